"""``agentSession.send/interrupt/respond``: talking to the agent.

Rule 1 (write-ahead): a prompt is journaled as ``submission`` (with the ledger's
provisional entry, in one commit) before the agent sees it; its dispatch outcome
(``accepted``, ``rejected``, ``unknown``) is journaled after. A submission whose
outcome was never journaled is settled ``unknown`` when its child ends or at
recovery, and is never re-sent unless a client asks with ``retryUnknown``.

Rule 2 (first answer wins): an approval is claimed synchronously (no await between
the check and the claim), then its resolution is committed, then delivered. Later
answers get ``already_resolved`` with the winner.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import msgspec

from agentsd.operations import Provisional
from agentsd.providers.base import Dispatch, Submission
from agentsd.session import Session
from agentsd_protocol.api import conversation as api
from agentsd_protocol.api.events import (
    ApprovalResolved,
    InterruptRequested,
    SubmissionDispatched,
    body_fields,
)
from agentsd_protocol.api.events import Submission as SubmissionEvent
from agentsd_protocol.errors import (
    AlreadyResolved,
    ApprovalNotFound,
    InvalidParams,
    RpcError,
    StorageUnavailable,
)

if TYPE_CHECKING:
    from agentsd.connection import Call
    from agentsd.supervisor import Supervisor

log = logging.getLogger(__name__)

MAX_PROMPT_BYTES = 1024 * 1024  # a prompt is typed or pasted; files go through the agent's tools


async def _deliver(supervisor: Supervisor, session: Session, cmid: str, text: str) -> Dispatch:
    """Start the agent if needed (resuming natively), hand it the submission, and
    journal the outcome."""
    try:
        await supervisor.start(session)
        task = session.task
        adapter = None if task is None else task.adapter
        if adapter is None:
            dispatch = Dispatch(outcome="rejected", reason="the agent stopped before delivery")
        else:
            dispatch = await adapter.send(Submission(client_message_id=cmid, text=text))
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


def _result(cmid: str, seq: int, dispatch: Dispatch) -> api.SendResult:
    return api.SendResult(
        client_message_id=cmid,
        seq=seq,
        dispatch=dispatch.outcome,
        reason=dispatch.reason,
        turn_id=dispatch.turn_id,
    )


async def handle_send(call: Call, params: api.SendParams) -> api.SendResult:
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    if len(params.text.encode()) > MAX_PROMPT_BYTES:
        raise InvalidParams(f"Invalid params: text longer than {MAX_PROMPT_BYTES} bytes")
    if params.retry_unknown:
        return await _retry_unknown(call, session, params)
    cmid = uuid.uuid4().hex
    operation = call.operation
    submission = SubmissionEvent(
        client_message_id=cmid,
        text=params.text,
        operation_id=None if operation is None else operation.op_id,
    )

    provisional = None
    if operation is not None:
        pending = Dispatch(outcome="unknown", reason="delivery not confirmed yet")
        provisional = Provisional(operation, lambda stored: _result(cmid, stored[0].seq, pending))
    stored = await session.journal.append([submission], provisional=provisional)
    dispatch = await _deliver(supervisor, session, cmid, params.text)
    return _result(cmid, stored[0].seq, dispatch)


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
    if outcome != "unknown":
        # Delivered or refused for certain: never re-sent.
        return api.SendResult(
            client_message_id=previous.client_message_id,
            seq=previous.seq,
            dispatch=outcome,
            reason="not re-sent: the outcome is known",
        )
    dispatch = await _deliver(supervisor, session, previous.client_message_id, params.text)
    return _result(previous.client_message_id, previous.seq, dispatch)


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
    turn_id = convo.turn_id
    await session.journal.append([InterruptRequested(turn_id=turn_id)])
    interrupted = await adapter.interrupt(turn_id)
    return api.InterruptResult(
        interrupted=interrupted, reason=None if interrupted else "the turn had already ended"
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
    try:
        stored = await session.journal.append([resolution])
    finally:
        # Committed (now in the conversation's resolutions) or failed (nobody won).
        session.claims.pop(approval_id, None)
    task = session.task
    adapter = None if task is None else task.adapter
    if adapter is not None:
        await adapter.answer_approval(approval.native_id, params.decision)
        task.touch()  # type: ignore[union-attr]
    return api.RespondResult(approval_id=approval_id, decision=params.decision, seq=stored[0].seq)


HANDLERS: dict[str, Any] = {
    "agentSession.send": handle_send,
    "agentSession.interrupt": handle_interrupt,
    "agentSession.respond": handle_respond,
}
