"""The questions Claude Code asks its host: ``control_request`` frames from the CLI.

With ``--permission-prompt-tool stdio`` the CLI asks ``can_use_tool`` before a tool
that needs permission, and waits for a ``control_response``; it withdraws a question
with ``control_cancel_request`` (an interrupt does). Other subtypes (hook callbacks,
MCP messages) exist for SDK hosts that register hooks or servers; agentsd registers
none.

Rule 1: every request is answered. ``can_use_tool`` becomes a durable approval and
is answered once a client decided (``allow`` runs the tool with the input it asked
for, ``deny`` and ``cancel`` refuse it); one that cannot be recorded is denied at
once. Any other subtype gets an error response at once.

Rule 2: a question is answered at most once: the answer, or the CLI's cancel, takes
it out of ``_pending``, and whatever comes second finds nothing to do.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import trio

from agentsd.providers.base import LineLink, SessionSink
from agentsd_protocol.errors import AgentProtocolError, RpcError

log = logging.getLogger(__name__)

OPTIONS = ["allow", "deny"]  # a client may also answer "cancel", which denies
MAX_DETAIL_CHARS = 8 * 1024  # an approval shows a command or a file's head, not all of it
_clip_encoder = msgspec.json.Encoder()


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def describe_permission(request: dict[str, Any]) -> tuple[str, str]:
    """Title and detail of a ``can_use_tool`` request, for a person to decide on:
    the tool and what it will do (a command, a path, else its input as JSON)."""
    name = _str(request.get("display_name")) or _str(request.get("tool_name")) or "a tool"
    description = _str(request.get("description")) or _str(request.get("title"))
    title = f"{name}: {description}" if description else f"Allow {name}?"
    tool_input = _dict(request.get("input"))
    command = _str(tool_input.get("command"))
    path = _str(tool_input.get("file_path")) or _str(request.get("blocked_path"))
    if command is not None:
        detail = command
    elif path is not None and len(tool_input) <= 1:
        detail = path
    else:
        detail = _clip_encoder.encode(tool_input).decode()
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[:MAX_DETAIL_CHARS] + "..."
    return title[:MAX_DETAIL_CHARS], detail


def permission_response(decision: str, tool_input: Any) -> dict[str, Any]:
    """The ``can_use_tool`` answer for a committed decision: ``allow`` runs the tool
    with the input it asked for; anything else (``deny``, ``cancel``) refuses it."""
    if decision == "allow":
        return {"behavior": "allow", "updatedInput": tool_input}
    reason = "the user cancelled the request" if decision == "cancel" else "the user denied it"
    return {"behavior": "deny", "message": f"Permission to use this tool was refused: {reason}."}


class Permissions:
    """The CLI's open questions of one child: the reader records them, RPC handlers
    answer them (through ``answer``)."""

    def __init__(self, link: LineLink, sink: SessionSink) -> None:
        self._link = link
        self._sink = sink
        self._pending: dict[str, Any] = {}  # request id -> the tool input it asked for

    async def _respond(self, request_id: str, response: dict[str, Any]) -> None:
        """Send a ``control_response``; a child that is gone needs no answer."""
        try:
            await self._link.send(
                {"type": "control_response", "response": {**response, "request_id": request_id}}
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.info("claude exited before the answer to its request %s reached it", request_id)

    async def on_request(self, frame: dict[str, Any]) -> None:
        request_id = frame.get("request_id")
        request = _dict(frame.get("request"))
        subtype = request.get("subtype")
        if not isinstance(request_id, str):
            clipped = _clip_encoder.encode(frame)[:300].decode(errors="replace")
            await self._sink.emit(
                "agent.error",
                {
                    "kind": AgentProtocolError.kind,
                    "message": f"claude sent a control request without an id: {clipped}",
                },
            )
            return
        if subtype != "can_use_tool":
            await self._respond(
                request_id,
                {
                    "subtype": "error",
                    "error": f"agentsd does not handle {subtype!r} control requests",
                },
            )
            await self._sink.emit(
                "agent.warning",
                {"source": str(subtype), "message": f"refused claude's {subtype!r} request"},
            )
            return
        title, detail = describe_permission(request)
        # The tool call it asks about: the ``tool_use`` id its item carries.
        tool_use_id = _str(request.get("tool_use_id"))
        # Registered before the await: a client may answer before the commit returns.
        self._pending[request_id] = request.get("input")
        try:
            await self._sink.approval_requested(
                native_id=request_id,
                kind="tool",
                title=title,
                detail=detail,
                options=OPTIONS,
                item_id=tool_use_id,
            )
        except RpcError as exc:
            # Rule 1: a question nobody can durably answer is refused, not left hanging.
            self._pending.pop(request_id, None)
            log.warning("denied claude's can_use_tool: could not record it: %s", exc.message)
            await self._respond(
                request_id,
                {
                    "subtype": "success",
                    "response": {
                        "behavior": "deny",
                        "message": f"agentsd could not record the request: {exc.message}",
                    },
                },
            )

    async def on_cancel(self, frame: dict[str, Any]) -> None:
        request_id = frame.get("request_id")
        if isinstance(request_id, str) and request_id in self._pending:
            del self._pending[request_id]
            await self._sink.approval_cancelled(request_id)

    async def answer(self, request_id: str, decision: str) -> None:
        """Deliver a committed decision (Rule 2: at most once)."""
        if request_id not in self._pending:
            return  # withdrawn by the CLI (its cancel is journaled), or answered already
        tool_input = self._pending.pop(request_id)
        await self._respond(
            request_id,
            {"subtype": "success", "response": permission_response(decision, tool_input)},
        )
