"""The held lease: the outer ``async with`` of the session task (DESIGN.md section 2),
and the one path by which a lease whose child ended is settled.

    async with open_lease(session, write, refused) as held:  # fence + 1, durable, before spawn
        async with open_child(spec, ladder, held.child_spawned, held.child_exited):
            ...                                       # identity durable before handshake
        # open_child's exit: the shielded, bounded ladder; the child is reaped
    # open_lease's exit: settle(...) with the proof open_child handed over

Rule 1 (reap before release): `settle` releases a lease only with proof: our child
was reaped (``wait()`` returned) and nothing of it remains (its group is empty and
no process carries its token), or a previous child's leftovers were found and ended
or were already gone, or no process was spawned under the lease at all. Without
proof it keeps the lease held, journals ``exit.unproven``, and the session is
``exit-unproven``; a later close or start retries, through `settle` again.

Rule 2 (one story): `settle` is the only writer of ``child.exited`` (one shape,
`exited_event`) and of ``exit.unproven``, for the session task, the retry of an
unproven exit (``Supervisor``) and recovery at start-up, with one exception:
`_withdraw` settles a reservation the session task never learned of (Rule 4), in
the same shape; `_evidence` is the only place that puts a proof into words.

Rule 3 (bounded, shielded): `open_lease` acquires and settles under a shield with a
time bound. A store that refuses the settle, or is too slow, leaves the lease held
durably as it was: the session is ``exit-unproven`` and ``settle_error`` says why.

Rule 4 (slow storage is slow storage): every durable write of a start has the same
bound. An acquisition that takes longer fails the start with
``StorageUnavailable`` at once (``refused``), and the reservation, which may still
commit after the caller gave up, is withdrawn by a write queued behind it (the
writer keeps order), so no ``reserved`` lease is left behind.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import assert_never

import attrs
import msgspec
import trio

from agentsd.child import ChildExit, ExitProof, ExitUnproven
from agentsd.leases import ExitEvidence, Identity, Lease
from agentsd.leftovers import ChildIdentity, EndOutcome
from agentsd.session import Session
from agentsd.store import leases as lease_rows
from agentsd.store.database import StoreConnection
from agentsd.store.journal import StoredEvent
from agentsd_protocol.api import events as events_api
from agentsd_protocol.api.events import (
    ApprovalResolved,
    ChildExited,
    ErrorInfo,
    Event,
    SubmissionDispatched,
    TurnCompleted,
    TurnOutcome,
)
from agentsd_protocol.api.session import ChildInfo, ExitCause, ExitInfo, SessionError
from agentsd_protocol.errors import RpcError, StorageUnavailable

log = logging.getLogger(__name__)

# A durable write of a start or an end (acquire, identity, ready, release) is one
# small commit, milliseconds on a healthy disk; longer than this is slow storage.
SETTLE_TIMEOUT_S = 10.0
# How long a start that gave up on its acquisition waits for the reservation to be
# withdrawn: the acquisition's own commit, then the withdrawal's, on slow storage.
WITHDRAW_TIMEOUT_S = 6 * SETTLE_TIMEOUT_S

LeaseOp = Callable[[StoreConnection], tuple[Lease, list[StoredEvent]]]
Write = Callable[[LeaseOp], Awaitable[tuple[Lease, list[StoredEvent]]]]
"""Commits a lease op and returns its result: the ``write`` of the session's journal
port (which applies and publishes the events), the store's ``write`` during
recovery (nothing is served yet)."""

Proof = ChildExit | EndOutcome | None
"""What a lease is settled with: how the close ladder left our own child, how ending
a previous child's leftovers went, or None: no process was spawned under the lease."""


@attrs.define(eq=False)
class HeldLease:
    """The lease of one session task, from its acquisition to its settle.

    ``open_child`` reports to it (`child_spawned`, `child_exited`); the task body
    says why its child ends (``cause``) and what failed (``failure``), both journaled
    by the settle. Owned by the session task.
    """

    session: Session
    write: Write
    lease: Lease  # as acquired: its fence and generation; ``session.lease`` is current
    cause: ExitCause = "unexpected"
    failure: RpcError | None = None
    stderr_tail: str | None = None  # the end of the agent's stderr, when it failed
    # None until a spawned process was laddered; an EndOutcome when the holder that
    # held it was lost and it was ended by its identity (agentsd.held_child).
    proof: Proof = None
    settle_error: RpcError | None = None  # why the settle could not be committed
    # Its agent was handed over to the next image (``agentsd.session_task`` Rule 2): it
    # runs on, nothing ended, so nothing is settled and the lease stays held.
    handed_over: bool = False

    async def child_spawned(self, identity: ChildIdentity) -> None:
        """Make the child's identity durable (the lease goes live) before its
        handshake. Raises what the store raises; the child is laddered all the same."""
        lease = self.lease
        ident = Identity(pid=identity.pid, pgid=identity.pgid, start_time=identity.start_time)
        with trio.move_on_after(SETTLE_TIMEOUT_S) as slow:
            live, _ = await self.write(
                lambda conn: lease_rows.lease_live(conn, lease, ident, time.time())
            )
        if slow.cancelled_caught:
            # It may still commit; the settle, queued behind it, releases the lease.
            raise StorageUnavailable(
                f"storage too slow: recording the agent took over {SETTLE_TIMEOUT_S:g} s"
            )
        self.session.lease = live
        self.session.child = ChildInfo(
            pid=identity.pid,
            pgid=identity.pgid,
            generation=lease.generation,
            started_at=time.time(),
        )

    def child_exited(self, proof: ChildExit | EndOutcome) -> None:
        self.proof = proof


@asynccontextmanager
async def open_lease(
    session: Session,
    write: Write,
    refused: Callable[[RpcError], None],
    *,
    handover: Lease | None = None,
) -> AsyncIterator[HeldLease]:
    """Acquire the session's next lease and yield it held; settle it on exit.

    Entering takes fence + 1 and reserves the lease durably, before anything is
    spawned (shielded, at most ``SETTLE_TIMEOUT_S``); the session goes ``starting``.
    It raises what the store raises (``StorageUnavailable``), and then nothing is
    held. When the store takes longer (Rule 4), ``refused`` hears
    ``StorageUnavailable`` at once, the reservation is withdrawn (shielded, at most
    ``WITHDRAW_TIMEOUT_S``) and then that error is raised.

    With ``handover`` (a live lease an earlier daemon held, whose agent the holder
    kept running), entering takes that lease over instead of acquiring one
    (``store.leases.hand_over_lease``: fence + 1, the same child, its undelivered
    submissions settled ``unknown``, ``child.reattached``), from ``exit-unproven``.
    Its agent runs already: until the body's ladder reports a proof, the held
    lease's ``proof`` says the exit is unproven, so a body that fails before its
    ladder leaves the lease held (Rule 1), never released on "never started".

    Exit runs whatever ended the body, after it: so after the child nested inside was
    laddered. The session goes ``stopping``, then `settle` runs with the held lease's
    ``proof``, ``cause`` and ``failure``, shielded and at most ``SETTLE_TIMEOUT_S``;
    unless the child was handed over (``handed_over``): then nothing is settled and
    the lease stays held, durably as it is, for the next daemon.
    Exit never raises: if the store refuses or is too slow, the lease stays held, the
    session is ``exit-unproven`` with a ``storage_unavailable`` error, and
    ``settle_error`` says why. The body's exception propagates unchanged.
    """
    # Shielded: once the fence is taken durably, this task must learn it, so that
    # the lease is settled below even if a close arrived meanwhile.
    if handover is not None:
        taken = handover
        undispatched = sorted(session.conversation.undispatched)
        from_seq = session.head_seq
        with trio.CancelScope(shield=True), trio.fail_after(SETTLE_TIMEOUT_S):
            lease, _ = await write(
                lambda conn: lease_rows.hand_over_lease(
                    conn, taken, from_seq, undispatched, time.time()
                )
            )
        session.lease = lease
        session.row = attrs.evolve(session.row, fence=lease.fence)
        session.transition("starting")
        held = HeldLease(session=session, write=write, lease=lease)
        held.proof = ExitUnproven("the agent taken over was never laddered")
        try:
            yield held
        finally:
            await _settle_held(session, write, held)
        return
    with trio.CancelScope(shield=True):
        with trio.move_on_after(SETTLE_TIMEOUT_S) as slow:
            lease, _ = await write(
                lambda conn: lease_rows.acquire_lease(conn, session.id, time.time())
            )
        if slow.cancelled_caught:
            error = StorageUnavailable(
                f"storage too slow: reserving the agent's lease took over "
                f"{SETTLE_TIMEOUT_S:g} s; nothing was started, retry later"
            )
            refused(error)
            await _withdraw(session, write, error)
            raise error
    session.lease = lease
    session.row = attrs.evolve(session.row, fence=lease.fence)
    session.error = None
    session.transition("starting")
    held = HeldLease(session=session, write=write, lease=lease)
    try:
        yield held
    finally:
        await _settle_held(session, write, held)


async def _settle_held(session: Session, write: Write, held: HeldLease) -> None:
    """`open_lease`'s exit: settle, unless the agent was handed over."""
    session.transition("stopping")
    if held.handed_over:
        log.info("session %s: lease %d handed over, still held", session.id, held.lease.fence)
        return
    settled = False
    with trio.CancelScope(shield=True), trio.move_on_after(SETTLE_TIMEOUT_S):
        try:
            await settle(session, write, held.cause, held.proof, held.failure, held.stderr_tail)
            settled = True
        except RpcError as exc:
            log.error("session %s: could not record its agent's end: %s", session.id, exc)
            held.settle_error = exc
    if not settled:
        # The child is gone (or unproven) but the store did not take the settle:
        # the lease stays held durably, and the next start or close retries.
        session.transition("exit-unproven")
        session.error = SessionError(
            kind="storage_unavailable",
            message="the end of the agent could not be recorded; close to retry",
            at=time.time(),
        )
        if held.settle_error is None:
            held.settle_error = StorageUnavailable(
                f"recording the end of the agent took over {SETTLE_TIMEOUT_S:g} s"
            )


async def settle(
    session: Session,
    write: Write,
    cause: ExitCause,
    proof: Proof,
    failure: RpcError | None = None,
    stderr_tail: str | None = None,
) -> None:
    """Settle ``session.lease``, which is held, on the end of its child (Rule 1).

    With proof, one commit settles the conversation (`settle_events`), journals
    ``child.exited`` and releases the lease; the session goes ``stopped``. Without,
    ``exit.unproven`` is journaled and the lease stays held; the session goes
    ``exit-unproven``. Raises what ``write`` raises (``StorageUnavailable``), and then
    nothing changed, in memory or durably. Callers shield and bound it.
    """
    lease = session.lease
    assert lease is not None and lease.held, "settle takes a held lease"
    evidence = _evidence(proof, cause)
    now = time.time()
    error = None
    if failure is not None:
        error = SessionError(kind=failure.kind, message=failure.message, at=now)
    if evidence.proven:
        events: list[Event] = [
            *settle_events(session, cause),
            exited_event(cause, evidence, failure, stderr_tail, oom_kills(proof)),
        ]
        last_exit = ExitInfo(
            cause=cause,
            returncode=evidence.returncode,
            signal=evidence.signal,
            at=now,
            stderr_tail=stderr_tail,
        )
        released, _ = await write(
            lambda conn: lease_rows.lease_released(
                conn,
                lease,
                evidence,
                now,
                events,
                last_exit=msgspec.to_builtins(last_exit),
                error=None if error is None else msgspec.to_builtins(error),
            )
        )
        session.lease = released
        session.child = None
        session.last_exit = last_exit
        session.error = error
        session.transition("stopped")
    else:
        log.error(
            "session %s: exit of its agent could not be proven: %s", session.id, evidence.detail
        )
        unproven: list[Event] = [events_api.ExitUnproven(cause=cause, detail=evidence.detail)]
        held, _ = await write(
            lambda conn: lease_rows.lease_unproven(conn, lease, evidence, now, unproven)
        )
        session.lease = held
        session.error = error
        session.transition("exit-unproven")


async def _withdraw(session: Session, write: Write, error: StorageUnavailable) -> None:
    """Release the reservation of an acquisition the caller gave up on, if it
    committed (Rule 4): queued behind it, this runs after it. Shielded by the
    caller; at most ``WITHDRAW_TIMEOUT_S``. Never raises."""
    known = session.fence
    evidence = _evidence(None, "failed")
    now = time.time()
    last_exit = ExitInfo(cause="failed", at=now)
    session_error = SessionError(kind=error.kind, message=error.message, at=now)
    op = functools.partial(
        lease_rows.withdraw_reservation,
        session_id=session.id,
        known_fence=known,
        evidence=evidence,
        now=now,
        events=[exited_event("failed", evidence, error)],
        last_exit=msgspec.to_builtins(last_exit),
        error=msgspec.to_builtins(session_error),
    )
    with trio.move_on_after(WITHDRAW_TIMEOUT_S) as late:
        try:
            withdrawn, _ = await write(op)
        except lease_rows.NoReservation:
            return  # the acquisition never committed
        except RpcError as exc:
            log.error("session %s: could not withdraw its lease reservation: %s", session.id, exc)
            return
    if late.cancelled_caught:
        log.error(
            "session %s: storage too slow to withdraw a lease reservation in %g s; "
            "recovery settles it at the next daemon start",
            session.id,
            WITHDRAW_TIMEOUT_S,
        )
        return
    session.lease = withdrawn
    session.row = attrs.evolve(session.row, fence=withdrawn.fence)
    session.last_exit = last_exit
    session.error = session_error


def exited_event(
    cause: ExitCause,
    evidence: ExitEvidence,
    failure: RpcError | None,
    stderr_tail: str | None = None,
    oom_kills: int | None = None,
) -> ChildExited:
    """The one ``child.exited``, whoever settles: how the child ended (``returncode``
    or ``signal`` when it was our own and reaped), the evidence in words, the
    failure that ended it, if any, and the end of what it wrote to stderr."""
    return ChildExited(
        cause=cause,
        returncode=evidence.returncode,
        signal=evidence.signal,
        detail=evidence.detail,
        error=None if failure is None else ErrorInfo(kind=failure.kind, message=failure.message),
        stderr_tail=stderr_tail,
        oom_kills=oom_kills,
    )


def oom_kills(proof: Proof) -> int | None:
    """The OOM kills counted in the proven-empty cgroup of the child, if known."""
    return proof.oom_kills if isinstance(proof, ExitProof) else None


def exit_cause(stopped: ExitCause | None, failure: RpcError | None, proof: Proof) -> ExitCause:
    """Why a child ended: what stopped it (a close, the idle timer, a shutdown), else
    ``failed`` (a start or protocol failure), ``oom`` (it ended by itself after the
    OOM killer had killed in its cgroup: its memory limit was reached), or
    ``unexpected``."""
    cause = stopped or ("failed" if failure is not None else "unexpected")
    if cause == "unexpected" and (oom_kills(proof) or 0) > 0:
        return "oom"
    return cause


def _evidence(proof: Proof, cause: ExitCause) -> ExitEvidence:
    match proof:
        case None:
            return ExitEvidence(cause=cause, proven=True, detail="the agent was never started")
        case ExitProof(
            returncode=returncode, signal=signal, stragglers_killed=killed, cgroup_empty=empty
        ):
            words = [f"{killed} stragglers killed"] if killed else []
            if empty:
                words.append("its cgroup was empty")
            detail = ", ".join(words)
            return ExitEvidence(
                cause=cause, proven=True, returncode=returncode, signal=signal, detail=detail
            )
        case ExitUnproven(reason=reason):
            return ExitEvidence(cause=cause, proven=False, detail=reason)
        case EndOutcome.ENDED:
            return ExitEvidence(cause=cause, proven=True, detail="found running and ended")
        case EndOutcome.ALREADY_GONE:
            return ExitEvidence(cause=cause, proven=True, detail="already gone")
        case EndOutcome.UNPROVEN:
            return ExitEvidence(cause=cause, proven=False, detail="still running after the ladder")
        case _:
            assert_never(proof)


def recorded_identity(lease: Lease) -> ChildIdentity:
    """The identity of a lease's child, to find its leftovers."""
    ident = lease.identity
    if ident is None:
        # Reserved but never confirmed: only its token can find what it spawned.
        return ChildIdentity(pid=0, pgid=0, start_time=-1, token=lease.token)
    return ChildIdentity(
        pid=ident.pid, pgid=ident.pgid, start_time=ident.start_time, token=lease.token
    )


def settle_events(session: Session, cause: ExitCause) -> list[Event]:
    """What a child's end settles in the conversation: its open turn and its pending
    approvals (absent evidence is ``unknown``/``interrupted``, never success)."""
    convo = session.conversation
    events: list[Event] = []
    for approval in convo.approvals.values():
        if approval.approval_id in session.claims:
            continue  # a client's answer is being committed; it wins
        events.append(
            ApprovalResolved(approval_id=approval.approval_id, decision="cancelled", by="daemon")
        )
    if convo.turn_open:
        outcome: TurnOutcome = (
            "interrupted"
            if cause in ("requested", "shutdown", "idle", "daemon-restart")
            else "unknown"
        )
        events.append(TurnCompleted(turn_id=convo.turn_id, outcome=outcome, reason=cause))
    for cmid in sorted(convo.undispatched):
        events.append(SubmissionDispatched(client_message_id=cmid, outcome="unknown", reason=cause))
    return events
