"""``daemon.*`` and ``rpc.*``: liveness, status, shutdown, the agents' environment and
discovery."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from agentsd.providers import BUILTIN_PROVIDERS
from agentsd.providers.acp_agents import acp_agents
from agentsd_protocol.api import daemon as api

if TYPE_CHECKING:
    from agentsd.agent_env import AgentEnvironment
    from agentsd.connection import Call

_PING = api.PingResult()


async def handle_ping(call: Call, params: api.PingParams) -> api.PingResult:
    return _PING


async def handle_status(call: Call, params: api.StatusParams) -> api.StatusResult:
    app = call.app
    return api.StatusResult(
        version=app.version,
        pid=os.getpid(),
        uptime_s=round(time.monotonic() - app.started_at, 3),
        socket=str(app.socket_path),
        state_dir=str(app.state_dir),
        connections=len(app.connections),
        sessions=app.session_counts(),
        recovery=app.recovery,
        agent_env=_agent_env(app.agent_env),
        storage=_storage(app.storage_unavailable()),
        draining=app.draining,
        containment=api.Containment(
            mode=app.containment.mode,
            root=None if app.containment.root is None else str(app.containment.root.path),
            detail=app.containment.detail,
        ),
        providers=sorted({*BUILTIN_PROVIDERS, *acp_agents(app.config.agents)}),
    )


def _storage(problem: str | None) -> api.Storage:
    if problem is None:
        return api.Storage()
    return api.Storage(state="unavailable", detail=problem)


async def handle_reload_env(call: Call, params: api.ReloadEnvParams) -> api.ReloadEnvResult:
    """Capture the agents' environment again (bounded by ``login_shell_timeout_s``);
    agents already running keep theirs."""
    agent_env = call.app.agent_env
    await agent_env.refresh()
    return api.ReloadEnvResult(agent_env=_agent_env(agent_env))


def _agent_env(agent_env: AgentEnvironment) -> api.AgentEnv:
    snapshot = agent_env.current
    configured = agent_env.config.agent_env
    if snapshot is None:
        return api.AgentEnv(
            mode=agent_env.mode,
            configured=configured,
            state="pending",
            detail="the first capture is under way",
            daemon_path=agent_env.daemon_path,
            capturing=agent_env.capturing,
        )
    return api.AgentEnv(
        mode=snapshot.mode,
        configured=configured,
        state=snapshot.state,
        detail=snapshot.detail,
        shell=snapshot.shell,
        path=snapshot.env.get("PATH", ""),
        daemon_path=agent_env.daemon_path,
        age_s=round(max(0.0, time.time() - snapshot.taken_at), 3),
        capturing=agent_env.capturing,
        programs=[
            api.AgentProgram(
                provider=found.provider,
                command=found.command,
                path=found.path,
                source=found.source,
                version=None if found.path is None else agent_env.versions.last_known(found.path),
            )
            for found in snapshot.programs
        ],
    )


async def handle_shutdown(call: Call, params: api.ShutdownParams) -> api.ShutdownResult:
    call.after_reply.append(call.app.request_shutdown)
    return api.ShutdownResult()


async def handle_discover(call: Call, params: api.DiscoverParams) -> dict[str, Any]:
    return call.app.openrpc_document()


HANDLERS: dict[str, Any] = {
    "daemon.ping": handle_ping,
    "daemon.status": handle_status,
    "daemon.shutdown": handle_shutdown,
    "daemon.reloadEnv": handle_reload_env,
    "rpc.discover": handle_discover,
}
