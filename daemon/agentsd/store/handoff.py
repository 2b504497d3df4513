"""How the writer task and its thread hand batches to each other.

``Request`` is one op submitted to ``Store.write``, with the caller that waits for
it; ``WriterThread`` is the long-lived thread that owns the write connection and runs
one batch at a time. Together they cost one thread handoff and one trio wakeup per
batch (``writer`` Rule 1), and a lone op no trio task switch besides its caller's
own (``writer`` Rule 7).
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
    """One submitted op. The writer thread fills in the outcome; ``finish`` runs in
    trio's thread after the batch's transaction ended (or when the op is refused)
    and wakes the caller if it still waits (``task``; None once it was
    cancelled)."""

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

    def reset(self) -> None:
        """Forget the outcome of a run whose transaction was rolled back as a whole,
        before the op runs again."""
        self.ok = False
        self.value = None
        self.error = None

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
    """The long-lived thread that runs batches on the write connection, one at a
    time.

    Rule 1: at most one batch is in the thread (``busy``); ``start`` is called only
    when it is idle, by the writer task or, for a lone op, by its caller
    (``writer`` Rule 7). Nothing else may use the connection meanwhile.

    Rule 2: each batch's result comes back with one ``run_sync_soon``, which calls
    ``batch_ended`` in trio's thread and then wakes the task waiting in
    ``wait_idle`` (if any), so a batch's callers and the writer task resume in the
    same tick.

    Rule 3: a batch that raised (a ``BaseException`` that is not an ``Exception``
    from an op) is not reported to ``batch_ended``: the exception is kept in
    ``failure`` and ``on_failure`` is called, which stops the writer task.

    ``stop`` ends the thread once it is idle.
    """

    def __init__(
        self,
        run_batch: Callable[[list[Request[Any]]], int | None],
        batch_ended: Callable[[list[Request[Any]], int | None], None],
        on_failure: Callable[[], None],
    ) -> None:
        self._run_batch = run_batch
        self._batch_ended = batch_ended
        self._on_failure = on_failure
        self._token = trio.lowlevel.current_trio_token()
        self._waiter: trio.lowlevel.Task | None = None
        self.busy = False
        self.failure: BaseException | None = None
        # None asks the thread to exit.
        self._inbox: queue.SimpleQueue[list[Request[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._serve, name="agentsd-store-writer", daemon=True
        )
        self._thread.start()

    def _serve(self) -> None:
        while (batch := self._inbox.get()) is not None:
            # A BaseException from an op travels back to trio's thread (Rule 3); the
            # thread itself stays ready for ``stop``.
            result = outcome.capture(self._run_batch, batch)
            self._token.run_sync_soon(self._report, batch, result)

    def _report(self, batch: list[Request[Any]], result: outcome.Outcome[int | None]) -> None:
        self.busy = False
        if isinstance(result, outcome.Value):
            self._batch_ended(batch, result.value)
        else:
            assert isinstance(result, outcome.Error)
            self.failure = result.error
            self._on_failure()
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            trio.lowlevel.reschedule(waiter)

    def start(self, batch: list[Request[Any]]) -> None:
        """Hand ``batch`` to the idle thread; returns at once."""
        assert not self.busy, "a batch is already in the writer thread"
        self.busy = True
        self._inbox.put(batch)

    async def wait_idle(self) -> None:
        """Wait, uncancellably, until the thread ran the batch it holds, if any, and
        reported it (Rule 2). It cannot be interrupted, so neither is this."""
        if self.busy:
            self._waiter = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    def raise_failure(self) -> None:
        """Raise the exception a batch raised (Rule 3), if one did."""
        if self.failure is not None:
            raise self.failure

    async def stop(self, timeout_s: float) -> None:
        """End the idle thread and wait for it, shielded and bounded by
        ``timeout_s``: it holds no batch, so it exits at once, and the caller may be
        cleaning up past its deadline or after an error."""
        self._inbox.put(None)
        with trio.move_on_after(timeout_s, shield=True):
            await trio.to_thread.run_sync(self._thread.join, abandon_on_cancel=True)
