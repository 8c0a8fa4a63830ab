"""Dataset tools: pack, inspect, verify (what the `stoker` command does).

Each releases the GIL while it works and raises a stoker error (see
stoker.errors) with the core's message when it cannot do its job.
"""

import numbers
import os

from . import _stoker

__all__ = ["pack", "inspect", "verify"]


def _path(name, value):
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or path, not {type(value).__name__}")
    value = os.fspath(value)
    if not value:
        raise ValueError(f"{name} is empty")
    return value


def pack(src, dst, shard_mib=4, threads=0, progress=None, shuffle=True, seed=0):
    """Packs many small files into shards and a manifest; returns inspect(dst).

    Args:
      src: an ImageFolder tree (ROOT/CLASS/FILE; sorted class folders become
        labels 0, 1, ...) or a list file of "PATH LABEL" lines. Each sample
        gets a bytes field "image" (the file's bytes) and an int64 "label".
      dst: the dataset URI (a path, file://, rados://, mem://). A destination
        that already holds a dataset is refused (stoker.AlreadyExistsError).
      shard_mib: target shard size in MiB (default 4, Ceph's object size).
      threads: reader/writer workers; 0 = 2 x cores.
      progress: optional callable(dict) with files_done, files_total,
        bytes_done, bytes_total, shards_written; called from pack's workers.
        If it raises, the exception is raised when pack returns.
      shuffle: shuffle the samples (seeded by `seed`) before cutting shards,
        so that shards mix classes; sample ids are then positions in the
        packed order. False keeps the source order (sample id = source index).
    """
    src, dst = _path("src", src), _path("dst", dst)
    if isinstance(shard_mib, bool) or not isinstance(shard_mib, numbers.Real):
        raise TypeError(f"shard_mib must be a number, not {type(shard_mib).__name__}")
    if not 0 < shard_mib <= 4096:
        raise ValueError(f"shard_mib must be above 0 and at most 4096 (4 GiB), got {shard_mib}")
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 0:
        raise ValueError(f"threads must be an int >= 0, got {threads!r}")
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable")
    return _stoker.pack(src, dst, shard_bytes=int(shard_mib * (1 << 20)), threads=int(threads),
                        progress=progress, shuffle=bool(shuffle), seed=int(seed))


def inspect(uri):
    """What a dataset holds, from its manifest and shard table: a dict with
    uri, format_version, dataset_id, samples, shards, shard_samples, bytes,
    payload_bytes, max_sample_bytes, fields ([{"name", "type"}]), classes,
    created_by, shard_table ({"key", "records", "bytes", "header_hash"}, or
    None for a format v1 dataset, whose manifest lists its shards).

    stoker.NotFoundError when there is no dataset at uri; CorruptionError when
    its manifest or shard table is damaged.
    """
    return _stoker.inspect(_path("uri", uri))


def verify(uri, reads_in_flight=8):
    """Reads every byte of a dataset and checks every checksum.

    Returns a report: {"uri", "ok", "shards_checked", "samples_checked",
    "bytes_read", "problems": [{"shard", "sample" (global id, or None for the
    whole shard), "code", "message"}]}. Bad shards and samples are problems in
    the report (verify goes on past the first); a missing or damaged manifest
    raises (NotFoundError, CorruptionError), since nothing can be checked
    without it.
    """
    if (isinstance(reads_in_flight, bool) or not isinstance(reads_in_flight, numbers.Integral)
            or not 1 <= reads_in_flight <= 4096):
        raise ValueError(f"reads_in_flight must be between 1 and 4096, got {reads_in_flight!r}")
    return _stoker.verify(_path("uri", uri), reads_in_flight=int(reads_in_flight))
