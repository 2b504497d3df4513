"""The session task: one trio task per live agent child (DESIGN.md section 2).

    run_session:
        async with open_lease(session) as held:           # fence + 1, durable, before spawn
            async with open_child(spec, ladder, held...):  # identity durable before handshake
                adapter.handshake, then serve until stopped, idle, or the child exits
            # open_child's exit: the shielded, bounded close ladder; the child is reaped
        # open_lease's exit: settle with the ladder's proof (or keep it held: exit-unproven)

Its control handle, stop and handover are ``agentsd.session_task``; serving the agent
once spawned is ``agentsd.attendance``; a task started with a ``Reattachable`` takes
over an agent an earlier daemon left in the holder instead (``agentsd.takeover``),
under the same rules.

Rule 1 (reap before release): the lease is settled only by ``open_lease``'s exit,
which runs after ``open_child``'s, and released only with proof
(``agentsd.held_lease``).

Rule 2 (bounded cleanup): the settle runs under a shield with a time bound; a store
that cannot take it leaves the lease held in the database (the next start or close
retries, and recovery at the next daemon start re-proves the exit).

Rule 3: a session task never raises into the supervisor's nursery. Failures are
journaled, recorded on the session and reported to whoever waits for the start.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs
import msgspec
import trio

from agentsd.attendance import attend
from agentsd.child import ChildSpec as ProcessSpec
from agentsd.child import open_child
from agentsd.held_child import HeldChild, open_held_child
from agentsd.held_lease import SETTLE_TIMEOUT_S, HeldLease, open_lease
from agentsd.holder_link import HolderLost
from agentsd.leases import Lease
from agentsd.providers.base import Adapter, LineLink, Provider, Resume
from agentsd.providers.versions import settle_version
from agentsd.session import Session, had_turns, was_ready
from agentsd.session_task import SessionTask, record_end
from agentsd.sink import HeldOutput, Sink
from agentsd.stderr_log import StderrLog
from agentsd.takeover import run_takeover
from agentsd_protocol.api.events import ChildReady, Event
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
    ``reattach``: take that agent over (``agentsd.takeover``)."""
    try:
        with task.scope:
            if reattach is None:
                await _run(supervisor, session, task)
            else:
                await run_takeover(supervisor, session, task, reattach)
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
    async with open_lease(session, session.journal.write, task.refuse_start) as held:
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
            task.link = None
            record_end(task, held, failure, stderr)


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
            failure = await attend(
                supervisor,
                session,
                task,
                child,
                adapter,
                sink,
                functools.partial(
                    _handshake, supervisor, session, held.lease, task, adapter, sink, process_spec
                ),
                link=line_link,
            )
            if task.at_boundary and isinstance(child, HeldChild):
                task.handed_over = child.hand_over()  # agentsd.session_task Rule 2
            return failure
    except RpcError as exc:
        return exc
    except (OSError, trio.TooSlowError) as exc:
        return _classify_start_failure(exc, program)
    except HolderLost as exc:
        return AgentStartFailed(f"cannot start the agent: the holder is unavailable: {exc}")


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
