"""The ``codex`` provider against the real ``codex app-server``, through the daemon.

Codex talks only to ``fake_openai`` on 127.0.0.1 (its ``CODEX_HOME`` says so); the
session gets ``CODEX_HOME`` and the dummy key through ``agentSession.create``'s env.
The module's daemon runs the newest pinned release (``peer_daemon``).
The last part drives ``CodexAdapter`` alone against a scripted app-server over
memory streams, for what the real binary cannot be made to do (an old version, a
resume that lands elsewhere, garbage, silence).
"""

from __future__ import annotations

import functools
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, ParamSpec

import pytest
import trio
import trio.testing
from trio.testing import wait_all_tasks_blocked

from agentsctl.client import Client
from agentsd.providers.base import Dispatch, LineLink, Resume, Submission
from agentsd.providers.codex import CodexAdapter
from agentsd.providers.codex_events import MAX_OUTPUT_BYTES, error_kind, item_completed
from agentsd.providers.codex_options import CodexOptions, parse_options, parse_version
from agentsd.providers.programs import CODEX, find_program
from agentsd.store.sessions import SessionRow
from agentsd_protocol.errors import (
    AgentExited,
    AgentNotFound,
    AgentProtocolError,
    AgentUnsupported,
    HandshakeTimeout,
    InvalidParams,
    ResumeFailed,
)
from tests.daemon_process import DaemonProcess, make_temp_dir, no_holder_config, running_daemon
from tests.peers.codex_peer import (
    NEWEST,
    codex_processes,
    create_codex,
    peer_daemon,
    send,
)
from tests.peers.conftest import CALL_TIMEOUT_S, Deadline, Follower
from tests.peers.fake_openai import (
    FakeOpenAI,
    HttpError,
    ShellCall,
    TextReply,
    input_texts,
    shell_call_outputs,
)
from tests.recording_sink import RecordingSink

pytestmark = pytest.mark.skipif(
    find_program(CODEX) is None, reason="codex is not installed (the test extras ship it)"
)
__all__ = ["peer_daemon"]  # the module's daemon (codex_peer), a fixture


# -- a turn --------------------------------------------------------------------------


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
    session = create_codex(client, workdir, codex_env, model="fake-model")
    sid = session["sessionId"]
    assert session["phase"] == "running"
    if NEWEST.binary() is not None:
        assert session["child"]["agentVersion"] == NEWEST.version  # what peer_daemon runs
    assert session["providerHandle"], "the thread id is the durable handle"
    with Follower(peer_daemon, sid, deadline) as follower:
        result = send(client, sid, "Say hello")
        assert result["dispatch"] == "accepted", result
        assert result["turnId"]

        done = follower.wait_for("turn.completed")
        assert done["body"] == {"turnId": result["turnId"], "outcome": "completed"}
        message = follower.wait_for("item.completed", lambda b: b["type"] == "agentMessage")
        assert message["body"]["text"] == answer
        assert message["body"]["turnId"] == result["turnId"]
        assert follower.streamed_text(message["body"]["itemId"]) == answer
        follower.wait_for("item.started", lambda b: b["itemId"] == message["body"]["itemId"])
        assert follower.wait_for("turn.started")["body"] == {"turnId": result["turnId"]}
        usage = follower.wait_for("usage.updated")
        assert usage["body"]["total"]["totalTokens"] > 0
        user = follower.wait_for("item.completed", lambda b: b["type"] == "userMessage")
        assert user["body"]["text"] == "Say hello"
        kinds = follower.kinds()
        assert (
            kinds.index("submission") < kinds.index("turn.started") < kinds.index("turn.completed")
        )
    deadline.poll(
        lambda: client.call("agentSession.get", {"sessionId": sid})["session"]["status"] == "idle",
        "the session to be idle",
    )
    (request,) = fake.requests()
    assert request.body["model"] == "fake-model"
    assert input_texts(request.body, "user")[-1] == "Say hello"
    assert request.headers["authorization"] == "Bearer dummy"


# -- approvals -----------------------------------------------------------------------


def test_an_accepted_shell_command_runs(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(ShellCall("echo hi"), TextReply("The command printed hi."))
    sid = create_codex(client, workdir, codex_env)["sessionId"]
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "Run echo hi")
        asked = follower.wait_for("approval.requested")["body"]
        assert asked["approvalKind"] == "command"
        assert "echo hi" in asked["detail"]
        # Codex 0.163 offers accept (and an exec-policy amendment) or cancel for an
        # escalation; only the decisions it offers are offered.
        assert asked["options"] == ["accept", "cancel"]
        assert client.call("agentSession.get", {"sessionId": sid})["session"]["status"] == (
            "attention"
        )
        client.call(
            "agentSession.respond",
            {"sessionId": sid, "approvalId": asked["approvalId"], "decision": "accept"},
        )
        ran = follower.wait_for("item.completed", lambda b: b["type"] == "commandExecution")
        assert ran["body"]["itemId"] == asked["itemId"], "the approval names the item it ran"
        assert ran["body"]["status"] == "completed"
        assert ran["body"]["exitCode"] == 0
        assert ran["body"]["output"] == {"text": "hi\n", "byteLength": 3, "truncated": False}
        assert "echo hi" in ran["body"]["command"]
        done = follower.wait_for("turn.completed")
        assert done["body"]["outcome"] == "completed"
    _, second = fake.requests()
    assert any("hi" in out for out in shell_call_outputs(second.body)), second.body["input"][-2:]


def test_a_command_is_cancelled_when_decline_is_not_offered(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    marker = workdir / "ran"
    fake.script(ShellCall(f"touch {marker}"))
    sid = create_codex(client, workdir, codex_env)["sessionId"]
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "Touch a file")
        asked = follower.wait_for("approval.requested")["body"]
        with pytest.raises(InvalidParams) as refused:
            client.call(
                "agentSession.respond",
                {"sessionId": sid, "approvalId": asked["approvalId"], "decision": "decline"},
            )
        assert set(refused.value.details["options"]) == {"accept", "cancel"}
        client.call(
            "agentSession.respond",
            {"sessionId": sid, "approvalId": asked["approvalId"], "decision": "cancel"},
        )
        item = follower.wait_for("item.completed", lambda b: b["type"] == "commandExecution")
        assert item["body"]["status"] == "declined"
        # cancel is Codex's "no, and stop": the turn ends interrupted.
        assert follower.wait_for("turn.completed")["body"]["outcome"] == "interrupted"
    assert not marker.exists()
    assert len(fake.requests()) == 1


def test_a_declined_file_change_is_not_applied_and_the_turn_goes_on(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    patch = (
        "apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: new.txt\n+hello\n*** End Patch\nEOF"
    )
    fake.script(ShellCall(patch, escalate=False), TextReply("Understood, no file."))
    # A read-only sandbox makes any patch ask; file changes offer all four decisions.
    sid = create_codex(client, workdir, codex_env, sandbox="read-only")["sessionId"]
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "Create new.txt")
        asked = follower.wait_for("approval.requested")["body"]
        assert asked["approvalKind"] == "fileChange"
        assert asked["options"] == ["accept", "acceptForSession", "decline", "cancel"]
        assert "new.txt" in asked["detail"] and "hello" in asked["detail"]
        client.call(
            "agentSession.respond",
            {"sessionId": sid, "approvalId": asked["approvalId"], "decision": "decline"},
        )
        item = follower.wait_for("item.completed", lambda b: b["type"] == "fileChange")
        assert item["body"]["itemId"] == asked["itemId"], "the approval names the item"
        assert item["body"]["status"] == "declined"
        assert item["body"]["changes"] == [
            {
                "path": str(workdir / "new.txt"),
                "kind": "add",
                "diff": {"text": "hello\n", "byteLength": 6, "truncated": False},
            }
        ]
        assert follower.wait_for("turn.completed")["body"]["outcome"] == "completed"
        resolved = follower.wait_for("approval.resolved")["body"]
        assert resolved["decision"] == "decline"
    assert not (workdir / "new.txt").exists()
    assert shell_call_outputs(fake.requests()[1].body) == ["patch rejected by user"]


# -- interrupt, close, resume ------------------------------------------------------------


def test_an_interrupt_mid_stream_ends_the_turn_interrupted(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(TextReply("word " * 200, chunks=200, chunk_delay_s=0.05))
    sid = create_codex(client, workdir, codex_env)["sessionId"]
    with Follower(peer_daemon, sid, deadline) as follower:
        turn_id = send(client, sid, "Talk for a while")["turnId"]
        follower.wait_for_delta()
        result = client.call("agentSession.interrupt", {"sessionId": sid})
        assert result["interrupted"] is True, result
        done = follower.wait_for("turn.completed")
        assert done["body"] == {"turnId": turn_id, "outcome": "interrupted"}
        kinds = follower.kinds()
        assert kinds.index("interrupt.requested") < kinds.index("turn.completed")
    streamed = "".join(d["text"] for d in follower.deltas)
    assert 0 < len(streamed) < len("word " * 200)


def test_a_send_during_a_turn_steers_it(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(
        TextReply("word " * 200, chunks=200, chunk_delay_s=0.05), TextReply("Steered answer.")
    )
    sid = create_codex(client, workdir, codex_env)["sessionId"]
    with Follower(peer_daemon, sid, deadline) as follower:
        first = send(client, sid, "Talk for a while")
        follower.wait_for_delta()
        steered = send(client, sid, "Actually, be brief")
        assert steered["dispatch"] == "accepted", steered
        assert steered["turnId"] == first["turnId"]
        done = follower.wait_for("turn.completed")
        assert done["body"] == {"turnId": first["turnId"], "outcome": "completed"}
        answer = follower.wait_for(
            "item.completed",
            lambda b: b["type"] == "agentMessage" and b["text"] == "Steered answer.",
        )
        assert answer["body"]["turnId"] == first["turnId"]
    assert "Actually, be brief" in input_texts(fake.requests()[-1].body, "user")


def test_close_then_send_resumes_the_same_thread(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    codex_home: Path,
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(TextReply("The first answer."), TextReply("The second answer."))
    session = create_codex(client, workdir, codex_env)
    sid, thread_id = session["sessionId"], session["providerHandle"]
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "The first question")
        follower.wait_for("turn.completed")
        closed = client.call("agentSession.close", {"sessionId": sid})
        assert closed["wasRunning"] is True
        assert closed["session"]["phase"] == "stopped"
        deadline.poll(lambda: not codex_processes(codex_home), "codex to exit")

        result = send(client, sid, "The second question")
        assert result["dispatch"] == "accepted", result
        first = follower.wait_for("child.ready")["body"]
        again = follower.wait_for("child.ready", lambda b: b["generation"] != first["generation"])
        assert first["providerHandle"] == again["body"]["providerHandle"] == thread_id
        follower.wait_for("turn.completed", lambda b: b["turnId"] == result["turnId"])
    last = fake.requests()[-1].body
    assert "The first question" in input_texts(last, "user")
    assert "The first answer." in input_texts(last, "assistant")
    assert input_texts(last, "user")[-1] == "The second question"
    info = client.call("agentSession.get", {"sessionId": sid})["session"]
    assert info["providerHandle"] == thread_id


def test_a_daemon_killed_mid_turn_leaves_no_codex_and_the_next_send_resumes(
    fake: FakeOpenAI, codex_env: dict[str, str], codex_home: Path, workdir: Path
) -> None:
    """Without the holder (``holder = false``): the crash ends Codex."""
    deadline = Deadline()
    base = make_temp_dir()
    state = base / "state"
    fake.script(TextReply("word " * 400, chunks=400, chunk_delay_s=0.05), TextReply("Back again."))
    try:
        with (
            no_holder_config() as config,
            running_daemon(state_dir=state, extra_args=config) as daemon,
        ):
            with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
                session = create_codex(client, workdir, codex_env)
                sid, thread_id = session["sessionId"], session["providerHandle"]
                with Follower(daemon, sid, deadline) as follower:
                    turn_id = send(client, sid, "Talk for a long while")["turnId"]
                    follower.wait_for_delta()
                    assert codex_processes(codex_home)
            daemon.stop(signal.SIGKILL)

        with (
            no_holder_config() as config,
            running_daemon(state_dir=state, extra_args=config) as daemon,
        ):
            # Recovery ran before the daemon answered its first ping.
            assert codex_processes(codex_home) == []
            with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
                info = client.call("agentSession.get", {"sessionId": sid})["session"]
                assert info["phase"] == "stopped"
                assert info["status"] == "idle"
                history = client.call("agentSession.history", {"sessionId": sid, "limit": 1000})
                ended = [e["body"] for e in history["events"] if e["kind"] == "turn.completed"]
                assert ended == [
                    {"turnId": turn_id, "outcome": "interrupted", "reason": "daemon-restart"}
                ]

                result = send(client, sid, "Are you there?")
                assert result["dispatch"] == "accepted", result
                with Follower(daemon, sid, deadline) as follower:
                    follower.wait_for("turn.completed", lambda b: b["turnId"] == result["turnId"])
                    ready = [e["body"] for e in follower.events if e["kind"] == "child.ready"]
                    assert {r["providerHandle"] for r in ready} == {thread_id}
                client.call("agentSession.close", {"sessionId": sid})
        last = fake.requests()[-1].body
        assert "Talk for a long while" in input_texts(last, "user")
        assert input_texts(last, "user")[-1] == "Are you there?"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def superseded_events(client: Client, sid: str) -> list[dict[str, Any]]:
    history = client.call("agentSession.history", {"sessionId": sid, "limit": 1000})
    return [e["body"] for e in history["events"] if e["kind"] == "thread.superseded"]


def test_a_thread_never_prompted_is_superseded_after_a_close_and_the_turn_runs(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(TextReply("Now I am here."))
    session = create_codex(client, workdir, codex_env)
    sid, old_thread = session["sessionId"], session["providerHandle"]
    client.call("agentSession.close", {"sessionId": sid})
    with Follower(peer_daemon, sid, deadline) as follower:
        result = send(client, sid, "Hello?")
        assert result["dispatch"] == "accepted", result
        follower.wait_for("turn.completed", lambda b: b["turnId"] == result["turnId"])
    [superseded] = superseded_events(client, sid)
    new_thread = superseded["handle"]
    assert superseded["previousHandle"] == old_thread != new_thread
    assert f"no rollout found for thread id {old_thread}" in superseded["reason"]
    info = client.call("agentSession.get", {"sessionId": sid})["session"]
    assert info["providerHandle"] == new_thread
    ready = [e["body"]["providerHandle"] for e in follower.events if e["kind"] == "child.ready"]
    assert ready == [old_thread, new_thread]


def test_a_thread_never_prompted_is_superseded_after_a_daemon_restart(
    fake: FakeOpenAI, codex_env: dict[str, str], workdir: Path
) -> None:
    deadline = Deadline()
    base = make_temp_dir()
    state = base / "state"
    fake.script(TextReply("After the restart."), TextReply("And again."))
    try:
        with (
            running_daemon(state_dir=state) as daemon,
            Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client,
        ):
            session = create_codex(client, workdir, codex_env)
            sid, old_thread = session["sessionId"], session["providerHandle"]
        with (
            running_daemon(state_dir=state) as daemon,
            Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client,
        ):
            with Follower(daemon, sid, deadline) as follower:
                result = send(client, sid, "Are you there?")
                assert result["dispatch"] == "accepted", result
                follower.wait_for("turn.completed", lambda b: b["turnId"] == result["turnId"])
            [superseded] = superseded_events(client, sid)
            assert superseded["previousHandle"] == old_thread
            assert "no rollout found" in superseded["reason"]
            # The new thread had a turn: the next start resumes it, no new supersede.
            client.call("agentSession.close", {"sessionId": sid})
            result = send(client, sid, "Still there?")
            assert result["dispatch"] == "accepted", result
            assert len(superseded_events(client, sid)) == 1
            info = client.call("agentSession.get", {"sessionId": sid})["session"]
            assert info["providerHandle"] == superseded["handle"]
            client.call("agentSession.close", {"sessionId": sid})
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_lost_thread_that_had_turns_is_resume_failed_with_codex_words(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    codex_home: Path,
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(TextReply("The only answer."))
    session = create_codex(client, workdir, codex_env)
    sid, thread_id = session["sessionId"], session["providerHandle"]
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "The first question")
        follower.wait_for("turn.completed")
    client.call("agentSession.close", {"sessionId": sid})
    shutil.rmtree(codex_home)  # Codex's state is gone: rollouts and their index
    fake.write_codex_home(codex_home)
    result = send(client, sid, "The second question")
    assert result["dispatch"] == "rejected", result
    assert result["reason"].startswith("resume_failed: codex lost thread")
    assert f"no rollout found for thread id {thread_id}" in result["reason"]
    history = client.call("agentSession.history", {"sessionId": sid, "limit": 1000})
    [*_, exited] = [e["body"] for e in history["events"] if e["kind"] == "child.exited"]
    assert exited["error"]["kind"] == "resume_failed"
    assert superseded_events(client, sid) == []
    info = client.call("agentSession.get", {"sessionId": sid})["session"]
    assert info["providerHandle"] == thread_id
    assert info["error"]["kind"] == "resume_failed"


# -- failures ------------------------------------------------------------------------------


def test_a_missing_binary_is_agent_not_found(
    client: Client, codex_env: dict[str, str], workdir: Path
) -> None:
    missing = str(workdir / "no-such-codex")
    with pytest.raises(AgentNotFound):
        client.call(
            "agentSession.create",
            {
                "provider": "codex",
                "cwd": str(workdir),
                "env": codex_env,
                "command": [missing, "app-server"],
            },
        )
    (info,) = [
        s
        for s in client.call("agentSession.list", {})["sessions"]
        if s["command"] == [missing, "app-server"]
    ]
    assert info["error"]["kind"] == "agent_not_found"
    assert missing in info["error"]["message"]
    history = client.call("agentSession.history", {"sessionId": info["sessionId"]})
    exited = [e["body"] for e in history["events"] if e["kind"] == "child.exited"]
    assert exited[-1]["error"]["kind"] == "agent_not_found"


def test_an_unknown_option_is_refused_at_start(
    client: Client, codex_env: dict[str, str], workdir: Path
) -> None:
    with pytest.raises(InvalidParams, match="unknown codex option 'aproval'"):
        create_codex(client, workdir, codex_env, aproval="never")
    with pytest.raises(InvalidParams, match="'sandbox' must be one of"):
        create_codex(client, workdir, codex_env, sandbox="wide-open")


def test_a_refused_key_fails_the_turn_as_auth_refused(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(HttpError(401, "invalid api key"))
    sid = create_codex(client, workdir, codex_env)["sessionId"]
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "hello")
        done = follower.wait_for("turn.completed")["body"]
        assert done["outcome"] == "failed"
        assert done["error"]["kind"] == "auth_refused"
        error = follower.wait_for("agent.error")["body"]
        assert error["errorKind"] == "auth_refused"
        assert "invalid api key" in error["message"]
    # The agent is still there for the next try.
    assert client.call("agentSession.get", {"sessionId": sid})["session"]["phase"] == "running"


def test_an_unreachable_model_server_fails_the_turn(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    sid = create_codex(client, workdir, codex_env)["sessionId"]
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "hello")
        assert follower.wait_for("turn.completed")["body"]["outcome"] == "completed"
        # The server goes away, with the connection Codex keeps alive to it.
        fake.close()
        second = send(client, sid, "are you there?")
        done = follower.wait_for("turn.completed", lambda b: b["turnId"] == second["turnId"])[
            "body"
        ]
        assert done["outcome"] == "failed"
        error = follower.wait_for("agent.error")["body"]
        assert error["errorKind"] == "model_unreachable"
        assert error["willRetry"] is False


def test_an_agent_that_never_answers_times_out_its_handshake(
    codex_env: dict[str, str], workdir: Path
) -> None:
    base = make_temp_dir()
    config = base / "config.toml"
    config.write_text("handshake_timeout_s = 1.0\n")
    silent = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    try:
        with (
            running_daemon(extra_args=["--config", str(config)]) as daemon,
            Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client,
            pytest.raises(HandshakeTimeout),
        ):
            client.call(
                "agentSession.create",
                {"provider": "codex", "cwd": str(workdir), "env": codex_env, "command": silent},
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- the adapter alone, against a scripted app-server ----------------------------------------


ADAPTER_TEST_TIMEOUT_S = 60.0  # these take milliseconds (past ACK_TIMEOUT_S in virtual time)

P = ParamSpec("P")


def within_timeout(
    test: Callable[P, Awaitable[None]],
) -> Callable[P, Coroutine[Any, Any, None]]:
    """Run an async test under ``trio.fail_after`` (virtual time under autojump_clock)."""

    @functools.wraps(test)
    async def bounded_test(*args: P.args, **kwargs: P.kwargs) -> None:
        with trio.fail_after(ADAPTER_TEST_TIMEOUT_S):
            await test(*args, **kwargs)

    return bounded_test


THREAD = "01a2284c-4ef1-7911-bbaa-09712bb015bf"
TURN = "01a2284c-51c7-7a10-a274-15053a0d6377"


class ScriptedCodex:
    """The app-server's end of a ``CodexAdapter``'s pipes."""

    def __init__(self, sink: RecordingSink, provider_handle: str | None = None, **options: Any):
        to_codex = trio.testing.memory_stream_one_way_pair()
        from_codex = trio.testing.memory_stream_one_way_pair()
        self.peer = LineLink(from_codex[0], to_codex[1])
        self._from_codex = from_codex[0]
        row = SessionRow(
            id="s-1",
            host_id="h",
            provider="codex",
            cwd="/tmp",
            title=None,
            options=options,
            env={},
            command=None,
            provider_handle=provider_handle,
            created_at=0.0,
            updated_at=0.0,
        )
        self.adapter = CodexAdapter(LineLink(to_codex[0], from_codex[1]), sink, row)

    async def expect(self, method: str) -> dict[str, Any]:
        message = await self.peer.receive()
        assert message is not None and message.get("method") == method, message
        return message

    async def reply(self, request: dict[str, Any], result: Any) -> None:
        await self.peer.send({"id": request["id"], "result": result})

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self.peer.send({"method": method, "params": params})

    async def serve_handshake(
        self, user_agent: str = "agentsd/0.163.0 (Linux)", thread_id: str = THREAD
    ) -> None:
        init = await self.expect("initialize")
        await self.reply(init, {"userAgent": user_agent, "codexHome": "/tmp/h"})
        await self.expect("initialized")
        start = await self.peer.receive()
        assert start is not None and start["method"] in ("thread/start", "thread/resume")
        await self.reply(start, {"thread": {"id": thread_id}})

    async def write_raw(self, data: bytes) -> None:
        await self._from_codex.send_all(data)

    async def eof(self) -> None:
        await self._from_codex.aclose()


async def started(nursery: trio.Nursery, codex: ScriptedCodex) -> None:
    """Handshake, then the adapter's reader runs in ``nursery``."""
    nursery.start_soon(codex.serve_handshake)
    assert await codex.adapter.handshake(None) == THREAD
    nursery.start_soon(codex.adapter.run)


@within_timeout
async def test_an_old_codex_is_unsupported() -> None:
    codex = ScriptedCodex(RecordingSink())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(codex.serve_handshake, "codex_vscode/0.40.1 (Mac)")
        with pytest.raises(AgentUnsupported, match=r"codex 0\.40\.1 is too old") as raised:
            await codex.adapter.handshake(None)
        nursery.cancel_scope.cancel()
    assert raised.value.kind == "agent_unsupported"
    assert raised.value.details["version"] == "0.40.1"


@within_timeout
async def test_a_resume_that_lands_on_another_thread_is_a_protocol_error() -> None:
    codex = ScriptedCodex(RecordingSink(), provider_handle=THREAD)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(codex.serve_handshake, "agentsd/0.163.0", "another-thread")
        with pytest.raises(AgentProtocolError, match="resumed thread another-thread instead"):
            await codex.adapter.handshake(Resume(handle=THREAD, had_turns=True))


NO_ROLLOUT = {"code": -32600, "message": f"no rollout found for thread id {THREAD}"}


async def refuse_resume(codex: ScriptedCodex, error: dict[str, Any]) -> dict[str, Any]:
    """Serve a handshake whose ``thread/resume`` Codex answers with ``error``; then
    answer a ``thread/start``, if one comes, and return its params."""
    init = await codex.expect("initialize")
    await codex.reply(init, {"userAgent": "agentsd/0.163.0"})
    await codex.expect("initialized")
    resume = await codex.expect("thread/resume")
    assert resume["params"]["threadId"] == THREAD
    await codex.peer.send({"id": resume["id"], "error": error})
    start = await codex.expect("thread/start")
    await codex.reply(start, {"thread": {"id": "new-thread"}})
    params: dict[str, Any] = start["params"]
    return params


@within_timeout
async def test_a_thread_codex_never_saved_and_without_turns_is_superseded() -> None:
    codex = ScriptedCodex(RecordingSink(), provider_handle=THREAD, model="gpt-x")
    started: dict[str, Any] = {}

    async def serve() -> None:
        started.update(await refuse_resume(codex, NO_ROLLOUT))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        handle = await codex.adapter.handshake(Resume(handle=THREAD, had_turns=False))
    assert handle == "new-thread"
    # A plain start with the session's options, no threadId.
    assert started == {"cwd": "/tmp", **parse_options({"model": "gpt-x"}).thread_params()}
    superseded = codex.adapter.superseded
    assert superseded is not None
    assert (superseded.previous_handle, superseded.handle) == (THREAD, "new-thread")
    assert "never saved" in superseded.reason
    assert f"no rollout found for thread id {THREAD}" in superseded.reason


@pytest.mark.parametrize(
    ("error", "had_turns", "words"),
    [
        (NO_ROLLOUT, True, r"lost thread .* which had turns.*no rollout found for thread id"),
        (
            {"code": -32600, "message": "invalid session id: invalid character"},
            False,
            r"could not resume thread .*: invalid session id: invalid character",
        ),
        (
            {"code": -32603, "message": f"no rollout found for thread id {THREAD}"},
            False,
            r"could not resume thread .*: no rollout found",
        ),
    ],
    ids=["lost-with-turns", "other-error", "other-code"],
)
@within_timeout
async def test_a_resume_that_fails_otherwise_is_resume_failed_with_codex_words(
    error: dict[str, Any], had_turns: bool, words: str
) -> None:
    codex = ScriptedCodex(RecordingSink(), provider_handle=THREAD)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(refuse_resume, codex, error)
        with pytest.raises(ResumeFailed, match=words) as raised:
            await codex.adapter.handshake(Resume(handle=THREAD, had_turns=had_turns))
        nursery.cancel_scope.cancel()  # no thread/start ever came
    assert raised.value.kind == "resume_failed"
    assert codex.adapter.superseded is None


@within_timeout
async def test_garbage_during_the_handshake_is_a_protocol_error() -> None:
    codex = ScriptedCodex(RecordingSink())

    async def garbage() -> None:
        await codex.expect("initialize")
        await codex.write_raw(b"Segmentation fault\n")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(garbage)
        with pytest.raises(AgentProtocolError, match="not a JSON object"):
            await codex.adapter.handshake(None)


@within_timeout
async def test_eof_during_the_handshake_is_agent_exited() -> None:
    codex = ScriptedCodex(RecordingSink())

    async def die() -> None:
        await codex.expect("initialize")
        await codex.eof()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(die)
        with pytest.raises(AgentExited):
            await codex.adapter.handshake(None)


@within_timeout
async def test_the_thread_takes_the_session_options() -> None:
    codex = ScriptedCodex(
        RecordingSink(), model="gpt-x", sandbox="read-only", approvalPolicy="never", effort="low"
    )
    seen: dict[str, dict[str, Any]] = {}

    async def serve() -> None:
        init = await codex.expect("initialize")
        seen["initialize"] = init["params"]
        await codex.reply(init, {"userAgent": "agentsd/0.163.0"})
        await codex.expect("initialized")
        start = await codex.expect("thread/start")
        seen["thread/start"] = start["params"]
        await codex.reply(start, {"thread": {"id": THREAD}})
        turn = await codex.expect("turn/start")
        seen["turn/start"] = turn["params"]
        await codex.reply(turn, {"turn": {"id": TURN, "status": "inProgress"}})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await codex.adapter.handshake(None)
        nursery.start_soon(codex.adapter.run)
        dispatch = await codex.adapter.send(Submission(client_message_id="m1", text="hi"))
        nursery.cancel_scope.cancel()
    assert dispatch == Dispatch(outcome="accepted", turn_id=TURN)
    assert seen["initialize"]["clientInfo"]["name"] == "agentsd"
    assert seen["thread/start"] == {
        "cwd": "/tmp",
        "model": "gpt-x",
        "sandbox": "read-only",
        "approvalPolicy": "never",
    }
    assert seen["turn/start"] == {
        "threadId": THREAD,
        "clientUserMessageId": "m1",
        "input": [{"type": "text", "text": "hi", "text_elements": []}],
        "effort": "low",
    }


@pytest.mark.parametrize(
    "method",
    [
        "attestation/generate",
        "account/chatgptAuthTokens/refresh",
        "applyPatchApproval",
        "execCommandApproval",
        "currentTime/read",
    ],
)
@within_timeout
async def test_requests_it_does_not_handle_are_refused_never_ignored(method: str) -> None:
    sink = RecordingSink()
    codex = ScriptedCodex(sink)
    async with trio.open_nursery() as nursery:
        await started(nursery, codex)
        await codex.peer.send({"id": 0, "method": method, "params": {}})
        refusal = await codex.peer.receive()
        assert refusal is not None
        assert refusal["id"] == 0 and refusal["error"]["code"] == -32601
        assert method in refusal["error"]["message"]
        nursery.cancel_scope.cancel()
    assert sink.kinds() == ["agent.warning"]


@pytest.mark.parametrize(
    ("method", "params", "result"),
    [
        (
            "item/tool/call",
            {"callId": "c1", "namespace": None, "tool": "lookup", "arguments": {}},
            {
                "contentItems": [{"type": "inputText", "text": "agentsd has no tool 'lookup'"}],
                "success": False,
            },
        ),
        (
            "mcpServer/elicitation/request",
            {
                "serverName": "tickets",
                "mode": "form",
                "_meta": None,
                "message": "Your name?",
                "requestedSchema": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                },
            },
            {"action": "decline", "content": None, "_meta": None},
        ),
    ],
)
@within_timeout
async def test_requests_nobody_can_answer_get_their_protocols_refusal(
    method: str, params: dict[str, Any], result: dict[str, Any]
) -> None:
    sink = RecordingSink()
    codex = ScriptedCodex(sink)
    async with trio.open_nursery() as nursery:
        await started(nursery, codex)
        await codex.peer.send(
            {"id": 4, "method": method, "params": {"threadId": THREAD, "turnId": TURN, **params}}
        )
        answer = await codex.peer.receive()
        assert answer == {"id": 4, "result": result}
        nursery.cancel_scope.cancel()
    assert sink.kinds() == ["agent.warning"]
    assert sink.approvals == []


@pytest.mark.parametrize(
    ("params", "decision", "result"),
    [
        (
            {"mode": "url", "url": "https://example.com/login", "elicitationId": "e1"},
            "accept",
            {"action": "accept", "content": None, "_meta": None},
        ),
        (
            # An MCP tool call's approval: a form without fields.
            {
                "mode": "form",
                "_meta": {"codex_approval_kind": "mcp_tool_call"},
                "requestedSchema": {"type": "object", "properties": {}},
            },
            "accept",
            {"action": "accept", "content": {}, "_meta": None},
        ),
        ({"mode": "form", "requestedSchema": {}}, "decline", {"action": "decline"}),
        ({"mode": "url", "url": "https://example.com"}, "cancel", {"action": "cancel"}),
    ],
)
@within_timeout
async def test_an_mcp_elicitation_is_an_approval(
    params: dict[str, Any], decision: str, result: dict[str, Any]
) -> None:
    sink = RecordingSink()
    codex = ScriptedCodex(sink)
    async with trio.open_nursery() as nursery:
        await started(nursery, codex)
        await codex.peer.send(
            {
                "id": 7,
                "method": "mcpServer/elicitation/request",
                "params": {
                    "threadId": THREAD,
                    "turnId": TURN,
                    "serverName": "tickets",
                    "message": "Allow the tickets server to continue?",
                    **params,
                },
            }
        )
        await wait_all_tasks_blocked()
        (asked,) = sink.approvals
        assert asked["kind"] == "elicitation"
        assert asked["options"] == ["accept", "decline"]
        assert asked["title"] == "tickets: Allow the tickets server to continue?"
        await codex.adapter.answer_approval("7", decision)
        answer = await codex.peer.receive()
        assert answer is not None and answer["id"] == 7
        assert answer["result"] == {"content": None, "_meta": None, **result}
        nursery.cancel_scope.cancel()


@within_timeout
async def test_an_approval_that_cannot_be_recorded_is_refused() -> None:
    codex = ScriptedCodex(RecordingSink(refuse_approvals=True))
    async with trio.open_nursery() as nursery:
        await started(nursery, codex)
        await codex.peer.send(
            {
                "id": 3,
                "method": "item/commandExecution/requestApproval",
                "params": {"threadId": THREAD, "turnId": TURN, "itemId": "c1", "command": "ls"},
            }
        )
        refusal = await codex.peer.receive()
        assert refusal is not None and refusal["id"] == 3
        assert "could not record" in refusal["error"]["message"]
        # Refused means answered: a late client answer sends nothing more.
        await codex.adapter.answer_approval("3", "accept")
        nursery.cancel_scope.cancel()


@within_timeout
async def test_approval_answers_take_the_shape_each_request_wants() -> None:
    sink = RecordingSink()
    codex = ScriptedCodex(sink)
    requests: list[dict[str, Any]] = [
        {
            "method": "item/commandExecution/requestApproval",
            "params": {
                "command": "make",
                "availableDecisions": ["accept", "acceptForSession", "cancel"],
            },
        },
        {"method": "item/fileChange/requestApproval", "params": {"reason": "write a file"}},
        {
            "method": "item/permissions/requestApproval",
            "params": {"permissions": {"network": {"enabled": True}, "fileSystem": None}},
        },
        {
            "method": "item/tool/requestUserInput",
            "params": {
                "questions": [
                    {
                        "id": "color",
                        "header": "Color",
                        "question": "Which color?",
                        "options": [
                            {"label": "Blue (Recommended)", "description": "calm"},
                            {"label": "Red", "description": "bold"},
                        ],
                    }
                ]
            },
        },
    ]
    decisions = ["acceptForSession", "decline", "acceptForSession", "accept"]
    answers = []
    async with trio.open_nursery() as nursery:
        await started(nursery, codex)
        for request_id, (request, decision) in enumerate(zip(requests, decisions, strict=True)):
            params = {"threadId": THREAD, "turnId": TURN, "itemId": f"i{request_id}"}
            await codex.peer.send(
                {
                    "id": request_id,
                    "method": request["method"],
                    "params": {**params, **request["params"]},
                }
            )
            await wait_all_tasks_blocked()
            await codex.adapter.answer_approval(str(request_id), decision)
            answer = await codex.peer.receive()
            assert answer is not None and answer["id"] == request_id
            answers.append(answer["result"])
        nursery.cancel_scope.cancel()
    assert [a["options"] for a in sink.approvals] == [
        ["accept", "acceptForSession", "cancel"],
        ["accept", "acceptForSession", "decline", "cancel"],
        ["accept", "acceptForSession", "decline"],
        ["accept", "decline"],
    ]
    assert [a["kind"] for a in sink.approvals] == [
        "command",
        "fileChange",
        "permissions",
        "question",
    ]
    # Each names the item it asks about, so clients show the two as one tool call.
    assert [a["itemId"] for a in sink.approvals] == ["i0", "i1", "i2", "i3"]
    assert answers == [
        {"decision": "acceptForSession"},
        {"decision": "decline"},
        {"permissions": {"network": {"enabled": True}}, "scope": "session"},
        {"answers": {"color": {"answers": ["Blue (Recommended)"]}}},
    ]


@within_timeout
async def test_a_withdrawn_request_cancels_its_approval(autojump_clock: trio.abc.Clock) -> None:
    sink = RecordingSink()
    codex = ScriptedCodex(sink)
    async with trio.open_nursery() as nursery:
        await started(nursery, codex)
        await codex.peer.send(
            {
                "id": 0,
                "method": "item/fileChange/requestApproval",
                "params": {"threadId": THREAD, "turnId": TURN, "itemId": "f1"},
            }
        )
        await codex.notify("serverRequest/resolved", {"threadId": THREAD, "requestId": 0})
        await wait_all_tasks_blocked()
        assert sink.cancelled == ["0"]
        # Answering it later sends nothing (Codex no longer expects it).
        await codex.adapter.answer_approval("0", "accept")
        with trio.move_on_after(1.0):
            unexpected = await codex.peer.receive()
            raise AssertionError(f"the adapter answered a withdrawn request: {unexpected}")
        nursery.cancel_scope.cancel()


@within_timeout
async def test_a_bad_line_is_journaled_and_skipped() -> None:
    sink = RecordingSink()
    codex = ScriptedCodex(sink)
    async with trio.open_nursery() as nursery:
        await started(nursery, codex)
        await codex.write_raw(b'not json\n[1, 2]\n{"neither": true}\n')
        await codex.notify("turn/started", {"threadId": THREAD, "turn": {"id": TURN}})
        await codex.eof()
    assert sink.kinds() == ["agent.error", "agent.error", "agent.error", "turn.started"]
    assert all(body["errorKind"] == "agent_protocol_error" for _, body in sink.events[:3])


@within_timeout
async def test_another_threads_notifications_are_not_this_sessions() -> None:
    sink = RecordingSink()
    codex = ScriptedCodex(sink)
    async with trio.open_nursery() as nursery:
        await started(nursery, codex)
        await codex.notify("turn/started", {"threadId": "sub-agent", "turn": {"id": "t-sub"}})
        await codex.notify("turn/started", {"threadId": THREAD, "turn": {"id": TURN}})
        await codex.notify(
            "item/agentMessage/delta",
            {"threadId": THREAD, "turnId": TURN, "itemId": "m", "delta": "hi"},
        )
        await codex.notify(
            "turn/completed", {"threadId": THREAD, "turn": {"id": TURN, "status": "weird"}}
        )
        await codex.eof()
    assert sink.events == [
        ("turn.started", {"turnId": TURN}),
        ("turn.completed", {"turnId": TURN, "outcome": "unknown"}),
    ]
    assert sink.deltas == [("m", "hi")]


@within_timeout
async def test_a_send_nobody_confirms_is_unknown(autojump_clock: trio.abc.Clock) -> None:
    codex = ScriptedCodex(RecordingSink())
    async with trio.open_nursery() as nursery:
        await started(nursery, codex)
        dispatch = await codex.adapter.send(Submission(client_message_id="m1", text="hi"))
        nursery.cancel_scope.cancel()
    assert dispatch.outcome == "unknown"
    assert "did not confirm turn/start" in str(dispatch.reason)


@within_timeout
async def test_a_refused_steer_starts_a_turn_instead() -> None:
    sink = RecordingSink()
    codex = ScriptedCodex(sink)
    async with trio.open_nursery() as nursery:
        await started(nursery, codex)
        await codex.notify("turn/started", {"threadId": THREAD, "turn": {"id": TURN}})
        await wait_all_tasks_blocked()
        result: list[Dispatch] = []

        async def send() -> None:
            result.append(await codex.adapter.send(Submission(client_message_id="m", text="x")))

        nursery.start_soon(send)
        steer = await codex.expect("turn/steer")
        assert steer["params"]["expectedTurnId"] == TURN
        await codex.peer.send(
            {"id": steer["id"], "error": {"code": -32600, "message": "no active turn"}}
        )
        start = await codex.expect("turn/start")
        await codex.reply(start, {"turn": {"id": "turn-2", "status": "inProgress"}})
        await wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert result == [Dispatch(outcome="accepted", turn_id="turn-2")]


@within_timeout
async def test_waiters_are_released_when_codex_exits() -> None:
    codex = ScriptedCodex(RecordingSink())
    result: list[Dispatch] = []
    async with trio.open_nursery() as nursery:
        await started(nursery, codex)

        async def send() -> None:
            result.append(await codex.adapter.send(Submission(client_message_id="m", text="x")))

        nursery.start_soon(send)
        await codex.expect("turn/start")
        await codex.eof()
    assert result[0].outcome == "rejected"
    assert "exited" in str(result[0].reason)
    assert await codex.adapter.send(Submission(client_message_id="n", text="y")) == Dispatch(
        outcome="rejected", reason="codex is not running"
    )
    assert await codex.adapter.interrupt(None) is False


# -- pure parts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ({"codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": 401}}}, "auth_refused"),
        ({"codexErrorInfo": "unauthorized"}, "auth_refused"),
        (
            {"codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": None}}},
            "model_unreachable",
        ),
        (
            {"codexErrorInfo": {"responseStreamDisconnected": {"httpStatusCode": None}}},
            "model_unreachable",
        ),
        ({"codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": 503}}}, "model_http_error"),
        ({"codexErrorInfo": "contextWindowExceeded"}, "context_window_exceeded"),
        ({"codexErrorInfo": None}, "agent_error"),
        ("not even an object", "agent_error"),
    ],
)
def test_error_kinds(error: Any, kind: str) -> None:
    assert error_kind(error) == kind


def test_big_tool_output_is_bounded_in_the_journal() -> None:
    item = item_completed(
        {
            "turnId": TURN,
            "item": {
                "type": "commandExecution",
                "id": "c",
                "command": "yes",
                "aggregatedOutput": "y\n" * 100_000,
                "exitCode": 0,
                "status": "completed",
            },
        }
    )
    assert item.output is not None
    assert item.output.truncated is True
    assert item.output.byte_length == 200_000
    assert len(item.output.text) == MAX_OUTPUT_BYTES


def test_options_are_checked() -> None:
    assert parse_options({}) == CodexOptions()
    assert parse_options({"model": "m", "config": {"a.b": 1}}).thread_params() == {
        "approvalPolicy": "on-request",
        "sandbox": "workspace-write",
        "model": "m",
        "config": {"a.b": 1},
    }
    bad: dict[str, Any]
    for bad in ({"model": 3}, {"approvalPolicy": "sometimes"}, {"config": []}, {"x": 1}):
        with pytest.raises(InvalidParams):
            parse_options(bad)


def test_versions_come_from_the_user_agent() -> None:
    user_agent = "agentsd/0.171.0 (Debian 12.0.0; x86_64) unknown (agentsd; 0.1)"
    assert parse_version(user_agent) == "0.171.0"
    assert parse_version("agentsd/0.172.0-alpha.2 (Linux)") == "0.172.0-alpha.2"
    assert parse_version("something else") is None
