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
# "oom": it ended by itself and the kernel's OOM killer had killed in its cgroup
# (``memory.events`` ``oom_kill``): its memory limit was reached.
ExitCause = Literal[
    "requested", "unexpected", "oom", "shutdown", "daemon-restart", "idle", "failed"
]


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
    """What a running agent and everything it started use.

    With a cgroup (``cgroup`` set): its own files. ``cpuUs`` is ``cpu.stat``
    ``usage_usec`` (all that ever ran in it), ``processes`` counts ``cgroup.procs``,
    memory is ``memory.current`` / ``memory.peak`` where the memory controller is
    enabled for it, else None.

    In the fallback (``processGroup`` set): what ``/proc`` says of the agent's
    process group: its live members, and their CPU time with that of the children
    they waited for. Memory is None (resident sizes summed over processes count
    shared pages many times), and a process that left the group is not counted."""

    cgroup: str | None = None  # the cgroup directory
    process_group: int | None = None  # the process group, in the fallback
    cpu_us: int | None = None  # CPU time used, user and system, in microseconds
    processes: int = 0  # processes in it now
    memory_bytes: int | None = None  # memory.current
    memory_peak_bytes: int | None = None  # memory.peak


class SessionLimits(Result, frozen=True, kw_only=True):
    """A session's own limits, given at create: each one set replaces the daemon's
    default (the config's ``[limits]``) for every agent of the session; None: the
    default applies."""

    memory_max: int | None = None  # bytes, cgroup memory.max
    pids_max: int | None = None  # processes, cgroup pids.max
    cpu_max: float | None = None  # CPUs (1.5: one and a half), cgroup cpu.max


class TokenUsage(Result, frozen=True, kw_only=True):
    """Tokens of the session's current provider conversation, as far as its agent
    reports them (None: not reported). ``turn_tokens``: the last turn's;
    ``total_tokens``: every turn's since the conversation began (Codex) or since its
    agent last started (Claude Code reports per turn); ``context_tokens``: what the
    conversation holds now, of ``context_window``, leaving ``context_left``."""

    turn_tokens: int | None = None
    total_tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    context_window: int | None = None
    context_tokens: int | None = None
    context_left: int | None = None


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
    resources: Resources | None = None  # while its agent runs (see `Resources`)
    limits: SessionLimits | None = None  # its own limits, if it was given any
    created_by: str | None = None  # the session whose agent created it; None: the user
    tokens: TokenUsage | None = None  # once its agent reported usage


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
    stopped, with the error, as any failed start). One a stored session already
    holds is refused with ``conversation_in_use``, nothing stored."""

    provider: str
    cwd: str
    title: str | None = None
    options: dict[str, Any] = {}
    env: dict[str, str] = {}
    command: list[str] | None = None
    start: bool = True
    # Limits for this session's agents (see `SessionLimits`): each needs its cgroup
    # controller enabled where the daemon makes session cgroups, or the create fails
    # with ``limit_unavailable`` and nothing is stored.
    memory_max: int | None = None
    pids_max: int | None = None
    cpu_max: float | None = None
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
