"""Leases as pure functions over frozen records.

A lease is a session's claim to run one agent child. Its life is
``reserved -> live -> released``:

Rule 1 (fencing): every acquisition takes ``fence = previous fence + 1`` and mints a
new generation id. The store commits the new fence before the child is spawned, so
fences strictly increase across crashes and restarts.

Rule 2 (single owner): a lease can be acquired only when the previous one of the same
session is released, so a session never has two live children.

Rule 3 (reap before release): ``release`` demands an ``ExitEvidence`` whose
``proven`` is true. Without proof the lease stays held.

Nothing here does I/O; ``agentsd.records`` persists these values and
``agentsd.session`` drives the transitions.
"""

from __future__ import annotations

import enum
import uuid

import attrs


class ClaimState(enum.Enum):
    RESERVED = "reserved"  # fence taken, spawn not yet confirmed
    LIVE = "live"  # child identity recorded
    RELEASED = "released"  # child proven gone


class LeaseError(Exception):
    """A transition the rules forbid; always a bug in the caller."""


@attrs.frozen
class Identity:
    """Who the child is, durable before its handshake: pid alone is never proof."""

    pid: int
    pgid: int
    start_time: int


@attrs.frozen
class ExitEvidence:
    """Why the child is known to be gone (or why that could not be shown)."""

    cause: str
    proven: bool
    returncode: int | None = None
    signal: int | None = None
    detail: str = ""


@attrs.frozen
class Lease:
    session_id: str
    fence: int
    generation: str
    token: str
    state: ClaimState
    acquired_at: float
    identity: Identity | None = None
    live_at: float | None = None
    released_at: float | None = None
    death: ExitEvidence | None = None

    @property
    def held(self) -> bool:
        return self.state is not ClaimState.RELEASED


def new_generation() -> str:
    return uuid.uuid4().hex


def new_token() -> str:
    return uuid.uuid4().hex


def acquire(session_id: str, current_fence: int, previous: Lease | None, now: float) -> Lease:
    """The next lease of a session: fence + 1, a new generation and spawn token."""
    if previous is not None and previous.held:
        raise LeaseError(
            f"session {session_id}: lease fence {previous.fence} is still {previous.state.value}"
        )
    if previous is not None and previous.fence > current_fence:
        raise LeaseError(f"session {session_id}: fence went backwards")
    return Lease(
        session_id=session_id,
        fence=current_fence + 1,
        generation=new_generation(),
        token=new_token(),
        state=ClaimState.RESERVED,
        acquired_at=now,
    )


def go_live(lease: Lease, identity: Identity, now: float) -> Lease:
    if lease.state is not ClaimState.RESERVED:
        raise LeaseError(f"lease fence {lease.fence} is {lease.state.value}, not reserved")
    return attrs.evolve(lease, state=ClaimState.LIVE, identity=identity, live_at=now)


def hand_over(lease: Lease) -> Lease:
    """The lease a daemon takes over a running child under (reattach): the same
    claim on the same child (token, identity), under fence + 1 and a new
    generation, so that nothing of the previous daemon's counts any more (Rule 1).
    The previous lease is not released: no exit was proven (Rule 3); it becomes
    this one."""
    if lease.state is not ClaimState.LIVE or lease.identity is None:
        raise LeaseError(f"lease fence {lease.fence} is {lease.state.value}: no child to take over")
    return attrs.evolve(lease, fence=lease.fence + 1, generation=new_generation())


def release(lease: Lease, evidence: ExitEvidence, now: float) -> Lease:
    if not evidence.proven:
        raise LeaseError(f"lease fence {lease.fence}: release without proof of exit")
    if lease.state is ClaimState.RELEASED:
        raise LeaseError(f"lease fence {lease.fence} is already released")
    return attrs.evolve(lease, state=ClaimState.RELEASED, released_at=now, death=evidence)


def record_unproven(lease: Lease, evidence: ExitEvidence) -> Lease:
    """Keep the lease held, remembering why exit could not be proven."""
    if evidence.proven:
        raise LeaseError("record_unproven takes unproven evidence")
    return attrs.evolve(lease, death=evidence)


def is_current(lease: Lease | None, fence: int, generation: str) -> bool:
    """Events from a child are accepted only while its (fence, generation) is current."""
    return (
        lease is not None and lease.held and lease.fence == fence and lease.generation == generation
    )
