"""Checkpoints of torch state dicts: stoker.save and stoker.load, beside
torch.save and torch.load (see their docstrings, and docs/checkpoint.md).

    stoker.save({"model": model.state_dict(), "optim": opt.state_dict()},
                "/ckpt/run-17", step=1200)               # -> "step-000000001200"
    handle = stoker.save(state, "rados://checkpoint/run-17?id=stoker-train",
                         step=1300, async_=True)         # returns after a copy in memory
    handle.wait()                                        # raises if the write failed
    model.load_state_dict(stoker.load("/ckpt/run-17")["model"])  # the latest commit

A state is stored as its tensors' bytes (tied tensors once) and a structure
document (docs/checkpoint.md §8: dicts with any keys, OrderedDicts, lists,
tuples, None, bool, int, float, complex, str, bytes, torch dtypes, devices
and Sizes, numpy arrays and scalars), which `stoker ckpt show` prints; tensor
names are the dotted key paths. Walking the state, the names, the document
and every check are C++'s (python/ckpt_state.cc and ckpt_load.cc over EncodeState
and LoadState in stoker/checkpoint.h): this module converts arguments. The
module keeps one Checkpointer per root (release() closes them); at exit
pending saves are waited for, and a failure nobody asked about is printed
on stderr. Errors are stoker errors (stoker.errors) with the C++ message.
"""

import atexit
import collections.abc
import json
import os
import sys
import threading
import time
import weakref

from . import _stoker
from .dataset import _path
from .options import _bool, _int, _rank_world, _seconds, _store_options

__all__ = ["save", "load", "release", "Checkpointer", "SaveHandle", "ShardedTensor"]

_U64 = 2**64 - 1
_MAX_RANKS = _stoker.MAX_CHECKPOINT_RANKS  # of one checkpoint (SaveOptions::world_size)


def _dims(what, v, ndim=None):
    try:
        out = tuple(int(x) for x in v)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of ints, not {type(v).__name__}") from None
    if any(x < 0 for x in out):
        raise ValueError(f"{what} {out} has a negative entry")
    if ndim is not None and len(out) != ndim:
        raise ValueError(f"{what} {out} has {len(out)} entries; the tensor has {ndim} dimensions")
    return out


class ShardedTensor:
    """A piece of a larger (global) tensor, in any state dict given to
    stoker.save or to stoker.load(into=...), on the CPU or a GPU:

        ShardedTensor(local, global_shape, offsets)      # a box: local's shape at offsets
        ShardedTensor(local, global_shape, flat_start=N)  # elements [N, N + local.numel())
                                                          # of the row-major global tensor
                                                          # (ZeRO/FSDP flat shards; local 1-D)

    Saved, the checkpoint records the global layout (docs/checkpoint.md §3.4);
    loaded into ShardedTensors of another split or world size, each is filled
    from whatever pieces the saving ranks wrote, reading only the bytes that
    intersect it. stoker.load without into= gives back ShardedTensors for the
    pieces a rank saved. ``local`` is a torch tensor or a numpy array."""

    __slots__ = ("local", "global_shape", "offsets", "flat_start")

    def __init__(self, local, global_shape, offsets=None, *, flat_start=None):
        if not hasattr(local, "shape") or not hasattr(local, "dtype"):
            raise TypeError(f"ShardedTensor: local must be a torch tensor or a numpy array, not "
                            f"{type(local).__name__}")
        self.local = local
        self.global_shape = _dims("ShardedTensor: global_shape", global_shape)
        if (offsets is None) == (flat_start is None):
            raise ValueError("ShardedTensor: give exactly one of offsets (a box) and flat_start "
                             "(a flat range)")
        if offsets is not None:
            self.offsets = _dims("ShardedTensor: offsets", offsets, len(self.global_shape))
            shape = tuple(local.shape)
            if len(shape) != len(self.global_shape):
                raise ValueError(f"ShardedTensor: local has shape {shape}, the global tensor "
                                 f"{self.global_shape}: not as many dimensions")
            for d, (o, n, g) in enumerate(zip(self.offsets, shape, self.global_shape)):
                if o + n > g:
                    raise ValueError(f"ShardedTensor: dimension {d}: [{o}, {o + n}) is not inside "
                                     f"[0, {g}) of global shape {self.global_shape}")
            self.flat_start = None
        else:
            self.flat_start = _int("ShardedTensor: flat_start", flat_start, 0, _U64)
            if len(tuple(local.shape)) != 1:
                raise ValueError(f"ShardedTensor: a flat piece is 1-D, not of shape "
                                 f"{tuple(local.shape)}")
            total = 1
            for g in self.global_shape:
                total *= g
            if self.flat_start + int(local.shape[0]) > total:
                raise ValueError(f"ShardedTensor: flat [{self.flat_start}, "
                                 f"{self.flat_start + int(local.shape[0])}) runs past the {total} "
                                 f"elements of global shape {self.global_shape}")
            self.offsets = None

    @property
    def shape(self):
        return tuple(self.local.shape)

    @property
    def dtype(self):
        return self.local.dtype

    def __repr__(self):
        where = (f"offsets={self.offsets}" if self.offsets is not None
                 else f"flat_start={self.flat_start}")
        return (f"stoker.ShardedTensor(shape={self.shape}, global_shape={self.global_shape}, "
                f"{where}, dtype={self.dtype})")


def _dtensor_type():
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # noqa: BLE001 -- torch without DTensor (1.13), or without distributed
        return None
    return DTensor


def _piece(value):
    """A ShardedTensor for a DTensor (its local shard and where it lies), the
    ShardedTensor itself, or None for anything else. Called by the binding."""
    if isinstance(value, ShardedTensor):
        return value
    dtensor = _dtensor_type()
    if dtensor is None or not isinstance(value, dtensor):
        return None
    from torch.distributed.tensor import Replicate, Shard
    placements = tuple(value.placements)
    for p in placements:
        if not isinstance(p, (Replicate, Shard)):
            raise TypeError(f"a DTensor with placement {p} (a partial sum) cannot be saved as it "
                            f"is: redistribute it to Shard or Replicate first")
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    local = value.to_local()
    _, offsets = compute_local_shape_and_global_offset(value.shape, value.device_mesh, placements)
    return ShardedTensor(local, tuple(value.shape), tuple(offsets))


def _has_pieces(value, depth=0):
    """Whether a load(into=...) state holds ShardedTensors or DTensors."""
    if depth > 64:
        return False
    if isinstance(value, ShardedTensor):
        return True
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(value, dtensor):
        return True
    if isinstance(value, collections.abc.Mapping):
        return any(_has_pieces(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_pieces(v, depth + 1) for v in value)
    return False


class SaveHandle:
    """An asynchronous save: its CPU tensors were copied when save() returned,
    its CUDA tensors are being copied (``wait_staged()``); the writing goes on
    in the background. ``done()``: finished? ``wait(timeout=None)``: True once
    committed, False if the timeout passed first; raises the save's error.
    ``exception(timeout=None)``: that error (or None) instead."""

    __slots__ = ("_impl", "name", "uri", "_pid", "_keep", "__weakref__")

    def __init__(self, impl, name, uri, keep=None):  # impl raises in a forked child
        self._impl, self.name, self.uri, self._pid = impl, name, uri, os.getpid()
        self._keep = keep  # the CUDA tensors, alive until their copies landed

    def wait_staged(self):
        """Returns once every CUDA tensor of the save has been copied to host
        memory: from then on they may change (call it just before the
        optimizer step; the forward and backward before it hide the copy).
        Until then, changing them is the caller's error (docs/checkpoint.md
        §9). Raises the copies' error (the save then fails too)."""
        try:
            self._impl.wait_staged()
        finally:
            self._keep = None

    def done(self):
        """True once the save has finished, committed or failed."""
        return self._impl.done()

    def wait(self, timeout=None):
        """True when the save is durable (and committed), False if `timeout`
        seconds passed first. Raises the save's error."""
        if timeout is not None:
            timeout = _seconds("timeout", timeout, allow_zero=True)
        done = self._impl.wait(timeout)
        if done:
            self._keep = None
        return done

    def exception(self, timeout=None):
        """The save's error, or None if it succeeded; TimeoutError if it still
        runs after `timeout` seconds."""
        from .errors import StokerError

        try:
            if self.wait(timeout):
                return None
        except StokerError as e:
            return e
        raise TimeoutError(f"the save of {self.name} is still running")

    def __repr__(self):
        state = "done" if os.getpid() == self._pid and self._impl.done() else "running"
        return f"<stoker.SaveHandle {self.name!r} at {self.uri!r}: {state}>"


_live_checkpointers = weakref.WeakSet()


class Checkpointer:
    """The checkpoints under one root (a path, ``file:///...``, ``rados://POOL/PREFIX``),
    kept open with, for asynchronous saves, a staging area in host memory that
    each save reuses (as large as the largest state saved). stoker.save and
    stoker.load use one per root; make your own for other options, or to free
    the staging area (close()). Safe to use from several threads; saves are
    serialised.

    Args (None: CheckpointerOptions' default, include/stoker/checkpoint.h):
      io_threads: chunk writes (and restore reads) in flight.
      write_retries: attempts after a failed write whose error is retryable.
      store: store options, as for stoker.Loader: {"posix_engine":
        "auto"|"io_uring"|"threads", "io_threads": N, "op_timeout": seconds}.
      direct_io: on a local directory, write and read chunks past the page
        cache (O_DIRECT): at the disk's rate, without evicting what a loader
        keeps cached (a checkpoint still in the page cache is read again).
      device_staging: how CUDA tensors reach host memory (docs/checkpoint.md
        §9): "snapshot" (pinned staging of the whole device state, kept and
        reused; save(async_=True) returns once the copies are queued) or
        "bounded" (a ring of staging_ring_bytes of pinned buffers: for nodes
        without host memory for a copy; wait_staged() then lasts about the
        whole save).
      staging_ring_bytes: the bounded ring, and the pinned buffers restores
        into CUDA memory read through (default 256 MiB).
    """

    def __init__(self, uri, *, io_threads=None, write_retries=None, store=None, direct_io=None,
                 device_staging=None, staging_ring_bytes=None):
        self._impl = None  # so close() and __repr__ work if a check below raises
        uri = _path("uri", uri)
        o = self._options = _stoker._CheckpointerOptions()  # None: C++'s default
        if io_threads is not None:
            o.io_threads = _int("io_threads", io_threads, 1, 4096)
        if write_retries is not None:
            o.write_retries = _int("write_retries", write_retries, 0, 1000)
        _store_options(store, o.store)
        if direct_io is not None:
            o.store.direct_writes = o.direct_reads = _bool("direct_io", direct_io)
        if device_staging is not None and not isinstance(device_staging, str):
            raise TypeError(f"device_staging must be a str, not {type(device_staging).__name__}")
        _stoker._set_device_staging(
            o, device_staging,
            None if staging_ring_bytes is None else _int("staging_ring_bytes", staging_ring_bytes,
                                                          1 << 20, _U64))
        self._impl = _stoker._Checkpointer(uri, o)
        self.uri, self._pid, self._lock = uri, os.getpid(), threading.Lock()
        _live_checkpointers.add(self)

    def _c(self):
        return self._impl  # which raises in a forked child

    def save(self, state_dict, name=None, *, step=None, async_=False, metadata=None,
             keep_last=None, rank=None, world_size=None, chunk_bytes=None, attempt=None,
             commit_timeout=None):
        """Saves `state_dict` as checkpoint `name`; see stoker.save."""
        impl = self._c()
        options = self._save_options(step=step, metadata=metadata, keep_last=keep_last, rank=rank,
                                     world_size=world_size, chunk_bytes=chunk_bytes,
                                     attempt=attempt, commit_timeout=commit_timeout)
        async_ = _bool("async_", async_)
        # The metered checkpointer in C++ counts the save; its stall and
        # seconds start here, so the walk and GPU-to-host copies are in them.
        started = time.monotonic_ns()
        state = _stoker._encode_state(state_dict)
        if name is not None:
            if not isinstance(name, str):
                raise TypeError(f"name must be a str, not {type(name).__name__}")
            _stoker._validate_checkpoint_name(name)  # "" too
        with self._lock:  # the given name, the step's, or ckpt-N claimed (CheckpointNameFor)
            name = impl.name_for(name or "", options)
        with _stoker._CheckpointSaveStarted(started):
            if async_:
                handle = impl.save_state_async(name, state, options)
            else:
                impl.save_state(name, state, options)
        if async_:  # CPU tensors were copied; CUDA ones are kept until staged
            return SaveHandle(handle, name, self.uri, keep=state if state.on_device else None)
        return name

    @staticmethod
    def _save_options(step=None, metadata=None, keep_last=None, rank=None, world_size=None,
                      chunk_bytes=None, attempt=None, commit_timeout=None):
        """save()'s arguments as a _SaveOptions; those left None keep C++'s default."""
        rank, world_size, _ = _rank_world(rank, world_size, _MAX_RANKS)
        if step is not None:
            step = _int("step", step, 0, _U64)
        options = _stoker._SaveOptions(rank=rank, world_size=world_size, step=step)
        # Fields left None keep SaveOptions' defaults (include/stoker/checkpoint.h);
        # the manifest's envelope around the metadata ({"step", "user"}) is C++'s.
        if metadata is not None:
            if not isinstance(metadata, collections.abc.Mapping):
                raise TypeError(f"metadata must be a dict, not {type(metadata).__name__}")
            try:
                options.metadata_json = json.dumps(dict(metadata), allow_nan=False,
                                                   separators=(",", ":"))
            except (TypeError, ValueError) as e:
                raise TypeError(f"metadata must be JSON-serialisable (it goes in the manifest): "
                                f"{e}") from None
        if attempt is not None:
            if not isinstance(attempt, str):
                raise TypeError(f"attempt must be a str, not {type(attempt).__name__}")
            options.attempt = attempt
        if keep_last is not None:
            options.keep_last = _int("keep_last", keep_last, 1)
        if commit_timeout is not None:
            options.commit_timeout_s = _seconds("commit_timeout", commit_timeout)
        if chunk_bytes is not None:
            options.chunk_bytes = _int("chunk_bytes", chunk_bytes, 1, _U64)
        return options

    def load(self, name=None, *, rank=None, world_size=None, all_ranks=False,
             map_location=None, into=None):
        """Loads checkpoint `name` (default: the latest); see stoker.load."""
        impl = self._c()
        name = "latest" if name is None else name
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        options = _stoker._StateLoadOptions()
        # A checkpoint of one rank loads in a job of any size (replicated state).
        options.any_world_if_single = rank is None and world_size is None
        options.rank, world_size, _ = _rank_world(rank, world_size, _MAX_RANKS)
        options.all_ranks = _bool("all_ranks", all_ranks)
        options.world_size = 0 if all_ranks else world_size
        # Pieces (ShardedTensor, DTensor) in `into`: a load of any world size
        # (docs/checkpoint.md §6.1).
        options.reshard = into is not None and _has_pieces(into)
        return impl.load_state(name, options, map_location, into)  # one call, into= or not

    def list(self):
        """The checkpoints under the root, by commit order (incomplete ones last):
        dicts with name, committed, latest, sequence, bytes, tensors, world_size,
        created_unix_ms, objects."""
        return self._c().list()

    def latest(self):
        """The name `latest` points to, or None when nothing was committed."""
        return self._c().latest()

    def info(self, name=None):
        """What the manifest of `name` (default: the latest) says: name, sequence,
        world_size, bytes, tensors (count), created_by, created_unix_ms, step,
        metadata (the dict given to save), ranks (each with its tensors' names,
        dtypes, shapes and bytes)."""
        m = self._c().read_manifest("latest" if name is None else name)
        m["metadata"] = json.loads(m.pop("metadata_json"))  # step and metadata: C++'s reading
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


_by_uri = {}  # the module's checkpointers
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
      async_: return a SaveHandle and write in the background. CPU tensors are
        copied into host memory first (the caller may change them at once);
        CUDA tensors are copied by stoker on its own stream, ordered after
        the current stream, into pinned staging: the call returns once the
        copies are queued, and the caller must not change them until
        handle.wait_staged() returns.
      metadata: a JSON-serialisable dict stored in the manifest (rank 0's).
      keep_last: after the commit, remove all but the newest K checkpoints.
      rank, world_size: this process's part; from the environment when None.
        Every rank saves its own state under the same name (or step); where
        only rank 0 saves a replicated state, pass rank=0, world_size=1.
      chunk_bytes: chunk object size (default: SaveOptions', 64 MiB).
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
        against the checkpoint's); from the environment when None, and then a
        checkpoint of one rank loads in a job of any size (replicated state).
      all_ranks: a list of every rank's state, indexed by rank.
      map_location: None (CPU tensors sharing the restored memory), or a device
        ("cuda:0", torch.device) to move them to.
      into: a state of the same structure (e.g. {"model": model.state_dict()})
        whose tensors are overwritten in place, as load_state_dict would,
        without new memory: CPU contiguous tensors and numpy arrays are read
        straight into, others (CUDA, non-contiguous) copied into after the
        restore. Each must have the checkpoint's dtype and shape (ValueError
        naming both, before anything is read). Tensors `into` lacks come back
        in new memory; tensors the checkpoint lacks are left as they are.
        Returns the state, with `into`'s tensor objects where they were
        filled. If the restore fails, `into` may hold part of the checkpoint.
    """
    return _checkpointer(uri).load(name, rank=rank, world_size=world_size, all_ranks=all_ranks,
                                   map_location=map_location, into=into)


def release(uri=None):
    """Closes the Checkpointer that stoker.save/stoker.load keep for `uri` (all
    of them if None): waits for its pending saves and frees its staging area."""
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
