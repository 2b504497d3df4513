"""The takeover: a session task that adopts the agent an earlier daemon left running
in the holder, instead of acquiring a lease and spawning (``agentsd.runner``).

With the holder and ``crash_policy = "reattach"`` (or after a handover,
``agentsd.session_task`` Rule 2), recovery hands the supervisor the held leases
whose agents the holder kept (``agentsd.recovery.Reattachable``); the supervisor
starts a session task for each with `run_takeover`.

Rule 1 (what is taken over): the lease is taken over (``open_lease`` with
``handover``: the fence moves on and ``child.reattached`` is journaled), the agent
is claimed from the holder (``adopt_held_child``) and read from the output offset
the journal holds, and its adapter restores its state from the journal
(``Adapter.take_over`` with ``agentsd.reattach.takeover_state``) instead of a
handshake: no frame is sent, but the answers and the interrupt of the open turn the
earlier daemon committed and never wrote (``agentsd.reattach`` Rule 2). Then the
same serving (``agentsd.attendance``), the
same ladder and the same settle as a started agent (``agentsd.runner`` Rules 1-3).

Rule 2 (or it is ended, as without the holder): if the lease cannot be taken over,
the agent is ended by its identity and the lease settled, as recovery would have
(`_abandon`); if the agent cannot be claimed or its adapter cannot take over, it is
ended by the ladder; either way with cause ``daemon-restart``, so its turn is cut
off as it would be without the holder.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING

import msgspec
import trio

from agentsd.attendance import attend
from agentsd.delivery import deliver_answer, deliver_interrupt
from agentsd.held_child import adopt_held_child
from agentsd.held_lease import (
    SETTLE_TIMEOUT_S,
    HeldLease,
    open_lease,
    recorded_identity,
    settle,
)
from agentsd.holder_link import HolderLost, HolderRefused
from agentsd.leases import LeaseError
from agentsd.leftovers import ChildIdentity, EndOutcome, end_contained
from agentsd.procfs import current_scanner
from agentsd.providers.base import Adapter, LineLink, Provider, Takeover
from agentsd.reattach import Answer, Interrupt, KeyedWrite, owed, takeover_state
from agentsd.session import Session
from agentsd.session_task import SessionTask, record_end
from agentsd.sink import HeldOutput, Sink
from agentsd.stderr_log import StderrLog
from agentsd_protocol.api.session import ChildInfo
from agentsd_protocol.errors import AgentStartFailed, HandshakeTimeout, RpcError

if TYPE_CHECKING:
    from agentsd.recovery import Reattachable
    from agentsd.supervisor import Supervisor

log = logging.getLogger(__name__)


async def run_takeover(
    supervisor: Supervisor, session: Session, task: SessionTask, reattach: Reattachable
) -> None:
    """The session task's body for ``reattach`` (``run_session`` calls it inside the
    task's scope and boundary): take it over (Rule 1) or end it (Rule 2). Raises what
    the task's boundary handles, once the lease is taken over."""
    provider = supervisor.provider(session.row.provider)
    undispatched = tuple(sorted(session.conversation.undispatched))
    taken = False
    try:
        async with open_lease(
            session,
            session.journal.write,
            task.refuse_start,
            handover=reattach.lease,
        ) as held:
            taken = True
            task.held = held
            stderr = StderrLog(
                supervisor.stderr_path(session.id), supervisor.config.stderr_log_max_bytes
            )
            failure: RpcError | None = None
            try:
                async with stderr.capture() as stderr_fd:
                    failure = await _take_over_child(
                        supervisor, session, task, provider, held, reattach, undispatched, stderr_fd
                    )
            finally:
                task.adapter = None
                task.link = None
                if failure is not None and task.stop_cause is None:
                    task.stop_cause = "daemon-restart"  # not taken over: cut off, as without
                record_end(task, held, failure, stderr)
    except (RpcError, LeaseError, trio.TooSlowError) as exc:
        if taken:
            raise
        log.error("session %s: could not take its agent over: %s", session.id, exc)
        task.start_error = AgentStartFailed(f"the agent could not be taken over: {exc}")
        await _abandon(supervisor, session, reattach)


async def _abandon(supervisor: Supervisor, session: Session, reattach: Reattachable) -> None:
    """The lease could not be taken over: end its agent by its identity and settle
    the lease, as recovery does (shielded, bounded by the ladder and the settle)."""
    outcome = await _end_by_identity(supervisor, recorded_identity(reattach.lease))
    with trio.CancelScope(shield=True), trio.move_on_after(SETTLE_TIMEOUT_S):
        try:
            await settle(session, session.journal.write, "daemon-restart", outcome)
        except RpcError as exc:
            log.error("session %s: could not record its agent's end: %s", session.id, exc)


async def _end_by_identity(supervisor: Supervisor, identity: ChildIdentity) -> EndOutcome:
    """End an agent this daemon could not take over, as recovery ends a previous
    daemon's (shielded, bounded by the ladder; never raises)."""
    with trio.CancelScope(shield=True):
        report = await end_contained(
            [identity],
            supervisor.ladder,
            current_scanner(),
            supervisor.containment.root,
            sweep=False,
        )
    return report.outcomes.get(identity, EndOutcome.UNPROVEN)


async def _take_over_child(
    supervisor: Supervisor,
    session: Session,
    task: SessionTask,
    provider: Provider,
    held: HeldLease,
    reattach: Reattachable,
    undispatched: tuple[str, ...],
    stderr_fd: int,
) -> RpcError | None:
    """``agentsd.runner``'s ``_run_child`` for a takeover (Rule 1): claim the agent
    from the holder, build its adapter over the link read from the durable position,
    take over, serve."""
    keeper = supervisor.holder
    link = None if keeper is None else keeper.current()
    identity = recorded_identity(reattach.lease)
    if link is None:
        # Lost since recovery: end the agent by its identity, as recovery would.
        held.child_exited(await _end_by_identity(supervisor, identity))
        return AgentStartFailed("the agent could not be taken over: the holder is gone")
    try:
        async with adopt_held_child(
            identity,
            supervisor.containment.root,
            supervisor.ladder,
            held.child_exited,
            link,
            reattach.out_offset,
            stderr_fd,
        ) as child:
            session.child = ChildInfo(
                pid=identity.pid,
                pgid=identity.pgid,
                generation=held.lease.generation,
                started_at=time.time(),
            )
            state, items, writes = await takeover_state(
                supervisor.store,
                session,
                held.lease.fence,
                undispatched,
                child.agent.stdin_key,
                child.agent.keys_known,
            )
            line_link = LineLink(child.stdin, child.stdout, base=reattach.out_offset)
            line_link.cursor.on_overrun = child.agent.give_up_exactness
            output = HeldOutput(
                cursor=line_link.cursor,
                acknowledge=child.agent.acknowledge_out,
                replay=(reattach.out_offset, reattach.out_skip),
                open_items=items,
            )
            sink = Sink(session, held.lease, task, output)
            adapter = provider.adapter(line_link, sink, session.row)
            failure = await attend(
                supervisor,
                session,
                task,
                child,
                adapter,
                sink,
                functools.partial(
                    _take_over, supervisor, session, task, adapter, state, writes, line_link
                ),
                link=line_link,
            )
            if task.at_boundary:
                task.handed_over = child.hand_over()  # agentsd.session_task Rule 2
            return failure
    except RpcError as exc:
        return exc
    except (HolderLost, HolderRefused) as exc:
        return AgentStartFailed(f"the agent could not be taken over: {exc}")


async def _take_over(
    supervisor: Supervisor,
    session: Session,
    task: SessionTask,
    adapter: Adapter,
    takeover: Takeover,
    writes: list[KeyedWrite],
    link: LineLink,
) -> None:
    """Rule 1's handshake: the adapter restores its state from the journal's; no
    frame is sent but the answers and the interrupt the earlier daemon committed and
    never wrote (``agentsd.reattach`` Rule 2). Raises what ``take_over`` raises
    (``ResumeFailed``)."""
    timeout_s = supervisor.config.handshake_timeout_s
    try:
        with trio.fail_after(timeout_s):
            await adapter.take_over(takeover)
            async with session.keyed_writes:  # in journal order, before any client's
                await _write_undelivered(session, adapter, link, writes)
    except trio.TooSlowError:
        raise HandshakeTimeout(
            f"the agent could not be taken over within {timeout_s:g} s"
        ) from None
    if session.child is not None and takeover.agent_version is not None:
        session.child = msgspec.structs.replace(session.child, agent_version=takeover.agent_version)
    session.transition("running")
    task.adapter = adapter
    task.touch()
    task.ready.set()


async def _write_undelivered(
    session: Session, adapter: Adapter, link: LineLink, writes: list[KeyedWrite]
) -> None:
    """Write the answers and the interrupt the earlier daemon committed and never
    wrote, each keyed with its seq, in journal order (``agentsd.reattach`` Rule 2):
    an interrupt only if the turn it named is still the open one, and once. An
    agent gone meanwhile ends the writing, not the takeover."""
    convo = session.conversation
    writing = owed(writes, convo.turn_open, convo.turn_id)
    for write in writes:
        if isinstance(write, Interrupt) and write not in writing:
            log.info(
                "session %s: not interrupting turn %s as asked at %d: it is not the open "
                "turn, or is interrupted once already",
                session.id,
                write.turn_id,
                write.seq,
            )
    try:
        for write in writing:
            if isinstance(write, Answer):
                log.warning(
                    "session %s: writing %s's answer %r, committed by the earlier daemon "
                    "and never written to the agent",
                    session.id,
                    write.approval_id,
                    write.decision,
                )
                await deliver_answer(
                    adapter, link, write.asked.native_id, write.seq, write.decision
                )
            else:
                log.warning(
                    "session %s: interrupting turn %s, as asked at %d: committed by the "
                    "earlier daemon and never written to the agent",
                    session.id,
                    write.turn_id,
                    write.seq,
                )
                # Its confirmation would be read by the reader, which runs once this
                # takeover is done: the turn's end tells the rest.
                await deliver_interrupt(adapter, link, write.turn_id, write.seq, confirm=False)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        # It ended while no daemon watched, or as a write went out: it is taken over
        # all the same, and its exit settles the rest.
        log.info("session %s: its agent ended before hearing what was owed", session.id)
