"""The adapter of one ACP agent's child, once its session is open (``acp_handshake``
opens it): turns, updates, the agent's requests, and what clients ask of it.

- ``session/prompt {sessionId, prompt}`` answers only when the turn ends, with
  ``{stopReason}``: the turn is ours from the moment the request is written.
  ``session/cancel`` is a notification; the agent then ends the turn with
  ``cancelled``, and every permission request still open is answered ``cancelled``.
- ``session/request_permission {sessionId, toolCall, options: [{optionId, name,
  kind}]}`` answers ``{outcome: {outcome: "selected", optionId} | {outcome:
  "cancelled"}}`` (``acp_permissions``).
- ``session/update`` becomes journal events (``acp_updates``).

Rule 1 (one reader): the handshake and then ``run`` are the only readers of the
child's output; responses reach the tasks waiting for them through ``RpcPeer``.
The turn and the open permission requests change only in the reader, except that
``send`` starts a turn, ``interrupt`` marks it cancelled and takes the requests out,
and ``answer_approval`` takes one out.

Rule 2: every request from the agent is answered: a permission once a client
decided (at once with ``cancelled`` when it comes outside a running turn, after a
cancel, or cannot be recorded), anything else at once with method-not-found (no
``fs`` and no ``terminal`` were offered at ``initialize``).

Rule 3: an update outside a running turn is not journaled (a late update after the
turn settled, or ``session/load``'s replay), except the session-wide ones: a mode
change (kept in the session's options, set again at the next start) and the
commands offered (``commands.updated``, when they changed). A malformed update is
journaled as ``agent.error``; the session goes on.

Rule 4 (takeover, base Rule 5): an adapter that takes over restores the session
id, the running turn (with its items, ``acp_updates`` Rule 4) and the open
permission requests, and writes nothing. The turn it took over ends with the
answer to the earlier adapter's ``session/prompt``, an id it never sent: a
response to an id not its own that carries a stop reason (or an error) while that
turn runs ends it; any other is logged and ignored (``codex_rpc`` Rule 3).
"""

from __future__ import annotations

import base64
import itertools
import logging
import os
import secrets
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from agentsd.providers.acp_agents import AcpAgent
from agentsd.providers.acp_handshake import (
    SessionOpener,
    acp_error_message,
    garbage_message,
    parse_options,
)
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
    LineLink,
    Resume,
    SessionSink,
    Submission,
    Takeover,
)
from agentsd.providers.codex_rpc import Call, Garbage, RpcPeer, clip, error_message
from agentsd.store.sessions import SessionRow
from agentsd_protocol.api.controls import OptionChoice
from agentsd_protocol.api.events import (
    AgentCommand,
    AgentError,
    AgentWarning,
    CommandsUpdated,
    ErrorInfo,
    TurnCompleted,
    TurnOutcome,
    TurnStarted,
)
from agentsd_protocol.errors import (
    AgentNotRunning,
    AgentProtocolError,
    InvalidParams,
    RpcError,
)

log = logging.getLogger(__name__)

CONTROL_TIMEOUT_S = 10.0  # session/set_mode is answered in milliseconds

METHOD_NOT_FOUND = -32601
# A stop reason other than cancelled ends the turn as the agent meant it to end.
STOP_REASONS: Mapping[str, TurnOutcome] = {
    "end_turn": "completed",
    "max_tokens": "completed",
    "max_turn_requests": "completed",
    "refusal": "completed",
    "cancelled": "interrupted",
}


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
        self._opener = SessionOpener(
            self._rpc, agent, session, sink, self._handle, parse_options(session.options)
        )
        self._turn: Turn | None = None
        self._turn_ids = itertools.count(1)
        self._turn_prefix = secrets.token_hex(3)  # turn ids stay unique across restarts
        self._requests: dict[str, PermissionRequest] = {}  # by native id
        self._commands: list[AgentCommand] | None = None  # as last journaled by this child

    @property
    def agent_version(self) -> str | None:
        return self._opener.version

    @property
    def agent_name(self) -> str | None:
        return self._opener.agent_name

    @property
    def _session_id(self) -> str | None:
        return self._opener.session_id

    async def handshake(self, resume: Resume | None) -> str:
        """Open the ACP session (``SessionOpener.open``, which says what it raises);
        returns its id."""
        session_id = await self._opener.open(resume)
        if self._opener.superseded is not None:
            self.superseded = self._opener.superseded
        return session_id

    async def take_over(self, state: Takeover) -> None:
        """Carry on with an ACP agent whose session an earlier adapter opened (Rule
        4): nothing is written."""
        self._rpc.take_over(state.generation)
        self._opener.session_id = state.handle
        self._opener.version = state.agent_version
        mode = state.options.get("mode")
        if isinstance(mode, str):
            self._opener.mode = mode
        if state.turn_open:
            turn_id = state.turn_id or f"{self._turn_prefix}-{next(self._turn_ids)}"
            self._turn = Turn(turn_id, TurnItems(turn_id))
            self._turn.items.restore(state.open_items)
        for approval in state.approvals:
            record = approval.request or {}
            request_id = record.get("id")
            if not isinstance(request_id, int | str) or isinstance(request_id, bool):
                native = approval.native_id
                request_id = int(native) if native.isdecimal() else native
            self._requests[approval.native_id] = PermissionRequest(
                request_id, tuple(approval.options)
            )

    # -- the reader -------------------------------------------------------------------

    async def run(self) -> None:
        bad_lines = 0  # in a row (base Rule 3)
        try:
            while (frame := await self._rpc.receive()) is not None:
                if isinstance(frame, Garbage):
                    bad_lines += 1
                    if bad_lines > MAX_BAD_LINES:
                        raise AgentProtocolError(
                            f"{garbage_message(self._agent, frame)}: {bad_lines} such lines in a row, so its "
                            "output is not JSON-RPC"
                        )
                    await self._protocol_error(garbage_message(self._agent, frame))
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
            if call is None and turn is not None and turn.call is None and _prompt_answer(frame):
                # Rule 4: the earlier adapter's session/prompt, answered now.
                call = Call("session/prompt")
                call.settle(result=frame.get("result"), error=frame.get("error"))
                turn.call = call
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
            words = acp_error_message(call.error)
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
                self._opener.mode = mode
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
                request={"id": request_id},
            )
        except RpcError as exc:
            # Rule 2: a question nobody can durably answer is refused, not left hanging.
            self._requests.pop(native_id, None)
            log.warning("answered %s's permission request cancelled: %s", name, exc.message)
            await self._rpc.respond(request_id, CANCELLED)

    @property
    def takes_images(self) -> bool:
        """Whether the agent said at ``initialize`` that its prompts take images."""
        prompt = self._opener.capabilities.get("promptCapabilities")
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

    async def interrupt(self, turn_id: str | None, *, confirm: bool = True) -> bool:
        """``session/cancel``; every open permission request is answered cancelled.
        The turn ends when the agent answers the prompt (with ``cancelled``); nothing
        is waited for, so ``confirm`` changes nothing."""
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

    async def option_choices(self) -> Mapping[str, list[OptionChoice]]:
        modes = self._opener.modes
        return {"mode": list(modes)} if modes else {}

    async def apply_options(self, changes: Mapping[str, Any]) -> None:
        """``session/set_mode``; ``InvalidParams`` with the agent's words when it
        refuses the mode."""
        for key, value in changes.items():
            if key != "mode":
                raise InvalidParams(f"Invalid params: {key!r} cannot change live")
            try:
                call = await self._rpc.request(
                    "session/set_mode", {"sessionId": self._session_id, "modeId": value}
                )
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise AgentNotRunning(f"{self._agent.display_name} is not running") from None
            if not await call.wait(CONTROL_TIMEOUT_S):
                raise AgentProtocolError(
                    f"{self._agent.display_name} did not answer session/set_mode "
                    f"within {CONTROL_TIMEOUT_S:g} s"
                )
            if call.error is not None:
                raise InvalidParams(
                    f"Invalid params: {self._agent.display_name} refused mode {value!r}: "
                    f"{error_message(call.error)}",
                    option="mode",
                )
            self._opener.mode = str(value)

    async def agent_commands(self) -> list[AgentCommand]:
        """The slash commands of the agent's last ``available_commands_update``."""
        return list(self._commands or [])

    async def run_command(self, name: str, args: str | None) -> Dispatch:
        """A slash command as ACP runs them: a prompt starting ``/NAME``."""
        text = f"/{name} {args}" if args else f"/{name}"
        return await self.send(Submission(client_message_id=secrets.token_hex(16), text=text))

    async def answer_approval(self, native_id: str, decision: str) -> None:
        """Answer the permission request ``native_id`` with the option ``decision``
        (``cancel``: the cancelled outcome). One the agent no longer waits for is a
        no-op: its turn's end settles the approval."""
        request = self._requests.pop(native_id, None)
        if request is None:
            log.info("no open permission request %s to answer", native_id)
            return
        await self._rpc.respond(request.request_id, permission_answer(request.option_ids, decision))


def _prompt_answer(frame: dict[str, Any]) -> bool:
    """Whether a response is what ``session/prompt`` answers (a stop reason, or an
    error): the end of a turn an earlier adapter started (Rule 4)."""
    result = frame.get("result")
    return frame.get("error") is not None or (
        isinstance(result, dict) and isinstance(result.get("stopReason"), str)
    )


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
