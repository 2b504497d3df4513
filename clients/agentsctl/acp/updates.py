"""A daemon session's journal and deltas, as ACP ``session/update`` notifications.

Rule 1: every character of an item's text reaches the editor exactly once and in
order, whatever mix of ``agentSession.delta`` (live), ``item.updated`` (coalesced
snapshots) and ``item.completed`` (the full text) carries it. The translator counts
what it sent per item: a delta is cut to what is new, a delta that would leave a hole
is dropped (the next snapshot fills it), a snapshot sends only its unsent tail.

Rule 2: a replay from seq 0 and the live stream produce the same updates, so an
editor that ``session/load``s sees what an editor that was attached saw, except for
the user's own prompts: those a bridge sent itself (known by their
``clientOperationId``) are not echoed back to the editor that typed them.

Rule 3: a tool call is announced once (``tool_call``) and then only updated
(``tool_call_update``).

Rule 4: an approval is about a tool call. One that names its item (``itemId``) is
that item's tool call, whichever of the two the journal shows first: ``pending``
while it waits for the decision, ``in_progress`` once allowed, then what the item
reports; ``failed`` once refused, whatever follows. An approval without an item is
a tool call of its own, keyed by its approval id, ``completed`` when allowed and
``failed`` otherwise.

Pure: no I/O, no trio.
"""

from __future__ import annotations

from typing import Any

import attrs

from agentsctl.acp import schema as acp
from agentsd_protocol.api.stream import DeltaNotification, JournalEvent

_MESSAGE_TYPES: dict[str, type[acp.AgentMessageChunk | acp.AgentThoughtChunk]] = {
    "agentMessage": acp.AgentMessageChunk,
    "reasoning": acp.AgentThoughtChunk,
}
# An item status that means the tool did not run to the end: ACP's ``failed``.
_FAILED_STATUSES = {
    *("failed", "error", "declined", "denied", "rejected", "cancelled", "canceled"),
    *("interrupted", "incomplete", "aborted"),
}
_ALLOWING = ("accept", "allow", "approve", "yes")


@attrs.define
class _Item:
    type: str
    turn_id: str | None = None
    sent: int = 0  # characters of its text already sent (Rule 1)
    announced: bool = False  # a tool call was sent for it (Rule 3)
    described: bool = False  # its tool call has the agent's input and kind (Rule 4)
    asking: set[str] = attrs.field(factory=set)  # its approvals awaiting a decision (Rule 4)
    refused: bool = False  # an approval of it was refused: it stays failed (Rule 4)


class UpdateTranslator:
    """Translates one session's stream, in order; feed it every event and delta."""

    def __init__(self) -> None:
        self.own_operations: set[str] = set()  # clientOperationIds of this bridge's prompts
        self._items: dict[str, _Item] = {}
        # Approvals announced, by approval id: the item each is about, or None when
        # the approval is a tool call of its own (Rule 4).
        self._approvals: dict[str, str | None] = {}
        self._turn_id: str | None = None  # the turn running, as far as this stream shows

    def event(self, event: JournalEvent) -> list[acp.SessionUpdate]:
        body: dict[str, Any] = event.body if isinstance(event.body, dict) else {}
        match event.kind:
            case "submission":
                return self._submission(body)
            case "item.started":
                return self._item_started(body)
            case "item.updated":
                item = self._item(body)
                return self._text(str(body.get("itemId")), item, _str(body.get("text")))
            case "item.completed":
                return self._item_completed(body)
            case "approval.requested":
                return self._approval_requested(body)
            case "approval.resolved":
                return self._approval_resolved(body)
            case "turn.started":
                self._turn_id = _opt_str(body.get("turnId"))
                return []
            case "turn.completed":
                self._turn_id = None
                return self._settle(body.get("turnId"), str(body.get("outcome")))
            case "child.exited":
                self._turn_id = None
                return self._settle(None, "exited")
            case _:
                return []

    def delta(self, delta: DeltaNotification) -> list[acp.SessionUpdate]:
        item = self._items.get(delta.item_id)
        if item is None:
            # Deltas stream message text; an item not seen starting is a message.
            item = self._items[delta.item_id] = _Item(type="agentMessage")
        end = delta.offset + len(delta.text)
        if delta.offset > item.sent or end <= item.sent:
            return []  # a hole before it, or nothing new (Rule 1)
        return self._chunk(delta.item_id, item, delta.text[item.sent - delta.offset :])

    # -- messages ----------------------------------------------------------------------

    def _submission(self, body: dict[str, Any]) -> list[acp.SessionUpdate]:
        if body.get("operationId") in self.own_operations:
            return []  # the editor shows what it sent itself (Rule 2)
        text = _str(body.get("text"))
        if not text:
            return []
        message_id = body.get("clientMessageId")
        return [
            acp.UserMessageChunk(
                content=acp.TextContent(text=text),
                message_id=message_id if isinstance(message_id, str) else None,
            )
        ]

    def _item(self, body: dict[str, Any]) -> _Item:
        item_id = str(body.get("itemId"))
        item = self._items.get(item_id)
        if item is None:
            item = self._items[item_id] = _Item(
                type=str(body.get("type") or "agentMessage"), turn_id=_opt_str(body.get("turnId"))
            )
        return item

    def _text(self, item_id: str, item: _Item, text: str) -> list[acp.SessionUpdate]:
        if item.type not in _MESSAGE_TYPES or len(text) <= item.sent:
            return []
        return self._chunk(item_id, item, text[item.sent :])

    def _chunk(self, item_id: str, item: _Item, text: str) -> list[acp.SessionUpdate]:
        item.sent += len(text)
        chunk = _MESSAGE_TYPES.get(item.type, acp.AgentMessageChunk)
        return [chunk(content=acp.TextContent(text=text), message_id=item_id)]

    # -- items and tool calls --------------------------------------------------------

    def _item_started(self, body: dict[str, Any]) -> list[acp.SessionUpdate]:
        item = self._item(body)
        if item.type in _MESSAGE_TYPES:
            return []
        status: acp.ToolCallStatus = "pending" if item.asking else "in_progress"
        if item.refused:
            status = "failed"
        if item.announced:
            return [self._described(body, item, status=status)]
        item.announced = item.described = True
        return [
            acp.ToolCall(
                tool_call_id=str(body.get("itemId")),
                title=_tool_title(body),
                kind=acp.tool_kind(_tool_kind_hint(body)),
                status=status,
                raw_input=body.get("input"),
            )
        ]

    def _item_completed(self, body: dict[str, Any]) -> list[acp.SessionUpdate]:
        item_id = str(body.get("itemId"))
        item = self._item(body)
        del self._items[item_id]
        if item.type in _MESSAGE_TYPES:
            return self._text(item_id, item, _str(body.get("text")))
        failed = item.refused or str(body.get("status")).lower() in _FAILED_STATUSES
        status: acp.ToolCallStatus = "failed" if failed else "completed"
        text = _str(body.get("text"))
        content = acp.text_content(text) if text else None
        output = {k: body[k] for k in ("status", "text") if body.get(k) is not None} or None
        if item.announced and item.described:
            return [
                acp.ToolCallUpdate(
                    tool_call_id=item_id, status=status, content=content, raw_output=output
                )
            ]
        if item.announced:
            return [self._described(body, item, status=status, content=content, raw_output=output)]
        return [
            acp.ToolCall(
                tool_call_id=item_id,
                title=_tool_title(body),
                kind=acp.tool_kind(_tool_kind_hint(body)),
                status=status,
                content=content or [],
                raw_input=body.get("input"),
                raw_output=output,
            )
        ]

    def _described(
        self,
        body: dict[str, Any],
        item: _Item,
        *,
        status: acp.ToolCallStatus,
        content: list[acp.ToolCallContent] | None = None,
        raw_output: Any = None,
    ) -> acp.ToolCallUpdate:
        """The update of a tool call its approval announced (Rule 4), once the agent
        says what the tool is: its input and kind; the title stays the question's."""
        item.described = True
        kind = acp.tool_kind(_tool_kind_hint(body))
        return acp.ToolCallUpdate(
            tool_call_id=str(body.get("itemId")),
            kind=None if kind == "other" else kind,
            status=status,
            content=content,
            raw_input=body.get("input"),
            raw_output=raw_output,
        )

    def _settle(self, turn_id: object, outcome: str) -> list[acp.SessionUpdate]:
        """A turn ended (or the agent did): forget its items; a tool call still open
        ends ``failed`` unless the turn completed."""
        updates: list[acp.SessionUpdate] = []
        for item_id, item in list(self._items.items()):
            if turn_id is not None and item.turn_id is not None and item.turn_id != turn_id:
                continue
            del self._items[item_id]
            if item.announced and not item.refused:  # a refused one was failed already
                status: acp.ToolCallStatus = "completed" if outcome == "completed" else "failed"
                updates.append(acp.ToolCallUpdate(tool_call_id=item_id, status=status))
        return updates

    # -- approvals (Rule 4) --------------------------------------------------------------

    def _approval_requested(self, body: dict[str, Any]) -> list[acp.SessionUpdate]:
        approval_id = str(body.get("approvalId"))
        item_id = _opt_str(body.get("itemId"))
        self._approvals[approval_id] = item_id
        tool_call_id = item_id or approval_id
        detail = _str(body.get("detail"))
        if item_id is not None:
            item = self._items.get(item_id)
            if item is None:
                item = self._items[item_id] = _Item(
                    type=_str(body.get("kind")) or "tool", turn_id=self._turn_id
                )
            item.asking.add(approval_id)
            if item.announced:
                # The agent announced the tool first; it now waits for the decision.
                return [acp.ToolCallUpdate(tool_call_id=item_id, status="pending")]
            item.announced = True
        return [
            acp.ToolCall(
                tool_call_id=tool_call_id,
                title=_str(body.get("title")) or "Permission requested",
                kind=acp.tool_kind(_opt_str(body.get("kind"))),
                status="pending",
                content=acp.text_content(detail) if detail else [],
                raw_input={"kind": body.get("kind"), "options": body.get("options")},
            )
        ]

    def _approval_resolved(self, body: dict[str, Any]) -> list[acp.SessionUpdate]:
        approval_id = str(body.get("approvalId"))
        if approval_id not in self._approvals:
            return []  # requested before this stream began: nothing to update
        item_id = self._approvals.pop(approval_id)
        decision = str(body.get("decision"))
        allowed = decision.lower().startswith(_ALLOWING)
        outcome = {"decision": decision, "by": body.get("by")}
        if item_id is None:
            return [
                acp.ToolCallUpdate(
                    tool_call_id=approval_id,
                    status="completed" if allowed else "failed",
                    raw_output=outcome,
                )
            ]
        item = self._items.get(item_id)
        if item is None or item.refused:
            return []  # the item already ended (or failed): nothing left to decide
        item.asking.discard(approval_id)
        if not allowed:
            item.refused = True
            return [acp.ToolCallUpdate(tool_call_id=item_id, status="failed", raw_output=outcome)]
        if item.asking:
            return []  # another question about it is still open: it stays pending
        return [acp.ToolCallUpdate(tool_call_id=item_id, status="in_progress")]


def approval_tool_call(body: dict[str, Any]) -> acp.PermissionToolCall:
    """The ``toolCall`` of the permission request for an ``approval.requested`` body:
    the tool call ``UpdateTranslator`` announced for it (its item's, Rule 4), by id,
    with the question's fields again for an editor that missed the announcement."""
    detail = _str(body.get("detail"))
    return acp.PermissionToolCall(
        tool_call_id=_opt_str(body.get("itemId")) or str(body.get("approvalId")),
        title=_str(body.get("title")) or "Permission requested",
        kind=acp.tool_kind(_opt_str(body.get("kind"))),
        status="pending",
        content=acp.text_content(detail) if detail else None,
    )


def _tool_title(body: dict[str, Any]) -> str:
    command = _command(body.get("input"))
    name = _opt_str(body.get("name"))
    if command and name:
        return f"{name}: {command}"
    return command or name or str(body.get("type") or "tool")


def _tool_kind_hint(body: dict[str, Any]) -> str | None:
    kind = str(body.get("type") or "")
    if kind == "toolCall":
        return _opt_str(body.get("name"))
    return kind


def _command(raw: object) -> str | None:
    if not isinstance(raw, dict):
        return None
    command = raw.get("command")
    if isinstance(command, list):
        return " ".join(str(part) for part in command)
    return command if isinstance(command, str) else None


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None
