"""Wire types for talking to the agent: send, interrupt, respond, setOptions."""

from __future__ import annotations

from typing import Any, Literal

from agentsd_protocol.api.base import MutationParams, Result
from agentsd_protocol.api.session import SessionInfo

DispatchOutcome = Literal["accepted", "rejected", "unknown"]
Delivery = Literal["steer", "queue", "interrupt"]
QueueAction = Literal["list", "withdraw", "edit", "sendNow", "resume"]


class SendParams(MutationParams, frozen=True, kw_only=True):
    """``delivery`` says what a prompt sent while a turn runs does (when none runs,
    each starts a turn at once, except behind a non-empty queue):

    - ``steer`` (the default, as the Codex and Claude Code terminal UIs do when you
      type during a turn): into the running turn (Codex ``turn/steer``; Claude Code
      takes it up at the turn's next model call).
    - ``queue``: held durably (``prompt.queued``) until the running turn and every
      prompt queued before it ended, then sent as a turn of its own.
    - ``interrupt``: interrupt the running turn, wait for its end, then send this
      prompt as the next turn; the queue is paused, never sent on its own.
    """

    session_id: str
    text: str
    retry_unknown: bool = False  # with clientOperationId: re-deliver a durably unknown submission
    delivery: Delivery = "steer"


class SendResult(Result, frozen=True, kw_only=True):
    """``queued``: the prompt waits in the queue (``client_message_id`` is its
    prompt id, ``seq`` that of its ``prompt.queued``; ``dispatch`` is ``unknown``
    until it is sent)."""

    client_message_id: str
    seq: int
    dispatch: DispatchOutcome
    reason: str | None = None
    turn_id: str | None = None
    queued: bool = False


class QueueParams(MutationParams, frozen=True, kw_only=True):
    """``list`` (the default) changes nothing. ``withdraw``, ``edit`` (with
    ``text``) and ``sendNow`` (as a ``steer``) act on ``prompt_id``; ``resume``
    unpauses the queue and sends its head if no turn runs."""

    session_id: str
    action: QueueAction = "list"
    prompt_id: str | None = None
    text: str | None = None


class QueuedPromptInfo(Result, frozen=True, kw_only=True):
    prompt_id: str
    text: str
    seq: int  # of its ``prompt.queued``


class QueueResult(Result, frozen=True, kw_only=True):
    """The queue after the action, in the order it is sent. ``withdrawn`` is the
    withdrawn prompt (its text is the client's again); ``sent`` the dispatch of a
    prompt sent now or of the head a resume sent."""

    prompts: list[QueuedPromptInfo]
    paused: str | None = None  # why it waits for a resume
    withdrawn: QueuedPromptInfo | None = None
    sent: SendResult | None = None


class InterruptParams(MutationParams, frozen=True, kw_only=True):
    session_id: str
    turn_id: str | None = None


class InterruptResult(Result, frozen=True, kw_only=True):
    """``seq`` is that of the ``interrupt.requested`` this call journaled (none when
    nothing was running to interrupt)."""

    interrupted: bool
    reason: str | None = None  # why nothing was interrupted
    seq: int | None = None


class RespondParams(MutationParams, frozen=True, kw_only=True):
    session_id: str
    approval_id: str
    decision: str


class RespondResult(Result, frozen=True, kw_only=True):
    approval_id: str
    decision: str
    seq: int


class SetOptionsParams(MutationParams, frozen=True, kw_only=True):
    session_id: str
    title: str | None = None
    options: dict[str, Any] | None = None  # replaces the options; used at the next start


class SetTitleParams(MutationParams, frozen=True, kw_only=True):
    session_id: str
    title: str


class SetOptionsResult(Result, frozen=True, kw_only=True):
    session: SessionInfo
