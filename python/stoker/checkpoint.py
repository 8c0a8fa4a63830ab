"""Checkpoints of torch state dicts: stoker.save and stoker.load, beside
torch.save and torch.load.

    stoker.save({"model": model.state_dict(), "optim": opt.state_dict()},
                "/ckpt/run-17", step=1200)               # -> "step-000000001200"
    handle = stoker.save(state, "rados://checkpoint/run-17?id=stoker-train",
                         step=1300, async_=True)         # returns after a copy in memory
    ...                                                  # training goes on
    handle.wait()                                        # raises if the write failed
    state = stoker.load("/ckpt/run-17")                  # the latest commit
    model.load_state_dict(state["model"])

A checkpoint root (a directory, ``file:///...`` or ``rados://POOL/PREFIX``)
holds checkpoints by name and a ``latest`` pointer moved only after a commit
(docs/checkpoint.md). What is stored:

- every tensor's bytes, as a named tensor of the checkpoint: CPU tensors are
  handed to C++ as pointers into their storage (no copy in Python); CUDA
  tensors are copied to the host first, non-contiguous ones made contiguous.
  numpy arrays are stored the same way and come back as numpy arrays.
  Tensors that are the same view of the same memory (tied weights) are
  stored once and come back as one tensor;
- the rest of the structure, exactly: dicts with any keys (int keys of
  optimizer states stay ints), OrderedDicts, lists, tuples, None, bool, int,
  float (nan and inf too), complex, str, bytes, torch.dtype, torch.device,
  torch.Size and numpy scalars, as a JSON document stored with each rank's
  tensors (a uint8 tensor named ``stoker:structure``). Anything else raises
  TypeError naming its key path, e.g. ``state['sched']['fn']``.

Tensor names are the dotted key paths (``model.layer1.weight``,
``optim.state.0.exp_avg``), made unique where two paths would collide.

``load`` returns the same structure. Its tensors share the memory the
checkpoint was restored into (no copy: one buffer per load, freed when the
last of its tensors goes), on the CPU unless ``map_location`` says where.
A checkpoint written without this module (the C++ API) loads as a flat dict
of its tensors.

Many ranks: every rank calls ``save`` with its own state dict and the same
name (give ``name`` or ``step``); the checkpoint commits when every rank's
part is durable. Rank and world size come from the environment as for
stoker.Loader (torchrun, mpirun, MPICH, Slurm). In a data-parallel job where
only rank 0 saves the (replicated) state, pass ``rank=0, world_size=1`` to
save, or the save waits for parts that never come. ``load`` restores this
rank's part, and checks that the job has the checkpoint's world size (an
error naming both otherwise), except that a checkpoint saved by one rank
loads in a job of any size when rank and world_size are not given (every
rank gets the same state, as with torch.load); ``all_ranks=True`` returns
every rank's state, in a list indexed by rank, for a re-shard.

Asynchronous saves (``async_=True``) copy the tensors into a staging area in
host memory before ``save`` returns, so the caller may change them right
after; the writing goes on in the background and the returned SaveHandle
tells how it ended. The staging area belongs to the root's Checkpointer and
is reused by the next save: the module keeps one Checkpointer per root
for stoker.save/stoker.load (stoker.checkpoint.release() closes them and
frees their staging areas), or make your own (stoker.Checkpointer). A save
waits for the previous asynchronous save of its Checkpointer to finish
writing. At exit, pending saves are waited for, and a failure nobody asked
the handle about is printed on stderr.

Errors are stoker errors (stoker.errors) with the C++ message: e.g.
stoker.CorruptionError naming the chunk and its tensors when a checksum does
not match, stoker.NotFoundError when there is no checkpoint.
"""

import atexit
import base64
import collections
import collections.abc
import json
import math
import os
import sys
import threading
import weakref

import numpy as np

from . import _stoker
from . import metrics as _metrics
from .dataset import _path
from .loader import _bool, _int, _seconds, _store_options, distributed_env

__all__ = ["save", "load", "release", "Checkpointer", "SaveHandle"]

_U32 = 2**32 - 1
_U64 = 2**64 - 1
_DEFAULT_CHUNK_BYTES = _stoker.DEFAULT_CHUNK_BYTES  # SaveOptions::chunk_bytes
_STRUCTURE = "stoker:structure"  # the uint8 tensor holding a rank's structure
_STRUCTURE_FORMAT = "stoker.python.state"
_STRUCTURE_VERSION = 1
_MAX_TENSOR_NAME = _stoker.MAX_TENSOR_NAME_BYTES  # UTF-8 (docs/checkpoint.md §3.1)

# numpy dtypes by checkpoint dtype name (docs/checkpoint.md §3.3); bfloat16
# and float8 have none.
_NUMPY_DTYPES = {
    name: np.dtype(name)
    for name in ("bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64",
                 "uint64", "float16", "float32", "float64", "complex64", "complex128")
}
_NUMPY_NAMES = {dtype: name for name, dtype in _NUMPY_DTYPES.items()}

_torch_dtypes = None  # checkpoint dtype name -> torch dtype, for this torch


def _torch():
    """torch, imported when a checkpoint needs it (numpy-only states do not)."""
    import torch

    global _torch_dtypes
    if _torch_dtypes is None:
        names = ("bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                 "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
                 "float8_e4m3fn", "float8_e5m2")
        # uint16/32/64 and float8 only exist in newer torch.
        _torch_dtypes = {n: getattr(torch, n) for n in names if hasattr(torch, n)}
        _torch_names.update({d: n for n, d in _torch_dtypes.items()})
    return torch


_torch_names = {}  # the inverse


def _torch_dtype_name(dtype):
    return _torch_names.get(dtype)


# ---- the structure ----------------------------------------------------------------
#
# JSON, read only by this module. null, true/false, numbers, strings and
# arrays are themselves (arrays are lists); every JSON object is a tag with
# one key that says what it stands for:
#   {"tensor": NAME} [+ "requires_grad": true]   {"parameter": NAME, "requires_grad": b}
#   {"ndarray": NAME}   {"dict": [[K, V], ...]}   {"odict": [[K, V], ...]}
#   {"tuple": [...]}    {"size": [...]}           {"float": "nan"|"inf"|"-inf"}
#   {"complex": [RE, IM]}   {"bytes": BASE64}     {"dtype": "float32"}
#   {"device": "cuda:0"}    {"np": [DTYPE, VALUE]}


class _Flattener:
    """Walks a state: collects its tensors (as C++ TensorArgs) and encodes the rest."""

    def __init__(self, root_name):
        self.root_name = root_name
        self.tensors = []  # (name, dtype, shape, address, nbytes)
        self.keep = []     # what the addresses point into, alive until C++ has read it
        self.names = {_STRUCTURE}
        self.views = {}    # (device, address, dtype, shape, stride) -> name: tied tensors
        self.active = set()  # ids of the containers being walked (cycles)
        # A state holds tensors only if torch is loaded.
        self.torch = _torch() if "torch" in sys.modules else None

    def encode(self, value, path, where):
        t = type(value)
        if value is None or t is bool or t is str or t is int:
            return value
        if t is float:
            return value if math.isfinite(value) else {"float": repr(value)}
        torch = self.torch
        if torch is not None:
            if isinstance(value, torch.Tensor):
                return self._tensor(value, path, where)
            if t is torch.Size:
                return {"size": list(value)}
            if t is torch.dtype:
                name = _torch_dtype_name(value)
                if name is None:
                    raise TypeError(f"{where} is {value}, a torch dtype a checkpoint does not "
                                    "store")
                return {"dtype": name}
            if t is torch.device:
                return {"device": str(value)}
        if t in (dict, collections.OrderedDict, list, tuple):
            return self._container(value, path, where)
        if t is complex:
            return {"complex": [self.encode(value.real, path, where),
                                self.encode(value.imag, path, where)]}
        if t is bytes:
            return {"bytes": base64.b64encode(value).decode("ascii")}
        if isinstance(value, np.ndarray) and t in (np.ndarray, np.memmap):
            return self._ndarray(value, path, where)
        if isinstance(value, np.generic) and value.dtype in _NUMPY_NAMES:
            return {"np": [_NUMPY_NAMES[value.dtype], self.encode(value.item(), path, where)]}
        raise TypeError(
            f"cannot save {where}: a {t.__module__}.{t.__qualname__}, which a stoker "
            "checkpoint does not store (it stores tensors, numpy arrays, dicts, lists, "
            "tuples, None, bool, int, float, complex, str, bytes, torch dtypes and devices)")

    def _container(self, value, path, where):
        if id(value) in self.active:
            raise TypeError(f"cannot save {where}: it contains itself")
        self.active.add(id(value))
        try:
            if isinstance(value, dict):
                items = []
                for k, v in value.items():
                    key = self._key(k, where)
                    items.append([key, self.encode(v, path + [_path_part(k)], f"{where}[{k!r}]")])
                return {"odict" if type(value) is collections.OrderedDict else "dict": items}
            items = [self.encode(v, path + [str(i)], f"{where}[{i}]")
                     for i, v in enumerate(value)]
            return items if type(value) is list else {"tuple": items}
        finally:
            self.active.discard(id(value))

    def _key(self, k, where):
        torch = self.torch
        if (torch is not None and isinstance(k, torch.Tensor)) or isinstance(k, np.ndarray):
            raise TypeError(f"cannot save {where}: a tensor as a dict key")
        return self.encode(k, [], f"a key of {where}")

    def _tensor(self, value, path, where):
        torch = self.torch
        if value.layout != torch.strided:
            raise TypeError(f"cannot save {where}: a {value.layout} tensor (only dense ones)")
        if value.is_quantized or value.device.type == "meta":
            raise TypeError(f"cannot save {where}: a "
                            f"{'quantized' if value.is_quantized else 'meta'} tensor")
        dtype = _torch_dtype_name(value.dtype)
        if dtype is None:
            raise TypeError(f"cannot save {where}: dtype {value.dtype} has no checkpoint type")
        tag = "parameter" if isinstance(value, torch.nn.Parameter) else "tensor"
        view = None
        if value.numel() > 0:
            view = (str(value.device), value.data_ptr(), value.dtype, tuple(value.shape),
                    value.stride())
        name = self.views.get(view) if view else None
        if name is None:
            t = value.detach()
            if t.device.type != "cpu":
                t = t.to("cpu")
            if t.is_conj():
                t = t.resolve_conj()
            if t.is_neg():
                t = t.resolve_neg()
            if not t.is_contiguous():
                t = t.contiguous()
            name = self._name(path)
            if view:
                self.views[view] = name
            self.keep.append(t)
            self.tensors.append((name, dtype, list(t.shape), t.data_ptr(),
                                 t.numel() * t.element_size()))
        if tag == "parameter":
            return {"parameter": name, "requires_grad": bool(value.requires_grad)}
        if value.requires_grad:
            return {"tensor": name, "requires_grad": True}
        return {"tensor": name}

    def _ndarray(self, value, path, where):
        if value.dtype not in _NUMPY_NAMES and not (
                value.dtype.newbyteorder("=") in _NUMPY_NAMES):
            raise TypeError(f"cannot save {where}: a numpy array of {value.dtype}")
        a = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("="))
        name = self._name(path)
        self.keep.append(a)
        self.tensors.append((name, _NUMPY_NAMES[a.dtype], list(a.shape),
                             a.__array_interface__["data"][0], a.nbytes))
        return {"ndarray": name}

    def _name(self, path):
        """The dotted key path, made a valid unique tensor name."""
        base = ".".join(path) if path else self.root_name
        base = "".join(c if c.isprintable() or c == " " else "?" for c in base)
        base = base.encode("utf-8", "replace").decode("utf-8")
        if len(base.encode("utf-8")) > _MAX_TENSOR_NAME - 16:
            base = base.encode("utf-8")[:_MAX_TENSOR_NAME - 16].decode("utf-8", "ignore")
        name, n = base or "tensor", 1
        while name in self.names:
            n += 1
            name = f"{base}~{n}"
        self.names.add(name)
        return name


def _path_part(key):
    return key if type(key) is str else str(key) if type(key) is int else repr(key)


def _decode(node, tensor, given=None):
    """The structure's value; tensor(name, kind) gives the tensors, except those
    in `given` (name -> object, load(into=...)), which are returned as they are."""
    if type(node) is list:
        return [_decode(v, tensor, given) for v in node]
    if type(node) is not dict:
        return node
    if len(node) == 1 or "requires_grad" in node:
        if given:
            for tag in ("tensor", "parameter", "ndarray"):
                if tag in node and node[tag] in given:
                    return given[node[tag]]
        if "tensor" in node:
            t = tensor(node["tensor"], "tensor")
            return t.requires_grad_(True) if node.get("requires_grad") else t
        if "parameter" in node:
            torch = _torch()
            return torch.nn.Parameter(tensor(node["parameter"], "tensor"),
                                      requires_grad=bool(node["requires_grad"]))
        if "ndarray" in node:
            return tensor(node["ndarray"], "ndarray")
        if "dict" in node:
            return {_decode(k, tensor, given): _decode(v, tensor, given) for k, v in node["dict"]}
        if "odict" in node:
            return collections.OrderedDict((_decode(k, tensor, given), _decode(v, tensor, given))
                                           for k, v in node["odict"])
        if "tuple" in node:
            return tuple(_decode(v, tensor, given) for v in node["tuple"])
        if "float" in node:
            return float(node["float"])
        if "complex" in node:
            re_, im = node["complex"]
            return complex(_decode(re_, tensor, given), _decode(im, tensor, given))
        if "bytes" in node:
            return base64.b64decode(node["bytes"])
        if "size" in node:
            return _torch().Size(node["size"])
        if "dtype" in node:
            torch = _torch()
            if node["dtype"] not in _torch_dtypes:
                raise TypeError(f"the checkpoint holds torch dtype {node['dtype']}, which this "
                                f"torch ({torch.__version__}) does not have")
            return _torch_dtypes[node["dtype"]]
        if "device" in node:
            return _torch().device(node["device"])
        if "np" in node:
            dtype, value = node["np"]
            return _NUMPY_DTYPES[dtype].type(_decode(value, tensor, given))
    raise ValueError(f"stoker checkpoint structure: unknown entry {json.dumps(node)[:200]}")


def _encode_state(state):
    f = _Flattener("state")
    root = f.encode(state, [], "state")
    doc = json.dumps({"format": _STRUCTURE_FORMAT, "version": _STRUCTURE_VERSION, "root": root},
                     separators=(",", ":"), allow_nan=False).encode("utf-8")
    structure = np.frombuffer(doc, dtype=np.uint8)
    f.keep.append(structure)
    f.tensors.append((_STRUCTURE, "uint8", [len(doc)], structure.__array_interface__["data"][0],
                      len(doc)))
    return f.tensors, f.keep


# ---- restored tensors ----------------------------------------------------------------


def _restored(name, dtype, shape, array, kind, device):
    """A restored tensor (or numpy array) over `array`, uint8 bytes in the restore's memory."""
    if kind == "ndarray" or dtype not in _torch_dtypes_or_load():
        if dtype not in _NUMPY_DTYPES:
            raise TypeError(f"tensor {name!r} has dtype {dtype}, which this torch "
                            f"({_torch().__version__}) does not have")
        # uint16/32/64 on a torch without them come back as numpy arrays.
        a = array.view(_NUMPY_DTYPES[dtype]) if array.size else np.empty(0, _NUMPY_DTYPES[dtype])
        return a.reshape(shape)
    torch = _torch()
    tdtype = _torch_dtypes[dtype]
    if array.size == 0:  # nothing to share; a view of 0 bytes cannot change its dtype
        t = torch.empty(shape, dtype=tdtype)
    else:
        t = torch.from_numpy(array)
        if tdtype != torch.uint8:
            t = t.view(tdtype)
        t = t.reshape(shape)
    return t if device is None else t.to(device)


def _torch_dtypes_or_load():
    if _torch_dtypes is None:
        _torch()
    return _torch_dtypes


def _structure(array, where):
    """The decoded structure document of a rank, from its uint8 array."""
    doc = json.loads(array.tobytes())
    if doc.get("format") != _STRUCTURE_FORMAT:
        raise ValueError(f"{where}: tensor {_STRUCTURE!r} is not a stoker state structure")
    if doc.get("version") != _STRUCTURE_VERSION:
        raise ValueError(f"{where}: state structure version {doc.get('version')} is not "
                         f"supported (this stoker reads version {_STRUCTURE_VERSION})")
    return doc


def _build_state(tensors, device, where, doc=None, given=None):
    """One rank's state from its restored tensors {name: (dtype, shape, array)}
    (and `given`, the tensors load(into=...) restored in place)."""
    given = given or {}
    if doc is None and _STRUCTURE not in tensors:  # not written by stoker.save: a flat dict
        out = {name: _restored(name, *t, "tensor", device) for name, t in tensors.items()}
        out.update(given)
        return out
    if doc is None:
        doc = _structure(tensors[_STRUCTURE][2], where)
    made = {}

    def tensor(name, kind):
        if name not in made:
            if name not in tensors or name == _STRUCTURE:
                raise ValueError(f"{where}: the state names tensor {name!r}, which the "
                                 "checkpoint does not hold")
            made[name] = _restored(name, *tensors[name], kind, device)
        return made[name]

    return _decode(doc["root"], tensor, given)


# ---- load(into=...) -----------------------------------------------------------------


def _into_targets(node, target, where, out):
    """Walks a structure node beside `target`, the into= value at the same key
    path: out[tensor name] gets (where, target) for every tensor of the
    structure that `target` has a value for."""
    if type(node) is list or (type(node) is dict and "tuple" in node and len(node) == 1):
        items = node if type(node) is list else node["tuple"]
        if isinstance(target, (list, tuple)):
            for i, v in enumerate(items[:len(target)]):
                _into_targets(v, target[i], f"{where}[{i}]", out)
        return
    if type(node) is not dict:
        return
    for tag in ("tensor", "parameter", "ndarray"):
        if tag in node and (len(node) == 1 or "requires_grad" in node):
            out.setdefault(node[tag], []).append((where, target))
            return
    for tag in ("dict", "odict"):
        if tag in node and len(node) == 1:
            if not isinstance(target, collections.abc.Mapping):
                return
            for k, v in node[tag]:
                key = _decode(k, _no_tensor_keys)
                try:
                    present = key in target
                except TypeError:  # an unhashable key cannot be in a dict
                    present = False
                if present:
                    _into_targets(v, target[key], f"{where}[{key!r}]", out)
            return


def _no_tensor_keys(name, kind):
    raise ValueError(f"stoker checkpoint structure: tensor {name!r} used as a dict key")


def _destination(where, target, name, info):
    """How `target` (the into= value at `where`) takes checkpoint tensor `name`:
    "direct" (read straight into its memory: (address, nbytes)), "copy"
    (restored, then copied in: another device, a non-contiguous view), or
    "empty" (nothing to read). Raises naming both when they do not match."""
    dtype, shape = info["dtype"], tuple(info["shape"])
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(target, torch.Tensor):
        _torch()  # the dtype names
        have = _torch_dtype_name(target.dtype)
        if have != dtype or tuple(target.shape) != shape:
            raise ValueError(f"load(into=...): {where} is a {target.dtype} tensor of shape "
                             f"{list(target.shape)}, the checkpoint's tensor {name!r} is "
                             f"{dtype} of shape {list(shape)}")
        if target.numel() == 0:
            return "empty", None
        if (target.device.type == "cpu" and target.is_contiguous() and not target.is_conj()
                and not target.is_neg() and target.layout == torch.strided):
            return "direct", (target.data_ptr(), target.numel() * target.element_size())
        return "copy", None
    if isinstance(target, np.ndarray):
        have = _NUMPY_NAMES.get(target.dtype)
        if have != dtype or target.shape != shape:
            raise ValueError(f"load(into=...): {where} is a numpy array of {target.dtype} and "
                             f"shape {list(target.shape)}, the checkpoint's tensor {name!r} is "
                             f"{dtype} of shape {list(shape)}")
        if not target.flags.writeable:
            raise ValueError(f"load(into=...): {where} is a read-only numpy array")
        if target.size == 0:
            return "empty", None
        if target.flags.c_contiguous:
            return "direct", (target.__array_interface__["data"][0], target.nbytes)
        return "copy", None
    raise TypeError(f"load(into=...): {where} is a {type(target).__name__}, where the "
                    f"checkpoint holds tensor {name!r} ({dtype} of shape {list(shape)})")


def _same_memory(a, b):
    """Whether two destinations are the same view of the same memory (tied weights)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.__array_interface__ == b.__array_interface__)
    return (a.device == b.device and a.data_ptr() == b.data_ptr() and a.dtype == b.dtype
            and a.shape == b.shape and a.stride() == b.stride())


def _copy_into(dest, src):
    if isinstance(dest, np.ndarray):
        np.copyto(dest, src if isinstance(src, np.ndarray) else src.numpy())
        return
    torch = _torch()
    with torch.no_grad():
        dest.copy_(src if isinstance(src, torch.Tensor) else torch.from_numpy(src))


def _device(map_location):
    if map_location is None:
        return None
    torch = _torch()
    if isinstance(map_location, (str, torch.device)):
        device = torch.device(map_location)
        return None if device.type == "cpu" else device
    raise TypeError("map_location must be None, a device string like 'cuda:0' or a "
                    f"torch.device, not {type(map_location).__name__}")


# ---- handles and checkpointers ---------------------------------------------------


class SaveHandle:
    """An asynchronous save: its tensors were copied when save() returned; the
    writing goes on in the background.

    ``done()`` says whether it has finished; ``wait(timeout=None)`` waits
    (True once committed, False if the timeout passed first) and raises the
    save's error if it failed; ``exception(timeout=None)`` returns that error
    (or None) instead of raising it.
    """

    __slots__ = ("_impl", "name", "uri", "_pid", "_metric", "__weakref__")

    def __init__(self, impl, name, uri, metric=None):
        self._impl = impl
        self.name = name
        self.uri = uri
        self._pid = os.getpid()
        self._metric = metric  # (start, bytes) until the end is counted

    def _count_end(self, ok):
        if self._metric is not None:
            started, nbytes = self._metric
            self._metric = None
            _metrics._save_ended(started, nbytes, ok)

    def _check_process(self):
        if os.getpid() != self._pid:
            raise RuntimeError("this stoker.SaveHandle belongs to another process (fork): its "
                               "save is written by the parent")

    def done(self):
        """True once the save has finished, committed or failed."""
        self._check_process()
        finished = self._impl.done()
        if finished and self._metric is not None:
            self.exception()  # counts the end, committed or failed
        return finished

    def wait(self, timeout=None):
        """Waits for the save; True when it is durable (and committed), False if
        `timeout` seconds passed first. Raises the save's error."""
        self._check_process()
        if timeout is not None:
            timeout = _seconds("timeout", timeout, allow_zero=True)
        try:
            finished = self._impl.wait(timeout)
        except Exception:  # the save's error (not an interrupt of the wait)
            self._count_end(False)
            raise
        if finished:
            self._count_end(True)
        return finished

    def exception(self, timeout=None):
        """The save's error, or None if it succeeded. TimeoutError if it is still
        running after `timeout` seconds."""
        from .errors import StokerError

        try:
            finished = self.wait(timeout)
        except StokerError as e:
            return e
        if not finished:
            raise TimeoutError(f"the save of {self.name} is still running")
        return None

    def __repr__(self):
        state = "done" if os.getpid() == self._pid and self._impl.done() else "running"
        return f"<stoker.SaveHandle {self.name!r} at {self.uri!r}: {state}>"


_live_checkpointers = weakref.WeakSet()


class Checkpointer:
    """The checkpoints under one root (a path, ``file:///...``, ``rados://POOL/PREFIX``).

    Keeps the root open and, for asynchronous saves, a staging area in host
    memory that each save reuses (as large as the largest state saved).
    stoker.save and stoker.load use one per root, made on first use; make
    your own for other options, or to free the staging area (close()).

    Args:
      uri: the checkpoint root.
      io_threads: chunk writes (and restore reads) in flight.
      write_retries: attempts after a failed write whose error is retryable.
      store: store options, as for stoker.Loader: {"posix_engine":
        "auto"|"io_uring"|"threads", "io_threads": N, "op_timeout": seconds}.
      direct_io: on a local directory, write and read chunks past the page
        cache (O_DIRECT): a save or restore streams at the disk's rate and
        does not evict the data a loader keeps cached; a restore of a
        checkpoint still in the page cache reads the disk again. Default on.

    Safe to use from several threads; saves are serialised.
    """

    def __init__(self, uri, *, io_threads=8, write_retries=3, store=None, direct_io=True):
        self._impl = None  # so close() and __repr__ work if a check below raises
        uri = _path("uri", uri)
        engine, store_threads, op_timeout = _store_options(store)
        self._impl = _stoker._Checkpointer(
            uri=uri, io_threads=_int("io_threads", io_threads, 1, 4096),
            write_retries=_int("write_retries", write_retries, 0, 1000), posix_engine=engine,
            store_io_threads=store_threads, op_timeout_s=op_timeout,
            direct_io=_bool("direct_io", direct_io))
        self.uri = uri
        self._pid = os.getpid()
        self._lock = threading.Lock()
        _live_checkpointers.add(self)

    def _c(self):
        if os.getpid() != self._pid:
            raise RuntimeError("this stoker.Checkpointer was created in another process: a "
                               "forked child cannot use it (its threads do not exist here); "
                               "make a new one in the child")
        return self._impl

    # -- saving --

    def save(self, state_dict, name=None, *, step=None, async_=False, metadata=None,
             keep_last=None, rank=None, world_size=None, chunk_bytes=None, attempt="",
             commit_timeout=600.0):
        """Saves `state_dict` as checkpoint `name`; see stoker.save."""
        impl = self._c()
        rank, world_size, where = _rank_world(rank, world_size)
        if step is not None:
            step = _int("step", step, 0, _U64)
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, collections.abc.Mapping):
            raise TypeError(f"metadata must be a dict, not {type(metadata).__name__}")
        try:
            metadata_json = json.dumps({"step": step, "user": dict(metadata)}, allow_nan=False,
                                       separators=(",", ":"))
        except (TypeError, ValueError) as e:
            raise TypeError(f"metadata must be JSON-serialisable (it goes in the manifest): "
                            f"{e}") from None
        keep_last = 0 if keep_last is None else _int("keep_last", keep_last, 1)
        chunk_bytes = (_DEFAULT_CHUNK_BYTES if chunk_bytes is None
                       else _int("chunk_bytes", chunk_bytes, 1, _U64))
        if not isinstance(attempt, str):
            raise TypeError(f"attempt must be a str, not {type(attempt).__name__}")
        options = _stoker._SaveOptions()
        options.rank, options.world_size, options.chunk_bytes = rank, world_size, chunk_bytes
        options.metadata_json, options.keep_last, options.attempt = metadata_json, keep_last, attempt
        options.commit_timeout_s = _seconds("commit_timeout", commit_timeout)
        async_ = _bool("async_", async_)
        started = _metrics._save_started()  # the stall counts the flattening too
        tensors, keep = _encode_state(state_dict)
        nbytes = _metrics._tensor_bytes(tensors)
        with self._lock:
            name = self._name(impl, name, step, world_size, where)
        try:
            if not async_:
                impl.save(name, tensors, options)
            else:
                handle = impl.save_async(name, tensors, options)
        except BaseException:
            _metrics._save_stalled(started)
            _metrics._save_ended(started, nbytes, ok=False)
            raise
        del keep  # C++ has read the tensors (async: copied into the staging area)
        _metrics._save_stalled(started)
        if not async_:
            _metrics._save_ended(started, nbytes, ok=True)
            return name
        return SaveHandle(handle, name, self.uri, (started, nbytes))

    def _name(self, impl, name, step, world_size, where):
        if name is not None:
            if not isinstance(name, str):
                raise TypeError(f"name must be a str, not {type(name).__name__}")
            _stoker._validate_checkpoint_name(name)
            return name
        if step is not None:
            return f"step-{step:012d}"
        if world_size > 1:
            raise ValueError(f"a save by {world_size} ranks{where} needs name= or step=, so "
                             "that every rank saves under the same name")
        return impl.claim_name()  # ckpt-N, claimed atomically under the root

    # -- loading --

    def load(self, name=None, *, rank=None, world_size=None, all_ranks=False,
             map_location=None, into=None):
        """Loads checkpoint `name` (default: the latest); see stoker.load."""
        impl = self._c()
        name = "latest" if name is None else name
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        all_ranks = _bool("all_ranks", all_ranks)
        device = _device(map_location)
        if into is not None and all_ranks:
            raise ValueError("load(into=...) restores this rank's part; it does not combine "
                             "with all_ranks=True")
        if into is not None and device is not None:
            raise ValueError("load(into=...) restores into the tensors where they are; "
                             "map_location does not apply")
        implicit = rank is None and world_size is None
        rank, world_size, where = _rank_world(rank, world_size)
        if into is not None:
            manifest = impl.read_manifest(name)
            name = manifest["name"]  # not "latest", which may move before the restore
            if implicit and world_size > 1 and manifest["world_size"] == 1:
                check_world, rank = 0, 0
            else:
                check_world = world_size
            return self._load_into(impl, manifest, rank, check_world, into)
        if all_ranks:
            check_world = 0
        elif implicit and world_size > 1:
            # A checkpoint of one rank loads in a job of any size (replicated state).
            manifest = impl.read_manifest(name)
            name = manifest["name"]  # not "latest", which may move before the restore
            check_world, rank = (0, 0) if manifest["world_size"] == 1 else (world_size, rank)
        else:
            check_world = world_size
        restored = impl.restore(name, rank=rank, world_size=check_world, all_ranks=all_ranks,
                                only=[])
        manifest = restored["manifest"]
        by_rank = {}
        for tname, dtype, shape, trank, array, _address in restored["tensors"]:
            by_rank.setdefault(trank, {})[tname] = (dtype, shape, array)
        where = f"{self.uri}: checkpoint {manifest['name']}"
        if all_ranks:
            return [_build_state(by_rank.get(r, {}), device, f"{where} rank {r}")
                    for r in range(manifest["world_size"])]
        return _build_state(by_rank.get(rank, {}), device, where)

    def _load_into(self, impl, manifest, rank, check_world, into):
        name = manifest["name"]
        where = f"{self.uri}: checkpoint {name}"
        part = next((r for r in manifest["ranks"] if r["rank"] == rank), None)
        if part is None:  # raises the C++ error naming the rank and world sizes
            impl.restore(name, rank=rank, world_size=check_world, all_ranks=False, only=[])
            return {}
        infos = {t["name"]: t for t in part["tensors"]}
        doc = None
        if _STRUCTURE in infos:
            got = impl.restore(name, rank=rank, world_size=check_world, all_ranks=False,
                               only=[_STRUCTURE])
            doc = _structure(got["tensors"][0][4], where)
            targets = {}
            _into_targets(doc["root"], into, "into", targets)
        elif isinstance(into, collections.abc.Mapping):
            # Written by the C++ API: a flat dict of tensors by name.
            targets = {k: [(f"into[{k!r}]", v)] for k, v in into.items()
                       if isinstance(k, str) and k in infos}
        else:
            targets = {}
        if infos and not targets:
            raise ValueError(f"{where}: load(into=...) found none of the checkpoint's tensors "
                             f"at the same key paths in `into` (a {type(into).__name__}); "
                             "its state has the structure stoker.load returns")
        # Each checkpoint tensor: the first destination that can take it
        # directly is read into; every other destination is copied from it.
        direct, direct_dst, copies, given = [], {}, [], {}
        for tname, dests in targets.items():
            info = infos.get(tname)
            if info is None:
                raise ValueError(f"{where}: the state names tensor {tname!r}, which the "
                                 "checkpoint does not hold")
            for dwhere, target in dests:
                how, span = _destination(dwhere, target, tname, info)
                if how == "direct" and tname not in direct_dst:
                    direct.append((tname, span[0], span[1]))
                    direct_dst[tname] = target
                elif how != "empty":
                    copies.append((tname, target))
            given[tname] = direct_dst.get(tname, dests[0][1])
        if direct:  # check_world: the C++ side checks world size and rank
            impl.restore_into(name, rank, check_world, direct)
        rest = [n for n in infos if n != _STRUCTURE and n not in direct_dst]
        restored = {}
        if rest:
            got = impl.restore(name, rank=rank, world_size=check_world, all_ranks=False,
                               only=rest)
            restored = {t[0]: (t[1], t[2], t[4]) for t in got["tensors"]}
        made = {}
        for tname, target in copies:
            if tname in direct_dst:
                if not _same_memory(target, direct_dst[tname]):
                    _copy_into(target, direct_dst[tname])
                continue
            if tname not in made:
                made[tname] = _restored(tname, *restored[tname],
                                        "ndarray" if isinstance(target, np.ndarray) else "tensor",
                                        None)
            _copy_into(target, made[tname])
        others = {n: t for n, t in restored.items() if n not in given}
        return _build_state(others, None, where, doc=doc, given=given)

    # -- the rest --

    def list(self):
        """The checkpoints under the root, by commit order (incomplete ones last):
        dicts with name, committed, latest, sequence, bytes, tensors, world_size,
        created_unix_ms, objects."""
        return self._c().list()

    def latest(self):
        """The name `latest` points to, or None when nothing was committed."""
        from .errors import NotFoundError

        try:
            return self._c().latest()
        except NotFoundError:
            return None

    def info(self, name=None):
        """What the manifest of `name` (default: the latest) says: name, sequence,
        world_size, bytes, tensors (count), created_by, created_unix_ms, step,
        metadata (the dict given to save), ranks (each with its tensors' names,
        dtypes, shapes and bytes)."""
        m = self._c().read_manifest("latest" if name is None else name)
        meta = json.loads(m.pop("metadata_json"))
        m["step"] = meta.get("step") if isinstance(meta, dict) else None
        m["metadata"] = meta.get("user", meta) if isinstance(meta, dict) else meta
        return m

    def remove(self, name):
        """Removes checkpoint `name`, committed or not; `latest` moves to the newest
        remaining commit."""
        self._c().remove(name)

    def close(self):
        """Waits for pending saves and frees the staging area. Idempotent."""
        if self._impl is not None and os.getpid() == self._pid:
            self._impl.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<stoker.Checkpointer {getattr(self, 'uri', None)!r}>"


def _rank_world(rank, world_size):
    if rank is None or world_size is None:
        env = distributed_env()
        rank = env.rank if rank is None else rank
        world_size = env.world_size if world_size is None else world_size
        where = f" (from {env.source})" if env.source else ""
    else:
        where = ""
    rank = _int("rank", rank, 0)
    world_size = _int("world_size", world_size, 1, 65536)
    if rank >= world_size:
        raise ValueError(f"rank {rank} must be below world_size {world_size}{where}")
    return rank, world_size, where


# ---- the module's checkpointers ------------------------------------------------------

_by_uri = {}
_by_uri_lock = threading.Lock()


def _checkpointer(uri):
    key = _path("uri", uri)
    with _by_uri_lock:
        c = _by_uri.get(key)
        if c is None or c._pid != os.getpid():
            c = _by_uri[key] = Checkpointer(key)
        return c


def save(state_dict, uri, name=None, step=None, async_=False, metadata=None, keep_last=None,
         rank=None, world_size=None, chunk_bytes=None):
    """Saves a state dict (any structure of tensors, see stoker.checkpoint) as a
    checkpoint under the root `uri`, like torch.save; returns its name, or a
    SaveHandle when async_.

    Args:
      state_dict: e.g. model.state_dict(), or {"model": ..., "optim": ...}.
      uri: the checkpoint root: a path, ``file:///...``, ``rados://POOL/PREFIX``.
      name: the checkpoint's name ([A-Za-z0-9][A-Za-z0-9._-]{0,127}); default
        ``step-%012d`` of `step`, else the next ``ckpt-%06d`` under the root.
        A name already committed raises stoker.AlreadyExistsError.
      step: the training step, stored in the manifest (stoker.Checkpointer.info).
      async_: copy the tensors into host memory, return a SaveHandle, write in
        the background (the caller may change the tensors at once).
      metadata: a JSON-serialisable dict stored in the manifest (rank 0's).
      keep_last: after the commit, remove all but the newest K checkpoints.
      rank, world_size: this process's part; from the environment when None.
      chunk_bytes: chunk object size (default 64 MiB).
    """
    return _checkpointer(uri).save(state_dict, name, step=step, async_=async_, metadata=metadata,
                                   keep_last=keep_last, rank=rank, world_size=world_size,
                                   chunk_bytes=chunk_bytes)


def load(uri, name=None, rank=None, world_size=None, all_ranks=False, map_location=None,
         into=None):
    """Loads a checkpoint saved by stoker.save, like torch.load.

    Args:
      uri: the checkpoint root.
      name: the checkpoint (default: the latest commit).
      rank, world_size: which rank's part to load, and the job's size (checked
        against the checkpoint's); from the environment when None.
      all_ranks: a list of every rank's state, indexed by rank.
      map_location: None (CPU tensors sharing the restored memory), or a device
        ("cuda:0", torch.device) to move them to.
      into: a state with the same structure (e.g. {"model": model.state_dict()}
        for a checkpoint of {"model": ...}) whose tensors are overwritten in
        place, as load_state_dict would, without new memory or a second copy:
        CPU contiguous tensors and numpy arrays are read straight into, others
        (CUDA, non-contiguous) copied into after the restore. Every such
        tensor must have the checkpoint's dtype and shape (ValueError naming
        both otherwise), checked before anything is read. Tensors the
        checkpoint has and `into` does not come back in new memory; tensors of
        `into` the checkpoint lacks are left as they are. Returns the state,
        with `into`'s own tensor objects where they were filled. If the restore
        fails (a corrupt chunk, say), the error is raised and `into`'s tensors
        may hold part of the checkpoint.
    """
    return _checkpointer(uri).load(name, rank=rank, world_size=world_size, all_ranks=all_ranks,
                                   map_location=map_location, into=into)


def release(uri=None):
    """Closes the Checkpointer that stoker.save/stoker.load keep for `uri` (all
    of them if None): waits for its pending saves and frees its staging area
    (as large as the largest state saved asynchronously)."""
    with _by_uri_lock:
        keys = list(_by_uri) if uri is None else [os.fspath(uri)]
        closing = [_by_uri.pop(k) for k in keys if k in _by_uri]
    for c in closing:
        c.close()


def _after_fork_in_child():
    # The Checkpointers' threads do not exist in the child: leak them (joining
    # threads that are gone would hang) rather than destroy them.
    for c in list(_live_checkpointers):
        if c._impl is not None:
            c._impl.abandon()
    _by_uri.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@atexit.register
def _close_all():
    # Pending asynchronous saves finish (or report their failure) before the
    # interpreter goes.
    for c in list(_live_checkpointers):
        try:
            c.close()
        except Exception as e:  # noqa: BLE001 -- at exit, say it and go on
            print(f"stoker: closing the checkpointer of {c.uri}: {e}", file=sys.stderr)
