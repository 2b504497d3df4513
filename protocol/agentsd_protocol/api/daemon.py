"""Wire types of the ``daemon.*`` and ``rpc.*`` methods."""

from __future__ import annotations

from typing import Any, Literal

from agentsd_protocol.api.base import Empty, MutationParams, Result


class PingParams(Empty, frozen=True, kw_only=True):
    pass


class PingResult(Result, frozen=True, kw_only=True):
    pong: bool = True


class StatusParams(Empty, frozen=True, kw_only=True):
    pass


class CutOffTurn(Result, frozen=True, kw_only=True):
    """A session whose last turn a daemon restart or stop cut off: ``seq`` is its
    ``turn.completed`` (``interrupted``, ``reason`` ``daemon-restart`` after a crash,
    ``shutdown`` after a stop). ``continued``: ``agentSession.continue`` has since
    carried it on."""

    session_id: str
    title: str | None = None
    provider: str = ""
    seq: int
    reason: str = ""
    continued: bool = False


class RecoveryFailure(Result, frozen=True, kw_only=True):
    """A session recovery could not settle, or whose continuation failed, and why."""

    session_id: str
    reason: str


class RecoveryReport(Result, frozen=True, kw_only=True):
    """What the daemon found at start-up and what became of it (the reconciliation
    report; ``continued`` and the ``cut_off`` entries follow ``agentSession.continue``
    while the daemon runs).

    ``sessions_running``: sessions whose agent a previous daemon left running (it
    crashed or was killed); ``turns_cut_off``: sessions whose last turn a daemon
    restart or stop cut off and nobody carried on, listed in ``cut_off``;
    ``failed``: sessions recovery could not settle (their agent could not be proven
    gone) or whose continuation failed; ``lost``: turns that were running and are
    accounted for nowhere (neither cut off nor failed): always 0, or a bug;
    ``reattached``: agents the holder kept running through the previous daemon's
    death that this daemon took over (``crash_policy = "reattach"``): their turns go
    on, so they are neither cut off nor lost."""

    sessions_recovered: int = 0
    orphans_ended: int = 0
    unproven: int = 0
    summary: str = ""
    sessions_running: int = 0
    turns_cut_off: int = 0
    continued: int = 0
    lost: int = 0
    cut_off: list[CutOffTurn] = []
    failed: list[RecoveryFailure] = []
    reattached: int = 0


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


class RestartParams(MutationParams, frozen=True, kw_only=True):
    """Restart the daemon in place: the same process executes the daemon again
    (whatever was installed since is what runs), keeping its pid and the sockets a
    service manager passed; under one it says ``RELOADING=1``, then the new image
    ``READY=1``. With the holder (config ``holder``) running agents are handed over
    and keep running; without it they end (the next send resumes natively). With
    ``drain`` (``turn``: the only kind yet) it first takes no new turn (sends get
    ``draining``) and waits until no turn runs, or ``timeout_s`` passed (None: no
    bound). Without the holder and without ``drain`` running turns are cut off at
    once (``agentSession.continue`` carries them on)."""

    drain: Literal["turn"] | None = None
    timeout_s: float | None = None


class RestartResult(Result, frozen=True, kw_only=True):
    """``turns_running``: turns running when the drain began; ``turns_finished`` of
    them ended while it waited, ``turns_cut_off`` still ran and are cut off by the
    restart. ``how``: ``service-manager`` (re-executed in place, told with
    ``RELOADING=1``/``READY=1``) or ``re-exec``. ``keeps_agents``: running agents
    are handed over to the new image (the holder keeps them) rather than ended."""

    drained: bool
    turns_running: int = 0
    turns_finished: int = 0
    turns_cut_off: int = 0
    waited_s: float = 0.0
    timed_out: bool = False
    how: str
    keeps_agents: bool = False


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
    draining: bool = False  # a drained restart is waiting for running turns


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
