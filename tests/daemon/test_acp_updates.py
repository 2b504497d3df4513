"""``acp_updates``: ACP ``session/update`` payloads as journal events (sans-IO)."""

from __future__ import annotations

from typing import Any

import pytest

from agentsd.providers.acp_updates import MalformedUpdate, TurnItems
from agentsd_protocol.api.events import ItemCompleted, ItemStarted, kind_of


def chunk(text: str, kind: str = "agent_message_chunk", **extra: Any) -> dict[str, Any]:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}, **extra}


def test_a_run_of_chunks_is_one_item_and_a_new_kind_or_message_starts_another() -> None:
    items = TurnItems("t")
    assert [kind_of(e) for e in items.update(chunk("a"))] == ["item.started"]
    assert items.deltas == [("t-1", "a")]
    assert items.update(chunk("b")) == []
    (done, started) = items.update(chunk("hm", "agent_thought_chunk"))
    assert done == ItemCompleted(item_id="t-1", turn_id="t", type="agentMessage", text="ab")
    assert started == ItemStarted(item_id="t-2", turn_id="t", type="reasoning")
    (done, started) = items.update(chunk("x", messageId="m2"))
    assert isinstance(started, ItemStarted) and started.type == "agentMessage"
    assert items.update(chunk("y", messageId="m2")) == []
    (last,) = items.finish()
    assert isinstance(last, ItemCompleted) and last.text == "xy"


def test_an_update_of_an_unannounced_tool_call_announces_it_and_finish_marks_it_incomplete() -> (
    None
):
    items = TurnItems("t")
    (started,) = items.update(
        {"sessionUpdate": "tool_call_update", "toolCallId": "c", "title": "ls"}
    )
    assert started == ItemStarted(item_id="c", turn_id="t", type="toolCall", name="ls")
    assert items.update({"sessionUpdate": "tool_call_update", "toolCallId": "c"}) == []
    (done,) = items.finish()
    assert isinstance(done, ItemCompleted)
    assert done.incomplete is True and done.name == "ls"


def test_a_failed_tool_call_completes_with_its_text_content() -> None:
    items = TurnItems("t")
    items.update({"sessionUpdate": "tool_call", "toolCallId": "c", "status": "pending"})
    (done,) = items.update(
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "c",
            "status": "failed",
            "content": [{"type": "content", "content": {"type": "text", "text": "boom"}}],
        }
    )
    assert isinstance(done, ItemCompleted)
    assert done.status == "failed"
    assert done.output is not None and done.output.text == "boom"
    assert items.finish() == []


@pytest.mark.parametrize(
    "update",
    [
        None,
        {"content": {"type": "text", "text": "no kind"}},
        {"sessionUpdate": "agent_message_chunk"},
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text"}},
        {"sessionUpdate": "tool_call"},
        {"sessionUpdate": "plan", "entries": "x"},
    ],
)
def test_a_malformed_update_raises(update: Any) -> None:
    with pytest.raises(MalformedUpdate):
        TurnItems("t").update(update)


def test_kinds_it_does_not_translate_give_no_events() -> None:
    items = TurnItems("t")
    items.update(chunk("a"))
    assert items.update({"sessionUpdate": "usage_update", "used": 1}) == []
    assert items.update({"sessionUpdate": "available_commands_update"}) == []
