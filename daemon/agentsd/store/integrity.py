"""Whether a database file can be trusted, checked before anything is served from it.

Rule 1: the checks only read. A damaged file is never changed here: not written,
not emptied, not checkpointed (a file without a write-ahead log is read with
``immutable=1``, which creates no side files either).

Rule 2: at start-up the check is cheap and bounded (`check_at_start`): the header
(an SQLite file, not shorter than its pages), the write-ahead log (a WAL database
whose ``-shm`` index remains without its ``-wal`` log lost the log, and with it
every commit since the last checkpoint), then ``PRAGMA quick_check`` for at most
``START_CHECK_BUDGET_S`` (measured: 0.25 s for 100 MB with a warm cache; a larger
file is checked as far as the budget reaches and the log says so). A full
``PRAGMA integrity_check`` runs on request (`full_check`: ``agentsd --check``).

What cannot be seen: a log deleted together with its index after an unclean stop
looks exactly like a clean stop, and a commit lost that way leaves no trace in
the file. Only the index left behind betrays the lost log.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
import urllib.parse
from pathlib import Path

from agentsd.store.failures import storage_failure

__all__ = [
    "START_CHECK_BUDGET_S",
    "DatabaseDamaged",
    "check_at_start",
    "check_files",
    "full_check",
]

log = logging.getLogger(__name__)

# How long the start-up quick_check may take before the rest is left unchecked: a
# daemon that takes seconds to start would be restarted by impatient users.
START_CHECK_BUDGET_S = 2.0
_PROGRESS_OPS = 10_000  # SQLite VM steps between deadline checks (~1 ms)
_HEADER = b"SQLite format 3\x00"
_MAX_PROBLEMS = 5  # integrity_check lines kept for the message


class DatabaseDamaged(Exception):
    """The database at ``path`` cannot be trusted; ``detail`` says what is wrong.
    The file was left exactly as it was."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(
            f"database {path} is damaged ({detail}); it was left as it is. Run "
            f"`agentsd --salvage` to copy what can be read into a fresh database "
            "(the damaged files are kept beside it), or restore it from a backup"
        )
        self.path = path
        self.detail = detail


def check_at_start(path: Path) -> None:
    """The bounded start-up check (Rule 2) of an existing ``path``; nothing to check
    when it does not exist. Raises ``DatabaseDamaged``."""
    if not path.exists():
        return
    check_files(path)
    problems = _pragma_check(path, "quick_check", START_CHECK_BUDGET_S)
    if problems is None:
        log.warning(
            "the start-up check of %s stopped after %g s; run `agentsd --check` for a full one",
            path,
            START_CHECK_BUDGET_S,
        )
    elif problems:
        raise DatabaseDamaged(path, problems[0])


def full_check(path: Path) -> list[str]:
    """Every problem ``PRAGMA integrity_check`` finds (at most a few), after the
    file checks; an empty list when the database is sound. Raises
    ``FileNotFoundError`` when there is no database."""
    if not path.exists():
        raise FileNotFoundError(f"database {path} does not exist")
    try:
        check_files(path)
    except DatabaseDamaged as exc:
        return [exc.detail]
    problems = _pragma_check(path, "integrity_check", None)
    assert problems is not None  # no budget: never cut short
    return problems


def check_files(path: Path) -> None:
    """The header and the write-ahead log's files (Rule 2). Raises ``DatabaseDamaged``."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
        size = os.stat(path).st_size
    except OSError:
        return  # not damage but unusable storage: opening it says so (StorageUnavailable)
    if size == 0:
        return  # created, never written: SQLite makes it a database on first use
    if len(header) < 100 or not header.startswith(_HEADER):
        raise DatabaseDamaged(path, "it does not start with an SQLite header")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The page count in the header is valid when the change counter matches the
    # "version valid for" number (SQLite file format, section 1.3.7).
    counted = header[24:28] == header[92:96] and pages > 0
    if counted and pages * page_size > size:
        raise DatabaseDamaged(
            path, f"it is truncated: {size} bytes where its header counts {pages * page_size}"
        )
    wal_mode = header[18] == 2 and header[19] == 2
    wal = path.with_name(path.name + "-wal")
    shm = path.with_name(path.name + "-shm")
    if wal_mode and shm.exists() and not wal.exists():
        raise DatabaseDamaged(
            path,
            f"its write-ahead log {wal.name} is missing while {shm.name} remains: "
            "the commits since its last checkpoint are lost",
        )


def _pragma_check(path: Path, pragma: str, budget_s: float | None) -> list[str] | None:
    """The problems ``PRAGMA <pragma>`` reports ([] when it says ok), or None when
    ``budget_s`` ran out first."""
    side_files = (path.with_name(path.name + s) for s in ("-wal", "-journal"))
    immutable = not any(p.exists() for p in side_files)  # Rule 1
    uri = "file:" + urllib.parse.quote(str(path.absolute())) + "?mode=ro"
    if immutable:
        uri += "&immutable=1"
    conn = sqlite3.connect(uri, uri=True, timeout=5.0)  # opens lazily: never raises here
    try:
        if budget_s is not None:
            deadline = time.monotonic() + budget_s
            conn.set_progress_handler(lambda: time.monotonic() > deadline, _PROGRESS_OPS)
        try:
            rows = conn.execute(f"PRAGMA {pragma}({_MAX_PROBLEMS})").fetchall()
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_INTERRUPT:
                return None
            if storage_failure(exc) is not None:
                # Not damage but unusable storage (an I/O error, a directory where
                # the file should be): opening it says so (StorageUnavailable).
                return []
            raise DatabaseDamaged(path, str(exc)) from None
    finally:
        conn.close()
    # A report may span lines and open with "*** in database main ***": one line
    # per problem, that header dropped.
    problems = [
        " ".join(line.removeprefix("*** in database main ***").split())
        for row in rows
        if (line := str(row[0]))
    ]
    return [] if problems == ["ok"] else [p for p in problems if p]
