"""Codex app-server notifications as journal event bodies (pure: no I/O).

The adapter in ``codex`` reads frames; this module decides what each one means for
the journal. Every function takes the notification's ``params`` (decoded JSON) and
returns plain JSON values, so it is tested without a child process.

Rule 1: what a client needs to render the conversation is kept (item text, command,
exit code, outcome); payloads that can grow without bound (command output, diffs,
tool results) go through ``bounded_payload``.

Rule 2: values the protocol does not promise are never trusted: a missing field is
``None`` and an unknown turn status is ``unknown``, never success.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from agentsd.store.journal import bounded_payload

MAX_OUTPUT_BYTES = 64 * 1024  # per tool output or diff: the head a reader needs, not a log file
MAX_DETAIL_BYTES = 16 * 1024  # an item type this adapter does not know, kept as JSON

TURN_OUTCOMES = frozenset({"completed", "interrupted", "failed"})
_AUTH_STATUSES = frozenset({401, 403})
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_encoder = msgspec.json.Encoder()


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def bounded(value: Any, max_bytes: int = MAX_OUTPUT_BYTES) -> dict[str, Any] | None:
    """``bounded_payload`` of a string, or of anything else as JSON; None stays None."""
    if value is None:
        return None
    data = value if isinstance(value, str) else _encoder.encode(value)
    return bounded_payload(data, max_bytes)


def user_text(content: Any) -> str:
    """The text of a ``userMessage`` item's inputs, joined."""
    return "".join(
        str(part.get("text", ""))
        for part in _list(content)
        if isinstance(part, dict) and part.get("type") == "text"
    )


def item_body(params: dict[str, Any]) -> dict[str, Any]:
    """``item.started`` / ``item.completed`` body of an ``item/*`` notification."""
    item = _dict(params.get("item"))
    kind = _str(item.get("type")) or "unknown"
    body: dict[str, Any] = {
        "itemId": _str(item.get("id")),
        "turnId": _str(params.get("turnId")),
        "type": kind,
    }
    match kind:
        case "agentMessage" | "plan":
            body["text"] = str(item.get("text") or "")
        case "userMessage":
            body["text"] = user_text(item.get("content"))
        case "reasoning":
            body["text"] = "\n\n".join(str(s) for s in _list(item.get("summary")))
        case "commandExecution":
            body["command"] = _str(item.get("command"))
            body["cwd"] = _str(item.get("cwd"))
            body["status"] = _str(item.get("status"))
            body["exitCode"] = item.get("exitCode")
            body["durationMs"] = item.get("durationMs")
            body["output"] = bounded(item.get("aggregatedOutput"))
        case "fileChange":
            changes = [_dict(c) for c in _list(item.get("changes"))]
            body["status"] = _str(item.get("status"))
            body["changes"] = [
                {"path": _str(c.get("path")), "kind": _dict(c.get("kind")).get("type")}
                for c in changes
            ]
            diff = "".join(str(c.get("diff") or "") for c in changes)
            body["diff"] = bounded(diff) if diff else None
        case "mcpToolCall":
            body["server"] = _str(item.get("server"))
            body["tool"] = _str(item.get("tool"))
            body["status"] = _str(item.get("status"))
            body["arguments"] = bounded(item.get("arguments"))
            body["result"] = bounded(item.get("result"))
            body["error"] = bounded(item.get("error"))
        case "dynamicToolCall":
            body["tool"] = _str(item.get("tool"))
            body["status"] = _str(item.get("status"))
            body["arguments"] = bounded(item.get("arguments"))
            body["result"] = bounded(item.get("contentItems"))
        case _:
            rest = {k: v for k, v in item.items() if k not in ("id", "type")}
            if rest:
                body["detail"] = bounded(rest, MAX_DETAIL_BYTES)
    return body


def item_started_body(params: dict[str, Any]) -> dict[str, Any]:
    """``item.started``: the identity of the item only; its content comes with
    ``item.completed`` (and streamed text with deltas)."""
    body = item_body(params)
    return {"itemId": body["itemId"], "turnId": body["turnId"], "type": body["type"]}


def turn_id_of(params: dict[str, Any]) -> str | None:
    return _str(_dict(params.get("turn")).get("id"))


def error_kind(error: Any) -> str:
    """A stable ``kind`` for a Codex ``TurnError``: ``auth_refused`` (the model
    server refused the key), ``model_unreachable`` (no HTTP answer at all), else the
    ``codexErrorInfo`` variant in snake case (``model_http_error`` for other HTTP
    statuses), or ``agent_error`` when Codex gives no detail."""
    info = _dict(error).get("codexErrorInfo")
    if isinstance(info, str):
        return "auth_refused" if info == "unauthorized" else _CAMEL.sub("_", info).lower()
    if isinstance(info, dict) and info:
        variant, detail = next(iter(info.items()))
        status = _dict(detail).get("httpStatusCode")
        if status in _AUTH_STATUSES:
            return "auth_refused"
        if status is None and variant in (
            "httpConnectionFailed",
            "responseStreamConnectionFailed",
            "responseStreamDisconnected",
        ):
            return "model_unreachable"
        if isinstance(status, int):
            return "model_http_error"
        return _CAMEL.sub("_", str(variant)).lower()
    return "agent_error"


def error_body(error: Any, turn_id: str | None, will_retry: bool) -> dict[str, Any]:
    """``agent.error`` body of a Codex ``TurnError``."""
    err = _dict(error)
    body: dict[str, Any] = {
        "kind": error_kind(err),
        "message": str(err.get("message") or "the agent reported an error"),
        "turnId": turn_id,
        "willRetry": will_retry,
    }
    details = _str(err.get("additionalDetails"))
    if details:
        body["details"] = details
    return body


def turn_completed_body(params: dict[str, Any]) -> dict[str, Any]:
    """``turn.completed {turnId, outcome}``; a failed turn carries its error."""
    turn = _dict(params.get("turn"))
    status = turn.get("status")
    outcome = status if status in TURN_OUTCOMES else "unknown"
    body: dict[str, Any] = {"turnId": _str(turn.get("id")), "outcome": outcome}
    if turn.get("error"):
        err = _dict(turn.get("error"))
        body["error"] = {
            "kind": error_kind(err),
            "message": str(err.get("message") or ""),
        }
    return body


def thread_status_body(params: dict[str, Any]) -> dict[str, Any]:
    status = _dict(params.get("status"))
    return {
        "status": _str(status.get("type")) or "unknown",
        "activeFlags": [str(f) for f in _list(status.get("activeFlags"))],
    }


def usage_body(params: dict[str, Any]) -> dict[str, Any]:
    usage = _dict(params.get("tokenUsage"))
    return {
        "turnId": _str(params.get("turnId")),
        "total": _dict(usage.get("total")),
        "last": _dict(usage.get("last")),
        "modelContextWindow": usage.get("modelContextWindow"),
    }


def warning_body(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """``agent.warning`` of ``warning``, ``configWarning``, ``deprecationNotice``."""
    message = _str(params.get("message")) or _str(params.get("summary")) or ""
    body: dict[str, Any] = {"source": method, "message": message}
    details = _str(params.get("details"))
    if details:
        body["details"] = details
    return body
