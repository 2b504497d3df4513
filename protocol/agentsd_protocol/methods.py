"""The method registry: every method's name, params and result types, and summary.

Rule 1: a method exists on the wire exactly when it is registered here; the daemon's
dispatch table and the OpenRPC document are both derived from this registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentsd_protocol.api import daemon as d
from agentsd_protocol.api import session as s


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    params: type[Any]
    result: Any  # a Struct type, or a typing alias such as dict[str, Any]
    summary: str
    mutation: bool = False


_METHODS = [
    Method("daemon.ping", d.PingParams, d.PingResult, "Check that the daemon answers."),
    Method(
        "daemon.status",
        d.StatusParams,
        d.StatusResult,
        "Version, uptime, paths, counts and what recovery did.",
    ),
    Method(
        "daemon.shutdown",
        d.ShutdownParams,
        d.ShutdownResult,
        "Reply, then close every session and exit.",
        mutation=True,
    ),
    Method(
        "rpc.discover", d.DiscoverParams, d.DiscoverResult, "This API as an OpenRPC 1.3 document."
    ),
    Method(
        "agentSession.create",
        s.CreateParams,
        s.CreateResult,
        "Create a session and (by default) start its agent.",
        mutation=True,
    ),
    Method(
        "agentSession.get",
        s.GetParams,
        s.GetResult,
        "One session's record, status, fence and live child.",
    ),
    Method(
        "agentSession.list",
        s.ListParams,
        s.ListResult,
        "Every session, optionally filtered by phase or provider.",
    ),
    Method(
        "agentSession.start",
        s.StartParams,
        s.StartResult,
        "Start the session's agent if it is not running.",
        mutation=True,
    ),
    Method(
        "agentSession.close",
        s.CloseParams,
        s.CloseResult,
        "End the agent child; keep the record and journal.",
        mutation=True,
    ),
    Method(
        "agentSession.delete",
        s.DeleteParams,
        s.DeleteResult,
        "Close, then remove the record and journal.",
        mutation=True,
    ),
]

METHODS: dict[str, Method] = {m.name: m for m in _METHODS}
