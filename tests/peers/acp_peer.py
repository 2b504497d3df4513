"""What the peer tests of real ACP agents share: a daemon with the agent configured
as ``[agents.NAME]``, sessions on it, and the agent's processes found by a variable
of their environment (every process an agent starts inherits it)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agentsctl.client import Client
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon
from tests.peers.conftest import CALL_TIMEOUT_S, Deadline, Follower

NODE_MODULES = Path(__file__).resolve().parents[1] / "agents" / "node_modules"
# claude-agent-acp and codex-acp with a session open do not end on stdin EOF (the
# agent process they run keeps them alive): each close, and each module daemon's stop,
# waited out the default 2 s EOF grace before the SIGTERM that ends them. Their tests
# check the protocol, not the ladder, so the SIGTERM comes after 0.2 s; the later
# rungs keep their defaults.
EOF_IGNORED_LADDER = "[ladder]\neof_grace_s = 0.2\nterm_grace_s = 3.0\nkill_wait_s = 2.0\n"


def installed(what: str, package: str, entry: str) -> Path:
    """The entry point of an ACP agent that ``make test`` installs (pinned in
    tests/agents/package.json). Outside CI a missing one skips the calling module;
    under CI its tests run and fail, since their daemon cannot start it."""
    path = NODE_MODULES / package / entry
    if not path.exists() and os.environ.get("CI") != "true":
        pytest.skip(f"{what} is not installed (make test installs it)", allow_module_level=True)
    return path


def daemon_args(
    base: Path,
    name: str,
    command: Sequence[str],
    env: Mapping[str, str],
    ladder: str = "",
    *,
    no_holder: bool = False,
) -> list[str]:
    """``--config`` with ``[agents.NAME]`` running ``command`` with ``env``, and
    ``ladder`` (a ``[ladder]`` table, or nothing for the defaults); ``no_holder``:
    ``holder = false``, the daemon starts its agents itself (a crash ends them)."""
    config = base / "config.toml"
    table = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in env.items())
    top = "holder = false\n" if no_holder else ""
    config.write_text(
        f"{top}[agents.{name}]\ncommand = {json.dumps(list(command))}\n"
        f"env = {{ {table} }}\n{ladder}"
    )
    return ["--config", str(config)]


@contextmanager
def acp_daemon(
    base: Path,
    name: str,
    command: Sequence[str],
    env: Mapping[str, str],
    state: Path | None = None,
    ladder: str = "",
    *,
    no_holder: bool = False,
) -> Iterator[DaemonProcess]:
    args = daemon_args(base, name, command, env, ladder, no_holder=no_holder)
    with running_daemon(state_dir=state, extra_args=args) as d:
        yield d


@contextmanager
def module_daemon(
    name: str, command: Sequence[str], env: Mapping[str, str], ladder: str = ""
) -> Iterator[DaemonProcess]:
    """A daemon with ``[agents.NAME]``, its config in a directory of its own."""
    base = make_temp_dir()
    try:
        with acp_daemon(base, name, command, env, ladder=ladder) as daemon:
            yield daemon
    finally:
        shutil.rmtree(base, ignore_errors=True)


def create(client: Client, provider: str, workdir: Path, env: dict[str, str]) -> dict[str, Any]:
    """Create (and start) a session; its SessionInfo as plain JSON."""
    result = client.call(
        "agentSession.create", {"provider": provider, "cwd": str(workdir), "env": env}
    )
    session: dict[str, Any] = result["session"]
    return session


def send(client: Client, session_id: str, text: str) -> dict[str, Any]:
    result: dict[str, Any] = client.call(
        "agentSession.send", {"sessionId": session_id, "text": text}
    )
    assert result["dispatch"] == "accepted", result
    return result


def cancel_mid_turn(client: Client, daemon: DaemonProcess, sid: str, deadline: Deadline) -> str:
    """Start a turn the model answers slowly with ``word word ...``, cancel it once
    some words streamed, and check it ends ``interrupted`` (``cancelled``) with
    nothing journaled after its end; what streamed, for the caller to check."""
    with Follower(daemon, sid, deadline) as follower:
        turn_id = send(client, sid, "Talk for a while")["turnId"]
        follower.wait_for("item.updated", lambda b: "word" in b["text"])
        assert client.call("agentSession.interrupt", {"sessionId": sid})["interrupted"] is True
        done = follower.wait_for("turn.completed")
        assert done["body"] == {"turnId": turn_id, "outcome": "interrupted", "reason": "cancelled"}
        settled = done["seq"]
    deadline.poll(
        lambda: client.call("agentSession.get", {"sessionId": sid})["session"]["status"] == "idle",
        "the session to be idle",
    )
    events = client.call("agentSession.history", {"sessionId": sid, "limit": 1000})["events"]
    assert [e["kind"] for e in events if e["seq"] > settled] == []
    return "".join(d["text"] for d in follower.deltas)


def close_then_send(
    client: Client,
    daemon: DaemonProcess,
    session: dict[str, Any],
    deadline: Deadline,
    agent_gone: Callable[[], bool],
) -> list[Any]:
    """A first question's turn, a close (the agent gone), then a second question: the
    agent comes back with the same session (no supersede) and answers it. The texts of
    the ``item.completed`` events, for the caller to check the replay."""
    sid, handle = session["sessionId"], session["providerHandle"]
    with Follower(daemon, sid, deadline) as follower:
        send(client, sid, "The first question")
        follower.wait_for("turn.completed")
        assert client.call("agentSession.close", {"sessionId": sid})["wasRunning"] is True
        deadline.poll(agent_gone, "the agent to exit")
        second = send(client, sid, "The second question")
        follower.wait_for("turn.completed", lambda b: b["turnId"] == second["turnId"])
        ready = [e["body"] for e in follower.events if e["kind"] == "child.ready"]
        assert [r["providerHandle"] for r in ready] == [handle, handle]
        assert "thread.superseded" not in follower.kinds()
        return [e["body"].get("text") for e in follower.events if e["kind"] == "item.completed"]


def daemon_killed_mid_turn_then_send(
    base: Path,
    daemon: Callable[[Path, Path], contextlib.AbstractContextManager[DaemonProcess]],
    create: Callable[[Client], dict[str, Any]],
    agents: Callable[[], list[int]],
    *,
    processes: int = 1,
    then_send: bool = True,
) -> None:
    """A daemon SIGKILLed while the agent (at least ``processes`` of them) streams a
    long turn: the next daemon's recovery leaves no agent running and ends the turn
    ``daemon-restart``, and (``then_send``) the next send resumes the same session.
    ``daemon(base, state)`` runs a daemon on ``state`` without the holder
    (``holder = false``: with it the agent outlives the crash and is taken over);
    ``agents()`` lists the agent's processes."""
    deadline = Deadline()
    state = base / "state"
    with daemon(base, state) as first:
        with Client(first.socket, timeout_s=CALL_TIMEOUT_S) as client:
            session = create(client)
            sid, handle = session["sessionId"], session["providerHandle"]
            with Follower(first, sid, deadline) as follower:
                turn_id = send(client, sid, "Talk for a long while")["turnId"]
                follower.wait_for_delta()
                assert len(agents()) >= processes
        first.stop(signal.SIGKILL)

    with daemon(base, state) as second:
        # Recovery ran before the daemon answered its first ping.
        assert agents() == []
        with Client(second.socket, timeout_s=CALL_TIMEOUT_S) as client:
            info = client.call("agentSession.get", {"sessionId": sid})["session"]
            assert info["phase"] == "stopped"
            history = client.call("agentSession.history", {"sessionId": sid, "limit": 1000})
            ended = [e["body"] for e in history["events"] if e["kind"] == "turn.completed"]
            assert ended == [
                {"turnId": turn_id, "outcome": "interrupted", "reason": "daemon-restart"}
            ]
            if not then_send:
                return
            result = send(client, sid, "Are you there?")
            with Follower(second, sid, deadline) as follower:
                follower.wait_for("turn.completed", lambda b: b["turnId"] == result["turnId"])
                ready = [e["body"] for e in follower.events if e["kind"] == "child.ready"]
                assert {r["providerHandle"] for r in ready} == {handle}
            client.call("agentSession.close", {"sessionId": sid})
        deadline.poll(lambda: not agents(), "the agent to exit")
