"""Recovery at start-up, before anything is served (DESIGN.md invariant 5).

For every lease a previous daemon left held: end whatever still runs of its child
(the recorded process only while its start time matches, its group, and every
process carrying its spawn token; with a cgroup root, its cgroup), then settle it through the one settle path
(``agentsd.held_lease.settle``): open turn ``interrupted``, pending approvals
``cancelled``, undelivered submissions ``unknown``, ``child.exited {cause:
daemon-restart}`` and the release, in one commit. A child that cannot be proven gone
keeps its lease held and its session shows ``exit-unproven``.
"""

from __future__ import annotations

import logging

from agentsd.cgroup import CgroupRoot
from agentsd.config import Ladder
from agentsd.held_lease import recorded_identity, settle
from agentsd.leases import Lease
from agentsd.leftovers import EndOutcome, end_contained
from agentsd.procfs import current_scanner
from agentsd.session import Session, derive_conversation
from agentsd.status_board import StatusBoard
from agentsd.store import leases as lease_rows
from agentsd.store import sessions as session_rows
from agentsd.store.writer import Store
from agentsd_protocol.api.daemon import RecoveryReport

log = logging.getLogger(__name__)


async def recover(store: Store, ladder: Ladder, root: CgroupRoot | None = None) -> RecoveryReport:
    """End and settle what a previous daemon left; with a cgroup ``root``, also kill
    and remove every session cgroup there: none is owned by a live lease yet."""
    held = await store.read(lease_rows.load_held_leases)
    identities = [recorded_identity(lease) for lease in held]
    if not held and (root is None or not root.existing()):
        return RecoveryReport(summary="nothing to recover")
    # All together: ending every previous child takes about one ladder.
    report = await end_contained(identities, ladder, current_scanner(), root, sweep=True)
    if not held:
        return RecoveryReport(summary="stray session cgroups removed")
    recovered = unproven = 0
    for lease, identity in zip(held, identities, strict=True):
        outcome = report.outcomes.get(identity, EndOutcome.UNPROVEN)
        session = await _load(store, lease)
        await settle(session, store.write, "daemon-restart", outcome)
        if session.lease is not None and session.lease.held:
            unproven += 1
        else:
            recovered += 1
    summary = (
        f"{recovered} session{'s' if recovered != 1 else ''} recovered, "
        f"{report.ended} orphan process group{'s' if report.ended != 1 else ''} ended"
        + (f", {unproven} unproven" if unproven else "")
    )
    log.info("recovery: %s", summary)
    return RecoveryReport(
        sessions_recovered=recovered, orphans_ended=report.ended, unproven=unproven, summary=summary
    )


async def _load(store: Store, lease: Lease) -> Session:
    """The session of ``lease`` as the previous daemon left it, to settle it (the
    supervisor loads its own afterwards)."""
    session_id = lease.session_id
    convo = await store.read(lambda conn: derive_conversation(conn, session_id))
    row = await store.read(lambda conn: session_rows.load_session(conn, session_id))
    assert row is not None  # leases cascade with their session
    # Nothing is served yet: no watcher to tell of its phase.
    board = StatusBoard()
    return Session(row=row, head_seq=row.head_seq, board=board, conversation=convo, lease=lease)
