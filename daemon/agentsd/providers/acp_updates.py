"""ACP ``session/update`` notifications as journal events, for one running turn.

Sans-IO: ``TurnItems.update`` takes one update's payload and returns the events to
journal plus the streamed text to pass to ``sink.delta``; the adapter does the I/O.

Rule 1: message and thought chunks are one streamed item per run of chunks of the
same kind (and ``messageId``, when the agent gives one): ``item.started`` at the
first chunk, deltas for each chunk, ``item.completed`` with the whole text when
another kind of update arrives or the turn ends.

Rule 2: a tool call is one item: ``item.started`` at ``tool_call``; its
``tool_call_update``s merge into what is known (ACP sends only changed fields) and
``item.completed`` carries it all once its status is ``completed`` or ``failed``.
A tool call still open when the turn ends is completed ``incomplete``.

Rule 3: a payload that does not have ACP's shape raises ``MalformedUpdate``; the
adapter journals it as an ``agent.error`` and the turn goes on.

Rule 4 (takeover): item ids follow from the turn id and the stream, so a turn
taken over (``restore``) goes on with the items begun before: the text item in
progress (the last one; taken to be the agent's message, and split off should
the next chunk be a thought) and the tool calls not yet done.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import attrs
import msgspec

from agentsd.providers.base import journal_payload
from agentsd_protocol.api.events import (
    AgentCommand,
    Event,
    FileChange,
    ItemCompleted,
    ItemStarted,
    PlanStep,
    TurnPlan,
)

MAX_OUTPUT_BYTES = 64 * 1024  # per tool output or diff: the head a reader needs
MAX_DETAIL_BYTES = 16 * 1024  # a tool call's kind and locations, as JSON
MAX_ITEM_TEXT_CHARS = 1 << 20  # one message's text kept for its item.completed
TEXT_KINDS = {"agent_message_chunk": "agentMessage", "agent_thought_chunk": "reasoning"}
DONE_STATUSES = frozenset({"completed", "failed"})

_encoder = msgspec.json.Encoder()


class MalformedUpdate(ValueError):
    """A ``session/update`` that does not have ACP's shape (Rule 3)."""


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def content_text(block: Any) -> str:
    """The text of an ACP content block; other blocks as a short placeholder."""
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise MalformedUpdate(f"a content block must be an object with a type, not {block!r:.200}")
    if block["type"] == "text":
        text = block.get("text")
        if not isinstance(text, str):
            raise MalformedUpdate("a text content block has no text")
        return text
    if block["type"] == "resource_link":
        return f"[{block.get('name') or block.get('uri') or 'resource'}]"
    return f"[{block['type']}]"


@attrs.define
class Streamed:
    item_id: str
    type: str
    message_id: str | None
    parts: list[str] = attrs.field(factory=list)
    kept: int = 0
    taken_over: bool = False  # begun before a takeover: its messageId is not known

    def add(self, text: str) -> None:
        room = MAX_ITEM_TEXT_CHARS - self.kept
        if room > 0:
            self.parts.append(text[:room])
            self.kept += min(room, len(text))


@attrs.define
class TurnItems:
    """The items of one turn (see the module's rules). ``deltas`` collects the
    streamed text of the last ``update`` as ``(item_id, text)``."""

    turn_id: str
    _text: Streamed | None = None
    _tools: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    _count: int = 0
    deltas: list[tuple[str, str]] = attrs.field(factory=list)

    def restore(self, open_items: Mapping[str, str]) -> None:
        """Take over the items an earlier adapter left open in this turn (Rule 4)."""
        prefix = f"{self.turn_id}-"
        for item_id, text in open_items.items():
            number = item_id.removeprefix(prefix)
            if item_id.startswith(prefix) and number.isdecimal():
                if int(number) > self._count:
                    self._count = int(number)
                    self._text = Streamed(item_id, "agentMessage", None, taken_over=True)
                    self._text.add(text)
            else:
                self._tools[item_id] = {}

    def update(self, update: Any) -> list[Event]:
        """The events of one update payload (``params.update``). Raises
        ``MalformedUpdate``. Kinds this module does not translate give no events."""
        self.deltas = []
        if not isinstance(update, dict) or not isinstance(update.get("sessionUpdate"), str):
            raise MalformedUpdate(
                f"an update must be an object with sessionUpdate: {update!r:.200}"
            )
        kind = update["sessionUpdate"]
        if kind in TEXT_KINDS:
            return self._chunk(TEXT_KINDS[kind], update)
        match kind:
            case "tool_call":
                return [*self.close_text(), *self._tool_call(update)]
            case "tool_call_update":
                return [*self.close_text(), *self._tool_call_update(update)]
            case "plan":
                return [*self.close_text(), self._plan(update)]
            case _:
                return []

    def _chunk(self, item_type: str, update: dict[str, Any]) -> list[Event]:
        text = content_text(update.get("content"))
        message_id = _str(update.get("messageId"))
        events: list[Event] = []
        current = self._text
        if current is not None and current.taken_over:
            current.message_id, current.taken_over = message_id, False
        if current is None or current.type != item_type or current.message_id != message_id:
            events.extend(self.close_text())
            self._count += 1
            current = Streamed(f"{self.turn_id}-{self._count}", item_type, message_id)
            self._text = current
            events.append(
                ItemStarted(item_id=current.item_id, turn_id=self.turn_id, type=item_type)
            )
        current.add(text)
        self.deltas.append((current.item_id, text))
        return events

    def close_text(self) -> list[Event]:
        """Complete the streamed item in progress, if any."""
        current, self._text = self._text, None
        if current is None:
            return []
        return [
            ItemCompleted(
                item_id=current.item_id,
                turn_id=self.turn_id,
                type=current.type,
                text="".join(current.parts),
            )
        ]

    def _tool_call(self, update: dict[str, Any]) -> list[Event]:
        tool_id = _str(update.get("toolCallId"))
        if not tool_id:
            raise MalformedUpdate("a tool_call has no toolCallId")
        self._tools[tool_id] = dict(update)
        events: list[Event] = [self._started(tool_id, update)]
        if update.get("status") in DONE_STATUSES:
            events.append(self._completed(tool_id, incomplete=False))
        return events

    def _tool_call_update(self, update: dict[str, Any]) -> list[Event]:
        tool_id = _str(update.get("toolCallId"))
        if not tool_id:
            raise MalformedUpdate("a tool_call_update has no toolCallId")
        known = self._tools.get(tool_id)
        events: list[Event] = []
        if known is None:  # an update of a call never announced: announce it now
            known = self._tools[tool_id] = {}
            events.append(self._started(tool_id, update))
        known.update({k: v for k, v in update.items() if v is not None})
        if known.get("status") in DONE_STATUSES:
            events.append(self._completed(tool_id, incomplete=False))
        return events

    def _started(self, tool_id: str, fields: dict[str, Any]) -> ItemStarted:
        return ItemStarted(
            item_id=tool_id,
            turn_id=self.turn_id,
            type="toolCall",
            name=_str(fields.get("title")),
            status=_str(fields.get("status")),
        )

    def _completed(self, tool_id: str, *, incomplete: bool) -> ItemCompleted:
        fields = self._tools.pop(tool_id)
        outputs: list[str] = []
        diffs: list[str] = []
        changes: list[FileChange] = []
        content = fields.get("content")
        for entry in content if isinstance(content, list) else []:
            if not isinstance(entry, dict):
                raise MalformedUpdate(f"tool call content must be objects, not {entry!r:.200}")
            match entry.get("type"):
                case "content":
                    outputs.append(content_text(entry.get("content")))
                case "diff":
                    path = _str(entry.get("path"))
                    old = entry.get("oldText")
                    changes.append(FileChange(path=path, kind="add" if old is None else "update"))
                    diffs.append(_diff(path, old, entry.get("newText")))
                case "terminal":
                    outputs.append(f"[terminal {entry.get('terminalId')}]")
                case other:
                    outputs.append(f"[{other}]")
        raw_output = fields.get("rawOutput")
        if not outputs and raw_output is not None:
            outputs.append(raw_output if isinstance(raw_output, str) else _json(raw_output))
        detail = {k: fields[k] for k in ("kind", "locations") if fields.get(k) is not None}
        raw_input = fields.get("rawInput")
        return ItemCompleted(
            item_id=tool_id,
            turn_id=self.turn_id,
            type="toolCall",
            name=_str(fields.get("title")),
            status=_str(fields.get("status")),
            incomplete=incomplete,
            arguments=None
            if raw_input is None
            else journal_payload(_json(raw_input), MAX_DETAIL_BYTES),
            output=journal_payload("\n".join(outputs), MAX_OUTPUT_BYTES) if outputs else None,
            changes=changes,
            diff=journal_payload("".join(diffs), MAX_OUTPUT_BYTES) if diffs else None,
            detail=journal_payload(_json(detail), MAX_DETAIL_BYTES) if detail else None,
        )

    def _plan(self, update: dict[str, Any]) -> TurnPlan:
        entries = update.get("entries")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise MalformedUpdate("a plan must have a list of entries")
        return TurnPlan(
            turn_id=self.turn_id,
            plan=[
                PlanStep(step=_str(e.get("content")), status=_str(e.get("status"))) for e in entries
            ],
        )

    def finish(self) -> list[Event]:
        """The turn ended: complete what is still open (Rules 1 and 2)."""
        events = self.close_text()
        for tool_id in list(self._tools):
            events.append(self._completed(tool_id, incomplete=True))
        return events


def agent_commands(value: Any) -> list[AgentCommand] | None:
    """An ``availableCommands`` list as the journal's commands; None when malformed."""
    if not isinstance(value, list):
        return None
    commands = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            return None
        description = entry.get("description")
        given = entry.get("input")
        hint = given.get("hint") if isinstance(given, dict) else None
        commands.append(
            AgentCommand(
                name=entry["name"],
                description=description if isinstance(description, str) else None,
                hint=hint if isinstance(hint, str) else None,
            )
        )
    return commands


def _json(value: Any) -> str:
    return _encoder.encode(value).decode()


def _diff(path: str | None, old: Any, new: Any) -> str:
    """A diff entry as a minimal unified-style text (ACP sends whole texts)."""
    name = path or "?"
    before = old.splitlines(keepends=True) if isinstance(old, str) else []
    after = new.splitlines(keepends=True) if isinstance(new, str) else []
    return "".join(difflib.unified_diff(before, after, "/dev/null" if old is None else name, name))
