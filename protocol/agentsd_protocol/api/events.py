"""The journal's language: every event the daemon writes, one Struct per kind.

A journal row is ``(seq, ts, fence, kind, body)``. ``kind`` is the tag of one Struct
below and ``body`` is that Struct encoded without its tag: its fields, camelCase,
those at their default left out. So ``{"kind": kind, **body}`` is the tagged document
msgspec decodes as ``Event``; ``JournalEvent`` (``agentSession.history`` and
``agentSession.event``) carries the same pair on the wire, and ``rpc.discover``
publishes every Struct here.

Evolution rules (a journal is kept forever; clients and daemons of different ages
read each other's rows):

1. A new field always gets a default, so older rows (without it) decode; readers
   ignore fields they do not know, so newer rows decode in older clients.
2. A field's type never changes, and a removed field's name is never reused.
3. A kind is never removed and never reused for another meaning. A client meets
   kinds newer than itself as ``UnknownEvent`` and skips them.
4. A renamed kind keeps decoding its old rows: the old name goes into
   ``RENAMED_KINDS`` and decodes as the new Struct. The daemon serves old rows under
   their current name (``upgrade_row``), so clients see only the kinds below.
5. No event has a field named ``kind``: that name is the tag. Two did before this
   union (``approval.requested`` and ``agent.error``); their old rows are read with it
   renamed (``_RENAMED_KIND_FIELD``).
6. A kind is ``subject.event``: one lowercase word each side of the dot, the subject
   a noun, the event a past participle for a change (``turn.completed``) or a noun for
   a report (``agent.error``); ``submission`` alone is the prompt itself.

Fields that pass an agent's own payload through (tool input, token counts, provider
options) are typed ``Any`` / ``dict[str, Any]`` on purpose: their shape is the agent's,
not ours, and differs between agents and their versions.
"""

from __future__ import annotations

import typing
from typing import Any, Final, Literal

import msgspec

from agentsd_protocol.api.conversation import Attachment, DispatchOutcome
from agentsd_protocol.api.session import ExitCause

TurnOutcome = Literal["completed", "interrupted", "failed", "unknown"]
ResolvedBy = Literal["client", "agent", "daemon"]


# -- values inside events -----------------------------------------------------------


class Value(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """Base of the Structs nested in events."""


class BoundedPayload(Value, frozen=True, kw_only=True):
    """A payload that can grow without bound (tool output, a diff), journaled as its
    head: ``text`` is at most the provider's bound in UTF-8 bytes, ``byte_length`` is
    the whole payload's, and a cut one records the whole one's ``sha256`` (hex)."""

    text: str
    byte_length: int
    truncated: bool
    sha256: str | None = None


class ErrorInfo(Value, frozen=True, kw_only=True):
    """A failure: ``kind`` is a stable string clients switch on (``auth_refused``,
    ``model_unreachable``, ``agent_not_found``, ...)."""

    kind: str
    message: str


class FileChange(Value, frozen=True, kw_only=True):
    """One file of a Codex ``fileChange`` item; ``kind`` is ``add``, ``delete`` or
    ``update``. ``diff`` is Codex's for this file: a unified diff of an update, the
    whole content of an added or deleted file (absent in rows older than it);
    ``move_path`` where an update renames the file."""

    path: str | None = None
    kind: str | None = None
    diff: BoundedPayload | None = None
    move_path: str | None = None


class ApprovalOption(Value, frozen=True, kw_only=True):
    """One option of an approval as the agent described it. ``kind`` is ACP's
    ``allow_once``, ``allow_always``, ``reject_once`` or ``reject_always``."""

    option_id: str
    name: str | None = None
    kind: str | None = None


class AgentCommand(Value, frozen=True, kw_only=True):
    """A command the agent offers: ``name`` without its slash, and what to type after
    it (``hint``) when it takes input."""

    name: str
    description: str | None = None
    hint: str | None = None


class PlanStep(Value, frozen=True, kw_only=True):
    """One step of an agent's plan; ``status`` is the agent's (Codex: ``pending``,
    ``inProgress``, ``completed``)."""

    step: str | None = None
    status: str | None = None


# -- the events -----------------------------------------------------------------------


class EventStruct(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    tag_field="kind",
    rename="camel",
    omit_defaults=True,
):
    """Base of every event; a subclass's ``tag`` is its journal kind."""


class SessionCreated(EventStruct, tag="session.created", frozen=True, kw_only=True):
    """``by``: the session whose agent created it (allowed by the config's
    ``agent_allowance``); None: the user did."""

    provider: str
    cwd: str
    title: str | None = None
    by: str | None = None
    # The provider conversation (Codex thread, Claude session) the session adopts
    # (``create {resumeFrom}``): its first start resumes it and imports its history.
    resume_from: str | None = None


class SessionUpdated(EventStruct, tag="session.updated", frozen=True, kw_only=True):
    """A client (``by`` absent), the agent itself (``by: agent``) or the daemon
    (``by: daemon``: the title taken from the first prompt) changed the session; only
    what changed is set. ``options`` replace the old ones whole."""

    title: str | None = None
    options: dict[str, Any] | None = None  # the provider's options, as given: opaque here
    by: str | None = None


class Submission(EventStruct, tag="submission", frozen=True, kw_only=True):
    """A prompt, journaled before the agent sees it (write-ahead)."""

    client_message_id: str
    text: str
    operation_id: str | None = None  # the send's clientOperationId
    # Set on a continuation (``agentSession.continue``): the seq of the
    # ``turn.completed`` that cut the turn off. ``text`` is then the daemon's
    # request to carry on, not a prompt the user wrote.
    continues_seq: int | None = None
    attachments: list[Attachment] = []  # images and file references, after the text


class SubmissionDispatched(EventStruct, tag="submission.dispatched", frozen=True, kw_only=True):
    """What became of a submission; ``unknown`` is never re-sent on its own."""

    client_message_id: str
    outcome: DispatchOutcome
    reason: str | None = None
    turn_id: str | None = None


class TurnStarted(EventStruct, tag="turn.started", frozen=True, kw_only=True):
    turn_id: str | None = None


class TurnCompleted(EventStruct, tag="turn.completed", frozen=True, kw_only=True):
    """A turn ended. ``reason`` says why the daemon settled it (the child's exit
    cause); ``error`` why it failed; the rest is what the agent reported."""

    turn_id: str | None = None
    outcome: TurnOutcome
    reason: str | None = None
    error: ErrorInfo | None = None
    duration_ms: int | None = None
    num_turns: int | None = None
    cost_usd: float | None = None


class TurnPlan(EventStruct, tag="turn.plan", frozen=True, kw_only=True):
    turn_id: str | None = None
    explanation: str | None = None
    plan: list[PlanStep] = []


class TurnDiff(EventStruct, tag="turn.diff", frozen=True, kw_only=True):
    """The turn's aggregated diff so far."""

    turn_id: str | None = None
    diff: BoundedPayload | None = None


class InterruptRequested(EventStruct, tag="interrupt.requested", frozen=True, kw_only=True):
    """A client asked to interrupt the running turn (its end comes as
    ``turn.completed``). Before this union: ``turn.interruptRequested``."""

    turn_id: str | None = None


class ItemFields(EventStruct, frozen=True, kw_only=True):
    """What ``item.started`` and ``item.completed`` say about an item. ``type`` is
    the agent's (``agentMessage``, ``reasoning``, ``toolCall``, ``commandExecution``,
    ``fileChange``, ``mcpToolCall``, ...); which other fields are set depends on it."""

    item_id: str
    turn_id: str | None = None
    type: str
    text: str | None = None  # a message, reasoning or plan
    incomplete: bool = False  # its turn ended before the agent finished it
    name: str | None = None  # of a tool call
    # The tool input as the model wrote it (the agent's shape); when it was over the
    # bound, a ``BoundedPayload`` of its JSON and ``input_truncated``.
    input: Any = None
    input_truncated: bool = False
    output: BoundedPayload | None = None
    status: str | None = None  # the agent's: completed, failed, declined, interrupted...
    parent_tool_use_id: str | None = None  # the sub-agent's tool call that ran it
    command: str | None = None
    cwd: str | None = None
    exit_code: int | None = None
    duration_ms: int | None = None
    changes: list[FileChange] = []
    diff: BoundedPayload | None = None
    server: str | None = None  # of an MCP tool
    tool: str | None = None
    arguments: BoundedPayload | None = None
    result: BoundedPayload | None = None
    error: BoundedPayload | None = None
    detail: BoundedPayload | None = None  # an item type the provider does not know, as JSON


class ItemStarted(ItemFields, tag="item.started", frozen=True, kw_only=True):
    pass


class ItemUpdated(EventStruct, tag="item.updated", frozen=True, kw_only=True):
    """A snapshot of an item's streamed text so far; past the daemon's bound it is
    kept ``truncated`` at its head, ``length`` counting every character."""

    item_id: str
    text: str
    truncated: bool = False
    length: int | None = None


class ItemCompleted(ItemFields, tag="item.completed", frozen=True, kw_only=True):
    pass


class ApprovalRequested(EventStruct, tag="approval.requested", frozen=True, kw_only=True):
    """The agent asks; ``approval_id`` is stable, ``item_id`` the tool call it is
    about. ``approval_kind`` (``command``, ``fileChange``, ``tool``, ``question``,
    ``plan``, ...) was ``kind`` before this union (rule 5)."""

    approval_id: str
    native_id: str
    approval_kind: str
    title: str
    detail: str
    options: list[str]
    item_id: str | None = None
    # Each option as the agent described it, when it does (ACP agents: their option
    # ids are ``options``, with a name and ACP's kind).
    option_details: list[ApprovalOption] = []
    # The agent's request as its adapter needs it to answer (opaque, per provider):
    # a daemon that takes the agent over after a restart answers with it. None when
    # not kept (past the journal's bound).
    request: dict[str, Any] | None = None


class ApprovalResolved(EventStruct, tag="approval.resolved", frozen=True, kw_only=True):
    """The first answer, or ``cancelled`` by the agent (it withdrew the question) or
    the daemon (its turn or its child ended)."""

    approval_id: str
    decision: str
    by: ResolvedBy
    reason: str | None = None


class AgentRequest(EventStruct, tag="agent.request", frozen=True, kw_only=True):
    """A mutation requested through the daemon's socket from inside this session (by
    its agent or a tool it ran), allowed or refused (``reason`` says what was)."""

    method: str
    target_session_id: str | None = None
    allowed: bool
    reason: str | None = None


class ChildSpawned(EventStruct, tag="child.spawned", frozen=True, kw_only=True):
    pid: int
    pgid: int
    generation: str
    fence: int


class ChildReady(EventStruct, tag="child.ready", frozen=True, kw_only=True):
    """The handshake completed; ``provider_handle`` resumes the conversation.
    ``agent_version`` is the agent's version (from its handshake, else its
    ``--version``); None when it could not be read, or before agentsd recorded it.
    ``agent_name`` is the agent's own name where its handshake gives one (an ACP
    agent's ``agentInfo.name``): what runs behind a provider name from the config."""

    provider_handle: str
    generation: str
    agent_version: str | None = None
    agent_name: str | None = None


class ChildReattached(EventStruct, tag="child.reattached", frozen=True, kw_only=True):
    """A daemon took over a running agent the holder kept through the previous
    daemon's death (config ``crash_policy = "reattach"``): the same process (``pid``),
    now under the lease ``fence`` (the previous one's fence + 1, ``previous_fence``)
    and ``generation``. What the agent wrote meanwhile follows in order; every event
    up to ``from_seq`` was journaled before the takeover. Its open turn and pending
    approvals go on; a submission whose delivery was not recorded is ``unknown``."""

    pid: int
    fence: int
    generation: str
    previous_fence: int
    from_seq: int


class ChildExited(EventStruct, tag="child.exited", frozen=True, kw_only=True):
    """The child is proven gone and its lease released. ``detail`` says how the
    proof was had (recovery); ``error`` is the failure that ended it;
    ``stderr_tail`` is the end of what the agent wrote to stderr (at most 4 KiB), kept
    when it exited unexpectedly or failed, the words that say why. ``oom_kills`` is
    its cgroup's ``memory.events`` ``oom_kill`` count when the memory controller was
    on for it (None otherwise); cause ``oom`` when it ended by itself after one."""

    cause: ExitCause
    returncode: int | None = None
    signal: int | None = None
    detail: str | None = None
    error: ErrorInfo | None = None
    stderr_tail: str | None = None
    oom_kills: int | None = None


class ExitUnproven(EventStruct, tag="exit.unproven", frozen=True, kw_only=True):
    """The child's exit could not be proven: its lease stays held and a later close
    retries. Before this union: ``child.exit-unproven``."""

    cause: ExitCause
    detail: str = ""


class LeaseAcquired(EventStruct, tag="lease.acquired", frozen=True, kw_only=True):
    fence: int
    generation: str


class LeaseReleased(EventStruct, tag="lease.released", frozen=True, kw_only=True):
    fence: int


class AgentError(EventStruct, tag="agent.error", frozen=True, kw_only=True):
    """A failure the agent reported or the adapter diagnosed. ``error_kind`` (was
    ``kind``, rule 5) is stable; ``will_retry`` with ``attempt``/``max_retries`` and
    the HTTP ``status`` for a model call the agent retries."""

    message: str
    error_kind: str | None = None
    turn_id: str | None = None
    will_retry: bool | None = None  # None: the agent did not say
    details: str | None = None
    attempt: int | None = None
    max_retries: int | None = None
    status: int | None = None


class AgentWarning(EventStruct, tag="agent.warning", frozen=True, kw_only=True):
    """``source`` is the agent's notification or request that raised it."""

    source: str
    message: str
    details: str | None = None


class UsageUpdated(EventStruct, tag="usage.updated", frozen=True, kw_only=True):
    """Token counts as the agent reports them (Codex: ``totalTokens``,
    ``inputTokens``, ...): passed through."""

    turn_id: str | None = None
    total: dict[str, Any] = {}
    last: dict[str, Any] = {}
    model_context_window: int | None = None


class ThreadSuperseded(EventStruct, tag="thread.superseded", frozen=True, kw_only=True):
    """The provider never saved the conversation ``previous_handle`` (it had no turn:
    Codex writes a thread's rollout, Claude Code its transcript, at the first one), so
    a fresh one, ``handle``, took its place; ``reason`` says how that was known, in
    the provider's words where it gave any. Journaled with the ``child.ready`` that
    carries the new handle."""

    previous_handle: str
    handle: str
    reason: str


class PromptQueued(EventStruct, tag="prompt.queued", frozen=True, kw_only=True):
    """A prompt sent with ``delivery: queue``, held durably until the running turn
    ends; ``prompt_id`` becomes its ``submission``'s ``client_message_id`` when it is
    sent. Queued prompts are sent in seq order, one turn each."""

    prompt_id: str
    text: str
    operation_id: str | None = None  # the send's clientOperationId
    attachments: list[Attachment] = []  # images and file references, after the text


class PromptEdited(EventStruct, tag="prompt.edited", frozen=True, kw_only=True):
    """A client replaced the text of a queued prompt."""

    prompt_id: str
    text: str


class PromptWithdrawn(EventStruct, tag="prompt.withdrawn", frozen=True, kw_only=True):
    """A queued prompt was taken out of the queue unsent; its text goes back to the
    client that withdrew it."""

    prompt_id: str


class QueuePaused(EventStruct, tag="queue.paused", frozen=True, kw_only=True):
    """Queued prompts wait for a client to resume them: ``reason`` is
    ``daemon-restart`` (nothing is sent on its own into a conversation the user may
    have left) or ``interrupted`` (a stop returns them to the user's control)."""

    reason: str


class QueueResumed(EventStruct, tag="queue.resumed", frozen=True, kw_only=True):
    """A client resumed the queue: its head is sent once no turn runs."""


class SessionAcknowledged(EventStruct, tag="session.acknowledged", frozen=True, kw_only=True):
    """The user has seen the session up to ``seq`` (``agentSession.acknowledge``): a
    turn completion or approval request at or before it is no longer unseen."""

    seq: int


class CommandsUpdated(EventStruct, tag="commands.updated", frozen=True, kw_only=True):
    """The commands the agent offers now, replacing those it offered before (an ACP
    agent's ``available_commands_update``: its slash commands)."""

    commands: list[AgentCommand] = []


class CommandRun(EventStruct, tag="command.run", frozen=True, kw_only=True):
    """A client ran command ``name`` (``agentSession.command``): agentsd's own
    (``compact``, ``clear``) or one of the agent's slash commands, with ``args``."""

    name: str
    args: str | None = None
    operation_id: str | None = None  # the command's clientOperationId


class ConversationCleared(EventStruct, tag="conversation.cleared", frozen=True, kw_only=True):
    """The marker of ``clear``: the provider conversation ``previous_handle`` ended
    here and the agent starts blank; the next ``child.ready`` carries the fresh
    conversation's handle. The journal before it stays readable."""

    previous_handle: str | None = None


class ThreadStatus(EventStruct, tag="thread.status", frozen=True, kw_only=True):
    """The agent's own thread status (Codex), journaled when it changes."""

    status: str
    active_flags: list[str] = []


class MessageImported(EventStruct, tag="message.imported", frozen=True, kw_only=True):
    """One message of a conversation started outside the daemon, imported when the
    session adopted it (``create {resumeFrom}``): history the agent already has,
    never sent again. ``role`` is ``user`` or ``assistant``; ``turn_id`` the
    provider's own id of its turn, when it has one; ``text`` at most the import
    bound, ``truncated`` when cut."""

    role: str
    text: str
    turn_id: str | None = None
    truncated: bool = False


Event = (
    SessionCreated
    | SessionUpdated
    | Submission
    | SubmissionDispatched
    | TurnStarted
    | TurnCompleted
    | TurnPlan
    | TurnDiff
    | InterruptRequested
    | ItemStarted
    | ItemUpdated
    | ItemCompleted
    | ApprovalRequested
    | ApprovalResolved
    | ChildSpawned
    | ChildReady
    | ChildReattached
    | ChildExited
    | ExitUnproven
    | LeaseAcquired
    | LeaseReleased
    | AgentError
    | AgentWarning
    | UsageUpdated
    | ThreadStatus
    | ThreadSuperseded
    | PromptQueued
    | PromptEdited
    | PromptWithdrawn
    | QueuePaused
    | QueueResumed
    | SessionAcknowledged
    | AgentRequest
    | CommandsUpdated
    | CommandRun
    | ConversationCleared
    | MessageImported
)
"""Every event the daemon writes."""

EVENT_TYPES: Final[tuple[type[EventStruct], ...]] = typing.get_args(Event)
KINDS: Final[dict[str, type[EventStruct]]] = {t.__struct_config__.tag: t for t in EVENT_TYPES}  # type: ignore[misc]

RENAMED_KINDS: Final[dict[str, str]] = {
    "turn.interruptRequested": "interrupt.requested",
    "child.exit-unproven": "exit.unproven",
}
"""Old kind -> current kind (rule 4)."""

# Kinds whose bodies had a field "kind" before the union -> that field's name now
# (rule 5).
_RENAMED_KIND_FIELD: Final[dict[str, str]] = {
    "approval.requested": "approvalKind",
    "agent.error": "errorKind",
}


class UnknownEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A row of a kind this code does not know (written by a newer agentsd)."""

    kind: str
    body: msgspec.Raw


_encoder = msgspec.json.Encoder()
_dict_decoder = msgspec.json.Decoder(dict[str, Any])
_decoders: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    kind: msgspec.json.Decoder(t) for kind, t in KINDS.items()
}
# What the encoder writes first for each type, '{"kind":"<tag>"': the body is the
# rest (rule: the tag is not part of the body).
_tag_prefix: Final[dict[type[EventStruct], bytes]] = {
    t: b'{"kind":' + _encoder.encode(kind) for kind, t in KINDS.items()
}


def kind_of(event: EventStruct | type[EventStruct]) -> str:
    """The journal kind of an event, or of an event type (its tag)."""
    tag: str = event.__struct_config__.tag  # type: ignore[assignment]
    return tag


def encode_body(event: Event) -> bytes:
    """``event`` as a journal body: its JSON without the tag."""
    data = _encoder.encode(event)
    prefix = _tag_prefix[type(event)]
    if not data.startswith(prefix):
        # msgspec writes the tag first; a version that did not would corrupt bodies.
        raise AssertionError(f"unexpected encoding of {type(event).__name__}: {data[:80]!r}")
    rest = data[len(prefix) :]
    return b"{}" if rest == b"}" else b"{" + rest[1:]


def body_fields(event: Event) -> dict[str, Any]:
    """``event``'s body as JSON values (for error data that quotes an event)."""
    fields: dict[str, Any] = msgspec.to_builtins(event)
    del fields["kind"]
    return fields


def decode_event(kind: str, body: bytes | msgspec.Raw) -> Event | UnknownEvent:
    """The typed event of a journal row, old rows included (rules 4 and 5).

    An unknown kind is an ``UnknownEvent``; a body that does not match its kind's
    Struct raises ``msgspec.ValidationError`` (``msgspec.DecodeError`` if it is not
    JSON).
    """
    kind = RENAMED_KINDS.get(kind, kind)
    decoder = _decoders.get(kind)
    if decoder is None:
        return UnknownEvent(kind=kind, body=msgspec.Raw(body))
    if kind in _RENAMED_KIND_FIELD:
        fields = _old_fields(kind, body)
        if fields is not None:
            event: Event = msgspec.convert(fields, KINDS[kind])  # type: ignore[assignment]
            return event
    decoded: Event = decoder.decode(body)
    return decoded


def upgrade_row(kind: str, body: bytes) -> tuple[str, bytes]:
    """A journal row as the current code writes it: an old kind renamed (rule 4),
    an old body with its ``kind`` field renamed (rule 5); any other row as it is."""
    current = RENAMED_KINDS.get(kind, kind)
    if current in _RENAMED_KIND_FIELD:
        fields = _old_fields(current, body)
        if fields is not None:
            return current, _encoder.encode(fields)
    return current, body


def _old_fields(kind: str, body: bytes | msgspec.Raw) -> dict[str, Any] | None:
    """The fields of a body written before rule 5, with ``kind`` renamed; None for a
    body written since."""
    fields = _dict_decoder.decode(body)
    if "kind" not in fields:
        return None
    fields[_RENAMED_KIND_FIELD[kind]] = fields.pop("kind")
    return fields
