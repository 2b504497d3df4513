"""A held agent's output position (``agentsd.sink`` Rule 4, ``providers.base``
Rule 5), against a real store: every commit stores where the agent's stdout is
journaled up to, in its own transaction, and only then acknowledges that offset;
a sink that takes over drops exactly the events of the line read again that were
journaled, and goes on from an open item's journaled text."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import msgspec
import pytest
import trio
import trio.testing

from agentsd.feed import Feed
from agentsd.leases import Identity
from agentsd.providers.base import BACKLOG_BYTES, BACKLOG_SOON_BYTES, OVERRUN_BYTES, LineLink
from agentsd.session import Session
from agentsd.session_journal import SessionJournal
from agentsd.session_task import SessionTask
from agentsd.sink import HeldOutput, OpenItem, Sink
from agentsd.status_board import StatusBoard
from agentsd.store import leases as lease_rows
from agentsd.store import sessions as session_rows
from agentsd.store.journal import StoredEvent, read_events
from agentsd.store.writer import Store, open_store
from agentsd_protocol.api.events import AgentWarning, ItemUpdated, SessionCreated, decode_event
from agentsd_protocol.errors import StorageUnavailable

SESSION = "s1"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "agentsd.db") as store:
        yield store


async def live_session(store: Store) -> Session:
    now = time.time()
    row = session_rows.SessionRow(
        id=SESSION,
        host_id="h",
        provider="mock",
        cwd="/",
        title=None,
        options={},
        env={},
        command=None,
        provider_handle="handle",
        created_at=now,
        updated_at=now,
    )
    await store.write(
        lambda conn: session_rows.insert_session(
            conn, row, [SessionCreated(provider="mock", cwd="/")]
        )
    )
    lease, _ = await store.write(lambda conn: lease_rows.acquire_lease(conn, SESSION, now))
    live, _ = await store.write(
        lambda conn: lease_rows.lease_live(conn, lease, Identity(pid=1, pgid=1, start_time=1), now)
    )
    row = attrs.evolve(row, fence=live.fence)
    session = Session(row=row, head_seq=3, board=StatusBoard(), lease=live)
    session.journal = SessionJournal(session, store, Feed())
    return session


def line(emits: list[str] | None = None, delta: str | None = None, pad: int = 0) -> bytes:
    frame: dict[str, Any] = {"emit": emits or [], "delta": delta, "pad": "." * pad}
    return msgspec.json.encode(frame) + b"\n"


async def translate(link: LineLink, sink: Sink) -> None:
    """A minimal adapter: each line's events in order, then its delta (Rule 5)."""
    while (frame := await link.receive()) is not None:
        for message in frame["emit"]:
            await sink.emit(AgentWarning(source="test", message=message))
        if frame["delta"]:
            sink.delta("item", frame["delta"])


async def journal(store: Store) -> list[StoredEvent]:
    events, _ = await store.read(
        lambda conn: read_events(conn, SESSION, after_seq=0, limit=10_000, max_bytes=1 << 30)
    )
    return events


def warnings(events: list[StoredEvent]) -> list[str]:
    out = []
    for stored in events:
        event = decode_event(stored.kind, stored.body)
        if isinstance(event, AgentWarning):
            out.append(event.message)
    return out


async def stored_position(store: Store, session: Session) -> tuple[int, int]:
    fence = session.lease.fence if session.lease is not None else 0
    return await store.read(lambda conn: lease_rows.held_output(conn, SESSION, fence))


async def run_over(
    store: Store, session: Session, data: bytes, *, base: int = 0, **held: Any
) -> tuple[Sink, list[int], LineLink]:
    """Feed ``data`` (the agent's stdout from ``base``) to a sink with Rule 4 on;
    the offsets it acknowledged."""
    acks: list[int] = []
    send, receive = trio.testing.memory_stream_one_way_pair()
    link = LineLink(trio.testing.MemorySendStream(), receive, base=base)
    assert session.lease is not None
    sink = Sink(session, session.lease, SessionTask(), HeldOutput(link.cursor, acks.append, **held))
    await send.send_all(data)
    await send.aclose()
    await translate(link, sink)
    await sink.flush_snapshots()
    return sink, acks, link


async def test_each_commit_stores_the_position_it_makes_durable_and_acknowledges_it(
    store: Store,
) -> None:
    session = await live_session(store)
    first = line(["a1", "a2"])
    second = line(delta="xyz")
    third = line(["b1"])
    _, acks, _ = await run_over(store, session, first + second + third)
    start_third = len(first) + len(second)
    # b1 took the snapshot of the second line's delta with it: the last commit is the
    # third line's, its first event journaled.
    assert await stored_position(store, session) == (start_third, 1)
    assert acks == [0, 0, start_third]
    assert warnings(await journal(store)) == ["a1", "a2", "b1"]


async def test_a_takeover_drops_only_the_events_of_the_line_that_were_journaled(
    store: Store,
) -> None:
    """The earlier daemon died after journaling a1 of the line at offset 100 (and
    nothing of the line after it): a2 and the next line's events follow, once."""
    session = await live_session(store)
    data = line(["a1", "a2", "a3"]) + line(["b1"])
    _, acks, _ = await run_over(store, session, data, base=100, replay=(100, 1))
    assert warnings(await journal(store)) == ["a2", "a3", "b1"]
    assert await stored_position(store, session) == (100 + len(line(["a1", "a2", "a3"])), 1)
    assert acks[0] == 100


async def test_between_lines_the_position_is_the_end_of_the_last_one(store: Store) -> None:
    session = await live_session(store)
    _, _, link = await run_over(store, session, line(["a1"]) + b"\n\n" + line(delta="x"))
    assert link.cursor.position == (len(line(["a1"])) + 2 + len(line(delta="x")), 0)
    # The delta's snapshot, flushed after its line was read.
    assert await stored_position(store, session) == link.cursor.position


async def test_a_takeover_goes_on_from_an_open_items_journaled_text(store: Store) -> None:
    session = await live_session(store)
    items = {"item": OpenItem(text="abc", length=3)}
    await run_over(store, session, line(delta="def"), replay=(0, 0), open_items=items)
    updates = [
        event
        for stored in await journal(store)
        if isinstance(event := decode_event(stored.kind, stored.body), ItemUpdated)
    ]
    assert [u.text for u in updates] == ["abcdef"]


async def test_lines_without_events_are_made_durable_past_the_backlog_bound(
    store: Store,
) -> None:
    """The holder keeps what is not durable, up to its bound: lines no event comes
    of (a response nobody waits for) must not hold the position back for ever."""
    session = await live_session(store)
    quiet = line(pad=1024)
    count = BACKLOG_BYTES // len(quiet) + 2
    _, acks, _ = await run_over(store, session, quiet * count)
    assert acks and acks[-1] > BACKLOG_BYTES
    offset, skip = await stored_position(store, session)
    assert (offset, skip) == (acks[-1], 0)
    assert warnings(await journal(store)) == []


async def test_past_half_the_backlog_the_reader_asks_for_the_position_without_waiting(
    store: Store,
) -> None:
    """A fast stream must not stall on commits: past ``BACKLOG_SOON_BYTES`` of lines
    with no event the reader only asks the session task for a commit of the
    position (its alarm is due now) and reads on; that commit stores the position
    the reader is at and acknowledges it."""
    session = await live_session(store)
    quiet = line(pad=1024)
    count = BACKLOG_SOON_BYTES // len(quiet) + 2
    assert count * len(quiet) < BACKLOG_BYTES
    acks: list[int] = []
    send, receive = trio.testing.memory_stream_one_way_pair()
    link = LineLink(trio.testing.MemorySendStream(), receive)
    assert session.lease is not None
    sink = Sink(session, session.lease, SessionTask(), HeldOutput(link.cursor, acks.append))
    await send.send_all(quiet * count)
    await send.aclose()
    await translate(link, sink)
    assert acks == [], "the reader waited for a commit below the backlog bound"
    assert sink.snapshot_due <= trio.current_time(), "no commit of the position was asked for"
    await sink.flush_snapshots()  # what the session task does once its alarm is due
    assert acks == [count * len(quiet)]
    assert await stored_position(store, session) == (count * len(quiet), 0)
    assert sink.snapshot_due == float("inf")
    await sink.flush_snapshots()  # answered: nothing more to commit
    assert acks == [count * len(quiet)]


async def test_a_line_the_holder_cannot_hold_whole_gives_up_its_start(store: Store) -> None:
    session = await live_session(store)
    overruns: list[int] = []
    send, receive = trio.testing.memory_stream_one_way_pair()
    link = LineLink(trio.testing.MemorySendStream(), receive)
    link.cursor.on_overrun = overruns.append
    await send.send_all(line(["big"], pad=OVERRUN_BYTES + 256 * 1024))
    await send.aclose()
    assert session.lease is not None
    sink = Sink(session, session.lease, SessionTask(), HeldOutput(link.cursor, lambda _: None))
    await translate(link, sink)
    assert overruns and overruns[-1] > OVERRUN_BYTES
    assert warnings(await journal(store)) == ["big"]


async def test_a_commit_the_store_refused_is_not_counted_as_the_lines(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event of the line whose commit failed is not journaled: a later commit of
    the same line stores only the events that were, or a takeover would drop one
    event that never reached the journal."""
    session = await live_session(store)
    send, receive = trio.testing.memory_stream_one_way_pair()
    link = LineLink(trio.testing.MemorySendStream(), receive)
    assert session.lease is not None
    acks: list[int] = []
    sink = Sink(session, session.lease, SessionTask(), HeldOutput(link.cursor, acks.append))
    await send.send_all(line(["a1", "a2"], delta="x"))
    assert await link.receive() is not None  # the line is being handled
    await sink.emit(AgentWarning(source="test", message="a1"))
    real = SessionJournal.append

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise StorageUnavailable("the disk is full")

    monkeypatch.setattr(SessionJournal, "append", refuse)
    with pytest.raises(StorageUnavailable):
        await sink.emit(AgentWarning(source="test", message="a2"))
    monkeypatch.setattr(SessionJournal, "append", real)
    sink.delta("item", "x")
    await sink.flush_snapshots()
    assert await stored_position(store, session) == (0, 1)
    assert warnings(await journal(store)) == ["a1"]
