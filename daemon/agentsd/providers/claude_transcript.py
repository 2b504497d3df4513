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

import errno
import json
import os
import re
import stat
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from agentsd.providers.imported import MAX_IMPORTED_MESSAGES, imported, latest
from agentsd_protocol.api.events import MessageImported

MAX_TRANSCRIPT_BYTES = 256 * 1024 * 1024  # read at most this much of a transcript
MAX_LINE_BYTES = 16 * 1024 * 1024  # a line with a big tool result; longer ones are skipped
SKIP_CHUNK_BYTES = 1024 * 1024  # how much of a skipped line is read at a time
_NOT_SLUG = re.compile(r"[^A-Za-z0-9]")


def project_slug(cwd: str) -> str:
    """The name of the directory Claude Code keeps ``cwd``'s transcripts in."""
    return _NOT_SLUG.sub("-", cwd)


def transcript_history(path: Path) -> list[MessageImported]:
    """The user prompts and assistant text of a transcript, oldest first (bounded:
    ``agentsd.providers.imported`` Rule 1). Blocking: run it in a worker thread.
    Raises ``OSError`` when it cannot be read or is not a regular file: the agent
    writes under its config dir and could leave a symlink to ``/dev/zero`` or a FIFO
    there. A line longer than ``MAX_LINE_BYTES`` is skipped unread, and reading
    stops after ``MAX_TRANSCRIPT_BYTES``: memory stays bounded whatever the file."""
    messages: deque[MessageImported] = deque(maxlen=MAX_IMPORTED_MESSAGES)
    last_assistant_id: object = None
    with _open_regular(path) as f:
        for raw in _lines(f):
            line = _decode(raw)
            if line is None:
                continue
            role, text, message_id = line
            if role == "assistant" and message_id is not None and message_id == last_assistant_id:
                previous = messages.pop()
                text = previous.text + "\n\n" + text if previous.text else text
            last_assistant_id = message_id if role == "assistant" else None
            messages.append(imported(role, text))
    return latest(list(messages))


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file, not through a symlink;
    O_NONBLOCK so that a FIFO cannot hang the open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symbolic link, not a regular file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "it is not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _lines(f: BinaryIO) -> Iterator[bytes]:
    """The file's lines of at most ``MAX_LINE_BYTES`` within its first
    ``MAX_TRANSCRIPT_BYTES``; a longer line is read through in bounded pieces and
    dropped."""
    total = 0
    while total < MAX_TRANSCRIPT_BYTES:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        total += len(raw)
        if total > MAX_TRANSCRIPT_BYTES:
            return  # a line that crosses the bound is not taken
        if len(raw) <= MAX_LINE_BYTES:
            yield raw
            continue
        while total < MAX_TRANSCRIPT_BYTES and not raw.endswith(b"\n"):
            raw = f.readline(SKIP_CHUNK_BYTES)  # the rest of the over-long line
            if not raw:
                return
            total += len(raw)


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
