"""Following one session live: catch up from the journal, then stream, across lags,
dropped connections and daemon restarts.

Rule 1 (exactly once, in order): ``agentsd_protocol.client.cursor.FollowCursor``
keeps the seq of the last event handed out (``cursor``), and every (re)subscription
asks for the events after it; so no lag, reconnect or restart repeats or skips an
event.

Rule 2 (resubscribe): when the cursor says so (after ``agentSession.lagged``, or a
gap) the follower subscribes again on the same connection from its cursor. After a
dropped connection it reconnects with backoff, never starting a daemon (one that went
away was stopped or is restarting; it is waited for, not replaced), then subscribes
again. Deltas streamed while
disconnected are not replayed: the next snapshot carries their text (see
``agentsctl.render``, Rule 1).

Rule 3 (deletion): ``agentSession.ended`` for the session ends following at once with
``SessionGone`` (its reason, and the cursor): nothing is resubscribed. A deletion the
follower was not told of (it happened while disconnected, or between a lag and the
resubscription) shows as ``session_not_found`` on the resubscription, which ends
following the same way. The first subscription's errors propagate unchanged.

Rule 4: ``next(timeout_s)`` never blocks past its timeout, reconnecting included, so a
caller can interleave keyboard input.

Rule 5 (seen): following is looking. Once caught up, and after each turn completion or
approval request handed out, ``acknowledge()`` (called by the view once it showed
them) tells the daemon the user has seen the session up to the cursor.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import TYPE_CHECKING

import msgspec

from agentsctl.daemon import DaemonDisconnected, DaemonUnreachable
from agentsd_protocol import methods
from agentsd_protocol.api import stream as st
from agentsd_protocol.api.attention import AcknowledgeParams
from agentsd_protocol.client.core import Notification
from agentsd_protocol.client.cursor import CaughtUp, Ended, FollowCursor, Resubscribe
from agentsd_protocol.errors import RpcError, SessionNotFound, ShuttingDown

if TYPE_CHECKING:
    from agentsctl.client import Client
    from agentsctl.target import Target

__all__ = ["CaughtUp", "FollowItem", "Follower", "Note", "SessionGone"]

NOTABLE_KINDS = frozenset({"turn.completed", "approval.requested"})  # unseen until shown
RECONNECT_FIRST_S = 0.05  # first pause before reconnecting, doubled up to RECONNECT_MAX_S
RECONNECT_MAX_S = 1.0  # a restarted daemon is seen within a second


NOT_FOUND_ON_RESUBSCRIBE = "not found on resubscribe"  # the reason when no ended was seen


class SessionGone(Exception):
    """The followed session was deleted (Rule 3): ``reason`` is the daemon's (from
    ``agentSession.ended``) or ``NOT_FOUND_ON_RESUBSCRIBE``; ``last_seq`` is the seq of
    the last event handed out."""

    def __init__(self, session_id: str, reason: str, last_seq: int) -> None:
        super().__init__(
            f"session {session_id} was deleted (reason: {reason}); "
            f"following ended after seq {last_seq}"
        )
        self.session_id = session_id
        self.reason = reason
        self.last_seq = last_seq


class Note(msgspec.Struct, frozen=True):
    """Something about the connection, for the user (lost, reconnected, lagged)."""

    text: str


FollowItem = st.JournalEvent | st.DeltaNotification | CaughtUp | Note


class Follower:
    """Follows ``session_id`` from ``after_seq`` (Rules 1-4); close it when done.

    Not thread-safe. ``open()`` makes the first connection and subscription.
    """

    def __init__(self, target: Target, session_id: str, *, after_seq: int = 0) -> None:
        self._target = target
        self.session_id = session_id
        self._cursor = FollowCursor(session_id, after_seq)
        self._client: Client | None = None
        self._items: deque[FollowItem] = deque()
        self._retry_at = 0.0
        self._backoff_s = RECONNECT_FIRST_S
        self._lost_reason: str | None = None
        self._gone_error: SessionGone | None = None  # once gone, always gone
        self._caught_up = False
        self._unacknowledged = False  # handed out something the user must see (Rule 5)

    @property
    def cursor(self) -> int:
        """The seq of the last event handed out."""
        return self._cursor.last_seq or 0

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open(self) -> None:
        """Connect (starting a daemon as ``target.client()`` does), then subscribe.

        Raises what connecting raises, and the daemon's error for the subscription
        (``SessionNotFound`` for an unknown session).
        """
        self._client = self._target.client()
        self._subscribe(self._client)

    def close(self) -> None:
        """Close the connection (idempotent); the daemon ends its subscription."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def next(self, timeout_s: float | None) -> FollowItem | None:
        """The next item, or None when ``timeout_s`` passes first (Rule 4).

        Raises ``SessionGone`` (Rule 3), after every item received before it was
        handed out, and on every call after that. Connection trouble is handled here
        and reported as ``Note`` items.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self._items:
                item = self._items.popleft()
                if isinstance(item, CaughtUp):
                    self._caught_up = self._unacknowledged = True
                elif isinstance(item, st.JournalEvent) and item.kind in NOTABLE_KINDS:
                    self._unacknowledged = True
                return item
            if self._gone_error is not None:
                raise self._gone_error
            client = self._client
            if client is None:
                connected = self._reconnect(deadline)
                if not connected and deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                notification = client.next_notification(remaining)
            except DaemonDisconnected as exc:
                self._lost(exc.message)
                continue
            if notification is None:
                return None
            self._handle(notification)

    def acknowledge(self) -> None:
        """Rule 5: record that the user has seen the session up to the cursor, if
        something they must see was handed out since the last time. A failure leaves
        it for the next call; connection trouble shows on ``next``."""
        client = self._client
        if client is None or not (self._caught_up and self._unacknowledged):
            return
        params = AcknowledgeParams(session_id=self.session_id, seq=self.cursor)
        try:
            client.call(methods.ACKNOWLEDGE, params)
        except (RpcError, DaemonUnreachable, TimeoutError):
            return
        self._unacknowledged = False

    # -- subscription ---------------------------------------------------------------

    def _subscribe(self, client: Client) -> None:
        result = client.call(methods.SUBSCRIBE, self._cursor.subscribe_params())
        self._items.extend(self._cursor.subscribed(result))

    def _handle(self, notification: Notification) -> None:
        for item in self._cursor.receive(notification):
            match item:
                case Resubscribe(stale=stale):
                    self._resubscribe(stale)
                case Ended(reason=reason):
                    self._gone(reason)
                case _:
                    self._items.append(item)

    def _resubscribe(self, stale: str | None) -> None:
        client = self._client
        if client is None:
            return
        self._items.append(Note(f"fell behind; resubscribing after seq {self.cursor}"))
        try:
            if stale is not None:
                with contextlib.suppress(RpcError):  # failing means it ended anyway
                    client.call(methods.UNSUBSCRIBE, st.UnsubscribeParams(subscription_id=stale))
            self._subscribe(client)
        except SessionNotFound:
            self._gone(NOT_FOUND_ON_RESUBSCRIBE)
        except (DaemonUnreachable, ShuttingDown, TimeoutError) as exc:
            self._lost(str(exc))

    def _gone(self, reason: str) -> SessionGone:
        """Record that the session is gone; ``next`` raises it once the items before
        it are handed out."""
        self._gone_error = SessionGone(self.session_id, reason, self.cursor)
        return self._gone_error

    # -- reconnecting ---------------------------------------------------------------

    def _lost(self, reason: str) -> None:
        self.close()
        self._cursor.unsubscribed()
        if self._lost_reason is None:
            self._lost_reason = reason
            self._items.append(Note(f"{reason}; reconnecting (Ctrl-C to stop)"))
        self._backoff_s = RECONNECT_FIRST_S
        self._retry_at = time.monotonic() + self._backoff_s

    def _reconnect(self, deadline: float | None) -> bool:
        """One attempt, once its backoff has passed; False if ``deadline`` came first
        or the attempt failed (the next call tries again)."""
        now = time.monotonic()
        if now < self._retry_at:
            wake = self._retry_at if deadline is None else min(self._retry_at, deadline)
            time.sleep(max(0.0, wake - now))
            if time.monotonic() < self._retry_at:
                return False  # the caller's deadline came first
        client: Client | None = None
        try:
            client = self._target.client(start=False)
            self._subscribe(client)
        except SessionNotFound:
            if client is not None:
                client.close()
            raise self._gone(NOT_FOUND_ON_RESUBSCRIBE) from None
        except (DaemonUnreachable, ShuttingDown, TimeoutError):
            if client is not None:
                client.close()
            self._retry_at = time.monotonic() + self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, RECONNECT_MAX_S)
            return False
        self._client = client
        self._lost_reason = None
        self._items.appendleft(Note(f"reconnected; resuming after seq {self.cursor}"))
        return True
