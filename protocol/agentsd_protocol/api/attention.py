"""Wire types for what needs the user: acknowledging what was seen, and the feed of
turn completions and approval requests across sessions (for notifiers)."""

from __future__ import annotations

from typing import Literal

from agentsd_protocol.api.base import Params, Result
from agentsd_protocol.api.events import TurnOutcome


class AcknowledgeParams(Params, frozen=True, kw_only=True):
    """The user has seen ``session_id`` up to ``seq`` (clamped to its head). It is
    idempotent by nature (the acknowledged seq only grows), so it takes no
    ``clientOperationId``."""

    session_id: str
    seq: int


class AcknowledgeResult(Result, frozen=True, kw_only=True):
    session_id: str
    acknowledged_seq: int
    unseen: bool


class CompletionsParams(Params, frozen=True, kw_only=True):
    pass


NoticeKind = Literal["turn", "approval"]


class Notice(Result, frozen=True, kw_only=True):
    """A turn completion (``outcome``) or an approval request (``approvalId``) at
    ``seq``; ``text`` is a short line to show (the start of the reply, why the turn
    failed, or the approval's title). ``cut_off``: a daemon restart or stop ended
    the turn, and ``agentSession.continue`` carries it on."""

    session_id: str
    seq: int
    kind: NoticeKind
    title: str | None
    text: str
    outcome: TurnOutcome | None = None
    approval_id: str | None = None
    ts: float = 0.0
    cut_off: bool = False


class CompletionsResult(Result, frozen=True, kw_only=True):
    """``unseen``: for each session with something unacknowledged, its latest notice
    (what was acknowledged is never replayed); live ones follow as
    ``agentSession.notice`` notifications."""

    feed_id: str
    unseen: list[Notice]


class NoticeNotification(Result, frozen=True, kw_only=True):
    """``agentSession.notice``: a turn completed or an approval was requested."""

    feed_id: str
    notice: Notice
