"""Codex server requests as durable approvals, and decisions back as responses (pure).

Codex asks its client through JSON-RPC requests of its own (the same ten in 0.163.0
and 0.171.0). Five of them are questions a person answers, and become approvals:

- ``item/commandExecution/requestApproval`` and ``item/fileChange/requestApproval``
  answer ``{"decision": ...}``;
- ``item/permissions/requestApproval`` answers the granted permission profile and
  its scope;
- ``item/tool/requestUserInput`` answers one choice per question;
- ``mcpServer/elicitation/request`` answers an MCP action (``elicitation``), when
  accepting needs no typed content; otherwise it is declined at once.

The others get a safe answer at once (Rule 3): ``item/tool/call`` (a dynamic tool;
agentsd registers none) a failed tool result; ``account/chatgptAuthTokens/refresh``,
``attestation/generate`` (only for clients that opted in; agentsd does not), the
deprecated ``applyPatchApproval`` / ``execCommandApproval`` (legacy turns only) and
anything newer an error, which Codex reads as a refusal (a denied command, an empty
grant, a declined elicitation).

Rule 1: an approval offers only the decisions the request offers, among
``accept``, ``acceptForSession``, ``decline`` and ``cancel``. A command request
lists them in ``availableDecisions`` (Codex 0.163 offers ``accept`` and ``cancel``
for an escalation, not ``decline``); decisions that carry an argument
(``acceptWithExecpolicyAmendment``) are not offered, since a client answers with a
word. Without the list, the protocol's documented set applies.

Rule 2: every decision maps to a response Codex accepts; ``cancel`` is always
answerable (the daemon adds it to every approval) and for requests that have no
cancel of their own it denies, the safe reading.

Rule 3: a request no person can answer through an approval gets the reply its
protocol documents as a refusal (``answer_at_once``), or an error; never silence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import msgspec

from agentsd.providers import elicitation

DECISIONS = ("accept", "acceptForSession", "decline", "cancel")
MAX_DETAIL_CHARS = 8 * 1024  # an approval shows a command or a diff head, not a whole file

COMMAND = "item/commandExecution/requestApproval"
FILE_CHANGE = "item/fileChange/requestApproval"
PERMISSIONS = "item/permissions/requestApproval"
USER_INPUT = "item/tool/requestUserInput"
ELICITATION = "mcpServer/elicitation/request"
DYNAMIC_TOOL = "item/tool/call"
APPROVAL_METHODS = frozenset({COMMAND, FILE_CHANGE, PERMISSIONS, USER_INPUT, ELICITATION})

_encoder = msgspec.json.Encoder()


@attrs.frozen
class ServerRequest:
    """A request Codex sent us; ``request_id`` is kept as sent (Codex numbers its
    own requests from 0, independently of ours)."""

    request_id: int | str
    method: str
    params: dict[str, Any]

    @property
    def native_id(self) -> str:
        return str(self.request_id)

    def record(self) -> dict[str, Any]:
        """What an adapter that takes over needs to answer it (``restored``)."""
        return {"id": self.request_id, "method": self.method, "params": self.params}


# An approval's kind -> the request it asked (for a record that was not kept).
KIND_METHODS = {
    "command": COMMAND,
    "fileChange": FILE_CHANGE,
    "permissions": PERMISSIONS,
    "question": USER_INPUT,
    "elicitation": ELICITATION,
}


def restored(native_id: str, kind: str, record: Mapping[str, Any] | None) -> ServerRequest | None:
    """The request an approval an earlier adapter recorded answers, from its
    ``record``; without one (not kept), from its kind with empty params, which
    ``response`` answers with the safe reading (nothing granted, nothing answered).
    None for a record that is not a Codex approval request."""
    if record is not None:
        request_id, method, params = record.get("id"), record.get("method"), record.get("params")
        if (
            isinstance(request_id, int | str)
            and not isinstance(request_id, bool)
            and str(request_id) == native_id
            and isinstance(method, str)
            and method in APPROVAL_METHODS
            and isinstance(params, dict)
        ):
            return ServerRequest(request_id, method, params)
        return None
    method = KIND_METHODS.get(kind)
    if method is None:
        return None
    # Codex numbers its requests with integers (native_id is their decimal form).
    number: int | str = int(native_id) if native_id.isdecimal() else native_id
    return ServerRequest(number, method, {})


@attrs.frozen
class Ask:
    """What an approval shows a person."""

    kind: str
    title: str
    detail: str
    options: list[str]


def _clip(text: str) -> str:
    if len(text) <= MAX_DETAIL_CHARS:
        return text
    return text[:MAX_DETAIL_CHARS] + f"\n... ({len(text) - MAX_DETAIL_CHARS} more characters)"


def _offered(available: Any, default: list[str]) -> list[str]:
    if not isinstance(available, list):
        return default
    return [d for d in DECISIONS if d in available]


def _questions(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    questions = params.get("questions")
    if not isinstance(questions, list):
        return []
    return [q for q in questions if isinstance(q, dict)]


def _choices(question: Mapping[str, Any]) -> list[dict[str, Any]]:
    options = question.get("options")
    if not isinstance(options, list):
        return []
    return [o for o in options if isinstance(o, dict) and isinstance(o.get("label"), str)]


def describe(request: ServerRequest, item: Mapping[str, Any] | None = None) -> Ask:
    """The approval for an approval request (``request.method`` in
    ``APPROVAL_METHODS``). ``item`` is the item Codex announced with
    ``item/started`` for the same ``itemId``, if any: a file change's diff is there."""
    params = request.params
    reason = params.get("reason") if isinstance(params.get("reason"), str) else None
    match request.method:
        case "item/commandExecution/requestApproval":
            command = params.get("command")
            lines = [f"$ {command}"] if isinstance(command, str) else []
            if isinstance(params.get("cwd"), str):
                lines.append(f"in {params['cwd']}")
            network = params.get("networkApprovalContext")
            if isinstance(network, dict) and network.get("host"):
                lines.append(f"network access to {network['host']}")
            if reason:
                lines.append(reason)
            title = reason or (f"Run {command}" if isinstance(command, str) else "Run a command")
            return Ask(
                kind="command",
                title=_clip(title),
                detail=_clip("\n".join(lines)),
                options=_offered(params.get("availableDecisions"), list(DECISIONS)),
            )
        case "item/fileChange/requestApproval":
            changes = (item or {}).get("changes")
            lines = []
            for change in changes if isinstance(changes, list) else []:
                if isinstance(change, dict):
                    kind = (change.get("kind") or {}).get("type", "update")
                    lines.append(f"{kind} {change.get('path')}")
                    if change.get("diff"):
                        lines.append(str(change["diff"]))
            if reason:
                lines.insert(0, reason)
            return Ask(
                kind="fileChange",
                title=_clip(reason or "Apply file changes"),
                detail=_clip("\n".join(lines)),
                options=list(DECISIONS),
            )
        case "mcpServer/elicitation/request":
            title, detail = elicitation.describe(
                params.get("serverName"),
                params.get("message"),
                params.get("mode"),
                params.get("url"),
                params.get("requestedSchema"),
            )
            return Ask(kind="elicitation", title=title, detail=detail, options=elicitation.OPTIONS)
        case "item/permissions/requestApproval":
            wanted = _encoder.encode(params.get("permissions")).decode()
            return Ask(
                kind="permissions",
                title=_clip(reason or "Grant additional permissions"),
                detail=_clip(f"{reason + chr(10) if reason else ''}{wanted}"),
                options=["accept", "acceptForSession", "decline"],
            )
        case _:  # item/tool/requestUserInput
            questions = _questions(params)
            lines = []
            for q in questions:
                lines.append(f"{q.get('header') or ''}: {q.get('question') or ''}".strip(": "))
                lines.extend(
                    f"  {'*' if i == 0 else '-'} {o['label']}: {o.get('description') or ''}"
                    for i, o in enumerate(_choices(q))
                )
            answerable = bool(questions) and all(_choices(q) for q in questions)
            if answerable:
                lines.append("accept answers every question with its first (*) choice")
            first = questions[0] if questions else {}
            return Ask(
                kind="question",
                title=_clip(str(first.get("question") or "The agent asks a question")),
                detail=_clip("\n".join(lines)),
                options=["accept", "decline"] if answerable else ["decline"],
            )


def _granted(requested: Any) -> dict[str, Any]:
    """The whole requested permission profile, as a grant (absent members omitted)."""
    if not isinstance(requested, dict):
        return {}
    return {k: v for k, v in requested.items() if v is not None}


def response(request: ServerRequest, decision: str) -> dict[str, Any]:
    """The JSON-RPC ``result`` answering ``request`` with ``decision`` (one of
    ``DECISIONS``; anything else is answered as ``cancel``)."""
    if decision not in DECISIONS:
        decision = "cancel"
    match request.method:
        case "mcpServer/elicitation/request":
            mode = request.params.get("mode")
            return {"content": None, "_meta": None, **elicitation.result(decision, mode)}
        case "item/permissions/requestApproval":
            if decision in ("accept", "acceptForSession"):
                return {
                    "permissions": _granted(request.params.get("permissions")),
                    "scope": "session" if decision == "acceptForSession" else "turn",
                }
            return {"permissions": {}, "scope": "turn"}
        case "item/tool/requestUserInput":
            if decision != "accept":
                return {"answers": {}}
            answers: dict[str, Any] = {}
            for q in _questions(request.params):
                choices = _choices(q)
                if isinstance(q.get("id"), str) and choices:
                    answers[q["id"]] = {"answers": [choices[0]["label"]]}
            return {"answers": answers}
        case _:
            return {"decision": decision}


def answer_at_once(method: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The result for a request answered without asking anyone (Rule 3), or None
    when it is asked (``APPROVAL_METHODS``) or refused with an error."""
    if method == DYNAMIC_TOOL:
        tool = params.get("tool")
        return {
            "contentItems": [{"type": "inputText", "text": f"agentsd has no tool {tool!r}"}],
            "success": False,
        }
    if method == ELICITATION and not elicitation.answerable(
        params.get("mode"), params.get("requestedSchema")
    ):
        return {"content": None, "_meta": None, **elicitation.result("decline", params.get("mode"))}
    return None
