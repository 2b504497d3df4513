"""Recovery at start-up, before anything is served (DESIGN.md invariant 5).

For every lease a previous daemon left held: end whatever still runs of its child
(the recorded process only while its start time matches, its group, and every
process carrying its spawn token; with a cgroup root, its cgroup), then settle it through the one settle path
(``agentsd.held_lease.settle``): open turn ``interrupted``, pending approvals
``cancelled``, undelivered submissions ``unknown``, ``child.exited {cause:
daemon-restart}`` and the release, in one commit. A child that cannot be proven gone
keeps its lease held and its session shows ``exit-unproven``.

With the holder and ``crash_policy = "reattach"``, a held lease whose agent the
holder still has (its token, pid and start time as recorded) and whose handshake
was journaled is not ended: it is handed to the supervisor to take over
(`Reattachable`, ``agentsd.reattach``), and its cgroup is spared. Every other held
lease is ended and settled as above.

Then, once the sessions are loaded, `reconcile` makes the reconciliation report
(``daemon.status`` ``recovery``, systemd's ``STATUS=``, the log): how many sessions
were running, which turns a restart or stop cut off (each is a ``turn.completed``
``interrupted`` in its journal, ``reason`` ``daemon-restart`` or ``shutdown``), what
failed and why, and how many turns are lost: a turn that was open at recovery and
is now neither cut off nor failed. That count is computed, not assumed; it must be
0. The report follows ``agentSession.continue`` while the daemon runs
(`mark_continued`, `mark_failed`).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import attrs
import msgspec

from agentsd.cgroup import CgroupRoot
from agentsd.config import Ladder
from agentsd.held_lease import recorded_identity, settle
from agentsd.leases import ClaimState, Lease
from agentsd.leftovers import EndOutcome, end_contained
from agentsd.procfs import current_scanner
from agentsd.session import Session, derive_conversation, ready_generation
from agentsd.status_board import StatusBoard
from agentsd.store import leases as lease_rows
from agentsd.store import sessions as session_rows
from agentsd.store.writer import Store
from agentsd_protocol.api.daemon import CutOffTurn, RecoveryFailure, RecoveryReport
from agentsd_protocol.api.session import ExitCause

log = logging.getLogger(__name__)


@attrs.frozen
class Reattachable:
    """A held lease whose agent the holder kept running: the supervisor takes it
    over instead of recovery ending it. ``out_offset`` and ``out_skip``: where its
    output is journaled up to (``agentsd.sink`` Rule 4)."""

    lease: Lease
    out_offset: int
    out_skip: int


@attrs.frozen
class Recovered:
    """What `recover` did, for `reconcile`."""

    report: RecoveryReport
    sessions_running: int = 0  # held leases found: agents a previous daemon left
    open_turns: frozenset[str] = frozenset()  # sessions whose turn was open then
    failures: tuple[RecoveryFailure, ...] = ()  # sessions left exit-unproven, and why
    reattachable: tuple[Reattachable, ...] = ()  # for the supervisor to take over


async def recover(
    store: Store,
    ladder: Ladder,
    root: CgroupRoot | None = None,
    *,
    holder_found: Mapping[str, Mapping[str, Any]] | None = None,
    cause: ExitCause = "daemon-restart",
) -> Recovered:
    """End and settle what a previous daemon left; with a cgroup ``root``, also kill
    and remove every session cgroup there that no lease kept for a takeover owns.
    ``holder_found``: what the holder held when this daemon attached it, by agent id
    (spawn token), when held agents are to be reattached; None: end them all.
    ``cause``: what the ends are journaled as (``shutdown`` for the agents a stop
    during a restart leaves handed over: ``agentsd.server`` Rule 6)."""
    held = await store.read(lease_rows.load_held_leases)
    kept: list[Reattachable] = []
    if holder_found is not None:
        kept = await _reattachable(store, held, holder_found)
    kept_tokens = {k.lease.token for k in kept}
    held = [lease for lease in held if lease.token not in kept_tokens]
    identities = [recorded_identity(lease) for lease in held]
    running = len(held) + len(kept)
    if not held and (root is None or not _strays(root, kept_tokens)):
        summary = "nothing to recover" if not kept else "nothing to end"
        return Recovered(
            RecoveryReport(summary=summary), sessions_running=running, reattachable=tuple(kept)
        )
    # All together: ending every previous child takes about one ladder.
    report = await end_contained(
        identities, ladder, current_scanner(), root, sweep=True, keep=kept_tokens
    )
    if not held:
        return Recovered(
            RecoveryReport(summary="stray session cgroups removed"),
            sessions_running=running,
            reattachable=tuple(kept),
        )
    recovered = unproven = 0
    open_turns: set[str] = set()
    failures: list[RecoveryFailure] = []
    for lease, identity in zip(held, identities, strict=True):
        outcome = report.outcomes.get(identity, EndOutcome.UNPROVEN)
        session = await _load(store, lease)
        if session.conversation.turn_open:
            open_turns.add(session.id)
        await settle(session, store.write, cause, outcome)
        if session.lease is not None and session.lease.held:
            unproven += 1
            failures.append(
                RecoveryFailure(
                    session_id=session.id,
                    reason="its agent could not be proven gone (exit-unproven); "
                    "`agentsctl close` retries",
                )
            )
        else:
            recovered += 1
    summary = (
        f"{recovered} session{'s' if recovered != 1 else ''} recovered, "
        f"{report.ended} orphan process group{'s' if report.ended != 1 else ''} ended"
        + (f", {unproven} unproven" if unproven else "")
    )
    return Recovered(
        RecoveryReport(
            sessions_recovered=recovered,
            orphans_ended=report.ended,
            unproven=unproven,
            summary=summary,
        ),
        sessions_running=running,
        open_turns=frozenset(open_turns),
        failures=tuple(failures),
        reattachable=tuple(kept),
    )


def _strays(root: CgroupRoot, kept: set[str]) -> bool:
    """Whether ``root`` has a session cgroup no kept agent lives in."""
    own = {root.for_token(token).path for token in kept}
    return any(cgroup.path not in own for cgroup in root.existing())


async def _reattachable(
    store: Store, held: list[Lease], found: Mapping[str, Mapping[str, Any]]
) -> list[Reattachable]:
    """The held leases whose agent can be taken over: live (its identity durable),
    the holder has it under its token with the recorded pid and start time (so it is
    that process, alive or exited since), and its handshake was journaled (so an
    adapter can go on without one)."""
    candidates: list[Lease] = []
    for lease in held:
        agent = found.get(lease.token)
        ident = lease.identity
        if lease.state is not ClaimState.LIVE or ident is None or agent is None:
            continue
        if (agent.get("pid"), agent.get("start_time")) != (ident.pid, ident.start_time):
            log.warning(
                "recovery: the holder's agent of session %s is not the recorded process; ending it",
                lease.session_id,
            )
            continue
        candidates.append(lease)

    def journaled(conn: sqlite3.Connection) -> list[tuple[str | None, tuple[int, int]]]:
        # One read for them all: a hundred agents cost one thread hop, not two hundred.
        return [
            (
                ready_generation(conn, lease.session_id),
                lease_rows.held_output(conn, lease.session_id, lease.fence),
            )
            for lease in candidates
        ]

    out: list[Reattachable] = []
    for lease, (ready, (offset, skip)) in zip(candidates, await store.read(journaled), strict=True):
        if ready != lease.generation:
            continue  # it was still in its handshake: ended, as without the holder
        out.append(Reattachable(lease=lease, out_offset=offset, out_skip=skip))
    return out


def reconcile(
    recovered: Recovered, sessions: Iterable[Session], reattached: Collection[str] = ()
) -> RecoveryReport:
    """The reconciliation report, from what recovery did, the loaded sessions and
    the sessions whose agent was taken over (``reattached``: their turns go on)."""
    cut_off: list[CutOffTurn] = []
    for session in sessions:
        summary = session.summary
        if summary.cut_off_seq is not None:
            cut_off.append(
                CutOffTurn(
                    session_id=session.id,
                    title=session.row.title,
                    provider=session.row.provider,
                    seq=summary.cut_off_seq,
                    reason=summary.cut_off_reason or "",
                )
            )
    cut_ids = {c.session_id for c in cut_off}
    failed_ids = {f.session_id for f in recovered.failures}
    # A turn recovery found open that is now neither cut off nor failed: a bug.
    lost = sorted(recovered.open_turns - cut_ids - failed_ids - set(reattached))
    if lost:
        log.error("recovery: the open turns of sessions %s are accounted for nowhere", lost)
    report = msgspec.structs.replace(
        recovered.report,
        sessions_running=recovered.sessions_running,
        turns_cut_off=len(cut_off),
        lost=len(lost),
        cut_off=sorted(cut_off, key=lambda c: c.session_id),
        failed=list(recovered.failures),
        reattached=len(reattached),
    )
    return _summarized(report, recovered.report.summary)


def mark_continued(report: RecoveryReport, session_id: str) -> RecoveryReport:
    """``session_id``'s cut-off turn was carried on."""
    entries = [
        msgspec.structs.replace(c, continued=True) if c.session_id == session_id else c
        for c in report.cut_off
    ]
    done = sum(1 for c in entries if c.continued)
    failed = [f for f in report.failed if f.session_id != session_id]
    updated = msgspec.structs.replace(report, cut_off=entries, continued=done, failed=failed)
    return _summarized(updated, _base_summary(report))


def mark_failed(report: RecoveryReport, session_id: str, reason: str) -> RecoveryReport:
    """Carrying ``session_id``'s turn on failed, for ``reason``."""
    failed = [f for f in report.failed if f.session_id != session_id]
    failed.append(RecoveryFailure(session_id=session_id, reason=reason))
    return _summarized(msgspec.structs.replace(report, failed=failed), _base_summary(report))


_SEPARATOR = "; "


def _base_summary(report: RecoveryReport) -> str:
    return report.summary.split(_SEPARATOR, 1)[0]


def _summarized(report: RecoveryReport, base: str) -> RecoveryReport:
    """``base`` (what recovery did) and the reconciliation, in one line."""
    waiting = report.turns_cut_off - report.continued
    text = (
        f"{report.sessions_running} running at the last stop; "
        f"{report.reattached} reattached, "
        f"{report.turns_cut_off} turn{'s' if report.turns_cut_off != 1 else ''} cut off "
        f"({report.continued} continued"
        + (f", {waiting} waiting for `agentsctl continue`" if waiting else "")
        + f"), {len(report.failed)} failed, {report.lost} lost"
    )
    return msgspec.structs.replace(report, summary=base + _SEPARATOR + text)


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
