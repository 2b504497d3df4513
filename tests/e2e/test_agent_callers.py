"""Agents are not users (DESIGN.md invariant 9), against a real daemon: a process
inside a session (a tool its agent ran) that connects to the daemon's socket and
tries to answer its own session's pending approval, close another session and shut
the daemon down is refused each time with ``forbidden_for_agents``, and every
attempt is journaled in its session; the user's CLI doing the same succeeds.

Found by its spawn token (fallback mode), or, with an empty environment, by its
cgroup (cgroup mode)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from agentsd.cgroup import CGROUP_PREFIX
from agentsd.procfs import SPAWN_TOKEN_ENV
from tests.cgroup_root import cgroup_root, unavailable
from tests.daemon_process import DaemonProcess, running_daemon
from tests.e2e.test_conversation import wait_journal
from tests.e2e.test_sessions import DATABASE_NAME, create, db_rows, history, open_rpc, temp_dir

CLI_TIMEOUT_S = 30.0
# The intruder: plain stdlib, one request per line, one reply per line, printed.
INTRUDER = """
import json, socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
reader = sock.makefile("rb")
for i, (method, params) in enumerate(json.loads(sys.argv[2])):
    sock.sendall(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode() + b"\\n")
    print(reader.readline().decode().strip(), flush=True)
"""


@contextlib.contextmanager
def daemon_in(mode: str, args: tuple[str, ...] = ()) -> Iterator[DaemonProcess]:
    if mode == "process-group":
        with running_daemon(extra_args=list(args)) as daemon:
            yield daemon
        return
    if unavailable() is not None:
        pytest.skip(str(unavailable()))
    with (
        cgroup_root() as root,
        running_daemon(extra_args=["--cgroup-root", str(root), *args]) as daemon,
    ):
        yield daemon


def cli(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentsctl.cli", "--socket", str(daemon.socket), "--no-start",
         *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
        check=False,
    )  # fmt: skip


def intrude(daemon: DaemonProcess, mode: str, token: str, requests: Any) -> list[dict[str, Any]]:
    """Run the intruder inside the session of ``token``: with the token in its
    environment (a tool of the agent), or with none at all inside its cgroup (a tool
    that cleared its environment); its replies."""
    argv = [sys.executable, "-c", INTRUDER, str(daemon.socket), json.dumps(requests)]
    if mode == "process-group":
        env = {**os.environ, SPAWN_TOKEN_ENV: token}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=True)
    else:
        root = Path(json.loads(cli(daemon, "status", "--json").stdout)["containment"]["root"])
        procs = root / f"{CGROUP_PREFIX}{token}" / "cgroup.procs"
        done = subprocess.run(
            argv,
            env={},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            preexec_fn=lambda: procs.write_text("0"),  # the test's stand-in for the agent's fork
        )
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("mode", ["process-group", "cgroup"])
async def test_agents_are_not_users(mode: str) -> None:
    with trio.fail_after(90), temp_dir() as cwd, daemon_in(mode) as daemon:
        async with open_rpc(daemon.socket) as rpc:
            mine = (await create(rpc, cwd))["sessionId"]
            other = (await create(rpc, cwd))["sessionId"]
            await rpc.call("agentSession.send", {"sessionId": mine, "text": "approve"})
            events = await wait_journal(rpc, mine, "approval.requested")
            approval = [e for e in events if e["kind"] == "approval.requested"][-1]["body"]
            [(token,)] = db_rows(
                daemon.state_dir / DATABASE_NAME,
                "SELECT token FROM leases WHERE session_id = ? ORDER BY fence DESC LIMIT 1",
                mine,
            )
            requests = [
                (
                    "agentSession.respond",
                    {"sessionId": mine, "approvalId": approval["approvalId"], "decision": "accept"},
                ),
                ("agentSession.close", {"sessionId": other}),
                ("agentSession.continue", {"sessionId": other}),
                ("daemon.restart", {"drain": "turn"}),
                ("daemon.shutdown", {}),
            ]
            replies = await trio.to_thread.run_sync(intrude, daemon, mode, token, requests)
            assert [r["error"]["data"]["kind"] for r in replies] == ["forbidden_for_agents"] * 5
            assert [r["error"]["data"]["refused"] for r in replies] == [
                "answering an approval",
                "closing another session",
                "acting on another session (agentSession.continue)",
                "controlling the daemon (daemon.restart)",
                "shutting the daemon down",
            ]
            assert all(r["error"]["data"]["callerSessionId"] == mine for r in replies)
            journaled = [
                e["body"] for e in await history(rpc, mine) if e["kind"] == "agent.request"
            ]
            assert [(e["method"], e["allowed"]) for e in journaled] == [
                ("agentSession.respond", False),
                ("agentSession.close", False),
                ("agentSession.continue", False),
                ("daemon.restart", False),
                ("daemon.shutdown", False),
            ]
            assert journaled[1]["targetSessionId"] == other
            infos = await rpc.call("agentSession.list", {})
            phases = {s["sessionId"]: s["phase"] for s in infos["sessions"]}
            assert phases[other] == "running"

        # The user's CLI does the same, and it works.
        assert cli(daemon, "approve", mine, approval["approvalId"]).returncode == 0
        assert cli(daemon, "close", other).returncode == 0
        assert cli(daemon, "daemon", "stop").returncode == 0
        assert daemon.wait() == 0


def _agent_request(events: list[dict[str, Any]]) -> list[tuple[str, bool, str | None]]:
    return [
        (e["body"]["method"], e["body"]["allowed"], e["body"].get("reason"))
        for e in events
        if e["kind"] == "agent.request"
    ]


@pytest.mark.parametrize("mode", ["process-group", "cgroup"])
async def test_an_agent_creates_sessions_only_when_the_allowance_says_so(mode: str) -> None:
    """Off by default: an agent's create is refused and journaled, nothing is made.
    With ``agent_allowance = ["sessions"]`` it creates a sub-session (recorded as
    its own), prompts and closes it, but still may not touch the user's other
    session, nor give a sub-session a command of its own."""
    with trio.fail_after(120), temp_dir() as cwd:
        config = cwd / "config.toml"
        config.write_text('agent_allowance = ["sessions"]\n')
        for allowed in (False, True):
            args = ("--config", str(config)) if allowed else ()
            with daemon_in(mode, args) as daemon:
                async with open_rpc(daemon.socket) as rpc:
                    mine = (await create(rpc, cwd))["sessionId"]
                    other = (await create(rpc, cwd))["sessionId"]
                    [(token,)] = db_rows(
                        daemon.state_dir / DATABASE_NAME,
                        "SELECT token FROM leases WHERE session_id = ?",
                        mine,
                    )
                    new = {"provider": "mock", "cwd": str(cwd)}
                    [made] = await trio.to_thread.run_sync(
                        intrude, daemon, mode, token, [("agentSession.create", new)]
                    )
                    listed = (await rpc.call("agentSession.list", {}))["sessions"]
                    if not allowed:
                        assert made["error"]["data"]["kind"] == "forbidden_for_agents"
                        assert made["error"]["data"]["refused"] == "creating a session"
                        assert {s["sessionId"] for s in listed} == {mine, other}
                        assert _agent_request(await history(rpc, mine)) == [
                            ("agentSession.create", False, "creating a session")
                        ]
                        continue
                    sub = made["result"]["sessionId"]
                    assert made["result"]["session"]["createdBy"] == mine
                    assert {s["sessionId"]: s.get("createdBy") for s in listed} == {
                        mine: None,
                        other: None,
                        sub: mine,
                    }
                    replies = await trio.to_thread.run_sync(
                        intrude,
                        daemon,
                        mode,
                        token,
                        [
                            ("agentSession.send", {"sessionId": sub, "text": "hello"}),
                            ("agentSession.close", {"sessionId": sub}),
                            ("agentSession.close", {"sessionId": other}),
                            ("agentSession.create", {**new, "command": ["/bin/sh"]}),
                        ],
                    )
                    assert "result" in replies[0] and "result" in replies[1]
                    assert replies[1]["result"]["wasRunning"] is True
                    assert [r["error"]["data"]["refused"] for r in replies[2:]] == [
                        "closing another session",
                        "creating a session with its own command or environment",
                    ]
                    assert _agent_request(await history(rpc, mine)) == [
                        ("agentSession.create", True, None),
                        ("agentSession.send", True, None),
                        ("agentSession.close", True, None),
                        ("agentSession.close", False, "closing another session"),
                        (
                            "agentSession.create",
                            False,
                            "creating a session with its own command or environment",
                        ),
                    ]
                    [created] = [
                        e for e in await history(rpc, sub) if e["kind"] == "session.created"
                    ]
                    assert created["body"]["by"] == mine
                    phases = {
                        s["sessionId"]: s["phase"]
                        for s in (await rpc.call("agentSession.list", {}))["sessions"]
                    }
                    assert (phases[sub], phases[other]) == ("stopped", "running")


# The escapee: connects, forks, and the process that connected exits; the child
# keeps the socket and waits for a line on stdin before it sends anything.
ESCAPEE = """
import json, os, socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
if os.fork():
    os._exit(0)
sys.stdin.readline()
reader = sock.makefile("rb")
for i, (method, params) in enumerate(json.loads(sys.argv[2])):
    sock.sendall(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode() + b"\\n")
    print(reader.readline().decode().strip(), flush=True)
"""


def escape(daemon: DaemonProcess, mode: str, token: str, requests: Any) -> list[dict[str, Any]]:
    """Run the escapee inside the session of ``token`` (as ``intrude``) while the
    daemon is stopped, so that the process that connected is gone and reaped before
    the daemon accepts the connection; its child's replies."""
    argv = [sys.executable, "-c", ESCAPEE, str(daemon.socket), json.dumps(requests)]
    if mode == "process-group":
        env = {**os.environ, SPAWN_TOKEN_ENV: token}
        preexec = None
    else:
        root = Path(json.loads(cli(daemon, "status", "--json").stdout)["containment"]["root"])
        procs = root / f"{CGROUP_PREFIX}{token}" / "cgroup.procs"
        env = {}

        def preexec() -> None:
            procs.write_text("0")

    os.kill(daemon.process.pid, signal.SIGSTOP)
    try:
        escapee = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            preexec_fn=preexec,
        )  # fmt: skip
        assert escapee.wait(timeout=30) == 0  # the connecting process: exited, reaped
    finally:
        os.kill(daemon.process.pid, signal.SIGCONT)
    out, _ = escapee.communicate("go\n", timeout=30)  # to the end: the child's exit
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize("mode", ["process-group", "cgroup"])
async def test_an_agent_whose_connecting_process_exited_is_still_an_agent(mode: str) -> None:
    """A tool of the agent connects, forks, and exits; its child, holding the
    connection, is not the user: the daemon fails closed, refusing every user-only
    action as to an agent it could not identify, and journals nothing in any
    session. The user's CLI still works."""
    with trio.fail_after(90), temp_dir() as cwd, daemon_in(mode) as daemon:
        async with open_rpc(daemon.socket) as rpc:
            mine = (await create(rpc, cwd))["sessionId"]
            await rpc.call("agentSession.send", {"sessionId": mine, "text": "approve"})
            events = await wait_journal(rpc, mine, "approval.requested")
            approval = [e for e in events if e["kind"] == "approval.requested"][-1]["body"]
            [(token,)] = db_rows(
                daemon.state_dir / DATABASE_NAME,
                "SELECT token FROM leases WHERE session_id = ? ORDER BY fence DESC LIMIT 1",
                mine,
            )
            requests = [
                (
                    "agentSession.respond",
                    {"sessionId": mine, "approvalId": approval["approvalId"], "decision": "accept"},
                ),
                ("agentSession.get", {"sessionId": mine}),
                ("daemon.shutdown", {}),
            ]
            replies = await trio.to_thread.run_sync(escape, daemon, mode, token, requests)
            assert [r.get("error", {}).get("data", {}).get("kind") for r in replies] == [
                "forbidden_for_agents",
                None,
                "forbidden_for_agents",
            ]
            assert replies[1]["result"]["session"]["sessionId"] == mine
            assert all("could not be identified" in replies[i]["error"]["message"] for i in (0, 2))
            assert _agent_request(await history(rpc, mine)) == []
        assert "could not be identified" in daemon.log()
        assert cli(daemon, "approve", mine, approval["approvalId"]).returncode == 0
        assert cli(daemon, "daemon", "stop").returncode == 0
        assert daemon.wait() == 0


def _token(daemon: DaemonProcess, session_id: str) -> str:
    [(token,)] = db_rows(
        daemon.state_dir / DATABASE_NAME,
        "SELECT token FROM leases WHERE session_id = ? ORDER BY fence DESC LIMIT 1",
        session_id,
    )
    return str(token)


@pytest.mark.parametrize(
    ("options", "allowance", "refused"),
    [
        ({"mcpServers": {"x": {"command": "/bin/sh", "args": ["-c", "id"]}}}, ["sessions"], True),
        ({"permissionMode": "bypassPermissions"}, ["sessions"], True),
        ({"sandbox": "danger-full-access"}, ["sessions"], True),
        ({"approvalPolicy": "never"}, ["sessions"], True),
        ({"config": {"sandbox_mode": "danger-full-access"}}, ["sessions"], True),
        ({"addDirs": ["/"]}, ["sessions"], True),
        ({"model": "m"}, ["sessions"], True),
        ({}, ["sessions"], False),
        ({"addDirs": ["/"]}, ["sessions", "approvals"], False),
    ],
)  # fmt: skip
async def test_an_agent_creates_sessions_with_options_only_under_the_approvals_allowance(
    options: dict[str, Any], allowance: list[str], refused: bool
) -> None:
    """An agent allowed ``sessions`` may not give a sub-session options that start
    programs or lift its permissions, sandbox or approvals, nor any other (which
    ``setOptions`` refuses too), unless ``approvals`` is allowed."""
    with trio.fail_after(90), temp_dir() as cwd:
        config = cwd / "config.toml"
        config.write_text(f"agent_allowance = {json.dumps(allowance)}\n")
        with daemon_in("process-group", ("--config", str(config))) as daemon:
            async with open_rpc(daemon.socket) as rpc:
                mine = (await create(rpc, cwd))["sessionId"]
                new = {"provider": "mock", "cwd": str(cwd), "start": False, "options": options}
                [made] = await trio.to_thread.run_sync(
                    intrude, daemon, "process-group", _token(daemon, mine),
                    [("agentSession.create", new)],
                )  # fmt: skip
                listed = (await rpc.call("agentSession.list", {}))["sessions"]
                if refused:
                    assert made["error"]["data"]["kind"] == "forbidden_for_agents"
                    assert made["error"]["data"]["refused"] == (
                        "creating a session with options of its own"
                    )
                    assert [s["sessionId"] for s in listed] == [mine]
                else:
                    assert made["result"]["session"]["createdBy"] == mine
                    assert len(listed) == 2


async def test_an_agent_may_not_mark_seen_delete_or_adopt() -> None:
    """By default an agent may not acknowledge its own session (that would hide its
    approvals from the user), delete it (erasing its journal) or adopt a
    conversation (closing it stays allowed: its journal is kept). Allowed ``sessions``, it still may not delete
    the sub-session it made, nor resume a conversation in one."""
    with trio.fail_after(120), temp_dir() as cwd:
        config = cwd / "config.toml"
        config.write_text('agent_allowance = ["sessions"]\n')
        with daemon_in("process-group", ("--config", str(config))) as daemon:
            async with open_rpc(daemon.socket) as rpc:
                mine = (await create(rpc, cwd))["sessionId"]
                token = _token(daemon, mine)
                [sub] = await trio.to_thread.run_sync(
                    intrude, daemon, "process-group", token,
                    [("agentSession.create", {"provider": "mock", "cwd": str(cwd)})],
                )  # fmt: skip
                sub_id = sub["result"]["sessionId"]
                handle = sub["result"]["session"]["providerHandle"]
                adopt = {"provider": "codex", "cwd": str(cwd), "resumeFrom": {"handle": handle}}
                replies = await trio.to_thread.run_sync(
                    intrude, daemon, "process-group", token,
                    [
                        ("agentSession.acknowledge", {"sessionId": mine, "seq": 1}),
                        ("agentSession.acknowledge", {"sessionId": sub_id, "seq": 1}),
                        ("agentSession.delete", {"sessionId": sub_id}),
                        ("agentSession.create", adopt),
                        ("agentSession.delete", {"sessionId": mine}),
                    ],
                )  # fmt: skip
                assert [r.get("error", {}).get("data", {}).get("refused") for r in replies] == [
                    "marking a session as seen",
                    "marking a session as seen",
                    "deleting a session",
                    "resuming a conversation",
                    "deleting a session",
                ]
                listed = {
                    s["sessionId"] for s in (await rpc.call("agentSession.list", {}))["sessions"]
                }
                assert listed == {mine, sub_id}
                assert [
                    (m, allowed) for m, allowed, _ in _agent_request(await history(rpc, mine))
                ] == [
                    ("agentSession.create", True),
                    ("agentSession.acknowledge", False),
                    ("agentSession.acknowledge", False),
                    ("agentSession.delete", False),
                    ("agentSession.create", False),
                    ("agentSession.delete", False),
                ]
            # The user may do all of it.
            assert cli(daemon, "rm", sub_id).returncode == 0


async def test_a_process_in_an_agent_cgroup_no_session_holds_is_unidentified() -> None:
    """An ``agent-*`` cgroup under the daemon's root whose token no session holds
    (one left behind, or made by an agent) does not make its processes the user."""
    with trio.fail_after(90), temp_dir() as cwd, daemon_in("cgroup") as daemon:
        async with open_rpc(daemon.socket) as rpc:
            mine = (await create(rpc, cwd))["sessionId"]
            root = Path(json.loads(cli(daemon, "status", "--json").stdout)["containment"]["root"])
            stray = root / f"{CGROUP_PREFIX}{'f' * 32}"
            stray.mkdir()
            try:
                procs = stray / "cgroup.procs"
                argv = [
                    sys.executable, "-c", INTRUDER, str(daemon.socket),
                    json.dumps([("agentSession.close", {"sessionId": mine}),
                                ("daemon.shutdown", {})]),
                ]  # fmt: skip
                done = await trio.to_thread.run_sync(
                    lambda: subprocess.run(
                        argv,
                        env={},
                        capture_output=True,
                        text=True,
                        timeout=30,
                        check=True,
                        preexec_fn=lambda: procs.write_text("0"),
                    )
                )
            finally:
                stray.rmdir()  # the intruder has exited: the cgroup is empty
            replies = [json.loads(line) for line in done.stdout.splitlines()]
            assert [r["error"]["data"]["kind"] for r in replies] == ["forbidden_for_agents"] * 2
            assert all("could not be identified" in r["error"]["message"] for r in replies)
            phases = {
                s["sessionId"]: s["phase"]
                for s in (await rpc.call("agentSession.list", {}))["sessions"]
            }
            assert phases[mine] == "running"
        assert cli(daemon, "daemon", "stop").returncode == 0
        assert daemon.wait() == 0
