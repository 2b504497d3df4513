"""Codex app-server notifications as journal events (pure: no I/O).

The adapter in ``codex`` reads frames; this module decides what each one means for
the journal. Every function takes the notification's ``params`` (decoded JSON) and
returns an event of ``agentsd_protocol.api.events``, so it is tested without a child
process.

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

from agentsd.providers.base import journal_payload
from agentsd_protocol.api.events import (
    AgentError,
    AgentWarning,
    BoundedPayload,
    ErrorInfo,
    FileChange,
    ItemCompleted,
    ItemStarted,
    PlanStep,
    ThreadStatus,
    TurnCompleted,
    TurnOutcome,
    TurnPlan,
    UsageUpdated,
)

MAX_OUTPUT_BYTES = 64 * 1024  # per tool output or diff: the head a reader needs, not a log file
MAX_DETAIL_BYTES = 16 * 1024  # an item type this adapter does not know, kept as JSON

_OUTCOMES: dict[str, TurnOutcome] = {
    "completed": "completed",
    "interrupted": "interrupted",
    "failed": "failed",
}
_AUTH_STATUSES = frozenset({401, 403})
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_encoder = msgspec.json.Encoder()


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def bounded(value: Any, max_bytes: int = MAX_OUTPUT_BYTES) -> BoundedPayload | None:
    """``bounded_payload`` of a string, or of anything else as JSON; None stays None."""
    if value is None:
        return None
    data = value if isinstance(value, str) else _encoder.encode(value)
    return journal_payload(data, max_bytes)


def user_text(content: Any) -> str:
    """The text of a ``userMessage`` item's inputs, joined."""
    return "".join(
        str(part.get("text", ""))
        for part in _list(content)
        if isinstance(part, dict) and part.get("type") == "text"
    )


def item_completed(params: dict[str, Any]) -> ItemCompleted:
    """``item.completed`` of an ``item/completed`` notification: what its start said
    (``item_started``) and how it ended."""
    item = _dict(params.get("item"))
    started = item_started(params)
    done = ItemCompleted(**msgspec.structs.asdict(started))
    replace = msgspec.structs.replace
    match started.type:
        case "agentMessage" | "plan":
            return replace(done, text=str(item.get("text") or ""))
        case "userMessage":
            return replace(done, text=user_text(item.get("content")))
        case "reasoning":
            return replace(done, text="\n\n".join(str(s) for s in _list(item.get("summary"))))
        case "commandExecution":
            return replace(
                done,
                status=_str(item.get("status")),
                exit_code=_int(item.get("exitCode")),
                duration_ms=_int(item.get("durationMs")),
                output=bounded(item.get("aggregatedOutput")),
            )
        case "fileChange":
            return replace(done, status=_str(item.get("status")))
        case "mcpToolCall":
            return replace(
                done,
                status=_str(item.get("status")),
                result=bounded(item.get("result")),
                error=bounded(item.get("error")),
            )
        case "dynamicToolCall":
            return replace(
                done, status=_str(item.get("status")), result=bounded(item.get("contentItems"))
            )
        case _:
            return done


def item_started(params: dict[str, Any]) -> ItemStarted:
    """``item.started``: the item's identity and what it is about (a command, the
    files a change touches with their diffs, an MCP tool and its arguments), so a
    client can show a tool call before it ends; its outcome comes with
    ``item.completed`` (and streamed text with deltas)."""
    item = _dict(params.get("item"))
    started = ItemStarted(
        item_id=_str(item.get("id")) or "",
        turn_id=_str(params.get("turnId")),
        type=_str(item.get("type")) or "unknown",
    )
    replace = msgspec.structs.replace
    match started.type:
        case "agentMessage" | "plan" | "userMessage" | "reasoning":
            return started
        case "commandExecution":
            return replace(started, command=_str(item.get("command")), cwd=_str(item.get("cwd")))
        case "fileChange":
            changes = [_dict(c) for c in _list(item.get("changes"))]
            diff = "".join(str(c.get("diff") or "") for c in changes)
            return replace(
                started,
                changes=[
                    FileChange(
                        path=_str(c.get("path")),
                        kind=_str(_dict(c.get("kind")).get("type")),
                        move_path=_str(_dict(c.get("kind")).get("move_path")),
                        diff=bounded(c.get("diff")) if c.get("diff") else None,
                    )
                    for c in changes
                ],
                diff=bounded(diff) if diff else None,
            )
        case "mcpToolCall":
            return replace(
                started,
                server=_str(item.get("server")),
                tool=_str(item.get("tool")),
                arguments=bounded(item.get("arguments")),
            )
        case "dynamicToolCall":
            return replace(
                started, tool=_str(item.get("tool")), arguments=bounded(item.get("arguments"))
            )
        case _:
            rest = {
                k: v for k, v in item.items() if k not in ("id", "type", "status") and v is not None
            }
            return replace(started, detail=bounded(rest, MAX_DETAIL_BYTES) if rest else None)


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


def agent_error(error: Any, turn_id: str | None, will_retry: bool) -> AgentError:
    """``agent.error`` of a Codex ``TurnError``."""
    err = _dict(error)
    return AgentError(
        error_kind=error_kind(err),
        message=str(err.get("message") or "the agent reported an error"),
        turn_id=turn_id,
        will_retry=will_retry,
        details=_str(err.get("additionalDetails")) or None,
    )


def turn_completed(params: dict[str, Any]) -> TurnCompleted:
    """``turn.completed {turnId, outcome}``; a failed turn carries its error."""
    turn = _dict(params.get("turn"))
    status = turn.get("status")
    error = None
    if turn.get("error"):
        err = _dict(turn.get("error"))
        error = ErrorInfo(kind=error_kind(err), message=str(err.get("message") or ""))
    return TurnCompleted(
        turn_id=_str(turn.get("id")),
        outcome=_OUTCOMES.get(status, "unknown") if isinstance(status, str) else "unknown",
        error=error,
    )


def turn_plan(params: dict[str, Any]) -> TurnPlan:
    steps = [_dict(step) for step in _list(params.get("plan"))]
    return TurnPlan(
        turn_id=_str(params.get("turnId")),
        explanation=_str(params.get("explanation")),
        plan=[PlanStep(step=_str(s.get("step")), status=_str(s.get("status"))) for s in steps],
    )


def thread_status(params: dict[str, Any]) -> ThreadStatus:
    status = _dict(params.get("status"))
    return ThreadStatus(
        status=_str(status.get("type")) or "unknown",
        active_flags=[str(f) for f in _list(status.get("activeFlags"))],
    )


def usage_updated(params: dict[str, Any]) -> UsageUpdated:
    usage = _dict(params.get("tokenUsage"))
    return UsageUpdated(
        turn_id=_str(params.get("turnId")),
        total=_dict(usage.get("total")),
        last=_dict(usage.get("last")),
        model_context_window=_int(usage.get("modelContextWindow")),
    )


def agent_warning(method: str, params: dict[str, Any]) -> AgentWarning:
    """``agent.warning`` of ``warning``, ``configWarning``, ``deprecationNotice``."""
    return AgentWarning(
        source=method,
        message=_str(params.get("message")) or _str(params.get("summary")) or "",
        details=_str(params.get("details")) or None,
    )
