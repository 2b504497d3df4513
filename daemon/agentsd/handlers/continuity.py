"""``agentSession.continue`` and ``daemon.restart``: carrying on after a restart, and
restarting without cutting turns off.

Rule 1 (a continuation is no re-send): ``continue`` never sends the user's prompt
again. It journals a ``submission`` whose ``continuesSeq`` names the cut-off turn's
``turn.completed`` and whose text is the provider's continuation prompt
(``Provider.continuation_prompt``), then delivers it as a send does: the agent is
started with its conversation resumed natively, so the model sees everything said
before and is asked to carry on.

Rule 2: only a turn a daemon restart or stop cut off is continued
(``agentsd.summary`` ``cut_off_seq``), once: a second ``continue``, or one after a
prompt was sent, gets ``not_cut_off``; two at the same moment, one of them.

Rule 3: ``daemon.restart`` with ``drain`` closes the turn gate, waits
(``agentsd.drain``), replies with what the drain found, then restarts; the reply is
the last thing the daemon sends on that connection.

Rule 4: before any of that, the code installed now is checked
(``agentsd.reexec.preflight``): a new version that would not start is refused
(``restart_refused``), with nothing stopped, drained or handed over.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from agentsd.delivery import deliver
from agentsd.drain import closed_gate, drain_turns
from agentsd.operations import Provisional
from agentsd.providers.base import Dispatch
from agentsd.recovery import mark_continued, mark_failed
from agentsd.reexec import preflight
from agentsd_protocol.api import conversation as api
from agentsd_protocol.api import daemon as daemon_api
from agentsd_protocol.api.events import Submission
from agentsd_protocol.errors import InvalidParams, NotCutOff, RestartRefused

if TYPE_CHECKING:
    from agentsd.connection import Call

log = logging.getLogger(__name__)


async def handle_continue(call: Call, params: api.ContinueParams) -> api.ContinueResult:
    app = call.app
    supervisor = app.supervisor
    session = supervisor.get(params.session_id, params.expected_fence)
    with supervisor.gate.admit():
        cut = session.summary.cut_off_seq
        convo = session.conversation
        if (
            cut is None
            or session.id in supervisor.continuing
            or convo.turn_open
            or convo.undispatched
        ):
            raise NotCutOff(
                f"the last turn of session {session.id} was not cut off by a daemon restart "
                "(or it was carried on already): send a prompt instead",
                sessionId=session.id,
            )
        text = supervisor.provider(session.row.provider).continuation_prompt
        cmid = uuid.uuid4().hex
        operation = call.operation
        provisional = None
        if operation is not None:
            # Committed with the continuation: a retry after a crash replays this
            # (delivery unknown) instead of finding the turn no longer cut off.
            provisional = Provisional(
                operation,
                lambda stored: _result(
                    session.id,
                    cmid,
                    stored[0].seq,
                    cut,
                    Dispatch(outcome="unknown", reason="delivery not confirmed yet"),
                ),
            )
        supervisor.continuing.add(session.id)
        try:
            stored = await session.journal.append(
                [
                    Submission(
                        client_message_id=cmid,
                        text=text,
                        operation_id=None if operation is None else operation.op_id,
                        continues_seq=cut,
                    )
                ],
                provisional=provisional,
            )
        finally:
            supervisor.continuing.discard(session.id)
        dispatch = await deliver(supervisor, session, cmid, text)
    if dispatch.outcome == "rejected":
        app.recovery = mark_failed(
            app.recovery, session.id, f"the continuation was not delivered: {dispatch.reason}"
        )
    else:
        app.recovery = mark_continued(app.recovery, session.id)
    return _result(session.id, cmid, stored[0].seq, cut, dispatch)


def _result(
    session_id: str, cmid: str, seq: int, cut: int, dispatch: Dispatch
) -> api.ContinueResult:
    return api.ContinueResult(
        session_id=session_id,
        client_message_id=cmid,
        seq=seq,
        continued_seq=cut,
        dispatch=dispatch.outcome,
        reason=dispatch.reason,
        turn_id=dispatch.turn_id,
    )


async def handle_restart(call: Call, params: daemon_api.RestartParams) -> daemon_api.RestartResult:
    app = call.app
    if params.timeout_s is not None and params.timeout_s < 0:
        raise InvalidParams("Invalid params: timeoutS must not be negative")
    if app.image_args is not None:  # Rule 4
        failure = await preflight(app.image_args)
        if failure is not None:
            log.error("restart refused: the new version would not start: %s", failure)
            raise RestartRefused(
                "the agentsd installed now would not start, so nothing was restarted: "
                + failure.splitlines()[-1],
                output=failure,
            )
    if params.drain is None:
        app.stop_accepting()  # before the reply: whoever it reaches may connect at once
        call.after_reply.append(app.request_restart)
        return daemon_api.RestartResult(
            drained=False, how=app.restart_mode, keeps_agents=app.restart_keeps_agents
        )
    supervisor = app.supervisor
    with closed_gate(supervisor.gate):
        report = await drain_turns(
            supervisor.gate, list(supervisor.sessions.values()), params.timeout_s
        )
    app.stop_accepting()
    call.after_reply.append(app.request_restart)
    return daemon_api.RestartResult(
        drained=True,
        turns_running=report.turns_running,
        turns_finished=report.turns_finished,
        turns_cut_off=report.turns_cut_off,
        waited_s=report.waited_s,
        timed_out=report.timed_out,
        how=app.restart_mode,
        keeps_agents=app.restart_keeps_agents,
    )


HANDLERS: dict[str, Any] = {
    "agentSession.continue": handle_continue,
    "daemon.restart": handle_restart,
}
