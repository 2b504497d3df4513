"""Claude Code's asking tools as daemon approvals: ``AskUserQuestion`` (one approval
per question, answered with a label) and ``ExitPlanMode`` (approve the plan, or
decline and keep planning). The translation is pure; ``Permissions`` is driven over
memory streams, reading the ``control_response`` it writes for the CLI."""

from __future__ import annotations

from typing import Any

import pytest
import trio.testing

from agentsd.providers.base import LineLink
from agentsd.providers.claude_permissions import Permissions
from agentsd.providers.claude_questions import (
    QuestionForm,
    parse_questions,
    plan_approval,
    plan_response,
)
from tests.recording_sink import RecordingSink

COLOUR = {
    "question": "Which colour do you like?",
    "header": "Colour",
    "options": [
        {"label": "Red", "description": "warm"},
        {"label": "Blue", "description": "cool"},
    ],
    "multiSelect": False,
}
SECTIONS = {
    "question": "Which sections should I include?",
    "header": "Sections",
    "options": [
        {"label": "Introduction", "description": "Opening context"},
        {"label": "Conclusion", "description": "Final summary"},
    ],
    "multiSelect": True,
}
PLAN = {"plan": "# Plan\n1. Do A\n2. Do B\n", "planFilePath": "/home/u/.claude/plans/x.md"}


# ---- the pure translation ------------------------------------------------------------


def test_a_question_is_asked_with_its_labels_and_decline() -> None:
    form = QuestionForm({"questions": [COLOUR]}, parse_questions({"questions": [COLOUR]}))
    ask = form.ask()
    assert ask.kind == "question"
    assert ask.title == "Colour: Which colour do you like?"
    assert ask.options == ["Red", "Blue", "decline"]
    assert ask.detail.splitlines() == ["Red: warm", "Blue: cool"]


def test_the_chosen_label_is_returned_as_the_answers_claude_code_expects() -> None:
    tool_input = {"questions": [COLOUR]}
    form = QuestionForm(tool_input, parse_questions(tool_input))
    assert form.answer("Blue") == {
        "behavior": "allow",
        "updatedInput": {
            "questions": [COLOUR],
            "answers": {"Which colour do you like?": "Blue"},
        },
    }


def test_several_questions_are_asked_one_after_another() -> None:
    tool_input = {"questions": [COLOUR, SECTIONS]}
    form = QuestionForm(tool_input, parse_questions(tool_input))
    first = form.ask()
    assert first.title == "Colour: Which colour do you like? (1 of 2)"
    assert form.answer("Red") is None  # another question follows
    assert form.number == 2
    second = form.ask()
    assert second.title.startswith("Sections: Which sections should I include? (2 of 2)")
    assert second.options == ["Introduction", "Conclusion", "decline"]
    assert "one" in second.detail.splitlines()[-1]  # a multiSelect takes one label here
    response = form.answer("Conclusion")
    assert response is not None
    assert response["updatedInput"]["answers"] == {
        "Which colour do you like?": "Red",
        "Which sections should I include?": "Conclusion",
    }


@pytest.mark.parametrize("decision", ["decline", "cancel"])
def test_declining_any_question_refuses_the_whole_call(decision: str) -> None:
    tool_input = {"questions": [COLOUR, SECTIONS]}
    form = QuestionForm(tool_input, parse_questions(tool_input))
    assert form.answer("Red") is None
    response = form.answer(decision)
    assert response is not None
    assert response["behavior"] == "deny"
    assert "answer" in response["message"]


def test_a_label_named_like_decline_is_an_answer_and_cancel_still_declines() -> None:
    question = {**COLOUR, "options": [{"label": "decline"}, {"label": "accept"}]}
    tool_input = {"questions": [question]}
    form = QuestionForm(tool_input, parse_questions(tool_input))
    assert form.ask().options == ["decline", "accept"]
    response = form.answer("decline")
    assert response is not None and response["behavior"] == "allow"
    assert response["updatedInput"]["answers"] == {"Which colour do you like?": "decline"}
    form = QuestionForm(tool_input, parse_questions(tool_input))
    cancelled = form.answer("cancel")
    assert cancelled is not None and cancelled["behavior"] == "deny"


def test_a_question_without_options_can_be_skipped_or_declined() -> None:
    free = {"question": "What should the file be called?", "header": "Name", "kind": "text"}
    tool_input = {"questions": [free, COLOUR]}
    form = QuestionForm(tool_input, parse_questions(tool_input))
    ask = form.ask()
    assert ask.options == ["skip", "decline"]
    assert "message" in ask.detail  # the answer can follow as a message
    assert form.answer("skip") is None
    response = form.answer("Red")
    assert response is not None
    assert response["updatedInput"]["answers"] == {"Which colour do you like?": "Red"}


def test_duplicate_labels_are_offered_once_and_unusable_input_has_no_questions() -> None:
    twice = {"question": "Pick", "options": [{"label": "A"}, {"label": "A"}, {"label": "B"}]}
    form = QuestionForm({"questions": [twice]}, parse_questions({"questions": [twice]}))
    assert form.ask().options == ["A", "B", "decline"]
    assert form.ask().title == "Pick"
    assert parse_questions({}) == []
    assert parse_questions({"questions": "what?"}) == []
    assert parse_questions({"questions": [{"header": "no text"}, 3]}) == []


def test_a_plan_is_shown_whole_and_approved_or_declined() -> None:
    ask = plan_approval(PLAN)
    assert ask.kind == "plan"
    assert ask.detail == PLAN["plan"]
    assert ask.options == ["approve", "decline"]
    assert "plan mode" in ask.title
    assert plan_response("approve", PLAN) == {"behavior": "allow", "updatedInput": PLAN}
    declined = plan_response("decline", PLAN)
    assert declined["behavior"] == "deny"
    assert "keep planning" in declined["message"]
    assert plan_response("cancel", PLAN)["behavior"] == "deny"
    # A plan kept in a file only, or none at all, still asks.
    assert plan_approval({"planFilePath": "/p.md"}).detail == "/p.md"
    assert plan_approval({}).detail


# ---- Permissions: the CLI's requests, answered over a link -----------------------------


def ask_frame(request_id: str, tool_name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "control_request",
        "request_id": request_id,
        "request": {
            "subtype": "can_use_tool",
            "tool_name": tool_name,
            "input": tool_input,
            "tool_use_id": "toolu_1",
            "requires_user_interaction": True,
        },
    }


class CliSide:
    """What ``Permissions`` wrote for the CLI, read back frame by frame."""

    def __init__(self) -> None:
        self.send, receive = trio.testing.memory_stream_one_way_pair()
        self.link = LineLink(self.send, receive)

    async def answer(self, request_id: str) -> dict[str, Any]:
        """The next ``control_response``, which must answer ``request_id``."""
        frame = await self.link.receive()
        assert frame is not None and frame["type"] == "control_response", frame
        response: dict[str, Any] = frame["response"]
        assert response["request_id"] == request_id
        assert response["subtype"] == "success"
        inner: dict[str, Any] = response["response"]
        return inner

    async def nothing_more(self) -> None:
        await self.send.aclose()
        assert await self.link.receive() is None


def permissions() -> tuple[Permissions, RecordingSink, CliSide]:
    sink = RecordingSink()
    cli = CliSide()
    return Permissions(cli.link, sink), sink, cli


async def test_questions_become_approvals_in_turn_and_their_answers_reach_the_cli() -> None:
    perms, sink, cli = permissions()
    await perms.on_request(ask_frame("r1", "AskUserQuestion", {"questions": [COLOUR, SECTIONS]}))
    assert sink.approval_fields("nativeId", "kind", "title", "options") == [
        {
            "nativeId": "r1",
            "kind": "question",
            "title": "Colour: Which colour do you like? (1 of 2)",
            "options": ["Red", "Blue", "decline"],
        }
    ]
    await perms.answer("r1", "Blue")
    assert [a["nativeId"] for a in sink.approvals] == ["r1", "r1#2"]
    assert sink.approvals[1]["options"] == ["Introduction", "Conclusion", "decline"]
    await perms.answer("r1", "Red")  # that question was answered: nothing happens
    await perms.answer("r1#2", "Introduction")
    response = await cli.answer("r1")
    assert response["behavior"] == "allow"
    assert response["updatedInput"]["answers"] == {
        "Which colour do you like?": "Blue",
        "Which sections should I include?": "Introduction",
    }
    await perms.answer("r1#2", "Conclusion")  # Rule 2: answered at most once
    await cli.nothing_more()


async def test_declining_a_question_refuses_the_call() -> None:
    perms, _, cli = permissions()
    await perms.on_request(ask_frame("r1", "AskUserQuestion", {"questions": [COLOUR]}))
    await perms.answer("r1", "decline")
    response = await cli.answer("r1")
    assert response["behavior"] == "deny"
    await cli.nothing_more()


async def test_the_cli_withdrawing_a_question_cancels_the_one_asked_now() -> None:
    perms, sink, cli = permissions()
    await perms.on_request(ask_frame("r1", "AskUserQuestion", {"questions": [COLOUR, SECTIONS]}))
    await perms.answer("r1", "Red")
    await perms.on_cancel({"type": "control_cancel_request", "request_id": "r1"})
    assert sink.cancelled == ["r1#2"]
    await perms.answer("r1#2", "Conclusion")  # too late: the CLI withdrew it
    await cli.nothing_more()


async def test_a_question_that_cannot_be_recorded_is_refused_at_once() -> None:
    perms, sink, cli = permissions()
    await perms.on_request(ask_frame("r1", "AskUserQuestion", {"questions": [COLOUR, SECTIONS]}))
    sink.refuse_approvals = True
    await perms.answer("r1", "Red")  # the second question cannot be recorded
    response = await cli.answer("r1")
    assert response["behavior"] == "deny"
    assert "could not record" in response["message"]
    await cli.nothing_more()


async def test_exit_plan_mode_becomes_a_plan_approval() -> None:
    perms, sink, cli = permissions()
    await perms.on_request(ask_frame("p1", "ExitPlanMode", PLAN))
    assert sink.approval_fields("nativeId", "kind", "title", "options") == [
        {
            "nativeId": "p1",
            "kind": "plan",
            "title": plan_approval(PLAN).title,
            "options": ["approve", "decline"],
        }
    ]
    await perms.answer("p1", "approve")
    assert await cli.answer("p1") == {"behavior": "allow", "updatedInput": PLAN}
    # Claude Code left plan mode: the session's next start must not go back to it.
    assert sink.option_changes == [{"permissionMode": "default"}]
    await perms.on_request(ask_frame("p2", "ExitPlanMode", PLAN))
    await perms.answer("p2", "decline")
    declined = await cli.answer("p2")
    assert declined["behavior"] == "deny" and "keep planning" in declined["message"]
    assert len(sink.option_changes) == 1  # still planning: nothing changed
    await cli.nothing_more()


async def test_other_tools_are_still_allowed_or_denied() -> None:
    perms, sink, cli = permissions()
    await perms.on_request(ask_frame("t1", "Bash", {"command": "rm -rf build"}))
    assert sink.approvals[0]["kind"] == "tool"
    assert sink.approvals[0]["options"] == ["allow", "deny"]
    await perms.answer("t1", "allow")
    assert await cli.answer("t1") == {
        "behavior": "allow",
        "updatedInput": {"command": "rm -rf build"},
    }
    # An AskUserQuestion without usable questions is asked about like any tool.
    await perms.on_request(ask_frame("t2", "AskUserQuestion", {"questions": []}))
    assert sink.approvals[1]["kind"] == "tool"
