"""The store notices when its database stops being where it was opened (the state
directory deleted, moved, or the write-ahead log deleted) and acknowledges nothing
it cannot make durable (``agentsd.store.location``; the e2e suite covers a
read-only filesystem and a restart)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from agentsd.store.writer import open_store
from agentsd_protocol.errors import StorageUnavailable

TEST_TIMEOUT_S = 20.0


def insert_session(session_id: str) -> Callable[[sqlite3.Connection], str]:
    def op(conn: sqlite3.Connection) -> str:
        conn.execute(
            "INSERT INTO sessions (id, host_id, provider, cwd, options, env, created_at,"
            " updated_at) VALUES (?, 'h', 'mock', '/', '{}', '{}', 0, 0)",
            (session_id,),
        )
        return session_id

    return op


def ids(conn: sqlite3.Connection) -> list[str]:
    return [row[0] for row in conn.execute("SELECT id FROM sessions ORDER BY id")]


async def test_a_moved_state_directory_refuses_writes_until_it_is_back(tmp_path: Path) -> None:
    state = tmp_path / "state"
    moved = tmp_path / "moved"
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(state / "agentsd.db") as store:
            assert await store.write(insert_session("a")) == "a"
            assert store.unavailable() is None
            state.rename(moved)
            with pytest.raises(StorageUnavailable, match="no longer names the database"):
                await store.write(insert_session("b"))
            problem = store.unavailable()
            assert problem is not None and "state directory was deleted or moved" in problem
            moved.rename(state)
            assert store.unavailable() is None
            assert await store.write(insert_session("c")) == "c"
        async with open_store(state / "agentsd.db") as store:
            assert await store.read(ids) == ["a", "c"]


async def test_a_deleted_state_directory_never_acknowledges_a_write(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(state / "agentsd.db") as store:
            await store.write(insert_session("a"))
            for path in sorted(state.iterdir()):
                path.unlink()
            state.rmdir()
            with pytest.raises(StorageUnavailable, match="deleted or moved"):
                await store.write(insert_session("b"))
            state.mkdir()  # a new directory by the same name is not the database
            with pytest.raises(StorageUnavailable):
                await store.write(insert_session("c"))


async def test_a_deleted_write_ahead_log_refuses_writes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(state / "agentsd.db") as store:
            await store.write(insert_session("a"))
            (state / "agentsd.db-wal").unlink()
            with pytest.raises(StorageUnavailable, match=r"write-ahead log .* was deleted"):
                await store.write(insert_session("b"))


async def test_a_move_during_a_batch_rolls_the_batch_back(tmp_path: Path) -> None:
    """The directory moves after an op wrote its rows and before the COMMIT: the
    batch is rolled back and its caller told, never acknowledged."""
    state = tmp_path / "state"
    moved = tmp_path / "moved"
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(state / "agentsd.db") as store:
            await store.write(insert_session("a"))

            def insert_then_move(conn: sqlite3.Connection) -> str:
                result = insert_session("b")(conn)
                state.rename(moved)
                return result

            with pytest.raises(StorageUnavailable, match="the write was rolled back"):
                await store.write(insert_then_move)
            moved.rename(state)
            assert await store.read(ids) == ["a"]
