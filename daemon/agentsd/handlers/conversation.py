"""``agentSession.send/interrupt/respond``: talking to the agent.

Delivery (``api.SendParams``): a prompt sent while a turn runs steers it (the
default), waits in the queue (``agentsd.prompt_queue``) or interrupts the turn and
then starts the next one. An interrupt pauses a non-empty queue: nothing the user
queued is sent on its own after they stopped the agent, and nothing is withdrawn
either.

Rule 1 (write-ahead): a prompt is journaled as ``submission`` (with the ledger's
provisional entry, in one commit) before the agent sees it; its dispatch outcome
(``accepted``, ``rejected``, ``unknown``) is journaled after. A submission whose
outcome was never journaled is settled ``unknown`` when its child ends or at
recovery, and is never re-sent unless a client asks with ``retryUnknown``.

Rule 2 (first answer wins): an approval is claimed synchronously (no await between
the check and the claim), then its resolution is committed, then delivered. Later
answers get ``already_resolved`` with the winner. The commit and the delivery run
under one shield (bounded by ``ANSWER_DELIVERY_S``): a client that hangs up, or a
restart that cancels the connections before it hands the agents over, cannot leave
an answer committed and never written to the agent, which would wait for it for
ever. The answers of one session are committed and written one at a time
(``Session.keyed_writes``, shared with interrupts: Rule 3), each write keyed with
the answer's seq (``agentsd.delivery`` Rule 3), so that a daemon killed between the
commit and the write leaves the holder's last key behind the journal's last answer,
and the daemon that takes the agent over writes the answer then
(``agentsd.reattach`` Rule 2).

Rule 3 (an interrupt is kept like an answer): ``interrupt.requested`` is committed,
then the interrupt is written keyed with its seq, under the same shield (bounded by
``INTERRUPT_DELIVERY_S``) and the same per-session lock as answers, so the journal's
order of all keyed writes is the order the holder took them. The lock is given back
once the interrupt is written, before the agent confirms it (Codex and Claude do
once the turn stopped); once it has the lock, an interrupt whose turn ended
meanwhile journals and writes nothing. A daemon killed between
the commit and the write leaves the journal saying the user stopped the turn: the
daemon that takes the agent over writes the interrupt then, if that turn is still
the open one (``agentsd.reattach`` Rule 2), instead of letting the turn run on.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from agentsd.attachments import Prepared, block_types, prepare
from agentsd.delivery import deliver, deliver_answer, deliver_interrupt, send_result
from agentsd.operations import Provisional
from agentsd.providers.base import Dispatch
from agentsd.session import Session
from agentsd.store.journal import StoredEvent
from agentsd_protocol.api import conversation as api
from agentsd_protocol.api.events import (
    ApprovalResolved,
    Event,
    InterruptRequested,
    PromptQueued,
    QueuePaused,
    SessionUpdated,
    SubmissionDispatched,
    body_fields,
)
from agentsd_protocol.api.events import Submission as SubmissionEvent
from agentsd_protocol.display import excerpt
from agentsd_protocol.errors import (
    AlreadyResolved,
    ApprovalNotFound,
    ContentUnsupported,
    InvalidParams,
    InvalidState,
    SessionNotFound,
    StorageUnavailable,
)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from agentsd.connection import Call

MAX_PROMPT_BYTES = 1024 * 1024  # a prompt is typed or pasted; files go through the agent's tools
AUTO_TITLE_CHARS = 80  # a title taken from a prompt: what a listing's column shows
INTERRUPT_WAIT_S = 15.0  # an interrupted turn ends within a second; past this it is stuck
ANSWER_DELIVERY_S = 10.0  # commit and write of an answer (Rule 2): milliseconds when healthy
# Commit and write of an interrupt (Rule 3), past the adapters' own wait (10 s) for
# the agent to confirm it.
INTERRUPT_DELIVERY_S = 15.0


async def handle_send(call: Call, params: api.SendParams) -> api.SendResult:
    """Check and keep the prompt's images and files (``agentsd.attachments``),
    journal the prompt, then deliver it by ``params.delivery`` (``api.SendParams``);
    the session's first prompt names an untitled session. A draining daemon refuses
    it before journaling (``agentsd.drain`` Rule 1). A session deleted after the
    lookup raises ``SessionNotFound``, with nothing of the prompt left."""
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    with supervisor.gate.admit():
        try:
            return await _send(call, session, params)
        except SessionNotFound:
            if supervisor.sessions.get(session.id) is not session:
                # Deleted after the lookup (``agentsd.session_journal`` Rule 4): the
                # images the prompt kept may have come after the delete's clean-up.
                await trio.to_thread.run_sync(supervisor.blobs.drop, session.id)
            raise


async def _send(call: Call, session: Session, params: api.SendParams) -> api.SendResult:
    supervisor = call.app.supervisor
    if params.retry_unknown:
        return await _retry_unknown(call, session, params)
    prompt = await _prepare(call, session, params)
    if params.delivery == "interrupt" and session.conversation.turn_open:
        await _interrupt_for(session, prompt.text)
    convo = session.conversation
    if params.delivery == "queue" and (
        convo.turn_open or convo.undispatched or session.queue.prompts
    ):
        return await _enqueue(call, session, prompt)
    cmid = uuid.uuid4().hex
    operation = call.operation
    submission = SubmissionEvent(
        client_message_id=cmid,
        text=prompt.text,
        operation_id=None if operation is None else operation.op_id,
        attachments=prompt.attachments,
    )

    provisional = None
    if operation is not None:
        pending = Dispatch(outcome="unknown", reason="delivery not confirmed yet")
        provisional = Provisional(
            operation, lambda stored: send_result(cmid, stored[0].seq, pending)
        )
    stored = await _journal_prompt(session, submission, prompt.text, provisional)
    dispatch = await deliver(supervisor, session, cmid, prompt.text, prompt.attachments)
    return send_result(cmid, stored[0].seq, dispatch)


async def _prepare(call: Call, session: Session, params: api.SendParams) -> Prepared:
    """The prompt of ``params`` with its blocks checked against the provider, its
    images read and kept (``agentsd.attachments`` Rules 1 and 2). Raises
    ``InvalidParams``, ``ContentUnsupported`` or ``AttachmentRefused``; then nothing
    was journaled."""
    if len(params.text.encode()) > MAX_PROMPT_BYTES:
        raise InvalidParams(f"Invalid params: text longer than {MAX_PROMPT_BYTES} bytes")
    if not params.content:
        if not params.text:
            raise InvalidParams("Invalid params: a prompt needs text or content")
        return Prepared(text=params.text, attachments=[], images={})
    supervisor = call.app.supervisor
    provider = supervisor.provider(session.row.provider)
    types = block_types(params.content)
    task = session.task
    refused = provider.refused_content(types, None if task is None else task.adapter)
    if refused is not None and (task is None or task.adapter is None):
        # Some agents say what they take only in their handshake (ACP): ask it.
        await supervisor.start(session)
        task = session.task
        refused = provider.refused_content(types, None if task is None else task.adapter)
    if refused is not None:
        raise ContentUnsupported(
            f"the {session.row.provider} agent of this session cannot take {refused} blocks",
            block=refused,
            provider=session.row.provider,
        )
    private = [supervisor.state_dir, call.app.socket_path.parent]
    prompt = await trio.to_thread.run_sync(
        prepare, params.text, params.content, session.row.cwd, private
    )
    if len(prompt.text.encode()) > MAX_PROMPT_BYTES:
        raise InvalidParams(f"Invalid params: text longer than {MAX_PROMPT_BYTES} bytes")
    if not prompt.text and not prompt.attachments:
        raise InvalidParams("Invalid params: a prompt needs text or content")
    await trio.to_thread.run_sync(supervisor.blobs.keep, session.id, prompt.images)
    return prompt


async def _journal_prompt(
    session: Session,
    prompt: SubmissionEvent | PromptQueued,
    text: str,
    provisional: Provisional | None,
) -> list[StoredEvent]:
    """Journal ``prompt`` (first of the events stored, so a follower from the head
    sees the prompt itself first), with the title taken from it when the session has
    none, in one commit."""
    if session.row.title is not None:
        return await session.journal.append([prompt], provisional=provisional)
    title = title_from_prompt(text)
    return await session.journal.append(
        [prompt, SessionUpdated(title=title, by="daemon")], provisional=provisional, title=title
    )


def title_from_prompt(text: str) -> str:
    """A session's title from its first prompt: the first line with words,
    whitespace collapsed, cut at ``AUTO_TITLE_CHARS``."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    title = " ".join(line.split())
    if len(title) > AUTO_TITLE_CHARS:
        title = title[: AUTO_TITLE_CHARS - 1].rstrip() + "\u2026"
    return title


async def _enqueue(call: Call, session: Session, prompt: Prepared) -> api.SendResult:
    """Hold ``prompt`` in the queue behind the running turn (``agentsd.prompt_queue``)."""
    prompt_id = uuid.uuid4().hex
    operation = call.operation
    queued = PromptQueued(
        prompt_id=prompt_id,
        text=prompt.text,
        operation_id=None if operation is None else operation.op_id,
        attachments=prompt.attachments,
    )

    def result(seq: int) -> api.SendResult:
        return api.SendResult(
            client_message_id=prompt_id,
            seq=seq,
            dispatch="unknown",
            reason="queued: sent as the next turn once the running turn ended",
            queued=True,
        )

    provisional = None
    if operation is not None:
        provisional = Provisional(operation, lambda stored: result(stored[0].seq))
    stored = await _journal_prompt(session, queued, prompt.text, provisional)
    return result(stored[0].seq)


async def _interrupt_for(session: Session, text: str) -> None:
    """``delivery: interrupt``: interrupt the running turn and wait (at most
    ``INTERRUPT_WAIT_S``) for its end. Raises ``InvalidState`` when it did not end,
    and then the prompt was not journaled."""
    await _interrupt(session, session.conversation.turn_id)
    with trio.move_on_after(INTERRUPT_WAIT_S):
        await session.wait_turn_over()
    if session.conversation.turn_open:
        raise InvalidState(
            f"the running turn did not end within {INTERRUPT_WAIT_S:g} s of the interrupt; "
            f"the prompt ({excerpt(text, 40)}) was not sent"
        )


async def _interrupt(session: Session, turn_id: str | None) -> tuple[int | None, bool]:
    """Journal the interrupt request, pausing a non-empty queue with it (a stop
    returns queued prompts to the user's control), then interrupt the agent, keyed
    (Rule 3). The seq of the ``interrupt.requested`` (None, and nothing journaled or
    written, when the turn ``turn_id`` was over once the previous keyed write was
    done), and whether the agent took the interrupt. The lock is held until the
    interrupt is written, not while the agent's confirmation is waited for: the
    order of keys is settled by then, and an answer need not wait for it."""
    lock = session.keyed_writes
    held = False

    def written() -> None:
        nonlocal held
        if held:
            held = False
            lock.release()

    stored: list[StoredEvent] | None = None
    interrupted = False
    with trio.CancelScope(shield=True) as bound:
        bound.deadline = trio.current_time() + INTERRUPT_DELIVERY_S
        try:
            await lock.acquire()  # committed in the order written (Rule 3)
            held = True
            convo = session.conversation
            if turn_id is not None and (not convo.turn_open or convo.turn_id != turn_id):
                return None, False  # it ended while an earlier keyed write went out
            events: list[Event] = [InterruptRequested(turn_id=turn_id)]
            if session.queue.prompts and session.queue.paused is None:
                events.append(QueuePaused(reason="interrupted"))
            stored = await session.journal.append(events)
            interrupted = await _deliver_interrupt(session, turn_id, stored[0].seq, written)
        finally:
            written()
    if stored is None:  # the deadline passed before the commit returned
        raise StorageUnavailable(
            f"interrupting took over {INTERRUPT_DELIVERY_S:g} s: storage too slow, or an "
            "earlier answer or interrupt still going to an agent that does not read its input"
        )
    if bound.cancelled_caught:
        log.warning(
            "session %s: its interrupt took over %g s to reach its agent",
            session.id,
            INTERRUPT_DELIVERY_S,
        )
    return stored[0].seq, interrupted


async def _deliver_interrupt(
    session: Session, turn_id: str | None, seq: int, written: Callable[[], None]
) -> bool:
    """Write a committed interrupt (journaled at ``seq``) to the running agent, if
    one runs (Rule 3); whether it took it. ``written``: called once the keyed write
    went out."""
    task = session.task
    adapter = None if task is None else task.adapter
    if task is None or adapter is None:
        return False
    try:
        return await deliver_interrupt(adapter, task.link, turn_id, seq, on_written=written)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        # The agent ended as the interrupt went out (a held agent's exit is heard
        # from the holder first): its end settles the turn.
        return False


async def _retry_unknown(call: Call, session: Session, params: api.SendParams) -> api.SendResult:
    supervisor = call.app.supervisor
    operation = call.operation
    if operation is None:
        raise InvalidParams("Invalid params: retryUnknown needs the clientOperationId of the send")
    recorded = await call.app.ledger.recorded(operation.op_id)
    if recorded is None:
        raise InvalidParams(
            f"Invalid params: no send with clientOperationId {operation.op_id!r} to retry"
        )
    previous = msgspec.json.decode(recorded, type=api.SendResult)
    cmid = previous.client_message_id
    # The durable outcome: the last ``submission.dispatched`` for it, ``unknown``
    # when none was journaled (the daemon died before it could be).
    dispatched = await session.journal.latest(
        SubmissionDispatched, lambda event: event.client_message_id == cmid
    )
    outcome = "unknown" if dispatched is None else dispatched.outcome
    journaled = await session.journal.latest(
        SubmissionEvent, lambda event: event.client_message_id == cmid
    )
    if outcome != "unknown":
        # Delivered or refused for certain: never re-sent.
        return api.SendResult(
            client_message_id=previous.client_message_id,
            seq=previous.seq,
            dispatch=outcome,
            reason="not re-sent: the outcome is known",
        )
    text = params.text if journaled is None else journaled.text
    attachments = [] if journaled is None else journaled.attachments
    dispatch = await deliver(supervisor, session, cmid, text, attachments)
    return send_result(previous.client_message_id, previous.seq, dispatch)


async def handle_interrupt(call: Call, params: api.InterruptParams) -> api.InterruptResult:
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    task = session.task
    adapter = None if task is None else task.adapter
    if adapter is None:
        return api.InterruptResult(interrupted=False, reason="no agent is running")
    convo = session.conversation
    if not convo.turn_open:
        return api.InterruptResult(interrupted=False, reason="no turn is running")
    if params.turn_id is not None and params.turn_id != convo.turn_id:
        return api.InterruptResult(
            interrupted=False, reason=f"turn {params.turn_id} is not the running turn"
        )
    seq, interrupted = await _interrupt(session, convo.turn_id)
    return api.InterruptResult(
        interrupted=interrupted,
        reason=None if interrupted else "the turn had already ended",
        seq=seq,
    )


async def handle_respond(call: Call, params: api.RespondParams) -> api.RespondResult:
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    convo = session.conversation
    approval_id = params.approval_id
    winner = session.claims.get(approval_id) or convo.resolved.get(approval_id)
    if winner is not None:
        raise AlreadyResolved(
            f"approval {approval_id} was already answered: {winner.decision}",
            approvalId=approval_id,
            winner=body_fields(winner),
        )
    approval = convo.approvals.get(approval_id)
    if approval is None:
        older = await session.journal.latest(
            ApprovalResolved, lambda event: event.approval_id == approval_id
        )
        if older is not None:
            raise AlreadyResolved(
                f"approval {approval_id} was already answered: {older.decision}",
                approvalId=approval_id,
                winner=body_fields(older),
            )
        raise ApprovalNotFound(f"no pending approval {approval_id!r}", approvalId=approval_id)
    allowed = [*approval.options, *(["cancel"] if "cancel" not in approval.options else [])]
    if params.decision not in allowed:
        raise InvalidParams(
            f"Invalid params: decision must be one of {', '.join(allowed)}", options=allowed
        )
    resolution = ApprovalResolved(approval_id=approval_id, decision=params.decision, by="client")
    session.claims[approval_id] = resolution  # the claim: first answer wins from here
    stored: list[StoredEvent] | None = None
    try:
        with trio.CancelScope(shield=True) as bound:
            bound.deadline = trio.current_time() + ANSWER_DELIVERY_S
            async with session.keyed_writes:  # committed in the order written (Rule 2)
                stored = await session.journal.append([resolution])
                await _deliver_answer(
                    session, approval.native_id, approval_id, stored[0].seq, params.decision
                )
    finally:
        # Committed (now in the conversation's resolutions) or failed (nobody won).
        session.claims.pop(approval_id, None)
    if stored is None:  # the deadline passed before the commit returned
        raise StorageUnavailable(
            f"answering {approval_id} took over {ANSWER_DELIVERY_S:g} s: storage too slow, or "
            "an earlier answer or interrupt still going to an agent that does not read its input (ask "
            "again: a recorded answer is then reported as already resolved)"
        )
    if bound.cancelled_caught:
        log.warning(
            "session %s: %s took over %g s to reach its agent",
            session.id,
            approval_id,
            ANSWER_DELIVERY_S,
        )
    return api.RespondResult(approval_id=approval_id, decision=params.decision, seq=stored[0].seq)


async def _deliver_answer(
    session: Session, native_id: str, approval_id: str, seq: int, decision: str
) -> None:
    """Write a committed answer (journaled at ``seq``) to the running agent, if one
    runs (Rule 2)."""
    task = session.task
    adapter = None if task is None else task.adapter
    if task is None or adapter is None:
        return
    try:
        await deliver_answer(adapter, task.link, native_id, seq, decision)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        # The agent ended as the answer went out (a held agent's exit is heard from
        # the holder first): the answer is committed, its end settles the rest.
        log.info("session %s: its agent ended before hearing %s", session.id, approval_id)
    task.touch()


HANDLERS: dict[str, Any] = {
    "agentSession.send": handle_send,
    "agentSession.interrupt": handle_interrupt,
    "agentSession.respond": handle_respond,
}
