"""Journal write throughput: what durability costs, and what group commit buys.

1. Single-row durable commits: sequential ``await store.append(one event)``
   against the floor for SQLite's WAL on this disk, measured in the same
   directory: one WAL frame (24-byte header + 4 KiB page) written over a
   preallocated file of the WAL's steady size at the next offset, then
   ``fdatasync``, which is what ``strace`` shows SQLite's WAL paying per commit
   (``pwrite64`` + ``fdatasync`` on a file that stopped growing). Goal: >= 0.7x.
   Until this bench was fixed, the floor was ``O_APPEND`` write + ``fsync`` on a
   growing file, which also journals the file's new size each time and so is
   slower than what the WAL pays: it flattered the store; it is still printed,
   for reference. Also shown: the same SQL run inline on a connection of its own
   (the writer's memory of heads included), SQLite's share of the cost; and the
   writer's thread round trip alone (``queue.SimpleQueue`` to a thread,
   ``run_sync_soon`` back, a parked task rescheduled: what ``handoff`` does, with
   no SQL), which bounds a lone write at floor / (floor + round trip) even with
   free SQL. The baselines on the store's file use the store's WAL checkpoint
   interval.
2. Group-committed appends: ``APPENDERS`` concurrent tasks, each on its own
   session, appending one event per ``write``, then ten per ``write`` (a session
   task that coalesces a burst of frames). Goals: >= 50,000 events/s and >= 0.5x
   bare SQLite. Baselines in the same run, each doing the work of one batch of
   the store at that write size (``APPENDERS`` appends of ``per_write`` events,
   one transaction, no savepoint: the writer takes none for appends), so that
   every ratio compares equal work: the same SQL without the store (one thread:
   seqs reserved in memory, multi-row INSERTs, one commit), which isolates what
   the writer task and its threads cost; and bare SQLite doing the same durable
   work for the same logical rows, the ratio's baseline: ``per_write`` rows
   (session_id, seq, ts, fence, kind, body) for each of ``APPENDERS`` sessions per
   commit, WAL with ``synchronous=FULL`` and the store's checkpoint interval, in
   one ``executemany``, into the schema plain SQLite would use for appends by many
   sessions read back by session in seq order: a rowid table in append order with
   a unique (session_id, seq) index (measured here against the table clustered by
   (session_id, seq): ~1.4x the appends, 128 against 196 WAL frames per commit of
   100 sessions; the store uses it too, schema v3). Until this bench was fixed,
   the baselines committed one-event appends at both write sizes, so at ten
   events per write the store's batches held ten times the baselines' rows.
   The "one-page ceiling" (100 bodies per commit into one keyless rowid table: all
   of a commit's rows land on one or two pages) bounds what any per-row work
   costs; it is not the store's workload. "Trio alone" (at one event per write,
   interleaved with the others) is the store's work with the store and SQLite
   taken out: ``APPENDERS`` tasks parked once per write and woken together from a
   thread, as a committed batch wakes its writers. It is the ceiling of any store
   on trio whose writers each await their own commit, and with bare SQLite's work
   after it (a batch's writers can write again only once it committed), the
   ceiling of such a store that cost nothing of its own.

Where the time goes with one event per write (callgrind, 100 writers, the
instructions of both threads per write, measured in this bench's workload): about
71,000, of which about 26,000 are trio's own cost of parking a task and waking it
again (100 tasks woken together from a thread, with nothing else done: the floor
of any store that makes each writer await its own commit), about 13,000 SQLite's,
and the rest the store's Python on both sides of the handoff (the write path, the
channel, the batch loop, the seq reservation, binding). The GIL runs trio's thread
and the writer's thread one at a time, so this is serial work, 20-25 us of CPU per
event here against 10-15 us for a row of bare SQLite (most of which is the WAL's
write and sync, in the kernel): the ratio at one event per write stays near 0.5,
and 50,000 events/s (20 us per event, everything included) is out of reach on
this machine while each event is a trio task's own await. The "trio alone" line
shows it in the same run: 5.8-8.0 us per event for trio by itself in three quiet
runs, and with bare SQLite's work after it a ceiling of 42,600-53,900 events/s,
which leaves a store at most 1.5 us per event of its own to reach 50,000 in
the best run and nothing in the worst (it spends about 10: the request, the
handoff, the batch, the rows). With ten events per
write the per-write cost is shared and the store reaches 0.8-0.9x. Measured and
not kept: cutting batches short so two overlap (commits of 50 alternating with
the other 50 writers' turn in trio: no better on two shared cores, and twice the
fsyncs); waking the writer's thread through an eventfd (its write releases the
GIL, and trio's thread then waited 0.5-0.9 ms for it behind every batch).

A lone durable write, timed in place (medians of three runs of 1,500): 16-31 us
until the writer's thread picked it up, 20-51 us for BEGIN, the seq and the
INSERT, 14-33 us for the location checks around COMMIT (``location`` Rule 1),
95-250 us for COMMIT, 45-120 us from the thread's report to the caller running
again (trio's entry queue wakes its task, whose callback reschedules the caller
for the next scheduler pass). Everything but COMMIT is the store's, 110-400 us,
which is why a single commit stays near 0.3x of a floor of 70-130 us.

Single commits and group commits are measured in short chunks interleaved with
their baselines (``PAIRS`` x ``CHUNK`` commits, ``GROUP_ROUNDS`` x
``GROUP_COMMITS``), and each ratio is the median of the chunks' ratios: on these shared machines the cost
of a sync swings tenfold within seconds, and a chunk of each variant back to back
sees the same disk.
"""

from __future__ import annotations

import os
import queue
import sqlite3
import statistics
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path

import msgspec
import trio

from agentsd.store.database import WAL_AUTOCHECKPOINT_PAGES, StoreConnection
from agentsd.store.journal import Append, append_events, insert_rows
from agentsd.store.writer import Store, open_store

# Single commits are measured in interleaved chunks: the floor, the store, the same
# SQL inline, the old floor, CHUNK commits each, PAIRS times. On a shared disk the
# cost of a sync swings tenfold within seconds; a chunk of each variant back to
# back sees the same disk, and the ratio of every round is taken, then their median.
PAIRS = 30
CHUNK = 50
SINGLE_COMMITS = PAIRS * CHUNK  # for the thread round trip
SINGLE_BUDGET_S = 2.0  # per chunk at most: a disk stalled for longer ends the chunk
# Grows the WAL to its steady size, as in a long-running daemon: a one-event commit
# writes two pages (the session row's and the events leaf), and the WAL stops growing
# once it holds a checkpoint's worth.
WARMUP_COMMITS = WAL_AUTOCHECKPOINT_PAGES // 2 + 100
WARMUP_BUDGET_S = 10.0
APPENDERS = 100
GROUP_ROUNDS = 10
GROUP_COMMITS = 20  # per chunk: the store's appenders each write this many times
BASELINE_ROWS = 50_000  # the one-page ceiling's
BASELINE_BUDGET_S = 5.0

BODY = msgspec.json.encode({"type": "item.completed", "text": "x" * 80})
# A WAL frame: a 24-byte header and one page (SQLite's default 4096 bytes).
WAL_FRAME_BYTES = 24 + 4096


def _create_session(conn: sqlite3.Connection, session_id: str) -> None:
    conn.execute(
        "INSERT INTO sessions (id, host_id, provider, cwd, options, env, created_at,"
        " updated_at) VALUES (?, 'bench', 'mock', '/', '{}', '{}', 0, 0)",
        (session_id,),
    )


class _WalFloor:
    """What the kernel charges SQLite's WAL for the smallest durable commit: one
    frame (a page and its 24-byte header) written over a preallocated file of the
    WAL's steady size, at the next offset (wrapping, as the WAL is reused after a
    checkpoint), then ``fdatasync``. This is what ``strace`` shows SQLite doing per
    commit in WAL mode with ``synchronous=FULL`` (``pwrite64`` of the frame, one
    ``fdatasync``); the file's size does not change, so no metadata is journaled."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / "floor.wal"
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        self._size = WAL_AUTOCHECKPOINT_PAGES * WAL_FRAME_BYTES
        # Preallocated with written blocks, as a WAL that has been used once.
        for offset in range(0, self._size, 1 << 20):
            os.pwrite(self._fd, b"\1" * min(1 << 20, self._size - offset), offset)
        os.fsync(self._fd)
        self._offset = 0
        self._frame = b"\0" * WAL_FRAME_BYTES

    def chunk(self, count: int) -> float:
        """Commits per second over ``count`` commits (or the budget)."""
        started = time.perf_counter()
        deadline = started + SINGLE_BUDGET_S
        done = 0
        while done < count and time.perf_counter() < deadline:
            os.pwrite(self._fd, self._frame, self._offset)
            os.fdatasync(self._fd)
            self._offset = (self._offset + WAL_FRAME_BYTES) % self._size
            done += 1
        return done / (time.perf_counter() - started)

    def close(self) -> None:
        os.close(self._fd)
        self._path.unlink()


class _AppendFsync:
    """``O_APPEND`` write + ``fsync`` of one record at a time on a growing file: the
    floor this bench used before, slower than what the WAL pays (each fsync also
    journals the file's new size). Shown for reference."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / "baseline.log"
        self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._record = BODY + b"\n"

    def chunk(self, count: int) -> float:
        started = time.perf_counter()
        deadline = started + SINGLE_BUDGET_S
        done = 0
        while done < count and time.perf_counter() < deadline:
            os.write(self._fd, self._record)
            os.fsync(self._fd)
            done += 1
        return done / (time.perf_counter() - started)

    def close(self) -> None:
        os.close(self._fd)
        self._path.unlink()


class _InlineSingleCommits:
    """The store's SQL for one event (transaction, append), run inline on a
    connection of its own: SQLite's share of a single durable commit, without the
    writer task and its thread hops."""

    def __init__(self, path: Path, session_id: str) -> None:
        # Used from trio's worker threads, one chunk at a time.
        self._conn = sqlite3.connect(
            path, isolation_level=None, factory=StoreConnection, check_same_thread=False
        )
        self._conn.execute("PRAGMA synchronous = FULL")
        # The store's checkpoint interval, so that only the store's own cost differs.
        self._conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES:d}")
        self._session_id = session_id

    def chunk(self, count: int) -> float:
        conn = self._conn
        started = time.perf_counter()
        deadline = started + SINGLE_BUDGET_S
        done = 0
        while done < count and time.perf_counter() < deadline:
            conn.execute("BEGIN IMMEDIATE")
            append_events(conn, self._session_id, 1, [("bench", BODY)], time.time())
            conn.execute("COMMIT")
            conn.memory.commit()
            done += 1
        return done / (time.perf_counter() - started)

    def close(self) -> None:
        self._conn.close()


class _TrioAlone:
    """What trio itself charges a store whose writers each await their own commit,
    with no SQL and no store: ``tasks`` tasks each park once per write, and once all
    of them wait, a thread (the writer's stand-in) hands the batch back through
    ``run_sync_soon`` (put on a ``queue.SimpleQueue`` as the writer's handoff does)
    and every task is rescheduled, as a committed batch wakes its writers. The
    ceiling of any such store on this machine, reached only if SQLite and the disk
    cost nothing; with one task, the writer thread's round trip for a lone write."""

    def __init__(self, tasks: int = APPENDERS) -> None:
        self._tasks = tasks
        self._token = trio.lowlevel.current_trio_token()
        self._inbox: queue.SimpleQueue[list[trio.lowlevel.Task] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (batch := self._inbox.get()) is not None:
            self._token.run_sync_soon(self._wake, batch)

    @staticmethod
    def _wake(batch: list[trio.lowlevel.Task]) -> None:
        for task in batch:
            trio.lowlevel.reschedule(task)

    async def chunk(self, writes: int) -> float:
        """Writes per second with every task making ``writes`` writes."""
        waiting: list[trio.lowlevel.Task] = []
        done = 0

        async def appender() -> None:
            nonlocal done
            for _ in range(writes):
                waiting.append(trio.lowlevel.current_task())
                if len(waiting) == self._tasks:
                    self._inbox.put(waiting[:])
                    waiting.clear()
                await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
                done += 1

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(self._tasks):
                nursery.start_soon(appender)
        return done / (time.perf_counter() - started)

    async def close(self) -> None:
        self._inbox.put(None)
        await trio.to_thread.run_sync(self._thread.join)


def _one_page_ceiling(directory: Path) -> float:
    """Rows per second for 100 bodies per durable commit appended to one keyless
    rowid table: every commit's rows share a page or two. Not the store's
    workload (see the module's docstring); shown as a ceiling."""
    path = directory / "ceiling.sqlite3"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        batch = [(BODY,)] * 100
        started = time.perf_counter()
        deadline = started + BASELINE_BUDGET_S
        done = 0
        while done < BASELINE_ROWS and time.perf_counter() < deadline:
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO rows (body) VALUES (?)", batch)
            conn.execute("COMMIT")
            done += len(batch)
        elapsed = time.perf_counter() - started
    for leftover in directory.glob("ceiling.sqlite3*"):
        leftover.unlink()
    return done / elapsed


class _BareSqlite:
    """Bare SQLite doing the store's durable work: ``per_write`` journal rows for
    each of ``sessions`` sessions per commit, seqs counted in a list, in the layout
    plain SQLite would pick for this access pattern (the module's docstring says
    why)."""

    def __init__(self, directory: Path, sessions: int) -> None:
        self._directory = directory
        # Used from trio's worker threads, one chunk at a time.
        self._conn = sqlite3.connect(
            directory / "bare.sqlite3", isolation_level=None, check_same_thread=False
        )
        conn = self._conn
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES:d}")
        conn.execute(
            "CREATE TABLE events (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL,"
            " seq INTEGER NOT NULL, ts REAL NOT NULL, fence INTEGER NOT NULL,"
            " kind TEXT NOT NULL, body BLOB NOT NULL)"
        )
        conn.execute("CREATE UNIQUE INDEX events_session_seq ON events (session_id, seq)")
        self._ids = [f"bare-{i}" for i in range(sessions)]
        self._heads = [0] * sessions

    def chunk(self, commits: int, per_write: int) -> float:
        """Rows per second over ``commits`` commits."""
        conn, heads = self._conn, self._heads
        started = time.perf_counter()
        done = 0
        for _ in range(commits):
            ts = time.time()
            rows = []
            for index, session_id in enumerate(self._ids):
                for _ in range(per_write):
                    heads[index] += 1
                    rows.append((session_id, heads[index], ts, 1, "bench", BODY))
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO events (session_id, seq, ts, fence, kind, body)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            conn.execute("COMMIT")
            done += len(rows)
        return done / (time.perf_counter() - started)

    def close(self) -> None:
        self._conn.close()
        for leftover in self._directory.glob("bare.sqlite3*"):
            leftover.unlink()


class _SameSqlWithoutStore:
    """The writer's work on a batch of appends of ``per_write`` events each, one per
    session, run inline in one thread: one transaction per ``len(sessions)``
    appends, their seqs taken from memory and their rows inserted together, as the
    writer does for such a batch (no savepoint: appends need none)."""

    def __init__(self, path: Path, sessions: list[str]) -> None:
        self._conn = sqlite3.connect(
            path, isolation_level=None, factory=StoreConnection, check_same_thread=False
        )
        self._conn.execute("PRAGMA synchronous = FULL")
        # The store's checkpoint interval, so that only the store's own cost differs.
        self._conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES:d}")
        self._sessions = sessions

    def chunk(self, commits: int, per_write: int) -> float:
        """Events per second over ``commits`` commits."""
        conn = self._conn
        items = [("bench", BODY)] * per_write
        started = time.perf_counter()
        done = 0
        for _ in range(commits):
            conn.execute("BEGIN IMMEDIATE")
            rows: list[object] = []
            for session_id in self._sessions:
                Append(session_id, 1, items, time.time()).reserve(conn, rows)
            insert_rows(conn, rows)
            conn.execute("COMMIT")
            conn.memory.commit()
            done += len(self._sessions) * per_write
        return done / (time.perf_counter() - started)

    def close(self) -> None:
        self._conn.close()


def _median_ratio(ours: list[float], baseline: list[float]) -> float:
    """The median of the ratios of paired chunks."""
    return statistics.median(a / b for a, b in zip(ours, baseline, strict=True))


async def _single_commits(
    store: Store, session_id: str, count: int, budget_s: float = SINGLE_BUDGET_S
) -> float:
    """Events per second for one-event appends, each awaited before the next."""
    items = [("bench", BODY)]
    started = time.perf_counter()
    deadline = started + budget_s
    done = 0
    while done < count and time.perf_counter() < deadline:
        await store.append(session_id, 1, items, time.time())
        done += 1
    return done / (time.perf_counter() - started)


async def _group_commits(
    store: Store, sessions: list[str], per_write: int, writes: int
) -> tuple[float, int, int]:
    """Events per second with every appender making ``writes`` writes of
    ``per_write`` events, the events appended and the batches that took."""
    batches_before = store.batches_committed
    items = [("bench", BODY)] * per_write
    appended = 0

    async def appender(session_id: str) -> None:
        nonlocal appended
        for _ in range(writes):
            await store.append(session_id, 1, items, time.time())
            appended += per_write

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for session_id in sessions:
            nursery.start_soon(appender, session_id)
    elapsed = time.perf_counter() - started
    return appended / elapsed, appended, store.batches_committed - batches_before


async def _run(directory: Path) -> None:
    path = directory / "agentsd.sqlite3"
    async with open_store(path) as store:
        sessions = [f"session-{i}" for i in range(APPENDERS)]
        # The baselines' own sessions in the same file: the store's writer keeps its
        # sessions' heads in memory, so nothing else may append to them.
        inline_sessions = [f"inline-{i}" for i in range(APPENDERS)]

        def create_all(conn: sqlite3.Connection) -> None:
            for session_id in sessions + inline_sessions:
                _create_session(conn, session_id)

        await store.write(create_all)
        await _single_commits(store, sessions[0], WARMUP_COMMITS, budget_s=WARMUP_BUDGET_S)

        # The store is idle whenever a baseline runs, so a second connection may
        # write to its file (to sessions of its own).
        floor = _WalFloor(directory)
        old_floor = _AppendFsync(directory)
        inline = await trio.to_thread.run_sync(_InlineSingleCommits, path, inline_sessions[0])
        rates: dict[str, list[float]] = {"store": [], "floor": [], "inline": [], "old": []}
        try:
            for _ in range(PAIRS):
                rates["floor"].append(await trio.to_thread.run_sync(floor.chunk, CHUNK))
                rates["store"].append(await _single_commits(store, sessions[0], CHUNK))
                rates["inline"].append(await trio.to_thread.run_sync(inline.chunk, CHUNK))
                rates["old"].append(await trio.to_thread.run_sync(old_floor.chunk, CHUNK))
        finally:
            floor.close()
            old_floor.close()
            await trio.to_thread.run_sync(inline.close)

        def median_ratio(ours: str) -> float:
            return _median_ratio(rates[ours], rates["floor"])

        median = {name: statistics.median(values) for name, values in rates.items()}
        print(
            f"single-row durable commits ({PAIRS} interleaved chunks of {CHUNK}; medians):"
            f" store {median['store']:,.0f}/s, WAL floor (frame overwrite + fdatasync)"
            f" {median['floor']:,.0f}/s: {median_ratio('store'):.2f}x (goal >= 0.7x);"
            f" same SQL inline without the store {median['inline']:,.0f}/s"
            f" ({median_ratio('inline'):.2f}x the floor); for reference, O_APPEND"
            f" write + fsync {median['old']:,.0f}/s ({median_ratio('old'):.2f}x the floor)",
            flush=True,
        )
        lone = _TrioAlone(tasks=1)
        try:
            trip_s = 1 / await lone.chunk(SINGLE_COMMITS)
        finally:
            await lone.close()
        floor_s = 1 / median["floor"]
        print(
            f"writer thread round trip alone (no SQL): {trip_s * 1e6:.0f} us against"
            f" {floor_s * 1e6:.0f} us for the floor: a lone write's ceiling"
            f" {floor_s / (floor_s + trip_s):.2f}x the floor",
            flush=True,
        )

        ceiling = await trio.to_thread.run_sync(_one_page_ceiling, directory)
        print(
            f"one-page ceiling, 100 bodies per commit into one keyless table: {ceiling:,.0f} rows/s",
            flush=True,
        )
        bare = await trio.to_thread.run_sync(_BareSqlite, directory, APPENDERS)
        same_sql = await trio.to_thread.run_sync(_SameSqlWithoutStore, path, inline_sessions)
        trio_alone = _TrioAlone()
        try:
            for per_write in (1, 10):
                # Equal work: each baseline commits what one batch of the store
                # holds when every appender's write is in it, ``APPENDERS`` appends
                # of ``per_write`` events; chunks interleaved as for single commits.
                group: dict[str, list[float]] = {"store": [], "bare": [], "same": [], "trio": []}
                appended = batches = 0
                for _ in range(GROUP_ROUNDS):
                    if per_write == 1:
                        group["trio"].append(await trio_alone.chunk(GROUP_COMMITS))
                    group["bare"].append(
                        await trio.to_thread.run_sync(bare.chunk, GROUP_COMMITS, per_write)
                    )
                    group["same"].append(
                        await trio.to_thread.run_sync(same_sql.chunk, GROUP_COMMITS, per_write)
                    )
                    rate, events, commits = await _group_commits(
                        store, sessions, per_write, GROUP_COMMITS
                    )
                    group["store"].append(rate)
                    appended += events
                    batches += commits
                group_median = {
                    name: statistics.median(values) for name, values in group.items() if values
                }

                print(
                    f"group-committed appends, {per_write} event(s) per write ({GROUP_ROUNDS}"
                    f" interleaved chunks; medians): {group_median['store']:,.0f} events/s"
                    f" ({APPENDERS} appenders, {appended:,} events in {batches} batches,"
                    f" {appended / max(batches, 1):.0f} events/batch);"
                    f" same SQL without the store {group_median['same']:,.0f}/s:"
                    f" {_median_ratio(group['store'], group['same']):.2f}x; bare SQLite, {APPENDERS} sessions x"
                    f" {per_write} row(s) per commit {group_median['bare']:,.0f}/s:"
                    f" {_median_ratio(group['store'], group['bare']):.2f}x (goals >= 50,000/s, >= 0.5x)",
                    flush=True,
                )
                if per_write == 1:
                    trio_rate, bare_rate = group_median["trio"], group_median["bare"]
                    print(
                        f"trio alone at one event per write ({APPENDERS} tasks parked and woken"
                        f" together from a thread, no SQL, no store; median): {trio_rate:,.0f}"
                        f" events/s, {1e6 / trio_rate:.1f} us per event; with bare SQLite's work"
                        f" after it, as each batch's writers wait for their commit:"
                        f" {1 / (1 / trio_rate + 1 / bare_rate):,.0f} events/s",
                        flush=True,
                    )
        finally:
            await trio_alone.close()
            await trio.to_thread.run_sync(bare.close)
            await trio.to_thread.run_sync(same_sql.close)


def main() -> None:
    # The default temp dir (/tmp): the store and the baselines share a filesystem.
    with tempfile.TemporaryDirectory(prefix="agentsd-bench-") as directory:
        trio.run(_run, Path(directory))
