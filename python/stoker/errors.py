"""stoker's exceptions: one class per status code of the C++ core.

Every error raised by stoker derives from :class:`StokerError` and also from
the built-in exception a Python programmer would catch for it, so both
``except stoker.NotFoundError`` and ``except FileNotFoundError`` work. The
message is the C++ Status message unchanged: it names what failed and where
(the URI, the shard, the sample). Each exception also carries ``code`` (the
status code's name as the core spells it, e.g. ``"Corruption"``) and ``retryable`` (a storage
timeout is, a checksum mismatch is not).

=====================  ===============================  =======================
C++ code               stoker class                     also a
=====================  ===============================  =======================
InvalidArgument        InvalidArgumentError             ValueError
NotFound               NotFoundError                    FileNotFoundError
AlreadyExists          AlreadyExistsError               FileExistsError
PermissionDenied       PermissionDeniedError            PermissionError
Corruption             CorruptionError                  -
Unsupported            UnsupportedError                 NotImplementedError
IoError                StorageIOError                   OSError
TimedOut               StorageTimeoutError              TimeoutError
Unavailable            UnavailableError                 ConnectionError
NoSpace                NoSpaceError                     OSError
Cancelled              CancelledError                   -
OutOfRange             OutOfRangeError                  IndexError
Internal               InternalError                    RuntimeError
=====================  ===============================  =======================
"""

__all__ = [
    "StokerError", "InvalidArgumentError", "NotFoundError", "AlreadyExistsError",
    "PermissionDeniedError", "CorruptionError", "UnsupportedError", "StorageIOError",
    "StorageTimeoutError", "UnavailableError", "NoSpaceError", "CancelledError",
    "OutOfRangeError", "InternalError",
]


class StokerError(Exception):
    """Base of every stoker error."""

    #: The C++ status code's name (stoker::CodeName), e.g. "Not found", "Corruption".
    code = "Unknown"
    #: Whether trying again may succeed (timeouts, unavailable services).
    retryable = False


class InvalidArgumentError(StokerError, ValueError):
    """The caller asked for something impossible (a bad option, a bad URI)."""


class NotFoundError(StokerError, FileNotFoundError):
    """An object, file or dataset does not exist."""


class AlreadyExistsError(StokerError, FileExistsError):
    """E.g. packing into a destination that already holds a dataset."""


class PermissionDeniedError(StokerError, PermissionError):
    """EPERM/EACCES, cephx refusals."""


class CorruptionError(StokerError):
    """Bad magic, bad checksum, an index out of bounds: the data is wrong."""


class UnsupportedError(StokerError, NotImplementedError):
    """E.g. a format version newer than this build, or a backend not built."""


class StorageIOError(StokerError, OSError):
    """Any other I/O failure."""


class StorageTimeoutError(StokerError, TimeoutError):
    """A deadline passed (retryable)."""


class UnavailableError(StokerError, ConnectionError):
    """A service cannot be reached right now (retryable)."""


class NoSpaceError(StokerError, OSError):
    """ENOSPC, a full pool."""


class CancelledError(StokerError):
    """The operation was abandoned (e.g. the loader was closed)."""


class OutOfRangeError(StokerError, IndexError):
    """Past the end of something."""


class InternalError(StokerError, RuntimeError):
    """A bug in stoker: please report it with the message."""


# Status code names (the C++ CodeName) to classes.
_BY_CODE_NAME = {
    "Invalid argument": InvalidArgumentError,
    "Not found": NotFoundError,
    "Already exists": AlreadyExistsError,
    "Permission denied": PermissionDeniedError,
    "Corruption": CorruptionError,
    "Unsupported": UnsupportedError,
    "I/O error": StorageIOError,
    "Timed out": StorageTimeoutError,
    "Unavailable": UnavailableError,
    "No space": NoSpaceError,
    "Cancelled": CancelledError,
    "Out of range": OutOfRangeError,
    "Internal error": InternalError,
}


def _register(ext):
    """Tells the extension which class to raise for each status code."""
    codes = ext.STATUS_CODES  # name -> number, from the C++ table
    missing = set(codes) ^ set(_BY_CODE_NAME)
    if missing:
        raise ImportError(f"stoker: status codes without an exception class: {sorted(missing)}")
    ext._register_errors({codes[name]: cls for name, cls in _BY_CODE_NAME.items()})
