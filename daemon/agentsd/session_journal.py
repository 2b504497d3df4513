"""A session's journal port: the one way into and out of a session's journal.

Every writer of a session's events holds the same port, ``session.journal``: the
handlers, the session task, the provider sink, and the settle of a lease
(``agentsd.held_lease`` takes its ``write``). A request thus flows handler ->
session -> store -> feed, and nothing returns to the supervisor on the way.

Rule 1 (durable first): the store commits first. Only then, in this order and with
no await in between, does the port advance the session's head seq, apply the events
to its conversation (which derives its status), its prompt queue and its summary,
take the committed columns into its in-memory row, publish the events to
subscribers, tell the status board, announce the notable events (turn completions,
approval requests) to its notice feeds, and wake those waiting on the conversation
(the end of a turn; the session task when the queue's head is due,
``agentsd.prompt_queue``). So nothing is published that is not durable, and a reply
sent after ``append`` returns is sent after the commit (DESIGN.md invariant 6). A
caller cancelled once its write was queued may have committed without publishing;
the feed fills such a gap from the store (``agentsd.feed`` Rule 1).

Rule 2: the port reads the journal only through named store functions, so no
handler holds SQL or a connection.

Rule 3: the port keeps the streamed text no snapshot has journaled yet
(``agentsd.streaming``), for a subscriber that arrives mid-stream (``tails``).

Rule 4 (a deleted session is not found): a request looks its session up, then
writes; a delete can complete in between. The store then refuses the write
(``UnknownSession``: nothing is committed) and the port raises ``SessionNotFound``,
what a request naming a deleted session gets, for every writer alike: the client
sees that stable error, not an internal one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from agentsd.feed import Delta, Feed
from agentsd.operations import Provisional, record_provisional
from agentsd.store import leases as lease_rows
from agentsd.store import sessions as session_rows
from agentsd.store.database import StoreConnection
from agentsd.store.journal import StoredEvent, UnknownSession, bodies_of_kind, read_events
from agentsd.store.writer import Store
from agentsd.streaming import StreamingText
from agentsd_protocol.api.events import Event, EventStruct, UnknownEvent, decode_event, kind_of
from agentsd_protocol.errors import SessionNotFound

if TYPE_CHECKING:
    import sqlite3

    from agentsd.session import Session

T = TypeVar("T")
E = TypeVar("E", bound=EventStruct)


class SessionJournal:
    """The journal port of one session; built by the supervisor when it registers
    the session, and shared by everything that writes for that session."""

    __slots__ = ("_feed", "_session", "_store", "_streaming")

    def __init__(self, session: Session, store: Store, feed: Feed) -> None:
        self._session = session
        self._store = store
        self._feed = feed
        self._streaming: StreamingText | None = None  # made at the first delta

    async def append(
        self,
        events: Sequence[Event],
        *,
        fence: int | None = None,
        provisional: Provisional | None = None,
        output: tuple[int, int] | None = None,
        **fields: Any,
    ) -> list[StoredEvent]:
        """Journal ``events`` under ``fence`` (default: the session's), with the
        session columns ``fields``, the ledger's ``provisional`` entry and the held
        agent's ``output`` position (offset, events of that line journaled: on the
        lease of ``fence``) in the same commit; returns the events as stored.
        Raises what the store raises (``StorageUnavailable``), or
        ``SessionNotFound`` once the session was deleted (Rule 4), and then nothing
        changed, durably or in memory."""
        session = self._session
        session_id = session.id
        fence = session.fence if fence is None else fence
        now = time.time()
        try:
            if fields or provisional is not None:

                def op(conn: StoreConnection) -> list[StoredEvent]:
                    stored = session_rows.update_session(
                        conn, session_id, fence, now, events, **fields
                    )
                    if provisional is not None:
                        record_provisional(conn, provisional.operation, provisional.result(stored))
                    if output is not None:
                        lease_rows.record_output(conn, session_id, fence, *output)
                    return stored

                stored = await self._store.write(op)
            else:
                items = session_rows.encode_events(events)
                stored = await self._store.append(session_id, fence, items, now, output)
        except UnknownSession:
            raise _deleted(session_id) from None
        if fields:
            session.row = attrs.evolve(session.row, **fields)
        self._committed(stored)
        return stored

    async def write(
        self, op: Callable[[StoreConnection], tuple[T, list[StoredEvent]]]
    ) -> tuple[T, list[StoredEvent]]:
        """Commit ``op``, a store op that changes other rows too (a lease, the
        session's own row) and returns ``(value, events it journaled)``; then apply
        and publish those events (Rule 1). Raises what the store raises, or
        ``SessionNotFound`` once the session was deleted (Rule 4)."""
        try:
            value, stored = await self._store.write(op)
        except UnknownSession:
            raise _deleted(self._session.id) from None
        self._committed(stored)
        return value, stored

    def publish_delta(self, item_id: str, offset: int, text: str) -> None:
        """Hand streaming text to subscribers at once; it is journaled later, as a
        snapshot, by whoever streams it (``agentsd.sink``)."""
        session = self._session
        delta = Delta(item_id=item_id, offset=offset, text=text, after_seq=session.head_seq)
        if self._streaming is None:
            self._streaming = StreamingText()
        self._streaming.streamed(item_id, offset, text)
        self._feed.publish_delta(session.id, delta)

    def tails(self) -> list[Delta]:
        """Rule 3: each open item's text streamed past its last committed snapshot,
        as one delta after the head seq (which a subscription made now catches up
        to first)."""
        head = self._session.head_seq
        return [
            Delta(item_id=item_id, offset=offset, text=text, after_seq=head)
            for item_id, offset, text in (self._streaming.tails() if self._streaming else ())
        ]

    async def latest(self, event_type: type[E], match: Callable[[E], bool]) -> E | None:
        """The session's newest journaled event of ``event_type`` for which
        ``match`` holds, or None. ``match`` runs in the store's reading thread: a
        pure test of the event."""
        session_id = self._session.id
        kind = kind_of(event_type)

        def find(conn: sqlite3.Connection) -> E | None:
            for body in bodies_of_kind(conn, session_id, kind):
                event = decode_event(kind, body)
                if isinstance(event, event_type) and match(event):
                    return event
            return None

        return await self._store.read(find)

    async def history(
        self, *, after_seq: int | None, before_seq: int | None, limit: int, max_bytes: int
    ) -> tuple[list[StoredEvent], bool]:
        """One page of the session's journal (``agentsd.store.journal.read_events``)."""
        session_id = self._session.id
        return await self._store.read(
            lambda conn: read_events(
                conn,
                session_id,
                after_seq=after_seq,
                before_seq=before_seq,
                limit=limit,
                max_bytes=max_bytes,
            )
        )

    def _committed(self, stored: Sequence[StoredEvent]) -> None:
        """Rule 1, once ``stored`` is durable."""
        if not stored:
            return
        session = self._session
        notable: list[tuple[StoredEvent, Event | UnknownEvent]] = []
        streaming = self._streaming
        for event in stored:
            if event.seq > session.head_seq:
                session.head_seq = event.seq
            decoded = decode_event(event.kind, event.body)
            if streaming is not None:
                streaming.committed(decoded)
            session.conversation.apply(event.seq, decoded)
            session.queue.apply(event.seq, decoded)
            if session.summary.apply(event.seq, decoded):
                notable.append((event, decoded))
        session.row = attrs.evolve(session.row, updated_at=stored[-1].ts)
        self._feed.publish(session.id, stored)
        session.board.changed(session)
        for event, decoded in notable:
            session.board.announce(session, event.seq, event.ts, decoded)
        session.conversation_changed()


def _deleted(session_id: str) -> SessionNotFound:
    """Rule 4: as ``Supervisor.get`` says it of a session it does not know."""
    return SessionNotFound(f"no session {session_id!r}", sessionId=session_id)
