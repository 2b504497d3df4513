"""The control handle of one session task (``agentsd.runner``), and how its end is
recorded on its lease.

Rule 1 (stop is cancellation): `SessionTask.stop` cancels the task's scope; the first
cause given is the one its agent's end is journaled with (``journaled_cause``).

Rule 2 (handover): a planned restart whose agents the holder keeps stops each
served session with `SessionTask.hand_over` instead of `SessionTask.stop`: the
reader stops between two frames (``LineLink.stop_at_boundary``), the streamed text
is journaled (a commit), and the agent is left running: no close ladder
(``HeldChild.hand_over``), no settle (``HeldLease.handed_over``: the lease stays
held, for the next image to take over, ``agentsd.takeover``), the holder link
detaches. A handover that cannot be made (the agent exited meanwhile, the holder
was lost) or that a ``stop`` overtakes before the boundary ends the agent as a
shutdown does.

Rule 3 (one record of the end): `record_end` is the only place a session task puts
on its lease why its agent ended (its cause, failure and stderr tail, or that it was
handed over), for a started agent and a taken-over one alike; ``open_lease``'s exit
settles with it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Literal

import attrs
import trio

from agentsd.held_lease import HeldLease, exit_cause
from agentsd.providers.base import Adapter, LineLink
from agentsd.stderr_log import StderrLog
from agentsd_protocol.api.session import ExitCause
from agentsd_protocol.errors import RpcError

MAX_QUOTED_CHARS = 500  # of the agent's last stderr line, in a start error's message

StopCause = ExitCause | Literal["handover"]
"""Why a session task stops: an ``ExitCause``, journaled with its agent's end; or
``handover`` (Rule 2), which ends no agent and is never journaled: if the handover
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
    # could not be recorded (the lease stays held; ``agentsd.runner`` Rule 2).
    held: HeldLease | None = None
    stop_cause: StopCause | None = None
    adapter: Adapter | None = None
    # The adapter's link to the agent while its child is attended (it outlives the
    # reader: an answer's key alone goes through it, ``agentsd.delivery`` Rule 3).
    link: LineLink | None = None
    # While the agent's output is read after its handshake: its link and the scope
    # around the reader, which a handover cancels at a frame boundary (Rule 2).
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
        left to finish; one that had not is abandoned (Rule 2)."""
        if self.stop_cause == "handover":
            if self.at_boundary:
                return
            self.stop_cause = cause
        elif self.stop_cause is None:
            self.stop_cause = cause
        self.scope.cancel()

    def hand_over(self) -> bool:
        """Stop at the next frame boundary and leave the agent running for the next
        image (Rule 2); ``done`` is set once the task has finished. False, and
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

    def refuse_start(self, error: RpcError) -> None:
        """Tell whoever waits for the start, now; the task goes on cleaning up."""
        if not self.ready.is_set():
            self.start_error = error
            self.ready.set()

    def touch(self) -> None:
        self.last_activity = time.monotonic()


def record_end(
    task: SessionTask, held: HeldLease, failure: RpcError | None, stderr: StderrLog
) -> None:
    """Rule 3: put on ``held`` why the agent ended, for ``open_lease``'s exit to
    settle with; a failure before the agent was ready is the start's error."""
    held.handed_over = task.handed_over
    held.cause = exit_cause(journaled_cause(task.stop_cause), failure, held.proof)
    if held.cause in ("failed", "unexpected", "oom"):
        # The agent's own words on why it ended (``agentsd.stderr_log`` Rule 2).
        held.stderr_tail = stderr.tail()
        failure = _quoting_stderr(failure, held.stderr_tail)
    held.failure = failure
    if failure is not None and not task.ready.is_set():
        task.start_error = failure


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
