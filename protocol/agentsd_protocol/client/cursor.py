"""Following one session's journal exactly once, in seq order, without the socket.

``FollowCursor`` turns the notifications of a subscription into what a follower
hands out, and says when to subscribe again; the stdlib follower and the trio
client's ``Subscription`` drive it.

Rule 1 (exactly once, in order): ``last_seq`` is the seq of the last event handed
out. Every (re)subscription asks for the events after it (``subscribe_params``); an
event at or below it is a duplicate and is dropped. An event past ``last_seq + 1`` is
a gap the daemon never makes: the subscription is abandoned and read again from the
journal, as a notification that does not decode is.

Rule 2 (resubscribe): ``agentSession.lagged`` for the current subscription yields
``Resubscribe``: the daemon ended it; subscribe again with ``subscribe_params``. A
subscription lost with its connection is reported with ``unsubscribed`` and resumed
the same way.

Rule 3 (the end): ``agentSession.ended`` for the session yields ``Ended``, and the
cursor takes nothing after it: there is nothing to resubscribe to.

Rule 4: notifications of any other subscription (a stale one still draining, another
follower's on the same connection) are ignored.
"""

from __future__ import annotations

import msgspec

from agentsd_protocol.api import stream as st
from agentsd_protocol.client.core import Notification


class CaughtUp(msgspec.Struct, frozen=True):
    """Everything journaled before the (re)subscription has been handed out."""

    seq: int


class Resubscribe(msgspec.Struct, frozen=True):
    """The subscription ended or broke (Rules 1 and 2): subscribe again with
    ``subscribe_params``, after unsubscribing ``stale`` if it is not None (the daemon
    may still feed it)."""

    stale: str | None = None


class Ended(msgspec.Struct, frozen=True):
    """The session is gone (Rule 3); ``last_seq`` is the last seq handed out."""

    session_id: str
    reason: str
    last_seq: int | None


FollowItem = st.JournalEvent | st.DeltaNotification | CaughtUp | Resubscribe | Ended


class FollowCursor:
    """The position of one follower in one session's journal (Rules 1-4).

    ``after_seq`` None follows from the head at the first subscription. ``head_seq`` is
    the head that first subscription reported.
    """

    def __init__(self, session_id: str, after_seq: int | None = 0) -> None:
        self.session_id = session_id
        self.last_seq = after_seq
        self.subscription_id: str | None = None
        self.head_seq: int | None = None
        self.ended: Ended | None = None
        self._catch_up_to: int | None = None  # until CaughtUp is handed out

    def subscribe_params(self) -> st.SubscribeParams:
        return st.SubscribeParams(session_id=self.session_id, after_seq=self.last_seq)

    def subscribed(self, result: st.SubscribeResult) -> list[CaughtUp]:
        """The (re)subscription's reply arrived: what to hand out now."""
        if self.head_seq is None:
            self.head_seq = result.head_seq
        if self.last_seq is None:
            self.last_seq = result.head_seq  # following from the head: it starts here
        self.subscription_id = result.subscription_id
        self._catch_up_to = result.head_seq
        return self._caught_up()

    def unsubscribed(self) -> None:
        """The subscription is gone (its connection failed, or it was given up)."""
        self.subscription_id = None

    def receive(self, notification: Notification) -> list[FollowItem]:
        """What ``notification`` hands out, in order (usually one item or none)."""
        if self.ended is not None:
            return []
        try:
            match notification.method:
                case "agentSession.event":
                    return self._event(notification.decode(st.EventNotification))
                case "agentSession.delta":
                    delta = notification.decode(st.DeltaNotification)
                    return [delta] if self._current(delta.subscription_id) else []
                case "agentSession.lagged":
                    lagged = notification.decode(st.LaggedNotification)
                    if not self._current(lagged.subscription_id):
                        return []
                    self.subscription_id = None
                    return [Resubscribe()]
                case "agentSession.ended":
                    ended = notification.decode(st.EndedNotification)
                    if ended.session_id != self.session_id:
                        return []
                    # Whichever subscription it names: the session itself is gone.
                    self.subscription_id = None
                    self.ended = Ended(self.session_id, ended.reason, self.last_seq)
                    return [self.ended]
        except msgspec.DecodeError:
            return self._abandon()
        return []

    def _current(self, subscription_id: str) -> bool:
        return self.subscription_id is not None and subscription_id == self.subscription_id

    def _event(self, event: st.EventNotification) -> list[FollowItem]:
        if not self._current(event.subscription_id):
            return []
        last = self.last_seq
        if last is not None and event.seq <= last:
            return []  # a duplicate (Rule 1)
        if last is not None and event.seq > last + 1:
            return self._abandon()  # a gap: read it from the journal
        self.last_seq = event.seq
        items: list[FollowItem] = [event.event]
        items.extend(self._caught_up())
        return items

    def _abandon(self) -> list[FollowItem]:
        if self.subscription_id is None:
            return []  # already resubscribing
        stale, self.subscription_id = self.subscription_id, None
        return [Resubscribe(stale=stale)]

    def _caught_up(self) -> list[CaughtUp]:
        last, target = self.last_seq, self._catch_up_to
        if target is None or last is None or last < target:
            return []
        self._catch_up_to = None
        return [CaughtUp(seq=last)]
