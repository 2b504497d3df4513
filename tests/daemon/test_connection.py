"""One connection over in-memory streams, with trio's fake clock.

A full ``Connection`` (real dispatch, a real supervisor on a temporary store) is
driven through ``StreamTransport`` on ``trio.testing`` stream pairs, so the timeouts
(frame, send) take their default values in fake time and run in milliseconds. A
``memory_stream_pair`` stands for a client whose socket buffers everything; a
``lockstep_stream_pair`` for one that takes bytes only when it reads, so "the client
does not read" is exact. Nothing here sleeps in real time.

Every test takes ``autojump_clock`` itself: pytest-trio runs a test under the clock
among the test's own arguments, not among its fixtures'. A test whose client is cut
off ends by pinging through another connection: what one client does never affects
the daemon (DESIGN.md invariant 8).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import msgspec
import pytest
import trio
import trio.testing

from agentsd.app import App
from agentsd.config import Config
from agentsd.connection import (
    MAX_OUTBOUND_MESSAGES,
    Connection,
    StreamTransport,
)
from agentsd.feed import CONNECTION_HIGH_WATER_BYTES, MAX_QUEUED
from agentsd.operations import Ledger
from agentsd.providers import provider_registry
from agentsd.store.journal import StoredEvent, read_events
from agentsd.store.writer import open_store
from agentsd.supervisor import open_supervisor
from agentsd_protocol.framing import FrameDecoder, Framing, encode_frame
from tests.daemon.test_feed_frames import old_notification

# Far beyond every timeout under test: reached (in fake time) only when the
# behaviour under test is broken and a test would otherwise wait forever.
GUARD_S = 1000.0
CATCH_UP_GUARD_S = 60.0  # real time, for a test that reads the store
PING = {"jsonrpc": "2.0", "id": 1, "method": "daemon.ping"}

Stream = trio.StapledStream[Any, Any]
StreamPair = Callable[[], tuple[Stream, Stream]]


@attrs.frozen
class Daemon:
    app: App
    session_id: str  # a session with no child, to subscribe to
    nursery: trio.Nursery  # where connections run; cancelled before the store closes

    @property
    def config(self) -> Config:
        return self.app.config


@pytest.fixture
async def daemon(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> AsyncIterator[Daemon]:
    # The store works in threads, in real time: the fake clock stands still while it
    # opens, creates the session and closes, and jumps only while the test runs.
    autojump_clock.autojump_threshold = math.inf
    config = Config()
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
            provider="mock",
            cwd=str(tmp_path),
            title=None,
            options={},
            env={},
            command=None,
        )
        autojump_clock.autojump_threshold = 0
        try:
            yield Daemon(app, session.id, connections)
        finally:
            autojump_clock.autojump_threshold = math.inf
            connections.cancel_scope.cancel()  # connections end before the store closes


class Peer:
    """The client's end of a connection: frames what it sends, decodes what it gets."""

    def __init__(self, stream: Stream, framing: Framing) -> None:
        self.stream = stream
        self.framing = framing
        self.received = bytearray()  # every byte, to check the framing of replies
        self._decoder = FrameDecoder(framing=framing)
        self._frames: deque[bytes] = deque()

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send(self, message: object) -> None:
        await self.send_raw(encode_frame(self.framing, msgspec.json.encode(message)))

    async def receive_some(self, max_bytes: int) -> bool:
        """Read once; False at end of stream."""
        data = await self.stream.receive_some(max_bytes)
        self.received += data
        self._frames.extend(self._decoder.feed_frames(bytes(data)))
        return bool(data)

    def ready(self) -> list[Any]:
        """The messages already received, without reading."""
        messages = [msgspec.json.decode(frame) for frame in self._frames]
        self._frames.clear()
        return messages

    async def recv(self) -> Any:
        """The next message; None once the daemon closed the connection."""
        while not self._frames:
            if not await self.receive_some(64 * 1024):
                return None
        return msgspec.json.decode(self._frames.popleft())

    async def recv_until_closed(self) -> list[Any]:
        messages = []
        while (message := await self.recv()) is not None:
            messages.append(message)
        return messages

    async def ping(self) -> None:
        await self.send(PING)
        assert await self.recv() == {"jsonrpc": "2.0", "id": 1, "result": {"pong": True}}


@attrs.define
class Served:
    connection: Connection
    peer: Peer
    done: trio.Event  # set once ``serve`` returned


def connect(
    daemon: Daemon,
    framing: Framing = Framing.NDJSON,
    pair: StreamPair = trio.testing.memory_stream_pair,
) -> Served:
    """Start serving a new connection, as the listener does for an accepted socket."""
    client, server = pair()
    connection = Connection(daemon.app, StreamTransport(server))
    served = Served(connection, Peer(client, framing), trio.Event())

    async def serve() -> None:
        daemon.app.connections.add(connection)
        try:
            await connection.serve()
        finally:
            daemon.app.connections.discard(connection)
            served.done.set()

    daemon.nursery.start_soon(serve)
    return served


async def assert_daemon_serves(daemon: Daemon) -> None:
    bystander = connect(daemon)
    await bystander.peer.ping()
    await bystander.peer.stream.aclose()
    await bystander.done.wait()


def assert_error(message: Any, code: int, kind: str) -> None:
    error = message["error"]
    assert (error["code"], error["data"]["kind"]) == (code, kind), message


# ---- framing ----------------------------------------------------------------------


@pytest.mark.parametrize("framing", list(Framing), ids=lambda f: f.value)
async def test_the_first_bytes_choose_the_framing_and_replies_use_it(
    autojump_clock: trio.testing.MockClock, daemon: Daemon, framing: Framing
) -> None:
    with trio.fail_after(GUARD_S):
        served = connect(daemon, framing)
        await served.peer.send_raw(b"\r\n \n\t")  # whitespace chooses nothing yet
        await served.peer.ping()
        assert served.connection.framing is framing
        expected = encode_frame(framing, b'{"jsonrpc":"2.0","id":1,"result":{"pong":true}}')
        assert bytes(served.peer.received) == expected
        await served.peer.stream.aclose()
        await served.done.wait()
        assert served.connection.closed_reason is None


@pytest.mark.parametrize("framing", list(Framing), ids=lambda f: f.value)
async def test_a_body_that_is_not_json_gets_a_parse_error_and_the_connection_survives(
    autojump_clock: trio.testing.MockClock, daemon: Daemon, framing: Framing
) -> None:
    with trio.fail_after(GUARD_S):
        served = connect(daemon, framing)
        await served.peer.send_raw(encode_frame(framing, b'{"jsonrpc": "2.0", "id": 9, "method"'))
        reply = await served.peer.recv()
        assert_error(reply, -32700, "parse_error")
        assert reply["id"] is None
        await served.peer.send({"jsonrpc": "2.0", "id": 5, "method": 1})
        reply = await served.peer.recv()
        assert_error(reply, -32600, "invalid_request")
        assert reply["id"] == 5
        await served.peer.ping()
        assert served.connection.closed_reason is None


async def test_a_framing_error_gets_one_reply_then_the_connection_closes(
    autojump_clock: trio.testing.MockClock, daemon: Daemon
) -> None:
    with trio.fail_after(GUARD_S):
        served = connect(daemon, Framing.CONTENT_LENGTH)
        await served.peer.send_raw(b"Content-Length: 2\r\nX-Unknown: 1\r\n\r\n{}")
        messages = await served.peer.recv_until_closed()
        assert len(messages) == 1, messages
        assert_error(messages[0], -32700, "parse_error")
        assert messages[0]["id"] is None
        await served.done.wait()
        assert (served.connection.closed_reason or "").startswith("framing error")
        await assert_daemon_serves(daemon)


# ---- the frame timeout (connection Rule 5) ------------------------------------------

HALF_FRAMES = {
    "content-length-body": (Framing.CONTENT_LENGTH, b"Content-Length: 48\r\n\r\n" + b'{"jsonrpc"'),
    "content-length-header": (Framing.CONTENT_LENGTH, b"Content-Le"),
    "ndjson-line": (Framing.NDJSON, b'{"jsonrpc":"2.0","id":1,"method":"daemon.pi'),
}


@pytest.mark.parametrize(("framing", "half"), list(HALF_FRAMES.values()), ids=list(HALF_FRAMES))
async def test_a_frame_left_unfinished_is_cut_after_the_frame_timeout(
    autojump_clock: trio.testing.MockClock, daemon: Daemon, framing: Framing, half: bytes
) -> None:
    with trio.fail_after(GUARD_S):
        served = connect(daemon, framing)
        await served.peer.ping()  # the connection is in use, then a frame stalls
        started = trio.current_time()
        await served.peer.send_raw(half)
        messages = await served.peer.recv_until_closed()
        waited = trio.current_time() - started
        assert waited == pytest.approx(daemon.config.frame_timeout_s)
        assert len(messages) == 1, messages
        assert_error(messages[0], -32700, "parse_error")
        assert messages[0]["id"] is None
        assert "unfinished" in messages[0]["error"]["message"]
        await served.done.wait()
        await assert_daemon_serves(daemon)


@pytest.mark.parametrize("framing", list(Framing), ids=lambda f: f.value)
async def test_the_frame_timeout_counts_one_frame_not_the_connections_life(
    autojump_clock: trio.testing.MockClock, daemon: Daemon, framing: Framing
) -> None:
    """Every chunk ends in the middle of a frame and arrives 0.6 timeouts after the
    one before: each frame completes within the timeout, the stream lasts twelve."""
    frames = 20
    ids = range(100, 100 + frames)  # three digits each: every frame has the same length
    stream = b"".join(
        encode_frame(framing, b'{"jsonrpc":"2.0","id":%d,"method":"daemon.ping"}' % i) for i in ids
    )
    frame_bytes = len(stream) // frames
    cuts = [0, *range(frame_bytes // 2, len(stream), frame_bytes), len(stream)]
    pause_s = daemon.config.frame_timeout_s * 0.6
    with trio.fail_after(GUARD_S):
        served = connect(daemon, framing)
        for start, end in itertools.pairwise(cuts):
            await served.peer.send_raw(stream[start:end])
            await trio.sleep(pause_s)
        await served.peer.stream.send_eof()
        replies = await served.peer.recv_until_closed()
        assert sorted(reply["id"] for reply in replies) == list(ids)
        assert served.connection.closed_reason is None


# ---- a client that does not read (connection Rule 3) ---------------------------------


async def test_a_client_that_takes_no_bytes_is_cut_after_the_send_timeout(
    autojump_clock: trio.testing.MockClock, daemon: Daemon
) -> None:
    with trio.fail_after(GUARD_S):
        served = connect(daemon, pair=trio.testing.lockstep_stream_pair)
        started = trio.current_time()
        await served.peer.send(PING)  # and never read the reply
        await served.done.wait()
        assert trio.current_time() - started == pytest.approx(daemon.config.send_timeout_s)
        assert served.connection.closed_reason == "client accepted no bytes for too long"
        # The daemon closed its end: the client reads what its stream held, then EOF.
        await served.peer.recv_until_closed()
        await assert_daemon_serves(daemon)


async def test_requests_pipelined_without_reading_are_cut_at_the_outbound_bound(
    autojump_clock: trio.testing.MockClock, daemon: Daemon
) -> None:
    """The daemon keeps reading, so the offender never blocks it; its replies queue up
    to ``MAX_OUTBOUND_MESSAGES`` and then it is cut off, at once, long before the
    send timeout would."""
    requests = 2 * MAX_OUTBOUND_MESSAGES
    stream = b"".join(
        encode_frame(Framing.NDJSON, b'{"jsonrpc":"2.0","id":%d,"method":"daemon.ping"}' % i)
        for i in range(requests)
    )
    with trio.fail_after(GUARD_S):
        served = connect(daemon, pair=trio.testing.lockstep_stream_pair)
        started = trio.current_time()
        with pytest.raises(trio.BrokenResourceError):
            await served.peer.send_raw(stream)  # the daemon stops reading when it cuts
        await served.done.wait()
        assert trio.current_time() == started
        assert served.connection.closed_reason == (
            "client is not reading its replies (outbound queue full)"
        )
        await assert_daemon_serves(daemon)


# ---- a subscriber that falls behind (feed Rule 2) ------------------------------------


def flood(session_id: str, first_seq: int, count: int, text_bytes: int) -> list[StoredEvent]:
    """Committed events as the supervisor publishes them. They follow the head the
    subscription started from, so the feed never reads the store for them."""
    body = msgspec.json.encode({"source": "test", "message": "x" * text_bytes})
    return [
        StoredEvent(
            session_id=session_id, seq=seq, ts=time.time(), fence=0, kind="agent.warning", body=body
        )
        for seq in range(first_seq, first_seq + count)
    ]


async def subscribe(served: Served, session_id: str) -> tuple[str, int]:
    """Subscribe from the head; wait until the pump runs (it starts after the reply)."""
    await served.peer.send(
        {
            "jsonrpc": "2.0",
            "id": "sub",
            "method": "agentSession.subscribe",
            "params": {"sessionId": session_id},
        }
    )
    result = (await served.peer.recv())["result"]
    await trio.testing.wait_all_tasks_blocked()
    return result["subscriptionId"], result["headSeq"]


def ended(messages: list[Any]) -> bool:
    return bool(messages) and messages[-1]["method"] != "agentSession.event"


def outcome(messages: list[Any], subscription_id: str) -> tuple[list[int], Any]:
    """The seqs a subscription delivered, and the notification that ended it."""
    assert ended(messages), messages[-1:]
    for message in messages:
        assert message["params"]["subscriptionId"] == subscription_id, message
    return [m["params"]["seq"] for m in messages[:-1]], messages[-1]


async def test_a_subscriber_that_stops_reading_is_told_lagged_and_dropped(
    autojump_clock: trio.testing.MockClock, daemon: Daemon
) -> None:
    """The pump stops at the connection's high-water mark, the subscription's queue
    overflows, and the subscriber receives a contiguous prefix, then ``lagged`` with
    the seq to resume after; the connection itself stays open and usable."""
    feed = daemon.app.supervisor.feed
    with trio.fail_after(GUARD_S):
        served = connect(daemon, pair=trio.testing.lockstep_stream_pair)
        subscription_id, head = await subscribe(served, daemon.session_id)
        events = flood(daemon.session_id, head + 1, 3 * MAX_QUEUED, text_bytes=10)
        for offset in range(0, len(events), 100):
            feed.publish(daemon.session_id, events[offset : offset + 100])
            await trio.testing.wait_all_tasks_blocked()
        assert served.connection.closed_reason is None
        messages: list[Any] = []
        while not ended(messages):
            message = await served.peer.recv()
            assert message is not None, "the connection closed"
            messages.append(message)
        seqs, end = outcome(messages, subscription_id)
        assert seqs == list(range(head + 1, head + 1 + len(seqs)))
        assert len(seqs) < len(events)
        assert end["method"] == "agentSession.lagged", end
        assert end["params"]["resumeAfterSeq"] == seqs[-1]
        assert feed.subscriber_count(daemon.session_id) == 0
        await served.peer.ping()
        assert served.connection.closed_reason is None


async def test_a_slow_reader_holds_the_outbound_queue_at_its_high_water_mark(
    autojump_clock: trio.testing.MockClock, daemon: Daemon
) -> None:
    """A subscriber reads 64 KiB a second while its session journals 1 MiB a second.
    What the daemon holds for it stays at ``CONNECTION_HIGH_WATER_BYTES`` (plus the
    frame that crossed it), never growing toward the cut-off bound; the client is
    never cut, and lags once its subscription's own queue overflows."""
    feed = daemon.app.supervisor.feed
    read_bytes = 64 * 1024  # each second
    published = 256  # events of 4 KiB each second
    with trio.fail_after(GUARD_S):
        served = connect(daemon, pair=trio.testing.lockstep_stream_pair)
        subscription_id, head = await subscribe(served, daemon.session_id)
        events = flood(daemon.session_id, head + 1, 2 * MAX_QUEUED, text_bytes=4096)
        frame_bytes = len(events[0].body) + 512  # the notification around the body
        peak = 0
        messages: list[Any] = []

        async def read_slowly() -> None:
            while not ended(messages):
                assert await served.peer.receive_some(read_bytes), "the connection closed"
                messages.extend(served.peer.ready())
                await trio.sleep(1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_slowly)
            for offset in range(0, len(events), published):
                feed.publish(daemon.session_id, events[offset : offset + published])
                await trio.testing.wait_all_tasks_blocked()
                peak = max(peak, served.connection.queued_bytes)
                await trio.sleep(1)
        seqs, end = outcome(messages, subscription_id)
        assert peak >= CONNECTION_HIGH_WATER_BYTES  # the mark was reached
        assert peak <= CONNECTION_HIGH_WATER_BYTES + frame_bytes
        assert end["method"] == "agentSession.lagged", end
        assert seqs == list(range(head + 1, end["params"]["resumeAfterSeq"] + 1))
        assert served.connection.closed_reason is None


# ---- catch-up (feed Rule 4) ------------------------------------------------------------


async def test_a_caught_up_stream_is_frame_for_frame_what_one_message_per_event_sent(
    autojump_clock: trio.testing.MockClock, daemon: Daemon
) -> None:
    """More events than a catch-up page holds, bodies of every size up to 64 KiB, so
    pages split into several writes; each framing."""
    store = daemon.app.supervisor.store
    session = daemon.app.supervisor.get(daemon.session_id)
    sizes = [0, 10, 200, 4000, 65536]
    items = [
        ("agent.warning", msgspec.json.encode({"source": "test", "message": "x" * sizes[n % 5]}))
        for n in range(3000)
    ]
    # Catch-up reads the store in its thread, in real time: no jumps meanwhile.
    autojump_clock.autojump_threshold = math.inf
    await store.append(daemon.session_id, 0, items, time.time())
    stored, _ = await store.read(
        lambda conn: read_events(conn, daemon.session_id, limit=10_000, max_bytes=1 << 30)
    )
    session.head_seq = stored[-1].seq
    for framing in Framing:
        with trio.fail_after(CATCH_UP_GUARD_S):
            served = connect(daemon, framing)
            await served.peer.send(
                {
                    "jsonrpc": "2.0",
                    "id": "sub",
                    "method": "agentSession.subscribe",
                    "params": {"sessionId": daemon.session_id, "afterSeq": 0},
                }
            )
            reply: Any = await served.peer.recv()
            subscription_id = reply["result"]["subscriptionId"]
            expected = b"".join(
                encode_frame(framing, old_notification(subscription_id, daemon.session_id, e))
                for e in stored
            )
            reply_frame = encode_frame(framing, msgspec.json.encode(reply))
            while len(served.peer.received) < len(reply_frame) + len(expected):
                assert await served.peer.receive_some(1 << 20), "the connection closed"
            received = bytes(served.peer.received)
            assert received[len(reply_frame) :] == expected
            await served.peer.stream.aclose()
            await served.done.wait()
