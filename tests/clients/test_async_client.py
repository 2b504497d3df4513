"""The trio client: typed calls, concurrency and errors against a real ``agentsd``;
subscriptions that resume across lagging, dropped connections and a daemon restart;
and the behaviours only a scripted fake daemon can show."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from agentsctl.async_client import AsyncClient, Subscription, follow, open_client
from agentsctl.daemon import DaemonDisconnected, DaemonNotRunning
from agentsd_protocol import methods
from agentsd_protocol.api import conversation as c
from agentsd_protocol.api import session as s
from agentsd_protocol.api import stream as st
from agentsd_protocol.errors import InvalidParams, SessionNotFound
from agentsd_protocol.methods import METHODS, Method
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon

TEST_TIMEOUT_S = 30.0  # each test's outer bound; the steps take milliseconds


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    """One real agentsd for this module's tests (each makes its own sessions)."""
    with running_daemon() as process:
        yield process


# -- against a real daemon --------------------------------------------------------


def create_params(*, title: str | None = None, start: bool = True) -> s.CreateParams:
    return s.CreateParams(provider="mock", cwd="/tmp", title=title, start=start)


def test_every_registered_method_has_a_typed_call() -> None:
    # ``call(methods.X, params)`` is typed by the constant; there is one per method.
    constants = {m.name: m for m in vars(methods).values() if isinstance(m, Method)}
    assert constants == METHODS
    assert callable(AsyncClient.call)


async def test_typed_calls_and_the_daemons_error_classes(daemon: DaemonProcess) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_client(daemon.socket) as client:
            assert (await client.call(methods.PING)).pong
            created = await client.call(methods.CREATE, create_params(title="aio"))
            session_id = created.session_id
            got = await client.call(methods.GET, s.GetParams(session_id=session_id))
            assert got.session.title == "aio"
            listed = await client.call(methods.LIST, s.ListParams())
            assert session_id in {i.session_id for i in listed.sessions}
            renamed = await client.call(
                methods.SET_OPTIONS, c.SetOptionsParams(session_id=session_id, title="renamed")
            )
            assert renamed.session.title == "renamed"
            interrupt = c.InterruptParams(session_id=session_id)
            assert (await client.call(methods.INTERRUPT, interrupt)).interrupted is False
            history = st.HistoryParams(session_id=session_id, after_seq=0)
            page = await client.call(methods.HISTORY, history)
            assert [e.kind for e in page.events][:1] == ["session.created"]
            with pytest.raises(SessionNotFound) as missing:
                await client.call(methods.GET, s.GetParams(session_id="no-such-session"))
            assert missing.value.kind == "session_not_found"
            with pytest.raises(InvalidParams):
                await client.call(methods.HISTORY, st.HistoryParams(session_id=session_id, limit=0))
            closed = await client.call(methods.CLOSE, s.CloseParams(session_id=session_id))
            assert closed.was_running
            deleted = await client.call(methods.DELETE, s.DeleteParams(session_id=session_id))
            assert deleted.deleted


async def test_many_requests_share_one_connection(daemon: DaemonProcess) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_client(daemon.socket) as client:
            created = await client.call(methods.CREATE, create_params(start=False))
            session_id = created.session_id
            results: list[str] = []

            async def get() -> None:
                got = await client.call(methods.GET, s.GetParams(session_id=session_id))
                results.append(got.session.session_id)

            async with trio.open_nursery() as nursery:
                for _ in range(50):
                    nursery.start_soon(get)
            assert results == [session_id] * 50
            assert (await client.call(methods.STATUS)).connections == 1


async def test_an_error_in_the_body_is_not_wrapped_in_a_group(daemon: DaemonProcess) -> None:
    with trio.fail_after(TEST_TIMEOUT_S), pytest.raises(SessionNotFound):
        async with open_client(daemon.socket) as client:
            await client.call(methods.GET, s.GetParams(session_id="no-such-session"))


async def test_no_daemon_raises_daemon_not_running(temp_dir: Path) -> None:
    with pytest.raises(DaemonNotRunning):
        async with open_client(temp_dir / "nothing.sock"):
            pass


async def _until_kind(events: Subscription, kind: str, seen: list[st.JournalEvent]) -> None:
    async for item in events:
        if isinstance(item, st.JournalEvent):
            seen.append(item)
            if item.kind == kind:
                return


async def test_a_subscription_catches_up_then_streams_deltas(daemon: DaemonProcess) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_client(daemon.socket) as client:
            session_id = (await client.call(methods.CREATE, create_params())).session_id
            async with client.subscribe(session_id, after_seq=0) as events:
                await client.call(methods.SEND, c.SendParams(session_id=session_id, text="hello"))
                deltas: list[str] = []
                seen: list[st.JournalEvent] = []
                async for item in events:
                    if isinstance(item, st.DeltaNotification):
                        deltas.append(item.text)
                        continue
                    seen.append(item)
                    if item.kind == "turn.completed":
                        break
            assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
            assert seen[0].kind == "session.created"
            assert "".join(deltas) == "Hello from the mock agent."
            assert events.last_seq == seen[-1].seq


async def test_following_from_the_head_skips_history(daemon: DaemonProcess) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_client(daemon.socket) as client:
            session_id = (await client.call(methods.CREATE, create_params())).session_id
            async with client.subscribe(session_id, after_seq=None) as events:
                head = events.head_seq
                assert events.last_seq == head
                await client.call(methods.SEND, c.SendParams(session_id=session_id, text="hello"))
                seen: list[st.JournalEvent] = []
                await _until_kind(events, "turn.completed", seen)
            assert seen[0].seq == head + 1
            assert seen[0].kind == "submission"


async def test_a_subscription_of_a_deleted_session_raises_session_not_found(
    daemon: DaemonProcess,
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_client(daemon.socket) as client:
            session_id = (await client.call(methods.CREATE, create_params())).session_id
            async with client.subscribe(session_id, after_seq=0) as events:
                await _until_kind(events, "session.created", [])
                await client.call(methods.DELETE, s.DeleteParams(session_id=session_id))
                seqs = [events.last_seq]
                with pytest.raises(SessionNotFound) as gone:
                    async for item in events:
                        if isinstance(item, st.JournalEvent):
                            seqs.append(item.seq)
                assert gone.value.details["reason"] == "deleted"
                assert gone.value.details["lastSeq"] == events.last_seq
                assert seqs == list(range(1, len(seqs) + 1))  # all it was sent, then the end
                with pytest.raises(SessionNotFound):
                    await events.__anext__()  # ended for good: nothing is resubscribed
            assert events.ended is not None and events.ended.reason == "deleted"


async def test_a_subscription_resumes_after_the_daemon_restarts(temp_dir: Path) -> None:
    state_dir, socket_path = temp_dir / "state", temp_dir / "agentsd.sock"

    def start(stack: contextlib.ExitStack) -> DaemonProcess:
        return stack.enter_context(running_daemon(state_dir=state_dir, socket_path=socket_path))

    with contextlib.ExitStack() as first, contextlib.ExitStack() as second:
        await trio.to_thread.run_sync(start, first)
        with trio.fail_after(TEST_TIMEOUT_S):
            async with open_client(socket_path, reconnect_deadline_s=TEST_TIMEOUT_S) as client:
                session_id = (await client.call(methods.CREATE, create_params())).session_id
                seen: list[st.JournalEvent] = []
                async with client.subscribe(session_id, after_seq=0) as events:
                    await client.call(
                        methods.SEND, c.SendParams(session_id=session_id, text="hello")
                    )
                    await _until_kind(events, "turn.completed", seen)
                    await trio.to_thread.run_sync(first.close)  # SIGTERM, exit 0
                    await trio.to_thread.run_sync(start, second)
                    # The closing daemon settled the session; the new one goes on.
                    await _until_kind(events, "lease.released", seen)
                    await client.call(
                        methods.SEND, c.SendParams(session_id=session_id, text="hello again")
                    )  # a fresh connection
                    await _until_kind(events, "turn.completed", seen)
        seqs = [e.seq for e in seen]
        assert seqs == list(range(1, len(seqs) + 1)), "no gap and no duplicate"
        kinds = [e.kind for e in seen]
        assert kinds.count("submission") == 2
        assert kinds.count("turn.completed") == 2


async def test_a_watch_yields_the_snapshot_then_changes(daemon: DaemonProcess) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_client(daemon.socket) as client:
            existing = (await client.call(methods.CREATE, create_params(start=False))).session_id
            async with client.watch() as watch:
                async for note in watch:  # the snapshot holds every session
                    if note.session.session_id == existing:
                        break
                created = (await client.call(methods.CREATE, create_params(start=False))).session_id
                async for note in watch:
                    if note.session.session_id == created:
                        assert not note.deleted
                        break


# -- against a scripted fake daemon ------------------------------------------------


class FakeConnection:
    """The fake daemon's end of one connection: newline-delimited JSON."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buf = b""

    async def recv(self) -> dict[str, Any]:
        while b"\n" not in self._buf:
            data = await self.stream.receive_some(65536)
            assert data, "the client closed the connection"
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    async def send(self, message: Any) -> None:
        await self.stream.send_all(json.dumps(message).encode() + b"\n")

    async def reply(self, request: dict[str, Any], result: Any) -> None:
        await self.send({"jsonrpc": "2.0", "id": request["id"], "result": result})

    async def event(self, subscription_id: str, seq: int) -> None:
        event = {"seq": seq, "ts": 0.0, "fence": 1, "kind": f"e{seq}", "body": {}}
        params = {"subscriptionId": subscription_id, "sessionId": "s", "seq": seq, "event": event}
        await self.send({"jsonrpc": "2.0", "method": "agentSession.event", "params": params})

    async def subscribed(self, subscription_id: str, *, after_seq: int, head: int = 0) -> None:
        request = await self.recv()
        assert request["method"] == "agentSession.subscribe", request
        assert request["params"] == {"sessionId": "s", "afterSeq": after_seq}, request
        await self.reply(request, {"subscriptionId": subscription_id, "headSeq": head})


Script = Callable[[FakeConnection], Awaitable[None]]


@contextlib.asynccontextmanager
async def fake_daemon(scripts: list[Script]) -> AsyncIterator[Path]:
    """A Unix socket whose n-th accepted connection runs ``scripts[n]``; a script's
    failure fails the test. Yields the socket path."""
    base = make_temp_dir()
    path = base / "fake.sock"
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen()
    listener = trio.SocketListener(sock)

    async def serve() -> None:
        for script in scripts:
            stream = await listener.accept()
            nursery.start_soon(run, script, stream)

    async def run(script: Script, stream: trio.SocketStream) -> None:
        async with stream:
            await script(FakeConnection(stream))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            yield path
            nursery.cancel_scope.cancel()
    finally:
        await listener.aclose()
        path.unlink(missing_ok=True)
        base.rmdir()


async def test_lagged_and_dropped_subscriptions_resume_exactly_once() -> None:
    async def first(conn: FakeConnection) -> None:
        await conn.subscribed("sub-1", after_seq=0)
        await conn.event("sub-1", 1)
        await conn.event("sub-1", 2)
        lagged = {"subscriptionId": "sub-1", "sessionId": "s", "resumeAfterSeq": 2}
        await conn.send({"jsonrpc": "2.0", "method": "agentSession.lagged", "params": lagged})
        await conn.subscribed("sub-2", after_seq=2)
        await conn.event("sub-2", 3)
        # Then the connection drops, as when the daemon restarts.

    async def second(conn: FakeConnection) -> None:
        await conn.subscribed("sub-3", after_seq=3)
        await conn.event("sub-3", 3)  # a duplicate: must not be yielded twice
        await conn.event("sub-3", 4)
        request = await conn.recv()  # the unsubscribe on leaving
        assert request["method"] == "agentSession.unsubscribe"
        await conn.reply(request, {"subscriptionId": "sub-3", "wasActive": True})

    with trio.fail_after(TEST_TIMEOUT_S):
        async with fake_daemon([first, second]) as path, open_client(path) as client:
            seqs: list[int] = []
            async with client.subscribe("s", after_seq=0) as events:
                async for item in events:
                    assert isinstance(item, st.JournalEvent)
                    seqs.append(item.seq)
                    if item.seq == 4:
                        break
    assert seqs == [1, 2, 3, 4]


async def test_a_slow_consumer_drops_its_buffer_and_resumes_from_the_journal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(follow, "MAX_BUFFERED", 3)

    async def script(conn: FakeConnection) -> None:
        await conn.subscribed("sub-1", after_seq=0)
        for seq in range(1, 11):
            await conn.event("sub-1", seq)
        requests = [await conn.recv(), await conn.recv()]
        by_method = {r["method"]: r for r in requests}
        await conn.reply(by_method["agentSession.unsubscribe"], {"subscriptionId": "sub-1"})
        resubscribe = by_method["agentSession.subscribe"]
        assert resubscribe["params"] == {"sessionId": "s", "afterSeq": 0}
        await conn.reply(resubscribe, {"subscriptionId": "sub-2", "headSeq": 10})
        for seq in range(1, 3):
            await conn.event("sub-2", seq)
        await conn.recv()  # the unsubscribe on leaving; the connection then closes

    with trio.fail_after(TEST_TIMEOUT_S):
        async with (
            fake_daemon([script]) as path,
            open_client(path) as client,
            client.subscribe("s", after_seq=0) as events,
        ):
            await trio.testing.wait_all_tasks_blocked()  # all ten arrived, unread
            first = await events.__anext__()
            second = await events.__anext__()
    assert isinstance(first, st.JournalEvent) and first.seq == 1
    assert isinstance(second, st.JournalEvent) and second.seq == 2


async def test_a_call_in_flight_when_the_connection_drops_raises_disconnected() -> None:
    async def script(conn: FakeConnection) -> None:
        await conn.recv()  # then close without answering

    with trio.fail_after(TEST_TIMEOUT_S):
        async with fake_daemon([script]) as path, open_client(path) as client:
            with pytest.raises(DaemonDisconnected):
                await client.call(methods.PING)


async def test_a_lost_subscription_gives_up_at_the_deadline() -> None:
    async def script(conn: FakeConnection) -> None:
        await conn.subscribed("sub-1", after_seq=0)
        # Then the connection closes, and nothing listens any more.

    with trio.fail_after(TEST_TIMEOUT_S):
        async with (
            fake_daemon([script]) as path,
            open_client(path, reconnect_deadline_s=0.2) as client,
            client.subscribe("s", after_seq=0) as events,
        ):
            path.unlink()  # the daemon is gone for good
            with pytest.raises(DaemonNotRunning):
                await events.__anext__()


async def test_an_ended_subscription_neither_resubscribes_nor_unsubscribes() -> None:
    after_ended: list[bytes] = []
    script_done = trio.Event()

    async def script(conn: FakeConnection) -> None:
        await conn.subscribed("sub-1", after_seq=0, head=1)
        await conn.event("sub-1", 1)
        ended = {"subscriptionId": "sub-1", "sessionId": "s", "lastSeq": 1, "reason": "deleted"}
        await conn.send({"jsonrpc": "2.0", "method": "agentSession.ended", "params": ended})
        while data := await conn.stream.receive_some(65536):  # until the client leaves
            after_ended.append(data)
        script_done.set()

    with trio.fail_after(TEST_TIMEOUT_S):
        async with fake_daemon([script]) as path:
            async with open_client(path) as client, client.subscribe("s", after_seq=0) as events:
                first = await events.__anext__()
                with pytest.raises(SessionNotFound) as gone:
                    await events.__anext__()
            await script_done.wait()
    assert isinstance(first, st.JournalEvent) and first.seq == 1
    assert gone.value.details == {"sessionId": "s", "reason": "deleted", "lastSeq": 1}
    assert after_ended == []


async def test_a_session_deleted_while_disconnected_raises_session_not_found() -> None:
    async def first(conn: FakeConnection) -> None:
        await conn.subscribed("sub-1", after_seq=0, head=1)
        await conn.event("sub-1", 1)
        # Then the connection drops; the session is deleted meanwhile.

    async def second(conn: FakeConnection) -> None:
        request = await conn.recv()
        assert request["params"] == {"sessionId": "s", "afterSeq": 1}, request
        error = msgspec.to_builtins(SessionNotFound("no session 's'").to_wire())
        await conn.send({"jsonrpc": "2.0", "id": request["id"], "error": error})

    with trio.fail_after(TEST_TIMEOUT_S):
        async with (
            fake_daemon([first, second]) as path,
            open_client(path) as client,
            client.subscribe("s", after_seq=0) as events,
        ):
            item = await events.__anext__()
            with pytest.raises(SessionNotFound, match="no session 's'"):
                await events.__anext__()
    assert isinstance(item, st.JournalEvent) and item.seq == 1
