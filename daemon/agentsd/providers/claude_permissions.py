"""The questions Claude Code asks its host: ``control_request`` frames from the CLI.

With ``--permission-prompt-tool stdio`` the CLI asks ``can_use_tool`` before a tool
that needs permission, and waits for a ``control_response``; it withdraws a question
with ``control_cancel_request`` (an interrupt does). An MCP server from the user's
settings may ask the user through ``elicitation``. The other subtypes both tested
releases send (2.1.197 and 2.1.332) go only to hosts that asked for them:
``hook_callback`` (hooks registered at ``initialize``; agentsd sends ``hooks:
null``), ``mcp_message`` (SDK MCP servers), ``request_user_dialog`` (declared
dialog kinds), ``host_auth_token_refresh`` / ``oauth_token_refresh`` (host-managed
login), and in 2.1.332 ``remote_control_work_secret``, ``register_device_hooks``
and ``upload_device_hook_template``. The CLI reads an error answer to any of them
as a refusal (no hook opinion, a cancelled dialog, no token).

Rule 1: every request is answered. ``can_use_tool`` becomes a durable approval and
is answered once a client decided (``allow`` runs the tool with the input it asked
for, ``deny`` and ``cancel`` refuse it); one that cannot be recorded is denied at
once. An ``elicitation`` is an approval too when accepting needs no typed content,
else it is declined at once (``agentsd.providers.elicitation``). Any other subtype
gets an error response at once. ``AskUserQuestion`` and
``ExitPlanMode`` are asked as questions and plans (``claude_questions``): one
approval per question, in order, and the answers go back in ``updatedInput``.

Rule 2: a request is answered at most once: the answer, or the CLI's cancel, takes
it out of ``_pending``, and whatever comes second finds nothing to do. ``_pending``
is keyed by the native id of the approval that asks now (a request id, or
``<request id>#<n>`` for the n-th question of a call).

Rule 3: a committed decision reaches the CLI even if the client that gave it goes
away: delivery (and asking the next question) is shielded, within
``DELIVER_TIMEOUT_S``.

Rule 4: an approved plan takes Claude Code out of plan mode (it switches itself to
``default``), so the session's stored ``permissionMode`` becomes ``default`` too: a
restart or resume then carries on with the approved plan instead of planning again.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import msgspec
import trio

from agentsd.providers import elicitation
from agentsd.providers.base import LineLink, PendingTakeover, SessionSink
from agentsd.providers.claude_questions import (
    PLAN_TOOL,
    QUESTION_TOOL,
    Ask,
    QuestionForm,
    parse_questions,
    plan_approval,
    plan_response,
)
from agentsd_protocol.api.events import AgentError, AgentWarning
from agentsd_protocol.errors import AgentProtocolError, RpcError

log = logging.getLogger(__name__)

OPTIONS = ["allow", "deny"]  # a client may also answer "cancel", which denies
MAX_DETAIL_CHARS = 8 * 1024  # an approval shows a command or a file's head, not all of it
# A commit and a pipe write take milliseconds; past this the store or the child is stuck.
DELIVER_TIMEOUT_S = 10.0
LEFT_PLAN_MODE = "default"  # the mode Claude Code takes once a plan is approved
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
    with the input it asked for (its own, when that was not kept over a takeover:
    2.1.332 takes an allow without ``updatedInput``); anything else (``deny``,
    ``cancel``) refuses it."""
    if decision == "allow":
        if tool_input is None:
            return {"behavior": "allow"}
        return {"behavior": "allow", "updatedInput": tool_input}
    reason = "the user cancelled the request" if decision == "cancel" else "the user denied it"
    return {"behavior": "deny", "message": f"Permission to use this tool was refused: {reason}."}


@attrs.define(eq=False)
class _Open:
    """A ``can_use_tool`` request waiting for its answer."""

    request_id: str
    kind: str  # "tool", "question", "plan" or "elicitation": how the decision is answered
    tool_input: Any  # what the answer is made from (an elicitation's: its mode)
    item_id: str | None
    native_id: str  # the approval that asks now (Rule 2)
    form: QuestionForm | None = None  # for questions

    def record(self) -> dict[str, Any]:
        """What an adapter that takes over needs to answer it (``Permissions.restore``)."""
        record = {
            "request_id": self.request_id,
            "kind": self.kind,
            "input": self.tool_input,
            "item_id": self.item_id,
        }
        if self.form is not None:
            record.update(self.form.progress())
        return record


class Permissions:
    """The CLI's open questions of one child: the reader records them, RPC handlers
    answer them (through ``answer``)."""

    def __init__(self, link: LineLink, sink: SessionSink) -> None:
        self._link = link
        self._sink = sink
        self._pending: dict[str, _Open] = {}  # by the native id of the approval asking now

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
                AgentError(
                    error_kind=AgentProtocolError.kind,
                    message=f"claude sent a control request without an id: {clipped}",
                )
            )
            return
        if subtype == "elicitation":
            await self._on_elicitation(request_id, request)
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
                AgentWarning(source=str(subtype), message=f"refused claude's {subtype!r} request")
            )
            return
        tool_name = request.get("tool_name")
        tool_input = request.get("input")
        # The tool call it asks about: the ``tool_use`` id its item carries.
        item_id = _str(request.get("tool_use_id"))
        pending = _Open(request_id, "tool", tool_input, item_id, native_id=request_id)
        questions = parse_questions(tool_input) if tool_name == QUESTION_TOOL else []
        if questions:
            pending.kind = "question"
            pending.form = QuestionForm(tool_input, questions)
            ask = pending.form.ask()
        elif tool_name == PLAN_TOOL:
            pending.kind = "plan"
            ask = plan_approval(tool_input)
        else:
            title, detail = describe_permission(request)
            ask = Ask(kind="tool", title=title, detail=detail, options=OPTIONS)
        await self._ask(pending, ask)

    async def _on_elicitation(self, request_id: str, request: dict[str, Any]) -> None:
        mode = request.get("mode")
        server = request.get("mcp_server_name")
        if not elicitation.answerable(mode, request.get("requested_schema")):
            await self._respond(
                request_id,
                {"subtype": "success", "response": elicitation.result("decline", mode)},
            )
            await self._sink.emit(
                AgentWarning(
                    source="elicitation",
                    message=f"declined {server}'s request for input agentsd cannot ask for: "
                    f"{_clip_encoder.encode(request.get('message'))[:300].decode(errors='replace')}",
                )
            )
            return
        title, detail = elicitation.describe(
            server,
            request.get("message"),
            mode,
            request.get("url"),
            request.get("requested_schema"),
        )
        pending = _Open(request_id, "elicitation", mode, None, native_id=request_id)
        await self._ask(
            pending,
            Ask(kind="elicitation", title=title, detail=detail, options=elicitation.OPTIONS),
        )

    async def _ask(self, pending: _Open, ask: Ask) -> None:
        """Record the approval that asks ``pending`` now; Rule 1 when it cannot be."""
        # Registered before the await: a client may answer before the commit returns.
        self._pending[pending.native_id] = pending
        try:
            await self._sink.approval_requested(
                native_id=pending.native_id,
                kind=ask.kind,
                title=ask.title,
                detail=ask.detail,
                options=ask.options,
                item_id=pending.item_id,
                request=pending.record(),
            )
        except RpcError as exc:
            # Rule 1: a question nobody can durably answer is refused, not left hanging.
            if self._pending.pop(pending.native_id, None) is None:
                return  # withdrawn by the CLI meanwhile: it needs no answer
            log.warning("refused claude's request: could not record it: %s", exc.message)
            refusal = (
                elicitation.result("decline", pending.tool_input)
                if pending.kind == "elicitation"
                else {
                    "behavior": "deny",
                    "message": f"agentsd could not record the request: {exc.message}",
                }
            )
            await self._respond(pending.request_id, {"subtype": "success", "response": refusal})

    def restore(self, approval: PendingTakeover) -> None:
        """Take over an approval an earlier adapter asked (``_Open.record``); without
        a record, from its native id and kind (a tool's allow then runs the input
        the CLI has)."""
        record = approval.request or {}
        request_id = record.get("request_id")
        if not isinstance(request_id, str):
            request_id = approval.native_id.split("#", 1)[0]
        kind = record.get("kind")
        if kind not in ("tool", "question", "plan", "elicitation"):
            kind = approval.kind if approval.kind in ("question", "plan", "elicitation") else "tool"
        tool_input = record.get("input")
        pending = _Open(
            request_id, kind, tool_input, _str(record.get("item_id")), approval.native_id
        )
        if kind == "question":
            questions = parse_questions(tool_input)
            if not questions:
                log.warning(
                    "cannot answer claude's question %s after a takeover: its questions "
                    "were not kept; it is denied when answered",
                    approval.native_id,
                )
                # As a tool whose options are labels: any answer denies it.
                pending.kind = "tool"
            else:
                answers = record.get("answers")
                index = record.get("index")
                pending.form = QuestionForm(
                    tool_input,
                    questions,
                    answers=answers if isinstance(answers, dict) else None,
                    index=index if isinstance(index, int) else 0,
                )
        self._pending[approval.native_id] = pending

    async def on_cancel(self, frame: dict[str, Any]) -> None:
        request_id = frame.get("request_id")
        for native_id, pending in list(self._pending.items()):
            if pending.request_id == request_id:
                del self._pending[native_id]
                await self._sink.approval_cancelled(native_id)

    async def answer(self, native_id: str, decision: str) -> None:
        """Deliver a committed decision (Rule 2: at most once; Rule 3: shielded)."""
        pending = self._pending.pop(native_id, None)
        if pending is None:
            return  # withdrawn by the CLI (its cancel is journaled), or answered already
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + DELIVER_TIMEOUT_S
            await self._deliver(pending, decision)
        if scope.cancelled_caught:
            log.warning(
                "the answer to claude's request %s was not delivered within %g s",
                pending.request_id,
                DELIVER_TIMEOUT_S,
            )

    async def _deliver(self, pending: _Open, decision: str) -> None:
        if pending.form is not None:
            response = pending.form.answer(decision)
            if response is None:
                # Rule 2's key: the next question has an approval of its own.
                pending.native_id = f"{pending.request_id}#{pending.form.number}"
                await self._ask(pending, pending.form.ask())
                return
        elif pending.kind == "plan":
            response = plan_response(decision, pending.tool_input)
        elif pending.kind == "elicitation":
            response = elicitation.result(decision, pending.tool_input)
        else:
            response = permission_response(decision, pending.tool_input)
        await self._respond(pending.request_id, {"subtype": "success", "response": response})
        if pending.kind == "plan" and response["behavior"] == "allow":
            await self._left_plan_mode()

    async def _left_plan_mode(self) -> None:
        """Claude Code leaves plan mode by itself once a plan is approved (Rule 4)."""
        try:
            await self._sink.options_changed({"permissionMode": LEFT_PLAN_MODE})
        except RpcError as exc:
            log.warning("could not record that claude left plan mode: %s", exc.message)
