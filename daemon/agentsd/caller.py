"""Who is calling: the user, or one of our own agents (DESIGN.md invariant 9).

An agent runs with the user's uid, so SO_PEERCRED cannot tell it from the user. A
connection's peer pid (taken when it connected) is looked up once, at accept:

Rule 1: it comes from a session when the peer is in that session's cgroup (cgroup
mode: ``0::/.../agent-<token>`` in ``/proc/PID/cgroup``, which no descendant can
leave), or when the peer or one of its ancestors is that session's recorded child
(pid and start time) or carries its spawn token in its environment (fallback; a
process that both left the agent's tree and cleared its environment is not found
without a cgroup).

Rule 2: a request from a session is journaled in that session as ``agent.request``
(what, on which session, allowed or not), and `refusal` names what an agent must not
do to its user unless the config's ``agent_allowance`` lifts it: answer any approval
(its own included: ``approvals``), change any session's options (its own
included, since a permission mode or sandbox is among them: ``approvals``), create
a session (``sessions``), change another session in any way (send, interrupt,
queue, close, delete, options, title, acknowledge: every mutation that names another
session, continuing its cut-off turn included; ``other-sessions``, or ``sessions``
for the sessions it created itself), control the daemon (shutdown, restart, reload
of the agents' environment: ``daemon``). Reading (get, list, history, subscribe:
following) is never refused.

Rule 3: a session an agent creates is recorded as created by it (``created_by``,
``session.created {by}``), runs in a container of its own like any other, and its
approvals are the user's. It may not be given its own ``command`` or ``env``: that
would let the agent run any program, with any environment, outside its own
container; the provider's configured agent is what runs. Nor limits above the
daemon's defaults: an agent may lower a sub-session's budget, never lift it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Literal

from agentsd.cgroup import CGROUP_PREFIX
from agentsd.config import Limits
from agentsd.procfs import SPAWN_TOKEN_ENV, read_proc_info
from agentsd.session import Session
from agentsd_protocol.methods import ACKNOWLEDGE, METHODS

__all__ = ["Allowance", "identify_caller", "refusal"]

Allowance = Literal["approvals", "sessions", "other-sessions", "daemon"]
MAX_ANCESTORS = 64  # deeper process trees than this are not a shell's tools

_TOKEN_PREFIX = f"{SPAWN_TOKEN_ENV}=".encode()
_OTHER_SESSION_METHODS = {
    "agentSession.close": "closing another session",
    "agentSession.delete": "deleting another session",
    "agentSession.setOptions": "changing the options of another session",
    "agentSession.command": "running a command in another session",
}


def identify_caller(pid: int, sessions: Iterable[Session]) -> str | None:
    """The id of the session ``pid`` belongs to (Rule 1), or None: the user. Reads
    /proc: run it in a worker thread."""
    by_token: dict[str, str] = {}
    by_child: dict[tuple[int, int], str] = {}
    for session in sessions:
        lease = session.lease
        if lease is None or not lease.held:
            continue
        by_token[lease.token] = session.id
        if lease.identity is not None:
            by_child[(lease.identity.pid, lease.identity.start_time)] = session.id
    if not by_token:
        return None
    found = _by_cgroup(pid, by_token)
    if found is not None:
        return found
    current = pid
    for _ in range(MAX_ANCESTORS):
        info = read_proc_info(current)
        if info is None:
            return None
        found = by_child.get((info.pid, info.start_time)) or _by_environ(current, by_token)
        if found is not None:
            return found
        if info.ppid <= 1:
            return None
        current = info.ppid
    return None


def _raises(params: Any, defaults: Limits) -> bool:
    """Whether ``params`` give a limit above a default (no default: no ceiling)."""
    given = (
        (getattr(params, "memory_max", None), defaults.memory_max_bytes),
        (getattr(params, "pids_max", None), defaults.pids_max),
        (getattr(params, "cpu_max", None), defaults.cpu_max),
    )
    return any(
        value is not None and ceiling is not None and value > ceiling for value, ceiling in given
    )


def _by_cgroup(pid: int, by_token: Mapping[str, str]) -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            for part in line[3:].split("/"):
                if part.startswith(CGROUP_PREFIX):
                    return by_token.get(part.removeprefix(CGROUP_PREFIX))
    return None


def _by_environ(pid: int, by_token: Mapping[str, str]) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(_TOKEN_PREFIX):
            return by_token.get(os.fsdecode(entry.removeprefix(_TOKEN_PREFIX)))
    return None


def refusal(
    method: str,
    params: Any,
    caller: str,
    allowance: Collection[Allowance],
    target_created_by: str | None = None,
    defaults: Limits | None = None,
) -> str | None:
    """What an agent of session ``caller`` must not do with this request, in words,
    or None (Rules 2 and 3). ``target_created_by`` is the creator of the session the
    request names, if any; ``defaults`` the daemon's limits, which an agent may lower
    for a session it creates, never raise."""
    if method == "agentSession.respond" and "approvals" not in allowance:
        return "answering an approval"
    if method == "agentSession.create":
        if "sessions" not in allowance:
            return "creating a session"
        if getattr(params, "command", None) is not None or getattr(params, "env", None):
            return "creating a session with its own command or environment"
        if defaults is not None and _raises(params, defaults):
            return "creating a session with limits above the daemon's defaults"
    changes = method in METHODS and (METHODS[method].mutation or method == ACKNOWLEDGE.name)
    target = getattr(params, "session_id", None)
    own_child = "sessions" in allowance and target_created_by == caller
    if (
        changes
        and target is not None
        and target != caller
        and "other-sessions" not in allowance
        and not own_child
    ):
        return _OTHER_SESSION_METHODS.get(method, f"acting on another session ({method})")
    if (
        method == "agentSession.setOptions"
        and (getattr(params, "options", None) is not None or getattr(params, "changes", None))
        and "approvals" not in allowance
    ):
        # Its own session's too: a permission mode, sandbox or approval policy lifted
        # by the agent itself (live, for Claude Code) is an approval it gave itself.
        return "changing a session's options (its model, permissions or sandbox)"
    if method == "daemon.shutdown" and "daemon" not in allowance:
        return "shutting the daemon down"
    if changes and method.startswith("daemon.") and "daemon" not in allowance:
        return f"controlling the daemon ({method})"
    return None
