"""agentsd.caller: who is calling, and what an agent may not do (DESIGN.md
invariant 9). Real processes: the caller is found by ancestry, by spawn token, or
not at all; the refusals follow the allowance."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

from agentsd import leases
from agentsd.caller import UNIDENTIFIED, Allowance, identify_caller, identify_peer, refusal
from agentsd.config import Limits
from agentsd.procfs import SPAWN_TOKEN_ENV, read_start_time
from agentsd.session import Session
from agentsd.status_board import StatusBoard
from agentsd.store.sessions import SessionRow
from agentsd_protocol.api.controls import CommandParams
from agentsd_protocol.api.conversation import SetOptionsParams
from agentsd_protocol.api.session import CloseParams, CreateParams

TOKEN = "0" * 32


def a_session(session_id: str, pid: int) -> Session:
    start_time = read_start_time(pid)
    assert start_time is not None
    row = SessionRow(
        id=session_id,
        host_id="h",
        provider="mock",
        cwd="/",
        title=None,
        options={},
        env={},
        command=None,
        provider_handle=None,
        created_at=0.0,
        updated_at=0.0,
    )
    lease = leases.Lease(
        session_id=session_id,
        fence=1,
        generation="g",
        token=TOKEN if session_id == "by-token" else os.urandom(16).hex(),
        state=leases.ClaimState.LIVE,
        acquired_at=0.0,
        identity=leases.Identity(pid=pid, pgid=pid, start_time=start_time),
    )
    return Session(row=row, head_seq=0, board=StatusBoard(), lease=lease)


def test_a_descendant_of_a_sessions_child_is_that_session() -> None:
    """This test process stands for a session's agent; a process it starts through
    a shell, with an empty environment, is its grandchild."""
    sessions = [a_session("agent", os.getpid())]
    with subprocess.Popen(["/bin/sh", "-c", "/bin/sleep 30; :"], env={}) as shell:
        child_pid = _only_child(shell.pid)
        try:
            assert identify_caller(child_pid, sessions) == "agent"
        finally:
            shell.kill()
            os.kill(child_pid, 9)


def _only_child(pid: int) -> int:
    """The one child of ``pid`` once it has started it."""
    path = f"/proc/{pid}/task/{pid}/children"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(path) as f:
            children = f.read().split()
        if children:
            return int(children[0])
        time.sleep(0.01)  # a synchronous test: a bounded poll for the shell's fork
    raise AssertionError(f"{pid} started no child")


def test_a_child_of_a_sessions_agent_is_that_session() -> None:
    sessions = [a_session("agent", os.getpid())]
    with subprocess.Popen(["/bin/sleep", "30"], env={}) as child:
        try:
            assert identify_caller(child.pid, sessions) == "agent"
        finally:
            child.kill()


def test_a_carrier_of_a_sessions_token_is_that_session() -> None:
    unrelated = a_session("by-token", 1)  # init: never an ancestor match that counts
    env = {SPAWN_TOKEN_ENV: TOKEN}
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env) as child:
        try:
            assert identify_caller(child.pid, [unrelated]) == "by-token"
        finally:
            child.kill()


def test_a_peer_gone_before_it_is_looked_up_is_unidentified() -> None:
    """Failing closed: a pid whose process exited (and was reaped) is not the user,
    with a session running or not."""
    child = subprocess.Popen(["/bin/true"])
    child.wait()
    assert identify_caller(child.pid, [a_session("other", 1)]) is UNIDENTIFIED
    assert identify_caller(child.pid, []) is UNIDENTIFIED


def test_a_pinned_peer_is_identified_while_alive_and_unidentified_once_exited() -> None:
    """The pidfd taken at accept: the process it pins is looked up while alive;
    once it exited, whatever now has its pid is not looked at."""
    sessions = [a_session("agent", os.getpid())]
    with subprocess.Popen(["/bin/sleep", "30"], env={}) as child:
        pidfd = os.pidfd_open(child.pid)
        try:
            assert identify_peer(-1, pidfd, sessions) == "agent"
        finally:
            child.kill()
    try:
        assert child.returncode is not None  # exited and reaped
        assert identify_peer(child.pid, pidfd, sessions) is UNIDENTIFIED
    finally:
        os.close(pidfd)


def test_the_user_is_no_session() -> None:
    with subprocess.Popen(["/bin/sleep", "30"], env={}) as child:
        try:
            assert identify_caller(child.pid, [a_session("other", 1)]) is None
        finally:
            child.kill()


@pytest.mark.parametrize(
    ("params", "allowance", "refused"),
    [
        (SetOptionsParams(session_id="mine", changes={"permissionMode": "bypassPermissions"}),
         [], "changing a session's options (its model, permissions or sandbox)"),
        (SetOptionsParams(session_id="mine", options={}), [],
         "changing a session's options (its model, permissions or sandbox)"),
        (SetOptionsParams(session_id="mine", changes={"sandbox": "danger-full-access"}),
         ["approvals"], None),
        (SetOptionsParams(session_id="mine", title="renamed"), [], None),
        (SetOptionsParams(session_id="other", title="renamed"), [],
         "changing the options of another session"),
        (CommandParams(session_id="mine", name="clear"), [], None),
        (CommandParams(session_id="other", name="compact"), [],
         "running a command in another session"),
    ],
)  # fmt: skip
def test_an_agent_may_not_change_its_own_options(
    params: SetOptionsParams | CommandParams, allowance: list[Allowance], refused: str | None
) -> None:
    method = (
        "agentSession.command" if isinstance(params, CommandParams) else "agentSession.setOptions"
    )
    assert refusal(method, params, "mine", allowance) == refused


@pytest.mark.parametrize(
    ("method", "target", "allowance", "refused"),
    [
        ("agentSession.respond", None, [], "answering an approval"),
        ("agentSession.respond", None, ["approvals"], None),
        ("agentSession.close", "other", [], "closing another session"),
        ("agentSession.close", "mine", [], None),
        ("agentSession.close", "other", ["other-sessions"], None),
        ("daemon.shutdown", None, [], "shutting the daemon down"),
        ("daemon.shutdown", None, ["daemon"], None),
        ("agentSession.send", "other", [], "acting on another session (agentSession.send)"),
        ("agentSession.send", "mine", [], None),
        (
            "agentSession.interrupt",
            "other",
            [],
            "acting on another session (agentSession.interrupt)",
        ),
        (
            "agentSession.acknowledge",
            "other",
            [],
            "acting on another session (agentSession.acknowledge)",
        ),
        ("agentSession.get", "other", [], None),
        (
            "agentSession.continue",
            "other",
            [],
            "acting on another session (agentSession.continue)",
        ),
        ("agentSession.continue", "mine", [], None),
        ("daemon.restart", None, [], "controlling the daemon (daemon.restart)"),
        ("daemon.restart", None, ["daemon"], None),
        ("daemon.reloadEnv", None, [], "controlling the daemon (daemon.reloadEnv)"),
        ("daemon.reloadEnv", None, ["daemon"], None),
        ("daemon.status", None, [], None),
    ],
)
def test_refusal_follows_the_allowance(
    method: str, target: str | None, allowance: list[Allowance], refused: str | None
) -> None:
    params = CloseParams(session_id=target or "mine")
    assert refusal(method, params, "mine", allowance) == refused


@pytest.mark.parametrize(
    ("params", "allowance", "refused"),
    [
        (CreateParams(provider="mock", cwd="/"), [], "creating a session"),
        (
            CreateParams(provider="mock", cwd="/"),
            ["other-sessions", "daemon"],
            "creating a session",
        ),
        (CreateParams(provider="mock", cwd="/"), ["sessions"], None),
        (
            CreateParams(provider="mock", cwd="/", command=["/bin/sh"]),
            ["sessions"],
            "creating a session with its own command or environment",
        ),
        (
            CreateParams(provider="mock", cwd="/", env={"LD_PRELOAD": "/tmp/x.so"}),
            ["sessions"],
            "creating a session with its own command or environment",
        ),
    ],
)
def test_creating_a_session_is_the_sessions_allowance(
    params: CreateParams, allowance: list[Allowance], refused: str | None
) -> None:
    assert refusal("agentSession.create", params, "mine", allowance) == refused


@pytest.mark.parametrize(
    ("created_by", "allowance", "refused"),
    [
        ("mine", ["sessions"], None),  # its own sub-session
        ("mine", [], "closing another session"),  # created while allowed, no longer
        ("someone", ["sessions"], "closing another session"),  # another agent's
        (None, ["sessions"], "closing another session"),  # the user's
        (None, ["other-sessions"], None),
    ],
)
def test_the_sessions_allowance_reaches_only_the_sessions_it_created(
    created_by: str | None, allowance: list[Allowance], refused: str | None
) -> None:
    params = CloseParams(session_id="sub")
    assert refusal("agentSession.close", params, "mine", allowance, created_by) == refused
    respond_refused = refusal("agentSession.respond", params, "mine", allowance, created_by)
    assert respond_refused == "answering an approval"  # a sub-session's approvals are the user's


@pytest.mark.parametrize(
    ("limits", "refused"),
    [
        ({"pids_max": 64}, None),  # lower than the default
        ({"pids_max": 256}, None),  # the default itself
        ({"pids_max": 257}, "creating a session with limits above the daemon's defaults"),
        ({"memory_max": 1 << 40}, None),  # no default: no ceiling to lift
        ({"cpu_max": 2.5}, "creating a session with limits above the daemon's defaults"),
    ],
)
def test_an_agent_may_lower_a_sub_session_budget_never_lift_it(
    limits: dict[str, Any], refused: str | None
) -> None:
    defaults = Limits(pids_max=256, cpu_max=2.0)
    params = CreateParams(provider="mock", cwd="/", **limits)
    assert refusal("agentSession.create", params, "mine", ["sessions"], None, defaults) == refused
