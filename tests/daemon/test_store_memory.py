"""What the writer keeps in memory (session heads, the ledger's row count) follows
the transaction: what a failed batch or op changed is forgotten, and what is kept
matches the tables, also after a restart (real SQLite)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from contextlib import closing
from pathlib import Path

import pytest
import trio
import trio.testing

from agentsd.operations import TTL_S, Ledger, Operation, record
from agentsd.store.database import StoreConnection
from agentsd.store.journal import StoredEvent, append_events, read_events
from agentsd.store.operations import purge_operations
from agentsd.store.writer import Store, open_store
from agentsd_protocol.errors import StorageUnavailable
from tests.daemon.test_store_writer import Gate, insert_session

TEST_TIMEOUT_S = 20.0


def seqs_in_table(path: Path, session_id: str) -> list[int]:
    with closing(sqlite3.connect(path)) as conn:
        return [
            seq
            for (seq,) in conn.execute("SELECT seq FROM events WHERE session_id = ?", (session_id,))
        ]


def rows_in_ledger(path: Path) -> int:
    with closing(sqlite3.connect(path)) as conn:
        count: int = conn.execute("SELECT COUNT(*) FROM operations").fetchone()[0]
        return count


async def one_batch(store: Store, calls: list[Callable[[], Awaitable[object]]]) -> list[object]:
    """Run ``calls`` (each one store call) so that they share one batch: the writer
    is held in a gate until all are queued. Each call's result or exception."""
    outcomes: list[object] = [None] * len(calls)

    async def run(index: int) -> None:
        try:
            outcomes[index] = await calls[index]()
        except Exception as exc:
            outcomes[index] = exc

    async with trio.open_nursery() as nursery:
        gate = Gate()
        nursery.start_soon(store.write, gate)
        await gate.wait_entered()
        for index in range(len(calls)):
            nursery.start_soon(run, index)
        await trio.testing.wait_all_tasks_blocked()
        assert store.queued_writes == len(calls)
        gate.open()
    return outcomes


def append_one(store: Store, session_id: str) -> Callable[[], Awaitable[list[StoredEvent]]]:
    return lambda: store.append(session_id, 1, [("k", b"{}")], time.time())


async def test_heads_stay_contiguous_across_a_batch_the_disk_refused(tmp_path: Path) -> None:
    path = tmp_path / "agentsd.sqlite3"

    def fill_the_disk(conn: StoreConnection) -> None:
        # max_page_count is SQLite's own "disk full": SQLite then discards the
        # whole transaction, appends queued before and after this op included.
        conn.execute("INSERT INTO operations VALUES ('op', 'm', 'f', ?, 0, 0)", (b"x" * 200_000,))

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(path) as store:
            await store.write(insert_session("s"))
            await store.append("s", 1, [("k", b"{}"), ("k", b"{}")], 1.0)
            await store.write(
                lambda conn: conn.execute(
                    "PRAGMA max_page_count = "
                    + str(conn.execute("PRAGMA page_count").fetchone()[0])
                )
            )
            outcomes = await one_batch(
                store,
                [
                    append_one(store, "s"),
                    lambda: store.write(fill_the_disk),
                    append_one(store, "s"),
                ],
            )
            assert all(isinstance(o, StorageUnavailable) for o in outcomes), outcomes
            await store.write(lambda conn: conn.execute("PRAGMA max_page_count = 1000000"))
            after = await store.append("s", 1, [("k", b"{}")], 2.0)
            assert [e.seq for e in after] == [3]
    assert seqs_in_table(path, "s") == [1, 2, 3]


async def test_a_failed_commit_does_not_advance_the_head(tmp_path: Path) -> None:
    path = tmp_path / "agentsd.sqlite3"

    def orphan_event(conn: StoreConnection) -> None:
        # A deferred foreign-key violation is only detected by COMMIT itself.
        conn.execute("PRAGMA defer_foreign_keys = ON")
        conn.execute(
            "INSERT INTO events (session_id, seq, ts, fence, kind, body)"
            " VALUES ('ghost', 1, 0, 0, 'k', x'7b7d')"
        )

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(path) as store:
            await store.write(insert_session("s"))
            outcomes = await one_batch(
                store,
                [append_one(store, "s"), lambda: store.write(orphan_event), append_one(store, "s")],
            )
            assert all(isinstance(o, StorageUnavailable) for o in outcomes), outcomes
            assert [e.seq for e in await append_one(store, "s")()] == [1]
    assert seqs_in_table(path, "s") == [1]


async def test_an_op_rolled_back_in_a_batch_of_appends_leaves_no_gap(tmp_path: Path) -> None:
    path = tmp_path / "agentsd.sqlite3"

    class Refused(Exception):
        pass

    def append_then_fail(conn: StoreConnection) -> None:
        append_events(conn, "s", 1, [("k", b"{}"), ("k", b"{}")], 0.0)
        raise Refused

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(path) as store:
            await store.write(insert_session("s"))
            outcomes = await one_batch(
                store,
                [
                    append_one(store, "s"),
                    lambda: store.write(append_then_fail),
                    append_one(store, "s"),
                    append_one(store, "ghost"),
                    append_one(store, "s"),
                ],
            )
            assert isinstance(outcomes[1], Refused)
            assert isinstance(outcomes[3], KeyError)  # UnknownSession, alone
            # The writer takes the queue in whatever order trio ran the callers.
            stored = [outcomes[i] for i in (0, 2, 4)]
            assert sorted(e.seq for events in stored for e in events) == [1, 2, 3]  # type: ignore[attr-defined]
            page, more = await store.read(
                lambda conn: read_events(conn, "s", limit=10, max_bytes=1 << 20)
            )
            assert [e.seq for e in page] == [1, 2, 3] and not more
    assert seqs_in_table(path, "s") == [1, 2, 3]


async def test_ledger_row_count_matches_the_table_after_restart(tmp_path: Path) -> None:
    path = tmp_path / "agentsd.sqlite3"
    long_ago = time.time() - TTL_S - 1

    async def mutation() -> dict[str, bool]:
        return {"done": True}

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(path) as store:
            assert store.operation_rows == 0
            ledger = Ledger(store)
            for i in range(3):
                await ledger.run(Operation(op_id=f"op-{i}", method="m", fingerprint="f"), mutation)
            # Recording an id again replaces its row: still three.
            await store.write(
                lambda conn: record(conn, Operation("op-0", "m", "f"), b"{}", time.time())
            )
            old = [Operation(op_id=f"old-{i}", method="m", fingerprint="f") for i in range(2)]
            for op in old:

                def record_long_ago(conn: StoreConnection, op: Operation = op) -> None:
                    record(conn, op, b"{}", long_ago)

                await store.write(record_long_ago)
            assert store.operation_rows == rows_in_ledger(path) == 5
            await store.write(lambda conn: purge_operations(conn, time.time()))
            assert store.operation_rows == rows_in_ledger(path) == 3

            def record_then_fail(conn: StoreConnection) -> None:
                record(conn, Operation("lost", "m", "f"), b"{}", time.time())
                raise RuntimeError("after the record")

            with pytest.raises(RuntimeError):
                await store.write(record_then_fail)
            assert store.operation_rows == rows_in_ledger(path) == 3
        async with open_store(path) as store:
            assert store.operation_rows == rows_in_ledger(path) == 3
