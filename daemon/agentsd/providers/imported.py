"""History of a conversation started outside the daemon, as journal events.

Rule 1 (bounded): an adopted conversation can be long. At most
``MAX_IMPORTED_MESSAGES`` of its latest messages are imported, each text cut at
``MAX_IMPORTED_TEXT_BYTES`` (``truncated`` marks a cut one); the rest stays with the
agent, which has it all.
"""

from __future__ import annotations

from agentsd_protocol.api.events import MessageImported

MAX_IMPORTED_MESSAGES = 2000  # a long day's conversation; the agent keeps the rest
MAX_IMPORTED_TEXT_BYTES = 64 * 1024  # a message's text as a client shows it


def imported(role: str, text: str, turn_id: str | None = None) -> MessageImported:
    """One message, its text bounded (Rule 1)."""
    data = text.encode()
    if len(data) <= MAX_IMPORTED_TEXT_BYTES:
        return MessageImported(role=role, text=text, turn_id=turn_id)
    head = data[:MAX_IMPORTED_TEXT_BYTES].decode(errors="ignore")
    return MessageImported(role=role, text=head, turn_id=turn_id, truncated=True)


def latest(messages: list[MessageImported]) -> list[MessageImported]:
    """The latest ``MAX_IMPORTED_MESSAGES`` of ``messages`` (Rule 1)."""
    return messages[-MAX_IMPORTED_MESSAGES:]
