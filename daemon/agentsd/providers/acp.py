"""ACP agents as providers: agentsd is the *client* side of the Agent Client Protocol.

The wire is JSON-RPC 2.0 (with ``"jsonrpc": "2.0"``), one object per line, over the
agent's stdio (protocol version 1, agentclientprotocol/agent-client-protocol):

- ``initialize {protocolVersion, clientCapabilities, clientInfo}`` answers
  ``{protocolVersion, agentCapabilities: {loadSession, sessionCapabilities: {resume}},
  authMethods, agentInfo: {name, version}}``. agentsd offers no ``fs`` and no
  ``terminal``: it answers their requests with method-not-found.
- ``session/new {cwd, mcpServers}`` answers ``{sessionId, modes?}``.
  ``session/resume`` (when ``sessionCapabilities.resume`` is offered) and
  ``session/load`` (when ``loadSession`` is) take ``{sessionId, cwd, mcpServers}``;
  ``session/load`` replays the conversation as ``session/update``s first, which are
  not journaled again (the journal already has them: no turn runs).
- ``session/prompt {sessionId, prompt}`` answers only when the turn ends, with
  ``{stopReason}``: the turn is ours from the moment the request is written.
  ``session/cancel`` is a notification; the agent then ends the turn with
  ``cancelled``, and every permission request still open is answered ``cancelled``.
- ``session/request_permission {sessionId, toolCall, options: [{optionId, name,
  kind}]}`` answers ``{outcome: {outcome: "selected", optionId} | {outcome:
  "cancelled"}}``.

Rule 1 (one reader): ``handshake`` and then ``run`` are the only readers of the
child's output; responses reach the tasks waiting for them through ``RpcPeer``.
The turn and the open permission requests change only in the reader, except that
``send`` starts a turn, ``interrupt`` marks it cancelled and takes the requests out,
and ``answer_approval`` takes one out.

Rule 2: every request from the agent is answered: a permission once a client
decided (at once with ``cancelled`` when it comes outside a running turn, after a
cancel, or cannot be recorded), anything else at once with method-not-found.

Rule 3: an update outside a running turn is not journaled (a late update after the
turn settled, or ``session/load``'s replay), except the session-wide ones: a mode
change (kept in the session's options, set again at the next start) and the
commands offered (``commands.updated``, when they changed). A malformed update is
journaled as ``agent.error``; the session goes on.
"""

from __future__ import annotations

import base64
import itertools
import logging
import os
import secrets
import shutil
from collections.abc import Mapping
from typing import Any

import attrs
import trio

import agentsd
from agentsd.providers.acp_agents import AcpAgent
from agentsd.providers.acp_permissions import (
    CANCELLED,
    Ask,
    permission_answer,
    read_permission,
)
from agentsd.providers.acp_updates import MalformedUpdate, TurnItems, agent_commands
from agentsd.providers.base import (
    MAX_BAD_LINES,
    Adapter,
    Dispatch,
    ImageInput,
    LaunchSpec,
    LineLink,
    Provider,
    Resume,
    SessionSink,
    Submission,
)
from agentsd.providers.codex_rpc import Call, Garbage, RpcPeer, clip, error_message
from agentsd.store.sessions import SessionRow
from agentsd_protocol.api.events import (
    AgentCommand,
    AgentError,
    AgentWarning,
    CommandsUpdated,
    ErrorInfo,
    ThreadSuperseded,
    TurnCompleted,
    TurnOutcome,
    TurnStarted,
)
from agentsd_protocol.errors import (
    AgentExited,
    AgentNotFound,
    AgentProtocolError,
    AgentStartFailed,
    InvalidParams,
    ResumeFailed,
    RpcError,
)

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1  # the ACP version agentsd speaks
METHOD_NOT_FOUND = -32601
AUTH_REQUIRED = -32000  # ACP's error for a session that needs ``authenticate`` first
OPTION_NAMES = ("mode",)
# A stop reason other than cancelled ends the turn as the agent meant it to end.
STOP_REASONS: Mapping[str, TurnOutcome] = {
    "end_turn": "completed",
    "max_tokens": "completed",
    "max_turn_requests": "completed",
    "refusal": "completed",
    "cancelled": "interrupted",
}


def parse_options(options: Mapping[str, Any]) -> str | None:
    """The session mode a session's options ask for; ``InvalidParams`` for any other
    option (ACP agents take a mode; models and the rest are the agent's own)."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise InvalidParams(
            f"Invalid params: unknown ACP agent option {unknown[0]!r} "
            f"(known: {', '.join(OPTION_NAMES)})",
            option=unknown[0],
        )
    mode = options.get("mode")
    if mode is not None and not isinstance(mode, str):
        raise InvalidParams("Invalid params: ACP agent option 'mode' must be a string")
    return mode


class AcpProvider(Provider):
    """One ACP agent, by the name sessions give as their provider."""

    def __init__(self, agent: AcpAgent) -> None:
        self.name = agent.name
        self.agent = agent

    def launch(self, session: SessionRow, state_dir: Any, env: Mapping[str, str]) -> LaunchSpec:
        """``session.command``, else the agent's command, its program resolved on the
        agent's PATH. Raises ``InvalidParams`` for bad options and ``AgentNotFound``
        when the program is not there."""
        parse_options(session.options)
        argv = list(session.command or self.agent.command)
        path = {**env, **self.agent.env, **session.env}.get("PATH", "")
        # Resolved here, so the daemon's status finds the version it reported by path.
        program = shutil.which(argv[0], path=path)
        if program is None:
            raise AgentNotFound(
                f"cannot start {self.agent.display_name}: {argv[0]} is not installed; "
                f"{self.agent.install_hint()}"
            )
        return LaunchSpec(argv=[program, *argv[1:]], env=self.agent.env)

    content_types = frozenset({"file"})  # resource_link: every ACP agent takes it

    def refused_content(self, types: set[str], adapter: Adapter | None) -> str | None:
        """Images only when the running agent said at ``initialize`` it takes them
        (``promptCapabilities.image``); a stopped session is started to ask first."""
        if "image" in types and not (isinstance(adapter, AcpAdapter) and adapter.takes_images):
            return "image"
        return super().refused_content(types - {"image"}, adapter)

    def adapter(self, link: LineLink, sink: SessionSink, session: SessionRow) -> Adapter:
        return AcpAdapter(link, sink, session, self.agent)


@attrs.define(eq=False)
class Turn:
    """The running ``session/prompt``: its id, its items, and whether it was cancelled."""

    turn_id: str
    items: TurnItems
    call: Call | None = None
    cancelled: bool = False


@attrs.frozen
class PermissionRequest:
    request_id: int | str
    option_ids: tuple[str, ...]


class AcpAdapter(Adapter):
    """Speaks to one ACP agent (see the module's rules)."""

    def __init__(
        self, link: LineLink, sink: SessionSink, session: SessionRow, agent: AcpAgent
    ) -> None:
        self._agent = agent
        self._rpc = RpcPeer(link, agent=agent.display_name, jsonrpc=True)
        self._sink = sink
        self._session = session
        self._mode = parse_options(session.options)
        self._session_id: str | None = None
        self._turn: Turn | None = None
        self._turn_ids = itertools.count(1)
        self._turn_prefix = secrets.token_hex(3)  # turn ids stay unique across restarts
        self._requests: dict[str, PermissionRequest] = {}  # by native id
        self._version: str | None = None
        self._agent_name: str | None = None
        self._capabilities: dict[str, Any] = {}
        self._auth_methods: list[str] = []
        self._commands: list[AgentCommand] | None = None  # as last journaled by this child

    @property
    def agent_version(self) -> str | None:
        return self._version

    @property
    def agent_name(self) -> str | None:
        return self._agent_name

    # -- the handshake ----------------------------------------------------------------

    async def _handshake_call(self, method: str, params: dict[str, Any]) -> Call:
        """A request during the handshake: read (and translate what comes first)
        until its response; an error response is left in ``Call.error``."""
        call = await self._rpc.request(method, params)
        while not call.done.is_set():
            frame = await self._rpc.receive()
            if frame is None:
                raise AgentExited(
                    f"{self._agent.display_name} exited during its handshake (waiting for {method})"
                )
            if isinstance(frame, Garbage):
                raise AgentProtocolError(self._garbage(frame))
            await self._handle(frame)
        return call

    async def handshake(self, resume: Resume | None) -> str:
        """``initialize``, then ``session/new``, ``session/resume`` or ``session/load``;
        returns the ACP session id. Raises ``AgentExited`` (EOF), ``AgentProtocolError``
        (garbage, a refused initialize, another protocol version), ``AgentStartFailed``
        (no session, e.g. authentication needed) or ``ResumeFailed``. The runner
        bounds it in time."""
        init = await self._handshake_call(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": {
                    "fs": {"readTextFile": False, "writeTextFile": False},
                    "terminal": False,
                },
                "clientInfo": {
                    "name": "agentsd",
                    "title": "agentsd",
                    "version": agentsd.__version__,
                },
            },
        )
        name = self._agent.display_name
        if init.error is not None:
            raise AgentProtocolError(f"{name} refused initialize: {error_message(init.error)}")
        result = init.result if isinstance(init.result, dict) else None
        if result is None:
            raise AgentProtocolError(f"{name} answered initialize with {clip(init.result)}")
        if result.get("protocolVersion") != PROTOCOL_VERSION:
            raise AgentProtocolError(
                f"{name} speaks ACP version {clip(result.get('protocolVersion'))}; "
                f"agentsd speaks version {PROTOCOL_VERSION}"
            )
        info = result.get("agentInfo")
        info = info if isinstance(info, dict) else {}
        version, agent_name = info.get("version"), info.get("name")
        self._version = version if isinstance(version, str) else None
        self._agent_name = agent_name if isinstance(agent_name, str) else None
        capabilities = result.get("agentCapabilities")
        self._capabilities = capabilities if isinstance(capabilities, dict) else {}
        methods = result.get("authMethods")
        self._auth_methods = [
            str(m.get("name") or m.get("id"))
            for m in (methods if isinstance(methods, list) else [])
            if isinstance(m, dict)
        ]

        if resume is None:
            session = await self._new_session()
        else:
            session = await self._resume_session(resume)
        await self._apply_mode(session)
        return self._session_id or ""

    def _session_params(self) -> dict[str, Any]:
        return {"cwd": self._session.cwd, "mcpServers": []}

    async def _new_session(self) -> dict[str, Any]:
        call = await self._handshake_call("session/new", self._session_params())
        name = self._agent.display_name
        if call.error is not None:
            words = error_message(call.error)
            if isinstance(call.error, dict) and call.error.get("code") == AUTH_REQUIRED:
                methods = ", ".join(self._auth_methods) or "none named"
                raise AgentStartFailed(
                    f"{name} needs you to log in first (its methods: {methods}): {words}"
                )
            raise AgentStartFailed(f"{name} could not start a session: {words}")
        result = call.result if isinstance(call.result, dict) else {}
        session_id = result.get("sessionId")
        if not isinstance(session_id, str) or not session_id:
            raise AgentProtocolError(f"{name} answered session/new without a sessionId")
        self._session_id = session_id
        return result

    async def _resume_session(self, resume: Resume) -> dict[str, Any]:
        """``session/resume`` or ``session/load``, whichever the agent offers (resume
        first: it does not replay). Without either, or for a session the agent lost
        that had no turn, a fresh session replaces it (``superseded``). Raises
        ``ResumeFailed`` when a session with turns cannot be resumed."""
        name = self._agent.display_name
        session_capabilities = self._capabilities.get("sessionCapabilities")
        if isinstance(session_capabilities, dict) and isinstance(
            session_capabilities.get("resume"), dict
        ):
            method = "session/resume"
        elif self._capabilities.get("loadSession") is True:
            method = "session/load"
        else:
            return await self._supersede(
                resume, f"{name} can neither resume nor load a session (it offers neither)"
            )
        self._session_id = resume.handle
        call = await self._handshake_call(
            method, {"sessionId": resume.handle, **self._session_params()}
        )
        if call.error is None:
            return call.result if isinstance(call.result, dict) else {}
        words = error_message(call.error)
        if resume.had_turns:
            raise ResumeFailed(f"{name} could not resume session {resume.handle}: {words}")
        return await self._supersede(
            resume, f"{name} could not resume session {resume.handle}, which had no turn: {words}"
        )

    async def _supersede(self, resume: Resume, reason: str) -> dict[str, Any]:
        log.info("%s; starting a new session", reason)
        result = await self._new_session()
        self.superseded = ThreadSuperseded(
            previous_handle=resume.handle, handle=self._session_id or "", reason=reason
        )
        return result

    async def _apply_mode(self, session: dict[str, Any]) -> None:
        """Put the session in the mode its options name, when it is not in it."""
        modes = session.get("modes")
        current = modes.get("currentModeId") if isinstance(modes, dict) else None
        if self._mode is None or self._mode == current:
            return
        call = await self._handshake_call(
            "session/set_mode", {"sessionId": self._session_id, "modeId": self._mode}
        )
        if call.error is not None:
            await self._sink.emit(
                AgentWarning(
                    source="session/set_mode",
                    message=f"{self._agent.display_name} refused mode {self._mode!r}: "
                    f"{error_message(call.error)}",
                )
            )

    # -- the reader -------------------------------------------------------------------

    def _garbage(self, frame: Garbage) -> str:
        return f"{self._agent.display_name} wrote a line that is not a JSON object: {frame.line[:200]!r}"

    async def run(self) -> None:
        bad_lines = 0  # in a row (base Rule 3)
        try:
            while (frame := await self._rpc.receive()) is not None:
                if isinstance(frame, Garbage):
                    bad_lines += 1
                    if bad_lines > MAX_BAD_LINES:
                        raise AgentProtocolError(
                            f"{self._garbage(frame)}: {bad_lines} such lines in a row, so its "
                            "output is not JSON-RPC"
                        )
                    await self._protocol_error(self._garbage(frame))
                else:
                    bad_lines = 0
                    await self._handle(frame)
        finally:
            self._rpc.close()

    async def _protocol_error(self, message: str) -> None:
        turn_id = self._turn.turn_id if self._turn is not None else None
        await self._sink.emit(
            AgentError(error_kind=AgentProtocolError.kind, message=message, turn_id=turn_id)
        )

    async def _handle(self, frame: dict[str, Any]) -> None:
        method = frame.get("method")
        params = frame.get("params")
        params = params if isinstance(params, dict) else {}
        if isinstance(method, str):
            if "id" in frame:
                await self._on_request(frame.get("id"), method, params)
            elif method == "session/update":
                await self._on_update(params)
            else:
                log.debug("ignored %s notification %s", self._agent.name, method)
        elif "id" in frame and ("result" in frame or "error" in frame):
            call = self._rpc.resolve(frame)
            turn = self._turn
            if call is not None and turn is not None and call is turn.call:
                await self._turn_ended(turn, call)
        else:
            await self._protocol_error(
                f"{self._agent.display_name} wrote a message that is neither request, "
                f"response nor notification: {clip(frame)}"
            )

    async def _turn_ended(self, turn: Turn, call: Call) -> None:
        """The ``session/prompt`` answered: the turn is over (Rule 3 from here on)."""
        self._turn = None
        for event in turn.items.finish():
            await self._sink.emit(event)
        result = call.result if isinstance(call.result, dict) else {}
        stop = result.get("stopReason")
        if call.error is not None:
            words = error_message(call.error)
            done = TurnCompleted(
                turn_id=turn.turn_id,
                outcome="interrupted" if turn.cancelled else "failed",
                reason=words,
                error=None if turn.cancelled else ErrorInfo(kind="agent_error", message=words),
            )
        elif isinstance(stop, str) and stop in STOP_REASONS:
            done = TurnCompleted(
                turn_id=turn.turn_id,
                outcome=STOP_REASONS[stop],
                reason=None if stop == "end_turn" else stop,
            )
        else:
            done = TurnCompleted(
                turn_id=turn.turn_id,
                outcome="unknown",
                reason=f"{self._agent.display_name} ended the turn with stop reason {clip(stop)}",
            )
        await self._sink.emit(done)

    async def _on_update(self, params: dict[str, Any]) -> None:
        # Before session/new has answered, the session's id is not known yet: an
        # agent holds one session here, so its updates are this session's.
        if self._session_id is not None and params.get("sessionId") != self._session_id:
            await self._protocol_error(
                f"{self._agent.display_name} sent an update for session "
                f"{clip(params.get('sessionId'))}, not {self._session_id}"
            )
            return
        update = params.get("update")
        session_wide = update if isinstance(update, dict) else {}
        kind = session_wide.get("sessionUpdate")
        if kind == "current_mode_update":
            mode = session_wide.get("currentModeId")
            if isinstance(mode, str):
                self._mode = mode
                await self._sink.options_changed({"mode": mode})
            return
        if kind == "available_commands_update":
            commands = agent_commands(session_wide.get("availableCommands"))
            if commands is None:
                await self._protocol_error(
                    f"{self._agent.display_name} sent a malformed available_commands_update"
                )
            elif commands != self._commands:
                self._commands = commands
                await self._sink.emit(CommandsUpdated(commands=commands))
            return
        turn = self._turn
        if turn is None:
            return  # Rule 3: a late update, or the replay of session/load
        try:
            events = turn.items.update(update)
        except MalformedUpdate as exc:
            await self._protocol_error(
                f"{self._agent.display_name} sent a malformed session/update: {exc}"
            )
            return
        for event in events:
            await self._sink.emit(event)
        for item_id, text in turn.items.deltas:
            self._sink.delta(item_id, text)

    async def _on_request(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        if not isinstance(request_id, int | str) or isinstance(request_id, bool):
            await self._rpc.refuse(request_id, -32600, "request id must be a number or a string")
            return
        if method != "session/request_permission":
            # fs/* and terminal/* were not offered at initialize; anything else is unknown.
            await self._rpc.refuse(request_id, METHOD_NOT_FOUND, f"Method not found: {method}")
            await self._sink.emit(
                AgentWarning(
                    source=method,
                    message=f"refused {self._agent.display_name}'s {method} request: "
                    "agentsd does not offer it",
                )
            )
            return
        await self._on_permission(request_id, params)

    async def _on_permission(self, request_id: int | str, params: dict[str, Any]) -> None:
        name = self._agent.display_name
        turn = self._turn
        ask: Ask | str
        if params.get("sessionId") != self._session_id:
            ask = f"it names session {clip(params.get('sessionId'))}"
        elif turn is None:
            ask = "no turn is running"
        elif turn.cancelled:
            ask = "its turn was cancelled"
        else:
            ask = read_permission(params, name)
        if isinstance(ask, str):
            await self._rpc.respond(request_id, CANCELLED)
            await self._sink.emit(
                AgentWarning(
                    source="session/request_permission",
                    message=f"answered {name}'s permission request with cancelled: {ask}",
                )
            )
            return
        native_id = str(request_id)
        # Registered before the await: a client may answer before the commit returns.
        self._requests[native_id] = PermissionRequest(request_id, tuple(ask.options))
        try:
            await self._sink.approval_requested(
                native_id=native_id,
                kind=ask.kind,
                title=ask.title,
                detail=ask.detail,
                options=ask.options,
                item_id=ask.item_id,
                option_details=ask.option_details,
            )
        except RpcError as exc:
            # Rule 2: a question nobody can durably answer is refused, not left hanging.
            self._requests.pop(native_id, None)
            log.warning("answered %s's permission request cancelled: %s", name, exc.message)
            await self._rpc.respond(request_id, CANCELLED)

    @property
    def takes_images(self) -> bool:
        """Whether the agent said at ``initialize`` that its prompts take images."""
        prompt = self._capabilities.get("promptCapabilities")
        return isinstance(prompt, dict) and prompt.get("image") is True

    # -- from RPC handlers ------------------------------------------------------------

    async def send(self, submission: Submission) -> Dispatch:
        """``session/prompt``, when no turn runs (ACP takes one prompt at a time).
        Accepted once written: the agent answers only when the turn ends."""
        name = self._agent.display_name
        if self._rpc.closed or self._session_id is None:
            return Dispatch(outcome="rejected", reason=f"{name} is not running")
        if self._turn is not None:
            return Dispatch(
                outcome="rejected",
                reason=f"a turn is running; {name} takes the next prompt once it ends",
            )
        turn_id = f"{self._turn_prefix}-{next(self._turn_ids)}"
        turn = Turn(turn_id, TurnItems(turn_id))
        self._turn = turn
        await self._sink.emit(TurnStarted(turn_id=turn_id))
        try:
            turn.call = await self._rpc.request(
                "session/prompt",
                {
                    "sessionId": self._session_id,
                    "prompt": prompt_blocks(submission),
                },
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return Dispatch(outcome="unknown", reason=f"{name} exited as the prompt was sent")
        return Dispatch(outcome="accepted", turn_id=turn_id)

    async def interrupt(self, turn_id: str | None) -> bool:
        """``session/cancel``; every open permission request is answered cancelled.
        The turn ends when the agent answers the prompt (with ``cancelled``)."""
        turn = self._turn
        if turn is None or self._rpc.closed:
            return False
        turn.cancelled = True
        requests, self._requests = self._requests, {}
        try:
            await self._rpc.notify("session/cancel", {"sessionId": self._session_id})
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        for native_id, request in requests.items():
            await self._rpc.respond(request.request_id, CANCELLED)
            await self._sink.approval_cancelled(native_id)
        return True

    async def answer_approval(self, native_id: str, decision: str) -> None:
        """Answer the permission request ``native_id`` with the option ``decision``
        (``cancel``: the cancelled outcome). One the agent no longer waits for is a
        no-op: its turn's end settles the approval."""
        request = self._requests.pop(native_id, None)
        if request is None:
            log.info("no open permission request %s to answer", native_id)
            return
        await self._rpc.respond(request.request_id, permission_answer(request.option_ids, decision))


def prompt_blocks(submission: Submission) -> list[dict[str, Any]]:
    """A prompt as ACP content blocks: its text, then each image (base64) and each
    file reference (a ``resource_link``, which every ACP agent takes)."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": submission.text}]
    for item in submission.inputs:
        if isinstance(item, ImageInput):
            data = base64.b64encode(item.data).decode()
            blocks.append({"type": "image", "mimeType": item.media_type, "data": data})
        else:
            name = os.path.basename(item.path) or item.path
            blocks.append({"type": "resource_link", "uri": f"file://{item.path}", "name": name})
    return blocks
