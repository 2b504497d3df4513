"""Wire types for following a session: subscribe, history, watch, and the
notifications they produce."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from agentsd_protocol.api.base import Empty, Params, Result
from agentsd_protocol.api.events import (
    Event,
    TurnOutcome,
    UnknownEvent,
    decode_event,
    encode_body,
    kind_of,
)
from agentsd_protocol.api.session import Phase, Resources, Status, TokenUsage


class JournalEvent(Result, frozen=True, kw_only=True):
    """One journal entry. ``seq`` is contiguous per session; order is by seq.

    ``kind`` names one Struct of ``agentsd_protocol.api.events`` and ``body`` holds
    its fields (without the ``kind`` tag); ``event()`` decodes them. The body stays
    raw JSON so the daemon forwards stored rows without re-encoding them.
    """

    seq: int
    ts: float
    fence: int
    kind: str
    body: Annotated[
        msgspec.Raw,
        msgspec.Meta(
            description="The fields of the event schema that `kind` names (see the"
            " Event schema), without the `kind` tag."
        ),
    ]

    def event(self) -> Event | UnknownEvent:
        """The typed event; raises ``msgspec.ValidationError`` for a body that does
        not match its kind."""
        return decode_event(self.kind, self.body)

    @classmethod
    def of(cls, event: Event, *, seq: int, ts: float, fence: int) -> JournalEvent:
        return cls(
            seq=seq, ts=ts, fence=fence, kind=kind_of(event), body=msgspec.Raw(encode_body(event))
        )


class SubscribeParams(Params, frozen=True, kw_only=True):
    session_id: str
    after_seq: int | None = None  # None: live only, from the current head


class SubscribeResult(Result, frozen=True, kw_only=True):
    subscription_id: str
    head_seq: int


class UnsubscribeParams(Params, frozen=True, kw_only=True):
    subscription_id: str


class UnsubscribeResult(Result, frozen=True, kw_only=True):
    subscription_id: str
    was_active: bool


class HistoryParams(Params, frozen=True, kw_only=True):
    session_id: str
    after_seq: int | None = None
    before_seq: int | None = None
    limit: int = 200


class HistoryResult(Result, frozen=True, kw_only=True):
    events: list[JournalEvent]
    has_more: bool
    head_seq: int


class WatchParams(Empty, frozen=True, kw_only=True):
    pass


SummaryState = Literal["idle", "working", "attention", "failed"]
"""``status``, except that an idle session whose last turn failed is ``failed``."""


class ApprovalNeed(Result, frozen=True, kw_only=True):
    approval_id: str
    approval_kind: str
    title: str
    seq: int


class SessionStatus(Result, frozen=True, kw_only=True):
    """A session's summary, for status bars. ``unseen``: a turn completion or an
    approval request came after what the user acknowledged (``acknowledgedSeq``);
    ``attentionSeq`` is the seq of the last of them. ``lastPrompt`` and ``lastReply``
    are heads of at most 200 characters."""

    session_id: str
    title: str | None
    provider: str
    phase: Phase
    status: Status
    head_seq: int
    state: SummaryState = "idle"
    approvals: list[ApprovalNeed] = []
    failure: str | None = None  # why the last turn failed
    outcome: TurnOutcome | None = None  # of the last turn
    last_prompt: str | None = None
    last_reply: str | None = None
    model: str | None = None
    usage: dict[str, Any] | None = None  # the agent's token counts, passed through
    tokens: TokenUsage | None = None  # the same, read: per turn, in all, context left
    updated_at: float = 0.0
    unseen: bool = False
    acknowledged_seq: int = 0
    attention_seq: int = 0
    # The running agent's figures, sampled every few seconds while anyone watches
    # (a new sample is sent like streaming text: at most once a second); None
    # while no agent runs and until the first sample.
    resources: Resources | None = None


class WatchResult(Result, frozen=True, kw_only=True):
    watch_id: str
    sessions: list[SessionStatus]


class EventNotification(Result, frozen=True, kw_only=True):
    """``agentSession.event``: one journaled event for a subscription."""

    subscription_id: str
    session_id: str
    seq: int
    event: JournalEvent


class DeltaNotification(Result, frozen=True, kw_only=True):
    """``agentSession.delta``: ephemeral streaming text. ``offset`` is where ``text``
    starts in the item's full text, so a client that caught up from an
    ``item.updated`` snapshot can drop what it already has. A subscription made
    while an item streams gets, right after its catch-up, one delta with the text
    streamed past that item's last snapshot, so the live deltas run on from what
    it has, with no gap."""

    subscription_id: str
    session_id: str
    item_id: str
    offset: int
    text: str
    after_seq: int


class LaggedNotification(Result, frozen=True, kw_only=True):
    """``agentSession.lagged``: the subscription ended; resubscribe with
    ``afterSeq = resumeAfterSeq``."""

    subscription_id: str
    session_id: str
    resume_after_seq: int


class EndedNotification(Result, frozen=True, kw_only=True):
    """``agentSession.ended``: the subscription ended because its session is gone
    (``reason``: ``deleted``); there is nothing to resubscribe to."""

    subscription_id: str
    session_id: str
    last_seq: int
    reason: str


class StatusNotification(Result, frozen=True, kw_only=True):
    """``agentSession.status``: a session's phase or status changed (or it was
    deleted: ``deleted`` true)."""

    watch_id: str
    session: SessionStatus
    deleted: bool = False
