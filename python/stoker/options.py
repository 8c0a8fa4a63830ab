"""Arguments of the Python API, checked and turned into the C++ option
structs: rank and world size from the launcher's environment, ints, bools
and seconds with their ranges, decode={...} into _DecodeOptions and store={...}
into _StoreOptions. What is not given keeps C++'s default. Used by the
loader, checkpoints and mixtures (loader.py, checkpoint.py, mix.py).
"""

import collections.abc
import numbers
import os

import numpy as np

from . import _stoker

_U32 = 2**32 - 1
_U64 = 2**64 - 1
_MAX_DECODE_SIDE = _stoker.MAX_DECODE_SIDE  # DecodeOptions (include/stoker/decode.h)


# ---- rank and world size from the environment ------------------------------

DistributedEnv = collections.namedtuple("DistributedEnv", "rank world_size local_rank source")
DistributedEnv.__doc__ = """Where this process stands in a job: rank, world size,
rank within the node, and the launcher they were read from (None: not launched
by one; then 0, 1, 0)."""

def distributed_env(environ=None):
    """Rank, world size and local rank from the launcher's variables.

    The C++ core decides (include/stoker/rank.h): torchrun, then Open MPI,
    MPICH, Slurm; the first whose rank and size variables are both set wins.
    A malformed or inconsistent value is a ValueError naming the variable.
    """
    env = os.environ if environ is None else environ
    r = _stoker._discover_rank({k: v for k, v in env.items() if isinstance(v, str)})
    if r["launcher"] is None:
        return DistributedEnv(0, 1, 0, None)
    return DistributedEnv(r["rank"], r["world_size"], r["local_rank"], r["launcher"])


def _rank_world(rank, world_size, maximum=2**32 - 1):
    """(rank, world_size, " (from LAUNCHER)" or ""): given, else from the environment."""
    where = ""
    if rank is None or world_size is None:
        env = distributed_env()
        rank = env.rank if rank is None else rank
        world_size = env.world_size if world_size is None else world_size
        where = f" (from {env.source})" if env.source else ""
    rank = _int("rank", rank, 0)
    world_size = _int("world_size", world_size, 1, maximum)
    if rank >= world_size:
        raise ValueError(f"rank {rank} must be below world_size {world_size}{where}")
    return rank, world_size, where


# ---- option checks ---------------------------------------------------------


def _int(name, value, minimum=0, maximum=_U32):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    value = int(value)
    if value < minimum or value > maximum:
        if maximum in (_U32, _U64):
            raise ValueError(f"{name} must be at least {minimum}, got {value}"
                             if value < minimum else f"{name} is too large: {value}")
        raise ValueError(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def _bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, not {type(value).__name__}")
    return bool(value)


def _seconds(name, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    value = float(value)
    if not (value >= 0 if allow_zero else value > 0) or value > 1e7:
        raise ValueError(f"{name} must be {'at least 0' if allow_zero else 'positive'} "
                         f"seconds, got {value}")
    return value


_DECODE_KEYS = ("field", "size", "crop", "scale", "ratio", "resize_shorter", "flip", "normalize",
                "dtype", "layout", "skip_corrupt", "device", "cpu_share",
                "cpu_share_balance", "worker_nice")
#: torchvision's ImageNet mean and std (normalize=True or "imagenet"): DecodeOptions'
#: defaults (include/stoker/decode.h), as the decimals they were written as.
IMAGENET_NORMALIZE = tuple(tuple(float(str(np.float32(x))) for x in v)
                           for v in (_stoker._DecodeOptions().mean, _stoker._DecodeOptions().std))


def _decode_real(key, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"decode[{key!r}] must be a number, got {value!r}")
    return float(value)


def _decode_pair(key, value):
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"decode[{key!r}] must be (min, max), got {value!r}")
    return tuple(_decode_real(key, v) for v in value)


def _decode_triple(key, value):
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return (float(value),) * 3
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise ValueError(f"decode[{key!r}] must be 3 numbers (one per channel, RGB), "
                         f"got {value!r}")
    return tuple(_decode_real(key, v) for v in value)


def _decode_choice(value, parse):
    """crop, dtype or layout by C++'s parse_* (include/stoker/decode.h: one set
    of spellings with the CLI, its message when none fits); a numpy or torch
    dtype is taken by its name."""
    if not isinstance(value, str):
        try:
            value = np.dtype(value).name
        except TypeError:
            value = str(value).removeprefix("torch.")
    return parse(value)


def _decode_options(decode):
    """decode=None | "FIELD" | {"field": "FIELD", "size": (H, W) or S, ...} ->
    (field, height, width, _stoker._DecodeOptions)."""
    o = _stoker._DecodeOptions()  # its defaults are C++'s
    default_size = (o.height, o.width)
    if decode is None:
        return "", *default_size, o
    if isinstance(decode, str):
        field, size, decode = decode, default_size, {}
    elif isinstance(decode, collections.abc.Mapping):
        for key in decode:
            if key not in _DECODE_KEYS:
                raise ValueError(f"unknown decode option {key!r} "
                                 f"(known: {', '.join(map(repr, _DECODE_KEYS))})")
        if "field" not in decode:
            raise ValueError("decode needs a 'field': the bytes field holding the JPEGs, "
                             "e.g. decode={'field': 'image', 'size': (224, 224)}")
        field, size = decode["field"], decode.get("size", default_size)
    else:
        raise TypeError("decode must be None, a field name, or a dict with 'field' and 'size', "
                        f"not {type(decode).__name__}")
    if not isinstance(field, str) or not field:
        raise ValueError(f"decode field must be a non-empty field name, got {field!r}")
    if isinstance(size, numbers.Integral) and not isinstance(size, bool):
        size = (size, size)
    if (not isinstance(size, (tuple, list)) or len(size) != 2
            or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in size)):
        raise ValueError(f"decode size must be (height, width) or one int, got {size!r}")
    height, width = (int(s) for s in size)
    if not (1 <= height <= _MAX_DECODE_SIDE and 1 <= width <= _MAX_DECODE_SIDE):
        raise ValueError(f"decode size must be between 1x1 and {_MAX_DECODE_SIDE}x"
                         f"{_MAX_DECODE_SIDE}, got {height}x{width}")
    o.field, o.height, o.width = field, height, width
    if decode.get("crop") is not None:
        o.crop = _decode_choice(decode["crop"], _stoker.parse_crop_mode)
    if "scale" in decode:
        o.scale_min, o.scale_max = _decode_pair("scale", decode["scale"])
    if "ratio" in decode:
        o.ratio_min, o.ratio_max = _decode_pair("ratio", decode["ratio"])
    if decode.get("resize_shorter") is not None:
        o.resize_shorter = _int("decode['resize_shorter']", decode["resize_shorter"], 1, 1 << 16)
    if "flip" in decode:
        o.flip = _decode_real("flip", decode["flip"])
    normalize = decode.get("normalize")
    if normalize is True or normalize == "imagenet":
        normalize = IMAGENET_NORMALIZE
    if normalize is not None and normalize is not False:
        if not isinstance(normalize, (tuple, list)) or len(normalize) != 2:
            raise ValueError("decode['normalize'] must be (mean, std), True or 'imagenet', "
                             f"got {normalize!r}")
        o.normalize = True
        o.mean = _decode_triple("normalize", normalize[0])
        o.std = _decode_triple("normalize", normalize[1])
        o.dtype = _stoker.ImageDType.FLOAT32  # unless dtype says otherwise
    if decode.get("dtype") is not None:
        o.dtype = _decode_choice(decode["dtype"], _stoker.parse_image_dtype)
    if decode.get("layout") is not None:
        o.layout = _decode_choice(decode["layout"], _stoker.parse_image_layout)
    if "skip_corrupt" in decode:
        o.skip_corrupt = _bool("decode['skip_corrupt']", decode["skip_corrupt"])
    if decode.get("device") is not None:
        # "cuda:N": nvJPEG on that GPU (DecodeOptions::device); checked in C++.
        o.device = str(decode["device"])
    if "cpu_share" in decode:
        o.cpu_share = _decode_real("cpu_share", decode["cpu_share"])
    if "cpu_share_balance" in decode:
        o.cpu_share_balance = _bool("decode['cpu_share_balance']", decode["cpu_share_balance"])
    if "worker_nice" in decode:
        v = decode["worker_nice"]
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
            raise ValueError(f"decode['worker_nice'] must be a whole number from 0, got {v!r}")
        o.worker_nice = min(int(v), 1 << 31)  # the range is checked in C++
    o.validate()  # ranges: stoker.InvalidArgumentError (a ValueError) naming the parameter
    return field, height, width, o


_STORE_OPTIONS = ("posix_engine", "io_threads", "op_timeout", "keep_mapped_bytes")
_POSIX_ENGINES = ("auto", "io_uring", "threads")


def _store_options(store, o):
    """Sets _stoker._StoreOptions `o` from store=None | {"posix_engine": ...,
    "io_threads": N, "op_timeout": seconds, "keep_mapped_bytes": N}; what is
    not given keeps C++'s default."""
    store = {} if store is None else store
    if not isinstance(store, collections.abc.Mapping):
        raise TypeError(f"store must be a dict of store options, not {type(store).__name__}")
    for key in store:
        if key not in _STORE_OPTIONS:
            raise ValueError(f"unknown store option {key!r} (known: {', '.join(_STORE_OPTIONS)})")
    o.posix_engine = store.get("posix_engine", o.posix_engine)
    if o.posix_engine not in _POSIX_ENGINES:
        raise ValueError(f"store option posix_engine must be one of {_POSIX_ENGINES}, "
                         f"got {o.posix_engine!r}")
    o.io_threads = _int("store option io_threads", store.get("io_threads", o.io_threads), 0, 4096)
    o.op_timeout_s = _seconds("store option op_timeout", store.get("op_timeout", o.op_timeout_s),
                              allow_zero=True)
    o.keep_mapped_bytes = _int("store option keep_mapped_bytes",
                               store.get("keep_mapped_bytes", o.keep_mapped_bytes), 0, _U64)
