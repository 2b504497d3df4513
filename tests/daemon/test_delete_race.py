"""A request racing ``agentSession.delete`` of its session, over real connections.

Each handler looks its session up, then acts; a delete can complete in between. The
client must then get ``session_not_found`` (what a request naming a deleted session
gets), never an internal error, and nothing may be journaled for the deleted
session. The race is made deterministic by ordering, not by timing: the handler's
journal write is held (`hold_append`) until the delete, sent on another connection,
has been answered.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import pytest
import trio

from agentsd.app import App
from agentsd.attachments import BlobStore
from agentsd.config import Config
from agentsd.operations import Ledger
from agentsd.providers import provider_registry
from agentsd.session_journal import SessionJournal
from agentsd.store import sessions as session_rows
from agentsd.store.journal import read_events
from agentsd.store.writer import Store, open_store
from agentsd.supervisor import Supervisor, open_supervisor
from agentsd_protocol.api.events import (
    ApprovalResolved,
    CommandRun,
    Event,
    InterruptRequested,
    PromptWithdrawn,
    SessionUpdated,
    Submission,
)
from agentsd_protocol.errors import SessionNotFound
from tests.daemon.test_connection import Daemon, Served, assert_error, connect
from tests.polling import eventually

GIF = b"GIF89a" + b"\x01\x02\x03" * 50
HANG_GUARD_S = 60.0  # real time, on a loaded machine: not a claim about speed


@attrs.frozen
class Harness:
    daemon: Daemon
    supervisor: Supervisor
    store: Store


@pytest.fixture
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    """The daemon's parts serving one mock session; its agents are held by a
    holder unless the test parametrizes this fixture (indirectly) with False."""
    config = Config(holder=getattr(request, "param", True))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    async with (
        open_store(state / "agentsd.db") as store,
        open_supervisor(store, config, state, provider_registry()) as supervisor,
        trio.open_nursery() as connections,
    ):
        app = App(config, socket_path=tmp_path / "agentsd.sock", state_dir=state)
        app.attach(supervisor, Ledger(store))
        session = await supervisor.create(
            provider="mock", cwd=str(tmp_path), title=None, options={}, env={}, command=None
        )
        try:
            yield Harness(Daemon(app, session.id, connections), supervisor, store)
        finally:
            connections.cancel_scope.cancel()  # connections end before the store closes


class Release(Protocol):
    def set(self) -> None: ...


@attrs.define
class HeldAppend:
    """Where a handler is held: ``reached`` once it is, until ``release``."""

    reached: trio.Event = attrs.field(factory=trio.Event)
    release: Release = attrs.field(factory=trio.Event)


def hold_append(
    monkeypatch: pytest.MonkeyPatch,
    journal: SessionJournal,
    holds: Callable[[Sequence[Event]], bool],
) -> HeldAppend:
    """Hold the first append to ``journal`` whose events ``holds`` picks until
    ``release`` is set: the handler has looked its session up and acts on it."""
    release = trio.Event()
    held = HeldAppend(release=release)
    original = SessionJournal.append

    async def append(self: SessionJournal, events: Sequence[Event], **kwargs: Any) -> Any:
        if self is journal and not held.reached.is_set() and holds(events):
            held.reached.set()
            await release.wait()
        return await original(self, events, **kwargs)

    monkeypatch.setattr(SessionJournal, "append", append)
    return held


def of_type(kind: type[Event]) -> Callable[[Sequence[Event]], bool]:
    return lambda events: any(isinstance(event, kind) for event in events)


async def call(served: Served, request_id: int, method: str, params: dict[str, Any]) -> None:
    await served.peer.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})


async def delete_between_lookup_and_act(
    harness: Harness, held: HeldAppend, racer: Served, method: str, params: dict[str, Any]
) -> Any:
    """Send ``method`` on ``racer``; once its handler holds its journal write, delete
    the session on another connection and wait for that answer; then let the
    handler go on. Its reply."""
    session_id = harness.daemon.session_id
    deleter = connect(harness.daemon)
    await call(racer, 1, method, params)
    await held.reached.wait()
    await call(deleter, 2, "agentSession.delete", {"sessionId": session_id})
    assert await deleter.peer.recv() == {
        "jsonrpc": "2.0",
        "id": 2,
        "result": {"sessionId": session_id, "deleted": True},
    }
    assert session_id not in harness.supervisor.sessions
    held.release.set()
    return await racer.peer.recv()


async def assert_nothing_left(harness: Harness) -> None:
    """The deleted session has no row and no event: nothing was journaled for it."""
    session_id = harness.daemon.session_id

    def read(conn: Any) -> tuple[Any, list[Any]]:
        events, _ = read_events(conn, session_id, after_seq=0, limit=100, max_bytes=1 << 20)
        return session_rows.load_session(conn, session_id), events

    row, events = await harness.store.read(read)
    assert row is None and events == []


async def assert_still_serves(harness: Harness) -> None:
    bystander = connect(harness.daemon)
    await bystander.peer.ping()


@pytest.mark.parametrize("delivery", ["steer", "queue"])
async def test_a_send_racing_the_delete_of_its_session_gets_session_not_found(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, delivery: str
) -> None:
    session = harness.supervisor.get(harness.daemon.session_id)
    held = hold_append(monkeypatch, session.journal, of_type(Submission))
    with trio.fail_after(HANG_GUARD_S):
        reply = await delete_between_lookup_and_act(
            harness,
            held,
            connect(harness.daemon),
            "agentSession.send",
            {"sessionId": session.id, "text": "hello", "delivery": delivery},
        )
        assert_error(reply, SessionNotFound.code, "session_not_found")
        assert reply["error"]["data"]["sessionId"] == session.id
        assert session.task is None  # no agent was started for it
        await assert_nothing_left(harness)
        await assert_still_serves(harness)


async def test_a_send_with_an_image_racing_the_delete_leaves_no_copy_of_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image is kept (``agentsd.attachments``) before the prompt is journaled;
    held here just before that, while the delete runs its own clean-up. The refused
    send removes what it kept after it."""
    session = harness.supervisor.get(harness.daemon.session_id)
    reached, release = trio.Event(), threading.Event()
    original = BlobStore.keep

    def keep(self: BlobStore, session_id: str, images: dict[str, bytes]) -> None:
        trio.from_thread.run_sync(reached.set)
        release.wait(HANG_GUARD_S)
        original(self, session_id, images)

    monkeypatch.setattr(BlobStore, "keep", keep)
    image = {"type": "image", "data": base64.b64encode(GIF).decode(), "mediaType": "image/gif"}
    with trio.fail_after(HANG_GUARD_S):
        reply = await delete_between_lookup_and_act(
            harness,
            HeldAppend(reached, release),
            connect(harness.daemon),
            "agentSession.send",
            {"sessionId": session.id, "text": "look", "content": [image]},
        )
        assert_error(reply, SessionNotFound.code, "session_not_found")
        assert not (harness.supervisor.blobs.root / session.id).exists()
        await assert_nothing_left(harness)


async def test_set_options_racing_the_delete_of_its_session_gets_session_not_found(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = harness.supervisor.get(harness.daemon.session_id)
    held = hold_append(monkeypatch, session.journal, of_type(SessionUpdated))
    with trio.fail_after(HANG_GUARD_S):
        reply = await delete_between_lookup_and_act(
            harness,
            held,
            connect(harness.daemon),
            "agentSession.setOptions",
            {"sessionId": session.id, "title": "renamed"},
        )
        assert_error(reply, SessionNotFound.code, "session_not_found")
        assert session.row.title is None  # the in-memory row follows only a commit
        await assert_nothing_left(harness)
        await assert_still_serves(harness)


async def test_a_command_racing_the_delete_of_its_session_gets_session_not_found(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = harness.supervisor.get(harness.daemon.session_id)
    held = hold_append(monkeypatch, session.journal, of_type(CommandRun))
    with trio.fail_after(HANG_GUARD_S):
        reply = await delete_between_lookup_and_act(
            harness,
            held,
            connect(harness.daemon),
            "agentSession.command",
            {"sessionId": session.id, "name": "clear"},
        )
        assert_error(reply, SessionNotFound.code, "session_not_found")
        assert session.task is None  # /clear starts a fresh agent only once journaled
        await assert_nothing_left(harness)
        await assert_still_serves(harness)


async def test_an_answer_racing_the_delete_of_its_session_gets_session_not_found(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = harness.supervisor.get(harness.daemon.session_id)
    client = connect(harness.daemon)
    with trio.fail_after(HANG_GUARD_S):
        await call(client, 1, "agentSession.send", {"sessionId": session.id, "text": "approve"})
        reply = await client.peer.recv()
        assert "result" in reply, reply
        await eventually(lambda: bool(session.conversation.approvals), timeout_s=HANG_GUARD_S)
        [approval_id] = session.conversation.approvals
        held = hold_append(monkeypatch, session.journal, of_type(ApprovalResolved))
        reply = await delete_between_lookup_and_act(
            harness,
            held,
            client,
            "agentSession.respond",
            {"sessionId": session.id, "approvalId": approval_id, "decision": "accept"},
        )
        assert_error(reply, SessionNotFound.code, "session_not_found")
        assert not session.claims  # the claim is given back: nobody won
        await assert_nothing_left(harness)
        await assert_still_serves(harness)


async def test_an_interrupt_racing_the_delete_of_its_session_gets_session_not_found(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = harness.supervisor.get(harness.daemon.session_id)
    client = connect(harness.daemon)
    with trio.fail_after(HANG_GUARD_S):
        # A turn that stays open: the agent waits for an answer.
        await call(client, 1, "agentSession.send", {"sessionId": session.id, "text": "approve"})
        reply = await client.peer.recv()
        assert "result" in reply, reply
        await eventually(lambda: bool(session.conversation.approvals), timeout_s=HANG_GUARD_S)
        assert session.conversation.turn_open
        held = hold_append(monkeypatch, session.journal, of_type(InterruptRequested))
        reply = await delete_between_lookup_and_act(
            harness, held, client, "agentSession.interrupt", {"sessionId": session.id}
        )
        assert_error(reply, SessionNotFound.code, "session_not_found")
        await assert_nothing_left(harness)
        await assert_still_serves(harness)


async def test_a_queue_withdrawal_racing_the_delete_of_its_session_gets_session_not_found(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = harness.supervisor.get(harness.daemon.session_id)
    client = connect(harness.daemon)
    with trio.fail_after(HANG_GUARD_S):
        await call(client, 1, "agentSession.send", {"sessionId": session.id, "text": "approve"})
        assert "result" in await client.peer.recv()
        await eventually(lambda: bool(session.conversation.approvals), timeout_s=HANG_GUARD_S)
        await call(
            client,
            1,
            "agentSession.send",
            {"sessionId": session.id, "text": "later", "delivery": "queue"},
        )
        queued = await client.peer.recv()
        assert queued["result"]["queued"] is True, queued
        prompt_id = queued["result"]["clientMessageId"]
        held = hold_append(monkeypatch, session.journal, of_type(PromptWithdrawn))
        reply = await delete_between_lookup_and_act(
            harness,
            held,
            client,
            "agentSession.queue",
            {"sessionId": session.id, "action": "withdraw", "promptId": prompt_id},
        )
        assert_error(reply, SessionNotFound.code, "session_not_found")
        assert prompt_id not in session.queue.claims  # the claim is given back
        await assert_nothing_left(harness)
        await assert_still_serves(harness)


async def test_a_journal_write_for_a_deleted_session_raises_session_not_found(
    harness: Harness,
) -> None:
    """The journal port translates the store's ``UnknownSession`` once, for every
    writer (``agentsd.session_journal``), and changes nothing in memory."""
    session = harness.supervisor.get(harness.daemon.session_id)
    await harness.supervisor.delete(session)
    head = session.head_seq
    with pytest.raises(SessionNotFound) as caught:
        await session.journal.append([SessionUpdated(title="late")], title="late")
    assert caught.value.details == {"sessionId": session.id}
    with pytest.raises(SessionNotFound):
        await session.journal.append([SessionUpdated(title="late")])
    with pytest.raises(SessionNotFound):
        await session.journal.write(
            lambda conn: (
                None,
                session_rows.update_session(
                    conn, session.id, session.fence, 0.0, [SessionUpdated()]
                ),
            )
        )
    assert session.head_seq == head and session.row.title is None
    await assert_nothing_left(harness)


async def test_a_command_whose_agent_start_follows_the_delete_gets_session_not_found(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command starts the agent before it journals anything: a delete completed
    before that start is told as the session's absence, not as a delete under way."""
    session = harness.supervisor.get(harness.daemon.session_id)
    release = trio.Event()
    held = HeldAppend(release=release)
    original = Supervisor.start

    async def start(self: Supervisor, target: Any) -> None:
        if target is session and not held.reached.is_set():
            held.reached.set()
            await release.wait()
        await original(self, target)

    monkeypatch.setattr(Supervisor, "start", start)
    with trio.fail_after(HANG_GUARD_S):
        reply = await delete_between_lookup_and_act(
            harness,
            held,
            connect(harness.daemon),
            "agentSession.command",
            {"sessionId": session.id, "name": "compact"},
        )
        assert_error(reply, SessionNotFound.code, "session_not_found")
        assert session.task is None  # no agent was started for the deleted session
        await assert_nothing_left(harness)
        await assert_still_serves(harness)


async def test_a_close_acting_after_the_delete_of_its_session_gets_session_not_found(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The close of a session whose exit is unproven waits for the session's lock;
    a delete can complete meanwhile. Held here at the same point: before the close
    acts. It then reports the session gone, not its last state as if it lived."""
    session = harness.supervisor.get(harness.daemon.session_id)
    release = trio.Event()
    held = HeldAppend(release=release)
    original = Supervisor.close

    async def close(self: Supervisor, target: Any, cause: Any = "requested") -> bool:
        if target is session and not held.reached.is_set():  # the handler's, not the delete's
            held.reached.set()
            await release.wait()
        return await original(self, target, cause)

    monkeypatch.setattr(Supervisor, "close", close)
    with trio.fail_after(HANG_GUARD_S):
        reply = await delete_between_lookup_and_act(
            harness, held, connect(harness.daemon), "agentSession.close", {"sessionId": session.id}
        )
        assert_error(reply, SessionNotFound.code, "session_not_found")
        await assert_nothing_left(harness)
        await assert_still_serves(harness)


async def test_a_close_of_a_running_agent_that_a_delete_also_stops_answers_it_was_running(
    harness: Harness,
) -> None:
    """Close and delete of a running session both wait for its one stop: the close
    did stop an agent, and says so even though the delete then removed the
    session; the delete removes everything."""
    session = harness.supervisor.get(harness.daemon.session_id)
    closer, deleter = connect(harness.daemon), connect(harness.daemon)
    with trio.fail_after(HANG_GUARD_S):
        await harness.supervisor.start(session)
        task = session.task
        assert task is not None
        await call(closer, 1, "agentSession.close", {"sessionId": session.id})
        await eventually(lambda: task.stop_cause is not None, timeout_s=HANG_GUARD_S)
        await call(deleter, 2, "agentSession.delete", {"sessionId": session.id})
        closed, deleted = await closer.peer.recv(), await deleter.peer.recv()
        assert deleted["result"] == {"sessionId": session.id, "deleted": True}, deleted
        assert closed["result"]["wasRunning"] is True, closed
        await assert_nothing_left(harness)
        await assert_still_serves(harness)
