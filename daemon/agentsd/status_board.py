"""The status board: who watches the sessions' status bars, and what they were told.

Rule 1: a watcher hears of a session only when its (phase, status) pair differs
from what watchers were last told of it, or when it is deleted: never twice in a row
the same. Both ways a pair changes report here without anyone asking: a committed
journal write (``SessionJournal``, status derives from the journal) and a change of
phase (``Session.transition``).

Rule 2: a watcher whose notification cannot be queued (its connection is closing or
hopelessly behind) is dropped; a slow watcher never holds up a session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from agentsd_protocol.api.stream import SessionStatus, StatusNotification

if TYPE_CHECKING:
    from agentsd.session import Session


Notify = Callable[[StatusNotification], bool]
"""Queues one notification for a watcher; False when the watcher is gone."""


def session_status(session: Session) -> SessionStatus:
    return SessionStatus(
        session_id=session.id,
        title=session.row.title,
        provider=session.row.provider,
        phase=session.phase,
        status=session.status,
        head_seq=session.head_seq,
    )


class StatusBoard:
    """Shared by every session of a daemon; owned by the supervisor."""

    def __init__(self) -> None:
        self._watches: dict[str, Notify] = {}  # by watch id
        self._told: dict[str, tuple[str, str]] = {}  # session id -> (phase, status)

    def watch(
        self, watch_id: str, notify: Notify, sessions: Iterable[Session]
    ) -> list[SessionStatus]:
        """Add a watcher; returns the status of ``sessions`` as of now, from which its
        notifications follow on."""
        self._watches[watch_id] = notify
        return [session_status(s) for s in sessions]

    def unwatch(self, watch_id: str) -> None:
        self._watches.pop(watch_id, None)

    def changed(self, session: Session) -> None:
        """The session's phase or status may have changed: tell the watchers if it did."""
        key = (session.phase, session.status)
        if self._told.get(session.id) == key:
            return
        self._told[session.id] = key
        self._tell(session, deleted=False)

    def deleted(self, session: Session) -> None:
        self._told.pop(session.id, None)
        self._tell(session, deleted=True)

    def _tell(self, session: Session, *, deleted: bool) -> None:
        if not self._watches:
            return
        status = session_status(session)
        for watch_id, notify in tuple(self._watches.items()):
            note = StatusNotification(watch_id=watch_id, session=status, deleted=deleted)
            if not notify(note):
                self._watches.pop(watch_id, None)
