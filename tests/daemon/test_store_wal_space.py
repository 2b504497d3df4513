"""The WAL gives its space back (DESIGN.md invariant 8).

A WAL that a held read let grow past its checkpoint size is cut back to
``WAL_SIZE_LIMIT_BYTES`` once it starts over (``journal_size_limit``). A database
that grows on a small disk fills it with its rows, not with its log.

On a full disk (writer Rule 8), on a tmpfs of its own (``tests.small_filesystem``,
needs root), a read holds an old snapshot while writes rewrite the same few pages,
so no checkpoint can catch up and the WAL grows until it fills the disk. Once the read ends, the disk is exactly as
full as before, but the writer must take writes again and the WAL must shrink: its
space belongs to writes, not to a log of pages the database already holds.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
import trio

from agentsd.store import database
from agentsd.store.database import open_database
from agentsd.store.location import wal_bytes
from agentsd.store.writer import open_store
from agentsd_protocol.errors import StorageUnavailable
from tests.small_filesystem import small_filesystem

TEST_TIMEOUT_S = 60.0
DISK = 4 * 1024 * 1024
SESSIONS = 10  # rows rewritten by every write: about one 4 KiB page each
OPTIONS_BYTES = 3000
# After the WAL gave its space back it holds the one write since (about SESSIONS
# pages), not a disk's worth.
WAL_BOUND = 64 * 1024


def create_sessions(path: Path) -> None:
    """The rows the writes rewrite, committed and checkpointed into the database (the
    last connection's close does), so rewriting them never grows the database."""
    with closing(open_database(path)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        for index in range(SESSIONS):
            conn.execute(
                "INSERT INTO sessions (id, host_id, provider, cwd, options, env, created_at,"
                " updated_at) VALUES (?, 'h', 'mock', '/', ?, '{}', 0, 0)",
                (f"s{index}", "x" * OPTIONS_BYTES),
            )
        conn.execute("COMMIT")


def rewrite(round_: int) -> Callable[[sqlite3.Connection], int]:
    def op(conn: sqlite3.Connection) -> int:
        options = f"{round_:08d}".encode().hex() * (OPTIONS_BYTES // 16)
        conn.execute("UPDATE sessions SET options = ?, updated_at = ?", (options, round_))
        return round_

    return op


def committed_rounds(path: Path) -> set[int]:
    """The round of each session row as committed, through a connection of its own."""
    with closing(sqlite3.connect(path)) as conn:
        return {int(row[0]) for row in conn.execute("SELECT updated_at FROM sessions")}


async def test_a_wal_that_filled_the_disk_gives_its_space_back_once_the_reader_ends() -> None:
    with small_filesystem(f"{DISK // 1024}k") as mount_point:
        path = mount_point / "agentsd.db"
        create_sessions(path)
        database_bytes = path.stat().st_size
        holding, release = threading.Event(), threading.Event()

        def hold_snapshot(conn: sqlite3.Connection) -> int:
            count: int = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
            holding.set()
            release.wait(TEST_TIMEOUT_S)
            return count

        with trio.fail_after(TEST_TIMEOUT_S):
            async with open_store(path) as store:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(store.read, hold_snapshot)
                    await trio.to_thread.run_sync(holding.wait, TEST_TIMEOUT_S)

                    # The WAL grows until the disk is full: the read's snapshot
                    # keeps every frame since it began in use.
                    rounds = 0
                    while True:
                        try:
                            await store.write(rewrite(rounds + 1))
                        except StorageUnavailable as exc:
                            assert "disk full" in exc.message, exc.message
                            break
                        rounds += 1
                        assert rounds < DISK // 4096, "the disk never filled"
                    grown = wal_bytes(path)
                    assert grown > DISK // 2, (grown, rounds)
                    # While the snapshot is held the log cannot be cut back: a
                    # write is refused, and nothing of it is kept.
                    try:
                        await store.write(rewrite(rounds + 1))
                    except StorageUnavailable as exc:
                        assert "disk full" in exc.message, exc.message
                    else:
                        raise AssertionError("a write fit on a disk its WAL had filled")
                    assert committed_rounds(path) == {rounds}
                    release.set()

                # The read ended and the disk is as full as it was. The next write
                # succeeds, on the same store, and the WAL gave its space back.
                rounds += 1
                assert await store.write(rewrite(rounds)) == rounds
                assert wal_bytes(path) < WAL_BOUND, (wal_bytes(path), grown)
                # With nothing but its own log filling the disk, no write is refused
                # however often the log fills it again.
                filled = rounds
                for _ in range(3 * filled):
                    rounds += 1
                    assert await store.write(rewrite(rounds)) == rounds
                assert committed_rounds(path) == {rounds}
                assert path.stat().st_size == database_bytes


async def test_a_wal_grown_past_its_checkpoint_size_is_cut_back_when_it_starts_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A small checkpoint interval and limit, so a few hundred pages show it.
    pages = 100
    limit = 32 + pages * (24 + 4096)
    monkeypatch.setattr(database, "WAL_AUTOCHECKPOINT_PAGES", pages)
    monkeypatch.setattr(database, "WAL_SIZE_LIMIT_BYTES", limit)
    path = tmp_path / "agentsd.db"
    create_sessions(path)
    holding, release = threading.Event(), threading.Event()

    def hold_snapshot(conn: sqlite3.Connection) -> None:
        conn.execute("SELECT count(*) FROM sessions").fetchone()
        holding.set()
        release.wait(TEST_TIMEOUT_S)

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(path) as store:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.read, hold_snapshot)
                await trio.to_thread.run_sync(holding.wait, TEST_TIMEOUT_S)
                rounds = 0
                # The held snapshot keeps every checkpoint from catching up.
                while wal_bytes(path) <= 3 * limit:
                    rounds += 1
                    await store.write(rewrite(rounds))
                grown = wal_bytes(path)
                release.set()
            # The next commit checkpoints (the log is past its interval) and,
            # with no read in the way, catches up; the write after it starts the
            # log over and its commit cuts the file back. From then on it grows no
            # further than a checkpoint interval and the commit that crossed it.
            rounds += 1
            await store.write(rewrite(rounds))
            for _ in range(3 * pages // SESSIONS):
                rounds += 1
                await store.write(rewrite(rounds))
                assert wal_bytes(path) <= limit + 2 * SESSIONS * (24 + 4096), (
                    wal_bytes(path),
                    grown,
                )
            assert wal_bytes(path) < grown
        assert committed_rounds(path) == {rounds}


async def test_a_growing_database_fills_the_disk_with_its_data_not_its_log() -> None:
    # New rows, about a page each: a checkpoint grows the database by the pages
    # the log holds, so it needs free space of its own; a log that took the last
    # free bytes could never be checkpointed, and every write after would fail.
    def insert(index: int) -> Callable[[sqlite3.Connection], int]:
        def op(conn: sqlite3.Connection) -> int:
            conn.execute(
                "INSERT INTO sessions (id, host_id, provider, cwd, options, env, created_at,"
                " updated_at) VALUES (?, 'h', 'mock', '/', ?, '{}', 0, 0)",
                (f"new{index}", "n" * OPTIONS_BYTES),
            )
            return index

        return op

    with small_filesystem(f"{DISK // 1024}k") as mount_point:
        path = mount_point / "agentsd.db"
        with trio.fail_after(TEST_TIMEOUT_S):
            async with open_store(path) as store:
                rows = 0
                while True:
                    try:
                        await store.write(insert(rows))
                    except StorageUnavailable as exc:
                        assert "disk full" in exc.message, exc.message
                        break
                    rows += 1
                    assert rows < DISK // OPTIONS_BYTES, "the disk never filled"
                # The disk is full of rows, each committed: the database holds more
                # than half of it (the log at most as much as was left free).
                assert rows * OPTIONS_BYTES > DISK // 2, (rows, wal_bytes(path))
                assert path.stat().st_size > DISK // 2, (path.stat().st_size, wal_bytes(path))
                with closing(sqlite3.connect(path)) as conn:
                    assert conn.execute("SELECT count(*) FROM sessions").fetchone()[0] == rows
