"""The idempotency ledger against a real store (DESIGN.md invariant 7).

The same operation id with the same params replays the recorded answer byte for
byte; with other params it is ``operation_conflict``; two requests with one id never
run at once; failures are not recorded; entries expire and the ledger is bounded.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from agentsd.operations import (
    TTL_S,
    Ledger,
    Operation,
    fingerprint,
    record,
    record_provisional,
)
from agentsd.store.writer import Store, open_store
from agentsd_protocol.api.conversation import SendParams
from agentsd_protocol.api.session import CloseParams
from agentsd_protocol.errors import OperationConflict, OperationLedgerFull, StorageUnavailable

SEND = SendParams(session_id="s1", text="hello", client_operation_id="op-1")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "agentsd.db") as store:
        yield store


def op_for(params: msgspec.Struct, method: str = "agentSession.send") -> Operation:
    op_id = getattr(params, "client_operation_id", None) or "op"
    return Operation(op_id=op_id, method=method, fingerprint=fingerprint(method, params))


class Counting:
    """A mutation that counts its runs and answers with the run number."""

    def __init__(self, result: Any = None) -> None:
        self.runs = 0
        self.result = result

    async def __call__(self) -> Any:
        self.runs += 1
        return self.result if self.result is not None else {"run": self.runs}


def test_the_fingerprint_leaves_out_the_operation_id_and_retry_unknown() -> None:
    base = fingerprint("agentSession.send", SEND)
    same = [
        SendParams(session_id="s1", text="hello", client_operation_id="other"),
        SendParams(session_id="s1", text="hello"),
        SendParams(session_id="s1", text="hello", client_operation_id="op-1", retry_unknown=True),
    ]
    for params in same:
        assert fingerprint("agentSession.send", params) == base
    different = [
        SendParams(session_id="s1", text="hello!", client_operation_id="op-1"),
        SendParams(session_id="s2", text="hello", client_operation_id="op-1"),
        SendParams(session_id="s1", text="hello", client_operation_id="op-1", expected_fence=3),
    ]
    for params in different:
        assert fingerprint("agentSession.send", params) != base
    assert fingerprint("agentSession.interrupt", SEND) != base


async def test_idempotent_mutations_the_same_id_and_params_replay_byte_for_byte(
    store: Store,
) -> None:
    ledger = Ledger(store)
    mutation = Counting({"answer": [1, 2, 3], "text": "héllo"})
    first = await ledger.run(op_for(SEND), mutation)
    assert first == {"answer": [1, 2, 3], "text": "héllo"}
    for _ in range(3):
        again = await ledger.run(op_for(SEND), mutation)
        assert isinstance(again, msgspec.Raw)
        assert bytes(again) == msgspec.json.encode(first)
    assert mutation.runs == 1


async def test_idempotent_mutations_the_same_id_with_other_params_conflicts(store: Store) -> None:
    ledger = Ledger(store)
    mutation = Counting()
    await ledger.run(op_for(SEND), mutation)
    other_text = SendParams(session_id="s1", text="bye", client_operation_id="op-1")
    with pytest.raises(OperationConflict) as conflict:
        await ledger.run(op_for(other_text), mutation)
    assert conflict.value.kind == "operation_conflict"
    assert conflict.value.details == {"operationId": "op-1", "method": "agentSession.send"}
    # The same id for another method is just as much a conflict.
    close = CloseParams(session_id="s1", client_operation_id="op-1")
    with pytest.raises(OperationConflict):
        await ledger.run(op_for(close, "agentSession.close"), mutation)
    # Even a retry of an unknown send (replay=False) checks the params first.
    with pytest.raises(OperationConflict):
        await ledger.run(op_for(other_text), mutation, replay=False)
    assert mutation.runs == 1


async def test_idempotent_mutations_two_requests_with_one_id_never_run_at_once(
    store: Store,
) -> None:
    ledger = Ledger(store)
    release = trio.Event()
    started = trio.Event()
    running = 0
    most = 0
    runs = 0

    async def slow() -> Any:
        nonlocal running, most, runs
        runs += 1
        running += 1
        most = max(most, running)
        started.set()
        await release.wait()
        running -= 1
        return {"run": runs}

    results: list[Any] = []

    async def call() -> None:
        results.append(await ledger.run(op_for(SEND), slow))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(call)
            await started.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert running == 1
            release.set()
    assert runs == 1 and most == 1
    assert [r for r in results if not isinstance(r, msgspec.Raw)] == [{"run": 1}]
    assert {bytes(r) for r in results if isinstance(r, msgspec.Raw)} == {b'{"run":1}'}


async def test_a_failed_mutation_is_not_recorded_and_a_retry_runs_again(store: Store) -> None:
    ledger = Ledger(store)
    attempts = 0

    async def flaky() -> Any:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise StorageUnavailable("disk full")
        return {"attempt": attempts}

    with pytest.raises(StorageUnavailable):
        await ledger.run(op_for(SEND), flaky)
    assert await ledger.recorded("op-1") is None
    assert await ledger.run(op_for(SEND), flaky) == {"attempt": 2}
    assert await ledger.recorded("op-1") == b'{"attempt":2}'


async def test_a_cancelled_first_request_lets_the_next_one_run(store: Store) -> None:
    ledger = Ledger(store)
    running = trio.Event()

    async def in_flight() -> None:
        running.set()
        await trio.sleep_forever()

    with trio.fail_after(10):
        # Cancelled once the mutation runs, not after a delay: the window is hit.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ledger.run, op_for(SEND), in_flight)
            await running.wait()
            nursery.cancel_scope.cancel()
        assert await ledger.run(op_for(SEND), Counting()) == {"run": 1}


async def test_a_provisional_entry_written_with_the_mutation_is_replayed(store: Store) -> None:
    """``send`` records a provisional answer in the commit of its submission: a
    crash before the final answer leaves that one for the retry."""
    op = op_for(SEND)
    await store.write(lambda conn: record_provisional(conn, op, {"dispatch": "unknown"}))
    mutation = Counting()
    replay = await Ledger(store).run(op, mutation)
    assert isinstance(replay, msgspec.Raw) and bytes(replay) == b'{"dispatch":"unknown"}'
    assert mutation.runs == 0
    # retryUnknown runs the mutation again and its answer replaces the provisional one.
    assert await Ledger(store).run(op, mutation, replay=False) == {"run": 1}
    assert await Ledger(store).recorded("op-1") == b'{"run":1}'


async def test_entries_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "agentsd.db"
    async with open_store(path) as store:
        await Ledger(store).run(op_for(SEND), Counting({"kept": True}))
    async with open_store(path) as store:
        mutation = Counting()
        replay = await Ledger(store).run(op_for(SEND), mutation)
        assert bytes(replay) == b'{"kept":true}'
        assert mutation.runs == 0


async def test_entries_expire_after_the_ttl(store: Store) -> None:
    op = op_for(SEND)
    long_ago = time.time() - TTL_S - 1
    await store.write(lambda conn: record(conn, op, b'{"old":true}', long_ago))
    ledger = Ledger(store)
    assert await ledger.recorded("op-1") is None
    assert await ledger.run(op, Counting()) == {"run": 1}
    # An expired entry no longer pins its params either.
    other = SendParams(session_id="s1", text="bye", client_operation_id="op-2")
    await store.write(lambda conn: record(conn, op_for(other), b"{}", long_ago))
    renamed = SendParams(session_id="s9", text="new", client_operation_id="op-2")
    assert await ledger.run(op_for(renamed), Counting()) == {"run": 1}


async def test_the_ledger_is_bounded_and_purges_expired_entries(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(store, capacity=3)
    for i in range(3):
        params = SendParams(session_id="s1", text=str(i), client_operation_id=f"op-{i}")
        await ledger.run(op_for(params), Counting())
    fourth = SendParams(session_id="s1", text="3", client_operation_id="op-3")
    with pytest.raises(OperationLedgerFull) as full:
        await ledger.run(op_for(fourth), Counting())
    assert full.value.details == {"capacity": 3}
    # Replays of recorded ids still work while it is full.
    replay = await ledger.run(
        op_for(SendParams(session_id="s1", text="0", client_operation_id="op-0")), Counting()
    )
    assert isinstance(replay, msgspec.Raw)
    # A day later every entry has expired: the purge makes room.
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + TTL_S + 1)
    assert await ledger.run(op_for(fourth), Counting()) == {"run": 1}


async def test_failed_mutations_never_use_up_the_ledger(store: Store) -> None:
    """Failures record nothing, so they must not count against the capacity: a
    client whose mutations keep failing can still get its next ones recorded."""
    ledger = Ledger(store, capacity=3)

    async def failing() -> Any:
        raise StorageUnavailable("disk full")

    for i in range(10):
        params = SendParams(session_id="s1", text=str(i), client_operation_id=f"bad-{i}")
        with pytest.raises(StorageUnavailable):
            await ledger.run(op_for(params), failing)
    for i in range(3):
        params = SendParams(session_id="s1", text=str(i), client_operation_id=f"op-{i}")
        assert await ledger.run(op_for(params), Counting()) == {"run": 1}
    fourth = SendParams(session_id="s1", text="3", client_operation_id="op-3")
    with pytest.raises(OperationLedgerFull):
        await ledger.run(op_for(fourth), Counting())
