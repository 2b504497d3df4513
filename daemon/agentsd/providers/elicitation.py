"""MCP elicitations relayed by an agent, as approvals (pure).

An MCP server the user configured may ask the user something through the agent:
Codex sends ``mcpServer/elicitation/request`` and Claude Code an ``elicitation``
control request. Both carry the server's name, a ``message``, a ``mode`` (``form``
with a JSON ``requestedSchema``, or ``url`` with a ``url`` to open) and answer
``{action: accept | decline | cancel, content}``; Codex's MCP tool-call approvals
come this way too (a form with no fields).

Rule 1: the approval API answers with one word, so an elicitation is asked only
when accepting needs no typed content: a URL, or a form without required fields
(accepted with no content). One that needs content is declined at once, and the
agent carries on without it; the warning journaled with it says what was asked.

Rule 2: ``accept`` and ``decline`` are offered; ``cancel`` (any client may answer
it) is the MCP ``cancel``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

OPTIONS = ["accept", "decline"]
MAX_DETAIL_CHARS = 8 * 1024  # an approval shows the question, not a whole schema
_encoder = msgspec.json.Encoder()


def answerable(mode: Any, schema: Any) -> bool:
    """Whether ``accept`` is a full answer (Rule 1)."""
    if mode == "url":
        return True
    if not isinstance(schema, Mapping):
        return True  # nothing is asked for
    required = schema.get("required")
    return not (isinstance(required, list) and required)


def describe(server: Any, message: Any, mode: Any, url: Any, schema: Any) -> tuple[str, str]:
    """Title and detail of the approval: who asks, what, and what accepting does."""
    name = server if isinstance(server, str) and server else "an MCP server"
    text = message if isinstance(message, str) and message else "asks for your input"
    lines = [text]
    if mode == "url" and isinstance(url, str):
        lines.append(f"open {url}; accept once done there")
    elif isinstance(schema, Mapping) and schema.get("properties"):
        lines.append(f"fields (accept leaves them empty): {_encoder.encode(schema).decode()}")
    detail = "\n".join(lines)
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[:MAX_DETAIL_CHARS] + "..."
    return f"{name}: {text}"[:MAX_DETAIL_CHARS], detail


def result(decision: str, mode: Any) -> dict[str, Any]:
    """The elicitation's answer for a committed ``decision`` (anything but
    ``accept`` and ``decline`` is ``cancel``); a form accepted carries no fields."""
    if decision == "accept":
        return {"action": "accept"} if mode == "url" else {"action": "accept", "content": {}}
    return {"action": decision if decision == "decline" else "cancel"}
