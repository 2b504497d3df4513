"""The following half of the trio client: subscriptions and watches, which survive
lagging, dropped connections and daemon restarts.

See Rules 3 and 4 of ``agentsctl.async_client``.
"""

from __future__ import annotations

import abc
import contextlib
from collections import deque
from typing import Generic, TypeVar

import msgspec
import trio

from agentsctl.async_client.connection import Connection, Connector, Route, decode_result
from agentsctl.daemon import DaemonUnreachable
from agentsd_protocol.api import stream as st
from agentsd_protocol.errors import RpcError, SessionNotFound
from agentsd_protocol.jsonrpc import ClientIncoming

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

    async def _reopen(self) -> None:
        self._conn, self._route_key = await self._client.retrying(self._open_remote)
        self._lost = False

    def _attach(self, conn: Connection, key: str) -> None:
        """Route ``key`` to this follower; runs in the reader (see ``Waiter``)."""
        conn.routes[key] = self

    def _detach(self) -> None:
        conn, key = self._conn, self._route_key
        if conn is not None and key is not None and conn.routes.get(key) is self:
            del conn.routes[key]

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

    def _end_remote_later(self, method: str, params: msgspec.Struct) -> None:
        """End a route the daemon may still feed, without waiting for the answer."""
        client = self._client

        async def end() -> None:
            # Failing means it ended anyway, or its connection did.
            with contextlib.suppress(RpcError, DaemonUnreachable):
                await client.call(method, params)

        client.spawn(end)

    async def _end_remote(self, method: str, params: msgspec.Struct) -> None:
        """End the route on the daemon if its connection lives; bounded and shielded so
        that leaving a cancelled scope still cleans up."""
        self._detach()
        conn = self._conn
        if conn is None or not conn.alive or self._client.closed:
            return
        # Failing means it is already gone: lagged, deleted, or its connection failed.
        deadline = trio.current_time() + UNSUBSCRIBE_TIMEOUT_S
        with (
            trio.CancelScope(deadline=deadline, shield=True),
            contextlib.suppress(RpcError, DaemonUnreachable),
        ):
            await self._client.call(method, params)


class Subscription(Follower[SubscriptionItem]):
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
        self.head_seq = 0
        self.last_seq: int | None = after_seq
        self._received_seq: int | None = after_seq  # highest seq buffered
        self.subscription_id: str | None = None
        self.ended: st.EndedNotification | None = None

    async def open(self) -> None:
        self._conn, self._route_key = await self._open_remote()

    async def _open_remote(self) -> tuple[Connection, str]:
        params = st.SubscribeParams(session_id=self.session_id, after_seq=self._received_seq)

        def on_reply(conn: Connection, reply: ClientIncoming) -> None:
            # In the reader, before any event of this subscription can be delivered.
            result = decode_result(reply, st.SubscribeResult)
            if self._received_seq is None:
                # Following from the head: the head is where this subscription starts.
                self._received_seq = self.last_seq = result.head_seq
            if self.subscription_id is None:
                self.head_seq = result.head_seq
            self.subscription_id = result.subscription_id
            self._attach(conn, result.subscription_id)

        conn, reply = await self._client.request(
            "agentSession.subscribe", params, on_reply=on_reply
        )
        return conn, decode_result(reply, st.SubscribeResult).subscription_id

    def deliver(self, method: str, params: msgspec.Raw) -> None:
        try:
            if method == "agentSession.event":
                event = msgspec.json.decode(params, type=st.EventNotification).event
                self._received_seq = event.seq
                self._push(event)
            elif method == "agentSession.delta":
                self._push(msgspec.json.decode(params, type=st.DeltaNotification))
            elif method == "agentSession.lagged":
                # The daemon ended this subscription; what it sent is all buffered here.
                self._detach()
                self.connection_lost()
            elif method == "agentSession.ended":
                self.ended = msgspec.json.decode(params, type=st.EndedNotification)
                self._end_for_good(
                    SessionNotFound(
                        f"session {self.session_id} was deleted (reason: {self.ended.reason})",
                        sessionId=self.session_id,
                        reason=self.ended.reason,
                        lastSeq=self.ended.last_seq,
                    )
                )
        except msgspec.ValidationError:
            self._detach()
            self.connection_lost()  # a malformed notification: resume from the journal

    def _overflow(self) -> None:
        self._buffer.clear()
        self._received_seq = self.last_seq
        self._detach()
        if self.subscription_id is not None and self._conn is not None and self._conn.alive:
            self._end_remote_later(
                "agentSession.unsubscribe",
                st.UnsubscribeParams(subscription_id=self.subscription_id),
            )
        self.connection_lost()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> SubscriptionItem:
        """The next item. Events come exactly once, in seq order; on an impossible gap
        the subscription re-opens from the last seq it yielded."""
        while True:
            item = await self._next_item()
            if isinstance(item, st.DeltaNotification):
                return item
            last = self.last_seq if self.last_seq is not None else item.seq - 1
            if item.seq <= last:
                continue  # already yielded before a re-subscription
            if item.seq > last + 1:
                self._overflow()  # a gap: read it from the journal
                continue
            self.last_seq = item.seq
            return item

    async def aclose(self) -> None:
        """Unsubscribe (see ``Follower._end_remote``), unless the daemon ended it."""
        if self.ended is not None:
            return
        if self.subscription_id is not None:
            params = st.UnsubscribeParams(subscription_id=self.subscription_id)
            await self._end_remote("agentSession.unsubscribe", params)


class Watch(Follower[st.StatusNotification]):
    """An async iterator over session status changes; see ``AsyncClient.watch``.

    The daemon has no ``unwatch``: a watch ends with its connection, and leaving the
    context only stops routing its notifications.
    """

    def __init__(self, client: Connector) -> None:
        super().__init__(client)
        self.watch_id: str | None = None
        self._known: set[str] = set()

    async def open(self) -> None:
        self._conn, self._route_key = await self._open_remote()

    async def _open_remote(self) -> tuple[Connection, str]:
        snapshot: list[st.StatusNotification] = []

        def on_reply(conn: Connection, reply: ClientIncoming) -> None:
            result = decode_result(reply, st.WatchResult)
            # Buffered before any notification the reader sees next (see ``Waiter``).
            present = {status.session_id for status in result.sessions}
            for session_id in sorted(self._known - present):
                snapshot.append(_deleted_status(result.watch_id, session_id))
            snapshot.extend(
                st.StatusNotification(watch_id=result.watch_id, session=status)
                for status in result.sessions
            )
            for note in snapshot:
                self._push(note)
            self._attach(conn, result.watch_id)

        conn, reply = await self._client.request("agentSession.watch", None, on_reply=on_reply)
        result = decode_result(reply, st.WatchResult)
        self.watch_id = result.watch_id
        return conn, result.watch_id

    def _push(self, item: st.StatusNotification) -> None:
        if item.deleted:
            self._known.discard(item.session.session_id)
        else:
            self._known.add(item.session.session_id)
        super()._push(item)

    def deliver(self, method: str, params: msgspec.Raw) -> None:
        if method != "agentSession.status":
            return
        try:
            self._push(msgspec.json.decode(params, type=st.StatusNotification))
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
        return await self._next_item()

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
