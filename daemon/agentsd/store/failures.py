"""What a ``sqlite3`` error means for the store's callers.

Errors that mean "the storage is not usable right now" (disk full, I/O error,
read-only, cannot open) become ``StorageUnavailable``, here and nowhere else; every
other exception passes through as it is (``writer`` Rule 4).
"""

from __future__ import annotations

import sqlite3

from agentsd_protocol.errors import StorageUnavailable

__all__ = ["batch_failed", "storage_failure", "translate"]

_READONLY = "database is read-only"

# sqlite3 primary result codes that mean the storage, not the statement, failed.
_STORAGE_FAILURES = {
    sqlite3.SQLITE_FULL: "disk full",
    sqlite3.SQLITE_IOERR: "I/O error",
    sqlite3.SQLITE_READONLY: _READONLY,
    sqlite3.SQLITE_CANTOPEN: "cannot open the database file",
}


def storage_failure(exc: BaseException) -> str | None:
    """Why the storage is unusable, if ``exc`` says it is."""
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return None
    # Extended codes (SQLITE_IOERR_FSYNC, ...) carry the primary code in the low byte.
    return _STORAGE_FAILURES.get(code & 0xFF)


def translate(exc: BaseException, *, readonly_is_failure: bool = True) -> BaseException:
    """``StorageUnavailable`` for storage failures, ``exc`` itself otherwise."""
    reason = storage_failure(exc)
    if reason is None or (not readonly_is_failure and reason == _READONLY):
        return exc
    unavailable = StorageUnavailable(f"storage unavailable: {reason} ({exc})")
    unavailable.__cause__ = exc
    return unavailable


def batch_failed(exc: BaseException) -> StorageUnavailable:
    """The error each caller of a batch gets when its transaction failed."""
    reason = storage_failure(exc)
    if reason is None and getattr(exc, "sqlite_errorcode", None) in (
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
    ):
        reason = "database is locked by another connection"
    failure = StorageUnavailable(f"storage unavailable: {reason or exc}; the write was rolled back")
    failure.__cause__ = exc
    return failure
