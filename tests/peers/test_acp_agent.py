"""An ACP agent as a provider, through a real daemon: the minimal agent of
``acp_test_agent.py`` configured as ``[agents.testacp]``, behaving and misbehaving."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsctl.client import Client
from agentsd_protocol.errors import (
    AgentStartFailed,
    ContentUnsupported,
    HandshakeTimeout,
    InvalidParams,
    UnknownCommand,
    UnknownOption,
)
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon
from tests.peers.conftest import CALL_TIMEOUT_S, Deadline, Follower

AGENT = str(Path(__file__).with_name("acp_test_agent.py"))


def agent_config(path: Path, *flags: str, handshake_timeout_s: float = 10.0) -> Path:
    command = [sys.executable, AGENT, *flags]
    path.write_text(
        f"handshake_timeout_s = {handshake_timeout_s}\n"
        f"[agents.testacp]\ncommand = {json.dumps(command)}\n"
        'display_name = "ACP test agent"\n'
        f"[agents.testacp-noload]\ncommand = {json.dumps([*command, '--no-load'])}\n"
        f"[agents.testacp-auth]\ncommand = {json.dumps([*command, '--auth'])}\n"
        f"[agents.testacp-forget]\ncommand = {json.dumps([*command, '--forget'])}\n"
        f"[agents.testacp-images]\ncommand = {json.dumps([*command, '--images'])}\n"
    )
    return path


@pytest.fixture(scope="module")
def peer_daemon() -> Iterator[DaemonProcess]:
    base = make_temp_dir()
    try:
        config = agent_config(base / "config.toml")
        with running_daemon(extra_args=["--config", str(config)]) as daemon:
            yield daemon
    finally:
        shutil.rmtree(base, ignore_errors=True)


def create(client: Client, workdir: Path, provider: str = "testacp", **params: Any) -> str:
    result = client.call(
        "agentSession.create", {"provider": provider, "cwd": str(workdir), **params}
    )
    session_id: str = result["session"]["sessionId"]
    return session_id


def send(client: Client, session_id: str, text: str) -> dict[str, Any]:
    result: dict[str, Any] = client.call(
        "agentSession.send", {"sessionId": session_id, "text": text}
    )
    assert result["dispatch"] == "accepted", result
    return result


def history(client: Client, session_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = client.call(
        "agentSession.history", {"sessionId": session_id, "limit": 1000}
    )["events"]
    return events


def agent_processes(session_id: str, client: Client) -> list[int]:
    """The session's agent, if its recorded pid still runs (and is not a zombie)."""
    child = client.call("agentSession.get", {"sessionId": session_id})["session"].get("child")
    pid = child.get("pid") if child else None
    if pid is None:
        return []
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return []
    return [] if stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] == b"Z" else [pid]


def hanging_agents() -> list[int]:
    """Pids of live test agents started with ``--hang-init``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if AGENT.encode() in argv and b"--hang-init" in argv:
            found.append(int(entry))
    return found


def test_a_turn_streams_items_a_plan_and_completes(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir)
    info = client.call("agentSession.get", {"sessionId": sid})["session"]
    assert info["phase"] == "running"
    assert info["providerHandle"].startswith("s-")
    assert info["child"]["agentVersion"] == "1.2.3"
    (ready,) = [e["body"] for e in history(client, sid) if e["kind"] == "child.ready"]
    assert ready["agentName"] == "acp-test-agent"
    with Follower(peer_daemon, sid, deadline) as follower:
        turn_id = send(client, sid, "hello")["turnId"]
        done = follower.wait_for("turn.completed")
        assert done["body"] == {"turnId": turn_id, "outcome": "completed"}
        thought = follower.wait_for("item.completed", lambda b: b["type"] == "reasoning")
        assert thought["body"]["text"] == "thinking"
        message = follower.wait_for("item.completed", lambda b: b["type"] == "agentMessage")
        assert message["body"]["text"] == "echo: hello"
        assert message["body"]["turnId"] == turn_id
        assert follower.streamed_text(message["body"]["itemId"]) == "echo: hello"
        commands = follower.wait_for("commands.updated")["body"]["commands"]
        assert commands == [
            {"name": "review", "description": "Review the changes"},
            {"name": "ask", "description": "Ask", "hint": "question"},
        ]
        plan = follower.wait_for("turn.plan")["body"]
        assert plan["plan"] == [{"step": "echo", "status": "in_progress"}]
        kinds = follower.kinds()
        assert (
            kinds.index("turn.started") < kinds.index("turn.plan") < kinds.index("turn.completed")
        )


def test_a_tool_call_is_one_item_with_its_diff_and_content(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir)
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "tool")
        follower.wait_for("turn.completed")
        started = follower.wait_for("item.started", lambda b: b["itemId"] == "t1")["body"]
        assert started["type"] == "toolCall" and started["name"] == "Edit a.txt"
        done = follower.wait_for("item.completed", lambda b: b["itemId"] == "t1")["body"]
    assert done["status"] == "completed"
    assert done["changes"] == [{"path": "/w/a.txt", "kind": "update"}]
    assert "-a\n+b\n" in done["diff"]["text"]
    assert done["output"]["text"] == "edited"
    assert json.loads(done["detail"]["text"]) == {
        "kind": "edit",
        "locations": [{"path": "/w/a.txt", "line": 1}],
    }
    assert json.loads(done["arguments"]["text"]) == {"path": "/w/a.txt"}


def test_a_permission_answered_by_one_client_reaches_the_agent_while_another_follows(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir)
    with (
        Follower(peer_daemon, sid, deadline) as follower,
        Client(peer_daemon.socket, timeout_s=CALL_TIMEOUT_S) as other,
    ):
        send(client, sid, "permission")
        asked = follower.wait_for("approval.requested")["body"]
        assert asked["options"] == ["yes", "no"]
        assert asked["approvalKind"] == "execute"
        assert asked["title"] == "Run ls"
        assert "yes (allow_once): Allow" in asked["detail"]
        assert asked["itemId"] == "call-1"
        assert asked["optionDetails"] == [
            {"optionId": "yes", "name": "Allow", "kind": "allow_once"},
            {"optionId": "no", "name": "Reject", "kind": "reject_once"},
        ]
        other.call(
            "agentSession.respond",
            {"sessionId": sid, "approvalId": asked["approvalId"], "decision": "yes"},
        )
        follower.wait_for("turn.completed")
        message = follower.wait_for("item.completed", lambda b: b["type"] == "agentMessage")
        resolved = follower.wait_for("approval.resolved")["body"]
    assert message["body"]["text"] == 'outcome: {"outcome": "selected", "optionId": "yes"}'
    assert resolved["decision"] == "yes" and resolved["by"] == "client"


def test_a_cancel_mid_turn_ends_it_interrupted_and_a_late_permission_is_refused(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir)
    with Follower(peer_daemon, sid, deadline) as follower:
        turn_id = send(client, sid, "late-permission")["turnId"]
        follower.wait_for_delta()
        assert client.call("agentSession.interrupt", {"sessionId": sid})["interrupted"] is True
        done = follower.wait_for("turn.completed")
        assert done["body"] == {"turnId": turn_id, "outcome": "interrupted", "reason": "cancelled"}
        # The agent's late words came before its late request, so before this.
        warning = follower.wait_for("agent.warning")["body"]
        assert warning["source"] == "session/request_permission"
        assert "no turn is running" in warning["message"]
        assert "permission request with cancelled" in warning["message"]
        # The session goes on, and nothing of the late turn was journaled.
        send(client, sid, "after")
        follower.wait_for("turn.completed", lambda b: b["turnId"] != turn_id)
    events = history(client, sid)
    assert not [e for e in events if e["kind"] == "approval.requested"]
    texts = [e["body"].get("text") for e in events if e["kind"] == "item.completed"]
    assert not [t for t in texts if t and "late outcome" in t]
    assert "echo: after" in texts


def test_malformed_updates_are_agent_errors_and_the_session_goes_on(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir)
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "malformed")
        done = follower.wait_for("turn.completed")["body"]
        assert done["outcome"] == "completed"
        errors = [e["body"] for e in follower.events if e["kind"] == "agent.error"]
        assert len(errors) == 4, errors
        assert {e["errorKind"] for e in errors} == {"agent_protocol_error"}
        assert any("not a JSON object" in e["message"] for e in errors)
        message = follower.wait_for("item.completed", lambda b: b["type"] == "agentMessage")
        assert message["body"]["text"] == "still here"
        send(client, sid, "again")
        follower.wait_for("item.completed", lambda b: b.get("text") == "echo: again")


def test_requests_it_does_not_offer_are_refused_method_not_found(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir)
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "requests")
        follower.wait_for("turn.completed")
        message = follower.wait_for("item.completed", lambda b: b["type"] == "agentMessage")
        assert json.loads(message["body"]["text"]) == [-32601, -32601]
        sources = {e["body"]["source"] for e in follower.events if e["kind"] == "agent.warning"}
        assert sources == {"fs/read_text_file", "x/unknown"}


def test_initialize_offers_no_file_system_and_no_terminal(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    # What agentsd does not implement it must not offer: an agent that believed it
    # would send fs/* or terminal/* requests that can only be refused.
    sid = create(client, workdir)
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "capabilities")
        follower.wait_for("turn.completed")
        message = follower.wait_for("item.completed", lambda b: b["type"] == "agentMessage")
    offered = json.loads(message["body"]["text"])
    assert offered == {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}


def test_an_agent_that_exits_mid_turn_settles_the_turn_and_leaves_nothing(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir)
    pids = agent_processes(sid, client)
    assert pids
    with Follower(peer_daemon, sid, deadline) as follower:
        turn_id = send(client, sid, "exit")["turnId"]
        exited = follower.wait_for("child.exited")["body"]
        assert exited["returncode"] == 3
        done = follower.wait_for("turn.completed")["body"]
        assert done["turnId"] == turn_id and done["outcome"] != "completed"
    deadline.poll(lambda: not Path(f"/proc/{pids[0]}").exists(), "the agent to be reaped")
    # The next send starts the agent again and loads the session.
    send(client, sid, "back")
    deadline.poll(
        lambda: client.call("agentSession.get", {"sessionId": sid})["session"]["status"] == "idle",
        "the session to be idle",
    )


def test_close_then_send_loads_the_session_without_journaling_its_replay(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir)
    handle = client.call("agentSession.get", {"sessionId": sid})["session"]["providerHandle"]
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "first")
        follower.wait_for("turn.completed")
        assert client.call("agentSession.close", {"sessionId": sid})["wasRunning"] is True
        second = send(client, sid, "second")
        follower.wait_for("turn.completed", lambda b: b["turnId"] == second["turnId"])
    ready = [e["body"] for e in history(client, sid) if e["kind"] == "child.ready"]
    assert [r["providerHandle"] for r in ready] == [handle, handle]
    texts = [e["body"].get("text") for e in history(client, sid) if e["kind"] == "item.completed"]
    assert "replayed history" not in texts
    assert "echo: second" in texts


def test_an_agent_that_cannot_resume_is_superseded_with_a_note(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir, provider="testacp-noload")
    handle = client.call("agentSession.get", {"sessionId": sid})["session"]["providerHandle"]
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "first")
        follower.wait_for("turn.completed")
        client.call("agentSession.close", {"sessionId": sid})
        send(client, sid, "second")
        note = follower.wait_for("thread.superseded")["body"]
    assert note["previousHandle"] == handle
    assert note["handle"] != handle
    assert "can neither resume nor load" in note["reason"]


def test_a_mode_the_agent_switches_to_is_kept_for_its_next_start(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir)
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "switch")
        updated = follower.wait_for("session.updated", lambda b: b["by"] == "agent")["body"]
        assert updated == {"options": {"mode": "code"}, "by": "agent"}
        follower.wait_for("turn.completed")
        client.call("agentSession.close", {"sessionId": sid})
        # The new agent process loads the session in its default mode: agentsd sets it.
        asked = send(client, sid, "whatmode")
        follower.wait_for("turn.completed", lambda b: b["turnId"] == asked["turnId"])
        follower.wait_for("item.completed", lambda b: b.get("text") == "mode: code")


def test_an_unknown_option_is_refused() -> None:
    base = make_temp_dir()
    try:
        config = agent_config(base / "config.toml")
        with (
            running_daemon(extra_args=["--config", str(config)]) as daemon,
            Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client,
            pytest.raises(InvalidParams, match="unknown ACP agent option 'model'"),
        ):
            create(client, base, options={"model": "x"})
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_an_agent_that_hangs_in_initialize_times_out_its_handshake(workdir: Path) -> None:
    base = make_temp_dir()
    try:
        config = agent_config(base / "config.toml", "--hang-init", handshake_timeout_s=1.0)
        with (
            running_daemon(extra_args=["--config", str(config)]) as daemon,
            Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client,
        ):
            with pytest.raises(HandshakeTimeout):
                create(client, workdir)
            (info,) = client.call("agentSession.list", {})["sessions"]
            assert info["phase"] == "stopped"
        assert hanging_agents() == []
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_an_agent_that_needs_a_login_fails_its_start_naming_its_methods(
    client: Client, workdir: Path
) -> None:
    with pytest.raises(AgentStartFailed, match=r"log in first \(its methods: Log in with Test\)"):
        create(client, workdir, provider="testacp-auth")


def test_status_reports_acp_agents_and_the_version_they_reported(
    client: Client, workdir: Path
) -> None:
    create(client, workdir)
    programs = {p["provider"]: p for p in client.call("daemon.status", {})["agentEnv"]["programs"]}
    assert {"testacp", "codex-acp", "claude-agent-acp", "gemini"} <= set(programs)
    assert programs["testacp"]["path"] == sys.executable
    assert programs["testacp"]["version"] == "1.2.3"
    assert programs["gemini"]["command"] == "gemini"


def test_a_lost_session_that_had_turns_is_resume_failed_with_the_agents_words(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir, provider="testacp-forget")
    handle = client.call("agentSession.get", {"sessionId": sid})["session"]["providerHandle"]
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "first")
        follower.wait_for("turn.completed")
    client.call("agentSession.close", {"sessionId": sid})
    result = client.call("agentSession.send", {"sessionId": sid, "text": "second"})
    assert result["dispatch"] == "rejected", result
    assert result["reason"].startswith("resume_failed: testacp-forget could not resume session")
    assert "Resource not found" in result["reason"]
    assert f"no session {handle} here" in result["reason"]
    assert not [e for e in history(client, sid) if e["kind"] == "thread.superseded"]


def test_a_lost_session_without_turns_is_superseded(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir, provider="testacp-forget")
    handle = client.call("agentSession.get", {"sessionId": sid})["session"]["providerHandle"]
    client.call("agentSession.close", {"sessionId": sid})
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "hello")
        note = follower.wait_for("thread.superseded")["body"]
        follower.wait_for("item.completed", lambda b: b.get("text") == "echo: hello")
    assert note["previousHandle"] == handle
    assert "which had no turn: Resource not found" in note["reason"]


def test_commands_and_a_live_mode_switch(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    sid = create(client, workdir)
    with Follower(peer_daemon, sid, deadline) as follower:
        follower.wait_for("commands.updated")
        listed = client.call("agentSession.commands", {"sessionId": sid})["commands"]
        # No compaction of its own and no compact command: none is offered.
        assert [(c["name"], c["source"]) for c in listed] == [
            ("clear", "agentsd"),
            ("review", "agent"),
            ("ask", "agent"),
        ]
        with pytest.raises(UnknownCommand):
            client.call("agentSession.command", {"sessionId": sid, "name": "compact"})
        ran = client.call("agentSession.command", {"sessionId": sid, "name": "ask", "args": "why?"})
        assert ran["dispatch"] == "accepted"
        follower.wait_for("item.completed", lambda b: b.get("text") == "echo: /ask why?")
        follower.wait_for("turn.completed")

        options = client.call("agentSession.options", {"sessionId": sid})["options"]
        assert [o["key"] for o in options] == ["mode", "mcpServers"]
        mode = options[0]
        assert [c["value"] for c in mode["choices"]] == ["ask", "code"]
        assert (mode["key"], mode["appliesAt"]) == ("mode", "now")
        switched = client.call(
            "agentSession.setOptions", {"sessionId": sid, "changes": {"mode": "code"}}
        )
        assert switched["appliesAt"] == {"mode": "now"}
        asked = send(client, sid, "whatmode")
        follower.wait_for("turn.completed", lambda b: b["turnId"] == asked["turnId"])
        follower.wait_for("item.completed", lambda b: b.get("text") == "mode: code")
        with pytest.raises(UnknownOption):
            client.call("agentSession.setOptions", {"sessionId": sid, "changes": {"model": "x"}})
    kinds = [e["kind"] for e in history(client, sid)]
    assert kinds.count("command.run") == 1


def test_images_go_to_an_agent_that_takes_them_and_are_refused_unjournaled_otherwise(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
    (workdir / "shot.png").write_bytes(png)
    (workdir / "notes.txt").write_text("x")
    image = {"type": "image", "path": "shot.png"}
    link = {"type": "file", "path": "notes.txt"}
    plain = create(client, workdir)
    with Follower(peer_daemon, plain, deadline) as follower:
        follower.wait_for("commands.updated")  # the agent's last word as it starts
    before = history(client, plain)
    with pytest.raises(ContentUnsupported) as caught:
        client.call("agentSession.send", {"sessionId": plain, "text": "hi", "content": [image]})
    assert caught.value.details == {"block": "image", "provider": "testacp"}
    assert history(client, plain) == before
    # A file reference is a resource_link, which every ACP agent takes.
    with Follower(peer_daemon, plain, deadline) as follower:
        client.call("agentSession.send", {"sessionId": plain, "text": "hi", "content": [link]})
        follower.wait_for("turn.completed")
    texts = [e["body"].get("text", "") for e in history(client, plain)]
    assert f"echo: hi [link file://{workdir / 'notes.txt'}]" in texts

    takes = create(client, workdir, provider="testacp-images")
    with Follower(peer_daemon, takes, deadline) as follower:
        client.call("agentSession.send", {"sessionId": takes, "text": "see", "content": [image]})
        follower.wait_for("turn.completed")
    digest = hashlib.sha256(png).hexdigest()
    texts = [e["body"].get("text", "") for e in history(client, takes)]
    assert f"echo: see [image image/png {digest} {len(png)}]" in texts


def test_a_stopped_acp_session_is_started_to_learn_whether_it_takes_images(
    client: Client, peer_daemon: DaemonProcess, workdir: Path, deadline: Deadline
) -> None:
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(16))
    (workdir / "shot.png").write_bytes(png)
    image = {"type": "image", "path": "shot.png"}
    takes = create(client, workdir, provider="testacp-images", start=False)
    with Follower(peer_daemon, takes, deadline) as follower:
        sent = client.call(
            "agentSession.send", {"sessionId": takes, "text": "see", "content": [image]}
        )
        assert sent["dispatch"] == "accepted", sent
        follower.wait_for("turn.completed")
    refuses = create(client, workdir, start=False)
    with pytest.raises(ContentUnsupported):
        client.call("agentSession.send", {"sessionId": refuses, "text": "see", "content": [image]})
    kinds = [e["kind"] for e in history(client, refuses)]
    assert "submission" not in kinds and "child.ready" in kinds  # started to ask, nothing sent
