"""Opening, migrating and refusing databases (real SQLite files, no mocks)."""

from __future__ import annotations

import hashlib
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from agentsd.store import database
from agentsd.store.database import SCHEMA_VERSION, SchemaTooNew, open_database
from agentsd.store.journal import StoredEvent, append_events, read_events
from agentsd.store.leases import held_output, load_held_leases
from agentsd.store.sessions import load_sessions

EXPECTED_COLUMNS = {
    "sessions": [
        "id",
        "host_id",
        "provider",
        "cwd",
        "title",
        "options",
        "env",
        "command",
        "provider_handle",
        "created_at",
        "updated_at",
        "fence",
        "last_exit",
        "error",
        "limits",
        "created_by",
    ],
    "leases": [
        "session_id",
        "fence",
        "generation",
        "state",
        "token",
        "pid",
        "start_time",
        "pgid",
        "acquired_at",
        "live_at",
        "released_at",
        "death",
        "out_offset",
        "out_skip",
    ],
    "events": ["id", "session_id", "seq", "ts", "fence", "kind", "body"],
    "operations": ["op_id", "method", "fingerprint", "result", "created_at", "expires_at"],
}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _listing(directory: Path) -> dict[str, str]:
    return {p.name: _digest(p) for p in sorted(directory.iterdir())}


def _schema(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    return conn.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name"
    ).fetchall()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "agentsd" / "agentsd.sqlite3"


@pytest.fixture
def opened(db_path: Path) -> Iterator[sqlite3.Connection]:
    with closing(open_database(db_path)) as conn:
        yield conn


def _insert_session(conn: sqlite3.Connection, session_id: str = "s1") -> None:
    conn.execute(
        "INSERT INTO sessions (id, host_id, provider, cwd, options, env, created_at, updated_at)"
        " VALUES (?, 'h', 'mock', '/', '{}', '{}', 0, 0)",
        (session_id,),
    )


def test_open_creates_directory_file_and_schema_v5(db_path: Path) -> None:
    with closing(open_database(db_path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
        for table, columns in EXPECTED_COLUMNS.items():
            found = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            assert found == columns, table
        indexes = {row[1]: row[4] for row in conn.execute("SELECT * FROM sqlite_master")}
        assert "WHERE state != 'released'" in indexes["leases_held"]
        assert "expires_at" in indexes["operations_expiry"]
        assert "WITHOUT ROWID" not in indexes["events"]
        assert (
            "UNIQUE INDEX events_session_seq ON events (session_id, seq)"
            in (indexes["events_session_seq"])
        )
    assert stat.S_IMODE(db_path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(db_path.stat().st_mode) == 0o600


def test_empty_existing_file_is_migrated(db_path: Path) -> None:
    # What a crash between creating the file and SQLite's first write leaves.
    db_path.parent.mkdir(parents=True)
    db_path.touch()
    with closing(open_database(db_path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert [row[0] for row in conn.execute("SELECT count(*) FROM sessions")] == [0]


def test_connection_settings(opened: sqlite3.Connection) -> None:
    assert opened.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert opened.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert opened.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert opened.execute("PRAGMA busy_timeout").fetchone()[0] == database.BUSY_TIMEOUT_MS
    assert (
        opened.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        == database.WAL_AUTOCHECKPOINT_PAGES
    )
    assert opened.isolation_level is None
    assert not opened.in_transaction


def test_connection_usable_from_another_thread(opened: sqlite3.Connection) -> None:
    import threading

    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(opened.execute("SELECT 1").fetchone()[0]))
    thread.start()
    thread.join()
    assert seen == [1]


def test_reopen_is_a_no_op(db_path: Path) -> None:
    with closing(open_database(db_path)) as conn:
        _insert_session(conn)
        before = _schema(conn)
    digest = _digest(db_path)
    with closing(open_database(db_path)) as conn:
        assert _schema(conn) == before
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT id FROM sessions").fetchall() == [("s1",)]
    assert _digest(db_path) == digest


def test_migrations_run_in_order_each_in_one_transaction(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    applied: list[int] = []
    current = SCHEMA_VERSION

    def add_column(conn: sqlite3.Connection) -> None:
        applied.append(current)
        assert conn.in_transaction
        conn.execute("ALTER TABLE sessions ADD COLUMN extra TEXT")

    def half_done(conn: sqlite3.Connection) -> None:
        applied.append(current + 1)
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("migration bug")

    with closing(open_database(db_path)):
        pass
    monkeypatch.setattr(database, "MIGRATIONS", (*database.MIGRATIONS, add_column, half_done))
    monkeypatch.setattr(database, "SCHEMA_VERSION", current + 2)
    with pytest.raises(RuntimeError, match="migration bug"):
        open_database(db_path)
    assert applied == [current, current + 1]
    with closing(sqlite3.connect(db_path)) as check:
        # The first new migration committed with its version bump; the failed one
        # after it left nothing behind.
        assert check.execute("PRAGMA user_version").fetchone()[0] == current + 1
        columns = [row[1] for row in check.execute("PRAGMA table_info(sessions)")]
        assert columns[-1] == "extra"
        tables = {row[0] for row in check.execute("SELECT name FROM sqlite_master")}
        assert "half_done" not in tables


def _make_future_file(path: Path, journal_mode: str) -> None:
    path.parent.mkdir(parents=True)
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(f"PRAGMA journal_mode = {journal_mode}")
        conn.execute("CREATE TABLE from_the_future (x)")
        conn.execute("INSERT INTO from_the_future VALUES (1)")
        conn.execute("PRAGMA user_version = 99")


@pytest.mark.parametrize("journal_mode", ["wal", "delete"])
@pytest.mark.parametrize("readonly", [False, True])
def test_schema_too_new_is_refused_and_file_unchanged(
    db_path: Path, journal_mode: str, readonly: bool
) -> None:
    _make_future_file(db_path, journal_mode)
    before = _listing(db_path.parent)
    with pytest.raises(SchemaTooNew) as caught:
        open_database(db_path, readonly=readonly)
    assert (caught.value.found, caught.value.supported) == (99, SCHEMA_VERSION)
    assert str(caught.value) == (
        f"database {db_path} has schema version 99, newer than this agentsd supports "
        f"({SCHEMA_VERSION}); upgrade agentsd or point --state-dir elsewhere"
    )
    # Byte for byte, and no -wal/-shm left behind.
    assert _listing(db_path.parent) == before


def test_schema_too_new_seen_through_a_live_wal(db_path: Path) -> None:
    # The newer version sits only in the -wal of a connection that is still open.
    db_path.parent.mkdir(parents=True)
    with closing(sqlite3.connect(db_path, isolation_level=None)) as other:
        other.execute("PRAGMA journal_mode = wal")
        other.execute("PRAGMA wal_autocheckpoint = 0")
        other.execute("CREATE TABLE t (x)")
        other.execute("PRAGMA user_version = 7")
        main_before = _digest(db_path)
        with pytest.raises(SchemaTooNew) as caught:
            open_database(db_path)
        assert caught.value.found == 7
        assert _digest(db_path) == main_before


def test_readonly_connection_refuses_writes(db_path: Path) -> None:
    with closing(open_database(db_path)):
        pass
    with closing(open_database(db_path, readonly=True)) as ro:
        assert ro.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            _insert_session(ro)


def test_readonly_open_of_missing_file_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        open_database(tmp_path / "nope" / "db.sqlite3", readonly=True)
    assert list(tmp_path.iterdir()) == []


def test_foreign_keys_cascade_and_lease_state_is_checked(opened: sqlite3.Connection) -> None:
    def insert_lease(state: str) -> None:
        opened.execute(
            "INSERT INTO leases (session_id, fence, generation, state, token, acquired_at)"
            " VALUES ('s1', 1, 'g', ?, 't', 0)",
            (state,),
        )

    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        insert_lease("reserved")
    _insert_session(opened)
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
        insert_lease("borrowed")
    insert_lease("reserved")
    opened.execute(
        "INSERT INTO events (session_id, seq, ts, fence, kind, body) VALUES ('s1', 1, 0, 1, 'k', x'7b7d')"
    )
    opened.execute("DELETE FROM sessions WHERE id = 's1'")
    assert opened.execute("SELECT count(*) FROM leases").fetchone()[0] == 0
    assert opened.execute("SELECT count(*) FROM events").fetchone()[0] == 0


def test_a_v1_database_keeps_its_heads_and_activity_after_dropping_head_seq(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 1 kept head_seq and updated_at current on every append; version 2
    derives both from the journal, so a file written by version 1 reads the same."""
    with monkeypatch.context() as v1:
        v1.setattr(database, "MIGRATIONS", database.MIGRATIONS[:1])
        v1.setattr(database, "SCHEMA_VERSION", 1)
        with closing(open_database(db_path)) as conn:
            _insert_session(conn, "s1")
            _insert_session(conn, "s2")
            conn.executemany(
                "INSERT INTO events (session_id, seq, ts, fence, kind, body) VALUES (?,?,?,0,'k',x'7b7d')",
                [("s1", 1, 5.0), ("s1", 2, 7.0)],
            )
            conn.execute("UPDATE sessions SET head_seq = 2, updated_at = 7.0 WHERE id = 's1'")
    with closing(open_database(db_path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        rows = {row.id: (row.head_seq, row.updated_at) for row in load_sessions(conn)}
        assert rows == {"s1": (2, 7.0), "s2": (0, 0.0)}
        assert conn.memory.head(conn, "s1") == 2


def test_a_v2_database_migrates_to_append_order_and_replays_identically(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 3 keeps events in a rowid table in append order with the
    (session_id, seq) key as an index; a file written by version 2 (clustered by
    that key) reads the same page by page, keeps its heads, and goes on appending."""
    interleaved = [
        (session_id, seq, float(seq), seq % 3, f"k{seq % 2}", b'{"n":%d}' % seq)
        for seq in range(1, 41)
        for session_id in ("s2", "s1", "s3")
    ]
    with monkeypatch.context() as v2:
        v2.setattr(database, "MIGRATIONS", database.MIGRATIONS[:2])
        v2.setattr(database, "SCHEMA_VERSION", 2)
        with closing(open_database(db_path)) as conn:
            for session_id in ("s1", "s2", "s3", "empty"):
                _insert_session(conn, session_id)
            conn.executemany(
                "INSERT INTO events (session_id, seq, ts, fence, kind, body)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                interleaved,
            )
            assert "WITHOUT ROWID" in _schema_sql(conn, "events")
            before = _replay(conn)
    with closing(open_database(db_path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert "WITHOUT ROWID" not in _schema_sql(conn, "events")
        assert _replay(conn) == before
        assert {row.id: row.head_seq for row in load_sessions(conn)} == {
            "s1": 40,
            "s2": 40,
            "s3": 40,
            "empty": 0,
        }
        # Copied in key order: each session's old events are contiguous rows.
        ids = [row[0] for row in conn.execute("SELECT id FROM events WHERE session_id = 's2'")]
        assert ids == list(range(ids[0], ids[0] + 40))
        conn.execute("BEGIN IMMEDIATE")
        appended = append_events(conn, "s1", 4, [("k", b"{}")], 99.0)
        conn.execute("COMMIT")
        assert [e.seq for e in appended] == [41]
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            conn.execute(
                "INSERT INTO events (session_id, seq, ts, fence, kind, body)"
                " VALUES ('s1', 41, 0, 0, 'k', x'7b7d')"
            )
        plan = " ".join(
            str(row[3])
            for row in conn.execute(
                "EXPLAIN QUERY PLAN SELECT seq, body FROM events"
                " WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT 10",
                ("s1", 0),
            )
        )
        assert "events_session_seq" in plan and "TEMP B-TREE" not in plan


def _schema_sql(conn: sqlite3.Connection, name: str) -> str:
    return str(conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0])


def _replay(conn: sqlite3.Connection) -> dict[str, list[list[StoredEvent]]]:
    """Every session's journal, read forward in pages of 7 the way catch-up reads it,
    and the last page read backward."""
    replay: dict[str, list[list[StoredEvent]]] = {}
    for (session_id,) in conn.execute("SELECT id FROM sessions ORDER BY id").fetchall():
        pages: list[list[StoredEvent]] = []
        after = 0
        while True:
            page, more = read_events(conn, session_id, after_seq=after, limit=7, max_bytes=1 << 20)
            pages.append(page)
            if not more:
                break
            after = page[-1].seq
        backward, _ = read_events(conn, session_id, before_seq=10**6, limit=5, max_bytes=1 << 20)
        pages.append(backward)
        replay[session_id] = pages
    return replay


def test_a_v3_database_gains_session_limits_and_keeps_its_sessions(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 4 adds each session's own limits and its creator; a version 3 file
    keeps its sessions, which have no limits (the daemon's defaults apply to them)
    and were created by the user."""
    with monkeypatch.context() as v3:
        v3.setattr(database, "MIGRATIONS", database.MIGRATIONS[:3])
        v3.setattr(database, "SCHEMA_VERSION", 3)
        with closing(open_database(db_path)) as conn:
            _insert_session(conn, "old")
    with closing(open_database(db_path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        [row] = load_sessions(conn)
        assert (row.id, row.limits, row.created_by) == ("old", None, None)


def test_a_v4_database_gains_held_output_positions_and_keeps_its_leases(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 5 adds where a held agent's output is journaled up to; a version 4
    file keeps its leases (held ones too, which recovery then settles), each at
    offset 0 with nothing to skip."""
    with monkeypatch.context() as v4:
        v4.setattr(database, "MIGRATIONS", database.MIGRATIONS[:4])
        v4.setattr(database, "SCHEMA_VERSION", 4)
        with closing(open_database(db_path)) as conn:
            _insert_session(conn, "old")
            conn.execute(
                "INSERT INTO leases (session_id, fence, generation, state, token, pid,"
                " start_time, pgid, acquired_at, live_at) VALUES"
                " ('old', 3, 'g', 'live', 'tok', 123, 456, 123, 1.0, 2.0)"
            )
    with closing(open_database(db_path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
        [held] = load_held_leases(conn)
        assert (held.session_id, held.fence, held.token) == ("old", 3, "tok")
        assert held.identity is not None and held.identity.pid == 123
        assert held_output(conn, "old", 3) == (0, 0)
