"""Wire types of the ``daemon.*`` and ``rpc.*`` methods."""

from __future__ import annotations

from typing import Any

from agentsd_protocol.api.base import Empty, Result


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


class StatusResult(Result, frozen=True, kw_only=True):
    version: str
    pid: int
    uptime_s: float
    socket: str
    state_dir: str
    connections: int
    sessions: SessionCounts = SessionCounts()
    recovery: RecoveryReport = RecoveryReport()


class ShutdownParams(Empty, frozen=True, kw_only=True):
    pass


class ShutdownResult(Result, frozen=True, kw_only=True):
    stopping: bool = True


class DiscoverParams(Empty, frozen=True, kw_only=True):
    pass


DiscoverResult = dict[str, Any]
