"""A session's queue of prompts held behind the running turn, derived from its
journal.

Rule 1: the queue is a reducer over journal events (``PromptQueue.apply``), fed by
the session's journal port after each commit, and rebuilt at load from every event
of ``QUEUE_KINDS`` (a queue outlives the child that ran when it was filled, so the
tail since the last child exit is not enough). A prompt leaves the queue when it is
withdrawn, or sent: its ``submission`` carries the prompt's id as its
``client_message_id``.

Rule 2 (one fate): a queued prompt is claimed synchronously (no await between the
check and the claim) by whoever withdraws, edits or sends it, the claim is held
while its event commits, and released after. A second client finds it claimed or
gone and gets ``prompt_not_queued``: two clients racing on one prompt resolve it
once.

Rule 3 (never on its own after a restart): the daemon pauses a non-empty queue at
load (``queue.paused``, reason ``daemon-restart``), and an interrupt pauses it
(reason ``interrupted``); a paused queue is sent from only when a client resumes it
or sends a prompt now. A queue that empties is no longer paused.
"""

from __future__ import annotations

import sqlite3

import attrs

from agentsd.store.journal import events_of_kinds
from agentsd_protocol.api.conversation import Attachment
from agentsd_protocol.api.events import (
    Event,
    PromptEdited,
    PromptQueued,
    PromptWithdrawn,
    QueuePaused,
    QueueResumed,
    Submission,
    UnknownEvent,
    decode_event,
    kind_of,
)

QUEUE_KINDS = tuple(
    kind_of(t)
    for t in (PromptQueued, PromptEdited, PromptWithdrawn, QueuePaused, QueueResumed, Submission)
)


@attrs.define
class QueuedPrompt:
    prompt_id: str
    text: str
    seq: int  # of its ``prompt.queued``
    operation_id: str | None = None
    attachments: list[Attachment] = attrs.field(factory=list)  # images and files, kept as sent


@attrs.define
class PromptQueue:
    """The prompts waiting, in the order they are sent, and whether the queue is
    paused (with why)."""

    prompts: dict[str, QueuedPrompt] = attrs.field(factory=dict)
    paused: str | None = None  # the reason, while paused
    # Prompt ids claimed by a withdraw, edit or send in flight (Rule 2).
    claims: set[str] = attrs.field(factory=set)

    def apply(self, seq: int, event: Event | UnknownEvent) -> None:
        match event:
            case PromptQueued():
                self.prompts[event.prompt_id] = QueuedPrompt(
                    prompt_id=event.prompt_id,
                    text=event.text,
                    seq=seq,
                    operation_id=event.operation_id,
                    attachments=event.attachments,
                )
            case PromptEdited(prompt_id=prompt_id, text=text):
                prompt = self.prompts.get(prompt_id)
                if prompt is not None:
                    prompt.text = text
            case PromptWithdrawn(prompt_id=prompt_id):
                self._remove(prompt_id)
            case Submission(client_message_id=cmid):
                self._remove(cmid)
            case QueuePaused(reason=reason):
                if self.prompts:
                    self.paused = reason
            case QueueResumed():
                self.paused = None
            case _:
                pass

    def _remove(self, prompt_id: str) -> None:
        if self.prompts.pop(prompt_id, None) is not None and not self.prompts:
            self.paused = None

    def claim(self, prompt_id: str) -> QueuedPrompt | None:
        """Claim a queued prompt (Rule 2); None when it is gone or claimed."""
        prompt = self.prompts.get(prompt_id)
        if prompt is None or prompt_id in self.claims:
            return None
        self.claims.add(prompt_id)
        return prompt

    def release(self, prompt_id: str) -> None:
        self.claims.discard(prompt_id)

    def head(self) -> QueuedPrompt | None:
        """The next prompt to send on its own, unless paused or it is claimed."""
        if self.paused is not None or not self.prompts:
            return None
        prompt = next(iter(self.prompts.values()))
        return None if prompt.prompt_id in self.claims else prompt


def derive_queue(conn: sqlite3.Connection, session_id: str) -> PromptQueue:
    """The session's queue, replayed from its journal (Rule 1)."""
    queue = PromptQueue()
    for seq, kind, body in events_of_kinds(conn, session_id, QUEUE_KINDS):
        queue.apply(seq, decode_event(kind, body))
    return queue
