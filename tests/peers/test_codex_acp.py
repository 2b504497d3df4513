"""A real third-party ACP agent through a real daemon: ``@zed-industries/codex-acp``
(pinned in tests/agents/package.json) against the fake Responses API of
``fake_openai``, configured as ``[agents.codex-acp]``.

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
from tests.peers.fake_openai import (
    FakeOpenAI,
    ShellCall,
    TextReply,
    input_texts,
    shell_call_outputs,
)

VERSION = "0.16.0"
COMMAND = [
    str(acp_peer.installed(f"codex-acp {VERSION}", f"codex-acp-{VERSION}", "bin/codex-acp.js"))
]


@pytest.fixture(scope="module")
def peer_daemon() -> Iterator[DaemonProcess]:
    with acp_peer.module_daemon("codex-acp", COMMAND, {}, acp_peer.EOF_IGNORED_LADDER) as daemon:
        yield daemon


def create(client: Client, workdir: Path, env: dict[str, str]) -> dict[str, Any]:
    return acp_peer.create(client, "codex-acp", workdir, env)


def agent_processes(codex_home: Path) -> list[int]:
    return processes_with_env("CODEX_HOME", str(codex_home))


def test_a_turn_streams_text_and_completes(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    answer = "Hello from the fake model, in several pieces."
    fake.script(TextReply(answer, chunks=6))
    session = create(client, workdir, codex_env)
    sid = session["sessionId"]
    assert session["phase"] == "running"
    assert session["providerHandle"]
    assert session["child"]["agentVersion"] == VERSION
    with Follower(peer_daemon, sid, deadline) as follower:
        turn_id = send(client, sid, "Say hello")["turnId"]
        done = follower.wait_for("turn.completed")
        assert done["body"] == {"turnId": turn_id, "outcome": "completed"}
        message = follower.wait_for("item.completed", lambda b: b["type"] == "agentMessage")
        # codex-acp streams Codex's warning about the fake model's missing metadata
        # as message text, in the same message.
        assert message["body"]["text"].endswith(answer)
        assert follower.streamed_text(message["body"]["itemId"]) == message["body"]["text"]
    (request,) = fake.requests()
    assert input_texts(request.body, "user")[-1] == "Say hello"


def test_a_permission_approved_by_one_client_while_another_follows(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(ShellCall("echo hi"), TextReply("The command printed hi."))
    sid = create(client, workdir, codex_env)["sessionId"]
    with (
        Follower(peer_daemon, sid, deadline) as follower,
        Client(peer_daemon.socket, timeout_s=CALL_TIMEOUT_S) as other,
    ):
        send(client, sid, "Run echo hi")
        asked = follower.wait_for("approval.requested")["body"]
        # codex-acp's option ids, with their ACP kinds in the detail.
        assert asked["options"] == ["approved", "approved-execpolicy-amendment", "abort"]
        assert "approved (allow_once)" in asked["detail"]
        assert asked["approvalKind"] == "execute"
        assert client.call("agentSession.get", {"sessionId": sid})["session"]["status"] == (
            "attention"
        )
        other.call(
            "agentSession.respond",
            {"sessionId": sid, "approvalId": asked["approvalId"], "decision": "approved"},
        )
        ran = follower.wait_for("item.completed", lambda b: b["itemId"] == asked["itemId"])
        assert ran["body"]["type"] == "toolCall"
        assert ran["body"]["status"] == "completed"
        assert '"stdout":"hi\\n"' in ran["body"]["output"]["text"]
        done = follower.wait_for("turn.completed")
        assert done["body"]["outcome"] == "completed"
        resolved = follower.wait_for("approval.resolved")["body"]
        assert resolved["decision"] == "approved" and resolved["by"] == "client"
    _, second = fake.requests()
    assert any("hi" in out for out in shell_call_outputs(second.body)), second.body["input"][-2:]


def test_a_cancel_mid_turn_ends_it_interrupted_and_nothing_late_is_journaled(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(TextReply("word " * 200, chunks=200, chunk_delay_s=0.05))
    sid = create(client, workdir, codex_env)["sessionId"]
    streamed = acp_peer.cancel_mid_turn(client, peer_daemon, sid, deadline)
    assert 0 < streamed.count("word") < 200


def test_close_then_send_resumes_the_session_with_its_history(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    codex_home: Path,
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(TextReply("The first answer."), TextReply("The second answer."))
    session = create(client, workdir, codex_env)
    texts = acp_peer.close_then_send(
        client, peer_daemon, session, deadline, lambda: not agent_processes(codex_home)
    )
    # A session/load replay is not journaled a second time.
    assert sum(1 for t in texts if t and t.endswith("The first answer.")) == 1
    last = fake.requests()[-1].body
    assert "The first question" in input_texts(last, "user")
    assert "The first answer." in input_texts(last, "assistant")
    assert input_texts(last, "user")[-1] == "The second question"


def test_a_daemon_killed_mid_turn_leaves_no_agent_and_the_next_send_resumes(
    fake: FakeOpenAI, codex_env: dict[str, str], codex_home: Path, workdir: Path
) -> None:
    """Without the holder (``holder = false``): the crash ends the agent."""
    base = make_temp_dir()
    fake.script(TextReply("word " * 400, chunks=400, chunk_delay_s=0.05), TextReply("Back again."))
    try:
        acp_peer.daemon_killed_mid_turn_then_send(
            base,
            lambda base, state: acp_daemon(
                base,
                "codex-acp",
                COMMAND,
                {},
                state,
                acp_peer.EOF_IGNORED_LADDER,
                no_holder=True,
            ),
            lambda client: create(client, workdir, codex_env),
            lambda: agent_processes(codex_home),
        )
        last = fake.requests()[-1].body
        assert "Talk for a long while" in input_texts(last, "user")
        assert input_texts(last, "user")[-1] == "Are you there?"
    finally:
        shutil.rmtree(base, ignore_errors=True)
