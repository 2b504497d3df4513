"""The store: one writer task that group-commits, and a serialized reader.

Rule 1: every write goes through ``Store.write`` (or ``Store.append``); one writer
task cuts the queue into batches and hands each to one long-lived writer thread
(``handoff``), which owns the write connection and runs the batch in one
transaction, one savepoint per op (a batch of one op needs none: the transaction is
its savepoint). Appends (``journal.Append``) need no savepoint either: they take
their seqs from the writer's memory (``memory``), which fails before anything was
written or not at all, and the rows of consecutive appends are inserted together,
before the next other op or the COMMIT. Many small appends therefore cost one fsync
and a few multi-row INSERTs, and a batch costs one thread handoff and one trio
wakeup.

Rule 2: a caller's ``write`` returns only after the COMMIT of its batch returned, so
"acknowledged" always means "durable" (``synchronous=FULL``), and only while the
database is still where it was opened (``location``): a batch committed while its
state directory was deleted, moved or made read-only is refused with
``StorageUnavailable`` instead.

Rule 3: an op's own failure rolls back its savepoint only and reaches that caller
unchanged; a failure of the transaction itself (BEGIN, COMMIT, or SQLite discarding
the transaction on a full disk or an I/O error) fails the whole batch with
``StorageUnavailable``, and the writer carries on with the next batch.

Rule 4: ``sqlite3`` errors that mean "the storage is not usable right now" (disk
full, I/O error, read-only, cannot open) are translated to ``StorageUnavailable`` by
``failures``, for the store's callers only; every other exception an op raises passes
through as it is.

Rule 6: the writer's memory follows the transaction: an op's changes to it are undone
with its savepoint, a failed batch's with the batch, and they are kept only once
COMMIT returned (``memory`` Rule 1).

Rule 5: every queue is bounded. ``write`` blocks while ``QUEUE_CAPACITY`` ops wait,
which is the backpressure a flooding agent feels.

Rule 7: a lone op skips the writer task. When nothing is queued or in the thread
and the last batch held one op (no sign of concurrent writers), ``write`` hands its
op to the thread itself: the caller's task is then the only one that runs, and
waking it is the batch's one trio wakeup (measured: about 20 us of a ~190 us
single durable write). After a batch of several ops, writes go through the writer
task, which lets every task woken by that batch submit before it cuts the next
batch, so concurrent writers keep sharing commits (Rule 1) instead of one of them
splitting off into a commit of its own each round. Order is kept: the direct path
is taken only when no op is pending at all.

Rule 8: the WAL never keeps the disk full by itself (DESIGN.md invariant 8). Its
file only grows until a checkpoint (every ``WAL_AUTOCHECKPOINT_PAGES``, 16 MB,
postponed while a read's snapshot needs the log), so on a small or nearly full disk
the log alone can take every free byte. Giving its space back is a
``wal_checkpoint(TRUNCATE)``: it copies every committed frame into the database and
cuts the log to zero bytes (not while a read's snapshot still needs the log). The
writer does that
- after a commit that grew the log file to as much as the filesystem has left, so
  the database still has room to take the log's pages (the checkpoint needs it:
  the log cannot be cut before its pages are in the database); a read in progress
  makes it skip this, the next commit that grows the log tries again;
- after a batch failed because the disk is full, waiting at most
  ``FULL_CHECKPOINT_BUSY_MS`` for a read in progress; when the log did shrink, the
  batch runs once more from the start (its first run left nothing behind: Rule 3,
  Rule 6).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import trio

from agentsd.store.database import BUSY_TIMEOUT_MS, StoreConnection, open_database
from agentsd.store.failures import batch_failed, translate
from agentsd.store.handoff import Request, WriterThread
from agentsd.store.journal import Append, StoredEvent, insert_rows
from agentsd.store.location import Location
from agentsd_protocol.errors import ShuttingDown, StorageUnavailable

__all__ = [
    "CLOSE_DRAIN_S",
    "MAX_BATCH_OPS",
    "QUEUE_CAPACITY",
    "WRITER_STALL_S",
    "Store",
    "open_store",
]

T = TypeVar("T")

log = logging.getLogger(__name__)

# Ops waiting for the writer. Enough to absorb a burst from hundreds of sessions
# while a batch commits; small enough that a flood blocks its producer quickly
# instead of growing memory.
QUEUE_CAPACITY = 4096

# Ops in one transaction. Bounds how long one batch holds the write lock and how
# long the first op in it waits for the last (1000 small appends take ~10 ms).
MAX_BATCH_OPS = 1000

# A batch pending for longer than this means the writer is stuck (a hung disk, a
# wedged thread): a healthy batch takes milliseconds, a WAL checkpoint well under a
# second. Below systemd's usual WatchdogSec so the watchdog can act on it.
WRITER_STALL_S = 20.0

# On close, how long the writer may keep committing what was already submitted
# (at most QUEUE_CAPACITY ops, a handful of batches) before the rest is refused.
CLOSE_DRAIN_S = 10.0

# How long the checkpoint after a disk-full failure (Rule 8) waits for a read in
# progress to end. Reads take milliseconds; a longer one makes the checkpoint give
# up and the next failed batch try again, rather than hold up the writer.
FULL_CHECKPOINT_BUSY_MS = 250

# How long closing a connection (the last one checkpoints the WAL) may hold up
# shutdown before its worker thread is abandoned to finish on its own.
CLOSE_CONNECTION_S = 5.0


class Store:
    """The durable store: ``write`` through the group-committing writer, ``read`` on a
    separate read-only connection. Made by ``open_store``, which owns its lifetime.

    Counters (read-only for callers, updated by the writer task only):
    ``batches_committed``, ``ops_committed`` (ops whose changes committed),
    ``batches_failed`` (transactions that were rolled back as a whole), and
    ``last_progress``, trio's clock when the writer last picked up or finished a
    batch (see ``writer_healthy``).
    """

    def __init__(
        self, write_conn: StoreConnection, read_conn: sqlite3.Connection, location: Location
    ) -> None:
        self._write_conn = write_conn
        self._location = location
        # What the last batch found wrong with the location (writer thread only).
        self._misplaced: str | None = None
        # Why the last batch's transaction failed, if it did (writer thread only).
        self._batch_failure: BaseException | None = None
        # The WAL file's size after the last commit, and why it last could not give
        # its space back (Rule 8; writer thread only).
        self._wal_size = location.wal_bytes()
        self._wal_problem: str | None = None
        self._read_conn = read_conn
        self._send, self._receive = trio.open_memory_channel[Request[Any]](QUEUE_CAPACITY)
        # A dedicated limiter: the reader never waits for a token of trio's shared
        # default limiter behind unrelated blocking work.
        self._read_limiter = trio.CapacityLimiter(1)
        self._read_lock = trio.Lock()
        self._read_closed = False
        self._closing = False
        self._writer_scope: trio.CancelScope | None = None
        self._thread: WriterThread | None = None
        # Rule 7: whether ``write`` may hand a lone op to the thread itself. Set
        # while the writer runs and the store is not closing.
        self._accepting = False
        # Ops submitted and not yet finished (queued, collected, in the thread).
        self._pending = 0
        # Whether the last batch held a single op (Rule 7).
        self._quiet = True
        # The batch in the thread, and the one the writer task cut while a lone op
        # ran there.
        self._in_flight: list[Request[Any]] = []
        self._collected: list[Request[Any]] = []
        self.batches_committed = 0
        self.ops_committed = 0
        self.batches_failed = 0
        self.last_progress = trio.current_time()

    async def write(self, op: Callable[[StoreConnection], T]) -> T:
        """Run ``op(conn)`` in the writer's thread, inside a savepoint of the current
        batch's transaction, and return its result once that transaction committed.

        ``op`` must not begin, commit or roll back transactions itself, and must not
        keep ``conn`` beyond its call.

        Raises whatever ``op`` raised (its savepoint rolled back, the rest of the
        batch unaffected), translated to ``StorageUnavailable`` if it is a storage
        failure; ``StorageUnavailable`` if the batch's transaction failed (nothing of
        the batch was kept); ``ShuttingDown`` if the store is closing and the op was
        not run.

        Cancellation: while waiting for queue space, cancellation means the op was
        not queued and will never run. Once queued, or handed to the writer's
        thread directly (Rule 7), cancelling the caller does not withdraw the op:
        it may still run and commit, the caller just does not learn the outcome.

        An op that raises a ``BaseException`` that is not an ``Exception`` stops the
        writer: its batch is rolled back, every pending caller gets
        ``StorageUnavailable``, and the exception leaves ``open_store``.
        """
        request: Request[T] = Request(op)
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._accepting and self._quiet and not self._pending:
            assert self._thread is not None
            self._pending = 1
            self._start(self._thread, [request])
        else:
            self._pending += 1
            try:
                try:
                    # The fast path does not yield here (send() would, once more
                    # per write); waiting for the commit below is this call's
                    # schedule point.
                    self._send.send_nowait(request)
                except trio.WouldBlock:
                    await self._send.send(request)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                self._pending -= 1
                raise ShuttingDown("the store is closed; the write was not made") from None
            except BaseException:
                # Cancelled while waiting for queue space: the op was not queued.
                self._pending -= 1
                raise
        if request.finished:
            # Refused while this call waited for queue space to be taken.
            await trio.lowlevel.checkpoint()
        else:
            request.task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(request.abandon)
        if not request.ok:
            assert request.error is not None
            raise request.error
        return cast(T, request.value)

    async def append(
        self,
        session_id: str,
        fence: int,
        items: Sequence[tuple[str, bytes]],
        ts: float,
        output: tuple[int, int] | None = None,
    ) -> list[StoredEvent]:
        """Append ``items`` (kind, encoded body) to the session's journal; the stored
        events once committed. As ``write`` (``journal.append_events`` as the op),
        sharing its INSERT with the appends around it in the batch. Raises
        ``UnknownSession`` if the session does not exist. ``output``: a held
        agent's output position, stored in the same commit (``journal.Append``)."""
        return await self.write(Append(session_id, fence, items, ts, output))

    @property
    def operation_rows(self) -> int:
        """Rows in the operation ledger as of the last commit (expired ones too)."""
        return self._write_conn.memory.committed_operation_rows

    async def read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op(conn)`` on the read-only connection in a worker thread, inside one
        read transaction, so every statement in ``op`` sees the same committed
        snapshot (never a batch still being written).

        Reads run one at a time. Raises what ``op`` raised (storage failures as
        ``StorageUnavailable``, except that an op trying to write gets SQLite's
        "readonly" error unchanged: that is a bug in the op), or ``ShuttingDown``
        once the store closed.
        Cancellation while waiting for the reader aborts the read; once ``op``
        runs, the caller waits for it to finish.
        """
        async with self._read_lock:
            if self._read_closed:
                raise ShuttingDown("the store is closed")
            try:
                return await trio.to_thread.run_sync(self._run_read, op, limiter=self._read_limiter)
            except sqlite3.Error as exc:
                # The read connection is read-only by construction: SQLITE_READONLY
                # there is an op that tried to write, a bug, not unusable storage.
                translated = translate(exc, readonly_is_failure=False)
                if translated is exc:
                    raise
                raise translated from exc

    @property
    def queued_writes(self) -> int:
        """Ops waiting for the writer, not counting the batch being committed."""
        return self._send.statistics().current_buffer_used + len(self._collected)

    def unavailable(self) -> str | None:
        """Why writes are refused now (the database is not where it was opened, or
        its directory is read-only), or None. A few ``stat`` calls."""
        return self._location.problem()

    def writer_healthy(self, *, stall_s: float = WRITER_STALL_S) -> bool:
        """False when work is pending and the writer has not made progress for more
        than ``stall_s`` seconds (trio's clock).

        Progress is picking up a batch or finishing one, committed or failed: a
        writer that answers "disk full" is alive; one stuck inside a commit is not.
        An idle writer with nothing queued is healthy however long it idled.
        """
        pending = bool(self._in_flight) or self.queued_writes > 0
        return not pending or trio.current_time() - self.last_progress <= stall_s

    # The writer task and its thread.

    async def _run_writer(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        # Shielded: cancelling the surrounding code must not drop writes that callers
        # already queued. The bound comes from ``_stop``, which closes the queue and
        # sets this scope's deadline; it takes effect between batches, because a
        # batch's thread cannot be interrupted while it holds the connection. A
        # batch that never returns (a hung disk) is what ``writer_healthy`` reports
        # to the watchdog.
        # A batch that raised in the thread cancels this scope (``on_failure``), so
        # a writer waiting for ops stops at once; its exception is raised below.
        with trio.CancelScope(shield=True) as scope:
            self._writer_scope = scope
            thread = self._thread = WriterThread(self._run_batch, self._batch_ended, scope.cancel)
            self._accepting = True
            task_status.started()
            try:
                async for first in self._receive:
                    # receive() yields before it returns (parked until a submitter
                    # woke it, or after taking an op already queued), so every task
                    # that ran in the previous tick has submitted by now: no extra
                    # checkpoint is needed for them to share this batch's commit.
                    self._collected = [first]
                    # A lone op's caller may have handed it to the thread (Rule 7):
                    # the batch is cut once the thread is free, so it takes every op
                    # that arrived meanwhile.
                    await thread.wait_idle()
                    thread.raise_failure()
                    self._collect_batch()
                    batch, self._collected = self._collected, []
                    self._start(thread, batch)
                    await thread.wait_idle()
                    thread.raise_failure()
            finally:
                self._accepting = False
                await thread.wait_idle()
                self._refuse_pending()
                await thread.stop(CLOSE_CONNECTION_S)
        thread.raise_failure()

    def _start(self, thread: WriterThread, batch: list[Request[Any]]) -> None:
        self._in_flight = batch
        self.last_progress = trio.current_time()
        thread.start(batch)

    def _batch_ended(self, batch: list[Request[Any]], committed: int | None) -> None:
        """Count the batch and wake its callers (in trio's thread)."""
        if committed is None:
            self.batches_failed += 1
        else:
            self.batches_committed += 1
            self.ops_committed += committed
        self._in_flight = []
        self._pending -= len(batch)
        self._quiet = len(batch) == 1
        self.last_progress = trio.current_time()
        for request in batch:
            request.finish()

    def _collect_batch(self) -> None:
        while len(self._collected) < MAX_BATCH_OPS:
            try:
                self._collected.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return

    def _refuse_pending(self) -> None:
        """Wake every caller whose op will not run (or whose batch was interrupted)
        with an error, and make later ``write`` calls fail fast."""

        def refusal() -> BaseException:
            if self._closing:
                return ShuttingDown("the store closed before this write was made")
            return StorageUnavailable("storage unavailable: the store's writer stopped")

        # A batch still marked in flight here never reported back from its thread
        # (the thread raised), so its transaction was rolled back.
        refused = [*self._in_flight, *self._collected]
        self._in_flight, self._collected = [], []
        while True:
            try:
                refused.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        for request in refused:
            request.fail(refusal())
            request.finish()
        self._pending -= len(refused)
        # Senders blocked on a full queue get BrokenResourceError -> ShuttingDown.
        self._receive.close()

    def _run_batch(self, batch: list[Request[Any]]) -> int | None:
        """Run one batch in one transaction (writer thread), once more if the disk
        was full and checkpointing gave space back (Rule 8). Returns how many ops
        committed, or None when the transaction failed and every request in the
        batch was failed with ``StorageUnavailable``."""
        committed = self._run_transaction(batch)
        if (
            committed is None
            and self._disk_was_full()
            and self._give_back_wal(FULL_CHECKPOINT_BUSY_MS)
        ):
            for request in batch:
                request.reset()
            committed = self._run_transaction(batch)
        if committed is not None:
            self._keep_wal_within_free_space()
        return committed

    def _disk_was_full(self) -> bool:
        code = getattr(self._batch_failure, "sqlite_errorcode", None)
        return code is not None and code & 0xFF == sqlite3.SQLITE_FULL

    def _give_back_wal(self, busy_ms: int) -> bool:
        """Checkpoint the whole WAL into the database and truncate it (Rule 8),
        waiting at most ``busy_ms`` for a read in progress. True when the log
        shrank."""
        conn = self._write_conn
        before = self._location.wal_bytes()
        if not before or conn.in_transaction:
            return False
        try:
            conn.execute(f"PRAGMA busy_timeout = {busy_ms:d}")
            try:
                busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            finally:
                conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS:d}")
        except sqlite3.Error as exc:
            # The checkpoint had to grow the database and found no room either.
            self._note_wal(f"checkpointing it failed: {exc}")
            return False
        after = self._wal_size = self._location.wal_bytes()
        if after < before:
            self._note_wal(None)
            log.debug("the WAL gave back %d bytes", before - after)
            return True
        self._note_wal("a read in progress kept it from being truncated" if busy else "it stayed")
        return False

    def _note_wal(self, problem: str | None) -> None:
        """Log why the WAL could not give its space back, once, and when it could
        again."""
        if problem == self._wal_problem:
            return
        if problem is None:
            log.warning("the disk is nearly full: the WAL gave its space back again")
        else:
            log.warning("the disk is nearly full: the WAL cannot give its space back: %s", problem)
        self._wal_problem = problem

    def _keep_wal_within_free_space(self) -> None:
        """After a commit that grew the WAL file: if it now takes as much space as
        the filesystem has left, give that space back (Rule 8). A log that only
        reuses its file takes no new space and costs one ``stat``."""
        size = self._location.wal_bytes()
        grew, self._wal_size = size > self._wal_size, size
        if not grew:
            return
        try:
            fs = os.statvfs(self._location.path.parent)
        except OSError:
            return
        if size >= fs.f_bavail * fs.f_frsize:
            # Nothing failed yet: no waiting for a read; the next commit that grows
            # the log tries again.
            self._give_back_wal(busy_ms=0)

    def _run_transaction(self, batch: list[Request[Any]]) -> int | None:
        """``_run_batch``'s one attempt; records why it failed in ``_batch_failure``."""
        self._batch_failure = None
        conn = self._write_conn
        memory = conn.memory
        # A transaction left over from a batch whose ROLLBACK failed would make
        # every later BEGIN fail: retry that rollback first.
        self._rollback_quietly()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            self._fail_batch(batch, exc)
            return None
        # An op alone in its batch needs no savepoint: rolling back the transaction
        # undoes that op and nothing else (two statements fewer per lone write).
        savepoints = len(batch) > 1
        # The rows of the appends since the last other op (Rule 1).
        rows: list[object] = []
        try:
            ok = 0
            for request in batch:
                op = request.op
                appending = type(op) is Append
                if not appending and rows:
                    insert_rows(conn, rows)
                    rows = []
                savepoint = savepoints and not appending
                if savepoint:
                    conn.execute("SAVEPOINT op")
                mark = memory.mark()
                try:
                    value = op.reserve(conn, rows) if isinstance(op, Append) else op(conn)
                except Exception as exc:
                    if not conn.in_transaction:
                        # SQLite discarded the whole transaction itself (it does on
                        # SQLITE_FULL and SQLITE_IOERR): the ops before this one in
                        # the batch are gone too.
                        memory.rollback_to(0)
                        self._fail_batch(batch, exc)
                        return None
                    memory.rollback_to(mark)
                    if savepoint:
                        conn.execute("ROLLBACK TO op")
                        conn.execute("RELEASE op")
                    elif not savepoints:
                        conn.execute("ROLLBACK")
                    request.fail(translate(exc))
                else:
                    if savepoint:
                        conn.execute("RELEASE op")
                    request.ok, request.value = True, value
                    ok += 1
            if rows:
                insert_rows(conn, rows)
            if savepoints or ok:
                if self._misplaced_now() is not None:
                    self._rollback_quietly()
                    memory.rollback_to(0)
                    self._refuse_batch(batch, "the write was rolled back")
                    return None
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # An INSERT of appends, SAVEPOINT, RELEASE, ROLLBACK TO or COMMIT failed:
            # the batch cannot be trusted, so none of it is kept.
            self._rollback_quietly()
            memory.rollback_to(0)
            self._fail_batch(batch, exc)
            return None
        except BaseException:
            self._rollback_quietly()
            memory.rollback_to(0)
            raise
        memory.commit()
        if ok and self._misplaced_now() is not None:
            # It changed during the COMMIT: what committed may not last (Rule 2).
            self._refuse_batch(batch, "this write may not survive a restart")
        return ok

    def _misplaced_now(self) -> str | None:
        """The location's problem (writer thread), logged when it appears or clears."""
        problem = self._location.problem()
        if problem != self._misplaced:
            if problem is None:
                log.warning("storage is available again; writes resume")
            else:
                log.error("storage unavailable: %s; writes are refused", problem)
            self._misplaced = problem
        return problem

    def _refuse_batch(self, batch: list[Request[Any]], outcome: str) -> None:
        for request in batch:
            if request.ok or request.error is None:
                request.fail(
                    StorageUnavailable(f"storage unavailable: {self._misplaced}; {outcome}")
                )

    def _rollback_quietly(self) -> None:
        if not self._write_conn.in_transaction:
            return
        # If the rollback fails too (the disk is gone), the next batch retries it
        # before its BEGIN; SQLite never commits a transaction nobody committed.
        with contextlib.suppress(sqlite3.Error):
            self._write_conn.execute("ROLLBACK")

    def _fail_batch(self, batch: list[Request[Any]], cause: BaseException) -> None:
        self._batch_failure = cause
        # A fresh exception per caller: one instance raised in many tasks would
        # share (and scramble) its traceback.
        for request in batch:
            request.fail(batch_failed(cause))

    def _run_read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._read_conn
        conn.execute("BEGIN")
        try:
            return op(conn)
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def _stop(self) -> None:
        """Stop accepting writes; let the writer finish what is queued, within
        ``CLOSE_DRAIN_S``."""
        self._closing = True
        self._accepting = False
        self._send.close()
        if self._writer_scope is not None:
            self._writer_scope.deadline = min(
                self._writer_scope.deadline, trio.current_time() + CLOSE_DRAIN_S
            )

    async def _close_reader(self) -> None:
        # Bounded and shielded: waits for a read in progress, then closes.
        with trio.move_on_after(CLOSE_CONNECTION_S, shield=True):
            async with self._read_lock:
                self._read_closed = True
                await _close_connection(self._read_conn)
        # If the bound expired with a read still running, the connection is left
        # for the garbage collector; later reads are refused either way.
        self._read_closed = True


async def _close_connection(conn: sqlite3.Connection) -> None:
    """Close ``conn`` in a worker thread, shielded and bounded. The thread cannot be
    interrupted, so on timeout it is abandoned and finishes the close on its own
    (an interrupted WAL checkpoint is safe: it is redone on the next open)."""
    with trio.move_on_after(CLOSE_CONNECTION_S, shield=True):
        await trio.to_thread.run_sync(conn.close, abandon_on_cancel=True)


async def _open_connection(path: Path, *, readonly: bool) -> StoreConnection:
    try:
        return await trio.to_thread.run_sync(
            functools.partial(open_database, path, readonly=readonly)
        )
    except sqlite3.Error as exc:
        translated = translate(exc)
        if translated is exc:
            raise
        raise StorageUnavailable(f"{path}: {translated}") from exc


@asynccontextmanager
async def open_store(path: Path) -> AsyncIterator[Store]:
    """Open the database at ``path`` (creating and migrating it) and run its writer.

    On exit, normal or by exception or cancellation, the writer first commits every
    write already submitted (bounded by ``CLOSE_DRAIN_S``; ops still queued after
    that fail with ``ShuttingDown``), later ``write``/``read`` calls raise
    ``ShuttingDown``, and both connections are closed.

    Raises ``SchemaTooNew`` (file untouched) if the database is newer than this code,
    ``StorageUnavailable`` if it cannot be opened for storage reasons (for example
    an unwritable directory), ``sqlite3.Error`` for anything else SQLite refuses.
    An exception from the body propagates unchanged (not wrapped in a group).
    """
    write_conn = await _open_connection(path, readonly=False)
    try:
        read_conn = await _open_connection(path, readonly=True)
        store = Store(write_conn, read_conn, Location.of(path))
        try:
            body_error: BaseException | None = None
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(store._run_writer)
                    try:
                        yield store
                    except BaseException as exc:
                        body_error = exc
                        raise
                    finally:
                        store._stop()
            except BaseExceptionGroup as group:
                # The nursery wraps the body's exception in a group; when it is the
                # only failure, hand it back as it was raised (below, outside this
                # handler, so its __context__ does not become the group).
                if body_error is None or group.exceptions != (body_error,):
                    raise
            else:
                body_error = None
            if body_error is not None:
                raise body_error
        finally:
            await store._close_reader()
    finally:
        await _close_connection(write_conn)
