"""The real Claude Code with its agent in the holder (config ``holder = true``): a
streamed turn, a tool call waiting for a client's decision, an interrupt and a native
resume after a close run exactly as with the agent the daemon's own child (the same
tests, on a daemon configured so), and the agent is the holder's child.

And the agent keeps running through the daemon going away (issue 19,
``tests.peers.reattach_peer``): a turn streaming through ``agentsctl daemon
restart`` and through a daemon SIGKILL (``crash_policy`` ``reattach``; with ``end``
its turn is cut off), and an approval answered after a restart reaching Claude Code
once."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentsctl.client import Client
from agentsd.holder_link import HOLDER_SCRIPT
from agentsd.procfs import read_proc_info
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon
from tests.peers.conftest import CALL_TIMEOUT_S, Deadline
from tests.peers.fake_anthropic import FakeAnthropic, RecordedRequest, TextReply, ToolUseReply
from tests.peers.reattach_peer import (
    PIECE_DELAY_S,
    STORY,
    STORY_PIECES,
    approval_through,
    crashable_daemons,
    cut_off_by_a_crash,
    streamed_through_a_crash,
    streamed_through_a_restart_in_place,
)
from tests.peers.test_claude import (
    alarm,
    fake,
    home,
    needs_claude,
    test_bash_tool_call_waits_for_a_clients_decision,
    test_close_then_send_resumes_natively,
    test_full_turn_streams_text,
    test_interrupt_mid_stream,
)

__all__ = [
    "alarm",
    "fake",
    "home",
    "test_bash_tool_call_waits_for_a_clients_decision",
    "test_close_then_send_resumes_natively",
    "test_full_turn_streams_text",
    "test_interrupt_mid_stream",
]


_HOLDER_CONFIG = "holder = true\n"


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    """As ``test_claude``'s, with ``holder = true``."""
    base = make_temp_dir()
    try:
        config = base / "config.toml"
        config.write_text(_HOLDER_CONFIG)
        with running_daemon(extra_args=["--config", str(config)]) as d:
            yield d
    finally:
        shutil.rmtree(base, ignore_errors=True)


@needs_claude
def test_claude_runs_as_the_holders_child(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
        created = client.call(
            "agentSession.create",
            {"provider": "claude", "cwd": str(home / "work"), "env": fake.claude_env(home)},
        )
        child = read_proc_info(created["session"]["child"]["pid"])
        assert child is not None and child.ppid != daemon.process.pid
        holder = read_proc_info(child.ppid)
        assert holder is not None and _runs_the_holder(child.ppid)
        client.call("agentSession.close", {"sessionId": created["sessionId"]})


def _runs_the_holder(pid: int) -> bool:
    return str(HOLDER_SCRIPT).encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


# -- through the daemon going away (issue 19) -------------------------------------------


def _held_story(fake: FakeAnthropic) -> threading.Event:
    """Script the story, held after its first piece; the event releases the rest."""
    hold = threading.Event()
    chunk_chars = -(-len(STORY) // STORY_PIECES)
    fake.script(TextReply(STORY, chunk_chars=chunk_chars, delay_s=PIECE_DELAY_S, hold=hold))
    return hold


def _create(fake: FakeAnthropic, home: Path) -> Callable[[Client], str]:
    def create(client: Client) -> str:
        params = {"provider": "claude", "cwd": str(home / "work"), "env": fake.claude_env(home)}
        sid: str = client.call("agentSession.create", params)["sessionId"]
        return sid

    return create


@needs_claude
def test_a_turn_streams_on_through_a_restart_in_place(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    hold = _held_story(fake)
    with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
        sid = _create(fake, home)(client)
    streamed_through_a_restart_in_place(daemon, sid, hold, STORY, Deadline())
    assert len(fake.message_requests()) == 1  # one model call: never started again


@needs_claude
@pytest.mark.parametrize("crash_policy", ["reattach", "end"])
def test_a_turn_through_a_daemon_sigkill(
    crash_policy: str, fake: FakeAnthropic, home: Path
) -> None:
    hold = _held_story(fake)
    with crashable_daemons(_HOLDER_CONFIG, crash_policy) as daemons:
        if crash_policy == "reattach":
            streamed_through_a_crash(daemons, _create(fake, home), hold, STORY, Deadline())
        else:
            cut_off_by_a_crash(daemons, _create(fake, home), hold, Deadline())
    assert len(fake.message_requests()) == 1


@needs_claude
@pytest.mark.parametrize("how", ["restart", "sigkill"])
def test_an_approval_answered_after_the_daemon_came_back_reaches_claude_once(
    how: str, daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    # A redirect makes the command a write, which needs permission.
    command = "echo ran >> ran.txt"
    fake.script(ToolUseReply({"command": command, "description": "Append"}), TextReply("Ran it."))
    with crashable_daemons(_HOLDER_CONFIG, "reattach") as daemons:
        events = approval_through(how, daemon, daemons, _create(fake, home), "allow", Deadline())
    tools = [
        e["body"]
        for e in events
        if e["kind"] == "item.completed" and e["body"]["type"] == "toolCall"
    ]
    assert [t["status"] for t in tools] == ["completed"]
    assert (home / "work" / "ran.txt").read_text() == "ran\n"  # the command ran once
    first, second = fake.wait_for_message_requests(2)
    assert len(fake.message_requests()) == 2
    assert _tool_results(first) == 0
    assert _tool_results(second) == 1


def _tool_results(request: RecordedRequest) -> int:
    return sum(
        block.get("type") == "tool_result"
        for message in request.messages
        if isinstance(message["content"], list)
        for block in message["content"]
    )
