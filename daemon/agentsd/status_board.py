"""The status board: who watches the sessions' summaries, what they were told, and
who follows the notice feed.

Rule 1: a watcher hears of a session only when its summary
(``agentsd.summary.session_status``) differs from what that watcher was last told of
it, or when it is deleted: never twice in a row the same. Both ways a summary changes
report here without anyone asking: a committed journal write (``SessionJournal``)
and a change of phase (``Session.transition``).

Rule 2 (coalescing): per watcher and session, a send spends a token from a bucket of
``BURST`` refilled at ``RATE_PER_S``; a change of what a status bar switches on (phase,
status, state, unseen, pending approvals, title) goes out at once while a token is
left, any other change (reply text, usage, head seq) only ``CONTENT_INTERVAL_S`` after
the last send. A change that must wait is held, latest wins, and sent by the
watcher's pump when its turn comes. So a watcher hears at most
``BURST + RATE_PER_S * t`` updates of a session in any ``t`` seconds, however fast it
streams, and the latest summary always arrives. A deletion is sent at once, unpaced.

Rule 3: a watcher or feed whose notification cannot be queued (its connection is
closing or hopelessly behind) is dropped; a slow watcher never holds up a session.

Rule 4: notices (turn completions, approval requests) go to every feed as they
commit, unpaced: there is one per turn or approval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import attrs
import trio

from agentsd.summary import notice_of, session_status
from agentsd_protocol.api.attention import NoticeNotification
from agentsd_protocol.api.events import Event, UnknownEvent
from agentsd_protocol.api.stream import SessionStatus, StatusNotification

if TYPE_CHECKING:
    from agentsd.session import Session


Notify = Callable[[StatusNotification], bool]
"""Queues one notification for a watcher; False when the watcher is gone."""
NotifyNotice = Callable[[NoticeNotification], bool]

BURST = 10  # a session's start and one turn with an approval fit, each step shown
RATE_PER_S = 4.0  # a steady flip-flopping session costs a status bar 4 redraws/s
CONTENT_INTERVAL_S = 1.0  # streaming text redraws a status line once a second


def _switch_key(s: SessionStatus) -> tuple[object, ...]:
    """What status bars switch on (Rule 2)."""
    return (
        s.phase,
        s.status,
        s.state,
        s.unseen,
        tuple(a.approval_id for a in s.approvals),
        s.title,
    )


@attrs.define
class _Pace:
    """One session's token bucket for one watcher (Rule 2)."""

    tokens: float
    stamp: float
    sent_at: float = -math.inf

    def ready_at(self, now: float, *, switch: bool) -> float:
        self.tokens = min(BURST, self.tokens + (now - self.stamp) * RATE_PER_S)
        self.stamp = now
        at = now if self.tokens >= 1 else now + (1 - self.tokens) / RATE_PER_S
        return at if switch else max(at, self.sent_at + CONTENT_INTERVAL_S)

    def spend(self, now: float) -> None:
        self.tokens -= 1
        self.sent_at = now


class Watcher:
    """One ``agentSession.watch``: what it was told, and the changes it waits to hear."""

    def __init__(self, watch_id: str, notify: Notify) -> None:
        self.watch_id = watch_id
        self._notify = notify
        self._told: dict[str, SessionStatus] = {}
        self._paces: dict[str, _Pace] = {}
        self._held: dict[str, Session] = {}  # by session id: at most one per session
        self._wake = trio.Event()
        self.gone = False

    def offer(self, session: Session, status: SessionStatus, now: float) -> bool:
        """Send ``status`` now if Rule 2 allows, else hold it; False when gone."""
        told = self._told.get(session.id)
        if told == status:
            self._held.pop(session.id, None)
            return True
        switch = told is None or _switch_key(told) != _switch_key(status)
        pace = self._paces.get(session.id)
        if pace is None:
            pace = self._paces[session.id] = _Pace(tokens=BURST, stamp=now)
        if pace.ready_at(now, switch=switch) <= now:
            self._held.pop(session.id, None)
            return self._send(status, pace, now)
        self._held[session.id] = session
        self._wake.set()
        return True

    def deleted(self, status: SessionStatus) -> bool:
        self._held.pop(status.session_id, None)
        self._paces.pop(status.session_id, None)
        self._told.pop(status.session_id, None)
        note = StatusNotification(watch_id=self.watch_id, session=status, deleted=True)
        return self._notify(note)

    def told(self, statuses: Iterable[SessionStatus]) -> None:
        for status in statuses:
            self._told[status.session_id] = status

    def _send(self, status: SessionStatus, pace: _Pace, now: float) -> bool:
        pace.spend(now)
        self._told[status.session_id] = status
        if not self._notify(StatusNotification(watch_id=self.watch_id, session=status)):
            self.gone = True
        return not self.gone

    async def run_pump(self) -> None:
        """Send held changes when their turn comes (Rule 2); returns once the watcher
        is gone. Runs on the watcher's connection, which cancels it on close."""
        while not self.gone:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._held and not self.gone:
                now = trio.current_time()
                due = {
                    sid: self._paces[sid].ready_at(now, switch=self._switches(session))
                    for sid, session in self._held.items()
                }
                await trio.sleep_until(min(due.values()))
                now = trio.current_time()
                for sid, session in tuple(self._held.items()):
                    if sid in self._held and due.get(sid, math.inf) <= now:
                        del self._held[sid]
                        status = session_status(session)
                        if self._told.get(sid) != status and not self._send(
                            status, self._paces[sid], now
                        ):
                            return

    def _switches(self, session: Session) -> bool:
        told = self._told.get(session.id)
        return told is None or _switch_key(told) != _switch_key(session_status(session))

    def drop(self) -> None:
        self.gone = True
        self._wake.set()


class StatusBoard:
    """Shared by every session of a daemon; owned by the supervisor."""

    def __init__(self) -> None:
        self._watchers: dict[str, Watcher] = {}  # by watch id
        self._feeds: dict[str, NotifyNotice] = {}  # by feed id

    def watch(
        self, watch_id: str, notify: Notify, sessions: Iterable[Session]
    ) -> tuple[Watcher, list[SessionStatus]]:
        """Add a watcher; returns it (its caller runs ``Watcher.run_pump``) and the
        summaries of ``sessions`` as of now, from which its notifications follow on."""
        watcher = Watcher(watch_id, notify)
        self._watchers[watch_id] = watcher
        snapshot = [session_status(s) for s in sessions]
        watcher.told(snapshot)
        return watcher, snapshot

    def unwatch(self, watch_id: str) -> None:
        watcher = self._watchers.pop(watch_id, None)
        if watcher is not None:
            watcher.drop()

    def follow(self, feed_id: str, notify: NotifyNotice) -> bool:
        """Whether the feed is new (False: it replaced the one of that id)."""
        new = feed_id not in self._feeds
        self._feeds[feed_id] = notify
        return new

    def unfollow(self, feed_id: str) -> None:
        self._feeds.pop(feed_id, None)

    @property
    def watched(self) -> bool:
        """Whether anyone watches the sessions' summaries now."""
        return bool(self._watchers)

    def changed(self, session: Session) -> None:
        """The session's summary may have changed: tell the watchers if it did."""
        if not self._watchers:
            return
        status = session_status(session)
        now = trio.current_time()
        for watch_id, watcher in tuple(self._watchers.items()):
            if not watcher.offer(session, status, now):
                self.unwatch(watch_id)

    def deleted(self, session: Session) -> None:
        if not self._watchers:
            return
        status = session_status(session)
        for watch_id, watcher in tuple(self._watchers.items()):
            if not watcher.deleted(status):
                self.unwatch(watch_id)

    def announce(self, session: Session, seq: int, ts: float, event: Event | UnknownEvent) -> None:
        """Rule 4: tell every feed of a notable event."""
        if not self._feeds:
            return
        notice = notice_of(session, seq, ts, event)
        if notice is None:
            return
        for feed_id, notify in tuple(self._feeds.items()):
            if not notify(NoticeNotification(feed_id=feed_id, notice=notice)):
                self._feeds.pop(feed_id, None)
