"""A session's child phase, as a table (in the style of h11's ``_state.py``).

Rule 1: `TRANSITIONS` lists every change of phase there is. ``Session.transition``
is the only code that changes a session's phase, and it goes through `advance`: a
change not in the table is a bug and raises `PhaseError`.

Rule 2: a session's first phase follows from its lease (`initial_phase`): a lease
still held when the session is loaded belongs to a child whose end is not yet proven.

Rule 3: the phase mirrors the lease, never leads it. ``stopped`` is entered only
once a release was committed with proof of exit (DESIGN.md invariant 1), and
``exit-unproven`` whenever a child ended without a committed release.
"""

from __future__ import annotations

from collections.abc import Mapping

from agentsd.leases import Lease
from agentsd_protocol.api.session import Phase

TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    # A lease was acquired (fence + 1, durable): a child is about to be spawned.
    "stopped": frozenset({"starting"}),
    # The handshake completed; or the start failed or was stopped.
    "starting": frozenset({"running", "stopping"}),
    # The child exited, or was closed, stopped idle or shut down.
    "running": frozenset({"stopping"}),
    # The child is gone and the release committed; or its exit is not proven, or
    # the release could not be committed (the lease stays held).
    "stopping": frozenset({"stopped", "exit-unproven"}),
    # A retry (a close, a start, or recovery at start-up) proved the exit and
    # released the lease; or it still cannot. Or a daemon takes over the agent of the
    # lease, which the holder kept running through its predecessor's death.
    "exit-unproven": frozenset({"stopped", "exit-unproven", "starting"}),
}


class PhaseError(Exception):
    """A change of phase that is not in `TRANSITIONS`; always a bug in the caller."""


def advance(current: Phase, new: Phase) -> Phase:
    """``new``, if the table allows going there from ``current``; else raise."""
    if new not in TRANSITIONS[current]:
        raise PhaseError(f"no transition from {current!r} to {new!r}")
    return new


def initial_phase(lease: Lease | None) -> Phase:
    return "exit-unproven" if lease is not None and lease.held else "stopped"
