"""stoker.Writer: write a dataset of your own records.

    with stoker.Writer("file:///data/ds", fields={
            "image": "jpeg", "caption": "str", "meta": "json",
            "tokens": ("uint32", None), "emb": ("float16", (512,))}) as w:
        for rec in records:
            w.write(rec)          # a dict with every field

Field types are C++'s (``stoker/format.h`` ParseFieldSpec): ``bytes``,
``jpeg``/``png``/``image`` (bytes), ``int64``, ``float32``, ``float64``,
``str``, ``json``, or an array ``"DTYPE[SHAPE]"`` (``"uint32[*]"``,
``"float32[3,224,224]"``); a tuple ``(dtype, shape)`` is the same, with
``None`` for the variable first dimension (``("uint32", None)`` is
``"uint32[*]"``). Values: bytes-like objects or numpy arrays (taken without a
copy), ``str``, any JSON-serialisable object for ``json`` (a ``str`` is taken
as JSON text), numbers, lists for arrays.

Nothing is visible until the ``with`` block ends without an exception (or
``close()``): the manifest is written last. An exception inside the block
leaves no dataset, and a later writer into the same place cleans up.

Parallel writers: ``Writer(uri, fields=..., part=k)`` in each of ``P``
processes, then ``stoker.commit_parts(uri, P)`` once.
"""

from . import _stoker

__all__ = ["Writer", "commit_parts"]


def _type_text(t):
    if isinstance(t, str):
        return t
    if isinstance(t, tuple) and len(t) == 2:
        dtype, shape = t
        if shape is None:
            dims = ["*"]
        elif isinstance(shape, int):
            dims = [str(shape)]
        else:
            dims = ["*" if d is None else str(d) for d in shape]
        return "%s[%s]" % (dtype, ",".join(dims))
    raise TypeError("field type must be a string or (dtype, shape), not %r" % (t,))


class Writer:
    """A dataset writer (C++ DatasetWriter). See the module's docstring."""

    def __init__(self, uri, fields, *, shard_bytes=None, threads=None, classes=None,
                 part=None, progress=None):
        if not isinstance(fields, dict) or not fields:
            raise TypeError("fields must be a non-empty dict of name -> type")
        schema = [(str(name), _type_text(t)) for name, t in fields.items()]
        self._names = [name for name, _ in schema]
        cb = None
        if progress is not None:
            def cb(records, nbytes, shards):
                progress({"records": records, "bytes": nbytes, "shards": shards})
        self._w = _stoker._Writer(uri, schema, shard_bytes or 0, threads or 0,
                                  list(classes or []), part, cb)
        self._closed = None

    def write(self, record):
        """Appends one record: a dict holding every field (or a sequence in
        schema order)."""
        if isinstance(record, dict):
            try:
                values = [record[n] for n in self._names]
            except KeyError as e:
                raise KeyError("record %d has no field %s (fields: %s)" %
                               (self._w.records, e, ", ".join(self._names))) from None
            if len(record) != len(self._names):
                extra = sorted(set(record) - set(self._names))
                raise ValueError("record %d: fields not in the schema: %s" %
                                 (self._w.records, ", ".join(map(str, extra))))
        else:
            values = list(record)
        self._w.write(values)

    @property
    def records(self):
        return self._w.records

    def close(self):
        """Commits the dataset (table, then manifest); returns its summary."""
        if self._closed is None:
            self._closed = self._w.close()
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            # Nothing committed: dropping the writer stops its workers and
            # leaves no manifest.
            self._w = None
        return False


def commit_parts(uri, parts):
    """Commits a dataset written by ``parts`` Writers with ``part=0..parts-1``."""
    return _stoker.commit_parts(uri, int(parts))
