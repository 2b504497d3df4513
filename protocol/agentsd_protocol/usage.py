"""Token usage as the agents report it (``usage.updated``), read the same way by the
daemon (``get``, the status feed) and by clients (the attach view). Pure."""

from __future__ import annotations

from typing import Any

from agentsd_protocol.api.events import UsageUpdated
from agentsd_protocol.api.session import TokenUsage


def _count(counts: dict[str, Any], key: str) -> int | None:
    value = counts.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def token_usage(event: UsageUpdated) -> TokenUsage:
    """The agent's counts read: the last turn's, every turn's, and the context.
    What the conversation holds is the last model call's tokens (``contextTokens``
    where the provider counts it apart: Claude Code sums a turn's calls), else the
    last turn's (Codex reports one call's)."""
    total, last = event.total, event.last
    window = event.model_context_window
    context = _count(last, "contextTokens")
    if context is None:
        context = _count(last, "totalTokens")
    left = None if window is None or context is None else max(window - context, 0)
    return TokenUsage(
        turn_tokens=_count(last, "totalTokens"),
        total_tokens=_count(total, "totalTokens"),
        input_tokens=_count(total, "inputTokens"),
        output_tokens=_count(total, "outputTokens"),
        context_window=window,
        context_tokens=context,
        context_left=left,
    )


def usage_line(tokens: TokenUsage) -> str | None:
    """``tokens`` in a few words (``turn 1.2k tokens, 35k in all, 82% of the context
    left (164k of 200k)``), or None when nothing was counted."""
    parts = []
    if tokens.turn_tokens is not None:
        parts.append(f"turn {_short(tokens.turn_tokens)} tokens")
    if tokens.total_tokens is not None:
        parts.append(f"{_short(tokens.total_tokens)} in all")
    if tokens.context_left is not None and tokens.context_window:
        share = round(100 * tokens.context_left / tokens.context_window)
        parts.append(
            f"{share}% of the context left ({_short(tokens.context_left)} of "
            f"{_short(tokens.context_window)})"
        )
    return ", ".join(parts) or None


def _short(n: int) -> str:
    if n < 1000:
        return str(n)
    if n < 10_000:
        return f"{n / 1000:.1f}k"
    if n < 1_000_000:
        return f"{n // 1000}k"
    return f"{n / 1_000_000:.1f}M"
