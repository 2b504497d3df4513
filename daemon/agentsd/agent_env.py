"""The environment agents start with, and where their programs are found in it.

Config ``agent_env`` chooses where it comes from:

- ``login-shell``: what the user's login shell exports (``agentsd.login_shell``).
- ``inherit``: the daemon's own environment.
- ``auto`` (the default): ``login-shell`` when the service manager started the daemon
  (systemd handed it a notify or a listening socket), since a user service runs with
  the user manager's short PATH, without nvm, cargo, ``~/.local/bin`` or pyenv shims;
  ``inherit`` otherwise, since a daemon started from a terminal, or by ``agentsctl``
  from one, already has the environment of the shell it came from, including what a
  login shell would undo (an activated virtualenv, ``nvm use``, a PATH set for that
  terminal; Debian's /etc/profile resets PATH).

Rules:

1. The daemon's own variables stay the daemon's (DESIGN.md invariant 9: agents are
   not users). ``DAEMON_ONLY`` (systemd's notify socket, socket-activation and
   watchdog variables, a spawn token, a holder's mark) never reach an agent,
   whichever the source: they speak for the daemon to its service manager, or
   mark processes it ends. ``FROM_DAEMON`` (the user's
   runtime directory and session bus) keep the daemon's values over a shell's. The
   daemon's socket path is in no variable it sets; it lies under the runtime
   directory, which agent tools need, and which is no secret: who may control the
   daemon is decided by the peer of a connection, not by hiding a path.
2. Precedence at a spawn: this base < ``[providers.NAME] env`` < the provider's own
   launch variables < the session's ``env`` (``agentsd.runner``).
3. One capture at a time (a lock). A `Snapshot` is immutable and shared by every
   start that uses it: a running agent keeps the one it started with, the next start
   gets the newest. ``refresh`` (``daemon.reloadEnv``, SIGHUP) takes a new one.
4. A failed capture is never fatal: agents get the daemon's own environment, and the
   snapshot (so ``daemon.status`` and ``agentsctl doctor``) and the log say why.
5. The first capture starts with the daemon, beside recovery, and never delays
   serving; the first agent start waits for it, at most ``login_shell_timeout_s``
   plus the shell's reap.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping
from typing import Literal

import attrs
import trio

from agentsd.config import Config
from agentsd.login_shell import CAPTURE_VARS, CaptureFailed, capture, login_shell
from agentsd.procfs import HOLDER_MARK_ENV, SPAWN_TOKEN_ENV
from agentsd.providers.acp_agents import acp_agents
from agentsd.providers.programs import CLAUDE, CODEX, Program, find_program
from agentsd.providers.versions import ProgramVersions

log = logging.getLogger(__name__)

DAEMON_ONLY = frozenset(
    {
        "NOTIFY_SOCKET",
        "LISTEN_PID",
        "LISTEN_FDS",
        "LISTEN_FDNAMES",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        SPAWN_TOKEN_ENV,  # each agent gets its own (agentsd.child)
        HOLDER_MARK_ENV,  # a holder's, which no agent may carry (agentsd.holder Rule 1)
    }
)
FROM_DAEMON = ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")
# The programs the built-in providers run when a session names none.
DEFAULT_PROGRAMS: Mapping[str, Program] = {"codex": CODEX, "claude": CLAUDE}

Mode = Literal["login-shell", "inherit"]
State = Literal["captured", "fallback", "inherited"]


def resolve_mode(configured: str, *, under_service_manager: bool) -> Mode:
    """The mode in force for config ``agent_env = configured``."""
    if configured == "auto":
        return "login-shell" if under_service_manager else "inherit"
    return "login-shell" if configured == "login-shell" else "inherit"


@attrs.frozen
class ProgramLocation:
    """Where an agent program resolves in a snapshot's environment."""

    provider: str
    command: str  # what is looked up: a name, or a path from the config
    path: str | None  # None: not found
    source: str  # "PATH", "package" (the PyPI package in agentsd's environment) or "config"


@attrs.frozen(eq=False)
class Snapshot:
    """One decision about the agents' environment (Rule 3)."""

    env: Mapping[str, str]
    mode: Mode  # configured (or chosen by ``auto``)
    state: State  # what happened: ``fallback`` is a login shell that failed (Rule 4)
    detail: str  # one line for people: what was captured, or why not
    shell: str | None
    taken_at: float  # wall clock, for "captured 5 min ago"
    programs: tuple[ProgramLocation, ...]


def compose(captured: Mapping[str, str] | None, daemon_env: Mapping[str, str]) -> dict[str, str]:
    """The base environment of agents (Rule 1): ``captured`` (None: the daemon's own)
    with the daemon's ``FROM_DAEMON`` and capture switches, without ``DAEMON_ONLY``."""
    if captured is None:
        env = dict(daemon_env)
    else:
        env = dict(captured)
        for name in (*FROM_DAEMON, *CAPTURE_VARS):
            if name in daemon_env:
                env[name] = daemon_env[name]
            elif name in CAPTURE_VARS:
                env.pop(name, None)
    for name in DAEMON_ONLY:
        env.pop(name, None)
    return env


def locate_programs(env: Mapping[str, str], config: Config) -> tuple[ProgramLocation, ...]:
    """Where each provider's program resolves for an agent started with ``env``: a
    ``command`` from ``[providers.NAME]`` (looked up on that table's PATH if it sets
    one), else an ACP agent's command, else the built-in program on PATH or in its
    PyPI package. Touches the file
    system: run it in a worker thread."""
    found: list[ProgramLocation] = []
    agents = acp_agents(config.agents)
    for name in sorted({*DEFAULT_PROGRAMS, *config.providers, *agents}):
        configured = config.providers.get(name)
        agent = agents.get(name)
        path_var = env.get("PATH", os.defpath)
        if agent is not None:
            path_var = agent.env.get("PATH", path_var)
        if configured is not None:
            path_var = configured.env.get("PATH", path_var)
        if configured is not None and configured.command:
            found.append(_locate_command(name, configured.command[0], path_var))
            continue
        if agent is not None:
            found.append(_locate_command(name, agent.command[0], path_var))
            continue
        program = DEFAULT_PROGRAMS.get(name)
        if program is None:
            continue  # the mock agent runs agentsd's own Python
        on_path = shutil.which(program.name, path=path_var)
        if on_path is not None:
            found.append(ProgramLocation(name, program.name, on_path, "PATH"))
        else:
            packaged = find_program(program, path_var)
            found.append(ProgramLocation(name, program.name, packaged, "package"))
    return tuple(found)


def _locate_command(provider: str, command: str, path_var: str) -> ProgramLocation:
    """Where a configured command resolves: a path as is, a name on ``path_var``."""
    if os.sep in command:
        usable = os.path.isfile(command) and os.access(command, os.X_OK)
        return ProgramLocation(provider, command, command if usable else None, "config")
    return ProgramLocation(provider, command, shutil.which(command, path=path_var), "PATH")


class AgentEnvironment:
    """The current `Snapshot`, and the capture of the next one (Rules 3-5)."""

    def __init__(
        self, config: Config, mode: Mode, daemon_env: Mapping[str, str] = os.environ
    ) -> None:
        self.config = config
        self.mode: Mode = mode
        self.current: Snapshot | None = None
        self.capturing = False
        self._daemon_env = daemon_env
        self._lock = trio.Lock()
        # What the agent programs said their versions are, for every session's start.
        self.versions = ProgramVersions()

    @property
    def daemon_path(self) -> str:
        """The daemon's own PATH (what ``inherit`` gives)."""
        return self._daemon_env.get("PATH", "")

    async def snapshot(self) -> Snapshot:
        """The snapshot to start an agent with: the current one, else the first,
        taken now or awaited if under way (Rule 5). Never raises but cancellation."""
        if self.current is None:
            async with self._lock:
                if self.current is None:
                    self.current = await self._take()
        return self.current

    async def refresh(self) -> Snapshot:
        """Take a new snapshot (after any under way) and make it current."""
        async with self._lock:
            self.current = await self._take()
        return self.current

    async def _take(self) -> Snapshot:
        self.capturing = True
        try:
            started = time.monotonic()
            shell = None
            if self.mode == "login-shell":
                # The passwd lookup may go to the network (NSS): not on the event loop.
                shell = await trio.to_thread.run_sync(login_shell, self._daemon_env)
            captured: dict[str, str] | None = None
            state: State = "inherited"
            detail = "the daemon's own environment (agent_env = inherit)"
            if self.mode == "login-shell":
                if shell is None:
                    state, detail = "fallback", "no login shell: $SHELL is unset and so is passwd's"
                else:
                    try:
                        captured = await capture(
                            shell,
                            compose(None, self._daemon_env),
                            self.config.login_shell_timeout_s,
                        )
                    except CaptureFailed as exc:
                        state, detail = "fallback", str(exc)
                    else:
                        took_ms = (time.monotonic() - started) * 1000
                        state, detail = "captured", f"from {shell} in {took_ms:.0f} ms"
            env = compose(captured, self._daemon_env)
            programs = await trio.to_thread.run_sync(locate_programs, env, self.config)
        finally:
            self.capturing = False
        if state == "fallback":
            log.warning("agent environment: %s; agents get the daemon's own environment", detail)
        elif state == "captured":
            log.info("agent environment captured %s; PATH=%s", detail, env.get("PATH", ""))
        else:
            log.info("agent environment: %s; PATH=%s", detail, env.get("PATH", ""))
        return Snapshot(
            env=env,
            mode=self.mode,
            state=state,
            detail=detail,
            shell=shell,
            taken_at=time.time(),
            programs=programs,
        )
