"""The mock agent program, over real pipes: handshake, turns, approvals, interrupts,
steering, resume, and each way it misbehaves on request."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from agentsd.child import ChildExit, ExitProof, open_child
from tests.daemon import test_child as child_tests
from tests.daemon.test_child import MOCK_AGENT, QUICK, JsonLines, MakeToken, mock_spec

# The same process-leak guard as test_child: no test may leave a process behind.
tokens = child_tests.tokens
make_token = child_tests.make_token
no_leftovers = child_tests.no_leftovers

FAST = {"chunkDelayS": 0.0}
REPLY = "Hello from the mock agent."


@asynccontextmanager
async def mock_agent(token: str, options: dict[str, Any] | None = None) -> AsyncIterator[JsonLines]:
    exits: list[ChildExit] = []
    spec = mock_spec(token, options)
    async with open_child(spec, QUICK, child_tests.ignore_identity, exits.append) as child:
        yield JsonLines(child)
    assert [type(e) for e in exits] == [ExitProof]


def texts(frames: list[dict[str, Any]], kind: str) -> list[str]:
    return [f["text"] for f in frames if f["type"] == kind]


async def test_handshake_starts_a_new_conversation(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token()) as agent:
            frame = await agent.handshake()
    assert frame.keys() == {"type", "handle", "agent", "version", "history", "models", "commands"}
    assert (frame["agent"], frame["version"], frame["history"]) == ("mock", 1, 0)
    assert frame["models"] == ["mock-fast", "mock-deep"]
    assert [c["name"] for c in frame["commands"]] == ["greet"]
    assert len(frame["handle"]) == 32 and int(frame["handle"], 16) >= 0


async def test_a_prompt_streams_one_turn(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token(), FAST) as agent:
            await agent.handshake()
            await agent.send({"type": "prompt", "id": "m1", "text": "hi"})
            frames = await agent.receive_until("turn_completed")
    assert frames[0] == {"type": "ack", "id": "m1", "turnId": "t1"}
    assert frames[1] == {"type": "turn_started", "turnId": "t1"}
    deltas = [f for f in frames if f["type"] == "delta"]
    assert len(deltas) == 5
    assert {(d["turnId"], d["itemId"]) for d in deltas} == {("t1", "t1-message")}
    assert "".join(texts(frames, "delta")) == REPLY
    assert frames[-2] == {"type": "message", "turnId": "t1", "itemId": "t1-message", "text": REPLY}
    assert frames[-1] == {"type": "turn_completed", "turnId": "t1", "outcome": "completed"}


async def test_set_model_and_commands(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token(), FAST) as agent:
            await agent.handshake()
            await agent.send({"type": "set_model", "model": "gpt-9"})
            assert (await agent.receive())["type"] == "error"
            await agent.send({"type": "set_model", "model": "mock-deep"})
            assert await agent.receive() == {"type": "model_set", "model": "mock-deep"}
            await agent.send({"type": "prompt", "id": "m1", "text": "which model"})
            frames = await agent.receive_until("turn_completed")
            assert "".join(texts(frames, "delta")) == "I am mock-deep."
            await agent.send({"type": "command", "id": "c1", "name": "nope"})
            assert (await agent.receive())["type"] == "error"
            await agent.send({"type": "command", "id": "c2", "name": "compact"})
            frames = await agent.receive_until("turn_completed")
            assert frames[0] == {"type": "ack", "id": "c2", "turnId": "t2"}
            assert "".join(texts(frames, "delta")) == "Compacted 2 messages."


async def test_echo_and_reply_options(make_token: MakeToken) -> None:
    options = {**FAST, "chunks": 2, "replyText": "custom"}
    with trio.fail_after(15):
        async with mock_agent(make_token(), options) as agent:
            await agent.handshake()
            await agent.send({"type": "prompt", "id": "m1", "text": "echo say this back"})
            first = await agent.receive_until("turn_completed")
            await agent.send({"type": "prompt", "id": "m2", "text": "anything"})
            second = await agent.receive_until("turn_completed")
    assert texts(first, "message") == ["say this back"]
    assert len(texts(first, "delta")) == 2
    assert texts(second, "message") == ["custom"]
    assert second[1] == {"type": "turn_started", "turnId": "t2"}


async def _approval_turn(agent: JsonLines, decision: str) -> list[dict[str, Any]]:
    await agent.handshake()
    await agent.send({"type": "prompt", "id": "m1", "text": "please approve this"})
    frames = await agent.receive_until("approval_request")
    assert frames[-1] == {
        "type": "approval_request",
        "requestId": "r1",
        "turnId": "t1",
        "itemId": "t1-tool",
        "kind": "command",
        "title": "Run `ls -la`",
        "detail": "The mock agent wants to run a shell command.",
        "options": ["accept", "decline"],
    }
    await agent.send({"type": "approval_response", "requestId": "r1", "decision": decision})
    return await agent.receive_until("turn_completed")


async def test_approval_accepted(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token(), FAST) as agent:
            frames = await _approval_turn(agent, "accept")
    assert frames[0] == {
        "type": "tool_call",
        "turnId": "t1",
        "itemId": "t1-tool",
        "name": "shell",
        "input": {"command": "ls -la"},
        "status": "completed",
    }
    assert texts(frames, "message") == ["Command approved."]
    assert frames[-1]["outcome"] == "completed"


async def test_approval_declined(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token(), FAST) as agent:
            frames = await _approval_turn(agent, "decline")
    assert frames[0]["status"] == "declined"
    assert texts(frames, "message") == ["Command declined."]
    assert frames[-1]["outcome"] == "completed"


async def test_approval_cancelled_interrupts_the_turn(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token(), FAST) as agent:
            frames = await _approval_turn(agent, "cancel")
            await agent.send({"type": "approval_response", "requestId": "r1", "decision": "accept"})
            late = await agent.receive()
    assert [f["type"] for f in frames] == ["tool_call", "turn_completed"]
    assert frames[0]["status"] == "declined"
    assert frames[-1]["outcome"] == "interrupted"
    assert late == {"type": "error", "message": "unknown requestId r1"}


async def test_interrupt_ends_the_running_turn(make_token: MakeToken) -> None:
    # Slow enough that the interrupt always lands mid-turn (50 chunks, 5 s in all).
    options = {"chunks": 50, "chunkDelayS": 0.1, "replyText": "x" * 50}
    with trio.fail_after(15):
        async with mock_agent(make_token(), options) as agent:
            await agent.handshake()
            await agent.send({"type": "prompt", "id": "m1", "text": "go"})
            before = await agent.receive_until("delta")
            await agent.send({"type": "interrupt", "turnId": "t1"})
            after = await agent.receive_until("turn_completed")
            await agent.send({"type": "interrupt", "turnId": None})
            idle = await agent.receive()
    streamed = "".join(texts(before + after, "delta"))
    assert 0 < len(streamed) < 50
    assert texts(after, "message") == [streamed]
    assert after[-1] == {"type": "turn_completed", "turnId": "t1", "outcome": "interrupted"}
    assert idle == {"type": "interrupt_result", "running": False}


async def test_a_prompt_during_a_turn_steers_it(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token(), FAST) as agent:
            await agent.handshake()
            # The approval holds the turn open, so the steering surely lands in it.
            await agent.send({"type": "prompt", "id": "m1", "text": "approve it"})
            frames = await agent.receive_until("approval_request")
            await agent.send({"type": "prompt", "id": "m2", "text": "echo and more"})
            frames.append(await agent.receive())
            await agent.send({"type": "approval_response", "requestId": "r1", "decision": "accept"})
            frames += await agent.receive_until("turn_completed")
    assert frames[3] == {"type": "ack", "id": "m2", "turnId": "t1"}
    assert [f["type"] for f in frames].count("turn_started") == 1
    assert texts(frames, "message") == ["Command approved. and more"]


async def test_resume_loads_the_conversation_from_the_state_dir(
    make_token: MakeToken, tmp_path: Path
) -> None:
    options = {**FAST, "stateDir": str(tmp_path)}
    with trio.fail_after(15):
        async with mock_agent(make_token(), options) as agent:
            handle = (await agent.handshake())["handle"]
            await agent.send({"type": "prompt", "id": "m1", "text": "echo remember me"})
            await agent.receive_until("turn_completed")
            await agent.send({"type": "shutdown"})
            assert await agent.child.wait() == 0
        async with mock_agent(make_token(), options) as agent:
            resumed = await agent.handshake(handle)
            await agent.send({"type": "prompt", "id": "m2", "text": "echo again"})
            frames = await agent.receive_until("turn_completed")
    assert (resumed["handle"], resumed["history"]) == (handle, 2)
    assert frames[1]["turnId"] == "t2"  # turn numbers continue across the resume
    state = json.loads((tmp_path / f"{handle}.json").read_text())
    assert [m["text"] for m in state["messages"]] == [
        "echo remember me",
        "remember me",
        "echo again",
        "again",
    ]


async def test_a_handle_cannot_name_another_file(make_token: MakeToken, tmp_path: Path) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token(), {"stateDir": str(tmp_path)}) as agent:
            await agent.send({"type": "initialize", "handle": "../escape"})
            frame = await agent.receive()
    assert frame == {"type": "error", "message": "invalid handle '../escape'"}


async def test_invalid_output_writes_one_line_that_is_not_json(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token(), {**FAST, "invalidOutput": True}) as agent:
            await agent.handshake()
            bad = await agent.receive_line()
            await agent.send({"type": "prompt", "id": "m1", "text": "hi"})
            frames = await agent.receive_until("turn_completed")
    try:
        json.loads(bad)
    except ValueError:
        pass
    else:
        raise AssertionError(f"{bad!r} is JSON")
    assert frames[-1]["outcome"] == "completed"


async def test_unknown_frames_and_bad_lines_get_an_error_and_it_carries_on(
    make_token: MakeToken,
) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token(), FAST) as agent:
            await agent.send({"type": "prompt", "id": "m0", "text": "too early"})
            early = await agent.receive()
            await agent.handshake()
            await agent.send({"type": "bogus"})
            unknown = await agent.receive()
            await agent.child.stdin.send_all(b"{not json\n")
            garbled = await agent.receive()
            await agent.send({"type": "prompt", "id": "m1", "text": "hi"})
            frames = await agent.receive_until("turn_completed")
    assert early == {"type": "error", "message": "prompt before initialize"}
    assert unknown == {"type": "error", "message": "unknown frame type bogus"}
    assert garbled == {"type": "error", "message": "invalid JSON line"}
    assert frames[-1]["outcome"] == "completed"


async def test_flood_stdout(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token(), {**FAST, "floodStdout": 5000}) as agent:
            await agent.handshake()
            await agent.send({"type": "prompt", "id": "m1", "text": "hi"})
            frames = await agent.receive_until("turn_completed")
    assert len(texts(frames, "delta")) == 5000 + 5
    assert texts(frames, "message") == ["." * 5000 + REPLY]


async def test_shutdown_and_eof_exit_zero(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token()) as agent:
            await agent.send({"type": "shutdown"})
            assert await agent.child.wait() == 0
        async with mock_agent(make_token()) as agent:
            await agent.child.stdin.aclose()
            assert await agent.child.wait() == 0


async def test_crash_after(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token(), {"crashAfterS": 0.01}) as agent:
            assert await agent.child.wait() == 3


async def test_ignore_sigterm_and_hang_handshake(make_token: MakeToken) -> None:
    options = {"ignoreSigterm": True, "hangHandshake": True}
    with trio.fail_after(15):
        async with mock_agent(make_token(), options) as agent:
            await agent.send({"type": "initialize", "handle": None})
            await agent.send({"type": "bogus"})  # answered: so initialize was not
            assert await agent.receive() == {"type": "error", "message": "unknown frame type bogus"}
            status = await trio.Path(f"/proc/{agent.child.identity.pid}/status").read_text()
    [ignored] = [line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")]
    assert int(ignored, 16) & (1 << (signal.SIGTERM - 1))


def test_mock_agent_imports_neither_trio_nor_msgspec() -> None:
    code = (
        "import sys, agentsd.providers.mock_agent;"
        "print(sorted({'trio', 'msgspec', 'attrs'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_option_of_the_wrong_type_is_refused_at_start() -> None:
    env = {**os.environ, "AGENTSD_MOCK_OPTIONS": json.dumps({"chunks": "five"})}
    out = subprocess.run(MOCK_AGENT, env=env, capture_output=True, text=True, input="")
    assert out.returncode == 1
    assert "option chunks must be int" in out.stderr


async def test_a_question_is_answered_with_one_of_its_labels(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        async with mock_agent(make_token(), FAST) as agent:
            await agent.handshake()
            await agent.send({"type": "prompt", "id": "m1", "text": "ask me something"})
            frames = await agent.receive_until("approval_request")
            assert frames[-1] == {
                "type": "approval_request",
                "requestId": "r1",
                "turnId": "t1",
                "kind": "question",
                "title": "Which colour do you like?",
                "detail": "Red: warm\nBlue: cool",
                "options": ["Red", "Blue", "decline"],
            }
            await agent.send({"type": "approval_response", "requestId": "r1", "decision": "accept"})
            refused = await agent.receive()
            await agent.send({"type": "approval_response", "requestId": "r1", "decision": "Blue"})
            frames = await agent.receive_until("turn_completed")
    assert refused == {"type": "error", "message": "invalid decision 'accept'"}
    assert texts(frames, "message") == ["You chose Blue."]
    assert frames[-1]["outcome"] == "completed"
