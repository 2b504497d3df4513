"""``agentSession.create/get/list/start/close/delete/setOptions``: the session record
and its agent's life."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentsd_protocol.api import conversation as capi
from agentsd_protocol.api import session as api
from agentsd_protocol.api.events import SessionUpdated
from agentsd_protocol.errors import InvalidParams

if TYPE_CHECKING:
    from agentsd.connection import Call

MAX_TITLE_CHARS = 500  # a status-bar label, not a document


def _check_title(title: str | None) -> None:
    if title is not None and len(title) > MAX_TITLE_CHARS:
        raise InvalidParams(f"Invalid params: title longer than {MAX_TITLE_CHARS} characters")


def _check_launch(env: dict[str, str], command: list[str] | None) -> None:
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise InvalidParams(f"Invalid params: bad environment variable name or value {key!r}")
    if command is not None and (not command or any(not a or "\0" in a for a in command)):
        raise InvalidParams("Invalid params: command must be a non-empty list of non-empty strings")


async def handle_create(call: Call, params: api.CreateParams) -> api.CreateResult:
    supervisor = call.app.supervisor
    supervisor.provider(params.provider)
    cwd = supervisor.check_cwd(params.cwd)
    _check_title(params.title)
    _check_launch(params.env, params.command)

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
        operation=call.operation,
        provisional=provisional,
    )
    if params.start:
        await supervisor.start(session)
    info = session.info()
    return api.CreateResult(
        session_id=session.id,
        fence=session.fence,
        status=info.status,
        phase=info.phase,
        session=info,
    )


async def handle_get(call: Call, params: api.GetParams) -> api.GetResult:
    return api.GetResult(session=call.app.supervisor.get(params.session_id).info())


async def handle_list(call: Call, params: api.ListParams) -> api.ListResult:
    sessions = [
        s.info()
        for s in call.app.supervisor.sessions.values()
        if (params.state is None or s.phase == params.state)
        and (params.provider is None or s.row.provider == params.provider)
    ]
    return api.ListResult(sessions=sessions)


async def handle_start(call: Call, params: api.StartParams) -> api.StartResult:
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    await supervisor.start(session)
    return api.StartResult(session=session.info())


async def handle_close(call: Call, params: api.CloseParams) -> api.CloseResult:
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    was_running = await supervisor.close(session)
    return api.CloseResult(session=session.info(), was_running=was_running)


async def handle_delete(call: Call, params: api.DeleteParams) -> api.DeleteResult:
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    await supervisor.delete(session)
    return api.DeleteResult(session_id=session.id)


async def handle_set_options(call: Call, params: capi.SetOptionsParams) -> capi.SetOptionsResult:
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    _check_title(params.title)
    fields: dict[str, Any] = {}
    if params.title is not None:
        fields["title"] = params.title
    if params.options is not None:
        fields["options"] = params.options
    if fields:
        updated = SessionUpdated(title=params.title, options=params.options)
        await session.journal.append([updated], **fields)
    return capi.SetOptionsResult(session=session.info())


HANDLERS: dict[str, Any] = {
    "agentSession.create": handle_create,
    "agentSession.get": handle_get,
    "agentSession.list": handle_list,
    "agentSession.start": handle_start,
    "agentSession.close": handle_close,
    "agentSession.delete": handle_delete,
    "agentSession.setOptions": handle_set_options,
}
