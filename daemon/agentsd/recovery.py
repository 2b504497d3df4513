"""Recovery at start-up, before anything is served (DESIGN.md invariant 5).

For every lease a previous daemon left held: end whatever still runs of its child
(the recorded process only while its start time matches, its group, and every
process carrying its spawn token), then settle the session in the journal
(open turn ``interrupted``, pending approvals ``cancelled``, undelivered submissions
``unknown``, ``child.exited {cause: daemon-restart}``) and release the lease. A child
that cannot be proven gone keeps its lease held and its session shows
``exit-unproven``.
"""

from __future__ import annotations

import logging
import time

from agentsd import records
from agentsd.child import ChildIdentity, EndOutcome, Ladder, end_processes
from agentsd.leases import ExitEvidence, Lease
from agentsd.procfs import current_scanner
from agentsd.runner import settle_events
from agentsd.session import Session, derive_conversation
from agentsd.store.writer import Store
from agentsd_protocol.api.daemon import RecoveryReport
from agentsd_protocol.api.events import ChildExited, ExitUnproven
from agentsd_protocol.api.session import ExitCause

log = logging.getLogger(__name__)

CAUSE: ExitCause = "daemon-restart"


def _identity(lease: Lease) -> ChildIdentity:
    ident = lease.identity
    if ident is None:
        # Reserved but never confirmed: only its token can find what it spawned.
        return ChildIdentity(pid=0, pgid=0, start_time=-1, token=lease.token)
    return ChildIdentity(
        pid=ident.pid, pgid=ident.pgid, start_time=ident.start_time, token=lease.token
    )


async def recover(store: Store, ladder: Ladder) -> RecoveryReport:
    held = await store.read(records.load_held_leases)
    if not held:
        return RecoveryReport(summary="nothing to recover")
    identities = [_identity(lease) for lease in held]
    report = await end_processes(identities, ladder, current_scanner())
    recovered = unproven = 0
    for lease, identity in zip(held, identities, strict=True):
        outcome = report.outcomes.get(identity, EndOutcome.UNPROVEN)
        if outcome is EndOutcome.UNPROVEN:
            unproven += 1
            await _keep_held(store, lease)
        else:
            await _release(store, lease, outcome)
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


async def _keep_held(store: Store, lease: Lease) -> None:
    evidence = ExitEvidence(cause=CAUSE, proven=False, detail="still running after the ladder")
    events = [ExitUnproven(cause=CAUSE, detail=evidence.detail)]
    now = time.time()
    await store.write(lambda conn: records.lease_unproven(conn, lease, evidence, now, events))


async def _release(store: Store, lease: Lease, outcome: EndOutcome) -> None:
    """Settle the session's conversation and release the lease, in one commit."""
    session_id = lease.session_id
    convo = await store.read(lambda conn: derive_conversation(conn, session_id))
    row = await store.read(lambda conn: records.load_session(conn, session_id))
    assert row is not None  # leases cascade with their session
    probe = Session(row=row, head_seq=row.head_seq, conversation=convo)
    detail = "ended at start-up" if outcome is EndOutcome.ENDED else "already gone"
    evidence = ExitEvidence(cause=CAUSE, proven=True, detail=detail)
    now = time.time()
    events = [*settle_events(probe, CAUSE), ChildExited(cause=CAUSE, detail=detail)]
    last_exit = {"cause": CAUSE, "returncode": None, "signal": None, "at": now}
    await store.write(
        lambda conn: records.lease_released(conn, lease, evidence, now, events, last_exit=last_exit)
    )
