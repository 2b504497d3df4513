"""Attending a live agent: from its handshake (or takeover) until it is gone, for
the session task (``agentsd.runner``, ``agentsd.takeover``).

Rule 1: `attend` returns the failure that ended the agent, if any, and raises
nothing but cancellation: a handshake's or the reader's error is a value, so the
serving nursery never wraps one in a group.

Rule 2 (the exit, not the output, says it is gone): the child itself is watched
(``agentsd.agent_watch``, or its holder for a held agent); once it exited, its
output gets ``EXIT_EOF_GRACE_S`` to end on its own, then what it left running is
ended (``Child.end_remains``), then after ``EXIT_DRAIN_S`` the reader is stopped.

Rule 3 (no period): the session task keeps the session's time itself (`_keep_time`):
one deadline for the next streamed-text snapshot and for idleness; an idle session
never wakes.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from agentsd.agent_watch import current_watch
from agentsd.child import Child
from agentsd.delivery import drain_queue
from agentsd.held_child import HeldChild
from agentsd.held_lease import SETTLE_TIMEOUT_S
from agentsd.providers.base import Adapter, LineLink
from agentsd.session import Session
from agentsd.session_task import SessionTask
from agentsd.sink import Sink
from agentsd_protocol.errors import AgentExited, RpcError

if TYPE_CHECKING:
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


async def attend(
    supervisor: Supervisor,
    session: Session,
    task: SessionTask,
    child: Child | HeldChild,
    adapter: Adapter,
    sink: Sink,
    begin: Callable[[], Awaitable[None]],
    *,
    link: LineLink,
) -> RpcError | None:
    """Run ``begin`` (the handshake, ``agentsd.runner``, or a takeover,
    ``agentsd.takeover``; it sets ``task.ready``), then translate the agent's output
    until it ends, the task is stopped, or a handover stops the reader at a frame
    boundary (``agentsd.session_task`` Rule 2): ``link`` is the adapter's, which the
    handover stops. Returns the failure that ended it, if any; never raises anything
    but cancellation, so the nursery below never wraps an error in a group (Rule 1).

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
            await begin()
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

    task.link = link
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
    task.link = None
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
