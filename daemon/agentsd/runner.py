"""The session task: one trio task per live agent child (DESIGN.md section 2).

    run_session:
        async with open_lease(session) as held:           # fence + 1, durable, before spawn
            async with open_child(spec, ladder, held...):  # identity durable before handshake
                adapter.handshake, then serve until stopped, idle, or the child exits
            # open_child's exit: the shielded, bounded close ladder; the child is reaped
        # open_lease's exit: settle with the ladder's proof (or keep it held: exit-unproven)

Rule 1 (reap before release): the lease is settled only by ``open_lease``'s exit,
which runs after ``open_child``'s, and released only with proof
(``agentsd.held_lease``).

Rule 2 (bounded cleanup): the settle runs under a shield with a time bound; a store
that cannot take it leaves the lease held in the database (the next start or close
retries, and recovery at the next daemon start re-proves the exit).

Rule 3: a session task never raises into the supervisor's nursery. Failures are
journaled, recorded on the session and reported to whoever waits for the start.

Rule 4 (takeover): a task started with a ``Reattachable`` (``agentsd.reattach``)
takes over the lease and the running agent an earlier daemon left in the holder
instead of acquiring and spawning: no handshake, ``Adapter.take_over``, then the
same serving and the same ladder. If the lease cannot be taken over, the agent is
ended by its identity and the lease settled, as recovery would have; if the agent
cannot be claimed or its adapter cannot take over, it is ended by the ladder; either
way with cause ``daemon-restart``, so its turn is cut off as without the holder.

Rule 5 (handover): a planned restart whose agents the holder keeps stops each
served session with `SessionTask.hand_over` instead of `SessionTask.stop`: the
reader stops between two frames (``LineLink.stop_at_boundary``), the streamed text
is journaled (a commit), and the agent is left running: no close ladder
(``HeldChild.hand_over``), no settle (``HeldLease.handed_over``: the lease stays
held, for the next image to take over), the holder link detaches. A handover that
cannot be made (the agent exited meanwhile, the holder was lost) or that a
``stop`` overtakes before the boundary ends the agent as a shutdown does.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Literal

import attrs
import msgspec
import trio

from agentsd.agent_watch import current_watch
from agentsd.child import Child, open_child
from agentsd.child import ChildSpec as ProcessSpec
from agentsd.delivery import drain_queue
from agentsd.held_child import HeldChild, adopt_held_child, open_held_child
from agentsd.held_lease import (
    SETTLE_TIMEOUT_S,
    HeldLease,
    exit_cause,
    open_lease,
    recorded_identity,
    settle,
)
from agentsd.holder_link import HolderLost, HolderRefused
from agentsd.leases import Lease, LeaseError
from agentsd.leftovers import ChildIdentity, EndOutcome, end_contained
from agentsd.procfs import current_scanner
from agentsd.providers.base import Adapter, LineLink, Provider, Resume, Takeover
from agentsd.providers.versions import settle_version
from agentsd.reattach import takeover_state
from agentsd.session import Session, had_turns, was_ready
from agentsd.sink import HeldOutput, Sink
from agentsd.stderr_log import StderrLog
from agentsd_protocol.api.events import ChildReady, Event
from agentsd_protocol.api.session import ChildInfo, ExitCause
from agentsd_protocol.errors import (
    AgentExited,
    AgentNotFound,
    AgentStartFailed,
    HandshakeTimeout,
    RpcError,
    StorageUnavailable,
)

if TYPE_CHECKING:
    from agentsd.recovery import Reattachable
    from agentsd.supervisor import Supervisor

log = logging.getLogger(__name__)

# After the agent exited, how long its output may take to end by itself before what
# it left running is ended: everything it wrote is in the pipe already, and an
# agent whose descendants are gone reaches end of output at once.
EXIT_EOF_GRACE_S = 0.5
# After that, how long reading what remains in the pipe may take (at most a pipe's
# 64 KiB plus a partial line, journaled; a slow disk is the reason for the margin)
# before the reader is stopped: something no scan finds holds the pipe.
EXIT_DRAIN_S = 10.0
MAX_QUOTED_CHARS = 500  # of the agent's last stderr line, in a start error's message

StopCause = ExitCause | Literal["handover"]
"""Why a session task stops: an ``ExitCause``, journaled with its agent's end; or
``handover`` (Rule 5), which ends no agent and is never journaled: if the handover
cannot be made the agent ends as in a shutdown (`journaled_cause`)."""


def journaled_cause(stop: StopCause | None) -> ExitCause | None:
    """The exit cause a stop is journaled with once its agent ends."""
    return "shutdown" if stop == "handover" else stop


@attrs.define(eq=False)
class SessionTask:
    """The control handle of one running session task."""

    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    ready: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)
    start_error: RpcError | None = None
    # Its lease, once acquired; ``held.settle_error`` says why the end of its agent
    # could not be recorded (the lease stays held; Rule 2).
    held: HeldLease | None = None
    stop_cause: StopCause | None = None
    adapter: Adapter | None = None
    # While the agent's output is read after its handshake: its link and the scope
    # around the reader, which a handover cancels at a frame boundary (Rule 5).
    reader: tuple[LineLink, trio.CancelScope] | None = None
    at_boundary: bool = False  # the reader stopped for a handover, between two frames
    handed_over: bool = False  # the agent was left running in the holder
    last_activity: float = attrs.field(factory=time.monotonic)
    # While the agent is served: where the queue's head is sent from, and whether a
    # send of it runs (``wake_queue``).
    _queue_sender: tuple[trio.Nursery, Callable[[], Awaitable[None]]] | None = None
    _draining: bool = False

    def serve_queue(
        self, sender: tuple[trio.Nursery, Callable[[], Awaitable[None]]] | None
    ) -> None:
        """Send queued prompts with ``sender``'s function from its nursery (the
        serving one: the agent's end cancels a send in flight, whose submission its
        exit settles); None once that nursery closed."""
        self._queue_sender = sender

    def wake_queue(self) -> None:
        """The queue's head is due: send it, unless a send of it runs already or the
        agent is not served. Called by the journal port after a commit; a task runs
        only while there is something to send."""
        sender = self._queue_sender
        if sender is None or self._draining:
            return
        self._draining = True
        nursery, drain = sender
        nursery.start_soon(self._drain_queue, drain)

    async def _drain_queue(self, drain: Callable[[], Awaitable[None]]) -> None:
        try:
            await drain()
        finally:
            self._draining = False

    def stop(self, cause: ExitCause) -> None:
        """Stop the task now (cancellation); its agent is ended and its lease
        settled with ``cause``. A handover whose reader reached its boundary is
        left to finish; one that had not is abandoned (Rule 5)."""
        if self.stop_cause == "handover":
            if self.at_boundary:
                return
            self.stop_cause = cause
        elif self.stop_cause is None:
            self.stop_cause = cause
        self.scope.cancel()

    def hand_over(self) -> bool:
        """Stop at the next frame boundary and leave the agent running for the next
        image (Rule 5); ``done`` is set once the task has finished. False, and
        nothing is done, when the task is stopping already or its agent's output
        is not being read (before its handshake completed): stop it instead."""
        if self.stop_cause is not None or self.reader is None:
            return False
        self.stop_cause = "handover"
        link, reading = self.reader

        def at_boundary() -> None:
            if self.stop_cause == "handover":  # not abandoned meanwhile
                self.at_boundary = True
                reading.cancel()

        link.stop_at_boundary(at_boundary)
        return True

    def touch(self) -> None:
        self.last_activity = time.monotonic()


def _classify_start_failure(exc: BaseException, program: str) -> RpcError:
    if isinstance(exc, RpcError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return AgentNotFound(f"cannot start the agent: {program!r} was not found")
    if isinstance(exc, PermissionError):
        return AgentNotFound(f"cannot start the agent: {program!r} is not executable")
    if isinstance(exc, trio.TooSlowError):
        return HandshakeTimeout("the agent did not complete its handshake in time")
    if isinstance(exc, OSError):
        return AgentStartFailed(f"cannot start the agent: {exc.strerror or exc}")
    return AgentStartFailed(f"the agent failed to start: {type(exc).__name__}")


async def run_session(
    supervisor: Supervisor,
    session: Session,
    task: SessionTask,
    reattach: Reattachable | None = None,
) -> None:
    """The task body. Returns when the child is gone and its lease settled.
    ``reattach``: take that agent over (Rule 4)."""
    try:
        with task.scope:
            if reattach is None:
                await _run(supervisor, session, task)
            else:
                await _reattach(supervisor, session, task, reattach)
    except RpcError as exc:
        # A failure with a name, not a bug: the store refused to take the lease
        # (``storage_unavailable`` on a full disk). Whoever waits for the start gets it.
        log.warning("session %s: could not start its agent: %s", session.id, exc.message)
        if task.start_error is None and not task.ready.is_set():
            task.start_error = exc
    except Exception as exc:
        # Rule 3: the session boundary. The failure is already journaled by _run
        # when it concerns the agent; anything else is a bug, logged here.
        log.exception("session %s task failed", session.id)
        if task.start_error is None and not task.ready.is_set():
            task.start_error = _classify_start_failure(exc, "")
    finally:
        if not task.ready.is_set():
            if task.start_error is None:
                task.start_error = AgentExited("the session stopped before its agent was ready")
            task.ready.set()
        session.task = None
        task.done.set()


async def _run(supervisor: Supervisor, session: Session, task: SessionTask) -> None:
    provider = supervisor.provider(session.row.provider)
    async with open_lease(
        session, session.journal.write, functools.partial(_refuse_start, task)
    ) as held:
        task.held = held
        stderr = StderrLog(
            supervisor.stderr_path(session.id), supervisor.config.stderr_log_max_bytes
        )
        failure: RpcError | None = None
        try:
            async with stderr.capture() as stderr_fd:
                failure = await _run_child(supervisor, session, task, provider, held, stderr_fd)
        finally:
            task.adapter = None
            held.handed_over = task.handed_over
            held.cause = exit_cause(journaled_cause(task.stop_cause), failure, held.proof)
            if held.cause in ("failed", "unexpected", "oom"):
                # The agent's own words on why it ended (``agentsd.stderr_log`` Rule 2).
                held.stderr_tail = stderr.tail()
                failure = _quoting_stderr(failure, held.stderr_tail)
            held.failure = failure
            if failure is not None and not task.ready.is_set():
                task.start_error = failure


async def _reattach(
    supervisor: Supervisor, session: Session, task: SessionTask, reattach: Reattachable
) -> None:
    """Rule 4."""
    provider = supervisor.provider(session.row.provider)
    undispatched = tuple(sorted(session.conversation.undispatched))
    taken = False
    try:
        async with open_lease(
            session,
            session.journal.write,
            functools.partial(_refuse_start, task),
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
                if failure is not None and task.stop_cause is None:
                    task.stop_cause = "daemon-restart"  # not taken over: cut off, as without
                held.handed_over = task.handed_over
                held.cause = exit_cause(journaled_cause(task.stop_cause), failure, held.proof)
                if held.cause in ("failed", "unexpected", "oom"):
                    held.stderr_tail = stderr.tail()
                    failure = _quoting_stderr(failure, held.stderr_tail)
                held.failure = failure
                if failure is not None and not task.ready.is_set():
                    task.start_error = failure
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
    """`_run_child` for a takeover (Rule 4): claim the agent from the holder, build
    its adapter over the link read from the durable position, take over, serve."""
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
            state, items = await takeover_state(
                supervisor.store, session, held.lease.fence, undispatched
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
            failure = await _attend(
                supervisor,
                session,
                held.lease,
                task,
                child,
                adapter,
                sink,
                None,
                state,
                link=line_link,
            )
            if task.at_boundary:
                task.handed_over = child.hand_over()  # Rule 5
            return failure
    except RpcError as exc:
        return exc
    except (HolderLost, HolderRefused) as exc:
        return AgentStartFailed(f"the agent could not be taken over: {exc}")


def _refuse_start(task: SessionTask, error: RpcError) -> None:
    """Tell whoever waits for the start, now; the task goes on cleaning up."""
    if not task.ready.is_set():
        task.start_error = error
        task.ready.set()


async def _run_child(
    supervisor: Supervisor,
    session: Session,
    task: SessionTask,
    provider: Provider,
    held: HeldLease,
    stderr_fd: int,
) -> RpcError | None:
    """Spawn the agent, handshake and serve it until it ends; the failure that ended
    it, if any. Raises nothing but cancellation (the stderr reader's nursery is
    around it)."""
    program = "agent"
    try:
        environment = await supervisor.agent_env.snapshot()
        process_spec = _process_spec(
            supervisor, session, provider, held.lease, environment.env, stderr_fd
        )
        program = process_spec.argv[0]
        # With the config's ``holder``, the agent is the holder's child, not ours.
        reattachable = supervisor.reattaches
        opened = (
            open_child(process_spec, supervisor.ladder, held.child_spawned, held.child_exited)
            if supervisor.holder is None
            else open_held_child(
                process_spec,
                supervisor.ladder,
                held.child_spawned,
                held.child_exited,
                await supervisor.holder.link(),
                durable_acks=reattachable,
            )
        )
        async with opened as child:
            line_link = LineLink(child.stdin, child.stdout)
            output = None
            if reattachable and isinstance(child, HeldChild):
                # A later daemon may take this agent over: journal where its output
                # is journaled up to (agentsd.sink Rule 4).
                line_link.cursor.on_overrun = child.agent.give_up_exactness
                output = HeldOutput(
                    cursor=line_link.cursor, acknowledge=child.agent.acknowledge_out
                )
            sink = Sink(session, held.lease, task, output)
            adapter = provider.adapter(line_link, sink, session.row)
            failure = await _attend(
                supervisor,
                session,
                held.lease,
                task,
                child,
                adapter,
                sink,
                process_spec,
                link=line_link,
            )
            if task.at_boundary and isinstance(child, HeldChild):
                task.handed_over = child.hand_over()  # Rule 5
            return failure
    except RpcError as exc:
        return exc
    except (OSError, trio.TooSlowError) as exc:
        return _classify_start_failure(exc, program)
    except HolderLost as exc:
        return AgentStartFailed(f"cannot start the agent: the holder is unavailable: {exc}")


def _quoting_stderr(failure: RpcError | None, tail: str | None) -> RpcError | None:
    """``failure`` with the last line the agent wrote to stderr in its message and
    the whole tail in its details (``stderrTail``): "exited during its handshake"
    alone does not say why."""
    if failure is None or tail is None:
        return failure
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    last = lines[-1] if len(lines[-1]) <= MAX_QUOTED_CHARS else lines[-1][:MAX_QUOTED_CHARS] + "..."
    return type(failure)(
        f"{failure.message}; its stderr ends: {last}", **failure.details, stderrTail=tail
    )


def _process_spec(
    supervisor: Supervisor,
    session: Session,
    provider: Provider,
    lease: Lease,
    base_env: Mapping[str, str],
    stderr_fd: int,
) -> ProcessSpec:
    """What to spawn, over ``base_env`` (``agentsd.agent_env``). A function of its own
    so that nothing it builds on the way (the launch spec, an evolved row) stays
    referenced for the session's life."""
    configured = supervisor.config.providers.get(session.row.provider)
    row = session.row
    if configured is not None and configured.command and not row.command:
        # The daemon's config names the program; a session's own command wins.
        row = attrs.evolve(row, command=configured.command)
    provider_env = configured.env if configured is not None else {}
    # The provider finds its program and state in what the agent will see.
    spec = provider.launch(row, supervisor.state_dir, {**base_env, **provider_env})
    return ProcessSpec(
        argv=list(spec.argv),
        cwd=row.cwd,
        # Layered over the shared base at the spawn, not copied here.
        env={**provider_env, **spec.env, **row.env},
        base_env=base_env,
        token=lease.token,
        stderr_fd=stderr_fd,
        cgroup_root=supervisor.containment.root,
        limits=supervisor.limits(session),
    )


async def _handshake(
    supervisor: Supervisor,
    session: Session,
    lease: Lease,
    task: SessionTask,
    adapter: Adapter,
    sink: Sink,
    spec: ProcessSpec,
) -> None:
    timeout_s = supervisor.config.handshake_timeout_s
    resume = None
    if session.row.provider_handle is not None:
        turns, ready_before = await supervisor.store.read(
            lambda conn: (had_turns(conn, session.id), was_ready(conn, session.id))
        )
        # A handle before any child was ready is one the session adopted
        # (``create {resumeFrom}``): it must exist, and its history is imported.
        adopt = not ready_before
        resume = Resume(handle=session.row.provider_handle, had_turns=turns or adopt, adopt=adopt)
    try:
        with trio.fail_after(timeout_s):
            handle = await adapter.handshake(resume)
    except trio.TooSlowError:
        raise HandshakeTimeout(
            f"the agent did not complete its handshake within {timeout_s:g} s"
        ) from None
    provider = supervisor.provider(session.row.provider)
    version = await settle_version(
        supervisor.agent_env.versions,
        provider.program,
        provider.minimum_version,
        adapter.agent_version,
        spec.argv[0],
        {**spec.base_env, **spec.env},
    )
    if session.child is not None:
        session.child = msgspec.structs.replace(session.child, agent_version=version)
    ready = ChildReady(
        provider_handle=handle,
        generation=lease.generation,
        agent_version=version,
        agent_name=adapter.agent_name,
    )
    events: list[Event] = [] if adapter.superseded is None else [adapter.superseded]
    if resume is not None and resume.adopt:
        events += await adapter.imported_history()
    # What the handshake read is done with: a takeover reads on after it.
    output = sink.handshake_position()
    with trio.move_on_after(SETTLE_TIMEOUT_S) as slow:
        await session.journal.append(
            [*events, ready],
            fence=lease.fence,
            provider_handle=handle,
            output=output,
        )
        sink.made_durable(output)
    if slow.cancelled_caught:
        raise StorageUnavailable(
            f"storage too slow: recording the agent ready took over {SETTLE_TIMEOUT_S:g} s"
        )
    session.transition("running")
    task.adapter = adapter
    task.touch()
    task.ready.set()


async def _take_over(
    supervisor: Supervisor,
    session: Session,
    task: SessionTask,
    adapter: Adapter,
    takeover: Takeover,
) -> None:
    """Rule 4's handshake: the adapter restores its state from the journal's; no
    frame is sent. Raises what ``take_over`` raises (``ResumeFailed``)."""
    timeout_s = supervisor.config.handshake_timeout_s
    try:
        with trio.fail_after(timeout_s):
            await adapter.take_over(takeover)
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


async def _attend(
    supervisor: Supervisor,
    session: Session,
    lease: Lease,
    task: SessionTask,
    child: Child | HeldChild,
    adapter: Adapter,
    sink: Sink,
    spec: ProcessSpec | None,
    takeover: Takeover | None = None,
    *,
    link: LineLink,
) -> RpcError | None:
    """Handshake (or, with ``takeover``, take over: Rule 4; ``spec`` is then None),
    then translate the agent's output until it ends, the task is stopped, or a
    handover stops the reader at a frame boundary (Rule 5): ``link`` is the
    adapter's, which the handover stops. Returns the failure that ended it, if any;
    never raises anything but cancellation, so the nursery below never wraps an
    error in a group.

    The child itself is watched meanwhile (``agentsd.agent_watch``, which ends
    ``_keep_time``; then ``_outlive``): its exit, not the end of its output, is
    what says it is gone, since a process it started in the
    background may hold its stdout for ever. Once it exited, its output gets
    ``EXIT_EOF_GRACE_S`` to end on its own, then what it left running is ended
    (``Child.end_remains``), which ends the output; should something no scan can
    find still hold it after ``EXIT_DRAIN_S``, the reader is stopped.

    Two tasks per live agent, each task parked per session costing memory at
    hundreds of sessions: a child task runs the handshake and then reads the
    agent, and the session task itself keeps the session's time (``_keep_time``)
    instead of waiting idle in the nursery. The agent's exit and its stderr are
    watched by the daemon's one watcher thread (``agentsd.agent_watch``)."""
    failure: list[RpcError] = []
    exited = False  # the watch saw the child exit

    def exit_seen() -> None:
        nonlocal exited
        exited = True
        if sink.alarm is not None:
            sink.alarm.cancel()

    async def handshake_and_read() -> None:
        try:
            if takeover is not None:
                await _take_over(supervisor, session, task, adapter, takeover)
            else:
                assert spec is not None
                await _handshake(supervisor, session, lease, task, adapter, sink, spec)
        except RpcError as exc:
            failure.append(exc)
            nursery.cancel_scope.cancel()
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            failure.append(AgentExited("the agent exited during its handshake"))
            nursery.cancel_scope.cancel()
            return
        task.serve_queue((nursery, functools.partial(drain_queue, supervisor, session)))
        try:
            with trio.CancelScope() as reading:
                task.reader = (link, reading)
                await adapter.run()
        except RpcError as exc:
            failure.append(exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the pipe broke: the child is gone, the ladder proves it
        finally:
            task.reader = None
        if task.stop_cause is None:
            task.stop_cause = "failed" if failure else "unexpected"
        nursery.cancel_scope.cancel()

    release_watch = _watch_exit(child, exit_seen)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(handshake_and_read)
            try:
                if await _keep_time(supervisor, session, task, sink, lambda: exited):
                    await _outlive(session, task, child, await child.wait(), failure)
            finally:
                task.serve_queue(None)
            nursery.cancel_scope.cancel()
    finally:
        release_watch()
    task.adapter = None
    if task.ready.is_set():
        with trio.CancelScope(shield=True), trio.move_on_after(SETTLE_TIMEOUT_S):
            try:
                await sink.flush_snapshots()
            except RpcError as exc:
                log.warning("could not journal the last streamed text: %s", exc.message)
    return failure[0] if failure else None


def _watch_exit(child: Child | HeldChild, exit_seen: Callable[[], None]) -> Callable[[], None]:
    """Call ``exit_seen`` once the child itself exited: our own child's pidfd in the
    daemon's watch, a held agent's exit as its holder reports it. What stops it."""
    if isinstance(child, HeldChild):
        return child.watch_exit(exit_seen)
    watch = current_watch()
    pidfd = watch.add_exit(child.process.pid, exit_seen)
    return functools.partial(watch.release, pidfd)


async def _outlive(
    session: Session,
    task: SessionTask,
    child: Child | HeldChild,
    returncode: int,
    failure: list[RpcError],
) -> None:
    """The child exited (its own exit, not the end of its output): give its output
    ``EXIT_EOF_GRACE_S`` to end, then end what it left running, then give the output
    ``EXIT_DRAIN_S`` more before the caller stops reading it. The end of the output
    cancels this at any point."""
    if task.stop_cause is None:
        log.warning("session %s: its agent %s", session.id, _exit_status(returncode))
        if task.ready.is_set():
            task.stop_cause = "unexpected"
    await trio.sleep(EXIT_EOF_GRACE_S)
    await child.end_remains()
    await trio.sleep(EXIT_DRAIN_S)
    log.warning("session %s: its agent's output did not end after it exited", session.id)
    if not task.ready.is_set():
        failure.append(AgentExited(f"the agent {_exit_status(returncode)} during its handshake"))


def _exit_status(returncode: int) -> str:
    if returncode < 0:
        return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


async def _keep_time(
    supervisor: Supervisor,
    session: Session,
    task: SessionTask,
    sink: Sink,
    exited: Callable[[], bool],
) -> bool:
    """Until the child exited (``exited()``, which holds once the watch cancelled
    the alarm: True), journal streamed text at most ``SNAPSHOT_INTERVAL_S`` after
    it arrived, and stop an agent that did nothing for ``idle_timeout_s`` while its
    session was idle (a long silent turn or a pending approval is not idleness;
    an agent not ready yet is never idle): False once it stopped the agent. One
    deadline serves both, and ``Sink.delta`` pulls it in when text starts to
    stream: an idle session never wakes on a period (20 wakeups a second each
    would cost most of a core at a few hundred sessions)."""
    idle_s = supervisor.config.idle_timeout_s
    while not exited():
        idle_at = trio.current_time() + (task.last_activity + idle_s - time.monotonic())
        with trio.CancelScope(deadline=min(idle_at, sink.snapshot_due)) as alarm:
            sink.alarm = alarm
            try:
                await trio.sleep_forever()
            finally:
                sink.alarm = None
        if exited():
            break
        if sink.snapshot_due <= trio.current_time():
            try:
                await sink.flush_snapshots()
            except RpcError as exc:
                # A snapshot is only a cache of streamed text; the next one retries.
                log.warning("could not journal streamed text: %s", exc.message)
        if time.monotonic() - task.last_activity >= idle_s:
            if session.status != "idle" or not task.ready.is_set():
                task.touch()
            else:
                log.info("stopping an agent idle for %g s", idle_s)
                task.stop("idle")
                return False
    return True
