"""Wire types of the ``daemon.*`` and ``rpc.*`` methods."""

from __future__ import annotations

from typing import Any

from agentsd_protocol.api.base import Empty, MutationParams, Result


class PingParams(Empty, frozen=True, kw_only=True):
    pass


class PingResult(Result, frozen=True, kw_only=True):
    pong: bool = True


class StatusParams(Empty, frozen=True, kw_only=True):
    pass


class RecoveryReport(Result, frozen=True, kw_only=True):
    """What the daemon's start-up recovery did before it began serving."""

    sessions_recovered: int = 0
    orphans_ended: int = 0
    unproven: int = 0
    summary: str = ""


class SessionCounts(Result, frozen=True, kw_only=True):
    total: int = 0
    running: int = 0
    working: int = 0
    attention: int = 0


class Storage(Result, frozen=True, kw_only=True):
    """Whether the daemon can make writes durable. ``state`` is ``ok`` or
    ``unavailable`` (every mutation fails with ``storage_unavailable``; ``detail``
    says why: the state directory was deleted, moved or made read-only)."""

    state: str = "ok"
    detail: str = ""


class AgentProgram(Result, frozen=True, kw_only=True):
    """Where one provider's program resolves in the agents' environment."""

    provider: str
    command: str  # what is looked up: a program name, or a configured path
    path: str | None = None  # None: not found
    source: str = "PATH"  # "PATH", "package" (a PyPI package in agentsd's environment), "config"
    # The version this program reported to the daemon (in a handshake, or its
    # ``--version``) at an agent's start; None until one started.
    version: str | None = None


class AgentEnv(Result, frozen=True, kw_only=True):
    """The environment agents start with, as the daemon sees it.

    ``mode`` is the one in force (``login-shell`` or ``inherit``; config ``agent_env =
    "auto"`` chooses by how the daemon was started). ``state`` says what happened:
    ``captured`` (from the login shell), ``fallback`` (the login shell failed:
    ``detail`` says why, and agents get the daemon's own environment), ``inherited``,
    or ``pending`` (the first capture is under way). ``programs`` were located when
    the environment was taken."""

    mode: str
    configured: str
    state: str
    detail: str = ""
    shell: str | None = None
    path: str = ""  # the PATH agents get
    daemon_path: str = ""  # the daemon's own PATH
    age_s: float | None = None  # since the environment was taken
    capturing: bool = False  # a new capture is under way
    programs: list[AgentProgram] = []


class Containment(Result, frozen=True, kw_only=True):
    """How agents are contained: ``cgroup-root`` (a configured cgroup v2 directory),
    ``systemd-delegated`` (the service's delegated subtree) or ``process-group``
    (no cgroup: the process group and spawn token)."""

    mode: str = "process-group"
    root: str | None = None  # the cgroup directory session cgroups are made in
    detail: str = ""


class StatusResult(Result, frozen=True, kw_only=True):
    version: str
    pid: int
    uptime_s: float
    socket: str
    state_dir: str
    connections: int
    sessions: SessionCounts = SessionCounts()
    recovery: RecoveryReport = RecoveryReport()
    containment: Containment = Containment()
    agent_env: AgentEnv | None = None
    storage: Storage = Storage()
    # Every name ``agentSession.create`` takes as its provider, sorted: the native
    # providers and every ACP agent (the built-in registry and the config's
    # ``[agents.NAME]``).
    providers: list[str] = []


class ShutdownParams(Empty, frozen=True, kw_only=True):
    pass


class ShutdownResult(Result, frozen=True, kw_only=True):
    stopping: bool = True


class ReloadEnvParams(MutationParams, frozen=True, kw_only=True):
    pass


class ReloadEnvResult(Result, frozen=True, kw_only=True):
    agent_env: AgentEnv


class DiscoverParams(Empty, frozen=True, kw_only=True):
    pass


DiscoverResult = dict[str, Any]
