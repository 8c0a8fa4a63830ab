"""Importers and the exporter: the formats training data already comes in.

    stoker.import_webdataset(["/data/laion/"], "/data/laion-ds")   # tars or folders of them
    stoker.import_jsonl(["corpus.jsonl"], "/data/corpus-ds",
                        fields={"text": "str", "tokens": ("uint32", None)})
    stoker.export_webdataset("/data/laion-ds", "/data/laion-tars")  # and back, byte-identical

The work is C++'s (``stoker/import.h``), the same code as ``stoker pack
--from webdataset|jsonl`` and ``stoker export --webdataset``. Nothing is
visible until the import commits; a failed or cancelled import leaves no
dataset. ``progress`` is called about every 16 MiB read (and at the end) with
a dict: ``samples``, ``bytes_read``, ``bytes_total``, ``shards``,
``skipped`` (export: ``samples``, ``samples_total``, ``bytes``,
``bytes_total``, ``tars``). An exception it raises, or Ctrl-C, stops the
import there, and is raised.
"""

from . import _stoker
from .writer import _type_text

__all__ = ["import_webdataset", "import_jsonl", "import_megatron", "export_webdataset"]


def _paths(p):
    if isinstance(p, (str, bytes)) or hasattr(p, "__fspath__"):
        return [str(p)]
    return [str(x) for x in p]


def _fields(fields):
    if fields is None:
        return []
    if not isinstance(fields, dict):
        raise TypeError("fields must be a dict of name -> type")
    return [(str(n), _type_text(t)) for n, t in fields.items()]


def import_webdataset(sources, uri, *, fields=None, skip_bad=False, shard_bytes=None,
                      threads=None, progress=None):
    """WebDataset tars (files, or folders of ``*.tar``) into a new dataset.

    Samples are grouped by key as WebDataset does (adjacent members; the key
    is the member's path up to the first dot of its file name); each
    extension becomes a field (``txt`` str, ``json`` json, the rest bytes;
    ``fields`` overrides by name, e.g. ``{"cls": "int64"}``), and ``__key__``
    keeps the key. ``skip_bad=True`` skips and counts bad samples instead of
    failing. Returns a summary dict (``samples``, ``skipped``, ``shards``,
    ``fields``, ...).
    """
    return _stoker.import_webdataset(_paths(sources), str(uri), _fields(fields), bool(skip_bad),
                                     int(shard_bytes or 0), int(threads or 0), progress)


def import_jsonl(paths, uri, *, fields=None, skip_bad=False, shard_bytes=None, threads=None,
                 progress=None):
    """JSONL files (one object a line) into a new dataset: ``fields`` names
    the keys to take and their types (as stoker.Writer's), or, when None, the
    first line decides. Errors name FILE:LINE and the key."""
    return _stoker.import_jsonl(_paths(paths), str(uri), _fields(fields), bool(skip_bad),
                                int(shard_bytes or 0), int(threads or 0), progress)


def import_megatron(paths, uri, *, shard_bytes=None, threads=None, progress=None):
    """Megatron-LM indexed datasets (each PREFIX, PREFIX.idx or PREFIX.bin) into
    a new token dataset: one record per sequence, its tokens byte for byte in
    a field "tokens" of the .idx's dtype, plus an int64
    "document" field where a document holds several sequences. A bad .idx is
    stoker.InvalidArgumentError naming the file, the offset and the field."""
    return _stoker.import_megatron(_paths(paths), str(uri), [], int(shard_bytes or 0),
                                   int(threads or 0), progress)


def export_webdataset(uri, out_dir, *, samples_per_tar=None, progress=None):
    """The dataset at ``uri`` as WebDataset tars ``OUT_DIR/000000.tar``, ...
    (``samples_per_tar``, default 10,000). A dataset imported from tars
    exports to the same members, byte for byte."""
    return _stoker.export_webdataset(str(uri), str(out_dir), int(samples_per_tar or 0), progress)
