"""``agentSession.create/get/list/start/close/delete/setTitle``: the session record
and its agent's life."""

from __future__ import annotations

import bisect
import re
from typing import TYPE_CHECKING, Any

import msgspec

from agentsd.config import Limits, check_config
from agentsd.handlers.controls import check_title, handle_set_options
from agentsd.resources import cached_resources, read_resources
from agentsd_protocol.api import conversation as capi
from agentsd_protocol.api import session as api
from agentsd_protocol.display import excerpt
from agentsd_protocol.errors import InvalidParams, RpcError, SessionNotFound

if TYPE_CHECKING:
    from agentsd.connection import Call
    from agentsd.session import Session
    from agentsd.supervisor import Supervisor

MAX_TITLE_CHARS = 500  # a status-bar label, not a document
# A Codex thread id or Claude session id (uuids); never a path or a flag.
HANDLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")

_encoder = msgspec.json.Encoder()


def _check_size(what: str, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise InvalidParams(
            f"Invalid params: {what} is {size} bytes, more than {max_bytes}",
            limit=what,
            maxBytes=max_bytes,
            bytes=size,
        )


def _check_create(params: api.CreateParams) -> None:
    """The limits of ``agentsd_protocol.api.session``, checked before anything is
    stored; bad input is quoted by a bounded excerpt."""
    if len(params.provider) > api.MAX_PROVIDER_CHARS:
        raise InvalidParams(f"Invalid params: unknown provider {excerpt(params.provider)}")
    _check_size("cwd", len(params.cwd.encode()), api.MAX_CWD_BYTES)
    check_title(params.title)
    for key, value in params.env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise InvalidParams(
                f"Invalid params: bad environment variable name or value {excerpt(key)}"
            )
        _check_size("env entry", len(key.encode()) + len(value.encode()) + 2, api.MAX_ARG_BYTES)
    env_bytes = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in params.env.items())
    _check_size("env", env_bytes, api.MAX_ENV_BYTES)
    command = params.command
    if command is not None:
        if not command or any(not a or "\0" in a for a in command):
            raise InvalidParams(
                "Invalid params: command must be a non-empty list of non-empty strings"
            )
        for word in command:
            _check_size("command argument", len(word.encode()) + 1, api.MAX_ARG_BYTES)
        _check_size("command", sum(len(a.encode()) + 1 for a in command), api.MAX_COMMAND_BYTES)
    _check_size("options", len(_encoder.encode(params.options)), api.MAX_OPTIONS_BYTES)


def _own_limits(params: api.CreateParams) -> dict[str, Any] | None:
    """The session's own limits, as stored, each checked against the range the
    config's ``[limits]`` allow; None when it gives none."""
    own = Limits(
        memory_max_bytes=params.memory_max, pids_max=params.pids_max, cpu_max=params.cpu_max
    )
    wire = {"memory_max_bytes": "memoryMax", "pids_max": "pidsMax", "cpu_max": "cpuMax"}
    for key, value, problem in check_config(own):
        raise InvalidParams(f"Invalid params: {wire[key]} = {value!r}: {problem}", limit=wire[key])
    if not own.controllers():
        return None
    limits = api.SessionLimits(
        memory_max=params.memory_max, pids_max=params.pids_max, cpu_max=params.cpu_max
    )
    return msgspec.to_builtins(limits)  # type: ignore[no-any-return]


async def handle_create(call: Call, params: api.CreateParams) -> api.CreateResult:
    """Store the session, then (``start``) start its agent. A start that fails
    raises its error with ``data.sessionId`` naming the stored session, so the id is
    never lost; a retry with the same ``clientOperationId`` replays the stored
    session (``phase`` stopped, ``error`` set)."""
    _check_create(params)
    limits = _own_limits(params)
    supervisor = call.app.supervisor
    provider = supervisor.provider(params.provider)
    cwd = supervisor.check_cwd(params.cwd)
    resume_from = None if params.resume_from is None else params.resume_from.handle
    if resume_from is not None:
        if not provider.adopts:
            raise InvalidParams(
                f"Invalid params: a {params.provider} session cannot adopt a conversation"
            )
        if not params.start:
            raise InvalidParams(
                "Invalid params: resumeFrom needs start: the adoption is checked then"
            )
        if not HANDLE.fullmatch(resume_from):
            raise InvalidParams(
                f"Invalid params: resumeFrom.handle is not a conversation id: {excerpt(resume_from)}"
            )

    def provisional(session_info: api.SessionInfo) -> Any:
        return api.CreateResult(
            session_id=session_info.session_id,
            fence=session_info.fence,
            status=session_info.status,
            phase=session_info.phase,
            session=session_info,
        )

    session = await supervisor.create(
        provider=params.provider,
        cwd=cwd,
        title=params.title,
        options=params.options,
        env=params.env,
        command=params.command,
        limits=limits,
        created_by=call.connection.caller_session,
        operation=call.operation,
        provisional=provisional,
        resume_from=resume_from,
    )
    if params.start:
        try:
            await supervisor.start(session)
        except RpcError as exc:
            raise type(exc)(exc.message, **{**exc.details, "sessionId": session.id}) from None
    info = session.info()
    return api.CreateResult(
        session_id=session.id,
        fence=session.fence,
        status=info.status,
        phase=info.phase,
        session=info,
    )


async def handle_get(call: Call, params: api.GetParams) -> api.GetResult:
    supervisor = call.app.supervisor
    [info] = await _with_resources(supervisor, [supervisor.get(params.session_id)])
    return api.GetResult(session=info)


async def _with_resources(supervisor: Supervisor, sessions: list[Session]) -> list[api.SessionInfo]:
    """The sessions' infos with their running agents' figures (``agentsd.resources``)."""
    root = supervisor.containment.root
    figures = cached_resources(root, sessions)
    if figures is None:
        figures = await read_resources(root, sessions)
    return [session.info(resources=found) for session, found in zip(sessions, figures, strict=True)]


async def handle_list(call: Call, params: api.ListParams) -> api.ListResult:
    """One page of sessions in creation order (``api.ListParams``): never more than
    ``LIST_PAGE_BYTES`` of them, unless one alone is larger, never none while some
    remain."""
    limit = params.limit if params.limit is not None else api.MAX_LIST_LIMIT
    if not 1 <= limit <= api.MAX_LIST_LIMIT:
        raise InvalidParams(f"Invalid params: limit must be from 1 to {api.MAX_LIST_LIMIT}")
    after = _parse_cursor(params.cursor)
    matching = sorted(
        (
            s
            for s in call.app.supervisor.sessions.values()
            if (params.state is None or s.phase == params.state)
            and (params.provider is None or s.row.provider == params.provider)
        ),
        key=_position,
    )
    start = bisect.bisect_right([_position(s) for s in matching], after) if after else 0
    page: list[api.SessionInfo] = []
    used = 0
    for info in await _with_resources(call.app.supervisor, matching[start : start + limit + 1]):
        if params.brief:
            info = msgspec.structs.replace(info, env={}, options={}, command=None)
        size = len(_encoder.encode(info))
        if page and (len(page) >= limit or used + size > api.LIST_PAGE_BYTES):
            return api.ListResult(sessions=page, next_cursor=_cursor(page[-1]))
        page.append(info)
        used += size
    return api.ListResult(sessions=page)


def _position(session: Session) -> tuple[float, str]:
    return (session.row.created_at, session.id)


def _cursor(info: api.SessionInfo) -> str:
    return f"{info.created_at!r}/{info.session_id}"


def _parse_cursor(cursor: str | None) -> tuple[float, str] | None:
    if cursor is None:
        return None
    created_at, _, session_id = cursor.partition("/")
    try:
        return (float(created_at), session_id)
    except ValueError:
        raise InvalidParams(
            f"Invalid params: cursor {excerpt(cursor)} is not one this daemon gave"
        ) from None


async def handle_start(call: Call, params: api.StartParams) -> api.StartResult:
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    await supervisor.start(session)
    return api.StartResult(session=session.info())


async def handle_close(call: Call, params: api.CloseParams) -> api.CloseResult:
    """A close that found no agent because a delete completed after the lookup
    (while it waited for the session's lock) says so as a close after the delete
    would: ``SessionNotFound``, not the deleted session's last state."""
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    was_running = await supervisor.close(session)
    if not was_running and supervisor.sessions.get(session.id) is not session:
        raise SessionNotFound(f"no session {session.id!r}", sessionId=session.id)
    return api.CloseResult(session=session.info(), was_running=was_running)


async def handle_delete(call: Call, params: api.DeleteParams) -> api.DeleteResult:
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    await supervisor.delete(session)
    return api.DeleteResult(session_id=session.id)


async def handle_set_title(call: Call, params: capi.SetTitleParams) -> capi.SetOptionsResult:
    return await handle_set_options(
        call,
        capi.SetOptionsParams(
            session_id=params.session_id, expected_fence=params.expected_fence, title=params.title
        ),
    )


HANDLERS: dict[str, Any] = {
    "agentSession.create": handle_create,
    "agentSession.get": handle_get,
    "agentSession.list": handle_list,
    "agentSession.start": handle_start,
    "agentSession.close": handle_close,
    "agentSession.delete": handle_delete,
    "agentSession.setTitle": handle_set_title,
}
