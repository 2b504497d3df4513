"""How the writer task and its thread hand batches to each other.

``Request`` is one op submitted to ``Store.write``, with the caller that waits for
it; ``WriterThread`` is the long-lived thread that owns the write connection and runs
one batch at a time. Together they cost one thread handoff and one trio wakeup per
batch (``writer`` Rule 1).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import attrs
import outcome
import trio

from agentsd.store.database import StoreConnection

__all__ = ["Request", "WriterThread"]

T = TypeVar("T")


@attrs.define(eq=False)
class Request(Generic[T]):
    """One submitted op. The writer thread fills in the outcome; the writer task
    calls ``finish`` after the batch's transaction ended, which wakes the caller
    if it still waits (``task``; None once it was cancelled)."""

    op: Callable[[StoreConnection], T]
    ok: bool = False
    value: T | None = None
    error: BaseException | None = None
    finished: bool = False
    task: trio.lowlevel.Task | None = None

    def fail(self, error: BaseException) -> None:
        self.ok = False
        self.value = None
        self.error = error

    def finish(self) -> None:
        self.finished = True
        task, self.task = self.task, None
        if task is not None:
            trio.lowlevel.reschedule(task)

    def abandon(self, raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
        """The caller was cancelled while waiting: the op stays queued, nobody is
        woken when it finishes."""
        self.task = None
        return trio.lowlevel.Abort.SUCCEEDED


class WriterThread:
    """The long-lived thread that runs batches on the write connection.

    The writer task hands it one batch at a time (``run``) and waits, uncancellably,
    for the result: the thread holds the connection until the batch's transaction
    ended, and nothing may use the connection meanwhile. The result comes back with
    one ``run_sync_soon`` per batch, which calls ``batch_ended`` in trio's thread
    (unless the batch raised) before it wakes the writer task, so the batch's callers
    and the writer resume in the same tick. ``stop`` ends the thread once it is idle.
    """

    def __init__(
        self,
        run_batch: Callable[[list[Request[Any]]], int | None],
        batch_ended: Callable[[list[Request[Any]], int | None], None],
    ) -> None:
        self._run_batch = run_batch
        self._batch_ended = batch_ended
        self._token = trio.lowlevel.current_trio_token()
        # None asks the thread to exit.
        self._inbox: queue.SimpleQueue[tuple[list[Request[Any]], trio.lowlevel.Task] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(
            target=self._serve, name="agentsd-store-writer", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        while (job := self._inbox.get()) is not None:
            batch, task = job
            # A BaseException from an op travels back to the writer task, which
            # raises it; the thread itself stays ready for ``stop``.
            result = outcome.capture(self._run_batch, batch)
            self._token.run_sync_soon(self._report, batch, task, result)

    def _report(
        self,
        batch: list[Request[Any]],
        task: trio.lowlevel.Task,
        result: outcome.Outcome[int | None],
    ) -> None:
        if isinstance(result, outcome.Value):
            self._batch_ended(batch, result.value)
        trio.lowlevel.reschedule(task, result)

    async def run(self, batch: list[Request[Any]]) -> None:
        """``run_batch(batch)`` in the thread, then ``batch_ended``; raises what
        ``run_batch`` raised (``batch_ended`` is not called then)."""
        self._inbox.put((batch, trio.lowlevel.current_task()))
        await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    async def stop(self, timeout_s: float) -> None:
        """End the thread and wait for it, shielded and bounded by ``timeout_s``: it
        runs no batch (``run`` cannot be cancelled), so it exits at once, and the
        caller may be cleaning up past its deadline or after an error."""
        self._inbox.put(None)
        with trio.move_on_after(timeout_s, shield=True):
            await trio.to_thread.run_sync(self._thread.join, abandon_on_cancel=True)
