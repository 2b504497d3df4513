"""Who is calling: the user, or one of our own agents (DESIGN.md invariant 9).

An agent runs with the user's uid, so SO_PEERCRED cannot tell it from the user. A
connection's peer (the process that connected, pinned by a pidfd taken at accept
where the kernel gives one: SO_PEERPIDFD) is looked up once, at accept:

Rule 1: it comes from a session when the peer is in that session's cgroup (cgroup
mode: ``0::/.../agent-<token>`` in ``/proc/PID/cgroup``, which no descendant can
leave by accident), or when the peer or one of its ancestors is that session's recorded child
(pid and start time) or carries its spawn token in its environment (fallback; a
process that both left the agent's tree and cleared its environment is not found
without a cgroup). Under systemd the agents' cgroups are in the holder's delegated
scope (``agentsd.holder_scope``), whose cgroups any process of the user may move
itself between: a peer anywhere in a holder's scope outside an agent's cgroup (an
agent's process that moved itself out, into the scope or the holder's leaf; the
holder itself never calls) is UNIDENTIFIED. Identification fails closed: a peer (or ancestor) already gone
or unreadable, or in an ``agent-*`` cgroup of no held session, is UNIDENTIFIED: it
may be an agent, which one is unknown; it is refused everything an agent is
refused with no allowance at all, logged (it has no session to journal in).

Rule 2: a request from a session is journaled in that session as ``agent.request``
(what, on which session, allowed or not), and `refusal` names what an agent must not
do to its user unless the config's ``agent_allowance`` lifts it: answer any approval
(its own included: ``approvals``), change any session's options (its own
included, since a permission mode or sandbox is among them: ``approvals``), mark any session seen (acknowledge, its own included: that
hides its approvals from the user; ``approvals``), create a session (``sessions``;
with options of its own (``sets_options``) also ``approvals``; adopting a conversation,
``resumeFrom``, ``other-sessions``), delete any session (its own and its
sub-sessions' included: that erases their journals; ``other-sessions``; closing its
own stays allowed), change another session in any way (send, interrupt, queue,
close, options, title, acknowledge: every mutation that names another session,
continuing its cut-off turn included; ``other-sessions``, or ``sessions`` for the
sessions it created itself), control the daemon (shutdown, restart, reload of the
agents' environment: ``daemon``). `POLICED_NON_MUTATIONS` are policed like
mutations. Reading (get, list, history, subscribe, watch, completions: following)
is never refused.

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

import attrs

from agentsd.cgroup import CGROUP_PREFIX
from agentsd.config import Limits
from agentsd.holder_scope import is_holder_scope
from agentsd.procfs import SPAWN_TOKEN_ENV, read_proc_info
from agentsd.session import Session
from agentsd_protocol.methods import ACKNOWLEDGE, METHODS

__all__ = [
    "POLICED_NON_MUTATIONS",
    "UNIDENTIFIED",
    "Allowance",
    "Caller",
    "Unidentified",
    "identify_caller",
    "refusal",
    "sets_options",
]

Allowance = Literal["approvals", "sessions", "other-sessions", "daemon"]
MAX_ANCESTORS = 64  # deeper process trees than this are not a shell's tools

_TOKEN_PREFIX = f"{SPAWN_TOKEN_ENV}=".encode()
# Methods that change state without being mutations (no operation id): policed too.
POLICED_NON_MUTATIONS = frozenset({ACKNOWLEDGE.name})
_OTHER_SESSION_METHODS = {
    "agentSession.close": "closing another session",
    "agentSession.delete": "deleting another session",
    "agentSession.setOptions": "changing the options of another session",
    "agentSession.command": "running a command in another session",
}


@attrs.frozen
class Unidentified:
    """A caller that may be an agent but could not be told apart (Rule 1): it is
    refused every user-only action, whatever the allowance."""


UNIDENTIFIED = Unidentified()
# A session id, None (the user), or UNIDENTIFIED.
Caller = str | None | Unidentified


def identify_caller(pid: int, sessions: Iterable[Session]) -> Caller:
    """The id of the session ``pid`` belongs to (Rule 1), None: the user, or
    UNIDENTIFIED when ``pid`` or an ancestor is gone, or sits in an agent's cgroup
    no session holds. Reads /proc: run it in a worker thread."""
    by_token: dict[str, str] = {}
    by_child: dict[tuple[int, int], str] = {}
    for session in sessions:
        lease = session.lease
        if lease is None or not lease.held:
            continue
        by_token[lease.token] = session.id
        if lease.identity is not None:
            by_child[(lease.identity.pid, lease.identity.start_time)] = session.id
    found = _by_cgroup(pid, by_token)
    if found is not None:
        return found
    if not by_token:
        return None
    current = pid
    for _ in range(MAX_ANCESTORS):
        info = read_proc_info(current)
        if info is None:
            return UNIDENTIFIED
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


def _by_cgroup(pid: int, by_token: Mapping[str, str]) -> str | Unidentified | None:
    """The session whose agent cgroup ``pid`` is in; UNIDENTIFIED when it is gone
    or in an agent cgroup of no held session; None when in no agent cgroup."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return UNIDENTIFIED
    for line in lines:
        if line.startswith("0::"):
            parts = line[3:].split("/")
            for part in parts:
                if part.startswith(CGROUP_PREFIX):
                    return by_token.get(part.removeprefix(CGROUP_PREFIX), UNIDENTIFIED)
            if any(is_holder_scope(part) for part in parts):
                return UNIDENTIFIED  # Rule 1: never the user, never the holder
    return None


def pidfd_pid(pidfd: int) -> int:
    """The pid a pidfd refers to, -1 once that process has exited (``Pid:`` in
    ``/proc/self/fdinfo``)."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as f:
            for line in f:
                if line.startswith("Pid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return -1


def identify_peer(pid: int, pidfd: int | None, sessions: Iterable[Session]) -> Caller:
    """``identify_caller`` for a connection's peer, pinned by the ``pidfd`` taken at
    accept (SO_PEERPIDFD) when there is one: the peer must be alive before and
    after /proc is read, so its pid was not reused meanwhile. The caller keeps
    ``pidfd`` and closes it."""
    if pidfd is None:
        return identify_caller(pid, sessions)
    pinned = pidfd_pid(pidfd)
    if pinned <= 0:
        return UNIDENTIFIED
    found = identify_caller(pinned, sessions)
    return found if pidfd_pid(pidfd) == pinned else UNIDENTIFIED


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


def sets_options(options: Mapping[str, Any] | None) -> bool:
    """Whether a request sets options (the predicate of create and setOptions
    alike, Rule 2): any option may start programs (``mcpServers``) or widen
    permissions, sandbox, directories or approvals, or cost the user (a model), and
    which are harmless differs by provider and release: none is, to an agent."""
    return bool(options)


def refusal(
    method: str,
    params: Any,
    caller: str | None,
    allowance: Collection[Allowance],
    target_created_by: str | None = None,
    defaults: Limits | None = None,
) -> str | None:
    """What an agent of session ``caller`` (None: an agent that could not be
    identified; pass no allowance) must not do with this request, in words, or None
    (Rules 2 and 3). ``target_created_by`` is the creator of the session the
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
        if sets_options(getattr(params, "options", None)) and "approvals" not in allowance:
            return "creating a session with options of its own"
        if getattr(params, "resume_from", None) is not None and "other-sessions" not in allowance:
            return "resuming a conversation"
    changes = method in METHODS and (METHODS[method].mutation or method in POLICED_NON_MUTATIONS)
    target = getattr(params, "session_id", None)
    own_child = "sessions" in allowance and caller is not None and target_created_by == caller
    if method == "agentSession.delete" and "other-sessions" not in allowance:
        # Its own and its sub-sessions too: a delete erases their journals, where
        # what the agent did (and asked) is recorded.
        return "deleting a session"
    if (
        changes
        and target is not None
        and target != caller
        and "other-sessions" not in allowance
        and not own_child
    ):
        return _OTHER_SESSION_METHODS.get(method, f"acting on another session ({method})")
    if method == ACKNOWLEDGE.name and "approvals" not in allowance:
        # Its own session's too: marking it seen would hide its pending approvals
        # and finished turns from the user's attention.
        return "marking a session as seen"
    if (
        method == "agentSession.setOptions"
        # ``options`` replaces them all (dropping what the user set): never harmless.
        and (getattr(params, "options", None) is not None or sets_options(params.changes))
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
