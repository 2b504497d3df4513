"""The group-committing writer, on real SQLite files (no mocks of sqlite).

Tests that need several ops in one batch hold the writer inside a ``Gate`` op (its
worker thread waits on a threading.Event), queue the others, and open the gate: the
next batch then holds exactly what was queued.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
import trio
import trio.testing

from agentsd.store import writer
from agentsd.store.database import SCHEMA_VERSION, SchemaTooNew
from agentsd.store.writer import Store, open_store
from agentsd_protocol.errors import ShuttingDown, StorageUnavailable

# Every test runs under this bound (real time), so a broken writer fails, not hangs.
TEST_TIMEOUT_S = 20.0


class Gate:
    """An op that blocks the writer's thread until ``open()``."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._released = threading.Event()

    def __call__(self, conn: sqlite3.Connection) -> str:
        self.entered.set()
        if not self._released.wait(TEST_TIMEOUT_S):
            raise TimeoutError("gate never opened")
        return "gate"

    async def wait_entered(self) -> None:
        await trio.to_thread.run_sync(self.entered.wait, TEST_TIMEOUT_S)
        assert self.entered.is_set()

    def open(self) -> None:
        self._released.set()


def insert_session(session_id: str) -> Callable[[sqlite3.Connection], str]:
    def op(conn: sqlite3.Connection) -> str:
        conn.execute(
            "INSERT INTO sessions (id, host_id, provider, cwd, options, env, created_at,"
            " updated_at) VALUES (?, 'h', 'mock', '/', '{}', '{}', 0, 0)",
            (session_id,),
        )
        return session_id

    return op


def session_ids(path: Path) -> set[str]:
    """Committed session ids, seen through a connection of its own."""
    with closing(sqlite3.connect(path)) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM sessions")}


def file_bytes(path: Path) -> bytes:
    return path.read_bytes()


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions in ``exc``, with every group flattened."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "agentsd.sqlite3"


async def record_outcome(
    store: Store,
    op: Callable[[sqlite3.Connection], str],
    outcomes: dict[int, object],
    index: int,
) -> None:
    """``outcomes[index]`` = what ``store.write(op)`` returned or raised."""
    try:
        outcomes[index] = await store.write(op)
    except Exception as exc:
        outcomes[index] = exc


async def queue_behind_gate(
    store: Store, nursery: trio.Nursery, ops: list[Callable[[sqlite3.Connection], str]]
) -> tuple[Gate, dict[int, object]]:
    """Block the writer in a gate, queue ``ops`` from concurrent tasks, and return
    the gate and a dict that fills with each op's result or exception by index."""
    gate = Gate()
    nursery.start_soon(store.write, gate)
    await gate.wait_entered()
    outcomes: dict[int, object] = {}
    for index, op in enumerate(ops):
        nursery.start_soon(record_outcome, store, op, outcomes, index)
    await trio.testing.wait_all_tasks_blocked()
    assert store.queued_writes == len(ops)
    return gate, outcomes


async def gather(store: Store, ops: list[Callable[[sqlite3.Connection], str]]) -> dict[int, object]:
    """Submit ``ops`` concurrently; each op's result or exception by index."""
    outcomes: dict[int, object] = {}
    async with trio.open_nursery() as nursery:
        for index, op in enumerate(ops):
            nursery.start_soon(record_outcome, store, op, outcomes, index)
    return outcomes


async def test_write_returns_only_after_commit(db_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store:
            seen_after_return: dict[str, bool] = {}

            async def one(session_id: str) -> None:
                assert await store.write(insert_session(session_id)) == session_id
                # No checkpoint between the return and this look from outside.
                seen_after_return[session_id] = session_id in session_ids(db_path)

            async with trio.open_nursery() as nursery:
                for i in range(50):
                    nursery.start_soon(one, f"s{i}")
            assert seen_after_return == {f"s{i}": True for i in range(50)}


async def test_group_commit_shares_transactions(db_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store:
            results: dict[int, str] = {}

            async def one(i: int) -> None:
                results[i] = await store.write(insert_session(f"s{i}"))

            async with trio.open_nursery() as nursery:
                for i in range(200):
                    nursery.start_soon(one, i)
            assert results == {i: f"s{i}" for i in range(200)}
            assert store.ops_committed == 200
            assert store.batches_committed <= 10
            assert store.batches_failed == 0
    assert len(session_ids(db_path)) == 200


async def test_batch_size_is_capped(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "MAX_BATCH_OPS", 10)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store, trio.open_nursery() as nursery:
            ops = [insert_session(f"s{i}") for i in range(45)]
            gate, outcomes = await queue_behind_gate(store, nursery, ops)
            gate.open()
        assert len(outcomes) == 45
        # The gate's batch, then 45 ops in batches of at most 10.
        assert store.batches_committed == 1 + 5


async def test_failing_op_rolls_back_only_itself(db_path: Path) -> None:
    def half_then_fail(conn: sqlite3.Connection) -> str:
        insert_session("doomed")(conn)
        raise ValueError("op bug")

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store, trio.open_nursery() as nursery:
            ops = [insert_session("a"), half_then_fail, insert_session("b")]
            gate, outcomes = await queue_behind_gate(store, nursery, ops)
            batches_before = store.batches_committed
            gate.open()
        assert store.batches_committed == batches_before + 2  # the gate's, then ours
        assert outcomes[0] == "a" and outcomes[2] == "b"
        assert isinstance(outcomes[1], ValueError) and str(outcomes[1]) == "op bug"
    assert session_ids(db_path) == {"a", "b"}


async def test_op_errors_pass_through_unchanged(db_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store:
            await store.write(insert_session("dup"))
            with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
                await store.write(insert_session("dup"))

            class OpBug(Exception):
                pass

            def buggy(conn: sqlite3.Connection) -> None:
                raise OpBug("mine")

            with pytest.raises(OpBug, match="mine"):
                await store.write(buggy)
            assert await store.write(insert_session("after")) == "after"


async def test_disk_full_fails_the_whole_batch_then_recovers(db_path: Path) -> None:
    # max_page_count is SQLite's own "disk full": growing past it fails with
    # SQLITE_FULL, and SQLite then discards the whole transaction.
    def big_row(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO operations VALUES ('op', 'm', 'f', ?, 0, 0)", (b"x" * 200_000,))
        return "big"

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store:
            await store.write(
                lambda conn: conn.execute(
                    "PRAGMA max_page_count = "
                    + str(conn.execute("PRAGMA page_count").fetchone()[0])
                )
            )
            async with trio.open_nursery() as nursery:
                ops = [insert_session("before"), big_row, insert_session("after")]
                gate, outcomes = await queue_behind_gate(store, nursery, ops)
                gate.open()
            for index in range(3):
                failure = outcomes[index]
                assert isinstance(failure, StorageUnavailable), failure
                assert "disk full" in failure.message
                assert failure.retryable
            assert store.batches_failed == 1
            assert session_ids(db_path) == set()

            # The cause goes away; the same writer carries on.
            await store.write(lambda conn: conn.execute("PRAGMA max_page_count = 1000000"))
            assert await store.write(big_row) == "big"
            assert await store.write(insert_session("later")) == "later"
    assert session_ids(db_path) == {"later"}


async def test_begin_failure_fails_the_batch_then_recovers(db_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store:
            # Fail fast instead of waiting out the busy timeout.
            await store.write(lambda conn: conn.execute("PRAGMA busy_timeout = 0"))
            with closing(sqlite3.connect(db_path, isolation_level=None, timeout=0)) as other:
                other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
                outcomes = await gather(store, [insert_session("a"), insert_session("b")])
                for index in range(2):
                    failure = outcomes[index]
                    assert isinstance(failure, StorageUnavailable), failure
                    assert "locked" in failure.message
                assert store.batches_failed >= 1
                other.execute("ROLLBACK")
            assert await store.write(insert_session("c")) == "c"
    assert session_ids(db_path) == {"c"}


async def test_commit_failure_fails_the_whole_batch_then_recovers(db_path: Path) -> None:
    # A deferred foreign-key violation is only detected by COMMIT itself.
    def orphan_event(conn: sqlite3.Connection) -> str:
        conn.execute("PRAGMA defer_foreign_keys = ON")
        conn.execute(
            "INSERT INTO events (session_id, seq, ts, fence, kind, body)"
            " VALUES ('ghost', 1, 0, 0, 'k', x'7b7d')"
        )
        return "orphan"

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store:
            async with trio.open_nursery() as nursery:
                ops = [insert_session("a"), orphan_event, insert_session("b")]
                gate, outcomes = await queue_behind_gate(store, nursery, ops)
                gate.open()
            for index in range(3):
                assert isinstance(outcomes[index], StorageUnavailable), outcomes[index]
            assert store.batches_failed == 1
            assert session_ids(db_path) == set()
            assert await store.write(insert_session("c")) == "c"
    assert session_ids(db_path) == {"c"}


async def test_read_sees_committed_data_only(db_path: Path) -> None:
    def count(conn: sqlite3.Connection) -> int:
        result: int = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
        return result

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store, trio.open_nursery() as nursery:
            # The insert has run, the gate holds the COMMIT back.
            gate = Gate()

            def insert_then_wait(conn: sqlite3.Connection) -> str:
                insert_session("a")(conn)
                return gate(conn)

            nursery.start_soon(store.write, insert_then_wait)
            await gate.wait_entered()
            assert await store.read(count) == 0
            gate.open()
            await store.write(insert_session("b"))
            assert await store.read(count) == 2


async def test_read_cannot_write(db_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store:
            with pytest.raises(sqlite3.OperationalError, match="readonly"):
                await store.read(insert_session("a"))


async def test_full_queue_blocks_and_cancelling_a_blocked_write_never_queues_it(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "QUEUE_CAPACITY", 3)
    ran: list[str] = []

    def record(name: str) -> Callable[[sqlite3.Connection], str]:
        def op(conn: sqlite3.Connection) -> str:
            ran.append(name)
            return name

        return op

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store, trio.open_nursery() as nursery:
            # The gate, a lone write, runs in the writer's thread without the writer
            # task (writer Rule 7), which meanwhile holds the first queued op: four
            # ops fill a queue of three.
            ops = [record(f"q{i}") for i in range(4)]
            gate, _ = await queue_behind_gate(store, nursery, ops)
            returned: list[str] = []
            nursery.start_soon(store.write, record("later"))

            async def waiter(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
                with trio.CancelScope() as scope:
                    task_status.started(scope)
                    returned.append(await store.write(record("cancelled")))

            scope = await nursery.start(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert store.queued_writes == 4  # "later" and "cancelled" wait for space
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            gate.open()
        assert returned == []
        assert sorted(ran) == ["later", "q0", "q1", "q2", "q3"]


async def test_cancelled_after_queueing_may_still_commit(db_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store, trio.open_nursery() as nursery:
            gate, _ = await queue_behind_gate(store, nursery, [])

            async def impatient(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
                with trio.CancelScope() as scope:
                    task_status.started(scope)
                    await store.write(insert_session("queued"))
                    raise AssertionError("not reached: cancelled while waiting for commit")

            scope = await nursery.start(impatient)
            await trio.testing.wait_all_tasks_blocked()
            assert store.queued_writes == 1
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            gate.open()
            await store.write(lambda conn: None)  # the queue is FIFO: this commits after it
    assert session_ids(db_path) == {"queued"}


@pytest.mark.parametrize("exit_by", ["return", "cancel", "error"])
async def test_close_commits_every_submitted_write(db_path: Path, exit_by: str) -> None:
    results: dict[int, object] = {}
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as outer:
            with trio.CancelScope() as body_scope:
                try:
                    async with open_store(db_path) as store:
                        gate = Gate()
                        outer.start_soon(store.write, gate)
                        await gate.wait_entered()

                        async def submit(i: int) -> None:
                            results[i] = await store.write(insert_session(f"s{i}"))

                        for i in range(20):
                            outer.start_soon(submit, i)
                        await trio.testing.wait_all_tasks_blocked()
                        gate.open()
                        if exit_by == "cancel":
                            body_scope.cancel()
                            await trio.sleep_forever()
                        elif exit_by == "error":
                            raise LookupError("body failed")
                except LookupError as exc:
                    # Unwrapped: the body's own exception, not an ExceptionGroup.
                    assert exit_by == "error" and str(exc) == "body failed"
            assert body_scope.cancelled_caught == (exit_by == "cancel")
    assert results == {i: f"s{i}" for i in range(20)}
    assert session_ids(db_path) == {f"s{i}" for i in range(20)}
    # The writer closed last and checkpointed: no WAL left behind.
    assert not db_path.with_name(db_path.name + "-wal").exists()


async def test_after_close_writes_and_reads_are_refused(db_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store:
            pass
        with pytest.raises(ShuttingDown):
            await store.write(insert_session("late"))
        with pytest.raises(ShuttingDown):
            await store.read(lambda conn: None)
    assert session_ids(db_path) == set()


async def test_fatal_op_stops_the_writer_and_no_caller_hangs(db_path: Path) -> None:
    class Fatal(BaseException):
        pass

    def fatal(conn: sqlite3.Connection) -> str:
        insert_session("fatal")(conn)
        raise Fatal

    outcomes: dict[int, object] = {}
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as outer:
            with pytest.raises(BaseException) as caught:
                async with open_store(db_path) as store:
                    ops = [insert_session("a"), fatal, insert_session("b")]
                    gate, outcomes = await queue_behind_gate(store, outer, ops)
                    gate.open()
                    await trio.sleep_forever()  # the writer's failure cancels this
    assert [type(leaf) for leaf in leaves(caught.value)] == [Fatal]
    # The fatal op's own caller too: the BaseException went to the writer.
    for index in range(3):
        failure = outcomes[index]
        assert isinstance(failure, StorageUnavailable), failure
        assert "writer stopped" in failure.message
    assert session_ids(db_path) == set()


async def test_writer_health_tracks_progress(
    db_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    async with open_store(db_path) as store, trio.open_nursery() as nursery:
        mock_clock.jump(10 * writer.WRITER_STALL_S)
        assert store.writer_healthy()  # idle for long is fine
        gate, _ = await queue_behind_gate(store, nursery, [insert_session("a")])
        assert store.writer_healthy()  # a batch just started
        mock_clock.jump(writer.WRITER_STALL_S + 1)
        assert not store.writer_healthy()  # stuck inside a batch
        assert store.writer_healthy(stall_s=writer.WRITER_STALL_S + 2)
        gate.open()
        await store.write(lambda conn: None)
        assert store.writer_healthy()
        assert store.last_progress == trio.current_time()


async def test_open_store_refuses_a_newer_schema(db_path: Path) -> None:
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    before = file_bytes(db_path)
    with pytest.raises(SchemaTooNew):
        async with open_store(db_path):
            raise AssertionError("not reached")
    assert file_bytes(db_path) == before


async def test_unusable_database_file_is_storage_unavailable(tmp_path: Path) -> None:
    # A directory where the database file should be: SQLite fails with an I/O error.
    (tmp_path / "db").mkdir()
    with pytest.raises(StorageUnavailable, match="storage unavailable"):
        async with open_store(tmp_path / "db"):
            raise AssertionError("not reached")


class StepRecorder(trio.abc.Instrument):
    """The names of the tasks trio runs while it is installed."""

    def __init__(self) -> None:
        self.stepped: set[str] = set()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.stepped.add(task.name)


async def test_a_lone_write_is_handed_to_the_thread_without_the_writer_task(
    db_path: Path,
) -> None:
    """Writer Rule 7: with no other write pending, the caller hands its op to the
    writer's thread itself; the writer task never runs for it."""
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store:
            await store.write(insert_session("a"))
            recorder = StepRecorder()
            trio.lowlevel.add_instrument(recorder)
            try:
                assert await store.write(insert_session("b")) == "b"
            finally:
                trio.lowlevel.remove_instrument(recorder)
            assert not [name for name in recorder.stepped if "_run_writer" in name]
            assert store.batches_committed == 2
    assert session_ids(db_path) == {"a", "b"}


async def test_a_lone_write_cancelled_in_the_thread_still_commits_and_keeps_order(
    db_path: Path,
) -> None:
    """Cancelling the caller of a lone write running in the thread does not withdraw
    it (as for a queued op); writes submitted meanwhile wait for it and then commit
    together."""
    order: list[str] = []

    def logged(session_id: str) -> Callable[[sqlite3.Connection], str]:
        def op(conn: sqlite3.Connection) -> str:
            order.append(session_id)
            return insert_session(session_id)(conn)

        return op

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store, trio.open_nursery() as nursery:
            gate = Gate()

            async def impatient(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
                with trio.CancelScope() as scope:
                    task_status.started(scope)
                    await store.write(gate)
                    raise AssertionError("not reached: cancelled while its op ran")

            scope = await nursery.start(impatient)
            await gate.wait_entered()
            batches = store.batches_committed
            outcomes: dict[int, object] = {}
            for index in range(3):
                nursery.start_soon(record_outcome, store, logged(f"s{index}"), outcomes, index)
            await trio.testing.wait_all_tasks_blocked()
            assert store.queued_writes == 3
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            gate.open()
            await store.write(lambda conn: None)  # queued behind the three
            await trio.testing.wait_all_tasks_blocked()
            assert outcomes == {0: "s0", 1: "s1", 2: "s2"}
            # The gate's batch, then everything queued meanwhile in one batch.
            assert store.batches_committed - batches == 2
    assert sorted(order) == ["s0", "s1", "s2"]
    assert session_ids(db_path) == {"s0", "s1", "s2"}


async def test_a_fatal_lone_write_stops_the_writer_and_no_caller_hangs(db_path: Path) -> None:
    """A ``BaseException`` from an op the caller handed to the thread itself stops
    the writer as one from a batch the writer task cut does."""

    class Fatal(BaseException):
        pass

    def fatal(conn: sqlite3.Connection) -> str:
        insert_session("fatal")(conn)
        raise Fatal

    outcomes: dict[int, object] = {}
    with trio.fail_after(TEST_TIMEOUT_S), pytest.raises(BaseException) as caught:
        async with open_store(db_path) as store:
            await record_outcome(store, fatal, outcomes, 0)
            await trio.sleep_forever()  # the writer's failure cancels this
    assert [type(leaf) for leaf in leaves(caught.value)] == [Fatal]
    failure = outcomes[0]
    assert isinstance(failure, StorageUnavailable), failure
    assert "writer stopped" in failure.message
    with pytest.raises(ShuttingDown):
        await store.write(insert_session("late"))
    assert session_ids(db_path) == set()


async def test_concurrent_writers_keep_sharing_commits(db_path: Path) -> None:
    """Writer Rule 7 does not split concurrent writers: after a batch of several
    ops, the next batch is cut by the writer task once every woken caller could
    submit, so rounds of writes from many tasks stay about one commit each."""
    writers, rounds = 50, 6
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_store(db_path) as store:
            await store.write(lambda conn: None)
            batches = store.batches_committed

            async def writer_task(index: int) -> None:
                for round_ in range(rounds):
                    await store.write(insert_session(f"w{index}-{round_}"))

            async with trio.open_nursery() as nursery:
                for index in range(writers):
                    nursery.start_soon(writer_task, index)
            # One lone op may split off while the first round starts (it saw no
            # concurrency yet); at most two cohorts then alternate.
            assert store.batches_committed - batches <= 2 * rounds + 1
    assert len(session_ids(db_path)) == writers * rounds
