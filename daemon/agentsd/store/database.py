"""Opening the SQLite database and migrating its schema forward.

Rule 1: an existing file is never changed before its schema version was read through
a read-only connection. A file written by a newer agentsd raises ``SchemaTooNew`` and
stays byte-for-byte as it was.

Rule 2: migrations only go forward, one version per function, each in its own
transaction together with the ``PRAGMA user_version`` bump, so a crash mid-migration
leaves the file at the last complete version.

Rule 3: every connection this module returns runs in autocommit mode
(``isolation_level=None``): transactions are opened explicitly by the caller (the
store's writer), never implicitly by the ``sqlite3`` module.

Rule 4: every connection this module returns is a ``StoreConnection``, which carries
its writer's memory (``memory``). The store's functions keep that memory in step with
the tables, so events, sessions and ledger entries are written only through them and
only through that one connection (one daemon per state directory).

Rule 5: a read-write open checks an existing file first (``integrity``) and refuses
a damaged one with ``DatabaseDamaged``, leaving it exactly as it was.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentsd.store.integrity import check_at_start
from agentsd.store.memory import WriterMemory

__all__ = [
    "BUSY_TIMEOUT_MS",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "WAL_AUTOCHECKPOINT_PAGES",
    "WAL_SIZE_LIMIT_BYTES",
    "SchemaTooNew",
    "StoreConnection",
    "open_database",
]

# How long a statement waits for a lock held by another connection before failing
# with SQLITE_BUSY. Only our own read connection and tools like `sqlite3` share the
# file (one daemon per state dir), so contention is brief; five seconds rides out a
# checkpoint or a human poking at the file without hanging a write forever.
BUSY_TIMEOUT_MS = 5000

# WAL frames after which a commit checkpoints (SQLite's default is 1000). Appends
# to many sessions dirty one leaf page per session per commit, so the WAL fills with
# copies of the same hot pages; a checkpoint writes each page once however often it
# was rewritten, so checkpointing less often saves disk writes (measured: a commit
# of 1000 events across 100 sessions ~13 ms at 1000, ~9.5 ms at 4000, ~8 ms at
# 10000). The price: a WAL of up to 16 MB (4 KiB pages), and after each start, until
# the new WAL first reaches that size, commits grow the file, which makes each
# fdatasync flush metadata too (a lone commit then costs ~1.5x).
WAL_AUTOCHECKPOINT_PAGES = 4000

# What SQLite cuts the WAL file back to when it starts it over after a checkpoint
# (``journal_size_limit``). Without it the file keeps the largest size it ever
# reached: a reader that held an old snapshot while writes went on lets it grow
# past the autocheckpoint size, and that space would never return to the disk.
# The size the log has when it checkpoints (a 32-byte header, then per frame a
# 24-byte header and a 4 KiB page), so the usual cycle (grow to it, start over)
# keeps its file and commits keep not extending it.
WAL_SIZE_LIMIT_BYTES = 32 + WAL_AUTOCHECKPOINT_PAGES * (24 + 4096)


class SchemaTooNew(Exception):
    """The database was written by a newer agentsd than this one.

    Raised before anything in the file was changed. ``found`` and ``supported`` are
    schema versions (``PRAGMA user_version``).
    """

    def __init__(self, found: int, supported: int, *, path: Path | str) -> None:
        super().__init__(
            f"database {path} has schema version {found}, newer than this agentsd "
            f"supports ({supported}); upgrade agentsd or point --state-dir elsewhere"
        )
        self.found = found
        self.supported = supported
        self.path = Path(path)


class StoreConnection(sqlite3.Connection):
    """A connection with the memory its writer keeps (``memory`` Rule 2)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.memory = WriterMemory()


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    # One statement per execute(): executescript() would COMMIT the migration's
    # transaction behind our back.
    statements = (
        """
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            host_id TEXT NOT NULL,
            provider TEXT NOT NULL,
            cwd TEXT NOT NULL,
            title TEXT,
            options TEXT NOT NULL,
            env TEXT NOT NULL,
            command TEXT,
            provider_handle TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            fence INTEGER NOT NULL DEFAULT 0,
            head_seq INTEGER NOT NULL DEFAULT 0,
            last_exit TEXT,
            error TEXT
        )
        """,
        """
        CREATE TABLE leases (
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            fence INTEGER NOT NULL,
            generation TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('reserved', 'live', 'released')),
            token TEXT NOT NULL,
            pid INTEGER,
            start_time INTEGER,
            pgid INTEGER,
            acquired_at REAL NOT NULL,
            live_at REAL,
            released_at REAL,
            death TEXT,
            PRIMARY KEY (session_id, fence)
        )
        """,
        """
        CREATE INDEX leases_held ON leases (session_id) WHERE state != 'released'
        """,
        """
        CREATE TABLE events (
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            ts REAL NOT NULL,
            fence INTEGER NOT NULL,
            kind TEXT NOT NULL,
            body BLOB NOT NULL,
            PRIMARY KEY (session_id, seq)
        ) WITHOUT ROWID
        """,
        """
        CREATE TABLE operations (
            op_id TEXT PRIMARY KEY,
            method TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            result BLOB NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL
        )
        """,
        """
        CREATE INDEX operations_expiry ON operations (expires_at)
        """,
    )
    for statement in statements:
        conn.execute(statement)


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    # The writer keeps each session's head seq in memory and reads it from the
    # events' primary key when it first needs it, so appends no longer update the
    # session row (a second page in every commit). A column nobody keeps current
    # would only mislead: it goes. ``updated_at`` stays, for the record's own
    # changes; a session's latest activity is that or its last event's ts.
    conn.execute("ALTER TABLE sessions DROP COLUMN head_seq")


def _migrate_2_to_3(conn: sqlite3.Connection) -> None:
    # Events in append order: a rowid table (new rows go to its last page) with the
    # (session_id, seq) key as a unique index. Clustered by session (version 2), a
    # commit of one event for each of N sessions inserted into the middle of N leaf
    # pages, and SQLite balances a leaf that overflows in the middle of a tree with
    # its siblings: ~2 WAL frames per event. Here the rows fill one or two table
    # pages and only the small index entries land in N places (measured, 100
    # sessions x 1 event per commit: 196 -> 128 frames per commit, 41k -> 57k
    # events/s). The price is on reads: a session's events are no longer
    # contiguous, so a page of them visits as many table pages as the events
    # interleaved with other sessions' (a session that writes alone, like a turn's
    # burst, still reads sequentially). Old rows are copied in (session_id, seq)
    # order, so they stay contiguous per session.
    statements = (
        """
        CREATE TABLE events_v3 (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            ts REAL NOT NULL,
            fence INTEGER NOT NULL,
            kind TEXT NOT NULL,
            body BLOB NOT NULL
        )
        """,
        """
        INSERT INTO events_v3 (session_id, seq, ts, fence, kind, body)
        SELECT session_id, seq, ts, fence, kind, body FROM events ORDER BY session_id, seq
        """,
        "DROP TABLE events",
        "ALTER TABLE events_v3 RENAME TO events",
        "CREATE UNIQUE INDEX events_session_seq ON events (session_id, seq)",
    )
    for statement in statements:
        conn.execute(statement)


def _migrate_3_to_4(conn: sqlite3.Connection) -> None:
    # A session's own limits (memory, pids, cpu) given at create, as JSON in the
    # wire's names; NULL: the daemon's defaults apply (every older session). And the
    # session whose agent created it (``agent_allowance = ["sessions"]``); NULL: the
    # user did.
    conn.execute("ALTER TABLE sessions ADD COLUMN limits TEXT")
    conn.execute("ALTER TABLE sessions ADD COLUMN created_by TEXT")


def _migrate_4_to_5(conn: sqlite3.Connection) -> None:
    # Where the next daemon resumes reading a held agent's stdout after a crash
    # (``crash_policy = "reattach"``): the offset of the first byte whose effects are
    # not all journaled, and how many of that line's events are. Written in the same
    # transaction as those events, so what the holder is told it may drop is always
    # journaled. 0, 0 for every older lease: their agents are not held.
    conn.execute("ALTER TABLE leases ADD COLUMN out_offset INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE leases ADD COLUMN out_skip INTEGER NOT NULL DEFAULT 0")


# MIGRATIONS[n] takes a database from version n to n + 1. Append only: a released
# migration is never edited, because files in the field already ran it.
MIGRATIONS: Sequence[Callable[[sqlite3.Connection], None]] = (
    _migrate_0_to_1,
    _migrate_1_to_2,
    _migrate_2_to_3,
    _migrate_3_to_4,
    _migrate_4_to_5,
)

SCHEMA_VERSION = 5


def _ro_uri(path: Path, *, immutable: bool) -> str:
    uri = "file:" + urllib.parse.quote(str(path.absolute())) + "?mode=ro"
    return uri + "&immutable=1" if immutable else uri


def _probe_version(path: Path) -> int:
    """Read ``user_version`` of an existing file without writing anything.

    A plain ``mode=ro`` connection to a WAL file creates empty ``-wal``/``-shm``
    files next to it. When no ``-wal`` or ``-journal`` file exists the main file
    alone holds every committed page, so ``immutable=1`` reads it with no side
    files at all; otherwise those side files exist already and SQLite must read
    them to see the latest commit.
    """
    side_files = (path.with_name(path.name + suffix) for suffix in ("-wal", "-journal"))
    immutable = not any(p.exists() for p in side_files)
    probe = sqlite3.connect(
        _ro_uri(path, immutable=immutable), uri=True, timeout=BUSY_TIMEOUT_MS / 1000
    )
    try:
        version: int = probe.execute("PRAGMA user_version").fetchone()[0]
    finally:
        probe.close()
    return version


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    while True:
        # BEGIN IMMEDIATE takes the write lock before reading the version, so the
        # version we migrate from is the one we commit on top of.
        conn.execute("BEGIN IMMEDIATE")
        try:
            version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise SchemaTooNew(version, SCHEMA_VERSION, path=path)
            if version == SCHEMA_VERSION:
                conn.execute("COMMIT")
                return
            MIGRATIONS[version](conn)
            # PRAGMA takes no bound parameters; the value is an int we computed.
            conn.execute(f"PRAGMA user_version = {version + 1:d}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


def open_database(path: Path, *, readonly: bool = False) -> StoreConnection:
    """Open (creating and migrating if needed) the database at ``path``.

    Read-write: creates the parent directory (mode 0700) and the file (mode 0600,
    which SQLite copies to ``-wal``/``-shm``), switches to WAL with
    ``synchronous=FULL``, checkpoints every ``WAL_AUTOCHECKPOINT_PAGES`` and cuts a
    restarted WAL back to ``WAL_SIZE_LIMIT_BYTES``, enables
    foreign keys, applies pending migrations and counts the ledger's rows into the
    connection's memory.

    ``readonly=True`` opens with ``mode=ro``: it never creates, migrates or writes,
    so it expects a file already migrated by a read-write open.

    The connection is in autocommit mode (``isolation_level=None``) and may be used
    from any thread, one thread at a time (``check_same_thread=False``). The caller
    closes it.

    Read-write, an existing file first passes the start-up check of
    ``agentsd.store.integrity``.

    Raises ``DatabaseDamaged`` (file untouched) if that check fails, ``SchemaTooNew``
    (file untouched) if the file's schema is newer than ``SCHEMA_VERSION``, and
    ``sqlite3.Error`` if SQLite cannot open or migrate it.
    """
    if not readonly:
        check_at_start(path)
    if path.exists():
        found = _probe_version(path)
        if found > SCHEMA_VERSION:
            raise SchemaTooNew(found, SCHEMA_VERSION, path=path)
    elif readonly:
        raise FileNotFoundError(f"database {path} does not exist")

    timeout_s = BUSY_TIMEOUT_MS / 1000
    if readonly:
        conn = sqlite3.connect(
            _ro_uri(path, immutable=False),
            uri=True,
            timeout=timeout_s,
            isolation_level=None,
            check_same_thread=False,
            factory=StoreConnection,
        )
    else:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Sessions carry their environment (API keys among it): keep the file
        # private even if the directory's mode was loosened.
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        conn = sqlite3.connect(
            path,
            timeout=timeout_s,
            isolation_level=None,
            check_same_thread=False,
            factory=StoreConnection,
        )
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS:d}")
        conn.execute("PRAGMA foreign_keys = ON")
        if not readonly:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise sqlite3.OperationalError(f"cannot switch {path} to WAL (got {mode!r})")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES:d}")
            conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES:d}")
            _migrate(conn, path)
            conn.memory.load_operation_rows(conn)
    except BaseException:
        conn.close()
        raise
    return conn
