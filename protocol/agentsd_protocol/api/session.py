"""Wire types of the ``agentSession.*`` methods and notifications.

Limits (the daemon refuses a create past one with ``invalid_params``, whose data
names it: ``limit``, ``maxBytes``, ``bytes``). Each keeps a stored session starting
and listable: the kernel refuses to ``exec`` one environment string or argument
longer than 32 pages (``MAX_ARG_STRLEN``), and every reply must fit a client's frame
bound (``agentsd_protocol.framing.DEFAULT_MAX_FRAME_BYTES``).
"""

from __future__ import annotations

from typing import Any, Literal

from agentsd_protocol.api.base import MutationParams, Params, Result

MAX_ARG_BYTES = 128 * 1024 - 1  # one KEY=VALUE or argument with its NUL: MAX_ARG_STRLEN
MAX_ENV_BYTES = 256 * 1024  # all of a session's env (KEY=VALUE NUL each)
MAX_COMMAND_BYTES = 256 * 1024  # all of a session's command (each argument with its NUL)
MAX_OPTIONS_BYTES = 64 * 1024  # a session's options, as JSON: models, modes, flags
MAX_CWD_BYTES = 4096  # PATH_MAX
MAX_PROVIDER_CHARS = 100  # a name from the daemon's registry or config

# A list page holds at most this many bytes of sessions (and at least one session),
# half of a client's default frame bound: no number or size of sessions can make a
# reply too large to read.
LIST_PAGE_BYTES = 4 * 1024 * 1024
MAX_LIST_LIMIT = 1000  # sessions per page a client may ask for

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
    """How the agent last ended; ``stderr_tail`` as in ``child.exited``."""

    cause: ExitCause
    returncode: int | None = None
    signal: int | None = None
    at: float
    stderr_tail: str | None = None


class SessionError(Result, frozen=True, kw_only=True):
    """The last failure of a session's agent (start, handshake, protocol)."""

    kind: str
    message: str
    at: float


class Resources(Result, frozen=True, kw_only=True):
    """What a running agent and everything it started use, from its own cgroup's
    files (cgroup mode only). Memory is reported where the memory controller is
    enabled for the cgroup, else None."""

    cgroup: str  # the cgroup directory
    cpu_us: int | None = None  # CPU time used, user and system, in microseconds
    processes: int = 0  # processes in it now
    memory_bytes: int | None = None  # memory.current
    memory_peak_bytes: int | None = None  # memory.peak


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
    queued: int = 0  # prompts held behind the running turn (``agentSession.queue``)
    queue_paused: str | None = None  # why they wait for a client to resume them
    resources: Resources | None = None  # while its agent runs in a cgroup


class ResumeFrom(Params, frozen=True, kw_only=True):
    """A provider conversation started elsewhere (a terminal): a Codex thread id or
    a Claude Code session id."""

    handle: str


class CreateParams(MutationParams, frozen=True, kw_only=True):
    """``resume_from`` adopts an existing conversation: the create starts the agent
    (``start`` must stay true), which resumes it after checking it exists for this
    ``cwd`` and this account home (``CODEX_HOME``, ``CLAUDE_CONFIG_DIR`` or ``HOME``
    in ``env`` or the daemon's environment); its earlier messages are journaled as
    ``message.imported``, and the next prompt continues it natively. One that does
    not exist there fails the create with ``resume_failed`` (the session is kept,
    stopped, with the error, as any failed start)."""

    provider: str
    cwd: str
    title: str | None = None
    options: dict[str, Any] = {}
    env: dict[str, str] = {}
    command: list[str] | None = None
    start: bool = True
    resume_from: ResumeFrom | None = None


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
    """Sessions in creation order, a page at a time: at most ``limit`` (default: as
    many as fit ``LIST_PAGE_BYTES``), after ``cursor`` (a previous ``nextCursor``).
    ``brief`` leaves out ``env``, ``options`` and ``command`` (empty in the reply)."""

    state: Phase | None = None
    provider: str | None = None
    limit: int | None = None
    cursor: str | None = None
    brief: bool = False


class ListResult(Result, frozen=True, kw_only=True):
    sessions: list[SessionInfo]
    next_cursor: str | None = None  # None: this page is the last


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
