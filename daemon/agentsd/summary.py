"""A session's summary for status bars and notifiers, derived from its journal.

Rule 1: ``Summary`` is a reducer over journal events in seq order, kept beside the
status reducer (``agentsd.session.Conversation``) and fed by the same journal port
after each commit. It never reads the clock or the store.

Rule 2 (seen and unseen): a turn completion or an approval request is notable; the
session is unseen while its last notable seq is above the seq the user acknowledged
(``session.acknowledged``). Both are journal seqs, so "a completion after that point
makes it unseen again" is a comparison of seqs, and a restart replays it.

Rule 3: ``derive_summary`` rebuilds the summary at load from the journal: the notable
and acknowledged seqs from the whole journal, the rest from the tail since the last
prompt; so it survives restarts (whose settled ``child.exited`` ends the status
reducer's replay, not this one's).
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import attrs

from agentsd.store.journal import bodies_of_kind, last_seq_of_kind, read_events
from agentsd_protocol.api.attention import Notice
from agentsd_protocol.api.events import (
    ApprovalRequested,
    ConversationCleared,
    Event,
    ItemCompleted,
    ItemStarted,
    ItemUpdated,
    SessionAcknowledged,
    Submission,
    TurnCompleted,
    TurnOutcome,
    UnknownEvent,
    UsageUpdated,
    decode_event,
    kind_of,
)
from agentsd_protocol.api.session import TokenUsage
from agentsd_protocol.api.stream import ApprovalNeed, SessionStatus, SummaryState
from agentsd_protocol.usage import token_usage

if TYPE_CHECKING:
    from agentsd.session import Session

# A turn settled ``interrupted`` for one of these causes was cut off by the daemon
# (a crash, then recovery; or a stop), not ended by the user or the agent.
CUT_OFF_REASONS = frozenset({"daemon-restart", "shutdown"})
MAX_TEXT_CHARS = 200  # a status line or a notification body shows no more
_REPLY_TYPE = "agentMessage"  # the item type of the agent's reply, in every provider


def head(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[: MAX_TEXT_CHARS - 1] + "…"


@attrs.define
class Summary:
    last_prompt: str | None = None
    last_reply: str | None = None
    reply_item: str | None = None  # the agent message the reply is taken from
    outcome: TurnOutcome | None = None
    failure: str | None = None
    usage: dict[str, Any] | None = None
    tokens: TokenUsage | None = None
    notable_seq: int = 0
    acknowledged_seq: int = 0
    # The seq of the ``turn.completed`` that cut the last turn off, until a prompt
    # or a continuation follows it (``agentSession.continue``).
    cut_off_seq: int | None = None
    cut_off_reason: str | None = None

    @property
    def unseen(self) -> bool:
        return self.notable_seq > self.acknowledged_seq

    def apply(self, seq: int, event: Event | UnknownEvent) -> bool:
        """Apply one event; returns whether it is notable (Rule 2)."""
        match event:
            case Submission(text=text, continues_seq=continues):
                if continues is None:  # a continuation is not what the user asked
                    self.last_prompt = head(text)
                self.last_reply = None
                self.reply_item = None
                self.cut_off_seq = self.cut_off_reason = None
            case (
                ItemStarted(type=item_type, item_id=item_id, text=text)
                | ItemCompleted(type=item_type, item_id=item_id, text=text)
            ) if item_type == _REPLY_TYPE:
                self.reply_item = item_id
                if text:
                    self.last_reply = head(text)
            case ItemUpdated(item_id=item_id, text=text) if item_id == self.reply_item:
                self.last_reply = head(text)
            case TurnCompleted(outcome=outcome, error=error, reason=reason):
                self.outcome = outcome
                self.failure = None
                cut = outcome == "interrupted" and reason in CUT_OFF_REASONS
                self.cut_off_seq = seq if cut else None
                self.cut_off_reason = reason if cut else None
                if outcome == "failed":
                    self.failure = error.message if error is not None else reason or "failed"
                self.notable_seq = max(self.notable_seq, seq)
                return True
            case ApprovalRequested():
                self.notable_seq = max(self.notable_seq, seq)
                return True
            case UsageUpdated(total=total):
                self.usage = total
                self.tokens = token_usage(event)
            case ConversationCleared():
                self.usage = None
                self.tokens = None
            case SessionAcknowledged(seq=acked):
                self.acknowledged_seq = max(self.acknowledged_seq, acked)
            case _:
                pass
        return False


def derive_summary(conn: sqlite3.Connection, session_id: str) -> Summary:
    """The session's summary replayed from its journal (Rule 3)."""
    summary = Summary()
    after = max(last_seq_of_kind(conn, session_id, kind_of(Submission)) - 1, 0)
    cleared = last_seq_of_kind(conn, session_id, kind_of(ConversationCleared))
    if last_seq_of_kind(conn, session_id, kind_of(UsageUpdated)) > cleared:
        for body in bodies_of_kind(conn, session_id, kind_of(UsageUpdated)):
            usage = decode_event(kind_of(UsageUpdated), body)
            if isinstance(usage, UsageUpdated):
                summary.usage = usage.total
                summary.tokens = token_usage(usage)
            break
    while True:
        page, more = read_events(conn, session_id, after_seq=after, limit=1000, max_bytes=4 << 20)
        for stored in page:
            summary.apply(stored.seq, decode_event(stored.kind, stored.body))
            after = stored.seq
        if not more or not page:
            break
    summary.notable_seq = max(
        summary.notable_seq,
        last_seq_of_kind(conn, session_id, kind_of(TurnCompleted)),
        last_seq_of_kind(conn, session_id, kind_of(ApprovalRequested)),
    )
    if summary.last_prompt is None:
        # The last submission was a continuation: the user's prompt is further back.
        for body in bodies_of_kind(conn, session_id, kind_of(Submission)):
            prompt = decode_event(kind_of(Submission), body)
            if isinstance(prompt, Submission) and prompt.continues_seq is None:
                summary.last_prompt = head(prompt.text)
                break
    for body in bodies_of_kind(conn, session_id, kind_of(SessionAcknowledged)):
        acked = decode_event(kind_of(SessionAcknowledged), body)
        if isinstance(acked, SessionAcknowledged):
            summary.acknowledged_seq = max(summary.acknowledged_seq, acked.seq)
        break
    return summary


def session_status(session: Session) -> SessionStatus:
    """The session's summary on the wire."""
    summary = session.summary
    status = session.status
    state: SummaryState = status
    if status == "idle" and summary.outcome == "failed":
        state = "failed"
    model = session.row.options.get("model")
    return SessionStatus(
        session_id=session.id,
        title=session.row.title,
        provider=session.row.provider,
        phase=session.phase,
        status=status,
        head_seq=session.head_seq,
        state=state,
        approvals=[
            ApprovalNeed(approval_id=a.approval_id, approval_kind=a.kind, title=a.title, seq=a.seq)
            for a in session.conversation.approvals.values()
        ],
        failure=summary.failure,
        outcome=summary.outcome,
        last_prompt=summary.last_prompt,
        last_reply=summary.last_reply,
        model=model if isinstance(model, str) else None,
        usage=summary.usage,
        tokens=summary.tokens,
        updated_at=session.row.updated_at,
        unseen=summary.unseen,
        acknowledged_seq=summary.acknowledged_seq,
        attention_seq=summary.notable_seq,
        resources=session.resources if session.child is not None else None,
    )


def notice_of(session: Session, seq: int, ts: float, event: Event | UnknownEvent) -> Notice | None:
    """The notice a notable event makes, or None for any other event."""
    summary = session.summary
    match event:
        case TurnCompleted(outcome=outcome):
            text = summary.failure or summary.last_reply or outcome
            return Notice(
                session_id=session.id,
                seq=seq,
                kind="turn",
                title=session.row.title,
                text=text,
                outcome=outcome,
                ts=ts,
                cut_off=summary.cut_off_seq == seq,
            )
        case ApprovalRequested(approval_id=approval_id, title=title):
            return Notice(
                session_id=session.id,
                seq=seq,
                kind="approval",
                title=session.row.title,
                text=head(title),
                approval_id=approval_id,
                ts=ts,
            )
        case _:
            return None


def unseen_notice(session: Session) -> Notice | None:
    """The session's latest notice if the user has not seen it, else None."""
    summary = session.summary
    if not summary.unseen:
        return None
    approvals = session.conversation.approvals
    if approvals:
        pending = max(approvals.values(), key=lambda a: a.seq)
        return Notice(
            session_id=session.id,
            seq=pending.seq,
            kind="approval",
            title=session.row.title,
            text=head(pending.title),
            approval_id=pending.approval_id,
            ts=session.row.updated_at,
        )
    return Notice(
        session_id=session.id,
        seq=summary.notable_seq,
        kind="turn",
        title=session.row.title,
        text=summary.failure or summary.last_reply or summary.outcome or "",
        outcome=summary.outcome,
        ts=session.row.updated_at,
        cut_off=summary.cut_off_seq is not None and summary.cut_off_seq == summary.notable_seq,
    )
