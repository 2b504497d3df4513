"""``acp_permissions``: an ACP permission request as an approval, and its answer."""

from __future__ import annotations

from typing import Any

from agentsd.providers.acp_permissions import (
    CANCELLED,
    Ask,
    permission_answer,
    read_permission,
)
from agentsd_protocol.api.events import ApprovalOption

OPTIONS = [
    {"optionId": "allow", "name": "Allow", "kind": "allow_once"},
    {"optionId": "always", "name": "Always allow", "kind": "allow_always"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]


def test_a_request_keeps_the_agents_option_ids_names_and_kinds() -> None:
    params: dict[str, Any] = {
        "sessionId": "s",
        "toolCall": {
            "toolCallId": "c1",
            "title": "Run ls",
            "kind": "execute",
            "rawInput": {"command": "ls"},
        },
        "options": OPTIONS,
    }
    ask = read_permission(params, "Agent")
    assert isinstance(ask, Ask)
    assert (ask.kind, ask.title, ask.item_id) == ("execute", "Run ls", "c1")
    assert ask.options == ["allow", "always", "reject"]
    assert ask.option_details[1] == ApprovalOption(
        option_id="always", name="Always allow", kind="allow_always"
    )
    assert ask.detail.splitlines() == [
        "allow (allow_once): Allow",
        "always (allow_always): Always allow",
        "reject (reject_once): Reject",
        'input: {"command":"ls"}',
    ]


def test_a_request_without_a_tool_call_is_still_asked_and_one_without_options_is_not() -> None:
    ask = read_permission({"options": OPTIONS[:1]}, "Agent")
    assert isinstance(ask, Ask)
    assert (ask.kind, ask.title, ask.item_id) == ("permission", "Agent asks for permission", None)
    assert read_permission({"options": []}, "Agent") == "it offers no options"
    assert read_permission({"options": [{"name": "no id"}]}, "Agent") == "it offers no options"


def test_a_decision_selects_its_option_and_anything_else_cancels() -> None:
    ids = ("allow", "reject")
    assert permission_answer(ids, "reject") == {
        "outcome": {"outcome": "selected", "optionId": "reject"}
    }
    assert permission_answer(ids, "cancel") == CANCELLED
