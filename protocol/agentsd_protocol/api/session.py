"""Wire types of the ``agentSession.*`` methods and notifications."""

from __future__ import annotations

from typing import Any, Literal

from agentsd_protocol.api.base import MutationParams, Params, Result

Phase = Literal["stopped", "starting", "running", "stopping", "exit-unproven"]
Status = Literal["idle", "working", "attention"]
ExitCause = Literal["requested", "unexpected", "shutdown", "daemon-restart", "idle", "failed"]


class ChildInfo(Result, frozen=True, kw_only=True):
    """The live agent child of a session."""

    pid: int
    pgid: int
    generation: str
    started_at: float
    # From its handshake, else its ``--version``; None until the handshake is done,
    # and when neither says (an unknown version is started, never refused).
    agent_version: str | None = None


class ExitInfo(Result, frozen=True, kw_only=True):
    cause: ExitCause
    returncode: int | None = None
    signal: int | None = None
    at: float


class SessionError(Result, frozen=True, kw_only=True):
    """The last failure of a session's agent (start, handshake, protocol)."""

    kind: str
    message: str
    at: float


class SessionInfo(Result, frozen=True, kw_only=True):
    session_id: str
    provider: str
    cwd: str
    title: str | None = None
    options: dict[str, Any] = {}
    env: dict[str, str] = {}
    command: list[str] | None = None
    provider_handle: str | None = None
    created_at: float
    updated_at: float
    fence: int
    phase: Phase
    status: Status
    head_seq: int
    child: ChildInfo | None = None
    last_exit: ExitInfo | None = None
    error: SessionError | None = None


class CreateParams(MutationParams, frozen=True, kw_only=True):
    provider: str
    cwd: str
    title: str | None = None
    options: dict[str, Any] = {}
    env: dict[str, str] = {}
    command: list[str] | None = None
    start: bool = True


class CreateResult(Result, frozen=True, kw_only=True):
    session_id: str
    fence: int
    status: Status
    phase: Phase
    session: SessionInfo


class GetParams(Params, frozen=True, kw_only=True):
    session_id: str


class GetResult(Result, frozen=True, kw_only=True):
    session: SessionInfo


class ListParams(Params, frozen=True, kw_only=True):
    state: Phase | None = None
    provider: str | None = None


class ListResult(Result, frozen=True, kw_only=True):
    sessions: list[SessionInfo]


class StartParams(MutationParams, frozen=True, kw_only=True):
    session_id: str


class StartResult(Result, frozen=True, kw_only=True):
    session: SessionInfo


class CloseParams(MutationParams, frozen=True, kw_only=True):
    session_id: str


class CloseResult(Result, frozen=True, kw_only=True):
    session: SessionInfo
    was_running: bool


class DeleteParams(MutationParams, frozen=True, kw_only=True):
    session_id: str


class DeleteResult(Result, frozen=True, kw_only=True):
    session_id: str
    deleted: bool = True
