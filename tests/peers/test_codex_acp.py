"""A real third-party ACP agent through a real daemon: ``@zed-industries/codex-acp``
(pinned in tests/agents/package.json) against the fake Responses API of
``fake_openai``, configured as ``[agents.codex-acp]``.

Under CI the agent must be installed (``make test`` installs it): a missing one
fails there, and is skipped only outside CI.
"""

from __future__ import annotations

import shutil
import signal
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
    with acp_peer.module_daemon("codex-acp", COMMAND, {}) as daemon:
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
    sid, handle = session["sessionId"], session["providerHandle"]
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "The first question")
        follower.wait_for("turn.completed")
        closed = client.call("agentSession.close", {"sessionId": sid})
        assert closed["wasRunning"] is True
        deadline.poll(lambda: not agent_processes(codex_home), "codex-acp to exit")
        second = send(client, sid, "The second question")
        follower.wait_for("turn.completed", lambda b: b["turnId"] == second["turnId"])
        ready = [e["body"] for e in follower.events if e["kind"] == "child.ready"]
        assert [r["providerHandle"] for r in ready] == [handle, handle]
        assert "thread.superseded" not in follower.kinds()
        texts = [e["body"].get("text") for e in follower.events if e["kind"] == "item.completed"]
        # A session/load replay is not journaled a second time.
        assert sum(1 for t in texts if t and t.endswith("The first answer.")) == 1
    last = fake.requests()[-1].body
    assert "The first question" in input_texts(last, "user")
    assert "The first answer." in input_texts(last, "assistant")
    assert input_texts(last, "user")[-1] == "The second question"


def test_a_daemon_killed_mid_turn_leaves_no_agent_and_the_next_send_resumes(
    fake: FakeOpenAI, codex_env: dict[str, str], codex_home: Path, workdir: Path
) -> None:
    deadline = Deadline()
    base = make_temp_dir()
    state = base / "state"
    fake.script(TextReply("word " * 400, chunks=400, chunk_delay_s=0.05), TextReply("Back again."))
    try:
        with acp_daemon(base, "codex-acp", COMMAND, {}, state) as daemon:
            with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
                session = create(client, workdir, codex_env)
                sid, handle = session["sessionId"], session["providerHandle"]
                with Follower(daemon, sid, deadline) as follower:
                    turn_id = send(client, sid, "Talk for a long while")["turnId"]
                    follower.wait_for_delta()
                    assert agent_processes(codex_home)
            daemon.stop(signal.SIGKILL)

        with acp_daemon(base, "codex-acp", COMMAND, {}, state) as daemon:
            # Recovery ran before the daemon answered its first ping.
            assert agent_processes(codex_home) == []
            with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
                info = client.call("agentSession.get", {"sessionId": sid})["session"]
                assert info["phase"] == "stopped"
                history = client.call("agentSession.history", {"sessionId": sid, "limit": 1000})
                ended = [e["body"] for e in history["events"] if e["kind"] == "turn.completed"]
                assert ended == [
                    {"turnId": turn_id, "outcome": "interrupted", "reason": "daemon-restart"}
                ]
                result = send(client, sid, "Are you there?")
                with Follower(daemon, sid, deadline) as follower:
                    follower.wait_for("turn.completed", lambda b: b["turnId"] == result["turnId"])
                    ready = [e["body"] for e in follower.events if e["kind"] == "child.ready"]
                    assert {r["providerHandle"] for r in ready} == {handle}
                client.call("agentSession.close", {"sessionId": sid})
            deadline.poll(lambda: not agent_processes(codex_home), "codex-acp to exit")
        last = fake.requests()[-1].body
        assert "Talk for a long while" in input_texts(last, "user")
        assert input_texts(last, "user")[-1] == "Are you there?"
    finally:
        shutil.rmtree(base, ignore_errors=True)
