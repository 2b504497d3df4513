"""Handing journaled prompts, answers and interrupts to the agent: a send's, a
queued prompt's, a client's answer to an approval, a client's interrupt.

Rule 1 (write-ahead, ``handlers.conversation`` Rule 1): every prompt is journaled as
``submission`` before ``deliver`` hands it to the agent, and ``deliver`` journals
its dispatch outcome after.

Rule 2: a queued prompt is sent as a ``submission`` whose ``client_message_id`` is
its prompt id, committed under its claim (``agentsd.prompt_queue`` Rule 2), so it is
sent once whoever sends it: the session task when the running turn ended
(``drain_queue``), or a client (send-now, resume).

Rule 3 (keyed writes, ``handlers.conversation`` Rules 2 and 3): a committed answer,
or a committed ``interrupt.requested``, is written keyed with its seq in the journal
(``agentsd.holder_link`` Rule 5: a key of the daemon's making, a few bytes, whatever
the agent named its question or turn), and when the adapter writes nothing for it
(the agent withdrew the question, or it asks the next one of a form; the adapter
saw no turn to interrupt) an empty write carries the key alone: either way the
holder's last key says it was handled, and a daemon taking over writes it only
when it was not (``agentsd.reattach`` Rule 2).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import trio

from agentsd.holder_link import keyed
from agentsd.prompt_queue import QueuedPrompt
from agentsd.providers.base import Adapter, Dispatch, FileInput, ImageInput, LineLink, Submission
from agentsd_protocol.api import conversation as api
from agentsd_protocol.api.conversation import Attachment
from agentsd_protocol.api.events import Submission as SubmissionEvent
from agentsd_protocol.api.events import SubmissionDispatched
from agentsd_protocol.errors import PromptNotQueued, RpcError, StorageUnavailable

if TYPE_CHECKING:
    from agentsd.session import Session
    from agentsd.supervisor import Supervisor

log = logging.getLogger(__name__)


async def deliver(
    supervisor: Supervisor,
    session: Session,
    cmid: str,
    text: str,
    attachments: Sequence[Attachment] = (),
) -> Dispatch:
    """Start the agent if needed (resuming natively), hand it the journaled
    submission ``cmid`` (with its images read back from the session's copies:
    ``agentsd.attachments`` Rule 2), and journal the outcome."""
    try:
        inputs: tuple[ImageInput | FileInput, ...] = ()
        if attachments:
            inputs = await trio.to_thread.run_sync(supervisor.blobs.inputs, session.id, attachments)
        await supervisor.start(session)
        task = session.task
        adapter = None if task is None else task.adapter
        if adapter is None:
            dispatch = Dispatch(outcome="rejected", reason="the agent stopped before delivery")
        else:
            submission = Submission(client_message_id=cmid, text=text, inputs=inputs)
            dispatch = await adapter.send(submission)
    except RpcError as exc:
        dispatch = Dispatch(outcome="rejected", reason=f"{exc.kind}: {exc.message}")
    dispatched = SubmissionDispatched(
        client_message_id=cmid,
        outcome=dispatch.outcome,
        reason=dispatch.reason,
        turn_id=dispatch.turn_id,
    )
    try:
        await session.journal.append([dispatched])
    except StorageUnavailable as exc:
        # The submission is durable and the agent may have it: an error reply now
        # would invite a retry that sends it twice. Its outcome stays unjournaled, so
        # the journal settles it ``unknown`` when its child ends (as after a crash).
        log.warning("session %s: outcome of %s not journaled: %s", session.id, cmid, exc.message)
        reason = f"its outcome could not be journaled ({exc.message})"
        if dispatch.reason:
            reason = f"{dispatch.reason}; {reason}"
        dispatch = Dispatch(outcome=dispatch.outcome, reason=reason, turn_id=dispatch.turn_id)
    if session.task is not None:
        session.task.touch()
    return dispatch


async def deliver_answer(
    adapter: Adapter, link: LineLink | None, native_id: str, seq: int, decision: str
) -> None:
    """Write the answer journaled at ``seq`` to the agent through ``adapter`` (Rule
    3; ``link``: the adapter's, for the key alone). Raises
    ``trio.BrokenResourceError`` or ``trio.ClosedResourceError`` when the agent is
    gone."""
    with keyed(str(seq)) as key:
        await adapter.answer_approval(native_id, decision)
        if not key.written and link is not None:
            await link.send_raw(b"")


async def deliver_interrupt(
    adapter: Adapter,
    link: LineLink | None,
    turn_id: str | None,
    seq: int,
    *,
    confirm: bool = True,
    on_written: Callable[[], None] | None = None,
) -> bool:
    """Interrupt ``turn_id`` through ``adapter``, keyed with the seq of its
    ``interrupt.requested`` (Rule 3; ``link``: the adapter's, for the key alone);
    ``confirm`` as ``Adapter.interrupt``; ``on_written`` as ``keyed``'s, called
    before the agent's confirmation is waited for. Whether the agent took it.
    Raises ``trio.BrokenResourceError`` or ``trio.ClosedResourceError`` when the
    agent is gone."""
    with keyed(str(seq), on_written) as key:
        interrupted = await adapter.interrupt(turn_id, confirm=confirm)
        if not key.written and link is not None:
            await link.send_raw(b"")
    return interrupted


def send_result(cmid: str, seq: int, dispatch: Dispatch) -> api.SendResult:
    return api.SendResult(
        client_message_id=cmid,
        seq=seq,
        dispatch=dispatch.outcome,
        reason=dispatch.reason,
        turn_id=dispatch.turn_id,
    )


async def send_queued(supervisor: Supervisor, session: Session, prompt_id: str) -> api.SendResult:
    """Send the queued prompt ``prompt_id`` now (Rule 2). Raises ``PromptNotQueued``
    when it is gone or claimed, ``Draining`` while the daemon drains (it stays
    queued), and what the journal raises (then it stays queued)."""
    with supervisor.gate.admit():
        prompt = session.queue.claim(prompt_id)
        if prompt is None:
            raise PromptNotQueued(f"prompt {prompt_id} is not queued", promptId=prompt_id)
        try:
            stored = await session.journal.append([_submission(prompt)])
        finally:
            session.queue.release(prompt_id)
        dispatch = await deliver(
            supervisor, session, prompt.prompt_id, prompt.text, prompt.attachments
        )
    return send_result(prompt.prompt_id, stored[0].seq, dispatch)


def _submission(prompt: QueuedPrompt) -> SubmissionEvent:
    return SubmissionEvent(
        client_message_id=prompt.prompt_id,
        text=prompt.text,
        operation_id=prompt.operation_id,
        attachments=prompt.attachments,
    )


async def send_due(supervisor: Supervisor, session: Session) -> api.SendResult | None:
    """Send the queue's head if it is due (``Session.queue_due``); None if not, or
    while the daemon drains (``agentsd.drain`` Rule 1)."""
    if supervisor.gate.draining or not session.queue_due():
        return None
    head = session.queue.head()
    if head is None:
        return None
    return await send_queued(supervisor, session, head.prompt_id)


async def drain_queue(supervisor: Supervisor, session: Session) -> None:
    """The session task's part: send queued prompts while one is due, until one is
    not accepted (it started no turn to wait for; the next commit wakes this
    again). A journal that refuses leaves the prompt queued."""
    while True:
        try:
            sent = await send_due(supervisor, session)
        except (PromptNotQueued, StorageUnavailable) as exc:
            log.warning("session %s: queued prompt not sent: %s", session.id, exc.message)
            return
        if sent is None or sent.dispatch != "accepted":
            return
