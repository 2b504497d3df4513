"""Adapter takeover (``providers.base`` Rule 5) against scripted agents over memory
streams: what a real agent shows only by chance (an answer to a request of the
earlier adapter arriving after the takeover), every kind of approval answered after
a takeover as it would have been before it, and the refusals."""

from __future__ import annotations

import logging
from typing import Any

import attrs
import msgspec
import pytest
import trio
import trio.testing
from trio.testing import wait_all_tasks_blocked

from agentsd.providers.acp_adapter import AcpAdapter
from agentsd.providers.acp_agents import AcpAgent
from agentsd.providers.base import (
    Adapter,
    Dispatch,
    LineLink,
    PendingTakeover,
    Resume,
    Submission,
    Takeover,
)
from agentsd.providers.claude import ClaudeProvider
from agentsd.providers.claude_adapter import ClaudeAdapter
from agentsd.providers.codex import CodexAdapter
from agentsd.providers.codex_rpc import GENERATION_SHIFT
from agentsd.session import Conversation
from agentsd.sink import MAX_REQUEST_BYTES, kept_request
from agentsd.store.sessions import SessionRow
from agentsd_protocol.api.events import ApprovalRequested
from agentsd_protocol.errors import AgentStartFailed, ResumeFailed
from tests.peers.test_claude_handshake import SESSION, ScriptedClaude
from tests.peers.test_codex import THREAD, TURN, ScriptedCodex
from tests.recording_sink import RecordingSink

TEST_TIMEOUT_S = 30.0  # in memory, each test takes milliseconds


def takeover(
    handle: str,
    *,
    generation: int = 3,
    turn_id: str | None = None,
    approvals: tuple[PendingTakeover, ...] = (),
    open_items: dict[str, str] | None = None,
) -> Takeover:
    return Takeover(
        handle=handle,
        generation=generation,
        turn_id=turn_id,
        turn_open=turn_id is not None,
        approvals=approvals,
        undispatched=(),
        options={},
        agent_version="1.2.3",
        open_items=open_items or {},
    )


def pending_of(sink: RecordingSink) -> tuple[PendingTakeover, ...]:
    """The approvals a sink recorded, as the journal hands them to a takeover."""
    return tuple(
        PendingTakeover(
            native_id=a["nativeId"],
            approval_id=f"ap-{a['nativeId']}",
            kind=a["kind"],
            options=tuple(a["options"]),
            request=a["request"],
        )
        for a in sink.approvals
    )


class Pipes:
    """An agent's pipes in memory: ``peer`` is the agent's end; ``link`` gives an
    adapter a fresh ``LineLink`` over the other, as a new daemon has."""

    def __init__(self) -> None:
        self._to_agent = trio.testing.memory_stream_one_way_pair()
        self._from_agent = trio.testing.memory_stream_one_way_pair()
        self.peer = LineLink(self._from_agent[0], self._to_agent[1])

    def link(self) -> LineLink:
        return LineLink(self._to_agent[0], self._from_agent[1])

    async def receive(self) -> dict[str, Any]:
        frame = await self.peer.receive()
        assert frame is not None
        return frame


def codex_row() -> SessionRow:
    return SessionRow(
        id="s-1",
        host_id="h",
        provider="codex",
        cwd="/tmp",
        title=None,
        options={},
        env={},
        command=None,
        provider_handle=THREAD,
        created_at=0.0,
        updated_at=0.0,
    )


# -- Codex ---------------------------------------------------------------------------

CODEX_REQUESTS: list[tuple[str, dict[str, Any], str]] = [
    (
        "item/commandExecution/requestApproval",
        {"command": "make", "availableDecisions": ["accept", "cancel"]},
        "accept",
    ),
    ("item/fileChange/requestApproval", {"reason": "write a file"}, "decline"),
    (
        "item/permissions/requestApproval",
        {"permissions": {"network": {"enabled": True}, "fileSystem": None}},
        "acceptForSession",
    ),
    (
        "item/tool/requestUserInput",
        {
            "questions": [
                {
                    "id": "color",
                    "question": "Which color?",
                    "options": [{"label": "Blue"}, {"label": "Red"}],
                }
            ]
        },
        "accept",
    ),
    ("mcpServer/elicitation/request", {"serverName": "s", "mode": "url", "url": "u"}, "accept"),
]


async def test_codex_approvals_answered_after_a_takeover_are_answered_as_before_it() -> None:
    """The same requests, answered by the adapter that asked them and by one that
    took over from its recorded approvals: the app-server receives the same answers,
    with its own request ids."""
    with trio.fail_after(TEST_TIMEOUT_S):
        results = []
        for taken_over in (False, True):
            pipes = Pipes()
            asked = RecordingSink()
            adapter: Adapter = CodexAdapter(pipes.link(), asked, codex_row())
            async with trio.open_nursery() as nursery:
                nursery.start_soon(adapter.run)
                for request_id, (method, params, _) in enumerate(CODEX_REQUESTS):
                    await pipes.peer.send({"id": request_id, "method": method, "params": params})
                await wait_all_tasks_blocked()
                assert len(asked.approvals) == len(CODEX_REQUESTS)
                nursery.cancel_scope.cancel()
            if taken_over:
                adapter = CodexAdapter(pipes.link(), RecordingSink(), codex_row())
                await adapter.take_over(takeover(THREAD, approvals=pending_of(asked)))
            answers = []
            for request_id, (_, _, decision) in enumerate(CODEX_REQUESTS):
                await adapter.answer_approval(str(request_id), decision)
                await adapter.answer_approval(str(request_id), decision)  # nothing more
                answers.append(await pipes.receive())
            results.append(answers)
    before, after_takeover = results
    assert after_takeover == before
    assert [a["id"] for a in before] == [0, 1, 2, 3, 4]
    assert before[2]["result"] == {
        "permissions": {"network": {"enabled": True}},
        "scope": "session",
    }


async def test_codex_after_a_takeover_numbers_its_requests_in_its_generation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A late answer to the earlier adapter's request is ignored (logged); the new
    adapter's requests carry ids of its own generation, and the open turn is the one
    the journal names."""
    sink = RecordingSink()
    codex = ScriptedCodex(sink)
    await codex.adapter.take_over(takeover(THREAD, generation=5, turn_id=TURN))
    caplog.set_level(logging.INFO)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(codex.adapter.run)
            # The earlier adapter's turn/start (id 3) is answered only now.
            await codex.peer.send({"id": 3, "result": {"turn": {"id": "other"}}})
            results: list[bool] = []

            async def interrupt() -> None:
                results.append(await codex.adapter.interrupt(None))

            nursery.start_soon(interrupt)
            request = await codex.expect("turn/interrupt")
            assert request["id"] == (5 << GENERATION_SHIFT) + 1
            assert request["params"] == {"threadId": THREAD, "turnId": TURN}
            await codex.reply(request, {})
            await codex.notify(
                "turn/completed",
                {"threadId": THREAD, "turn": {"id": TURN, "status": "interrupted"}},
            )
            await wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert results == [True]
    assert sink.kinds() == ["turn.completed"]  # the late answer journaled nothing
    assert "answered request 3, which this adapter never sent" in caplog.text


async def test_a_codex_approval_whose_request_was_not_kept_grants_nothing() -> None:
    """Without the request (past the journal's bound), accepting a permissions
    request grants no permission: the safe reading."""
    codex = ScriptedCodex(RecordingSink())
    lost = PendingTakeover("4", "ap-4", "permissions", ("accept", "decline"))
    await codex.adapter.take_over(takeover(THREAD, approvals=(lost,)))
    with trio.fail_after(TEST_TIMEOUT_S):
        await codex.adapter.answer_approval("4", "accept")
        answer = await codex.peer.receive()
    assert answer == {"id": 4, "result": {"permissions": {}, "scope": "turn"}}


# -- Claude --------------------------------------------------------------------------


def stream_event(message_id: str, event: dict[str, Any]) -> dict[str, Any]:
    return {"type": "stream_event", "api_message_id": message_id, "event": event}


async def test_claude_after_a_takeover_finishes_the_blocks_and_tools_begun_before_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The rest of a text block streams to the item the earlier adapter started and
    its assistant frame completes it whole; a tool call begun before completes with
    its result; the turn is the journal's; the earlier adapter's answers are
    ignored; the new adapter's control requests are of its generation."""
    sink = RecordingSink()
    claude = ScriptedClaude(sink)
    state = takeover(
        SESSION,
        generation=4,
        turn_id="turn-1",
        open_items={"msg_1:1": "Hel", "toolu_1": ""},
    )
    await claude.adapter.take_over(state)
    caplog.set_level(logging.INFO)
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(claude.adapter.run)
            # The earlier adapter's barrier is answered only now.
            await claude.respond({"request_id": "agentsd-2"}, {"mcpServers": []})
            # The block's start is read again (the takeover read from before it).
            start = {"type": "content_block_start", "index": 1, "content_block": {"type": "text"}}
            await claude.peer.send(stream_event("msg_1", start))
            delta = {"type": "text_delta", "text": "lo"}
            await claude.peer.send(
                stream_event("msg_1", {"type": "content_block_delta", "index": 1, "delta": delta})
            )
            await claude.peer.send(
                {
                    "type": "assistant",
                    "message": {"id": "msg_1", "content": [{"type": "text", "text": "Hello"}]},
                }
            )
            await claude.peer.send(
                {
                    "type": "user",
                    "message": {
                        "content": [
                            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}
                        ]
                    },
                }
            )
            results: list[bool] = []

            async def interrupt() -> None:
                results.append(await claude.adapter.interrupt(None))

            nursery.start_soon(interrupt)
            request = await claude.receive()
            assert request["request_id"] == "agentsd-g4-1"
            assert request["request"] == {"subtype": "interrupt"}
            await claude.respond(request, {})
            await claude.peer.send(
                {"type": "result", "subtype": "error_during_execution", "is_error": False}
            )
            await wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert results == [True]
    assert sink.deltas == [("msg_1:1", "lo")]
    events = [(kind, body.get("itemId"), body.get("turnId")) for kind, body in sink.events]
    assert events == [
        ("item.started", "msg_1:1", "turn-1"),  # the same event again, for the sink
        ("item.completed", "msg_1:1", "turn-1"),
        ("item.completed", "toolu_1", "turn-1"),
        ("turn.completed", None, "turn-1"),
    ]
    assert sink.events[1][1]["text"] == "Hello"
    assert sink.events[2][1]["output"]["text"] == "ok"
    assert "claude answered agentsd-2, which this adapter never sent" in caplog.text


async def test_a_prompt_the_earlier_claude_adapter_queued_runs_as_a_turn_of_its_own() -> None:
    """A prompt written into the running turn before the takeover, which the CLI
    takes up only once that turn ended, is a turn of its own after it."""
    sink = RecordingSink()
    claude = ScriptedClaude(sink)
    await claude.adapter.take_over(takeover(SESSION, turn_id="turn-1"))
    result = {"type": "result", "subtype": "success", "is_error": False, "result": "ok"}
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(claude.adapter.run)
            await claude.peer.send(result)
            queued = {"role": "user", "content": "and then?"}
            await claude.peer.send(
                {"type": "user", "isReplay": True, "uuid": "u-queued", "message": queued}
            )
            await claude.peer.send(result)
            await wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    turns = [(kind, body["turnId"]) for kind, body in sink.events if kind.startswith("turn.")]
    assert [kind for kind, _ in turns] == ["turn.completed", "turn.started", "turn.completed"]
    assert turns[0][1] == "turn-1"
    assert turns[1][1] == turns[2][1] != "turn-1"


async def test_claude_questions_answered_after_a_takeover_are_answered_as_before_it() -> None:
    """A tool, a plan and a two-question form whose first question was answered
    before the takeover: the CLI receives the same answers, each once, with its own
    request ids."""
    questions = {
        "questions": [
            {"question": "Which color?", "options": [{"label": "Blue"}, {"label": "Red"}]},
            {"question": "Which size?", "options": [{"label": "S"}, {"label": "L"}]},
        ]
    }
    requests = [
        ("r-tool", {"tool_name": "Bash", "input": {"command": "ls"}, "tool_use_id": "tu"}),
        ("r-plan", {"tool_name": "ExitPlanMode", "input": {"plan": "do it"}}),
        ("r-form", {"tool_name": "AskUserQuestion", "input": questions}),
    ]
    with trio.fail_after(TEST_TIMEOUT_S):
        results = []
        for taken_over in (False, True):
            pipes = Pipes()
            asked = RecordingSink()
            adapter: Adapter = ClaudeAdapter(pipes.link(), asked, session_id=SESSION)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(adapter.run)
                for request_id, request in requests:
                    await pipes.peer.send(
                        {
                            "type": "control_request",
                            "request_id": request_id,
                            "request": {"subtype": "can_use_tool", **request},
                        }
                    )
                await wait_all_tasks_blocked()
                await adapter.answer_approval("r-form", "Red")  # the first question
                await wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()
            pending = pending_of(asked)
            assert [p.native_id for p in pending] == ["r-tool", "r-plan", "r-form", "r-form#2"]
            if taken_over:
                adapter = ClaudeAdapter(pipes.link(), RecordingSink(), session_id=SESSION)
                open_ones = tuple(p for p in pending if p.native_id != "r-form")
                await adapter.take_over(takeover(SESSION, approvals=open_ones))
            answers = []
            for native_id, decision in (
                ("r-tool", "allow"),
                ("r-plan", "approve"),
                ("r-form#2", "L"),
            ):
                await adapter.answer_approval(native_id, decision)
                await adapter.answer_approval(native_id, decision)  # a second answer: nothing
                answers.append(await pipes.receive())
            results.append(answers)
    before, after_takeover = results
    assert after_takeover == before
    assert [a["response"]["request_id"] for a in before] == ["r-tool", "r-plan", "r-form"]
    assert before[0]["response"]["response"] == {
        "behavior": "allow",
        "updatedInput": {"command": "ls"},
    }
    form = before[2]["response"]["response"]
    assert form["updatedInput"]["answers"] == {"Which color?": "Red", "Which size?": "L"}


async def test_a_claude_not_launched_here_can_be_taken_over_but_not_initialized() -> None:
    """A new daemon's provider launched nothing: its adapter for the session takes
    the CLI over, and refuses a handshake (the session id was never chosen here)."""
    row = SessionRow(
        id="s-1",
        host_id="h",
        provider="claude",
        cwd="/tmp",
        title=None,
        options={},
        env={},
        command=None,
        provider_handle=SESSION,
        created_at=0.0,
        updated_at=0.0,
    )
    adapter = ClaudeProvider().adapter(Pipes().link(), RecordingSink(), row)
    with pytest.raises(AgentStartFailed):
        await adapter.handshake(None)
    await adapter.take_over(takeover(SESSION))
    claude = ScriptedClaude(RecordingSink())
    with pytest.raises(ResumeFailed):  # launched for another session
        await claude.adapter.take_over(takeover("another-session"))


# -- ACP -----------------------------------------------------------------------------

ACP_SESSION = "acp-session-1"


def acp_update(update: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": ACP_SESSION, "update": update},
    }


def chunk(text: str) -> dict[str, Any]:
    return acp_update(
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    )


async def test_an_acp_turn_taken_over_ends_with_the_earlier_prompts_answer() -> None:
    """The turn an earlier adapter prompted goes on: its message item streams on and
    completes whole, its tool call completes, its permission request is answered
    with the agent's id, and the answer to the earlier ``session/prompt`` (an id the
    new adapter never sent) ends it; a late answer to anything else is ignored."""
    pipes = Pipes()
    row = attrs.evolve(codex_row(), provider="acp-test", provider_handle=ACP_SESSION)
    sink = RecordingSink()
    adapter = AcpAdapter(pipes.link(), sink, row, AcpAgent("acp-test", ("x",), "Test agent"))
    asked = PendingTakeover("7", "ap-7", "execute", ("allow", "reject"), {"id": 7})
    await adapter.take_over(
        takeover(
            ACP_SESSION,
            generation=6,
            turn_id="t-1",
            approvals=(asked,),
            open_items={"t-1-2": "Hel", "call-1": ""},
        )
    )
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(adapter.run)
            await pipes.peer.send({"jsonrpc": "2.0", "id": 1, "result": {}})  # a late one
            await pipes.peer.send(chunk("lo"))
            await adapter.answer_approval("7", "allow")
            assert await pipes.receive() == {
                "jsonrpc": "2.0",
                "id": 7,
                "result": {"outcome": {"outcome": "selected", "optionId": "allow"}},
            }
            await pipes.peer.send(
                acp_update(
                    {
                        "sessionUpdate": "tool_call_update",
                        "toolCallId": "call-1",
                        "status": "completed",
                    }
                )
            )
            await pipes.peer.send(chunk("!"))
            await pipes.peer.send({"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}})
            await wait_all_tasks_blocked()
            # The next prompt is the new adapter's, in its generation's range.
            nursery.start_soon(adapter.send, Submission("m-2", "next"))
            prompt = await pipes.receive()
            assert prompt["method"] == "session/prompt"
            assert prompt["id"] == (6 << GENERATION_SHIFT) + 1
            assert prompt["params"]["sessionId"] == ACP_SESSION
            nursery.cancel_scope.cancel()
    events = [(kind, body.get("itemId"), body.get("text")) for kind, body in sink.events]
    assert events == [
        ("item.completed", "t-1-2", "Hello"),
        ("item.completed", "call-1", None),
        ("item.started", "t-1-3", None),
        ("item.completed", "t-1-3", "!"),
        ("turn.completed", None, None),
        ("turn.started", None, None),
    ]
    assert sink.events[4][1]["turnId"] == "t-1"
    assert sink.events[4][1]["outcome"] == "completed"
    assert sink.deltas == [("t-1-2", "lo"), ("t-1-3", "!")]


async def test_an_adapter_that_cannot_take_over_says_resume_failed() -> None:
    class Plain(Adapter):
        async def handshake(self, resume: Resume | None) -> str:
            return "h"

        async def run(self) -> None:
            pass

        async def send(self, submission: Submission) -> Dispatch:
            return Dispatch(outcome="unknown")

        async def interrupt(self, turn_id: str | None, *, confirm: bool = True) -> bool:
            return False

        async def answer_approval(self, native_id: str, decision: str) -> None:
            pass

    with pytest.raises(ResumeFailed):
        await Plain().take_over(takeover("h"))


def test_an_approvals_request_is_journaled_whole_or_not_at_all() -> None:
    small = {"id": 1, "method": "m", "params": {"command": "ls"}}
    assert kept_request(small) == small
    assert kept_request({"input": "x" * MAX_REQUEST_BYTES}) is None
    assert kept_request(None) is None


def test_a_pending_approval_keeps_the_request_a_takeover_answers_with() -> None:
    """The conversation the daemon rebuilds from the journal keeps each pending
    approval's request, which its recovery hands to ``take_over``."""
    convo = Conversation()
    record = {"request_id": "r-1", "kind": "tool", "input": {"command": "ls"}, "item_id": None}
    convo.apply(
        5,
        ApprovalRequested(
            approval_id="ap-1-r-1",
            native_id="r-1",
            approval_kind="tool",
            title="Bash",
            detail="ls",
            options=["allow", "deny"],
            request=record,
        ),
    )
    assert convo.approvals["ap-1-r-1"].request == record
    # And through the wire form the journal stores.
    encoded = msgspec.json.encode(
        ApprovalRequested(
            approval_id="a",
            native_id="n",
            approval_kind="k",
            title="",
            detail="",
            options=[],
            request=record,
        )
    )
    assert b'"request":{"request_id":"r-1"' in encoded
