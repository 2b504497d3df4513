"""The daemon's shared state, owned by the root task of ``serve_daemon``.

Handlers reach everything through ``App``: configuration, paths, the live
connections, the store, the session supervisor and the agents' environment. Shutdown is cancellation:
``request_shutdown`` cancels the serving scope and every task cleans up in its own
``finally``.
"""

from __future__ import annotations

import time
from functools import cached_property
from pathlib import Path
from typing import Any

import trio

from agentsd import __version__
from agentsd.agent_env import AgentEnvironment
from agentsd.cgroup import FALLBACK, Containment
from agentsd.config import Config
from agentsd.connection import Connection
from agentsd.dispatch import dispatch as _dispatch
from agentsd.operations import Ledger
from agentsd.supervisor import Supervisor
from agentsd_protocol.api.daemon import RecoveryReport, SessionCounts
from agentsd_protocol.errors import ShuttingDown
from agentsd_protocol.openrpc import build_openrpc


class App:
    def __init__(
        self,
        config: Config,
        *,
        socket_path: Path,
        state_dir: Path,
        agent_env: AgentEnvironment | None = None,
        containment: Containment = FALLBACK,
    ) -> None:
        self.config = config
        self.containment = containment
        self.agent_env = agent_env if agent_env is not None else AgentEnvironment(config, "inherit")
        self.socket_path = socket_path
        self.state_dir = state_dir
        self.version = __version__
        self.started_at = time.monotonic()
        self.connections: set[Connection] = set()
        self.recovery = RecoveryReport()
        self.serving_scope = trio.CancelScope()
        # False once a restart was asked for: a client connecting from then on waits
        # in the listener's backlog for the next image (agentsd.socket_keeper Rule 5)
        # instead of being accepted by this one and dropped at its exec.
        self.accepting = True
        self._accept_scope: trio.CancelScope | None = None
        # Set by serve_daemon: under a service manager (systemd) a restart in place
        # says RELOADING=1 and READY=1 (agentsd.reexec).
        self.under_service_manager = False
        self.restart_requested = False
        # The next image's arguments, checked before a restart stops anything
        # (agentsd.reexec.preflight); None: the caller does not restart in place.
        self.image_args: list[str] | None = None
        self._supervisor: Supervisor | None = None
        self._ledger: Ledger | None = None

    def attach(self, supervisor: Supervisor, ledger: Ledger) -> None:
        self._supervisor = supervisor
        self._ledger = ledger

    @property
    def supervisor(self) -> Supervisor:
        if self._supervisor is None:
            raise ShuttingDown("the daemon is not serving sessions")
        return self._supervisor

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            raise ShuttingDown("the daemon is not serving sessions")
        return self._ledger

    # The dispatcher itself rather than a method awaiting it: one coroutine less on
    # every request.
    dispatch = staticmethod(_dispatch)

    def request_shutdown(self) -> None:
        self.serving_scope.cancel()

    def request_restart(self) -> None:
        """Shut down, then start again (``agentsd.main``), as ``restart_mode`` says."""
        self.stop_accepting()
        self.restart_requested = True
        self.request_shutdown()

    def accept_scope(self) -> trio.CancelScope:
        """The scope of one wait for a connection: cancelled by `stop_accepting`."""
        scope = self._accept_scope = trio.CancelScope()
        if not self.accepting:
            scope.cancel()
        return scope

    def stop_accepting(self) -> None:
        """Accept no more connections. Called by a restart before its reply goes
        out: the client that got it may connect at once, and must reach the next
        image."""
        self.accepting = False
        if self._accept_scope is not None:
            self._accept_scope.cancel()

    @property
    def restart_mode(self) -> str:
        return "service-manager" if self.under_service_manager else "re-exec"

    @property
    def restart_keeps_agents(self) -> bool:
        """Whether a restart hands running agents over: the holder keeps them and the
        next image takes them over (``crash_policy = "reattach"``); under ``"end"`` its
        recovery would end them, so the restart ends them as a stop does."""
        return self._supervisor is not None and self._supervisor.reattaches

    @property
    def draining(self) -> bool:
        return self._supervisor is not None and self._supervisor.gate.draining

    def storage_unavailable(self) -> str | None:
        """Why writes are refused now (``Store.unavailable``), or None."""
        return None if self._supervisor is None else self._supervisor.store.unavailable()

    def session_counts(self) -> SessionCounts:
        return SessionCounts() if self._supervisor is None else self._supervisor.counts()

    @cached_property
    def _openrpc(self) -> dict[str, Any]:
        return build_openrpc(self.version)

    def openrpc_document(self) -> dict[str, Any]:
        return self._openrpc
