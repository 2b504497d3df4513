"""Opening an ACP session: ``initialize``, then ``session/new``, ``session/resume`` or
``session/load``, then ``session/set_mode`` when the session's options name another
mode (agentclientprotocol/agent-client-protocol, protocol version 1). A session's
options name at most that mode (``parse_options``).

- ``initialize {protocolVersion, clientCapabilities, clientInfo}`` answers
  ``{protocolVersion, agentCapabilities: {loadSession, sessionCapabilities: {resume}},
  authMethods, agentInfo: {name, version}}``. agentsd offers no ``fs`` and no
  ``terminal`` (the adapter refuses their requests with method-not-found).
- ``session/new {cwd, mcpServers}`` answers ``{sessionId, modes?}``; an agent that
  wants ``authenticate`` first answers ``AUTH_REQUIRED``.
- ``session/resume`` (when ``sessionCapabilities.resume`` is offered) and
  ``session/load`` (when ``loadSession`` is) take ``{sessionId, cwd, mcpServers}``;
  resume is preferred, as it does not replay. Without either, or for a session the
  agent lost that had no turn, a fresh session replaces it (``superseded``).

Rule: the opener reads the agent's output only until the answer it waits for; what
comes first (updates, requests) goes to ``on_frame``, the adapter's handler, so the
adapter stays the one place frames are interpreted.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

import agentsd
from agentsd.providers.acp_agents import AcpAgent
from agentsd.providers.base import Resume, SessionSink
from agentsd.providers.codex_rpc import Call, Garbage, RpcPeer, clip, error_message
from agentsd.providers.mcp_servers import acp_servers, parse_mcp_servers
from agentsd.store.sessions import SessionRow
from agentsd_protocol.api.controls import OptionChoice
from agentsd_protocol.api.events import AgentWarning, ThreadSuperseded
from agentsd_protocol.errors import (
    AgentExited,
    AgentProtocolError,
    AgentStartFailed,
    InvalidParams,
    ResumeFailed,
)

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1  # the ACP version agentsd speaks
AUTH_REQUIRED = -32000  # ACP's error for a session that needs ``authenticate`` first
CLIENT_CAPABILITIES: dict[str, Any] = {
    "fs": {"readTextFile": False, "writeTextFile": False},
    "terminal": False,
}


OPTION_NAMES = ("mode", "mcpServers")


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
    parse_mcp_servers(options.get("mcpServers", []))
    return mode


def acp_error_message(error: Any) -> str:
    """An ACP error member in words: its ``message``, and the ``details`` the ACP SDKs
    put in ``data`` (Gemini CLI's "Internal error" says what went wrong only there)."""
    words = error_message(error)
    data = error.get("data") if isinstance(error, dict) else None
    details = data.get("details") if isinstance(data, dict) else data
    if isinstance(details, str) and details.strip() and details not in words:
        return f"{words}: {clip(details.strip())}"
    return words


def garbage_message(agent: AcpAgent, frame: Garbage) -> str:
    return f"{agent.display_name} wrote a line that is not a JSON object: {frame.line[:200]!r}"


@attrs.define(eq=False)
class SessionOpener:
    """Opens (or reopens) the ACP session of one child; what the agent said about
    itself stays here for the adapter to report."""

    rpc: RpcPeer
    agent: AcpAgent
    session: SessionRow
    sink: SessionSink
    on_frame: Callable[[dict[str, Any]], Awaitable[None]]
    mode: str | None  # the mode the session's options ask for, or the agent last reported
    session_id: str | None = None
    version: str | None = None
    agent_name: str | None = None
    capabilities: dict[str, Any] = attrs.field(factory=dict)
    auth_methods: list[str] = attrs.field(factory=list)
    superseded: ThreadSuperseded | None = None
    modes: list[OptionChoice] = attrs.field(factory=list)  # what new or load listed

    async def call(self, method: str, params: dict[str, Any]) -> Call:
        """A request during the handshake: read (and hand on what comes first)
        until its response; an error response is left in ``Call.error``."""
        call = await self.rpc.request(method, params)
        while not call.done.is_set():
            frame = await self.rpc.receive()
            if frame is None:
                raise AgentExited(
                    f"{self.agent.display_name} exited during its handshake (waiting for {method})"
                )
            if isinstance(frame, Garbage):
                raise AgentProtocolError(garbage_message(self.agent, frame))
            await self.on_frame(frame)
        return call

    async def open(self, resume: Resume | None) -> str:
        """``initialize``, then ``session/new``, ``session/resume`` or ``session/load``;
        returns the ACP session id. Raises ``AgentExited`` (EOF), ``AgentProtocolError``
        (garbage, a refused initialize, another protocol version), ``AgentStartFailed``
        (no session, e.g. authentication needed) or ``ResumeFailed``. The runner
        bounds it in time."""
        await self.initialize()
        if resume is None:
            session = await self.new_session()
        else:
            session = await self.resume_session(resume)
        await self.apply_mode(session)
        return self.session_id or ""

    async def initialize(self) -> None:
        init = await self.call(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": CLIENT_CAPABILITIES,
                "clientInfo": {
                    "name": "agentsd",
                    "title": "agentsd",
                    "version": agentsd.__version__,
                },
            },
        )
        name = self.agent.display_name
        if init.error is not None:
            raise AgentProtocolError(f"{name} refused initialize: {acp_error_message(init.error)}")
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
        self.version = version if isinstance(version, str) else None
        self.agent_name = agent_name if isinstance(agent_name, str) else None
        capabilities = result.get("agentCapabilities")
        self.capabilities = capabilities if isinstance(capabilities, dict) else {}
        methods = result.get("authMethods")
        self.auth_methods = [
            str(m.get("name") or m.get("id"))
            for m in (methods if isinstance(methods, list) else [])
            if isinstance(m, dict)
        ]

    def _session_params(self) -> dict[str, Any]:
        servers = parse_mcp_servers(self.session.options.get("mcpServers", []))
        return {"cwd": self.session.cwd, "mcpServers": acp_servers(servers)}

    async def new_session(self) -> dict[str, Any]:
        call = await self.call("session/new", self._session_params())
        name = self.agent.display_name
        if call.error is not None:
            words = acp_error_message(call.error)
            if isinstance(call.error, dict) and call.error.get("code") == AUTH_REQUIRED:
                methods = ", ".join(self.auth_methods) or "none named"
                raise AgentStartFailed(
                    f"{name} needs you to log in first (its methods: {methods}): {words}"
                )
            raise AgentStartFailed(f"{name} could not start a session: {words}")
        result = call.result if isinstance(call.result, dict) else {}
        session_id = result.get("sessionId")
        if not isinstance(session_id, str) or not session_id:
            raise AgentProtocolError(f"{name} answered session/new without a sessionId")
        self.session_id = session_id
        return result

    async def resume_session(self, resume: Resume) -> dict[str, Any]:
        """``session/resume`` or ``session/load``, whichever the agent offers (resume
        first: it does not replay). Without either, or for a session the agent lost
        that had no turn, a fresh session replaces it (``superseded``). Raises
        ``ResumeFailed`` when a session with turns cannot be resumed."""
        name = self.agent.display_name
        session_capabilities = self.capabilities.get("sessionCapabilities")
        if isinstance(session_capabilities, dict) and isinstance(
            session_capabilities.get("resume"), dict
        ):
            method = "session/resume"
        elif self.capabilities.get("loadSession") is True:
            method = "session/load"
        else:
            return await self._supersede(
                resume, f"{name} can neither resume nor load a session (it offers neither)"
            )
        # Set before the call: session/load's replay names this session.
        self.session_id = resume.handle
        call = await self.call(method, {"sessionId": resume.handle, **self._session_params()})
        if call.error is None:
            return call.result if isinstance(call.result, dict) else {}
        words = acp_error_message(call.error)
        if resume.had_turns:
            raise ResumeFailed(f"{name} could not resume session {resume.handle}: {words}")
        return await self._supersede(
            resume, f"{name} could not resume session {resume.handle}, which had no turn: {words}"
        )

    async def _supersede(self, resume: Resume, reason: str) -> dict[str, Any]:
        log.info("%s; starting a new session", reason)
        result = await self.new_session()
        self.superseded = ThreadSuperseded(
            previous_handle=resume.handle, handle=self.session_id or "", reason=reason
        )
        return result

    async def apply_mode(self, session: dict[str, Any]) -> None:
        """Put the session in the mode its options name, when it is not in it."""
        modes = session.get("modes")
        current = modes.get("currentModeId") if isinstance(modes, dict) else None
        listed = modes.get("availableModes") if isinstance(modes, dict) else None
        self.modes = [
            OptionChoice(
                value=m["id"],
                label=m.get("name") if isinstance(m.get("name"), str) else None,
                description=m.get("description") if isinstance(m.get("description"), str) else None,
                default=m["id"] == current,  # the mode the agent is in unless one is set
            )
            for m in (listed if isinstance(listed, list) else [])
            if isinstance(m, dict) and isinstance(m.get("id"), str)
        ] or self.modes
        if self.mode is None or self.mode == current:
            return
        call = await self.call(
            "session/set_mode", {"sessionId": self.session_id, "modeId": self.mode}
        )
        if call.error is not None:
            await self.sink.emit(
                AgentWarning(
                    source="session/set_mode",
                    message=f"{self.agent.display_name} refused mode {self.mode!r}: "
                    f"{acp_error_message(call.error)}",
                )
            )
