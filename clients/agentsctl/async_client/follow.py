"""The following half of the trio client: subscriptions and watches, which survive
lagging, dropped connections and daemon restarts.

See Rules 3 and 4 of ``agentsctl.async_client``. A subscription's position in the
journal is ``agentsd_protocol.client.cursor.FollowCursor``'s, kept on the consumer's
side of the buffer, so what is dropped from the buffer is read again from the journal.
"""

from __future__ import annotations

import abc
import contextlib
from collections import deque
from typing import Generic, TypeVar

import msgspec
import trio

from agentsctl.async_client.connection import Connection, Connector, Route
from agentsctl.daemon import DaemonUnreachable
from agentsd_protocol import methods
from agentsd_protocol.api import stream as st
from agentsd_protocol.client.core import Notification
from agentsd_protocol.client.cursor import Ended, FollowCursor, Resubscribe
from agentsd_protocol.errors import RpcError, SessionNotFound

ItemT = TypeVar("ItemT")

MAX_BUFFERED = 10_000  # items a subscription holds for a slow consumer (Rule 4)
UNSUBSCRIBE_TIMEOUT_S = 2.0  # a local daemon answers in milliseconds; cleanup must not hang

SubscriptionItem = st.JournalEvent | st.DeltaNotification


class Follower(Route, Generic[ItemT]):
    """What subscriptions and watches share: a route on the current connection, a
    bounded buffer, and re-opening (with backoff) when the route is lost."""

    def __init__(self, client: Connector) -> None:
        self._client = client
        self._buffer: deque[ItemT] = deque()
        self._wakeup = trio.Event()
        self._conn: Connection | None = None
        self._route_key: str | None = None
        self._lost = False  # the route ended; re-open before waiting for more
        self._final: RpcError | None = None  # the route ended for good: raised, never re-opened

    @abc.abstractmethod
    async def _open_remote(self) -> tuple[Connection, str]:
        """Open the route on the daemon; returns the connection and its route key."""

    async def open(self) -> None:
        self._conn, self._route_key = await self._open_remote()

    async def _reopen(self) -> None:
        self._conn, self._route_key = await self._client.retrying(self._open_remote)
        self._lost = False

    def _detach(self) -> None:
        conn, key = self._conn, self._route_key
        if conn is not None and key is not None:
            conn.core.drop_route(key, self)

    def _wake(self) -> None:
        self._wakeup.set()

    def connection_lost(self) -> None:
        self._lost = True
        self._wake()

    def _push(self, item: ItemT) -> None:
        if len(self._buffer) >= MAX_BUFFERED:
            self._overflow()
            return
        self._buffer.append(item)
        self._wake()

    @abc.abstractmethod
    def _overflow(self) -> None:
        """Drop the buffer and re-open (Rule 4); the stale route is ended on the daemon."""

    def _end_for_good(self, error: RpcError) -> None:
        """Nothing more will come: once the buffer is drained, ``error`` is raised
        (on every call), and the route is never re-opened."""
        self._detach()
        self._final = error
        self._wake()

    async def _next_item(self) -> ItemT:
        while True:
            if self._buffer:
                return self._buffer.popleft()
            if self._final is not None:
                raise self._final
            if self._lost:
                await self._reopen()
                continue
            self._wakeup = trio.Event()
            if self._buffer or self._lost or self._final is not None:
                continue
            await self._wakeup.wait()

    def _unsubscribe_later(self, subscription_id: str) -> None:
        """End a subscription the daemon may still feed, without waiting for the answer."""
        client = self._client
        params = st.UnsubscribeParams(subscription_id=subscription_id)

        async def end() -> None:
            # Failing means it ended anyway, or its connection did.
            with contextlib.suppress(RpcError, DaemonUnreachable):
                await client.call(methods.UNSUBSCRIBE, params)

        client.spawn(end)


class Subscription(Follower[Notification]):
    """An async iterator over one session's journal events (``JournalEvent``) and
    streaming text (``DeltaNotification``); see ``AsyncClient.subscribe`` and Rule 3.

    ``head_seq`` is the session's head when the subscription was first opened;
    ``last_seq`` the seq of the last event yielded (before the first: ``after_seq``,
    or the head when following from it).

    A deleted session ends it with ``SessionNotFound``, raised by ``__anext__`` once
    every event received before is yielded, and on every call after. Told by
    ``agentSession.ended`` (kept in ``ended``), the error's ``details`` carry
    ``sessionId``, ``reason`` and ``lastSeq``, and nothing is re-subscribed or
    unsubscribed. A deletion while it was away (disconnected, or lagged) is the
    daemon's own ``SessionNotFound`` from the re-subscription.
    """

    def __init__(self, client: Connector, session_id: str, after_seq: int | None) -> None:
        super().__init__(client)
        self.session_id = session_id
        self._cursor = FollowCursor(session_id, after_seq)
        self._ready: deque[SubscriptionItem] = deque()  # taken from the cursor, not yielded

    @property
    def head_seq(self) -> int:
        return self._cursor.head_seq or 0

    @property
    def last_seq(self) -> int | None:
        return self._cursor.last_seq

    @property
    def subscription_id(self) -> str | None:
        return self._cursor.subscription_id

    @property
    def ended(self) -> Ended | None:
        return self._cursor.ended

    async def _open_remote(self) -> tuple[Connection, str]:
        # Everything buffered from the last subscription was taken by the cursor.
        self._cursor.unsubscribed()
        params = self._cursor.subscribe_params()
        conn, result = await self._client.request(methods.SUBSCRIBE, params, route=self)
        self._cursor.subscribed(result)  # events are yielded, not catch-up markers
        return conn, result.subscription_id

    def deliver(self, notification: Notification) -> None:
        self._push(notification)

    def _overflow(self) -> None:
        self._buffer.clear()
        self._detach()
        stale = self._cursor.subscription_id
        if stale is not None and self._conn is not None and self._conn.alive:
            self._unsubscribe_later(stale)
        self.connection_lost()

    def _take(self, notification: Notification) -> None:
        for item in self._cursor.receive(notification):
            match item:
                case st.JournalEvent() | st.DeltaNotification():
                    self._ready.append(item)
                case Resubscribe(stale=stale):
                    self._detach()
                    if stale is not None:
                        self._unsubscribe_later(stale)
                    self.connection_lost()
                case Ended(reason=reason, last_seq=last_seq):
                    self._end_for_good(
                        SessionNotFound(
                            f"session {self.session_id} was deleted (reason: {reason})",
                            sessionId=self.session_id,
                            reason=reason,
                            lastSeq=last_seq,
                        )
                    )

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> SubscriptionItem:
        """The next item. Events come exactly once, in seq order (the cursor's Rule 1)."""
        while not self._ready:
            self._take(await self._next_item())
        return self._ready.popleft()

    async def aclose(self) -> None:
        """Unsubscribe, unless the daemon ended it: only while its connection lives,
        bounded and shielded so that leaving a cancelled scope still cleans up."""
        self._detach()
        subscription_id, conn = self._cursor.subscription_id, self._conn
        if subscription_id is None or conn is None or not conn.alive or self._client.closed:
            return
        params = st.UnsubscribeParams(subscription_id=subscription_id)
        deadline = trio.current_time() + UNSUBSCRIBE_TIMEOUT_S
        # Failing means it is already gone: lagged, deleted, or its connection failed.
        with (
            trio.CancelScope(deadline=deadline, shield=True),
            contextlib.suppress(RpcError, DaemonUnreachable),
        ):
            await self._client.call(methods.UNSUBSCRIBE, params)


class Watch(Follower[st.StatusNotification]):
    """An async iterator over session status changes; see ``AsyncClient.watch``.

    The daemon has no ``unwatch``: a watch ends with its connection, and leaving the
    context only stops routing its notifications.
    """

    def __init__(self, client: Connector) -> None:
        super().__init__(client)
        self.watch_id: str | None = None
        self._known: set[str] = set()  # the sessions yielded as present

    async def _open_remote(self) -> tuple[Connection, str]:
        conn, result = await self._client.request(methods.WATCH, route=self)
        # The snapshot goes before every notification buffered since its reply.
        present = {status.session_id for status in result.sessions}
        snapshot = [_deleted_status(result.watch_id, sid) for sid in sorted(self._known - present)]
        snapshot.extend(
            st.StatusNotification(watch_id=result.watch_id, session=status)
            for status in result.sessions
        )
        self._buffer.extendleft(reversed(snapshot))
        self._wake()
        self.watch_id = result.watch_id
        return conn, result.watch_id

    def deliver(self, notification: Notification) -> None:
        if notification.method != "agentSession.status":
            return
        try:
            self._push(notification.decode(st.StatusNotification))
        except msgspec.ValidationError:
            self._overflow()

    def _overflow(self) -> None:
        # No seq to resume from: a fresh snapshot replaces what was dropped.
        self._buffer.clear()
        self._detach()
        self.connection_lost()

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> st.StatusNotification:
        item = await self._next_item()
        if item.deleted:
            self._known.discard(item.session.session_id)
        else:
            self._known.add(item.session.session_id)
        return item

    async def aclose(self) -> None:
        self._detach()


def _deleted_status(watch_id: str, session_id: str) -> st.StatusNotification:
    gone = st.SessionStatus(
        session_id=session_id,
        title=None,
        provider="",
        phase="stopped",
        status="idle",
        head_seq=0,
    )
    return st.StatusNotification(watch_id=watch_id, session=gone, deleted=True)
