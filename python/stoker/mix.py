"""stoker.Mix: token windows from several datasets by weight (include/stoker/mix.h).

    mix = stoker.Mix([("/data/web", 0.7), ("/data/code", 0.2), ("/data/books", 0.1)],
                     batch_size=512, sequence_length=4096, seed=1, format="torch")
    for step, batch in zip(range(steps), mix):
        tokens = batch["tokens"]           # (512 / world_size, 4097) int64
        sources = batch["source"]          # which source each row came from
    torch.save({"mix": mix.state_dict()}, "ckpt")   # step + one position per source

Every global batch (``batch_size`` windows over all ranks) holds each source's
share within one window of weight x batch_size; the stream depends only on
the sources, weights, seed and batch size, so a state saved on one world size
resumes on any other. A source runs through its own epochs: a small one
repeats, a large one does not. ``schedule=[(step, weights), ...]`` changes the
weights from a step on, with no window repeated early or skipped. The policy
is all in C++ (stoker::Mix); this is the Python skin.
"""

import collections.abc
import math
import os

from . import _stoker
from .options import _rank_world, _store_options

__all__ = ["Mix"]


def _source(i, item):
    """(uri, weight) or {"uri": ..., "weight": ..., "sequence_length": ..., "field": ...}."""
    s = _stoker._MixSource()
    if isinstance(item, collections.abc.Mapping):
        unknown = set(item) - {"uri", "weight", "sequence_length", "field"}
        if unknown:
            raise ValueError(f"source {i}: unknown keys {sorted(unknown)}")
        uri, weight = item.get("uri"), item.get("weight", 1.0)
        s.sequence_length = int(item.get("sequence_length") or 0)
        s.field = item.get("field") or ""
    elif isinstance(item, (tuple, list)) and len(item) == 2:
        uri, weight = item
    else:
        raise TypeError(f"source {i}: expected (uri, weight) or a dict, got {item!r}")
    if not isinstance(uri, (str, os.PathLike)):
        raise TypeError(f"source {i}: uri must be a str or path, not {type(uri).__name__}")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise TypeError(f"source {i} ({uri}): weight must be a number, not {weight!r}")
    s.uri = os.fspath(uri)
    s.weight = float(weight)  # C++ refuses <= 0 and NaN, naming the source
    return s


def _options(batch_size, sequence_length, *, seed=None, shuffle=None, rank=None,
             world_size=None, schedule=None, dtype=None, positions=None, verify=None,
             prefetch=None, store=None):
    """Mix's arguments as a _MixOptions; those left None keep MixOptions' defaults
    (include/stoker/mix.h)."""
    o = _stoker._MixOptions()
    o.batch_size = int(batch_size)
    o.sequence_length = int(sequence_length)
    if seed is not None:
        o.seed = int(seed)
    if shuffle is not None:
        o.shuffle = bool(shuffle)
    o.rank, o.world_size, _ = _rank_world(rank, world_size)
    if dtype is not None:
        o.sequence_dtype = dtype
    if positions is not None:
        o.sequence_positions = bool(positions)
    if verify is not None:
        o.sequence_verify = bool(verify)
    if prefetch is not None:
        o.prefetch_batches = int(prefetch)
    points = []
    for entry in schedule or ():
        step, weights = entry
        p = _stoker._MixSchedulePoint()
        p.step = int(step)
        p.weights = [float(w) for w in weights]
        if any(math.isnan(w) for w in p.weights):
            raise ValueError(f"schedule point at step {step}: a weight is NaN")
        points.append(p)
    o.schedule = points
    _store_options(store, o.store)
    return o


class Mix:
    """Iterable of this rank's part of each step's global batch (never ends).

    Args:
      sources: [(uri, weight), ...] or dicts with uri, weight and optionally
        sequence_length (must equal the mixture's) and field (the token field).
      batch_size: the global batch: windows per step over all ranks (a
        multiple of world_size); each rank gets batch_size / world_size.
      sequence_length: L; each window is L + 1 tokens.
      seed, shuffle: the order; the same on every rank.
      rank, world_size: from the environment when None.
      schedule: [(step, [weight per source]), ...], steps increasing, >= 1.
      dtype: "int64" (default) or "int32" tokens.
      positions: also deliver "positions" and "documents" (L + 1 each).
      verify: check every record a window reads against its checksum.
      format: "numpy" (default) or "torch".
      state: a state_dict() to resume from.

    Each batch: "tokens" (B / world, L + 1), "source" (int64: the source of
    each window), "sample_ids" (the window's number in its source's epoch).
    """

    def __init__(self, sources, batch_size, sequence_length, *, seed=None, shuffle=None,
                 rank=None, world_size=None, schedule=None, dtype=None, positions=None,
                 verify=None, format="numpy", prefetch=None, store=None, state=None):
        if isinstance(sources, (str, bytes)) or not isinstance(sources, collections.abc.Iterable):
            raise TypeError("sources must be a list of (uri, weight)")
        specs = [_source(i, item) for i, item in enumerate(sources)]
        o = self._options = _options(batch_size, sequence_length, seed=seed, shuffle=shuffle,
                                     rank=rank, world_size=world_size, schedule=schedule,
                                     dtype=dtype, positions=positions, verify=verify,
                                     prefetch=prefetch, store=store)
        if format not in ("numpy", "torch"):
            raise ValueError(f"format must be 'numpy' or 'torch', got {format!r}")
        if state is not None and not isinstance(state, collections.abc.Mapping):
            raise TypeError("state must be a dict from Mix.state_dict()")
        self._impl = _stoker._Mix(specs, o, dict(state) if state is not None else None)
        self.batch_size, self.sequence_length = o.batch_size, o.sequence_length
        self.rank, self.world_size = o.rank, o.world_size
        self.uris = [s.uri for s in specs]
        if format == "torch":
            import torch  # only when asked for

            self._impl.set_output(array=torch.from_numpy, signed_ids=True, widen_unsigned=True)
        else:
            self._impl.set_output(array=None, signed_ids=False, widen_unsigned=False)

    def __iter__(self):
        return self

    def __next__(self):
        return self._impl.next()

    def state_dict(self):
        """The step and each source's position after the last batch, with the
        mixture's identity (sources, weights, seed, sequence length, batch)."""
        return self._impl.state()

    def stats(self):
        """steps, bytes_read, windows (per source, this rank), epoch_windows, open_seconds."""
        return self._impl.stats()

    def weights_at(self, step):
        """The weights in effect at `step` (the schedule applied)."""
        return self._impl.weights_at(int(step))

    def __repr__(self):
        return (f"<stoker.Mix {len(self.uris)} sources batch_size={self.batch_size} "
                f"sequence_length={self.sequence_length} rank={self.rank}/{self.world_size}>")


def mix_counts(weights, batch, seed, step):
    """Each source's share of a global batch at `step` (stoker::MixCounts)."""
    return _stoker.mix_counts([float(w) for w in weights], int(batch), int(seed), int(step))
