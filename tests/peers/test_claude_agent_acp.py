"""A second real third-party ACP agent through a real daemon:
``@zed-industries/claude-agent-acp`` (pinned in tests/agents/package.json, with the
Claude Code its Agent SDK bundles) against the fake Messages API of
``fake_anthropic``, configured as ``[agents.claude-agent-acp]``.

Under CI the agent must be installed (``make test`` installs it): a missing one
fails there, and is skipped only outside CI.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsctl.client import Client
from tests.daemon_process import DaemonProcess, make_temp_dir
from tests.peers import acp_peer
from tests.peers.acp_peer import acp_daemon, send
from tests.peers.conftest import CALL_TIMEOUT_S, Deadline, Follower, processes_with_env
from tests.peers.fake_anthropic import (
    FakeAnthropic,
    TextReply,
    ToolUseReply,
)
from tests.peers.test_claude import fake, home

VERSION = "0.23.1"
BINARY = acp_peer.installed(
    f"claude-agent-acp {VERSION}", f"claude-agent-acp-{VERSION}", "dist/index.js"
)
COMMAND = ["node", str(BINARY)]
# claude-agent-acp starts Claude Code with --allow-dangerously-skip-permissions, which
# Claude Code refuses as root unless it is told it runs in a sandbox (CI runs as root).
AGENT_ENV = {"IS_SANDBOX": "1"}
__all__ = ["fake", "home"]  # test_claude's fake Messages API and private HOME, fixtures


@pytest.fixture(scope="module")
def peer_daemon() -> Iterator[DaemonProcess]:
    with acp_peer.module_daemon(
        "claude-agent-acp", COMMAND, AGENT_ENV, acp_peer.EOF_IGNORED_LADDER
    ) as daemon:
        yield daemon


def create(client: Client, home: Path, fake: FakeAnthropic) -> dict[str, Any]:
    return acp_peer.create(client, "claude-agent-acp", home / "work", fake.claude_env(home))


def agent_processes(home: Path) -> list[int]:
    return processes_with_env("HOME", str(home))


def test_a_turn_streams_text_and_completes(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeAnthropic,
    home: Path,
    deadline: Deadline,
) -> None:
    answer = "Hello from the fake model, in several pieces."
    fake.script(TextReply(answer, chunk_chars=8))
    session = create(client, home, fake)
    sid = session["sessionId"]
    assert session["phase"] == "running"
    assert session["child"]["agentVersion"] == VERSION
    with Follower(peer_daemon, sid, deadline) as follower:
        turn_id = send(client, sid, "Say hello")["turnId"]
        done = follower.wait_for("turn.completed")
        assert done["body"] == {"turnId": turn_id, "outcome": "completed"}
        message = follower.wait_for(
            "item.completed", lambda b: b["type"] == "agentMessage" and bool(b.get("text"))
        )
        assert message["body"]["text"] == answer
        assert follower.streamed_text(message["body"]["itemId"]) == answer
        assert follower.wait_for("commands.updated")["body"]["commands"]
        ready = follower.wait_for("child.ready")["body"]
        assert ready["agentName"] == "@zed-industries/claude-agent-acp"
    assert fake.message_requests()[-1].texts()[-1] == "Say hello"


def test_a_permission_approved_by_one_client_while_another_follows(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeAnthropic,
    home: Path,
    deadline: Deadline,
) -> None:
    fake.script(
        ToolUseReply({"command": "echo hi > out.txt", "description": "Write hi to a file"}),
        TextReply("Wrote it."),
    )
    sid = create(client, home, fake)["sessionId"]
    with (
        Follower(peer_daemon, sid, deadline) as follower,
        Client(peer_daemon.socket, timeout_s=CALL_TIMEOUT_S) as other,
    ):
        send(client, sid, "Write hi to out.txt")
        asked = follower.wait_for("approval.requested")["body"]
        allow = next(o for o in asked["options"] if "allow" in o and "always" not in o)
        assert f"{allow} (allow_once)" in asked["detail"]
        other.call(
            "agentSession.respond",
            {"sessionId": sid, "approvalId": asked["approvalId"], "decision": allow},
        )
        tool = follower.wait_for(
            "item.completed", lambda b: b["type"] == "toolCall" and b.get("status") == "completed"
        )
        assert tool["body"]["itemId"] == asked["itemId"]
        done = follower.wait_for("turn.completed")
        assert done["body"]["outcome"] == "completed"
    assert (home / "work" / "out.txt").read_text() == "hi\n"


def test_a_cancel_mid_turn_ends_it_interrupted_and_nothing_late_is_journaled(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeAnthropic,
    home: Path,
    deadline: Deadline,
) -> None:
    fake.script(TextReply("word " * 200, chunk_chars=5, delay_s=0.05))
    sid = create(client, home, fake)["sessionId"]
    streamed = acp_peer.cancel_mid_turn(client, peer_daemon, sid, deadline)
    assert 0 < streamed.count("word") < 200


def test_close_then_send_resumes_the_session_with_its_history(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeAnthropic,
    home: Path,
    deadline: Deadline,
) -> None:
    fake.script(TextReply("The first answer."), TextReply("The second answer."))
    session = create(client, home, fake)
    acp_peer.close_then_send(
        client, peer_daemon, session, deadline, lambda: not agent_processes(home)
    )
    texts = fake.message_requests()[-1].texts()
    assert "The first question" in texts
    assert "The first answer." in texts
    assert texts[-1] == "The second question"


def test_a_daemon_killed_mid_turn_leaves_no_agent_and_the_next_send_resumes(
    fake: FakeAnthropic, home: Path
) -> None:
    """Without the holder (``holder = false``): the crash ends the agent."""
    base = make_temp_dir()
    fake.script(TextReply("word " * 400, chunk_chars=5, delay_s=0.05), TextReply("Back again."))
    try:
        acp_peer.daemon_killed_mid_turn_then_send(
            base,
            lambda base, state: acp_daemon(
                base,
                "claude-agent-acp",
                COMMAND,
                AGENT_ENV,
                state,
                acp_peer.EOF_IGNORED_LADDER,
                no_holder=True,
            ),
            lambda client: create(client, home, fake),
            lambda: agent_processes(home),
        )
        texts = fake.message_requests()[-1].texts()
        assert "Talk for a long while" in texts
        assert texts[-1] == "Are you there?"
    finally:
        shutil.rmtree(base, ignore_errors=True)
