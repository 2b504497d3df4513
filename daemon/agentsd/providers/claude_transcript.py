"""Claude Code's transcript of a session, for adopting one started outside the
daemon: where it lives for a cwd, and its messages as ``message.imported`` events.

Facts (Claude Code 2.1.197 and 2.1.332): the transcript is
``<config dir>/projects/<cwd with every character but [A-Za-z0-9] as "-">/<id>.jsonl``,
one JSON object a line. Conversation lines have ``type`` ``user`` or ``assistant``
and a ``message`` in the Messages API's shape; an assistant message is written one
line per content block, under the same ``message.id``. ``isMeta`` and
``isSidechain`` lines are not the conversation the user saw; a user line whose
content holds only ``tool_result`` blocks is a tool's answer, not a prompt. Other
line types (``attachment``, ``queue-operation``, ``api-request*``, ``last-prompt``,
...) are bookkeeping.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agentsd.providers.imported import imported, latest
from agentsd_protocol.api.events import MessageImported

MAX_TRANSCRIPT_BYTES = 256 * 1024 * 1024  # read at most this much of a transcript
_NOT_SLUG = re.compile(r"[^A-Za-z0-9]")


def project_slug(cwd: str) -> str:
    """The name of the directory Claude Code keeps ``cwd``'s transcripts in."""
    return _NOT_SLUG.sub("-", cwd)


def transcript_history(path: Path) -> list[MessageImported]:
    """The user prompts and assistant text of a transcript, oldest first (bounded:
    ``agentsd.providers.imported`` Rule 1). Blocking: run it in a worker thread.
    Raises ``OSError`` when it cannot be read."""
    messages: list[MessageImported] = []
    last_assistant_id: object = None
    with path.open("rb") as f:
        for raw in f:
            if f.tell() > MAX_TRANSCRIPT_BYTES:
                break
            line = _decode(raw)
            if line is None:
                continue
            role, text, message_id = line
            if role == "assistant" and message_id is not None and message_id == last_assistant_id:
                previous = messages.pop()
                text = previous.text + "\n\n" + text if previous.text else text
            last_assistant_id = message_id if role == "assistant" else None
            messages.append(imported(role, text))
    return latest(messages)


def _decode(raw: bytes) -> tuple[str, str, object] | None:
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(entry, dict) or entry.get("type") not in ("user", "assistant"):
        return None
    if entry.get("isMeta") or entry.get("isSidechain"):
        return None
    message = entry.get("message")
    if not isinstance(message, dict):
        return None
    text = _text(message.get("content"))
    if not text:
        return None
    return str(entry["type"]), text, message.get("id")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n\n".join(
        str(block.get("text"))
        for block in content
        if isinstance(block, dict) and block.get("type") == "text" and block.get("text")
    )
