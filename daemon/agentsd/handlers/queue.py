"""``agentSession.queue``: the prompts held behind the running turn
(``agentsd.prompt_queue``): list them, withdraw, edit or send one now, resume a
paused queue. Each prompt has one fate: whoever claims it first acts, a later client
gets ``prompt_not_queued``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentsd.delivery import send_due, send_queued
from agentsd.handlers.conversation import MAX_PROMPT_BYTES
from agentsd.prompt_queue import QueuedPrompt
from agentsd_protocol.api import conversation as api
from agentsd_protocol.api.events import PromptEdited, PromptWithdrawn, QueueResumed
from agentsd_protocol.errors import InvalidParams, PromptNotQueued

if TYPE_CHECKING:
    from agentsd.connection import Call
    from agentsd.session import Session


def _info(prompt: QueuedPrompt) -> api.QueuedPromptInfo:
    return api.QueuedPromptInfo(
        prompt_id=prompt.prompt_id,
        text=prompt.text,
        seq=prompt.seq,
        attachments=prompt.attachments,
    )


def _claim(session: Session, prompt_id: str | None, action: str) -> QueuedPrompt:
    if prompt_id is None:
        raise InvalidParams(f"Invalid params: {action} needs promptId")
    prompt = session.queue.claim(prompt_id)
    if prompt is None:
        raise PromptNotQueued(
            f"prompt {prompt_id} is not queued (it was sent or withdrawn, or another "
            "client is acting on it)",
            promptId=prompt_id,
        )
    return prompt


async def handle_queue(call: Call, params: api.QueueParams) -> api.QueueResult:
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    withdrawn: api.QueuedPromptInfo | None = None
    sent: api.SendResult | None = None
    match params.action:
        case "list":
            pass
        case "withdraw":
            prompt = _claim(session, params.prompt_id, "withdraw")
            try:
                await session.journal.append([PromptWithdrawn(prompt_id=prompt.prompt_id)])
            finally:
                session.queue.release(prompt.prompt_id)
            withdrawn = _info(prompt)
        case "edit":
            text = params.text
            if text is None or not text.strip():
                raise InvalidParams("Invalid params: edit needs a non-empty text")
            if len(text.encode()) > MAX_PROMPT_BYTES:
                raise InvalidParams(f"Invalid params: text longer than {MAX_PROMPT_BYTES} bytes")
            prompt = _claim(session, params.prompt_id, "edit")
            try:
                await session.journal.append([PromptEdited(prompt_id=prompt.prompt_id, text=text)])
            finally:
                session.queue.release(prompt.prompt_id)
        case "sendNow":
            if params.prompt_id is None:
                raise InvalidParams("Invalid params: sendNow needs promptId")
            sent = await send_queued(supervisor, session, params.prompt_id)
        case "resume":
            if session.queue.paused is not None:
                await session.journal.append([QueueResumed()])
            # With an agent serving, the commit woke its task to send the head; without
            # one, nothing would: send it here (starting the agent).
            if session.task is None:
                sent = await send_due(supervisor, session)
    queue = session.queue
    return api.QueueResult(
        prompts=[_info(p) for p in queue.prompts.values()],
        paused=queue.paused,
        withdrawn=withdrawn,
        sent=sent,
    )


HANDLERS: dict[str, Any] = {"agentSession.queue": handle_queue}
