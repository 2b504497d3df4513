"""Wire types for talking to the agent: send, interrupt, respond, setOptions."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from agentsd_protocol.api.base import MutationParams, Params, Result
from agentsd_protocol.api.controls import AppliesAt
from agentsd_protocol.api.session import SessionInfo

DispatchOutcome = Literal["accepted", "rejected", "unknown"]
Delivery = Literal["steer", "queue", "interrupt"]
QueueAction = Literal["list", "withdraw", "edit", "sendNow", "resume"]


class Attachment(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """An image or file reference of a prompt, as the journal keeps it: never the
    bytes. ``type`` is ``image`` or ``file``. An image's bytes are kept by the
    daemon under its ``sha256`` (hex) for the session's life; ``path`` is where it
    was read from (absent for inline data). A file reference is its absolute
    ``path`` and the file's length when it was sent (never read: no digest)."""

    type: str
    sha256: str | None = None
    byte_length: int | None = None
    media_type: str | None = None
    path: str | None = None


class ContentBlock(Params, frozen=True, kw_only=True, tag_field="type"):
    """One part of a prompt (``SendParams.content``)."""


class TextBlock(ContentBlock, frozen=True, kw_only=True, tag="text"):
    text: str


class ImageBlock(ContentBlock, frozen=True, kw_only=True, tag="image"):
    """An image: ``path`` (absolute, or relative to the session's cwd), which the
    daemon reads, or ``data`` (base64) with its ``media_type``. PNG, JPEG, GIF and
    WebP, at most 5 MiB decoded; the type is read from the bytes, and a
    ``media_type`` that disagrees is refused. The daemon keeps a copy for the
    session (the agent gets the bytes as they were when sent, also after a queue or
    a restart) and journals only its digest."""

    path: str | None = None
    data: str | None = None
    media_type: str | None = None


class FileBlock(ContentBlock, frozen=True, kw_only=True, tag="file"):
    """A reference to a file the agent reads with its own tools: the daemon checks
    that ``path`` (absolute, or relative to the session's cwd) is a regular file and
    hands the agent its absolute path, never its content."""

    path: str


Content = TextBlock | ImageBlock | FileBlock


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

    ``content`` adds blocks after ``text`` (``TextBlock``, ``ImageBlock``,
    ``FileBlock``). What cannot be used is refused before anything is journaled:
    ``content_unsupported`` (the agent takes no such block), ``attachment_refused``
    (with ``data.reason``), ``invalid_params`` (no text and no content).
    """

    session_id: str
    text: str = ""
    retry_unknown: bool = False  # with clientOperationId: re-deliver a durably unknown submission
    delivery: Delivery = "steer"
    # Blocks after ``text``: the prompt's text is ``text`` and every text block, in
    # order (joined by blank lines); its images and file references, in order, go
    # with it as the agent's own input takes them (Codex: text then images; Claude:
    # images then text; file references as ``@path`` lines of the text).
    # A provider that cannot take a block refuses the send (``content_unsupported``)
    # before anything is journaled.
    content: list[Content] = []


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


class ContinueParams(MutationParams, frozen=True, kw_only=True):
    """Carry on the session's last turn, cut off by a daemon restart."""

    session_id: str


class ContinueResult(Result, frozen=True, kw_only=True):
    """The continuation was journaled at ``seq`` (a ``submission`` whose
    ``continuesSeq`` is ``continued_seq``, the cut-off turn's ``turn.completed``);
    ``dispatch`` says whether the agent took it, as for a send."""

    session_id: str
    client_message_id: str
    seq: int
    continued_seq: int
    dispatch: DispatchOutcome
    reason: str | None = None
    turn_id: str | None = None


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
    attachments: list[Attachment] = []  # its images and file references, as journaled


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
    """``options`` replaces the session's options; ``changes`` sets the keys it
    names over them (a null value unsets one). Each changed option applies as live
    as the provider allows (``agentSession.options``); an unknown key or a value
    outside an option's closed choices is refused (``unknown_option``) and then
    nothing changed."""

    session_id: str
    title: str | None = None
    options: dict[str, Any] | None = None
    changes: dict[str, Any] | None = None


class SetTitleParams(MutationParams, frozen=True, kw_only=True):
    session_id: str
    title: str


class SetOptionsResult(Result, frozen=True, kw_only=True):
    """``applies_at``: where each changed option applies (``now``, ``nextTurn``,
    ``nextStart``: ``agentsd_protocol.api.controls``)."""

    session: SessionInfo
    applies_at: dict[str, AppliesAt] = {}
