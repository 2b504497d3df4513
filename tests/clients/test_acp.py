"""The ACP bridge: the pure translation (journal -> session/update, prompts -> stop
reasons), the JSON-RPC peer over memory streams, the bridge in-process against a
real ``agentsd``, and ``agentsctl acp`` driven by the official ACP TypeScript SDK.

The SDK tests need ``node`` and ``npm ci --prefix tests/clients/acp_client``; without
them they skip, except under CI (``$CI`` set), where a missing piece fails."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as hs

from agentsctl.acp import schema as acp
from agentsctl.acp.bridge import BridgeConfig
from agentsctl.acp.peer import AcpError, Peer, Received
from agentsctl.acp.stdio import serve_acp
from agentsctl.acp.turns import (
    ApprovalClosed,
    ApprovalOpened,
    Finished,
    Interrupt,
    TurnTracker,
)
from agentsctl.acp.updates import UpdateTranslator
from agentsctl.async_client import open_client
from agentsctl.async_client.follow import Watch
from agentsctl.client import Client
from agentsd_protocol import methods
from agentsd_protocol.api.conversation import RespondParams, SendParams
from agentsd_protocol.api.events import ApprovalRequested
from agentsd_protocol.api.session import GetParams
from agentsd_protocol.api.stream import DeltaNotification, JournalEvent
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon

TEST_TIMEOUT_S = 60.0  # each test's outer bound; steps take milliseconds, bridges ~0.5 s
ACP_CLIENT = Path(__file__).parent / "acp_client"
DRIVER = ACP_CLIENT / "driver.mjs"
SDK_PACKAGE = ACP_CLIENT / "node_modules" / "@agentclientprotocol" / "sdk" / "package.json"
DRIVER_TIMEOUT_S = 120.0  # a scenario runs ~5 s; the machine is shared


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    """One real agentsd for this module's tests (each makes its own sessions)."""
    with running_daemon() as process:
        yield process


# -- journal -> session/update -------------------------------------------------------

_seqs = iter(range(1, 1_000_000))


def ev(event_kind: str, **body: Any) -> JournalEvent:
    """A journal event as the daemon sends it: ``body`` by its wire names."""
    return JournalEvent(
        seq=next(_seqs),
        ts=0.0,
        fence=1,
        kind=event_kind,
        body=msgspec.Raw(msgspec.json.encode(body)),
    )


def asked(**fields: Any) -> JournalEvent:
    """An ``approval.requested``; what a test leaves out is a command with no words."""
    return ev(
        "approval.requested",
        **{
            "nativeId": "n",
            "approvalKind": "command",
            "title": "",
            "detail": "",
            "options": ["accept", "decline"],
            **fields,
        },
    )


def delta(item_id: str, offset: int, text: str) -> DeltaNotification:
    return DeltaNotification(
        subscription_id="sub",
        session_id="s",
        item_id=item_id,
        offset=offset,
        text=text,
        after_seq=0,
    )


def wire(updates: list[acp.SessionUpdate]) -> list[dict[str, Any]]:
    """The updates as the editor receives them."""
    out: list[dict[str, Any]] = msgspec.json.decode(msgspec.json.encode(updates))
    return out


def test_a_submission_is_a_user_message_unless_this_bridge_sent_it() -> None:
    translator = UpdateTranslator()
    translator.own_operations.add("op-mine")
    other = ev("submission", clientMessageId="m1", text="from the CLI")
    mine = ev("submission", clientMessageId="m2", text="typed here", operationId="op-mine")
    assert wire(translator.event(other)) == [
        {
            "sessionUpdate": "user_message_chunk",
            "content": {"type": "text", "text": "from the CLI"},
            "messageId": "m1",
        }
    ]
    assert translator.event(mine) == []


def test_a_superseded_conversation_and_an_agents_last_words_are_shown_as_notes() -> None:
    """Notes from agentsd, set apart as thoughts; an exit on request says nothing."""
    translator = UpdateTranslator()
    superseded = ev("thread.superseded", previousHandle="th-1", handle="th-2", reason="never saved")
    crashed = ev("child.exited", cause="unexpected", returncode=1, stderrTail="panic: boom\n")
    closed = ev("child.exited", cause="requested", returncode=0)
    notes = [wire(translator.event(e)) for e in (superseded, crashed, closed)]
    assert [[(u["sessionUpdate"], u["content"]["text"]) for u in n] for n in notes] == [
        [("agent_thought_chunk", "A new conversation (th-2) took the place of th-1: never saved")],
        [("agent_thought_chunk", "The agent exited; its stderr ends:\npanic: boom\n")],
        [],
    ]


def test_a_continuation_is_a_note_and_imported_history_is_the_conversation() -> None:
    """The daemon's request to carry on is not the user's text; a conversation the
    session adopted replays as the user's and the agent's messages."""
    translator = UpdateTranslator()
    carry_on = ev(
        "submission", clientMessageId="m9", text="Continue where you left off.", continuesSeq=41
    )
    imported = [
        ev("message.imported", role="user", text="fix the bug"),
        ev("message.imported", role="assistant", text="Fixed it.", turnId="t0"),
    ]
    [[note], [user], [agent]] = [wire(translator.event(e)) for e in (carry_on, *imported)]
    assert note["sessionUpdate"] == "agent_thought_chunk"
    assert "carry on" in note["content"]["text"] and "#41" in note["content"]["text"]
    assert "Continue where you left off" not in note["content"]["text"]
    assert (user["sessionUpdate"], user["content"]["text"]) == ("user_message_chunk", "fix the bug")
    assert (agent["sessionUpdate"], agent["content"]["text"]) == (
        "agent_message_chunk",
        "Fixed it.",
    )
    assert user["messageId"] != agent["messageId"]


@settings(max_examples=100, deadline=None)  # a shared machine; no per-example deadline
@given(
    text=hs.text(min_size=1, max_size=60),
    cuts=hs.lists(hs.integers(min_value=1, max_value=59), max_size=12),
    delivered=hs.lists(hs.booleans(), min_size=14, max_size=14),
    snapshots=hs.lists(hs.booleans(), min_size=14, max_size=14),
)
def test_message_text_reaches_the_editor_exactly_once_in_order(
    text: str, cuts: list[int], delivered: list[bool], snapshots: list[bool]
) -> None:
    """Whatever deltas are lost and wherever snapshots fall, what was sent is always
    a prefix of the text, and after item.completed it is the whole text (Rule 1)."""
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    pieces = [(a, text[a:b]) for a, b in itertools.pairwise(bounds)]
    translator = UpdateTranslator()
    sent = ""
    translator.event(ev("item.started", itemId="i", turnId="t", type="agentMessage"))
    for index, (offset, piece) in enumerate(pieces):
        updates: list[acp.SessionUpdate] = []
        if delivered[index % 14]:
            updates += translator.delta(delta("i", offset, piece))
            updates += translator.delta(delta("i", offset, piece))  # a duplicate
        if snapshots[index % 14]:
            snapshot = text[: offset + len(piece)]
            updates += translator.event(ev("item.updated", itemId="i", text=snapshot))
        for update in updates:
            assert isinstance(update, acp.AgentMessageChunk)
            assert update.message_id == "i"
            sent += update.content.text
        assert text.startswith(sent)
    final = translator.event(ev("item.completed", itemId="i", type="agentMessage", text=text))
    sent += "".join(u.content.text for u in final if isinstance(u, acp.AgentMessageChunk))
    assert sent == text


def test_reasoning_is_a_thought_chunk() -> None:
    translator = UpdateTranslator()
    translator.event(ev("item.started", itemId="r", turnId="t", type="reasoning"))
    assert wire(translator.delta(delta("r", 0, "hmm"))) == [
        {
            "sessionUpdate": "agent_thought_chunk",
            "content": {"type": "text", "text": "hmm"},
            "messageId": "r",
        }
    ]


def test_a_tool_item_is_announced_once_then_updated() -> None:
    translator = UpdateTranslator(cwd="/w")
    started = ev(
        "item.started", itemId="c1", turnId="t", type="commandExecution", command="ls -la", cwd="/w"
    )
    assert wire(translator.event(started)) == [
        {
            "sessionUpdate": "tool_call",
            "toolCallId": "c1",
            "title": "ls -la",
            "kind": "execute",
            "status": "in_progress",
            "rawInput": {"command": "ls -la", "cwd": "/w"},
        }
    ]
    output = {"text": "a\nb", "byteLength": 3, "truncated": False}
    done = ev(
        "item.completed",
        itemId="c1",
        turnId="t",
        type="commandExecution",
        command="ls -la",
        cwd="/w",
        status="completed",
        exitCode=0,
        output=output,
    )
    assert wire(translator.event(done)) == [
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "c1",
            "status": "completed",
            "content": [{"type": "content", "content": {"type": "text", "text": "a\nb"}}],
            "rawOutput": {"status": "completed", "exitCode": 0, "output": "a\nb"},
        }
    ]


@pytest.mark.parametrize("status", ["interrupted", "incomplete", "declined", "failed"])
def test_a_tool_that_did_not_run_to_the_end_is_failed(status: str) -> None:
    """Claude reports a tool cut short by an interrupt as ``interrupted`` or
    ``incomplete``: the editor must not show it as completed."""
    translator = UpdateTranslator()
    translator.event(ev("item.started", itemId="c1", turnId="t", type="commandExecution"))
    done = ev("item.completed", itemId="c1", turnId="t", type="commandExecution", status=status)
    (update,) = wire(translator.event(done))
    assert (update["toolCallId"], update["status"]) == ("c1", "failed")


def test_a_tool_item_seen_only_completed_is_one_tool_call_with_its_status() -> None:
    translator = UpdateTranslator()
    body = {"name": "shell", "input": {"command": "rm -rf /"}, "status": "declined"}
    [update] = translator.event(ev("item.completed", itemId="x", type="toolCall", **body))
    assert isinstance(update, acp.ToolCall)
    assert (update.title, update.kind, update.status) == ("rm -rf /", "execute", "failed")


def test_an_unfinished_tool_call_fails_when_its_turn_is_interrupted() -> None:
    translator = UpdateTranslator()
    translator.event(ev("item.started", itemId="c", turnId="t1", type="fileChange"))
    updates = translator.event(ev("turn.completed", turnId="t1", outcome="interrupted"))
    assert wire(updates) == [
        {"sessionUpdate": "tool_call_update", "toolCallId": "c", "status": "failed"}
    ]


def test_an_approval_is_a_tool_call_resolved_by_its_decision() -> None:
    translator = UpdateTranslator()
    requested = asked(
        approvalId="ap-1",
        nativeId="r1",
        approvalKind="command",
        title="Run `ls`",
        detail="wants to list",
        options=["accept", "decline"],
    )
    [announced] = wire(translator.event(requested))
    assert announced["toolCallId"] == "ap-1"
    assert (announced["kind"], announced["status"]) == ("execute", "pending")
    resolved = translator.event(
        ev("approval.resolved", approvalId="ap-1", decision="decline", by="client")
    )
    assert wire(resolved) == [
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "ap-1",
            "status": "failed",
            "rawOutput": {"decision": "decline", "by": "client"},
        }
    ]
    unknown = ev("approval.resolved", approvalId="ap-0", decision="accept", by="client")
    assert translator.event(unknown) == []


@pytest.mark.parametrize(("decision", "status"), [("go", "completed"), ("abort", "failed")])
def test_an_acp_agents_option_allows_when_its_kind_says_so(decision: str, status: str) -> None:
    translator = UpdateTranslator()
    details = [
        {"optionId": "go", "name": "Proceed", "kind": "allow_once"},
        {"optionId": "abort", "name": "Stop", "kind": "reject_once"},
    ]
    requested = asked(
        approvalId="ap-1",
        nativeId="r1",
        approvalKind="execute",
        title="Run `ls`",
        detail="",
        options=["go", "abort"],
        optionDetails=details,
    )
    translator.event(requested)
    resolved = translator.event(
        ev("approval.resolved", approvalId="ap-1", decision=decision, by="client")
    )
    assert [u["status"] for u in wire(resolved)] == [status]


def tool_calls(updates: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each tool call the editor was shown, by id: every status it went through.
    Asserts ACP's shape: announced once, updated only once announced."""
    statuses: dict[str, list[str]] = {}
    for update in updates:
        tool_call_id: str = update.get("toolCallId", "")
        if update["sessionUpdate"] == "tool_call":
            assert tool_call_id not in statuses, f"{tool_call_id} announced twice"
            statuses[tool_call_id] = [update["status"]]
        elif update["sessionUpdate"] == "tool_call_update":
            assert tool_call_id in statuses, f"{tool_call_id} updated before it was announced"
            if "status" in update:
                statuses[tool_call_id].append(update["status"])
    return statuses


def test_an_approval_naming_its_item_is_that_items_tool_call() -> None:
    """Rule 4, the approval first (the mock, Codex): one tool call, pending while it
    is asked about, then what the agent reports; the permission request names it."""
    translator = UpdateTranslator()
    requested = asked(
        approvalId="ap-1-r1",
        itemId="t1-tool",
        approvalKind="command",
        title="Run `ls -la`",
        options=["accept", "decline"],
    )
    stream = [
        ev("turn.started", turnId="t1"),
        requested,
        ev("approval.resolved", approvalId="ap-1-r1", decision="accept", by="client"),
        ev(
            "item.completed",
            itemId="t1-tool",
            turnId="t1",
            type="toolCall",
            name="shell",
            input={"command": "ls -la"},
            status="completed",
        ),
        ev("turn.completed", turnId="t1", outcome="completed"),
    ]
    updates = wire([u for event in stream for u in translator.event(event)])
    assert tool_calls(updates) == {"t1-tool": ["pending", "in_progress", "completed"]}
    assert updates[0]["title"] == "Run `ls -la`"
    assert (updates[-1]["kind"], updates[-1]["rawInput"]) == ("execute", {"command": "ls -la"})
    event = requested.event()
    assert isinstance(event, ApprovalRequested)
    assert translator.permission_tool_call(event).tool_call_id == "t1-tool"


def test_a_tool_announced_before_its_approval_waits_pending_then_runs() -> None:
    """Rule 4, the tool first (Claude Code): the approval turns it back to pending."""
    translator = UpdateTranslator()
    tool = {"itemId": "toolu_1", "turnId": "t1", "type": "toolCall", "name": "Bash"}
    stream = [
        ev("item.started", **tool, input={"command": "echo hi > hi.txt"}),
        asked(approvalId="ap-1-3", itemId="toolu_1", approvalKind="tool", title="B"),
        ev("approval.resolved", approvalId="ap-1-3", decision="allow", by="client"),
        ev("item.completed", **tool, status="completed", text="done"),
    ]
    updates = wire([u for event in stream for u in translator.event(event)])
    assert tool_calls(updates) == {
        "toolu_1": ["in_progress", "pending", "in_progress", "completed"]
    }


@pytest.mark.parametrize("reported", [True, False], ids=["reported", "never-reported"])
def test_a_refused_tool_call_ends_failed_and_stays_failed(reported: bool) -> None:
    """Refused (here by the turn's end), whether or not the agent reports the tool
    afterwards: failed, never completed by the turn that goes on, never pending."""
    translator = UpdateTranslator()
    stream = [
        ev("turn.started", turnId="t1"),
        asked(approvalId="ap-1-0", itemId="c1", approvalKind="command"),
        ev("approval.resolved", approvalId="ap-1-0", decision="cancelled", by="daemon"),
    ]
    if reported:
        stream.append(ev("item.completed", itemId="c1", type="commandExecution", status="x"))
    stream.append(ev("turn.completed", turnId="t1", outcome="completed"))
    updates = wire([u for event in stream for u in translator.event(event)])
    statuses = tool_calls(updates)
    assert list(statuses) == ["c1"]
    assert statuses["c1"][0] == "pending" and set(statuses["c1"][1:]) == {"failed"}


def test_the_replay_and_the_live_stream_show_the_same_messages() -> None:
    """Rule 2: live (deltas, some lost, and snapshots) and replay (snapshots only)."""
    live, replay = UpdateTranslator(), UpdateTranslator()
    stream: list[JournalEvent | DeltaNotification] = [
        ev("item.started", itemId="m", turnId="t", type="agentMessage"),
        delta("m", 0, "Hel"),
        delta("m", 3, "lo "),
        ev("item.updated", itemId="m", text="Hello "),
        delta("m", 9, "ld"),  # a hole before it: dropped
        ev("item.updated", itemId="m", text="Hello world"),
        delta("m", 11, "!"),
        ev("item.completed", itemId="m", turnId="t", type="agentMessage", text="Hello world!"),
    ]

    def text(
        translator: UpdateTranslator, items: Sequence[JournalEvent | DeltaNotification]
    ) -> str:
        out = []
        for item in items:
            if isinstance(item, DeltaNotification):
                updates = translator.delta(item)
            else:
                updates = translator.event(item)
            out += [u.content.text for u in updates if isinstance(u, acp.AgentMessageChunk)]
        return "".join(out)

    journal = [i for i in stream if isinstance(i, JournalEvent)]
    assert text(live, stream) == text(replay, journal) == "Hello world!"


# -- prompts -> stop reasons ---------------------------------------------------------


def _finished(actions: list[Any]) -> list[Finished]:
    return [a for a in actions if isinstance(a, Finished)]


def test_a_prompt_ends_with_the_turn_its_dispatch_names() -> None:
    tracker = TurnTracker()
    prompt = tracker.add("op")
    assert tracker.event(ev("submission", clientMessageId="m", text="hi", operationId="op")) == []
    tracker.event(ev("turn.started", turnId="t1"))
    tracker.event(ev("submission.dispatched", clientMessageId="m", outcome="accepted", turnId="t1"))
    assert tracker.event(ev("turn.completed", turnId="t0", outcome="completed")) == []
    [done] = _finished(tracker.event(ev("turn.completed", turnId="t1", outcome="completed")))
    assert done.prompt is prompt and prompt.stop_reason == "end_turn"
    assert tracker.prompts == {}


def test_a_prompt_dispatched_between_turns_belongs_to_the_next_one() -> None:
    tracker = TurnTracker()
    prompt = tracker.add("op")
    tracker.event(ev("submission", clientMessageId="m", text="hi", operationId="op"))
    tracker.event(ev("submission.dispatched", clientMessageId="m", outcome="accepted"))
    tracker.event(ev("turn.started", turnId="t2"))
    tracker.event(ev("turn.completed", turnId="t2", outcome="interrupted"))
    assert prompt.stop_reason == "cancelled"


def test_a_prompt_that_steers_ends_with_the_running_turn() -> None:
    tracker = TurnTracker()
    tracker.event(ev("turn.started", turnId="t1"))
    prompt = tracker.add("op")
    tracker.event(ev("submission", clientMessageId="m", text="also", operationId="op"))
    tracker.event(ev("submission.dispatched", clientMessageId="m", outcome="accepted"))
    tracker.event(ev("turn.completed", turnId="t1", outcome="completed"))
    assert prompt.stop_reason == "end_turn"


def test_a_dispatch_naming_a_turn_already_over_ends_the_prompt_at_once() -> None:
    tracker = TurnTracker()
    tracker.event(ev("turn.started", turnId="t1"))
    prompt = tracker.add("op")
    tracker.event(ev("submission", clientMessageId="m", text="also", operationId="op"))
    tracker.event(ev("turn.completed", turnId="t1", outcome="completed"))
    actions = tracker.event(
        ev("submission.dispatched", clientMessageId="m", outcome="accepted", turnId="t1")
    )
    assert _finished(actions) and prompt.stop_reason == "end_turn"


def test_a_refused_prompt_is_a_refusal_and_an_unknown_one_an_error() -> None:
    tracker = TurnTracker()
    refused, unknown = tracker.add("op1"), tracker.add("op2")
    tracker.event(ev("submission", clientMessageId="m1", text="a", operationId="op1"))
    tracker.event(ev("submission", clientMessageId="m2", text="b", operationId="op2"))
    tracker.event(
        ev("submission.dispatched", clientMessageId="m1", outcome="rejected", reason="not running")
    )
    tracker.event(ev("submission.dispatched", clientMessageId="m2", outcome="unknown"))
    assert (refused.stop_reason, refused.reason) == ("refusal", "not running")
    assert unknown.failure is not None and unknown.failure.kind == "dispatch_unknown"


def test_failed_and_unknown_turns_are_errors() -> None:
    tracker = TurnTracker()
    failed, unknown = tracker.add("op1"), tracker.add("op2")
    for op, message, turn in (("op1", "m1", "t1"), ("op2", "m2", "t2")):
        tracker.event(ev("submission", clientMessageId=message, text="x", operationId=op))
        tracker.event(ev("turn.started", turnId=turn))
        tracker.event(ev("submission.dispatched", clientMessageId=message, outcome="accepted"))
        outcome = "failed" if op == "op1" else "unknown"
        tracker.event(ev("turn.completed", turnId=turn, outcome=outcome, reason="unexpected"))
    assert failed.failure is not None and failed.failure.kind == "turn_failed"
    assert unknown.failure is not None and "unexpected" in unknown.failure.message


def test_a_cancel_before_the_turn_starts_interrupts_it_when_it_does() -> None:
    tracker = TurnTracker()
    prompt = tracker.add("op")
    assert tracker.cancel() == [Interrupt(None)]
    tracker.event(ev("submission", clientMessageId="m", text="hi", operationId="op"))
    tracker.event(ev("submission.dispatched", clientMessageId="m", outcome="accepted"))
    assert tracker.event(ev("turn.started", turnId="t1")) == [Interrupt("t1")]
    tracker.event(ev("turn.completed", turnId="t1", outcome="completed"))
    assert prompt.stop_reason == "cancelled", "ACP: cancelled once cancel was asked"


def test_a_cancel_applies_to_the_prompts_sent_before_it_only() -> None:
    tracker = TurnTracker()
    earlier, later = tracker.add("op1", arrival=1), tracker.add("op2", arrival=3)
    tracker.cancel(before=2)
    assert (earlier.cancel_requested, later.cancel_requested) == (True, False)


def test_the_agent_exiting_fails_prompts_and_closes_approvals() -> None:
    tracker = TurnTracker()
    prompt = tracker.add("op")
    tracker.event(ev("submission", clientMessageId="m", text="hi", operationId="op"))
    opened = tracker.event(asked(approvalId="ap", options=["accept"]))
    assert [type(a) for a in opened] == [ApprovalOpened]
    actions = tracker.event(ev("child.exited", cause="unexpected"))
    assert ApprovalClosed("ap", "cancelled", "daemon") in actions
    assert prompt.failure is not None and prompt.failure.kind == "agent_exited"
    assert tracker.approvals == {}


def test_other_clients_prompts_are_not_ours() -> None:
    tracker = TurnTracker()
    prompt = tracker.add("op")
    tracker.event(ev("submission", clientMessageId="x", text="cli", operationId="other"))
    tracker.event(ev("turn.started", turnId="t1"))
    tracker.event(ev("submission.dispatched", clientMessageId="x", outcome="accepted"))
    assert tracker.event(ev("turn.completed", turnId="t1", outcome="completed")) == []
    assert not prompt.finished


# -- ACP types ---------------------------------------------------------------------


def test_prompt_content_becomes_text_and_images() -> None:
    blocks = msgspec.json.decode(
        json.dumps(
            [
                {"type": "text", "text": "look at"},
                {"type": "resource_link", "uri": "file:///a.py", "name": "a.py"},
                {"type": "resource", "resource": {"uri": "file:///b.py", "text": "x = 1"}},
                {"type": "resource", "resource": {"uri": "file:///c.png", "blob": "AA=="}},
                {"type": "image", "data": "R0lG", "mimeType": "image/gif"},
            ]
        ),
        type=list[acp.ContentBlock],
    )
    prompt = acp.daemon_prompt(blocks)
    assert prompt.text == (
        'look at\n[a.py](file:///a.py)\n<context uri="file:///b.py">\nx = 1\n</context>\n'
        "<file:///c.png>"
    )
    assert prompt.images == [("R0lG", "image/gif")]
    audio = acp.AudioBlock(data="AA==", mime_type="audio/wav")
    with pytest.raises(acp.UnsupportedContent):
        acp.daemon_prompt([audio])


@pytest.mark.parametrize(
    ("decision", "name", "kind"),
    [
        ("accept", "Accept", "allow_once"),
        ("acceptForSession", "Accept for session", "allow_always"),
        ("decline", "Decline", "reject_once"),
        ("cancel", "Cancel", "reject_once"),
    ],
)
def test_daemon_decisions_are_permission_options(decision: str, name: str, kind: str) -> None:
    option = acp.permission_option(decision)
    assert (option.option_id, option.name, option.kind) == (decision, name, kind)


@pytest.mark.parametrize(
    ("decision", "kind"),
    [
        ("rejectAlways", "reject_always"),
        ("deny_once", "reject_once"),
        ("Node.js", "allow_once"),  # a word that merely starts like "no"
        ("nothing", "allow_once"),
    ],
)
def test_only_a_refusing_first_word_makes_a_reject_option(decision: str, kind: str) -> None:
    assert acp.permission_option(decision).kind == kind


@pytest.mark.parametrize(
    ("label", "kind"),
    [
        ("PostgreSQL", "allow_once"),
        ("Use Redis", "allow_once"),
        ("No tests", "allow_once"),  # an answer, not a refusal
        ("decline", "reject_once"),
        ("cancel", "reject_once"),
    ],
)
def test_the_answers_to_a_question_are_shown_as_the_agent_wrote_them(label: str, kind: str) -> None:
    option = acp.permission_option(label, "question")
    assert (option.option_id, option.name, option.kind) == (label, label, kind)


def test_an_option_an_acp_agent_described_keeps_its_name_and_kind() -> None:
    option = acp.permission_option(
        "abort", "execute", agent_name="No, and tell Codex", agent_kind="reject_once"
    )
    assert (option.option_id, option.name, option.kind) == (
        "abort",
        "No, and tell Codex",
        "reject_once",
    )
    # A kind ACP does not have is read from the words, as for any decision.
    assert acp.permission_option("rejectAlways", agent_kind="maybe").kind == "reject_always"


def test_a_plan_approval_is_a_mode_switch() -> None:
    assert acp.tool_kind("plan") == "switch_mode"


def test_inbound_params_accept_unknown_fields() -> None:
    raw = b'{"sessionId":"s","prompt":[{"type":"text","text":"hi","_meta":{}}],"_meta":{"x":1}}'
    assert msgspec.json.decode(raw, type=acp.PromptParams).session_id == "s"


# -- the JSON-RPC peer ---------------------------------------------------------------


Handler = Callable[[Received], Awaitable[Any]]


class Wire:
    """The other end of a ``Peer``: raw newline-delimited JSON."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._buf = b""

    async def send(self, message: Any) -> None:
        raw = message if isinstance(message, bytes) else json.dumps(message).encode()
        await self.stream.send_all(raw + b"\n")

    async def recv(self) -> dict[str, Any]:
        while b"\n" not in self._buf:
            data = await self.stream.receive_some(65536)
            assert data, "the peer closed its end"
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message


@asynccontextmanager
async def peer_and_wire(on_request: Handler) -> AsyncIterator[tuple[Peer, Wire]]:
    ours, theirs = trio.testing.memory_stream_pair()

    async def ignore(received: Received) -> None:
        pass

    peer = Peer(ours, ours, on_request=on_request, on_notification=ignore)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.serve)
        yield peer, Wire(theirs)
        await theirs.aclose()


async def test_the_peer_answers_cancels_and_survives_garbage() -> None:
    release = trio.Event()

    async def on_request(received: Received) -> Any:
        method = received.method
        if method == "slow":
            await release.wait()
        if method == "fail":
            raise AcpError(-32002, "no such thing", {"kind": "x"})
        if method == "crash":
            raise RuntimeError("boom")
        return {"echo": method}

    with trio.fail_after(TEST_TIMEOUT_S):
        async with peer_and_wire(on_request) as (_, wire):
            await wire.send({"jsonrpc": "2.0", "id": 1, "method": "slow"})
            await wire.send({"jsonrpc": "2.0", "id": 2, "method": "fast"})
            assert await wire.recv() == {"jsonrpc": "2.0", "id": 2, "result": {"echo": "fast"}}
            await wire.send(
                {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 1}}
            )
            reply = await wire.recv()
            assert (reply["id"], reply["error"]["code"]) == (1, -32800)
            await wire.send(b"this is not json")
            assert (await wire.recv())["error"]["code"] == -32700
            await wire.send(b"[]")
            assert (await wire.recv())["error"]["code"] == -32600
            await wire.send({"jsonrpc": "2.0", "id": 3, "method": "fail"})
            assert (await wire.recv())["error"] == {
                "code": -32002,
                "message": "no such thing",
                "data": {"kind": "x"},
            }
            await wire.send({"jsonrpc": "2.0", "id": 4, "method": "crash"})
            crashed = await wire.recv()
            assert crashed["error"]["code"] == -32603
            assert "boom" not in json.dumps(crashed), "no exception text on the wire"


async def test_the_peers_own_requests_get_their_answers() -> None:
    async def on_request(received: Received) -> Any:
        return None

    with trio.fail_after(TEST_TIMEOUT_S):
        async with peer_and_wire(on_request) as (peer, wire):
            first = await peer.request("ask", {"n": 1})
            second = await peer.request("ask", {"n": 2})
            one, two = await wire.recv(), await wire.recv()
            assert (one["method"], one["params"], two["params"]) == ("ask", {"n": 1}, {"n": 2})
            await wire.send(
                {"jsonrpc": "2.0", "id": two["id"], "error": {"code": -1, "message": "no"}}
            )
            await wire.send({"jsonrpc": "2.0", "id": 999, "result": "for nobody"})
            await wire.send({"jsonrpc": "2.0", "id": one["id"], "result": {"ok": True}})
            assert msgspec.json.decode(await first.wait()) == {"ok": True}
            with pytest.raises(AcpError) as refused:
                await second.wait()
            assert refused.value.code == -1
            await first.cancel()  # already answered: nothing is sent


# -- the bridge in-process, against a real daemon -------------------------------------


class Editor:
    """A minimal ACP client on a ``Peer``: records updates, answers permissions."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.changed = trio.Event()
        self.permission: Callable[[dict[str, Any]], Awaitable[Any]] | None = None
        self.peer: Peer | None = None

    async def on_request(self, received: Received) -> Any:
        assert received.method == "session/request_permission", received.method
        assert self.permission is not None, "no permission request was expected"
        return await self.permission(msgspec.json.decode(received.params))

    async def on_notification(self, received: Received) -> None:
        assert received.method == "session/update", received.method
        self.updates.append(msgspec.json.decode(received.params)["update"])
        self.changed.set()
        self.changed = trio.Event()

    async def call(self, method: str, params: Any) -> Any:
        assert self.peer is not None
        return msgspec.json.decode(await (await self.peer.request(method, params)).wait())

    def texts(self, kind: str, since: int = 0) -> list[str]:
        return [u["content"]["text"] for u in self.updates[since:] if u["sessionUpdate"] == kind]

    async def until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self.changed.wait()


@asynccontextmanager
async def bridge(socket: Path, **options: Any) -> AsyncIterator[Editor]:
    """``serve_acp`` on memory streams, and an ``Editor`` connected to it."""
    editor = Editor()
    ours, theirs = trio.testing.memory_stream_pair()
    config = BridgeConfig(socket_path=str(socket), **options)
    editor.peer = Peer(
        ours, ours, on_request=editor.on_request, on_notification=editor.on_notification
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_acp, theirs, theirs, config)
        nursery.start_soon(editor.peer.serve)
        initialized = await editor.call("initialize", {"protocolVersion": 1})
        assert initialized["agentCapabilities"]["loadSession"] is True
        yield editor
        await ours.aclose()  # the editor leaves; the bridge returns


async def test_the_bridge_prompts_asks_cancels_and_replays(daemon: DaemonProcess) -> None:
    # Turns of ~1 s: long enough for session/cancel to land mid-turn on a loaded machine.
    options = {"options": {"chunkDelayS": 0.05, "chunks": 20}}
    long_text = " ".join(f"w{i}" for i in range(60))
    with trio.fail_after(TEST_TIMEOUT_S):
        async with bridge(daemon.socket, **options) as editor:
            session_id = (await editor.call("session/new", {"cwd": "/tmp", "mcpServers": []}))[
                "sessionId"
            ]

            async def prompt(text: str) -> Any:
                params = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
                return await editor.call("session/prompt", params)

            assert await prompt("hello") == {"stopReason": "end_turn"}
            assert "".join(editor.texts("agent_message_chunk")) == "Hello from the mock agent."

            async def accept(params: dict[str, Any]) -> Any:
                assert params["toolCall"]["title"] == "Run `ls -la`"
                return {"outcome": {"outcome": "selected", "optionId": "accept"}}

            editor.permission = accept
            mark = len(editor.updates)
            assert await prompt("approve it") == {"stopReason": "end_turn"}
            assert "".join(editor.texts("agent_message_chunk", mark)) == "Command approved."

            # Answered by another client first: the editor's request is withdrawn
            # ($/cancel_request cancels the Peer's handler, which answers -32800).
            withdrawn = trio.Event()

            async def elsewhere(params: dict[str, Any]) -> Any:
                # The withdrawal may land while the other client's answer is still on
                # its way (the bridge sees the resolution first): count it there too.
                try:
                    async with open_client(daemon.socket) as other:
                        approval_id = params["_meta"]["agentsd"]["approvalId"]
                        answer = RespondParams(
                            session_id=session_id, approval_id=approval_id, decision="decline"
                        )
                        await other.call(methods.RESPOND, answer)
                    await trio.sleep_forever()
                finally:
                    withdrawn.set()

            editor.permission = elsewhere
            mark = len(editor.updates)
            assert await prompt("approve elsewhere") == {"stopReason": "end_turn"}
            await withdrawn.wait()
            assert "".join(editor.texts("agent_message_chunk", mark)) == "Command declined."

            # session/cancel mid-turn.
            mark = len(editor.updates)
            async with trio.open_nursery() as nursery:

                async def cancel_on_first_chunk() -> None:
                    await editor.until(lambda: bool(editor.texts("agent_message_chunk", mark)))
                    assert editor.peer is not None
                    await editor.peer.notify("session/cancel", {"sessionId": session_id})

                nursery.start_soon(cancel_on_first_chunk)
                assert await prompt(f"echo {long_text}") == {"stopReason": "cancelled"}
            partial = "".join(editor.texts("agent_message_chunk", mark))
            assert 0 < len(partial) < len(long_text) and long_text.startswith(partial)
            live = [u for u in editor.updates if u["sessionUpdate"] == "agent_message_chunk"]

        async with bridge(daemon.socket) as second:
            loaded = await second.call(
                "session/load", {"sessionId": session_id, "cwd": "/tmp", "mcpServers": []}
            )
            # The mock has a model and no modes (``controls``).
            assert "modes" not in loaded
            assert [(o["id"], o["currentValue"]) for o in loaded["configOptions"]] == [
                ("model", "mock-fast")
            ]
            assert second.texts("user_message_chunk") == [
                "hello",
                "approve it",
                "approve elsewhere",
                f"echo {long_text}",
            ]
            replayed = [u for u in second.updates if u["sessionUpdate"] == "agent_message_chunk"]
            assert "".join(u["content"]["text"] for u in replayed) == "".join(
                u["content"]["text"] for u in live
            )


async def test_a_cancel_right_behind_its_prompt_cancels_it(daemon: DaemonProcess) -> None:
    """Handler tasks start in any order; the cancel still applies to the prompt the
    editor sent before it."""
    with trio.fail_after(TEST_TIMEOUT_S):
        async with bridge(daemon.socket) as editor:
            assert editor.peer is not None
            new = await editor.call("session/new", {"cwd": "/tmp", "mcpServers": []})
            session_id = new["sessionId"]
            for _ in range(3):
                params = {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]}
                prompt = await editor.peer.request("session/prompt", params)
                await editor.peer.notify("session/cancel", {"sessionId": session_id})
                assert msgspec.json.decode(await prompt.wait()) == {"stopReason": "cancelled"}


async def test_prompting_an_unknown_session_is_resource_not_found(daemon: DaemonProcess) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with bridge(daemon.socket) as editor:
            params = {"sessionId": "nope", "prompt": [{"type": "text", "text": "hi"}]}
            with pytest.raises(AcpError) as missing:
                await editor.call("session/prompt", params)
            assert missing.value.code == acp.RESOURCE_NOT_FOUND
            with pytest.raises(AcpError) as missing:
                await editor.call("session/set_mode", {"sessionId": "nope", "modeId": "x"})
            assert missing.value.code == acp.RESOURCE_NOT_FOUND
            with pytest.raises(AcpError) as unsupported:
                await editor.call("session/fork", {"sessionId": "nope", "cwd": "/tmp"})
            assert unsupported.value.code == acp.METHOD_NOT_FOUND


async def test_the_bridge_survives_a_daemon_restart(temp_dir: Path) -> None:
    state_dir, socket_path = temp_dir / "state", temp_dir / "agentsd.sock"

    def start(stack: contextlib.ExitStack) -> DaemonProcess:
        return stack.enter_context(running_daemon(state_dir=state_dir, socket_path=socket_path))

    with contextlib.ExitStack() as first, contextlib.ExitStack() as second:
        await trio.to_thread.run_sync(start, first)
        with trio.fail_after(TEST_TIMEOUT_S):
            async with bridge(socket_path) as editor:
                new = await editor.call("session/new", {"cwd": "/tmp", "mcpServers": []})
                params = {"sessionId": new["sessionId"], "prompt": [{"type": "text", "text": "hi"}]}
                assert await editor.call("session/prompt", params) == {"stopReason": "end_turn"}
                await trio.to_thread.run_sync(first.close)
                await trio.to_thread.run_sync(start, second)
                mark = len(editor.updates)
                assert await editor.call("session/prompt", params) == {"stopReason": "end_turn"}
                assert "".join(editor.texts("agent_message_chunk", mark)) == (
                    "Hello from the mock agent."
                )


# -- agentsctl acp, driven by the official ACP TypeScript SDK --------------------------


def _require_node() -> str:
    """The node binary, if it and the SDK are installed; else skip (fail under CI)."""
    node = shutil.which("node")
    missing = None
    if node is None:
        missing = "node is not installed"
    elif not SDK_PACKAGE.exists():
        missing = "the ACP SDK is not installed: run `npm ci --prefix tests/clients/acp_client`"
    if missing is None:
        assert node is not None
        return node
    if os.environ.get("CI"):
        pytest.fail(f"{missing} (required under CI)")
    pytest.skip(missing)


def _drive(daemon: DaemonProcess, scenario: str, cwd: Path) -> dict[str, Any]:
    node = _require_node()
    config = {
        "scenario": scenario,
        "python": sys.executable,
        "socket": str(daemon.socket),
        "cwd": str(cwd),
    }
    done = subprocess.run(
        [node, str(DRIVER), json.dumps(config)],
        cwd=ACP_CLIENT,
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{done.stderr}\n--- daemon log:\n{daemon.log()}"
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def test_an_sdk_client_prompts_asks_cancels_and_loads(
    daemon: DaemonProcess, temp_dir: Path
) -> None:
    """new session, streamed prompt, permission answered by the editor, cancel, a
    permission withdrawn because another client answered, then a second bridge
    loading the whole history and prompting on."""
    report = _drive(daemon, "conversation", temp_dir)
    with Client(daemon.socket) as client:
        events = client.call(
            "agentSession.history", {"sessionId": report["sessionId"], "afterSeq": 0, "limit": 1000}
        )["events"]
    resolved = [e["body"] for e in events if e["kind"] == "approval.resolved"]
    assert [(r["decision"], r["by"]) for r in resolved] == [
        ("accept", "client"),
        ("decline", "client"),
    ]
    outcomes = [e["body"]["outcome"] for e in events if e["kind"] == "turn.completed"]
    assert outcomes == ["completed", "completed", "interrupted", "completed", "completed"]


def test_an_sdk_client_sees_an_approved_tool_as_one_tool_call(
    daemon: DaemonProcess, temp_dir: Path
) -> None:
    """The permission request and the tool run it allows are one tool call: the
    request's toolCallId is the one the tool's updates carry, pending to completed;
    a denied one ends failed; ``session/load`` replays the same tool calls."""
    report = _drive(daemon, "permission", temp_dir)
    with Client(daemon.socket) as client:
        events = client.call(
            "agentSession.history", {"sessionId": report["sessionId"], "afterSeq": 0, "limit": 1000}
        )["events"]
    asked = [e["body"] for e in events if e["kind"] == "approval.requested"]
    ran = [
        e["body"]["itemId"]
        for e in events
        if e["kind"] == "item.completed" and e["body"]["type"] == "toolCall"
    ]
    assert [a["itemId"] for a in asked] == ran == [report["approvedId"], report["deniedId"]]
    assert [a["approvalId"] for a in asked] == report["approvalIds"], "_meta names the approval"


def test_killing_the_bridge_mid_turn_leaves_the_session_running(
    daemon: DaemonProcess, temp_dir: Path
) -> None:
    # How far the turn got when the bridge died depends on the machine's load; what
    # must hold is that it ran to its end, untouched, and the agent still runs.
    report = _drive(daemon, "kill", temp_dir)
    with Client(daemon.socket) as client:
        events = client.call(
            "agentSession.history", {"sessionId": report["sessionId"], "afterSeq": 0, "limit": 1000}
        )["events"]
        assert (
            client.call(methods.GET, GetParams(session_id=report["sessionId"])).session.phase
            == "running"
        )
    kinds = [e["kind"] for e in events]
    outcomes = [e["body"]["outcome"] for e in events if e["kind"] == "turn.completed"]
    assert outcomes == ["completed", "completed"], "the orphaned turn ran to its end"
    assert "interrupt.requested" not in kinds
    assert "child.exited" not in kinds


# -- the CLI row ---------------------------------------------------------------------


def test_acp_with_session_and_new_session_options_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentsctl.cli", "acp", "--session", "x", "--provider", "mock"],
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "--session" in done.stderr


def test_the_acp_help_does_not_import_trio() -> None:
    probe = (
        "import sys\n"
        "from agentsctl import cli\n"
        "try:\n"
        "    cli.main(['acp', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('trio' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "False"


# -- an ACP agent behind the daemon, through the bridge ------------------------------


ACP_TEST_AGENT = Path(__file__).parents[1] / "peers" / "acp_test_agent.py"


@pytest.fixture(scope="module")
def acp_agent_daemon() -> Iterator[DaemonProcess]:
    """A daemon with the tests' minimal ACP agent as ``[agents.testacp]``."""
    base = make_temp_dir()
    try:
        config = base / "config.toml"
        command = json.dumps([sys.executable, str(ACP_TEST_AGENT)])
        config.write_text(f"[agents.testacp]\ncommand = {command}\n")
        with running_daemon(extra_args=["--config", str(config)]) as process:
            yield process
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def test_an_editor_drives_an_acp_agent_through_the_bridge(
    acp_agent_daemon: DaemonProcess,
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with bridge(acp_agent_daemon.socket, provider="testacp") as editor:
            new = await editor.call("session/new", {"cwd": "/tmp", "mcpServers": []})
            session_id = new["sessionId"]

            async def prompt(text: str) -> Any:
                params = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
                return await editor.call("session/prompt", params)

            assert await prompt("hello") == {"stopReason": "end_turn"}
            assert "".join(editor.texts("agent_message_chunk")) == "echo: hello"
            assert "".join(editor.texts("agent_thought_chunk")) == "thinking"

            async def allow(params: dict[str, Any]) -> Any:
                # The agent's own options, names and kinds, through the daemon.
                assert params["options"] == [
                    {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
                ]
                return {"outcome": {"outcome": "selected", "optionId": "yes"}}

            editor.permission = allow
            mark = len(editor.updates)
            assert await prompt("permission") == {"stopReason": "end_turn"}
            assert "".join(editor.texts("agent_message_chunk", mark)) == (
                'outcome: {"outcome": "selected", "optionId": "yes"}'
            )
        with Client(acp_agent_daemon.socket) as client:
            info = client.call("agentSession.get", {"sessionId": session_id})["session"]
            assert info["provider"] == "testacp"


async def test_what_the_editor_was_shown_is_seen(daemon: DaemonProcess) -> None:
    """A turn's end sent to the editor acknowledges the session (no longer unseen);
    one that finished while no editor followed is unseen until a session/load
    replays it (bridge Rule 7). The other client watches the summaries."""

    async def until(watch: Watch, session_id: str, *, seen: bool, after_turns: int) -> None:
        async for note in watch:
            status = note.session
            if (
                status.session_id == session_id
                and status.outcome == "completed"
                and status.unseen is not seen
                and status.head_seq >= after_turns
            ):
                return

    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_client(daemon.socket) as other, other.watch() as watch:
            async with bridge(daemon.socket) as editor:
                new = await editor.call("session/new", {"cwd": "/tmp", "mcpServers": []})
                session_id = new["sessionId"]
                params = {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]}
                assert await editor.call("session/prompt", params) == {"stopReason": "end_turn"}
                await until(watch, session_id, seen=True, after_turns=0)
            sent = await other.call(
                methods.SEND, SendParams(session_id=session_id, text="hello while away")
            )
            await until(watch, session_id, seen=False, after_turns=sent.seq)
            async with bridge(daemon.socket) as second:
                load = {"sessionId": session_id, "cwd": "/tmp", "mcpServers": []}
                assert "configOptions" in await second.call("session/load", load)
                await until(watch, session_id, seen=True, after_turns=sent.seq)
