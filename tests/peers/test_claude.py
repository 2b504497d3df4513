"""The ``claude`` provider against the real Claude Code CLI, through the daemon's socket.

The CLI (bundled in ``claude-agent-sdk``, installed by the test extras) talks only to
``fake_anthropic`` on 127.0.0.1; a dead proxy refuses anything else. Each test
scripts what the model answers, drives a session with ``agentsctl.Client``, and
checks the journal. A few tests replace the CLI with a small Python impostor
(``FAKE_CLI``) to show what only a misbehaving agent can: an old version, garbage
output, silence, control requests agentsd does not handle.

Every wait has a deadline (no fixed sleeps); ``alarm`` bounds each test as a whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from agentsctl.client import Client
from agentsd.procfs import read_proc_info
from agentsd.providers.base import LineLink
from agentsd.providers.claude import KNOWN_OPTIONS, option_flags
from agentsd.providers.claude_adapter import AUTH_ATTEMPTS
from agentsd.providers.claude_events import error_kind, turn_completed
from agentsd.providers.claude_permissions import Permissions
from agentsd.providers.programs import CLAUDE, find_program
from agentsd_protocol.api.events import ErrorInfo
from agentsd_protocol.errors import RpcError
from tests.daemon_process import DaemonProcess, make_temp_dir, no_holder_config, running_daemon
from tests.peers.fake_anthropic import (
    AUTH_REFUSED,
    DEAD_PROXY,
    ComputedReply,
    FakeAnthropic,
    RecordedRequest,
    TextReply,
    ToolUseReply,
    running_fake_anthropic,
)
from tests.recording_sink import RecordingSink

TEST_TIMEOUT_S = 120.0  # a whole test; a turn takes about a second, the machine is shared
TURN_TIMEOUT_S = 60.0  # one wait for an event of a turn
CALL_TIMEOUT_S = 60.0  # one request (create with start spawns and initializes claude)
POLL_S = 0.02

CLAUDE_PROGRAM = find_program(CLAUDE)
needs_claude = pytest.mark.skipif(
    CLAUDE_PROGRAM is None, reason=f"claude is not installed: {CLAUDE.install_hint()}"
)


# ---- bounds ------------------------------------------------------------------------


class Overtime(Exception):
    pass


@pytest.fixture(autouse=True)
def alarm() -> Iterator[None]:
    """Fail a test that runs past ``TEST_TIMEOUT_S`` (a backstop: every wait below
    has its own deadline). SIGALRM interrupts a blocking socket read in the main
    thread, where sync tests run."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise Overtime(f"the test ran longer than {TEST_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def eventually(check: Callable[[], Any], what: str, timeout_s: float = TURN_TIMEOUT_S) -> Any:
    """Poll ``check()`` until it returns something truthy; AssertionError after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(POLL_S)


# ---- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    with running_daemon() as d:
        yield d


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with running_fake_anthropic() as f:
        yield f


@pytest.fixture
def home() -> Iterator[Path]:
    """A private HOME (Claude Code's config and transcripts) with a ``work`` cwd."""
    base = make_temp_dir()
    (base / "work").mkdir()
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


class Conversation:
    """One claude session driven over one connection: its journal (from seq 0) and
    its streamed deltas, collected as they arrive."""

    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.session_id = session_id
        self.events: list[dict[str, Any]] = []
        self.deltas: dict[str, list[tuple[int, str]]] = {}
        client.call("agentSession.subscribe", {"sessionId": session_id, "afterSeq": 0})

    def call(self, method: str, **params: Any) -> Any:
        return self.client.call(method, {"sessionId": self.session_id, **params})

    def send(self, text: str) -> dict[str, Any]:
        result: dict[str, Any] = self.call("agentSession.send", text=text)
        return result

    def info(self) -> dict[str, Any]:
        session: dict[str, Any] = self.call("agentSession.get")["session"]
        return session

    def _pump(self, timeout_s: float) -> None:
        note = self.client.next_notification(timeout_s)
        if note is None:
            return
        params = msgspec.json.decode(note.params)
        if note.method == "agentSession.event" and params["sessionId"] == self.session_id:
            self.events.append(params["event"])
        elif note.method == "agentSession.delta" and params["sessionId"] == self.session_id:
            self.deltas.setdefault(params["itemId"], []).append((params["offset"], params["text"]))

    def wait_for(
        self,
        kind: str,
        match: Callable[[dict[str, Any]], bool] = lambda body: True,
        after_seq: int = 0,
        timeout_s: float = TURN_TIMEOUT_S,
    ) -> dict[str, Any]:
        """The first journaled event of ``kind`` after ``after_seq`` whose body
        matches; AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            for event in self.events[seen:]:
                if event["seq"] > after_seq and event["kind"] == kind and match(event["body"]):
                    return event
            seen = len(self.events)
            left = deadline - time.monotonic()
            if left <= 0:
                kinds = [(e["seq"], e["kind"]) for e in self.events]
                raise AssertionError(f"no {kind} within {timeout_s} s; the journal: {kinds}")
            self._pump(min(left, 1.0))

    def wait_for_delta(self, item_id: str, timeout_s: float = TURN_TIMEOUT_S) -> str:
        """The text streamed so far for ``item_id``, once some was."""
        deadline = time.monotonic() + timeout_s
        while not self.deltas.get(item_id):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no streamed text for {item_id} within {timeout_s} s")
            self._pump(min(left, 1.0))
        return self.streamed_text(item_id)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [e["body"] for e in self.events if e["kind"] == kind]

    def streamed_text(self, item_id: str) -> str:
        return "".join(text for _, text in sorted(self.deltas.get(item_id, [])))

    def history(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.call("agentSession.history", afterSeq=after, limit=500)
            events += page["events"]
            if not page["hasMore"] or not page["events"]:
                return events
            after = page["events"][-1]["seq"]


@contextlib.contextmanager
def conversation(
    daemon: DaemonProcess,
    env: dict[str, str],
    cwd: Path,
    options: dict[str, Any] | None = None,
    command: list[str] | None = None,
) -> Iterator[Conversation]:
    """Create a claude session (started), follow it, and delete it afterwards (which
    ends its child)."""
    with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
        params: dict[str, Any] = {"provider": "claude", "cwd": str(cwd), "env": env}
        if options is not None:
            params["options"] = options
        if command is not None:
            params["command"] = command
        created = client.call("agentSession.create", params)
        convo = Conversation(client, created["sessionId"])
        try:
            yield convo
        finally:
            with contextlib.suppress(RpcError, OSError):
                client.call("agentSession.delete", {"sessionId": convo.session_id})


def create_error(
    daemon: DaemonProcess, env: dict[str, str], cwd: Path, **params: Any
) -> tuple[RpcError, str]:
    """Create a session whose start fails: the error, and the session's id (found by
    listing, since the failed create returns none)."""
    with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
        before = {s["sessionId"] for s in client.call("agentSession.list", {})["sessions"]}
        with pytest.raises(RpcError) as caught:
            client.call(
                "agentSession.create", {"provider": "claude", "cwd": str(cwd), "env": env, **params}
            )
        after = {s["sessionId"] for s in client.call("agentSession.list", {})["sessions"]}
        new = after - before
        assert len(new) == 1, (before, after)
        return caught.value, new.pop()


def journal_of(daemon: DaemonProcess, session_id: str) -> list[dict[str, Any]]:
    with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
        page = client.call("agentSession.history", {"sessionId": session_id, "limit": 500})
        events: list[dict[str, Any]] = page["events"]
        return events


def live_processes_with(needle: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line contains ``needle``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        info = read_proc_info(int(entry))
        if needle.encode() in cmdline and info is not None and not info.is_zombie:
            found.append(int(entry))
    return found


def last_assistant_text(convo: Conversation) -> str:
    texts = [b["text"] for b in convo.of_kind("item.completed") if b["type"] == "agentMessage"]
    return texts[-1] if texts else ""


# ---- pure pieces -----------------------------------------------------------------------


def test_option_flags_map_known_options_and_refuse_unknown_ones() -> None:
    flags = option_flags(
        {"model": "sonnet", "permissionMode": "acceptEdits", "allowedTools": ["Read", "Bash"]}
    )
    assert flags == [
        "--allowedTools",
        "Read,Bash",
        "--model",
        "sonnet",
        "--permission-mode",
        "acceptEdits",
    ]
    with pytest.raises(RpcError, match="unknown claude option 'temperature'") as caught:
        option_flags({"temperature": 0.2})
    assert caught.value.kind == "invalid_params"
    with pytest.raises(RpcError, match="maxTurns"):
        option_flags({"maxTurns": 0})
    assert "model" in KNOWN_OPTIONS


@pytest.mark.parametrize(
    ("status", "error", "api_error", "kind"),
    [
        (401, "authentication_failed", None, "auth_refused"),
        (403, None, None, "auth_refused"),
        (529, "server_error", None, "model_http_error"),
        (None, "unknown", None, "model_unreachable"),
        (None, "server_error", "connection_failed", "model_unreachable"),
        (None, None, None, "agent_error"),
    ],
)
def test_error_kinds(status: Any, error: Any, api_error: Any, kind: str) -> None:
    assert error_kind(status, error, api_error) == kind


def test_result_outcomes() -> None:
    success = {"type": "result", "subtype": "success", "is_error": False}
    done = turn_completed(success, "t", interrupt_requested=False, failure=None)
    assert done.outcome == "completed"
    aborted = {"type": "result", "subtype": "error_during_execution", "is_error": True}
    done = turn_completed(aborted, "t", interrupt_requested=True, failure=None)
    assert done.outcome == "interrupted"
    done = turn_completed(aborted, "t", interrupt_requested=False, failure=None)
    assert done.outcome == "failed"
    assert done.error is not None and done.error.kind == "agent_error"
    api = {**success, "is_error": True, "api_error_status": 500, "result": "API Error: 500"}
    done = turn_completed(api, "t", interrupt_requested=False, failure=None)
    assert done.error == ErrorInfo(kind="model_http_error", message="API Error: 500")
    # A result without is_error is never taken for a success.
    done = turn_completed({"subtype": "success"}, "t", interrupt_requested=False, failure=None)
    assert done.outcome == "failed"


# ---- the real CLI ------------------------------------------------------------------------


@needs_claude
def test_full_turn_streams_text(daemon: DaemonProcess, fake: FakeAnthropic, home: Path) -> None:
    reply = "The quick brown fox jumps over the lazy dog, streamed in small pieces."
    fake.script(TextReply(reply, chunk_chars=5, delay_s=0.005))
    with conversation(daemon, fake.claude_env(home), home / "work") as convo:
        handle = convo.info()["providerHandle"]
        assert handle and len(handle) == 36  # the uuid chosen at launch
        sent = convo.send("Say something")
        assert sent["dispatch"] == "accepted", sent
        started = convo.wait_for("turn.started")
        done = convo.wait_for("turn.completed")
        assert done["body"]["outcome"] == "completed", done
        assert done["body"]["turnId"] == started["body"]["turnId"] == sent["turnId"]
        message = convo.wait_for("item.completed", lambda b: b["type"] == "agentMessage")
        assert message["body"]["text"] == reply
        assert message["body"]["turnId"] == sent["turnId"]
        assert len(convo.deltas[message["body"]["itemId"]]) > 1  # it streamed
        assert convo.streamed_text(message["body"]["itemId"]) == reply
        item_started = convo.wait_for("item.started")
        assert started["seq"] < item_started["seq"] < message["seq"] < done["seq"]
        assert eventually(lambda: convo.info()["status"] == "idle", "the session is idle")
        # The model saw the prompt; the fake saw nothing but model calls.
        assert "Say something" in fake.message_requests()[-1].texts()
        assert {r.path.split("?")[0] for r in fake.requests} == {"/v1/messages"}


@needs_claude
@pytest.mark.parametrize("decision", ["allow", "deny"])
def test_bash_tool_call_waits_for_a_clients_decision(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path, decision: str
) -> None:
    # ``echo hi`` alone is read-only and Claude Code runs it unasked; the redirect
    # makes it a write, which needs permission.
    command = "echo hi > hi.txt"
    fake.script(
        ToolUseReply({"command": command, "description": "Write hi to a file"}),
        TextReply("All done."),
    )
    work = home / "work"
    with conversation(daemon, fake.claude_env(home), work) as convo:
        sent = convo.send("Please write hi to hi.txt")
        assert sent["dispatch"] == "accepted", sent
        asked = convo.wait_for("approval.requested")
        body = asked["body"]
        assert body["approvalKind"] == "tool"
        assert body["options"] == ["allow", "deny"]
        assert body["detail"] == command
        assert "Bash" in body["title"]
        assert convo.info()["status"] == "attention"
        tool = convo.wait_for("item.started", lambda b: b["type"] == "toolCall")
        assert tool["body"]["name"] == "Bash"
        assert body["itemId"] == tool["body"]["itemId"], "the approval names its tool call"
        assert tool["body"]["input"]["command"] == command
        assert not (work / "hi.txt").exists()  # nothing ran before the answer

        answered = convo.call(
            "agentSession.respond", approvalId=body["approvalId"], decision=decision
        )
        assert answered["decision"] == decision
        done = convo.wait_for("turn.completed")
        assert done["body"]["outcome"] == "completed", done
        result = convo.wait_for("item.completed", lambda b: b["type"] == "toolCall")["body"]
        assert result["itemId"] == tool["body"]["itemId"]
        assert result["name"] == "Bash"
        assert result["input"]["command"] == command
        assert last_assistant_text(convo) == "All done."
        # The model saw the tool's result in its next call.
        second = fake.wait_for_message_requests(2)[1]
        tool_results = [
            block
            for message in second.messages
            for block in (message["content"] if isinstance(message["content"], list) else [])
            if block.get("type") == "tool_result"
        ]
        assert len(tool_results) == 1
        if decision == "allow":
            assert result["status"] == "completed"
            assert (work / "hi.txt").read_text() == "hi\n"
            assert not tool_results[0].get("is_error")
        else:
            assert result["status"] == "declined"
            assert not (work / "hi.txt").exists()
            assert tool_results[0]["is_error"] is True
            assert "refused" in result["output"]["text"]
        assert convo.info()["status"] == "idle"


def tool_results(request: RecordedRequest) -> list[dict[str, Any]]:
    """The ``tool_result`` blocks a model call carried, in order."""
    return [
        block
        for message in request.messages
        for block in (message["content"] if isinstance(message["content"], list) else [])
        if block.get("type") == "tool_result"
    ]


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


COLOUR_QUESTION = {
    "question": "Which colour should the button be?",
    "header": "Colour",
    "options": [
        {"label": "Red", "description": "warm and loud"},
        {"label": "Blue", "description": "calm"},
    ],
    "multiSelect": False,
}


@needs_claude
def test_ask_user_question_is_answered_with_a_label(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    fake.script(
        ToolUseReply({"questions": [COLOUR_QUESTION]}, name="AskUserQuestion"),
        TextReply("Blue it is."),
    )
    with conversation(daemon, fake.claude_env(home), home / "work") as convo:
        assert convo.send("Make me a button")["dispatch"] == "accepted"
        asked = convo.wait_for("approval.requested")["body"]
        assert asked["approvalKind"] == "question"
        assert asked["title"] == "Colour: Which colour should the button be?"
        assert asked["options"] == ["Red", "Blue", "decline"]
        assert "Red: warm and loud" in asked["detail"]
        tool = convo.wait_for("item.started", lambda b: b["type"] == "toolCall")
        assert asked["itemId"] == tool["body"]["itemId"]
        assert convo.info()["status"] == "attention"

        answered = convo.call(
            "agentSession.respond", approvalId=asked["approvalId"], decision="Blue"
        )
        assert answered["decision"] == "Blue"
        done = convo.wait_for("turn.completed")
        assert done["body"]["outcome"] == "completed", done
        assert last_assistant_text(convo) == "Blue it is."
        # The model's next call carries the answer as the question's tool result.
        (result,) = tool_results(fake.wait_for_message_requests(2)[1])
        assert not result.get("is_error")
        assert '"Which colour should the button be?"="Blue"' in result_text(result)
        resolved = convo.wait_for("approval.resolved")["body"]
        assert resolved["decision"] == "Blue"


@needs_claude
def test_several_questions_are_asked_in_turn(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    sections = {
        "question": "Which sections should the page have?",
        "header": "Sections",
        "options": [
            {"label": "Intro", "description": "what it is"},
            {"label": "Usage", "description": "how to run it"},
        ],
        "multiSelect": True,
    }
    fake.script(
        ToolUseReply({"questions": [COLOUR_QUESTION, sections]}, name="AskUserQuestion"),
        TextReply("Noted."),
    )
    with conversation(daemon, fake.claude_env(home), home / "work") as convo:
        assert convo.send("Make me a page")["dispatch"] == "accepted"
        first = convo.wait_for("approval.requested")
        assert first["body"]["title"].endswith("(1 of 2)")
        convo.call("agentSession.respond", approvalId=first["body"]["approvalId"], decision="Red")
        second = convo.wait_for("approval.requested", after_seq=first["seq"])["body"]
        assert second["title"] == "Sections: Which sections should the page have? (2 of 2)"
        assert second["options"] == ["Intro", "Usage", "decline"]
        assert convo.info()["status"] == "attention"
        convo.call("agentSession.respond", approvalId=second["approvalId"], decision="Usage")
        assert convo.wait_for("turn.completed")["body"]["outcome"] == "completed"
        (result,) = tool_results(fake.wait_for_message_requests(2)[1])
        text = result_text(result)
        assert '"Which colour should the button be?"="Red"' in text
        assert '"Which sections should the page have?"="Usage"' in text


def write_plan(plan: str) -> ComputedReply:
    """The model writing ``plan`` to the plan file Claude Code names in plan mode."""

    def compute(request: RecordedRequest) -> ToolUseReply:
        found = re.search(r"create your plan at (\S+?\.md)", json.dumps(request.body))
        assert found is not None, "claude named no plan file in plan mode"
        return ToolUseReply({"file_path": found.group(1), "content": plan}, name="Write")

    return ComputedReply(compute)


@needs_claude
@pytest.mark.parametrize("decision", ["approve", "decline"])
def test_exit_plan_mode_asks_to_approve_the_plan(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path, decision: str
) -> None:
    plan = "# Plan\n\n1. Add the button\n2. Test it\n"
    fake.script(write_plan(plan), ToolUseReply({}, name="ExitPlanMode"), TextReply("Understood."))
    options = {"permissionMode": "plan"}
    with conversation(daemon, fake.claude_env(home), home / "work", options=options) as convo:
        assert convo.send("Plan a button")["dispatch"] == "accepted"
        asked = convo.wait_for("approval.requested")["body"]
        assert asked["approvalKind"] == "plan"
        assert asked["detail"] == plan
        assert asked["options"] == ["approve", "decline"]
        convo.call("agentSession.respond", approvalId=asked["approvalId"], decision=decision)
        done = convo.wait_for("turn.completed")
        assert done["body"]["outcome"] == "completed", done
        result = tool_results(fake.wait_for_message_requests(3)[2])[-1]
        text = result_text(result)
        if decision == "approve":
            assert not result.get("is_error")
            assert "approved your plan" in text and "Add the button" in text
            # Claude left plan mode: a restart must not put it back there.
            updated = convo.wait_for("session.updated", lambda b: b["by"] == "agent")["body"]
            assert updated == {"options": {"permissionMode": "default"}, "by": "agent"}
            mode = "default"
        else:
            assert result["is_error"] is True
            assert "keep planning" in text
            mode = "plan"
        assert convo.info()["options"] == {"permissionMode": mode}


async def test_a_permission_request_names_the_tool_call_it_asks_about() -> None:
    """``can_use_tool`` carries the ``tool_use`` id of the call it gates: the
    approval names it as its item, so clients show one tool call."""
    sink = RecordingSink()
    send, receive = trio.testing.memory_stream_one_way_pair()
    permissions = Permissions(LineLink(send, receive), sink)
    request = {"subtype": "can_use_tool", "tool_name": "Bash", "input": {"command": "ls"}}
    for request_id, extra in (("r1", {"tool_use_id": "toolu_1"}), ("r2", {})):
        frame = {"type": "control_request", "request_id": request_id}
        await permissions.on_request({**frame, "request": {**request, **extra}})
    assert sink.approval_fields("nativeId", "itemId", "detail") == [
        {"nativeId": "r1", "itemId": "toolu_1", "detail": "ls"},
        {"nativeId": "r2", "itemId": None, "detail": "ls"},
    ]


@needs_claude
def test_interrupt_mid_stream(daemon: DaemonProcess, fake: FakeAnthropic, home: Path) -> None:
    long_story = "Once upon a time, " * 200  # 3600 chars at 5 per 50 ms: 36 s if not stopped
    fake.script(TextReply(long_story, chunk_chars=5, delay_s=0.05))
    with conversation(daemon, fake.claude_env(home), home / "work") as convo:
        sent = convo.send("Tell me a long story")
        assert sent["dispatch"] == "accepted", sent
        item = convo.wait_for("item.started")
        convo.wait_for_delta(item["body"]["itemId"])
        result = convo.call("agentSession.interrupt")
        assert result["interrupted"] is True, result
        done = convo.wait_for("turn.completed")
        assert done["body"]["outcome"] == "interrupted", done
        # The interrupt landed mid-stream: part of the story, counted in characters.
        message = convo.wait_for("item.completed", lambda b: b["type"] == "agentMessage")
        assert 0 < len(message["body"]["text"]) < len(long_story)
        assert convo.info()["status"] == "idle"
        # The session goes on: the next prompt gets an answer.
        fake.script(TextReply("Back again."))
        after = done["seq"]
        assert convo.send("Are you there?")["dispatch"] == "accepted"
        again = convo.wait_for("turn.completed", after_seq=after)
        assert again["body"]["outcome"] == "completed", again
        assert last_assistant_text(convo) == "Back again."


@needs_claude
def test_close_then_send_resumes_natively(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    fake.script(TextReply("Noted: PAPAYA."), TextReply("The word was PAPAYA."))
    with conversation(daemon, fake.claude_env(home), home / "work") as convo:
        convo.send("Remember the word PAPAYA")
        first = convo.wait_for("turn.completed")
        handle = convo.info()["providerHandle"]
        closed = convo.call("agentSession.close")
        assert closed["wasRunning"] is True
        assert closed["session"]["phase"] == "stopped"

        sent = convo.send("What was the word?")  # starts claude again, with --resume
        assert sent["dispatch"] == "accepted", sent
        done = convo.wait_for("turn.completed", after_seq=first["seq"])
        assert done["body"]["outcome"] == "completed", done
        assert convo.info()["providerHandle"] == handle
        assert last_assistant_text(convo) == "The word was PAPAYA."
        texts = fake.message_requests()[-1].texts()
        assert "Remember the word PAPAYA" in texts
        assert "Noted: PAPAYA." in texts
        assert texts.index("Remember the word PAPAYA") < texts.index("What was the word?")


@needs_claude
def test_close_before_any_message_then_send_supersedes_the_unsaved_session(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    """Claude Code writes a transcript only once a message was sent: a session
    stopped before that has nothing to resume, and a fresh session id takes its
    place, journaled with the reason."""
    with conversation(daemon, fake.claude_env(home), home / "work") as convo:
        handle = convo.info()["providerHandle"]
        convo.call("agentSession.close")
        assert convo.send("Hello")["dispatch"] == "accepted"
        assert convo.wait_for("turn.completed")["body"]["outcome"] == "completed"
        [superseded] = convo.of_kind("thread.superseded")
        assert superseded["previousHandle"] == handle != superseded["handle"]
        assert "no transcript" in superseded["reason"]
        assert convo.info()["providerHandle"] == superseded["handle"]
        assert [b["providerHandle"] for b in convo.of_kind("child.ready")] == [
            handle,
            superseded["handle"],
        ]


@needs_claude
def test_a_session_never_prompted_is_superseded_after_a_daemon_restart(
    fake: FakeAnthropic, home: Path
) -> None:
    state = make_temp_dir()
    env = fake.claude_env(home)
    try:
        with (
            running_daemon(state_dir=state) as first,
            Client(first.socket, timeout_s=CALL_TIMEOUT_S) as client,
        ):
            created = client.call(
                "agentSession.create",
                {"provider": "claude", "cwd": str(home / "work"), "env": env},
            )
            handle = Conversation(client, created["sessionId"]).info()["providerHandle"]
        fake.script(TextReply("After the restart."))
        with (
            running_daemon(state_dir=state) as second,
            Client(second.socket, timeout_s=CALL_TIMEOUT_S) as client,
        ):
            convo = Conversation(client, created["sessionId"])
            assert convo.send("Are you there?")["dispatch"] == "accepted"
            assert convo.wait_for("turn.completed")["body"]["outcome"] == "completed"
            [superseded] = convo.of_kind("thread.superseded")
            assert superseded["previousHandle"] == handle
            assert convo.info()["providerHandle"] == superseded["handle"] != handle
            client.call("agentSession.delete", {"sessionId": created["sessionId"]})
    finally:
        shutil.rmtree(state, ignore_errors=True)


@needs_claude
def test_a_lost_transcript_of_a_session_with_turns_is_resume_failed(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    env = fake.claude_env(home)
    fake.script(TextReply("Noted."))
    with conversation(daemon, env, home / "work") as convo:
        convo.send("Remember this")
        convo.wait_for("turn.completed")
        handle = convo.info()["providerHandle"]
        convo.call("agentSession.close")
        [transcript] = Path(env["CLAUDE_CONFIG_DIR"]).glob(f"projects/*/{handle}.jsonl")
        transcript.unlink()
        sent = convo.send("What was it?")
        assert sent["dispatch"] == "rejected", sent
        assert sent["reason"].startswith(
            f"resume_failed: claude has no transcript of session {handle}"
        )
        assert convo.of_kind("thread.superseded") == []
        info = convo.info()
        assert info["providerHandle"] == handle
        assert info["error"]["kind"] == "resume_failed"


@needs_claude
def test_daemon_killed_mid_turn(fake: FakeAnthropic, home: Path) -> None:
    """Without the holder (``holder = false``), a daemon SIGKILL ends the agent: the
    next daemon reaps the orphan, interrupts the turn and the next send resumes."""
    state = make_temp_dir()
    try:
        fake.script(TextReply("A story that is cut short. " * 100, chunk_chars=5, delay_s=0.05))
        env = fake.claude_env(home)
        with (
            no_holder_config() as config,
            running_daemon(state_dir=state, extra_args=config) as first,
        ):
            with Client(first.socket, timeout_s=CALL_TIMEOUT_S) as client:
                created = client.call(
                    "agentSession.create",
                    {"provider": "claude", "cwd": str(home / "work"), "env": env},
                )
                convo = Conversation(client, created["sessionId"])
                convo.send("Tell me a story")
                item = convo.wait_for("item.started")
                convo.wait_for_delta(item["body"]["itemId"])
                info = convo.info()
            handle = info["providerHandle"]
            pid = info["child"]["pid"]
            child = read_proc_info(pid)
            assert child is not None and live_processes_with(handle) == [pid]
            first.process.kill()
            first.process.wait(timeout=10)

        with (
            no_holder_config() as config,
            running_daemon(state_dir=state, extra_args=config) as second,
        ):
            # Recovery ran before the daemon served: the orphan is gone.
            now = read_proc_info(pid)
            assert now is None or now.is_zombie or now.start_time != child.start_time
            assert live_processes_with(handle) == []
            journal = journal_of(second, created["sessionId"])
            ends = [e["body"] for e in journal if e["kind"] == "turn.completed"]
            assert ends and ends[-1]["outcome"] == "interrupted", ends
            assert ends[-1].get("reason") == "daemon-restart"

            fake.script(TextReply("Resumed after the restart."))
            with Client(second.socket, timeout_s=CALL_TIMEOUT_S) as client:
                convo = Conversation(client, created["sessionId"])
                after = convo.info()["headSeq"]
                sent = convo.send("Where were we?")
                assert sent["dispatch"] == "accepted", sent
                done = convo.wait_for("turn.completed", after_seq=after)
                assert done["body"]["outcome"] == "completed", done
                assert convo.info()["providerHandle"] == handle
                assert "Tell me a story" in fake.message_requests()[-1].texts()
                client.call("agentSession.delete", {"sessionId": created["sessionId"]})
    finally:
        shutil.rmtree(state, ignore_errors=True)


# ---- failures --------------------------------------------------------------------------


@needs_claude
def test_auth_refused_fails_the_turn_clearly(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    fake.default = AUTH_REFUSED
    with conversation(daemon, fake.claude_env(home), home / "work") as convo:
        sent = convo.send("Hello?")
        assert sent["dispatch"] == "accepted", sent  # the CLI took the prompt
        done = convo.wait_for("turn.completed")
        assert done["body"]["outcome"] == "failed", done
        assert done["body"]["error"]["kind"] == "auth_refused"
        errors = convo.of_kind("agent.error")
        assert errors and all(e["errorKind"] == "auth_refused" for e in errors)
        # Counted, not timed: the adapter gave up after AUTH_ATTEMPTS refusals while
        # the CLI still had retries left (minutes of backoff it would otherwise wait).
        retries = [e for e in errors if e.get("willRetry")]
        assert max(e["attempt"] for e in retries) >= AUTH_ATTEMPTS, retries
        assert max(e["attempt"] for e in retries) < retries[0]["maxRetries"], retries
        assert len([e for e in errors if not e.get("willRetry")]) == 1, errors
        assert convo.info()["status"] == "idle"


@needs_claude
def test_model_server_unreachable_fails_the_turn_clearly(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    env = {
        **fake.claude_env(home),
        "ANTHROPIC_BASE_URL": DEAD_PROXY,  # nothing listens there
        "CLAUDE_CODE_MAX_RETRIES": "1",  # the CLI's own backoff would take minutes
    }
    with conversation(daemon, env, home / "work") as convo:
        assert convo.send("Hello?")["dispatch"] == "accepted"
        done = convo.wait_for("turn.completed")
        assert done["body"]["outcome"] == "failed", done
        assert done["body"]["error"]["kind"] == "model_unreachable"
        assert "ECONNREFUSED" in done["body"]["error"]["message"]
        retries = convo.of_kind("agent.error")
        assert retries and retries[0]["errorKind"] == "model_unreachable"
        assert retries[0]["willRetry"] is True


def test_missing_binary_is_agent_not_found(daemon: DaemonProcess, home: Path) -> None:
    error, session_id = create_error(
        daemon, {"HOME": str(home)}, home / "work", command=[str(home / "no-such-claude")]
    )
    assert error.kind == "agent_not_found", error
    exited = [e for e in journal_of(daemon, session_id) if e["kind"] == "child.exited"]
    assert exited and exited[-1]["body"]["error"]["kind"] == "agent_not_found"


def test_unknown_option_is_refused_at_start(daemon: DaemonProcess, home: Path) -> None:
    error, _ = create_error(
        daemon, {"HOME": str(home)}, home / "work", options={"temperature": 0.5}
    )
    assert error.kind == "invalid_params"
    assert "temperature" in error.message


# ---- an impostor CLI ----------------------------------------------------------------------

# Speaks just enough stream-json to show one misbehaviour, chosen by its first
# argument; the provider appends its real flags after it.
FAKE_CLI = r"""
import json, sys
mode = sys.argv[1]
def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
def ok(request_id, version="2.1.0"):
    send({"type": "control_response", "response": {"subtype": "success",
          "request_id": request_id, "response": {"claude_code_version": version}}})
session = sys.argv[sys.argv.index("--session-id") + 1] if "--session-id" in sys.argv else None
if mode == "forgets" and "--resume" in sys.argv:
    resumed = sys.argv[sys.argv.index("--resume") + 1]
    sys.stdin.readline()
    send({"type": "result", "subtype": "error_during_execution", "is_error": True,
          "errors": [f"No conversation found with session ID: {resumed}"]})
    sys.exit(1)
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") == "control_request" and msg["request"]["subtype"] == "initialize":
        if mode == "old":
            ok(msg["request_id"], "1.0.3")
        elif mode == "garbage":
            sys.stdout.write("Welcome to Claude Code!\n")
            sys.stdout.flush()
        elif mode == "silent":
            pass
        elif mode == "asks":
            send({"type": "control_request", "request_id": "cli-1",
                  "request": {"subtype": "hook_callback", "callback_id": "h1"}})
            answer = json.loads(sys.stdin.readline())
            with open(sys.argv[2], "w") as f:
                json.dump(answer, f)
            ok(msg["request_id"])
        else:
            ok(msg["request_id"])
    elif msg.get("type") == "user":
        send({"type": "command_lifecycle", "command_uuid": msg["uuid"], "state": "queued"})
        send({"type": "system", "subtype": "init", "session_id": session})
        send({"type": "user", "message": msg["message"], "uuid": msg["uuid"], "isReplay": True})
        sys.stdout.write("<<< not json >>>\n")
        send({"type": "assistant", "message": {"id": "m1", "content": [
              {"type": "text", "text": "still here"}]}})
        send({"type": "result", "subtype": "success", "is_error": False})
"""


def fake_cli(mode: str, *args: str) -> list[str]:
    return [sys.executable, "-c", FAKE_CLI, mode, *args]


@pytest.mark.parametrize(
    ("mode", "kind"),
    [("old", "agent_unsupported"), ("garbage", "agent_protocol_error")],
)
def test_bad_handshakes_are_journaled_with_their_kind(
    daemon: DaemonProcess, home: Path, mode: str, kind: str
) -> None:
    error, session_id = create_error(
        daemon, {"HOME": str(home)}, home / "work", command=fake_cli(mode)
    )
    assert error.kind == kind, error
    exited = [e for e in journal_of(daemon, session_id) if e["kind"] == "child.exited"]
    assert exited and exited[-1]["body"]["error"]["kind"] == kind
    if mode == "old":
        assert "1.0.3" in error.message and "2.0.0" in error.message


def test_a_resume_the_cli_refuses_is_resume_failed_with_its_words(
    daemon: DaemonProcess, home: Path
) -> None:
    with conversation(
        daemon, {"HOME": str(home)}, home / "work", command=fake_cli("forgets")
    ) as convo:
        handle = convo.info()["providerHandle"]
        convo.call("agentSession.close")
        # A transcript to resume, which the CLI then does not find.
        (home / ".claude" / "projects" / "p").mkdir(parents=True)
        (home / ".claude" / "projects" / "p" / f"{handle}.jsonl").write_text("{}\n")
        sent = convo.send("hi")
        assert sent["dispatch"] == "rejected", sent
        assert sent["reason"].startswith(
            f"resume_failed: claude could not resume session {handle}: "
            f"No conversation found with session ID: {handle}"
        )
        assert convo.info()["providerHandle"] == handle


def test_handshake_timeout(home: Path) -> None:
    config = home / "config.toml"
    config.write_text("handshake_timeout_s = 1.0\n")
    with running_daemon(extra_args=["--config", str(config)]) as d:
        error, session_id = create_error(
            d, {"HOME": str(home)}, home / "work", command=fake_cli("silent")
        )
        assert error.kind == "handshake_timeout", error
        exited = [e for e in journal_of(d, session_id) if e["kind"] == "child.exited"]
        assert exited[-1]["body"]["error"]["kind"] == "handshake_timeout"


def test_unknown_control_requests_get_an_error_answer(daemon: DaemonProcess, home: Path) -> None:
    answer_file = home / "answer.json"
    with conversation(
        daemon, {"HOME": str(home)}, home / "work", command=fake_cli("asks", str(answer_file))
    ) as convo:
        answer = msgspec.json.decode(answer_file.read_bytes())
        assert answer["type"] == "control_response"
        assert answer["response"]["subtype"] == "error"
        assert answer["response"]["request_id"] == "cli-1"
        assert "hook_callback" in answer["response"]["error"]
        warning = convo.wait_for("agent.warning")
        assert warning["body"]["source"] == "hook_callback"


def test_malformed_output_mid_session_is_journaled_and_skipped(
    daemon: DaemonProcess, home: Path
) -> None:
    with conversation(daemon, {"HOME": str(home)}, home / "work", command=fake_cli("ok")) as convo:
        assert convo.send("hi")["dispatch"] == "accepted"
        done = convo.wait_for("turn.completed")
        assert done["body"]["outcome"] == "completed"
        bad = convo.wait_for("agent.error")
        assert bad["body"]["errorKind"] == "agent_protocol_error"
        assert "not json" in bad["body"]["message"]
        assert last_assistant_text(convo) == "still here"
