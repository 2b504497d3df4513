"""Claude Code stream-json frames as journal events (pure: no I/O).

The adapter in ``claude_adapter`` reads frames and keeps the turn's state; this
module decides what a frame means for the journal. Every function takes decoded
JSON and returns events of ``agentsd_protocol.api.events`` (or their parts), so it is
tested without a child process.

Rule 1: what a client needs to render the conversation is kept (message text, tool
name, input and output, outcome); payloads that can grow without bound (tool input
and output) go through ``bounded_payload``.

Rule 2: values the protocol does not promise are never trusted: a missing field is
``None``, and a result that is not plainly a success is never reported as one.

Error kinds match the Codex provider's, so clients switch on one vocabulary:
``auth_refused`` (the model server refused the credentials), ``model_unreachable``
(no HTTP answer at all), ``model_http_error`` (any other HTTP error status), and
``agent_error`` (the CLI failed on its own: turn limit, execution error).
"""

from __future__ import annotations

from typing import Any

import msgspec

from agentsd.providers.base import journal_payload
from agentsd_protocol.api.events import (
    AgentError,
    BoundedPayload,
    ErrorInfo,
    TurnCompleted,
    UsageUpdated,
)

MAX_OUTPUT_BYTES = 64 * 1024  # per tool output: the head a reader needs, not a log file
MAX_INPUT_BYTES = 16 * 1024  # per tool input: a Write of a whole file is cut here
AUTH_STATUSES = frozenset({401, 403})
AUTH_ERRORS = frozenset({"authentication_failed", "authentication_error", "oauth_org_not_allowed"})

_encoder = msgspec.json.Encoder()


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def text_of(content: Any) -> str:
    """The text of a message's or a tool result's content: a string as is, the
    ``text`` of every text block of a list (nested tool-result content included)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in _list(content):
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif "content" in block:
            parts.append(text_of(block["content"]))
    return "".join(parts)


# -- tools -----------------------------------------------------------------------------


def tool_input(value: Any) -> tuple[Any, bool]:
    """The ``input`` of a tool item and whether it was cut: the input as the model
    wrote it, or when its JSON is over ``MAX_INPUT_BYTES`` the bounded JSON text."""
    data = _encoder.encode(value)
    if len(data) <= MAX_INPUT_BYTES:
        return value, False
    return journal_payload(data, MAX_INPUT_BYTES), True


def tool_status(block: dict[str, Any], meta: Any) -> str:
    """``completed``, ``failed`` or ``declined`` (a person or a rule refused it)."""
    tool_use_id = block.get("tool_use_id")
    for entry in _list(meta):
        entry = _dict(entry)
        decision = _dict(entry.get("permission_decision")).get("decision")
        if entry.get("id") == tool_use_id and decision == "reject":
            return "declined"
    return "failed" if block.get("is_error") else "completed"


def tool_output(block: dict[str, Any]) -> BoundedPayload:
    """A tool result's output, bounded."""
    return journal_payload(text_of(block.get("content")), MAX_OUTPUT_BYTES)


def tool_results(frame: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``tool_result`` blocks of a ``user`` frame (the CLI's report of a tool)."""
    content = _dict(frame.get("message")).get("content")
    return [
        block
        for block in _list(content)
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]


# -- failures --------------------------------------------------------------------------


def error_kind(
    status: Any, error: Any = None, api_error: Any = None, api_error_type: Any = None
) -> str:
    """The stable kind of a model-call failure (see the module docstring).

    ``status`` is the HTTP status (None when no answer came); ``error`` the CLI's
    classification (``authentication_failed``, ``server_error``, ``unknown``, ...);
    ``api_error`` its transport verdict (``connection_failed``); ``api_error_type``
    the API's error type."""
    status_code = _int(status)
    if status_code in AUTH_STATUSES or error in AUTH_ERRORS or api_error_type in AUTH_ERRORS:
        return "auth_refused"
    if status_code is not None:
        return "model_http_error"
    if api_error == "connection_failed" or error in ("unknown", "connection_error"):
        return "model_unreachable"
    return "agent_error"


def retry_error(frame: dict[str, Any], turn_id: str | None) -> AgentError:
    """``agent.error`` of a ``system/api_retry`` frame: the model call failed and the
    CLI will try again after a delay."""
    status = _int(frame.get("error_status"))
    what = f"HTTP {status}" if status is not None else "no answer"
    attempt = _int(frame.get("attempt"))
    most = _int(frame.get("max_retries"))
    return AgentError(
        error_kind=error_kind(frame.get("error_status"), frame.get("error")),
        message=f"the model call failed ({what}, {frame.get('error')}); "
        f"retry {attempt} of {most} in {_int(frame.get('retry_delay_ms'))} ms",
        turn_id=turn_id,
        will_retry=True,
        attempt=attempt,
        max_retries=most,
        status=status,
    )


def is_auth_retry(frame: dict[str, Any]) -> bool:
    return error_kind(frame.get("error_status"), frame.get("error")) == "auth_refused"


def result_error_text(result: dict[str, Any]) -> str:
    """The most telling text of a failed ``result``: ``errors[]``, else ``result``
    (where an API failure puts its prose), else the subtype."""
    errors = [e for e in _list(result.get("errors")) if isinstance(e, str) and e.strip()]
    if errors:
        return "; ".join(errors)
    text = _str(result.get("result"))
    if text and text.strip():
        return text.strip()
    status = _int(result.get("api_error_status"))
    if status is not None:
        return f"API error (HTTP {status})"
    return _str(result.get("subtype")) or "the agent reported an error"


def turn_completed(
    result: dict[str, Any],
    turn_id: str | None,
    *,
    interrupt_requested: bool,
    failure: ErrorInfo | None,
) -> TurnCompleted:
    """``turn.completed {turnId, outcome}`` of a ``result`` frame.

    ``success`` without ``is_error`` is ``completed``. An error after a client's
    interrupt is ``interrupted``. ``failure`` (a failure the adapter diagnosed itself
    before the result, such as refused credentials) wins over both readings. Any
    other error is ``failed`` with ``error {kind, message}``; an API failure arrives
    as ``subtype: success`` with ``is_error: true``, so ``is_error`` decides."""
    is_error = result.get("is_error") is not False or result.get("subtype") != "success"
    cost = result.get("total_cost_usd")
    done = TurnCompleted(
        turn_id=turn_id,
        outcome="completed",
        duration_ms=_int(result.get("duration_ms")),
        num_turns=_int(result.get("num_turns")),
        cost_usd=cost if isinstance(cost, int | float) and not isinstance(cost, bool) else None,
    )
    replace = msgspec.structs.replace
    if failure is not None:
        return replace(done, outcome="failed", error=failure)
    if not is_error:
        return done
    if interrupt_requested:
        return replace(done, outcome="interrupted")
    has_api_error = (
        result.get("api_error_status") is not None or result.get("api_error") is not None
    )
    kind = (
        error_kind(
            result.get("api_error_status"),
            None,
            result.get("api_error"),
            result.get("api_error_type"),
        )
        if has_api_error
        else "agent_error"
    )
    return replace(
        done, outcome="failed", error=ErrorInfo(kind=kind, message=result_error_text(result))
    )


def usage_updated(
    frame: dict[str, Any], turn_id: str | None, total: dict[str, int], context_tokens: int | None
) -> UsageUpdated:
    """``usage.updated`` of a turn's ``result``: its ``usage`` (the turn's tokens,
    every model call summed) in Codex's names, added into ``total`` (the agent's
    since it started), the context window of the model it used (``modelUsage``),
    and ``context_tokens``: what the turn's last model call read and wrote."""
    usage = _dict(frame.get("usage"))
    read = sum(
        _int(usage.get(key)) or 0
        for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    written = _int(usage.get("output_tokens")) or 0
    last = {"inputTokens": read, "outputTokens": written, "totalTokens": read + written}
    if context_tokens is not None:
        last["contextTokens"] = context_tokens
    for key in ("inputTokens", "outputTokens", "totalTokens"):
        total[key] = total.get(key, 0) + last[key]
    windows = [
        _int(_dict(model).get("contextWindow")) for model in _dict(frame.get("modelUsage")).values()
    ]
    window = max((w for w in windows if w), default=None)
    return UsageUpdated(turn_id=turn_id, total=dict(total), last=last, model_context_window=window)


def call_context_tokens(message: Any) -> int | None:
    """What one model call read and wrote (an ``assistant`` frame's ``usage``): the
    size of the conversation as of that call."""
    usage = _dict(_dict(message).get("usage"))
    if not usage:
        return None
    return sum(
        _int(usage.get(key)) or 0
        for key in (
            "input_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "output_tokens",
        )
    )
