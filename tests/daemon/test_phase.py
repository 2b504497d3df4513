"""The phase table: every change of a session's phase is in it, and any other is a
bug that raises (``agentsd.phase``)."""

from __future__ import annotations

import itertools
import typing

import pytest

from agentsd import leases
from agentsd.leases import ExitEvidence, Identity
from agentsd.phase import TRANSITIONS, PhaseError, advance, initial_phase
from agentsd.session import Session
from agentsd.status_board import StatusBoard
from agentsd.store.sessions import SessionRow
from agentsd_protocol.api.session import Phase

PHASES: tuple[Phase, ...] = typing.get_args(Phase)


def a_session(lease: leases.Lease | None = None) -> Session:
    row = SessionRow(
        id="s1",
        host_id="h",
        provider="mock",
        cwd="/",
        title=None,
        options={},
        env={},
        command=None,
        provider_handle=None,
        created_at=0.0,
        updated_at=0.0,
    )
    return Session(row=row, head_seq=0, board=StatusBoard(), lease=lease)


def test_the_table_names_every_phase_and_only_phases() -> None:
    assert set(TRANSITIONS) == set(PHASES)
    for targets in TRANSITIONS.values():
        assert targets <= set(PHASES)


@pytest.mark.parametrize(("current", "new"), list(itertools.product(PHASES, PHASES)))
def test_a_transition_not_in_the_table_raises(current: Phase, new: Phase) -> None:
    if new in TRANSITIONS[current]:
        assert advance(current, new) == new
    else:
        with pytest.raises(PhaseError, match=f"from {current!r} to {new!r}"):
            advance(current, new)


def test_every_phase_is_reachable_from_stopped_and_leads_back_to_it() -> None:
    def reachable(start: Phase) -> set[Phase]:
        seen = {start}
        todo = [start]
        while todo:
            for new in TRANSITIONS[todo.pop()]:
                if new not in seen:
                    seen.add(new)
                    todo.append(new)
        return seen

    assert reachable("stopped") == set(PHASES)
    for phase in PHASES:
        assert "stopped" in reachable(phase)


def test_reap_before_release_stopped_is_entered_only_from_a_settle() -> None:
    """``stopped`` follows only ``stopping`` (the session task's settle) or
    ``exit-unproven`` (a retry's): never a running or starting child."""
    assert {p for p in PHASES if "stopped" in TRANSITIONS[p]} == {"stopping", "exit-unproven"}


def test_a_session_starts_exit_unproven_only_while_its_lease_is_held() -> None:
    lease = leases.acquire("s1", 0, None, 1.0)
    live = leases.go_live(lease, Identity(pid=10, pgid=10, start_time=5), 2.0)
    released = leases.release(live, ExitEvidence(cause="requested", proven=True), 3.0)
    assert initial_phase(None) == "stopped"
    assert initial_phase(lease) == "exit-unproven"
    assert initial_phase(live) == "exit-unproven"
    assert initial_phase(released) == "stopped"
    assert a_session().phase == "stopped"
    assert a_session(live).phase == "exit-unproven"


def test_session_transition_follows_the_table_and_a_refused_one_changes_nothing() -> None:
    session = a_session()
    path: list[Phase] = ["starting", "running", "stopping", "exit-unproven", "stopped"]
    for phase in path:
        session.transition(phase)
        assert session.phase == phase
    with pytest.raises(PhaseError):
        session.transition("running")
    assert session.info().phase == "stopped"
