"""Draining before a restart (``agentsd.drain``), the cut-off state of a session's
summary, and the reconciliation report (``agentsd.recovery``), without a daemon."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from agentsd.drain import DRAIN_POLL_S, TurnGate, closed_gate, drain_turns
from agentsd.recovery import Recovered, mark_continued, mark_failed, reconcile
from agentsd.session import Session
from agentsd.status_board import StatusBoard
from agentsd_protocol.api.daemon import RecoveryFailure, RecoveryReport
from agentsd_protocol.api.events import (
    Submission,
    SubmissionDispatched,
    TurnCompleted,
    TurnStarted,
)
from agentsd_protocol.errors import Draining
from tests.daemon.test_status_board import a_session, commit


def running(session_id: str) -> Session:
    session = a_session(StatusBoard(), session_id)
    commit(
        session,
        Submission(client_message_id="c1", text="go"),
        SubmissionDispatched(client_message_id="c1", outcome="accepted", turn_id="t1"),
        TurnStarted(turn_id="t1"),
    )
    return session


async def test_a_drain_waits_for_running_turns_and_admitted_sends(
    autojump_clock: trio.abc.Clock,
) -> None:
    gate = TurnGate()
    busy, idle = running("busy"), a_session(StatusBoard(), "idle")
    report = None

    async def drain() -> None:
        nonlocal report
        with closed_gate(gate):
            report = await drain_turns(gate, [busy, idle], None)

    admitted = gate.admit()
    admitted.__enter__()  # a send admitted before the drain, not yet journaled
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        await trio.sleep(10 * DRAIN_POLL_S)
        with pytest.raises(Draining), gate.admit():
            pass
        commit(busy, TurnCompleted(turn_id="t1", outcome="completed"))
        await trio.sleep(10 * DRAIN_POLL_S)
        assert report is None  # the admitted send is still on its way
        admitted.__exit__(None, None, None)
    assert report is not None
    assert (report.turns_running, report.turns_finished, report.turns_cut_off) == (1, 1, 0)
    assert not report.timed_out
    assert gate.draining  # only a restart follows a finished drain


async def test_a_drain_that_times_out_reports_what_it_cuts_off(
    autojump_clock: trio.abc.Clock,
) -> None:
    gate = TurnGate()
    with closed_gate(gate):
        report = await drain_turns(gate, [running("a"), running("b")], 5.0)
    assert (report.turns_running, report.turns_finished, report.turns_cut_off) == (2, 0, 2)
    assert report.timed_out and report.waited_s >= 5.0


async def test_an_abandoned_drain_reopens_the_gate(autojump_clock: trio.abc.Clock) -> None:
    gate = TurnGate()
    with trio.move_on_after(1.0), closed_gate(gate):
        await drain_turns(gate, [running("a")], None)
    assert not gate.draining
    with gate.admit():
        assert gate.in_flight == 1
    assert gate.in_flight == 0


def test_a_turn_cut_off_by_a_restart_or_stop_waits_until_a_prompt_or_continuation() -> None:
    session = running("s")
    commit(session, TurnCompleted(turn_id="t1", outcome="interrupted", reason="daemon-restart"))
    assert (session.summary.cut_off_seq, session.summary.cut_off_reason) == (4, "daemon-restart")
    commit(session, Submission(client_message_id="c2", text="carry on", continues_seq=4))
    assert session.summary.cut_off_seq is None
    assert session.summary.last_prompt == "go"  # a continuation is not the user's prompt
    # Interrupted by the user, or by an idle stop: nothing to continue.
    for reason in (None, "requested", "idle"):
        commit(session, TurnCompleted(turn_id="t2", outcome="interrupted", reason=reason))
        assert session.summary.cut_off_seq is None, reason
    commit(session, TurnCompleted(turn_id="t3", outcome="interrupted", reason="shutdown"))
    assert session.summary.cut_off_reason == "shutdown"
    commit(session, Submission(client_message_id="c3", text="something else"))
    assert session.summary.cut_off_seq is None


def test_the_report_counts_what_is_accounted_for_nowhere_as_lost() -> None:
    cut = a_session(StatusBoard(), "cut")
    commit(cut, TurnCompleted(outcome="interrupted", reason="daemon-restart"))
    unproven = a_session(StatusBoard(), "unproven")
    vanished = a_session(StatusBoard(), "vanished")  # open at recovery, settled nowhere
    recovered = Recovered(
        RecoveryReport(sessions_recovered=2, unproven=1, summary="2 sessions recovered"),
        sessions_running=3,
        open_turns=frozenset({"cut", "unproven", "vanished"}),
        failures=(RecoveryFailure(session_id="unproven", reason="exit-unproven"),),
    )
    report = reconcile(recovered, [cut, unproven, vanished])
    assert (report.sessions_running, report.turns_cut_off, report.lost) == (3, 1, 1)
    assert [c.session_id for c in report.cut_off] == ["cut"]
    assert report.summary == (
        "2 sessions recovered; 3 running at the last stop; 0 reattached, 1 turn cut off "
        "(0 continued, 1 waiting for `agentsctl continue`), 1 failed, 1 lost"
    )
    report = mark_continued(report, "cut")
    assert report.continued == 1 and report.cut_off[0].continued
    assert report.summary.endswith("1 turn cut off (1 continued), 1 failed, 1 lost")
    report = mark_failed(report, "cut", "not delivered")
    assert [f.session_id for f in report.failed] == ["unproven", "cut"]
    assert report.summary.startswith("2 sessions recovered; ")


def test_a_turn_that_goes_on_under_a_reattached_agent_is_not_lost() -> None:
    """With the holder and ``crash_policy = "reattach"`` the agent was taken over:
    its turn, open at recovery, is neither cut off nor lost."""
    taken = a_session(StatusBoard(), "taken")
    cut = a_session(StatusBoard(), "cut")
    commit(cut, TurnCompleted(outcome="interrupted", reason="daemon-restart"))
    recovered = Recovered(
        RecoveryReport(sessions_recovered=1, summary="1 session recovered"),
        sessions_running=2,
        open_turns=frozenset({"taken", "cut"}),
    )
    report = reconcile(recovered, [taken, cut], reattached=["taken"])
    assert (report.reattached, report.turns_cut_off, report.lost) == (1, 1, 0)
    assert "2 running at the last stop; 1 reattached, 1 turn cut off" in report.summary
    assert report.summary.endswith("0 failed, 0 lost")
