"""Leases as pure functions: the fencing, single-owner and reap-before-release rules
hold for any sequence of transitions (DESIGN.md invariants 1, 3, 4)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agentsd import leases
from agentsd.leases import ClaimState, ExitEvidence, Identity, Lease, LeaseError

PROOF = ExitEvidence(cause="requested", proven=True, returncode=0)
NO_PROOF = ExitEvidence(cause="requested", proven=False, detail="still running")


class LeaseMachine(RuleBasedStateMachine):
    """One session's leases over time, driven by arbitrary transitions, including
    forbidden ones (which must raise and change nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.fence = 0  # the session's durable fence
        self.current: Lease | None = None
        self.history: list[Lease] = []
        self.latest: dict[int, Lease] = {}  # newest state of each fence's lease
        self.clock = 0.0

    def _tick(self) -> float:
        self.clock += 1.0
        return self.clock

    @rule()
    def acquire(self) -> None:
        if self.current is not None and self.current.held:
            with pytest.raises(LeaseError):
                leases.acquire("s", self.fence, self.current, self._tick())
            return
        lease = leases.acquire("s", self.fence, self.current, self._tick())
        assert lease.fence == self.fence + 1
        assert lease.state is ClaimState.RESERVED
        assert all(lease.generation != old.generation for old in self.history)
        self.fence = lease.fence
        self.current = lease
        self.history.append(lease)

    @precondition(lambda self: self.current is not None)
    @rule(pid=st.integers(min_value=2, max_value=1 << 22))
    def go_live(self, pid: int) -> None:
        assert self.current is not None
        identity = Identity(pid=pid, pgid=pid, start_time=pid * 7)
        if self.current.state is not ClaimState.RESERVED:
            with pytest.raises(LeaseError):
                leases.go_live(self.current, identity, self._tick())
            return
        self.current = leases.go_live(self.current, identity, self._tick())
        assert self.current.identity == identity

    @precondition(lambda self: self.current is not None)
    @rule(proven=st.booleans())
    def release(self, proven: bool) -> None:
        assert self.current is not None
        evidence = PROOF if proven else NO_PROOF
        if not proven or not self.current.held:
            with pytest.raises(LeaseError):
                leases.release(self.current, evidence, self._tick())
            if not proven and self.current.held:
                self.current = leases.record_unproven(self.current, evidence)
                assert self.current.held
            return
        self.current = leases.release(self.current, evidence, self._tick())
        assert self.current.death is not None and self.current.death.proven

    @invariant()
    def fences_strictly_increase(self) -> None:
        fences = [lease.fence for lease in self.history]
        assert fences == sorted(set(fences))

    @invariant()
    def never_two_held(self) -> None:
        if self.current is not None:
            self.latest[self.current.fence] = self.current
        assert sum(1 for lease in self.latest.values() if lease.held) <= 1

    @invariant()
    def release_only_follows_proof(self) -> None:
        if self.current is not None and self.current.state is ClaimState.RELEASED:
            assert self.current.death is not None and self.current.death.proven


LeaseMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLeaseMachine = LeaseMachine.TestCase


def test_is_current_needs_fence_and_generation() -> None:
    lease = leases.acquire("s", 4, None, 0.0)
    assert leases.is_current(lease, 5, lease.generation)
    assert not leases.is_current(lease, 4, lease.generation)
    assert not leases.is_current(lease, 5, "other")
    released = leases.release(lease, PROOF, 1.0)
    assert not leases.is_current(released, 5, lease.generation)


def test_fence_never_goes_backwards() -> None:
    old = leases.release(leases.acquire("s", 9, None, 0.0), PROOF, 1.0)
    with pytest.raises(LeaseError):
        leases.acquire("s", 3, old, 2.0)
