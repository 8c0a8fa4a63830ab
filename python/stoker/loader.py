"""stoker.Loader: batches from a packed dataset, as numpy arrays or torch tensors.

A batch is a dict. Every value is a view of the one buffer the C++ loader
built the batch in (no copy); the buffer lives while any array or tensor
refers to it and goes back to the loader's pool after:

    "sample_ids"  uint64[N]   global sample ids, in delivery order
    "padding"     bool[N]     True where the sample is a repeat that evens
                              out the ranks (drop_last=False)
    int64 field   int64[N]    e.g. "label"
    image field   uint8[N, H, W, 3]  when decoded (decode=...); float32 or
                              float16 with decode's dtype, [N, 3, H, W]
                              with its layout "NCHW"
    bytes field   BytesColumn (offsets uint64[N + 1], data uint8[...]):
                              sample i is data[offsets[i]:offsets[i + 1]]

Format 3's typed fields (collated by the C++ loader; see Batch in
include/stoker/loader.h):

    float32 / float64 field   float32[N] / float64[N]
    array, fixed shape        DTYPE[N, *shape], e.g. float16[N, 3, 4]
    str field                 list of N str
    json field                list of N parsed values (json.loads of each)
    array, shape [*, ...]     ragged="padded" (default): DTYPE[N, L, ...],
                              each sample's rows then zeros up to the
                              longest, L; and NAME_lengths int64[N], its rows.
                              ragged="offsets": DTYPE[R, ...], every sample's
                              rows back to back, and NAME_offsets
                              int64[N + 1]: sample i is rows
                              [offsets[i], offsets[i + 1]).

Arrays are views of the batch buffer; str and json lists are copies. numpy
has no bfloat16: with format="numpy" a bfloat16 array is uint16 (its raw
bits), with format="torch" a torch.bfloat16 tensor. torch before 2.3 has no
uint16 or uint32: with format="torch" those arrays are copied into int32 and
int64 tensors on the host; on the device they stay uint16/uint32 DLPack
arrays, which such a torch cannot import (use format="dlpack" there).

With format="torch" the same views are torch tensors (torch.from_numpy, so
still no copy); uint64 arrays become int64 tensors, since torch has no
uint64.

With device="cuda:N" the batch is also copied to GPU N by the C++ loader
(pinned buffers, its own CUDA stream, the copy overlapping the next batches'
reads) and every value is on the GPU: with format="torch" a CUDA tensor made
by torch.from_dlpack, so the current torch stream waits for the copy (on the
device; the host does not block) and the device buffer is not reused before
the work queued on that stream when the tensor dies has run; with
format="dlpack" objects with __dlpack__/__dlpack_device__ for any framework's
from_dlpack (cupy, jax), which do the same with their own stream.

Epochs follow torch's DataLoader + DistributedSampler:

- ``iter(loader)`` runs the *current* epoch, 0 until ``set_epoch(e)`` is
  called; like DistributedSampler, the same epoch number gives the same order
  again, so call ``set_epoch`` before each epoch.
- ``state_dict()`` is where the current epoch stands: the batches handed out
  so far count as consumed (save it after the step that used the batch).
  After an epoch ends it is ``{"epoch": e, "position": <end>}``: "epoch e
  done".
- ``load_state_dict(sd)`` makes the next ``iter()`` run epoch sd["epoch"]
  from where it stood; ``set_epoch`` with that same epoch keeps the resume
  point (so the usual ``for e in range(start, n): set_epoch(e); for b in
  loader`` loop resumes correctly), another epoch drops it.
- ``set_epoch`` and ``load_state_dict`` take effect at the next ``iter()``.
  One iteration at a time: a new ``iter()`` ends the previous iterator (it
  raises RuntimeError if used again).
- When an epoch ends, the loader starts reading epoch e + 1 in the
  background, so that the next ``set_epoch(e + 1); iter()`` finds its first
  batches ready.

``len(loader)`` is the number of batches this rank gets in a full epoch
(every rank gets the same number); ``loader.num_batches`` is what the
current (or next) iteration yields from where it starts, less after a
resume.

Rank and world size, when not given, come from the environment: torchrun
(RANK, WORLD_SIZE), Open MPI's mpirun (OMPI_COMM_WORLD_RANK/SIZE), MPICH
(PMI_RANK/PMI_SIZE) or Slurm (SLURM_PROCID, SLURM_NTASKS), else 0 and 1.

A Loader must not be used in a process forked from the one that made it
(its worker threads do not exist there): use torch DataLoaders with
num_workers=0 around it (stoker has its own workers). In a forked child it
raises RuntimeError instead of hanging.
"""

import collections.abc
import numbers
import os
import weakref

import numpy as np

from . import _stoker
# The checks and conversions of the arguments (options.py), imported here
# by name too: stoker.loader.distributed_env, _decode_options etc. stay.
from .options import (_U32, _U64, IMAGENET_NORMALIZE, DistributedEnv,  # noqa: F401
                      _bool, _decode_options, _int, _rank_world, _seconds, _store_options,
                      distributed_env)

__all__ = ["Loader", "BytesColumn", "DistributedEnv", "distributed_env"]

_METADATA_KEYS = ("sample_ids", "padding")
# Loader.state_dict()'s identity keys, by LoaderState field (include/stoker/loader.h).
_IDENTITY = {"dataset_id": "dataset_id", "seed": "seed", "shuffle": "shuffle",
             "shuffle_window": "shuffle_window_shards", "world_size": "world_size",
             "sequence_length": "sequence_length"}


# ---- batches ----------------------------------------------------------------


class BytesColumn:
    """A variable-length field of a batch, as two views of the batch buffer.

    ``offsets`` has N + 1 entries; sample i's bytes are
    ``data[offsets[i]:offsets[i + 1]]``, which ``column[i]`` returns (a view,
    not a copy). ``column.tolist()`` copies them out as ``bytes`` objects.
    """

    __slots__ = ("offsets", "data")

    def __init__(self, offsets, data):
        self.offsets = offsets
        self.data = data

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        n = len(self.offsets) - 1
        if not isinstance(i, numbers.Integral):
            raise TypeError(f"BytesColumn indices must be integers, not {type(i).__name__}")
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {i} is out of range for a batch of {n}")
        return self.data[int(self.offsets[i]):int(self.offsets[i + 1])]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def tolist(self):
        """The samples as a list of bytes objects (copies)."""
        data = self.data if isinstance(self.data, np.ndarray) else self.data.numpy()
        offsets = [int(o) for o in self.offsets]
        return [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(offsets) - 1)]

    def __repr__(self):
        return f"BytesColumn({len(self)} samples, {int(self.offsets[-1])} bytes)"


# ---- fork safety -------------------------------------------------------------

_live_loaders = weakref.WeakSet()


class _Forked:
    """Stands in for the C++ loader in a forked child, where its threads are gone."""

    def _fail(self, *args, **kwargs):
        raise RuntimeError(
            "this stoker.Loader was created in another process: a forked child cannot use "
            "it (its worker threads do not exist here). Create the Loader in the process "
            "that iterates it; with torch's DataLoader use num_workers=0.")

    next = start_epoch = prefetch = num_batches = state = stats = set_output = _fail

    def close(self):
        pass

    def abandon(self):  # a child of a child
        pass


def _after_fork_in_child():
    for loader in list(_live_loaders):
        loader._impl.abandon()  # leaked on purpose: joining threads that are gone would hang
        loader._impl = _Forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---- the loader ---------------------------------------------------------------


class Loader:
    """Iterable of batches from the stoker dataset at ``uri``.

    Args (None: LoaderOptions' default, include/stoker/loader.h):
      uri: the dataset: a path, ``file:///path``, ``rados://POOL/PREFIX``, ``mem://NAME``.
      batch_size: samples per batch (the last one of an epoch may be short
        unless drop_last).
      shuffle: shuffle shards, then samples within windows of ``shuffle_window``
        shards. The order depends only on (dataset, seed, epoch).
      seed: the order's seed; the same on every rank.
      rank, world_size: this process's share; from the environment when None
        (see :func:`distributed_env`).
      drop_last: drop the tail that does not fill a batch on every rank;
        otherwise the ranks are evened out with repeated samples marked in
        ``batch["padding"]``.
      decode: None, the name of a bytes field holding JPEGs (decoded and
        resized to 224x224 RGB, uint8 N x H x W x 3), or a dict:
        ``{"field": name, "size": (H, W) or S, "crop": "resize" | "center" |
        "random_resized", "scale": (0.08, 1.0), "ratio": (3/4, 4/3),
        "resize_shorter": S, "flip": p, "normalize": (mean, std) | True,
        "dtype": "uint8" | "float32" | "float16" | "bfloat16" (device delivery
        only), "layout": "NHWC" | "NCHW",
        "skip_corrupt": False, "device": None}``: torchvision's Resize((H, W)), Resize(S) +
        CenterCrop (S defaults to max(H, W) * 256 / 224) or RandomResizedCrop(scale,
        ratio), then RandomHorizontalFlip(p), then ToTensor + Normalize
        (normalize=True is ImageNet's; normalize makes dtype float32 unless
        given). Random choices come from (seed, epoch, sample id): a resumed
        run sees the same crops and flips. skip_corrupt=True zero-fills an
        undecodable image and counts it (``stats()["decode_skipped"]``)
        instead of raising CorruptionError. device="cuda:N" decodes on that
        GPU (nvJPEG's hardware engines, then CUDA, libjpeg-turbo for the
        rest; batches are delivered there); without nvJPEG it says so once
        and decodes on the CPU. stats() tells decoded_hardware, decoded_cuda,
        decoded_cpu and decode_path. cpu_share=f (with device) has the
        workers decode that fraction of the GPU's images too, chosen per
        sample: CPU and GPU together; cpu_share_balance=True moves that
        fraction at run time so neither path idles (stats()
        ["decode_cpu_share"] is the share now; stoker/decode.h). With
        device the workers run at worker_nice (default 5) above the
        process's nice, behind the thread that feeds the GPU.
        Each key defaults to the value shown (crop "resize", flip 0, no
        normalize, uint8, NHWC); a key given as None keeps C++'s default.
        crop, dtype and layout are read by C++ (stoker/decode.h, the same
        spellings as the CLI's --crop, --dtype and --layout): any case, "_"
        or "-" ("random-resized"); dtype also takes a numpy or torch dtype.
      fields: the fields to deliver (default: all).
      ragged: how arrays whose first dimension varies are collated:
        "padded" (default; NAME is zero-padded to the batch's longest, with
        NAME_lengths) or "offsets" (rows back to back, with NAME_offsets).
        Checked by the C++ loader (stoker.InvalidArgumentError).
      sequence_length: L > 0 delivers token windows instead of records:
        batch["tokens"] is (batch_size, L + 1), windows of L + 1 tokens that
        run across document boundaries of the token field (an integer array
        of shape [*], e.g. from ``stoker pack --tokens`` or ``--from
        megatron``). Shuffle off: window k is tokens [kL, kL + L + 1) of the
        documents in dataset order; on: documents and windows in an order
        fixed by (dataset, seed, epoch). Positions (state_dict, len) count
        windows; each rank gets floor(windows / world_size) of an epoch.
        sequence_dtype "int64" (default) or "int32"; sequence_positions=True
        adds "positions" (each token's position in its document) and
        "documents" (its document's index within the window);
        sequence_field names the token field (default "tokens", or the only
        one); sequence_verify (default True) checks what a window reads: the
        512-byte blocks it touches against their checksums (the whole
        records, for datasets packed without block checksums);
        sequence_verify=False reads only the tokens' bytes, unchecked.
      format: "numpy" (default) or "torch".
      threads: collate/decode workers; 0 = the machine's cores.
      reads_in_flight: whole-shard reads outstanding; 0 (default) = the
        workers' count, 8 to 64.
      memory_budget: bytes for shard and batch buffers; 0 (default) sizes it
        from the dataset and the machine (see LoaderOptions::memory_budget).
        An explicit budget too small for the shuffle window is refused,
        naming what it needs.
      prefetch: batches built ahead of the consumer.
      shuffle_window: shards whose samples are mixed together.
      read_retries, read_timeout: a read that fails with a retryable error
        is tried again this many times (0: never); one read's deadline
        (seconds), retries included.
      direct_io: read shards with O_DIRECT (local files).
      read_unit: "auto" (default), "shard", "sample" or "map". "shard" reads
        each shard whole and copies its records into batches; "sample" reads
        only the shards' indexes ahead and then each record straight into its
        batch (one read per sample: one copy fewer, for large samples on
        local disks). "map" is "sample" from the shard files mapped into
        memory: each record is checked where it lies in the page cache and
        copied once into the batch (local folders and the node cache only;
        a local folder's shard files stay mapped from epoch to epoch, and
        show in the process's RSS; faster than "sample" on few cores, not
        at 16 workers, so "auto" does not pick it). "auto" picks
        "sample" for records of 64 KiB or more on a local disk or tmpfs,
        "shard" otherwise;
        ``loader.read_unit`` says which is in use.
      device: None (host memory) or "cuda:N" (batches delivered on GPU N; needs
        a CUDA build of stoker; format "torch" or "dlpack").
      device_memory_budget: bytes of GPU memory for batches, held ones
        included; 0 = room for prefetch + 4 batches.
      store: store options: {"posix_engine": "auto"|"io_uring"|"threads",
        "io_threads": N, "op_timeout": seconds, "keep_mapped_bytes": N (with
        read_unit "map": bytes of shard files kept mapped between epochs;
        0, the default, is the machine's memory; less than a shard keeps
        none)}.

    Raises ValueError (stoker.InvalidArgumentError for what C++ checks) for
    bad options, stoker.NotFoundError (a FileNotFoundError) when there is no
    dataset at ``uri``, and the matching stoker error for anything else.
    """

    def __init__(self, uri, batch_size, *, shuffle=None, seed=None, rank=None, world_size=None,
                 drop_last=None, decode=None, fields=None, format="numpy", threads=None,
                 reads_in_flight=None, memory_budget=None, prefetch=None, shuffle_window=None,
                 read_retries=None, read_timeout=None, direct_io=None, store=None,
                 device=None, device_memory_budget=None, read_unit=None, cache=None,
                 cache_bytes=None, cache_policy=None, ranks_per_node=None, node_affinity=None,
                 ragged=None, sequence_length=None, sequence_dtype=None,
                 sequence_positions=None, sequence_field=None, sequence_verify=None):
        self._impl = None  # so close() and __repr__ work if a check below raises
        if not isinstance(uri, (str, os.PathLike)):
            raise TypeError(f"uri must be a str or path, not {type(uri).__name__}")
        uri = os.fspath(uri)
        if not uri:
            raise ValueError("uri is empty")
        # Options left None keep LoaderOptions' defaults (include/stoker/loader.h).
        o = self._options = _stoker._LoaderOptions()
        o.batch_size = self.batch_size = _int("batch_size", batch_size, 1)
        for field, name, value, check, *limits in (
                ("shuffle", "shuffle", shuffle, _bool),
                ("seed", "seed", seed, _int, 0, _U64),
                ("drop_last", "drop_last", drop_last, _bool),
                ("shuffle_window_shards", "shuffle_window", shuffle_window, _int, 1),
                ("reads_in_flight", "reads_in_flight", reads_in_flight, _int, 0),
                ("memory_budget", "memory_budget", memory_budget, _int, 0, _U64),
                ("prefetch_batches", "prefetch", prefetch, _int, 0),
                ("threads", "threads", threads, _int, 0, 4096),
                ("read_retries", "read_retries", read_retries, _int, 0),
                ("read_timeout_s", "read_timeout", read_timeout, _seconds),
                ("direct_io", "direct_io", direct_io, _bool),
                ("device_memory_budget", "device_memory_budget", device_memory_budget, _int, 0,
                 _U64),
                ("cache_bytes", "cache_bytes", cache_bytes, _int, 0, _U64),
                ("ranks_per_node", "ranks_per_node", ranks_per_node, _int, 0),
                ("node_affinity", "node_affinity", node_affinity, _bool),
                ("sequence_length", "sequence_length", sequence_length, _int, 0, _U32),
                ("sequence_positions", "sequence_positions", sequence_positions, _bool),
                ("sequence_verify", "sequence_verify", sequence_verify, _bool)):
            if value is not None:
                setattr(o, field, check(name, value, *limits))
        self.shuffle, self.seed, self.drop_last = o.shuffle, o.seed, o.drop_last
        o.rank, o.world_size, _ = _rank_world(rank, world_size)
        self.rank, self.world_size = o.rank, o.world_size
        o.decode = _decode_options(decode)[3]
        if fields is not None:
            if isinstance(fields, str) or not isinstance(fields, collections.abc.Iterable):
                raise TypeError("fields must be a list of field names")
            fields = list(fields)
            for f in fields:
                if not isinstance(f, str):
                    raise TypeError(f"fields must be a list of field names, got {f!r}")
        if format not in ("numpy", "torch", "dlpack"):
            raise ValueError(f"format must be 'numpy', 'torch' or 'dlpack', got {format!r}")
        if device is None:
            device = ""
        if not isinstance(device, str):
            device = str(device)  # e.g. a torch.device
        if device not in ("", "cpu") and format == "numpy":
            raise ValueError(f"device={device!r} delivers GPU memory: use format='torch' or "
                             "'dlpack'")
        if device in ("", "cpu") and format == "dlpack":
            raise ValueError("format='dlpack' is for device delivery (device='cuda:N')")
        decode_device = decode.get("device") if isinstance(decode, collections.abc.Mapping) \
            else None
        if decode_device not in (None, "", "cpu") and device in ("", "cpu"):
            # The GPU's images are only in device memory: say where batches go.
            raise ValueError(f"decode['device']={decode_device!r} decodes into the batches on "
                             f"that GPU: pass device={decode_device!r} (and format='torch' or "
                             "'dlpack') too")
        if o.decode.dtype == _stoker.ImageDType.BFLOAT16 and device in ("", "cpu"):
            raise ValueError("decode dtype 'bfloat16' is for device delivery (device='cuda:N'): "
                             "numpy has no bfloat16")
        self.device = device or None
        self.format = format
        _store_options(store, o.store)
        if read_unit is not None:
            if read_unit not in ("auto", "shard", "sample", "map"):
                raise ValueError(
                    f"read_unit must be 'auto', 'shard', 'sample' or 'map', got {read_unit!r}")
            o.read_unit = read_unit
        # The node cache (a folder on local disk shared by the node's ranks
        # and jobs; see include/stoker/cache.h). cache_bytes 0 = the disk's
        # free space less 5%.
        if cache is not None:
            o.cache_dir = os.fspath(cache)
        if cache_policy is not None:
            if cache_policy not in ("planned", "lru"):
                raise ValueError(f"cache_policy must be 'planned' or 'lru', got {cache_policy!r}")
            o.cache_policy = cache_policy
        if fields is not None:
            o.fields = fields
        o.device = device
        if ragged is not None:
            if not isinstance(ragged, str):
                raise TypeError(f"ragged must be 'padded' or 'offsets', not "
                                f"{type(ragged).__name__}")
            o.ragged = ragged  # its value is checked by C++
        self.ragged = o.ragged
        # Token windows (LoaderOptions::sequence_length): batch["tokens"] is
        # (batch_size, L + 1); positions count windows.
        self.sequence_length = o.sequence_length
        if sequence_dtype is not None:
            o.sequence_dtype = str(sequence_dtype)  # "int64" or "int32", checked by C++
        if sequence_field is not None:
            o.sequence_field = str(sequence_field)
        self._impl = _stoker._Loader(uri, o)
        self.uri = uri
        self.read_unit = self._impl.read_unit  # what "auto" chose
        self.info = self._impl.info  # what stoker.inspect(uri) says about the dataset
        delivered = fields or [f["name"] for f in self.info["fields"]]
        # Keys stoker adds: the metadata, and each variable array's index.
        suffix = "_lengths" if o.ragged == "padded" else "_offsets"
        added = list(_METADATA_KEYS) + [
            f["name"] + suffix for f in self.info["fields"]
            if f["name"] in delivered and None in f.get("shape", ())]
        for name in added:
            if name in delivered:
                self.close()
                raise ValueError(f"the dataset has a field named {name!r}, which is also a key "
                                 "stoker adds to each batch; leave it out with fields=[...]")
        if format == "torch":
            import torch  # only when asked for

            convert = torch.from_dlpack if self.device else torch.from_numpy
            self._impl.set_output(array=convert, bytes_column=BytesColumn, signed_ids=True,
                                  from_dlpack=torch.from_dlpack, widen_unsigned=True)
        else:
            self._impl.set_output(array=None, bytes_column=BytesColumn, signed_ids=False)

        # Epoch bookkeeping (see the module docstring).
        self._epoch = 0          # the epoch the next iter() runs
        self._resume = 0         # the position it starts at
        self._started = False    # an iter() of _epoch began since set_epoch/load_state_dict
        self._iter_start = 0     # the position the latest iter() started at
        self._final = None       # (epoch, position) once that iteration ended
        self._generation = 0     # bumps at each iter(); older iterators are dead
        _live_loaders.add(self)

    # -- iteration --

    def __iter__(self):
        # Keeps what C++ read ahead when it is this epoch (Loader::Prefetch, Open).
        self._impl.start_epoch(self._epoch, self._resume)
        self._started = True
        self._iter_start = self._resume
        self._resume = 0
        self._final = None
        self._generation += 1
        return _EpochIterator(self, self._generation)

    def _epoch_ended(self):
        self._final = self._impl.state()
        # Read ahead for the epoch that most likely comes next (Loader::Prefetch).
        try:
            self._impl.prefetch(self._final[0] + 1)
        except Exception:  # noqa: BLE001 -- a failure is reported again by the next iter()
            pass

    def __len__(self):
        return self._batches_from(0)

    @property
    def num_batches(self):
        """Batches the current (or next) iteration yields, from where it starts."""
        return self._batches_from(self._iter_start if self._started else self._resume)

    def _batches_from(self, position):
        # The C++ plan's count (drop_last, padding, node affinity, token
        # windows): one source of truth.
        return self._impl.batches_from(self._epoch, position)

    # -- epochs and resume --

    @property
    def epoch(self):
        """The epoch the current (or next) iteration runs."""
        return self._epoch

    def set_epoch(self, epoch):
        """Makes the next iter() run `epoch` (from its start, unless load_state_dict
        set a resume point in that same epoch)."""
        epoch = _int("epoch", epoch, 0, _U64)
        if epoch != self._epoch:
            self._epoch = epoch
            self._resume = 0
            self._started = False
            self._final = None

    def state_dict(self):
        """Where the current epoch stands; batches handed out count as consumed."""
        if not self._started:
            epoch, position = self._epoch, self._resume
        elif self._final is not None:
            epoch, position = self._final
        else:
            epoch, position = self._impl.state()
        s = self._impl.identified_state(epoch, position)  # versioned, with the identity
        state = {"version": s.version, "epoch": s.epoch,
                 "position": s.position,  # global samples consumed, by all ranks together
                 "samples": self.info["samples"]}
        state.update((key, getattr(s, field)) for key, field in _IDENTITY.items())
        return state

    def load_state_dict(self, state):
        """Makes the next iter() resume from `state` (from state_dict(), on any
        world size or batch size; the seed and shuffle settings must match)."""
        if not isinstance(state, collections.abc.Mapping):
            raise TypeError(f"state must be a dict from Loader.state_dict(), "
                            f"not {type(state).__name__}")
        missing = [k for k in ("epoch", "position") if k not in state]
        if missing:
            raise ValueError(f"state is missing {', '.join(missing)}: not a stoker.Loader "
                             "state_dict()")
        # C++ checks the identity (CheckResumeState). A state without one (made
        # by hand) is a bare position; identity keys it lacks are this loader's.
        s = self._impl.identified_state(_int("state epoch", state["epoch"], 0, _U64),
                                        _int("state position", state["position"], 0, _U64))
        if any(key in state for key in _IDENTITY):
            s.version = _int("state version", state.get("version", s.version), 0)
            for key, field in _IDENTITY.items():
                setattr(s, field, state.get(key, getattr(s, field)))
        else:
            s.version = 0
        self._impl.check_resume(s)
        epoch, position = s.epoch, s.position
        self._epoch = epoch
        self._resume = position
        self._started = False
        self._final = None

    # -- the rest --

    def stats(self):
        """Counters: shards_read, bytes_read, samples_delivered, batches_delivered,
        read_retries, wait_seconds (time spent blocked waiting for a batch),
        peak_buffer_bytes, decode_skipped (corrupt images zero-filled with
        skip_corrupt), shared_batches (batches built by more than one
        worker); with a device also h2d_bytes, h2d_seconds (copy
        engine busy time), device_bytes, peak_device_bytes, pinned_bytes; the
        node cache's remote_bytes (bytes read from the store), cache_bytes,
        cache_hits, cache_misses, cache_fetch_waits, cache_evictions,
        cache_refetches."""
        return self._impl.stats()

    def close(self):
        """Stops the workers and frees the buffers; batches already delivered stay valid."""
        if self._impl is not None:
            self._impl.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self._impl is None:
            return "<stoker.Loader (not opened)>"
        return (f"<stoker.Loader {self.uri!r} samples={self.info['samples']} "
                f"batch_size={self.batch_size} rank={self.rank}/{self.world_size} "
                f"epoch={self._epoch}>")


class _EpochIterator:
    """One pass over an epoch; dies when its Loader starts another."""

    __slots__ = ("_loader", "_generation", "_done")

    def __init__(self, loader, generation):
        self._loader = loader
        self._generation = generation
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        loader = self._loader
        if self._generation != loader._generation:
            raise RuntimeError("this iterator was ended by a newer iter() of the same "
                               "stoker.Loader (one iteration at a time)")
        if self._done:
            raise StopIteration
        batch = loader._impl.next()
        if batch is None:
            self._done = True
            loader._epoch_ended()
            raise StopIteration
        return batch
