"""Live fan-out of journal events and streaming deltas to subscribers.

Rule 1 (exactly once, in order): each subscription keeps a cursor, the last seq it
delivered. A live event at or below the cursor is a duplicate and is skipped; one
beyond ``cursor + 1`` means something is missing (catch-up not finished, or a
publisher that committed but was cancelled before publishing), and the gap is read
from the store before the event is delivered. So catch-up and live switch over with
no gap and no duplicate, whatever order publishers run in.

Rule 2 (bounded): each subscription's live queue holds at most ``MAX_QUEUED`` items.
When a subscriber falls behind, it is sent ``agentSession.lagged`` with the seq to
resume after, and dropped; the session and other subscribers never wait for it. The
pump also stops feeding a connection whose outbound buffer is above
``CONNECTION_HIGH_WATER_BYTES`` (catch-up checks once per page, so the buffer may
pass the mark by up to one page, ``CATCH_UP_PAGE_BYTES`` of bodies), so a slow
reader lags instead of being cut off.

Rule 3: a subscription ends with its connection.

Rule 5 (no gap mid-stream): a subscription made while text streams is handed, as
it is made, the text streamed past each open item's last committed snapshot
(``agentsd.streaming``), and sends it as one delta right after its catch-up and
before anything live: the deltas that follow run on from it, with no gap to wait
out until the next snapshot.

Rule 4 (cheap per event): an ``agentSession.event`` notification is spliced from
bytes (``EventFrames``): the stored body is already JSON and goes out as it is, and
the bytes around it are the ones msgspec writes for ``EventNotification``. A
catch-up page goes to the connection as one write.
"""

from __future__ import annotations

import functools
import itertools
import logging
import sqlite3
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import attrs
import msgspec
import trio

from agentsd.store.journal import EventRow, StoredEvent, read_event_rows
from agentsd_protocol.api.events import upgrade_row
from agentsd_protocol.api.stream import (
    DeltaNotification,
    EndedNotification,
    JournalEvent,
    LaggedNotification,
)

if TYPE_CHECKING:
    from agentsd.connection import Connection
    from agentsd.store.writer import Store

log = logging.getLogger(__name__)

MAX_QUEUED = 2048  # live items per subscriber before it counts as lagging
CATCH_UP_PAGE_EVENTS = 2000  # events per catch-up read
CATCH_UP_PAGE_BYTES = 1024 * 1024  # bytes per catch-up read
CONNECTION_HIGH_WATER_BYTES = 1024 * 1024  # stop feeding a connection this far behind

_sub_ids = itertools.count(1)
_encoder = msgspec.json.Encoder()


@attrs.frozen
class Delta:
    item_id: str
    offset: int
    text: str
    after_seq: int


Item = StoredEvent | Delta


def journal_event(event: StoredEvent) -> JournalEvent:
    """The wire form of a stored event. A row written before a kind or field was
    renamed goes out as the current code writes it, so clients see only the kinds of
    ``agentsd_protocol.api.events``; any other row's body is forwarded as stored."""
    kind, body = upgrade_row(event.kind, event.body)
    return JournalEvent(
        seq=event.seq, ts=event.ts, fence=event.fence, kind=kind, body=msgspec.Raw(body)
    )


class EventFrames:
    """The ``agentSession.event`` notifications of one subscription, as JSON-RPC
    bodies byte for byte equal to ``encode_notification("agentSession.event",
    EventNotification(...))`` of ``journal_event(event)`` (a test holds them to it),
    built without decoding the stored body or building a Struct per event."""

    __slots__ = ("_head", "_kinds")

    def __init__(self, subscription_id: str, session_id: str) -> None:
        # EventNotification's fields in declaration order, then JournalEvent's.
        self._head = (
            b'{"jsonrpc":"2.0","method":"agentSession.event","params":{"subscriptionId":'
            + _encoder.encode(subscription_id)
            + b',"sessionId":'
            + _encoder.encode(session_id)
            + b',"seq":'
        )
        # A stored kind -> the JSON of the kind it goes out as, and whether
        # ``upgrade_row`` may rewrite its bodies (asked once per kind: asked per
        # event, it costs as much as the rest of the encoding).
        self._kinds: dict[str, tuple[bytes, bool]] = {}

    def encode(self, event: StoredEvent) -> bytes:
        return self.encode_rows(((event.seq, event.ts, event.fence, event.kind, event.body),))[0]

    def encode_rows(self, rows: Iterable[EventRow]) -> list[bytes]:
        head, kinds, encode = self._head, self._kinds, _encoder.encode
        out: list[bytes] = []
        append = out.append
        for seq, ts, fence, kind, body in rows:
            known = kinds.get(kind)
            if known is None:
                known = kinds[kind] = _kind_template(kind)
            kind_json, rewrites = known
            if rewrites:
                body = upgrade_row(kind, body)[1]
            append(
                b'%b%d,"event":{"seq":%d,"ts":%b,"fence":%d,"kind":%b,"body":%b}}}'
                % (head, seq, seq, encode(ts), fence, kind_json, body)
            )
        return out


def _kind_template(stored_kind: str) -> tuple[bytes, bool]:
    """The JSON of the kind a row of ``stored_kind`` goes out as, and whether
    ``upgrade_row`` rewrites some bodies of it: asked of ``upgrade_row`` itself,
    with a body that it rewrites for such a kind (one with a field ``kind``)."""
    probe = b'{"kind":null}'
    kind, body = upgrade_row(stored_kind, probe)
    return _encoder.encode(kind), body != probe


class Subscription:
    """One subscriber of one session; its pump task is owned by the connection."""

    def __init__(self, feed: Feed, session_id: str, connection: Connection, after_seq: int) -> None:
        self.id = f"sub-{next(_sub_ids)}"
        self.session_id = session_id
        self.connection = connection
        self.cursor = after_seq
        self._feed = feed
        self._frames = EventFrames(self.id, session_id)
        self._queue: deque[Item] = deque()
        self._wakeup = trio.Event()
        self._lagged = False
        self._catching_up = True
        self._refill = False
        self._tails: list[Delta] = []
        self.ended = False
        self.scope = trio.CancelScope()

    def start_from(self, tails: list[Delta]) -> None:
        """Rule 5: the streamed text the catch-up will not have, as the subscription
        is made (before anything live is offered)."""
        self._tails = tails

    def offer(self, item: Item) -> None:
        if self.ended or self._lagged:
            return
        if len(self._queue) >= MAX_QUEUED:
            self._queue.clear()
            if self._catching_up:
                # Everything dropped here is in the store; read it from there.
                self._refill = True
            else:
                self._lagged = True
        else:
            self._queue.append(item)
        self._wakeup.set()

    def end(self) -> None:
        self.ended = True
        self.scope.cancel()
        self._feed.remove(self)

    async def run(self, store: Store, head_seq: Callable[[], int]) -> None:
        """Catch up from the store, then deliver live items until ended or lagged."""
        with self.scope:
            try:
                await self._fill_to(store, head_seq())
                while self._refill:
                    self._refill = False
                    await self._fill_to(store, head_seq())
                self._catching_up = False
                for tail in self._tails:
                    self._send_delta(tail)
                self._tails = []
                while True:
                    while self._queue:
                        await self._below_high_water()
                        if not self._queue:
                            break  # lagged while waiting: the queue was dropped
                        item = self._queue.popleft()
                        if isinstance(item, Delta):
                            self._send_delta(item)
                            continue
                        if item.seq <= self.cursor:
                            continue
                        if item.seq > self.cursor + 1:
                            await self._close_gap(store, item.seq - 1)
                        self._send_event(item)
                    if self._lagged:
                        self._send_lagged()
                        return
                    self._wakeup = trio.Event()
                    if self._queue or self._lagged:
                        continue
                    await self._wakeup.wait()
            finally:
                self.ended = True
                self._feed.remove(self)

    async def _below_high_water(self) -> None:
        await self.connection.wait_outbound_below(CONNECTION_HIGH_WATER_BYTES)
        if self._lagged:
            # Lagged while waiting: what is queued is gone; resume from the cursor.
            self._queue.clear()

    async def _close_gap(self, store: Store, last_seq: int) -> None:
        """Deliver the events up to ``last_seq`` before a later one. Events committed
        in one batch are published by their writers' tasks in any order, so the
        missing ones are usually offered a moment later: take them from the queue
        (their queued copies are then skipped as duplicates) rather than wait for a
        store read, during which a flood would overflow the queue. Read the rest
        (a publisher cancelled after its commit) from the store."""
        await trio.lowlevel.checkpoint()
        queued = {
            item.seq: item
            for item in self._queue
            if isinstance(item, StoredEvent) and self.cursor < item.seq <= last_seq
        }
        while (event := queued.get(self.cursor + 1)) is not None:
            await self.connection.wait_outbound_below(CONNECTION_HIGH_WATER_BYTES)
            self._send_event(event)
        await self._fill_to(store, last_seq)

    async def _fill_to(self, store: Store, last_seq: int) -> None:
        while self.cursor < last_seq:
            frames, seq = await store.read(
                functools.partial(self._read_frames, after_seq=self.cursor, last_seq=last_seq)
            )
            if not frames:
                return  # deleted meanwhile
            await self.connection.wait_outbound_below(CONNECTION_HIGH_WATER_BYTES)
            self.connection.send_messages(frames)
            self.cursor = seq

    def _read_frames(
        self, conn: sqlite3.Connection, *, after_seq: int, last_seq: int
    ) -> tuple[list[bytes], int]:
        """The notifications of one page of events after ``after_seq``, up to
        ``last_seq`` (the rest arrives live, or by the next fill), and the seq of the
        last. Runs in the store's reader thread (``Store.read``), so encoding a
        page holds up no trio task."""
        rows, _more = read_event_rows(
            conn,
            self.session_id,
            after_seq=after_seq,
            limit=CATCH_UP_PAGE_EVENTS,
            max_bytes=CATCH_UP_PAGE_BYTES,
        )
        if rows and rows[-1][0] > last_seq:
            rows = [row for row in rows if row[0] <= last_seq]
        return self._frames.encode_rows(rows), rows[-1][0] if rows else after_seq

    def _send_event(self, event: StoredEvent) -> None:
        self.cursor = event.seq
        self.connection.send_message(self._frames.encode(event))

    def _send_delta(self, delta: Delta) -> None:
        self.connection.notify(
            "agentSession.delta",
            DeltaNotification(
                subscription_id=self.id,
                session_id=self.session_id,
                item_id=delta.item_id,
                offset=delta.offset,
                text=delta.text,
                after_seq=delta.after_seq,
            ),
        )

    def _send_lagged(self) -> None:
        log.info("subscription %s on %s lagged at seq %d", self.id, self.session_id, self.cursor)
        self.connection.notify(
            "agentSession.lagged",
            LaggedNotification(
                subscription_id=self.id, session_id=self.session_id, resume_after_seq=self.cursor
            ),
        )


class Feed:
    """Every live subscription, by session."""

    def __init__(self) -> None:
        self._by_session: dict[str, set[Subscription]] = {}
        self.by_id: dict[str, Subscription] = {}

    def add(self, subscription: Subscription) -> None:
        self._by_session.setdefault(subscription.session_id, set()).add(subscription)
        self.by_id[subscription.id] = subscription

    def remove(self, subscription: Subscription) -> None:
        subs = self._by_session.get(subscription.session_id)
        if subs is not None:
            subs.discard(subscription)
            if not subs:
                del self._by_session[subscription.session_id]
        self.by_id.pop(subscription.id, None)

    def publish(self, session_id: str, events: Sequence[StoredEvent]) -> None:
        for sub in tuple(self._by_session.get(session_id, ())):
            for event in events:
                sub.offer(event)

    def publish_delta(self, session_id: str, delta: Delta) -> None:
        for sub in tuple(self._by_session.get(session_id, ())):
            sub.offer(delta)

    def end_session(self, session_id: str, reason: str) -> None:
        """End every subscription of a session that is gone, telling each subscriber
        why (``agentSession.ended``) so it does not wait or resubscribe."""
        for sub in tuple(self._by_session.get(session_id, ())):
            sub.connection.notify(
                "agentSession.ended",
                EndedNotification(
                    subscription_id=sub.id,
                    session_id=session_id,
                    last_seq=sub.cursor,
                    reason=reason,
                ),
            )
            sub.end()

    def subscriber_count(self, session_id: str) -> int:
        return len(self._by_session.get(session_id, ()))
