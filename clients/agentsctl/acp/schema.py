"""The Agent Client Protocol's wire types, as far as the bridge speaks it (ACP v1).

Rule 1: inbound params accept unknown fields. ACP grows by optional fields and
``_meta`` everywhere, and an editor newer than this bridge must still be served; the
fields the bridge needs are typed and checked.

Rule 2: outbound values omit what is unset, so every message is the smallest valid
one; tagged unions carry ACP's discriminators (``type``, ``sessionUpdate``).

Pure: msgspec and the standard library only, no I/O.
"""

from __future__ import annotations

import re
import typing
from typing import Any, Literal

import msgspec

PROTOCOL_VERSION = 1  # the ACP major version this bridge speaks

# JSON-RPC error codes ACP gives a meaning to.
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002
REQUEST_CANCELLED = -32800

StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]
ToolKind = Literal[
    "read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"
]
ToolCallStatus = Literal["pending", "in_progress", "completed", "failed"]
PermissionOptionKind = Literal["allow_once", "allow_always", "reject_once", "reject_always"]


class Inbound(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Params an editor sends (Rule 1: unknown fields are accepted)."""


class Outbound(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """Results and params the bridge sends (Rule 2)."""


# -- content blocks -----------------------------------------------------------------


class TextBlock(Inbound, frozen=True, kw_only=True, tag_field="type", tag="text"):
    text: str


class ImageBlock(Inbound, frozen=True, kw_only=True, tag_field="type", tag="image"):
    data: str
    mime_type: str


class AudioBlock(Inbound, frozen=True, kw_only=True, tag_field="type", tag="audio"):
    data: str
    mime_type: str


class ResourceLinkBlock(Inbound, frozen=True, kw_only=True, tag_field="type", tag="resource_link"):
    uri: str
    name: str
    title: str | None = None


class EmbeddedResource(Inbound, frozen=True, kw_only=True):
    uri: str
    text: str | None = None  # a text resource
    blob: str | None = None  # a binary one (base64)
    mime_type: str | None = None


class ResourceBlock(Inbound, frozen=True, kw_only=True, tag_field="type", tag="resource"):
    resource: EmbeddedResource


ContentBlock = TextBlock | ImageBlock | AudioBlock | ResourceLinkBlock | ResourceBlock


class UnsupportedContent(ValueError):
    """A prompt holds content this bridge did not advertise (audio)."""


class DaemonPrompt(msgspec.Struct, frozen=True, kw_only=True):
    """A prompt as a daemon send takes it: its text, and its images as content blocks."""

    text: str
    images: list[tuple[str, str]]  # (base64 data, media type), in order


def daemon_prompt(blocks: list[ContentBlock]) -> DaemonPrompt:
    """The prompt as a daemon session takes it.

    Text is kept as is; a resource link becomes a Markdown link; an embedded text
    resource is inlined with its URI (also a ``file://`` one: its contents are what
    the editor holds, unsaved edits included, which a file reference would lose); a
    binary one is referred to by URI. Images go as image blocks. Raises
    ``UnsupportedContent`` for audio (not advertised in ``initialize``).
    """
    parts: list[str] = []
    images: list[tuple[str, str]] = []
    for block in blocks:
        match block:
            case TextBlock(text=text):
                parts.append(text)
            case ResourceLinkBlock(uri=uri, name=name, title=title):
                parts.append(f"[{title or name}]({uri})")
            case ResourceBlock(resource=EmbeddedResource(uri=uri, text=str() as text)):
                parts.append(f'<context uri="{uri}">\n{text}\n</context>')
            case ResourceBlock(resource=EmbeddedResource(uri=uri)):
                parts.append(f"<{uri}>")
            case ImageBlock(data=data, mime_type=mime_type):
                images.append((data, mime_type))
            case AudioBlock():
                raise UnsupportedContent("audio content is not supported by this agent")
    return DaemonPrompt(text="\n".join(parts), images=images)


# -- methods the editor calls -----------------------------------------------------------


class InitializeParams(Inbound, frozen=True, kw_only=True):
    protocol_version: int
    client_capabilities: dict[str, Any] = {}
    client_info: dict[str, Any] | None = None


class PromptCapabilities(Outbound, frozen=True, kw_only=True):
    image: bool = False
    audio: bool = False
    embedded_context: bool = False


class McpCapabilities(Outbound, frozen=True, kw_only=True):
    http: bool = False
    sse: bool = False


class SessionCapabilities(Outbound, frozen=True, kw_only=True):
    list: dict[str, Any] | None = None
    resume: dict[str, Any] | None = None


class AgentCapabilities(Outbound, frozen=True, kw_only=True):
    load_session: bool = False
    prompt_capabilities: PromptCapabilities = PromptCapabilities()
    mcp_capabilities: McpCapabilities = McpCapabilities()
    session_capabilities: SessionCapabilities = SessionCapabilities()


class Implementation(Outbound, frozen=True, kw_only=True):
    name: str
    title: str | None = None
    version: str


class InitializeResult(Outbound, frozen=True, kw_only=True):
    protocol_version: int
    agent_capabilities: AgentCapabilities
    agent_info: Implementation
    auth_methods: list[Any] = msgspec.field(default_factory=list)


class NewSessionParams(Inbound, frozen=True, kw_only=True):
    cwd: str
    mcp_servers: list[Any] = []


class SessionMode(Outbound, frozen=True, kw_only=True):
    id: str
    name: str
    description: str | None = None


class SessionModeState(Outbound, frozen=True, kw_only=True):
    current_mode_id: str
    available_modes: list[SessionMode]


class ConfigChoice(Outbound, frozen=True, kw_only=True):
    value: str
    name: str
    description: str | None = None


class ConfigOption(Outbound, frozen=True, kw_only=True, tag_field="type", tag="select"):
    """A session config option of type ``select`` (ACP's ``SessionConfigOption``)."""

    id: str
    name: str
    current_value: str
    options: list[ConfigChoice]
    description: str | None = None
    category: str | None = None  # mode, model, thought_level


class ModelInfo(Outbound, frozen=True, kw_only=True):
    model_id: str
    name: str
    description: str | None = None


class SessionModelState(Outbound, frozen=True, kw_only=True):
    """The unstable ``models`` of a session (the model picker of editors that predate
    config options, with ``session/set_model``)."""

    current_model_id: str
    available_models: list[ModelInfo]


class NewSessionResult(Outbound, frozen=True, kw_only=True):
    session_id: str
    modes: SessionModeState | None = None
    config_options: list[ConfigOption] | None = None
    models: SessionModelState | None = None


class SessionStateResult(Outbound, frozen=True, kw_only=True):
    """The result of ``session/load`` and ``session/resume``: the session's modes,
    config options and (unstable) models."""

    modes: SessionModeState | None = None
    config_options: list[ConfigOption] | None = None
    models: SessionModelState | None = None


class SetModeParams(Inbound, frozen=True, kw_only=True):
    session_id: str
    mode_id: str


class SetConfigOptionParams(Inbound, frozen=True, kw_only=True):
    session_id: str
    config_id: str
    value: str | bool


class SetConfigOptionResult(Outbound, frozen=True, kw_only=True):
    config_options: list[ConfigOption]


class SetModelParams(Inbound, frozen=True, kw_only=True):
    """The unstable ``session/set_model`` (Zed's model picker before config options)."""

    session_id: str
    model_id: str


class LoadSessionParams(Inbound, frozen=True, kw_only=True):
    session_id: str
    cwd: str
    mcp_servers: list[Any] = []


class ResumeSessionParams(Inbound, frozen=True, kw_only=True):
    session_id: str
    cwd: str
    mcp_servers: list[Any] = []


class EmptyResult(Outbound, frozen=True, kw_only=True):
    """The result of ``session/load`` and ``session/resume``: nothing to report."""


class ListSessionsParams(Inbound, frozen=True, kw_only=True):
    cwd: str | None = None
    cursor: str | None = None


class SessionListing(Outbound, frozen=True, kw_only=True):
    session_id: str
    cwd: str
    title: str | None = None
    updated_at: str | None = None  # ISO 8601


class ListSessionsResult(Outbound, frozen=True, kw_only=True):
    sessions: list[SessionListing]


class PromptParams(Inbound, frozen=True, kw_only=True):
    session_id: str
    prompt: list[ContentBlock]


class PromptResult(Outbound, frozen=True, kw_only=True):
    stop_reason: StopReason
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class CancelParams(Inbound, frozen=True, kw_only=True):
    session_id: str


class CancelRequestParams(Inbound, frozen=True, kw_only=True):
    """``$/cancel_request``: cancel a request by its JSON-RPC id."""

    request_id: int | str


# -- session/update -------------------------------------------------------------------


class TextContent(Outbound, frozen=True, kw_only=True, tag_field="type", tag="text"):
    text: str


class ToolCallContent(Outbound, frozen=True, kw_only=True, tag_field="type", tag="content"):
    content: TextContent


class DiffContent(Outbound, frozen=True, kw_only=True, tag_field="type", tag="diff"):
    """An edit as ACP shows it for review: ``old_text`` None is a new file. Sent with
    ``oldText`` always (null for a new file), as editors expect the key."""

    path: str
    old_text: str | None
    new_text: str


class ToolCallLocation(Outbound, frozen=True, kw_only=True):
    path: str  # absolute
    line: int | None = None  # 1-based


ToolContent = ToolCallContent | DiffContent

PlanEntryStatus = Literal["pending", "in_progress", "completed"]


class PlanEntry(Outbound, frozen=True, kw_only=True):
    content: str
    priority: Literal["high", "medium", "low"]  # required by ACP: sent always
    status: PlanEntryStatus


class Update(Outbound, frozen=True, kw_only=True, tag_field="sessionUpdate"):
    """One ``session/update``."""


class UserMessageChunk(Update, frozen=True, kw_only=True, tag="user_message_chunk"):
    content: TextContent
    message_id: str | None = None


class AgentMessageChunk(Update, frozen=True, kw_only=True, tag="agent_message_chunk"):
    content: TextContent
    message_id: str | None = None


class AgentThoughtChunk(Update, frozen=True, kw_only=True, tag="agent_thought_chunk"):
    content: TextContent
    message_id: str | None = None


class ToolCall(Update, frozen=True, kw_only=True, tag="tool_call"):
    tool_call_id: str
    title: str
    kind: ToolKind  # required here though ACP defaults them: sent always, for every editor
    status: ToolCallStatus
    content: list[ToolContent] = []
    locations: list[ToolCallLocation] = []
    raw_input: Any = None
    raw_output: Any = None


class ToolCallUpdate(Update, frozen=True, kw_only=True, tag="tool_call_update"):
    tool_call_id: str
    title: str | None = None
    kind: ToolKind | None = None
    status: ToolCallStatus | None = None
    content: list[ToolContent] | None = None
    locations: list[ToolCallLocation] | None = None
    raw_input: Any = None
    raw_output: Any = None


class Plan(Update, frozen=True, kw_only=True, tag="plan"):
    """The agent's plan, whole: each update replaces the one before."""

    entries: list[PlanEntry]


class Cost(Outbound, frozen=True, kw_only=True):
    amount: float
    currency: str = "USD"


class UsageUpdate(Update, frozen=True, kw_only=True, tag="usage_update"):
    """Tokens in the context (``used``) out of the model's window (``size``)."""

    used: int
    size: int
    cost: Cost | None = None


class SessionInfoUpdate(Update, frozen=True, kw_only=True, tag="session_info_update"):
    title: str | None = None
    updated_at: str | None = None


class CurrentModeUpdate(Update, frozen=True, kw_only=True, tag="current_mode_update"):
    current_mode_id: str


class ConfigOptionUpdate(Update, frozen=True, kw_only=True, tag="config_option_update"):
    config_options: list[ConfigOption]


class CommandInput(Outbound, frozen=True, kw_only=True):
    hint: str


class AvailableCommand(Outbound, frozen=True, kw_only=True):
    name: str
    description: str
    input: CommandInput | None = None


class AvailableCommandsUpdate(Update, frozen=True, kw_only=True, tag="available_commands_update"):
    available_commands: list[AvailableCommand]


SessionUpdate = (
    UserMessageChunk
    | AgentMessageChunk
    | AgentThoughtChunk
    | ToolCall
    | ToolCallUpdate
    | Plan
    | UsageUpdate
    | SessionInfoUpdate
    | CurrentModeUpdate
    | ConfigOptionUpdate
    | AvailableCommandsUpdate
)


class SessionNotification(Outbound, frozen=True, kw_only=True):
    session_id: str
    update: SessionUpdate


def text_content(text: str) -> list[ToolContent]:
    return [ToolCallContent(content=TextContent(text=text))]


# -- session/request_permission ------------------------------------------------------


class PermissionToolCall(Outbound, frozen=True, kw_only=True):
    """The ``toolCall`` of a permission request (a ``ToolCallUpdate`` without its tag)."""

    tool_call_id: str
    title: str | None = None
    kind: ToolKind | None = None
    status: ToolCallStatus | None = None
    content: list[ToolContent] | None = None
    locations: list[ToolCallLocation] | None = None
    raw_input: Any = None


class PermissionOption(Outbound, frozen=True, kw_only=True):
    option_id: str
    name: str
    kind: PermissionOptionKind


class RequestPermissionParams(Outbound, frozen=True, kw_only=True):
    session_id: str
    tool_call: PermissionToolCall
    options: list[PermissionOption]
    meta: dict[str, Any] | None = msgspec.field(default=None, name="_meta")


class PermissionOutcome(Inbound, frozen=True, kw_only=True):
    outcome: str  # "selected" or "cancelled"
    option_id: str | None = None


class RequestPermissionResult(Inbound, frozen=True, kw_only=True):
    outcome: PermissionOutcome


_ALLOW_WORDS = {"accept", "allow", "approve", "yes"}
_REJECT_WORDS = {"decline", "deny", "reject", "no", "cancel", "abort"}
# Approval kinds whose options are the agent's own words (the labels of a question it
# asks), shown as they are: only ``decline`` and ``cancel`` refuse.
_WORDED_KINDS = {"question"}
_REFUSALS = {"decline", "cancel"}
_OPTION_KINDS = frozenset(typing.get_args(PermissionOptionKind))


def _identifier_words(decision: str) -> list[str]:
    """``acceptForSession`` -> ``["accept", "for", "session"]``."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", decision).replace("_", " ")
    return spaced.lower().split()


def permission_option(
    decision: str,
    approval_kind: str | None = None,
    *,
    agent_name: str | None = None,
    agent_kind: str | None = None,
) -> PermissionOption:
    """One of the daemon's decisions as an ACP option; its ``optionId`` is the
    decision itself, so the editor's choice goes back to ``agentSession.respond``
    unchanged.

    An option an ACP agent behind the daemon described keeps that agent's name and
    kind (``agent_name``, ``agent_kind``).

    A decision of the daemon's vocabulary (``accept``, ``acceptForSession``, ...) is
    named in words and its kind read from its first word (``...ForSession`` and
    ``...Always`` allow or reject always). The options of a ``question`` are the
    agent's answer labels: named as they are, each allows once, except ``decline``
    and ``cancel``.
    """
    kind: PermissionOptionKind
    if agent_kind in _OPTION_KINDS:
        kind = typing.cast(PermissionOptionKind, agent_kind)
        return PermissionOption(option_id=decision, name=agent_name or decision, kind=kind)
    if approval_kind in _WORDED_KINDS:
        kind = "reject_once" if decision in _REFUSALS else "allow_once"
        return PermissionOption(option_id=decision, name=decision, kind=kind)
    words = _identifier_words(decision)
    first = words[0] if words else ""
    lasting = "always" in words or "session" in words
    if first in _REJECT_WORDS:
        kind = "reject_always" if lasting else "reject_once"
    elif first in _ALLOW_WORDS:
        kind = "allow_always" if lasting else "allow_once"
    else:
        kind = "allow_once"
    name = " ".join(words).capitalize() if words else decision
    return PermissionOption(option_id=decision, name=name, kind=kind)


def tool_kind(kind: str | None) -> ToolKind:
    """A daemon approval or item kind as ACP's tool kind (``other`` when unsure)."""
    match (kind or "").lower():
        case "command" | "commandexecution" | "exec" | "shell" | "bash":
            return "execute"
        case "file" | "filechange" | "patch" | "edit" | "write" | "applypatch":
            return "edit"
        case "read" | "view":
            return "read"
        case "search" | "grep" | "glob" | "websearch":
            return "search"
        case "fetch" | "network" | "webfetch":
            return "fetch"
        case "delete":
            return "delete"
        case "move" | "rename":
            return "move"
        case "reasoning" | "think":
            return "think"
        case "plan":  # leaving plan mode
            return "switch_mode"
        case _:
            return "other"
