"""The `insitubatch.Error` hierarchy. Each class also derives from the builtin a caller would
catch for that kind of failure (`ValueError` for bad arguments, `OSError` for IO...)."""

from __future__ import annotations


class Error(Exception):
    """Base of every insitubatch error; `status` is the C ABI status number."""

    status = 12


class InvalidArgument(Error, ValueError):
    status = 2


class NullPointer(Error, ValueError):
    status = 3


class NotFound(Error, FileNotFoundError):
    status = 4


class IOFailure(Error, OSError):
    status = 5


class BadData(Error):
    """A corrupt chunk, unreadable metadata, or not a Zarr store."""

    status = 6


class Unsupported(Error, NotImplementedError):
    status = 7


class BudgetError(Error):
    """The chunk pool's budget cannot hold this iteration (set cache_budget_bytes)."""

    status = 8


class Cancelled(Error):
    """The iteration was cancelled, closed, or failed earlier."""

    status = 9


class InternalError(Error):
    """A panic or another bug inside insitubatch."""

    status = 10


class WrongProcess(Error):
    """The dataset belongs to another process (used in a child after fork)."""

    status = 11


class CacheLocked(Error, OSError):
    """Another process holds the cache directory's lock (the message names its PID and host)."""

    status = 13


class StaleCache(Error):
    """The cache directory holds chunks made by another chunk-transform pipeline or log
    format (pass reset_stale_cache=True to rebuild just those arrays)."""

    status = 14


class CacheMiss(Error, LookupError):
    """readonly_cache=True and a chunk the iteration needs is not in the cache."""

    status = 15


class TransformError(Error):
    """A chunk transform failed on a chunk (a `transforms.Function` raised, or returned an
    array of another shape than it declared); the message names the transform, the array and
    the chunk, and ends with what the function raised."""

    status = 17


class CacheWarning(UserWarning):
    """A cache that is configured but not working as configured (a network cache_dir, a write
    that failed, a persistent cache that served no hits)."""


class Closed(Error, ValueError):
    """The dataset (or iteration) is closed."""

    status = 9


_BY_STATUS = {
    2: InvalidArgument,
    3: NullPointer,
    4: NotFound,
    5: IOFailure,
    6: BadData,
    7: Unsupported,
    8: BudgetError,
    9: Cancelled,
    10: InternalError,
    11: WrongProcess,
    12: InternalError,
    13: CacheLocked,
    14: StaleCache,
    15: CacheMiss,
    17: TransformError,
}


def from_status(status: int, message: str) -> Error:
    return _BY_STATUS.get(status, InternalError)(message)
