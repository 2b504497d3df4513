"""The items of a Claude Code conversation: streamed text and tool calls.

``Items`` turns ``stream_event``, ``assistant`` and tool-result ``user`` frames into
``item.started`` / ``item.completed`` events and streamed deltas. It belongs to the
adapter's reader task; nothing else touches it.

Rule 1 (one item per content block): a text block is ``<message id>:<block index>``
(the ids the stream gives), announced at ``content_block_start`` and completed by
the ``assistant`` frame that carries the same block; Claude Code sends one
``assistant`` frame per content block, before that block's ``content_block_stop``,
so the oldest open text block of a message is the one an ``assistant`` text
completes. A tool call is its ``tool_use`` id: announced by the ``assistant`` frame
(whole input), completed by the ``tool_result`` in a later ``user`` frame.

Rule 2: an item a turn left open (a stream cut short, a tool never reported) is
completed when the turn ends, marked as such, so no client waits on it forever.

Rule 3 (takeover): the ids depend only on the stream, so an adapter that takes over
mid-block (``restore``) streams the rest of a text block to the item the earlier
adapter started, and its ``assistant`` frame completes it with the whole text.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping
from typing import Any

import attrs

from agentsd.providers.base import SessionSink
from agentsd.providers.claude_events import (
    text_of,
    tool_input,
    tool_output,
    tool_results,
    tool_status,
)
from agentsd_protocol.api.events import BoundedPayload, ItemCompleted, ItemStarted


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@attrs.define(eq=False)
class _Text:
    """A text block being streamed."""

    item_id: str
    index: int
    parts: list[str] = attrs.field(factory=list)


class Items:
    def __init__(self, sink: SessionSink) -> None:
        self._sink = sink
        self._message_id: str | None = None  # of the message being streamed
        self._texts: dict[str, list[_Text]] = {}  # open text blocks by message id
        self._tools: dict[str, ItemStarted] = {}  # announced, not yet reported back; by id
        self._unstreamed = itertools.count(1)

    def restore(self, open_items: Mapping[str, str]) -> None:
        """Take over the items an earlier adapter left open (Rule 3): text blocks
        (``<message id>:<block index>``) with the text journaled so far, and tool
        calls (their ``tool_use`` id) awaiting their result."""
        for item_id, text in open_items.items():
            message_id, _, index = item_id.rpartition(":")
            if message_id and index.isdecimal():
                block = _Text(item_id=item_id, index=int(index), parts=[text] if text else [])
                blocks = self._texts.setdefault(message_id, [])
                blocks.append(block)
                blocks.sort(key=lambda b: b.index)
                self._message_id = message_id  # frames without api_message_id
            else:
                self._tools[item_id] = ItemStarted(item_id=item_id, turn_id=None, type="toolCall")

    async def on_stream_event(self, frame: dict[str, Any], turn_id: str | None) -> None:
        event = _dict(frame.get("event"))
        kind = event.get("type")
        if kind == "message_start":
            message_id = _dict(event.get("message")).get("id")
            self._message_id = message_id if isinstance(message_id, str) else None
            return
        message_id = frame.get("api_message_id") or self._message_id
        index = event.get("index")
        if not isinstance(message_id, str) or not isinstance(index, int):
            return
        if kind == "content_block_start":
            if _dict(event.get("content_block")).get("type") != "text":
                return  # a tool call is journaled whole, from its assistant frame
            text = _Text(item_id=f"{message_id}:{index}", index=index)
            blocks = self._texts.setdefault(message_id, [])
            # Read again after a takeover that restored it (Rule 3): the same event,
            # but one block.
            if all(block.item_id != text.item_id for block in blocks):
                blocks.append(text)
            await self._sink.emit(
                ItemStarted(item_id=text.item_id, turn_id=turn_id, type="agentMessage")
            )
        elif kind == "content_block_delta":
            delta = _dict(event.get("delta"))
            piece = delta.get("text")
            if delta.get("type") != "text_delta" or not isinstance(piece, str):
                return  # thinking and tool-input deltas are not streamed to clients
            for text in self._texts.get(message_id, ()):
                if text.index == index:
                    text.parts.append(piece)
                    self._sink.delta(text.item_id, piece)

    async def on_assistant(self, frame: dict[str, Any], turn_id: str | None) -> None:
        message = _dict(frame.get("message"))
        message_id = message.get("id")
        if not isinstance(message_id, str):
            message_id = f"m-{uuid.uuid4().hex[:12]}"
        parent = frame.get("parent_tool_use_id")
        parent_id = parent if isinstance(parent, str) else None
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            block = _dict(block)
            kind = block.get("type")
            if kind == "text":
                await self._sink.emit(
                    ItemCompleted(
                        item_id=self._complete_text(message_id),
                        turn_id=turn_id,
                        type="agentMessage",
                        text=text_of([block]),
                        parent_tool_use_id=parent_id,
                    )
                )
            elif kind == "tool_use" and isinstance(block.get("id"), str):
                name = block.get("name")
                tool_in, truncated = tool_input(block.get("input"))
                started = ItemStarted(
                    item_id=block["id"],
                    turn_id=turn_id,
                    type="toolCall",
                    name=name if isinstance(name, str) else None,
                    input=tool_in,
                    input_truncated=truncated,
                    parent_tool_use_id=parent_id,
                )
                self._tools[block["id"]] = started
                await self._sink.emit(started)
            # Thinking blocks are not journaled.

    def _complete_text(self, message_id: str) -> str:
        """The item id an ``assistant`` text block completes (Rule 1)."""
        open_texts = self._texts.get(message_id)
        if not open_texts:  # not streamed (partial messages off, or a synthetic message)
            return f"{message_id}:a{next(self._unstreamed)}"
        item_id = open_texts.pop(0).item_id
        if not open_texts:
            del self._texts[message_id]
        return item_id

    async def on_tool_results(self, frame: dict[str, Any], turn_id: str | None) -> None:
        for block in tool_results(frame):
            tool_use_id = block.get("tool_use_id")
            tool = self._tools.pop(tool_use_id, None) if isinstance(tool_use_id, str) else None
            if tool is None:
                continue
            await self._sink.emit(
                _completed(
                    tool,
                    turn_id,
                    output=tool_output(block),
                    status=tool_status(block, frame.get("tool_result_meta")),
                )
            )

    async def close_open(self, turn_id: str | None, *, interrupted: bool) -> None:
        """Complete what the turn left open (Rule 2)."""
        texts, self._texts = self._texts, {}
        for open_texts in texts.values():
            for text in open_texts:
                await self._sink.emit(
                    ItemCompleted(
                        item_id=text.item_id,
                        turn_id=turn_id,
                        type="agentMessage",
                        text="".join(text.parts),
                        incomplete=True,
                    )
                )
        tools, self._tools = self._tools, {}
        for tool in tools.values():
            await self._sink.emit(
                _completed(tool, turn_id, status="interrupted" if interrupted else "incomplete")
            )


def _completed(
    started: ItemStarted, turn_id: str | None, *, status: str, output: BoundedPayload | None = None
) -> ItemCompleted:
    """The ``item.completed`` of a tool call: what its start said, and how it ended."""
    return ItemCompleted(
        item_id=started.item_id,
        turn_id=turn_id,
        type=started.type,
        name=started.name,
        input=started.input,
        input_truncated=started.input_truncated,
        output=output,
        status=status,
        parent_tool_use_id=started.parent_tool_use_id,
    )
