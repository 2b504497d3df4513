"""``daemon.*`` and ``rpc.*``: liveness, status, shutdown and discovery."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from agentsd_protocol.api import daemon as api

if TYPE_CHECKING:
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
    "rpc.discover": handle_discover,
}
