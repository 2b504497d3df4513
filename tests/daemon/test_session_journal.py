"""The session's journal port, against a real store and a real mock agent, in process.

A send flows handler -> session -> store -> feed: the supervisor is asked only to
find the session and start its agent; every committed event is published once, after
its commit; the status board hears ``working`` then ``idle`` without anyone asking.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
import trio
import trio.testing

from agentsd.app import App
from agentsd.config import Config, Ladder
from agentsd.connection import Call, Connection, StreamTransport
from agentsd.dispatch import dispatch
from agentsd.operations import Ledger
from agentsd.providers import provider_registry
from agentsd.providers.mock import MockAdapter
from agentsd.session import Session
from agentsd.store import sessions as session_rows
from agentsd.store.journal import StoredEvent, read_events
from agentsd.store.writer import Store, open_store
from agentsd.supervisor import Supervisor, open_supervisor
from agentsd_protocol.api.events import SessionUpdated
from agentsd_protocol.api.stream import SessionStatus, StatusNotification
from agentsd_protocol.errors import StorageUnavailable
from agentsd_protocol.jsonrpc import RequestEnvelope

FAST_LADDER = Ladder(eof_grace_s=0.5, term_grace_s=0.5, kill_wait_s=1.0)
_request_ids = itertools.count(1)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "agentsd.db") as store:
        yield store


class SupervisorSpy:
    """The supervisor as handlers see it, noting every attribute they ask it for."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.asked: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.asked.append(name)
        return getattr(self.supervisor, name)


class Published:
    """What the feed is given to publish, in the order it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[StoredEvent]]] = []

    def __call__(self, session_id: str, events: Sequence[StoredEvent]) -> None:
        self.calls.append((session_id, list(events)))

    def of(self, session_id: str) -> list[StoredEvent]:
        return [e for sid, events in self.calls if sid == session_id for e in events]


async def journal(store: Store, session_id: str) -> list[StoredEvent]:
    events, _ = await store.read(
        lambda conn: read_events(conn, session_id, after_seq=0, limit=10_000, max_bytes=1 << 30)
    )
    return events


async def call(app: App, method: str, params: dict[str, Any]) -> Any:
    """Run ``method`` as the connection would, through the daemon's dispatch."""
    _, server = trio.testing.memory_stream_pair()
    envelope = RequestEnvelope(
        jsonrpc="2.0", method=method, params=msgspec.Raw(msgspec.json.encode(params)), id=1
    )
    return await dispatch(Call(app, Connection(app, StreamTransport(server))), envelope)


async def create(sup: Supervisor, cwd: Path) -> Session:
    return await sup.create(
        provider="mock", cwd=str(cwd), title=None, options={}, env={}, command=None
    )


async def test_a_send_flows_handler_session_store_feed_without_returning_to_the_supervisor(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    config = Config(ladder=FAST_LADDER)
    with trio.fail_after(60):
        async with (
            open_supervisor(store, config, state, provider_registry()) as sup,
            trio.open_nursery() as sup_nursery,
        ):
            published = Published()
            monkeypatch.setattr(sup.feed, "publish", published)
            session = await create(sup, tmp_path)
            seen: list[tuple[str, str]] = []
            told: list[SessionStatus] = []
            idle_again = trio.Event()

            def notify(note: StatusNotification) -> bool:
                if note.session.session_id == session.id:
                    told.append(note.session)
                    seen.append((note.session.phase, note.session.status))
                    if seen[-1] == ("running", "idle"):
                        idle_again.set()
                return True

            watcher, snapshot = sup.board.watch("w1", notify, sup.sessions.values())
            pump_scope = trio.CancelScope()

            async def pump() -> None:
                with pump_scope:
                    await watcher.run_pump()

            sup_nursery.start_soon(pump)
            assert [(s.phase, s.status) for s in snapshot] == [("stopped", "idle")]
            spy = SupervisorSpy(sup)
            app = App(config, socket_path=tmp_path / "agentsd.sock", state_dir=state)
            app.attach(cast(Supervisor, spy), Ledger(store))

            result = await call(
                app,
                "agentSession.send",
                {"sessionId": session.id, "text": "hello", "clientOperationId": "op-1"},
            )
            assert result.dispatch == "accepted"
            await idle_again.wait()

            # The handler asked the supervisor for the session, its turn gate (a
            # draining daemon takes no turn) and to start its agent; the journal, the
            # feed and the status went by the session.
            assert set(spy.asked) == {"get", "gate", "start"}
            pump_scope.cancel()
            # Status followed the journal and the phase, each change told once.
            assert seen[0] == ("stopped", "working")
            assert ("starting", "working") in seen
            assert ("running", "working") in seen
            assert seen[-1] == ("running", "idle")
            assert all(a != b for a, b in itertools.pairwise(told)), told
            # Every committed event was published once, after its commit: each
            # publish holds one commit's events, contiguous and in seq order.
            committed = await journal(store, session.id)
            assert sorted(published.of(session.id), key=lambda e: e.seq) == committed
            for _, events in published.calls:
                seqs = [e.seq for e in events]
                assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            assert session.head_seq == committed[-1].seq
            await sup.close(session)


async def test_a_write_the_store_refuses_changes_nothing_and_publishes_nothing(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing is published or applied that is not durable: a refused append leaves
    the session's head, row and status as they were, and tells no one."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    with trio.fail_after(60):
        async with open_supervisor(store, Config(), state, provider_registry()) as sup:
            session = await create(sup, tmp_path)
            published = Published()
            monkeypatch.setattr(sup.feed, "publish", published)
            notes: list[StatusNotification] = []

            def notify(note: StatusNotification) -> bool:
                notes.append(note)
                return True

            sup.board.watch("w1", notify, [])
            head, row = session.head_seq, session.row

            def full_disk(*args: Any, **kwargs: Any) -> Any:
                raise StorageUnavailable("storage unavailable: disk full")

            monkeypatch.setattr(session_rows, "update_session", full_disk)
            with pytest.raises(StorageUnavailable):
                await session.journal.append([SessionUpdated(title="new")], title="new")
            assert (session.head_seq, session.row) == (head, row)
            assert published.calls == []
            assert notes == []
            assert [e.seq for e in await journal(store, session.id)] == [head]


async def test_an_answer_or_interrupt_whose_agent_just_ended_is_committed_and_answered(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's pipe broke as the answer (or the interrupt) went out: what was
    journaled stays journaled and the client gets its result, not an internal
    error; the agent's end settles the rest. (A held agent's exit is heard from
    the holder, so its adapter can still be set when its stdin is gone.)"""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    config = Config(ladder=FAST_LADDER)
    with trio.fail_after(60):
        async with open_supervisor(store, config, state, provider_registry()) as sup:
            app = App(config, socket_path=tmp_path / "agentsd.sock", state_dir=state)
            app.attach(sup, Ledger(store))
            session = await create(sup, tmp_path)
            asked = trio.Event()
            changed = Session.conversation_changed

            def watch(self: Session) -> None:
                changed(self)
                if self.conversation.approvals:
                    asked.set()

            monkeypatch.setattr(Session, "conversation_changed", watch)
            await call(app, "agentSession.send", {"sessionId": session.id, "text": "approve"})
            await asked.wait()
            [approval_id] = session.conversation.approvals

            async def broken(*args: Any, **kwargs: Any) -> Any:
                raise trio.BrokenResourceError("the agent is gone")

            monkeypatch.setattr(MockAdapter, "answer_approval", broken)
            monkeypatch.setattr(MockAdapter, "interrupt", broken)
            answered = await call(
                app,
                "agentSession.respond",
                {"sessionId": session.id, "approvalId": approval_id, "decision": "accept"},
            )
            assert answered.decision == "accept"
            stopped = await call(app, "agentSession.interrupt", {"sessionId": session.id})
            assert stopped.interrupted is False
            kinds = [e.kind for e in await journal(store, session.id)]
            assert "approval.resolved" in kinds and "interrupt.requested" in kinds
            await sup.close(session)
