"""A full disk under a live workload (DESIGN.md invariants 6 and 8).

The daemon's state directory lives on a small tmpfs this test mounts. Clients send
prompts to running mock sessions, cycle another session through its life and read
all the while; the test then fills the filesystem with a ballast file. It checks:

- mutations fail with ``storage_unavailable`` (``retryable``), nothing else;
- nothing acknowledged is lost: every send that got a reply is in the journal as a
  ``submission``, and no send that got an error reply is (an error must mean "not
  done", or a client's retry would send the prompt twice);
- reads keep being served (``agentSession.get/list/history``, ``daemon.status``);
- once the ballast is deleted, new mutations succeed without a restart;
- afterwards ``PRAGMA integrity_check`` is ``ok`` and every journal is contiguous.

Mounting needs root (``tests.small_filesystem``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.daemon_process import IO_TIMEOUT_S, DaemonProcess, WireClient
from tests.daemon_process import running_daemon as start_daemon
from tests.e2e.reliability import PingProbe, report, sized, wait_until
from tests.small_filesystem import small_filesystem

TMPFS_SIZE = "16m"  # room for the database and mock agents; filled in milliseconds
DATABASE_NAME = "agentsd.db"
SENDERS = 3  # running mock sessions, one sending client each
PHASE_TIMEOUT_S = 60.0  # each phase normally takes well under a second
CONFIG = """\
idle_timeout_s = 600.0
[ladder]
eof_grace_s = 0.5
term_grace_s = 0.5
kill_wait_s = 1.0
"""
# The one error a mutation may answer while the disk is full; a close whose agent's
# end could not be recorded says so too (the lease stays held until it can be:
# runner Rule 2).
STORAGE_UNAVAILABLE = "storage_unavailable"


# ---- the filesystem --------------------------------------------------------------------


def fill(path: Path, progress: Callable[[], int]) -> int:
    """Write ``path`` until the filesystem refuses (ENOSPC); the bytes written. Each
    large step first waits (briefly, bounded) for the workload to move, so the disk
    fills while requests are in flight, not between them."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for step in (256 * 1024, 16 * 1024, 4096, 512):
            chunk = b"\0" * step
            while True:
                try:
                    written += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                if step == 256 * 1024:
                    before = progress()
                    deadline = time.monotonic() + 1.0
                    while progress() == before and time.monotonic() < deadline:
                        time.sleep(0.005)
    finally:
        os.close(fd)
    return written


# ---- the workload -------------------------------------------------------------------------


@dataclass
class Outcomes:
    """What the clients saw, shared by the worker threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    acked_sends: list[tuple[str, str, int, str]] = field(
        default_factory=list
    )  # sid, cmid, seq, text
    failed_sends: list[str] = field(default_factory=list)  # their texts
    errors: Counter[str] = field(default_factory=Counter)  # by kind, mutations only
    not_retryable: list[dict[str, Any]] = field(default_factory=list)
    mutations_ok: int = 0
    reads_ok: int = 0
    read_failures: list[dict[str, Any]] = field(default_factory=list)

    def progress(self) -> int:
        return self.mutations_ok + sum(self.errors.values())

    def failed(self, error: dict[str, Any]) -> None:
        with self.lock:
            kind = str(error["data"]["kind"])
            self.errors[kind] += 1
            if kind == STORAGE_UNAVAILABLE and error["data"]["retryable"] is not True:
                self.not_retryable.append(error)


class Worker(threading.Thread):
    def __init__(self, daemon: DaemonProcess, outcomes: Outcomes) -> None:
        super().__init__(daemon=True)
        self.socket = daemon.socket
        self.outcomes = outcomes
        self.stop = threading.Event()
        self.done_ok = 0  # mutations (or reads) this worker completed
        self.crash: BaseException | None = None
        self.last_error: dict[str, Any] | None = None  # the last refusal it got

    def run(self) -> None:
        try:
            with WireClient(self.socket) as client:
                while not self.stop.is_set():
                    self.step(client)
        except BaseException as exc:
            self.crash = exc

    def step(self, client: WireClient) -> None:
        raise NotImplementedError


class Sender(Worker):
    """Sends prompts to one running session; every text is unique."""

    def __init__(self, daemon: DaemonProcess, outcomes: Outcomes, session_id: str) -> None:
        super().__init__(daemon, outcomes)
        self.session_id = session_id
        self.count = 0

    def step(self, client: WireClient) -> None:
        self.count += 1
        text = f"echo {self.session_id}-{self.count} " + "x" * 200
        params: dict[str, Any] = {"sessionId": self.session_id, "text": text}
        if self.count % 2:
            params["clientOperationId"] = f"{self.session_id}-{self.count}"
        reply = client.call("agentSession.send", params)
        with self.outcomes.lock:
            if "result" in reply:
                result = reply["result"]
                entry = (self.session_id, result["clientMessageId"], result["seq"], text)
                self.outcomes.acked_sends.append(entry)
                self.outcomes.mutations_ok += 1
                self.done_ok += 1
            else:
                self.outcomes.failed_sends.append(text)
        if "error" in reply:
            self.last_error = reply["error"]
            self.outcomes.failed(reply["error"])


class Lifecycle(Worker):
    """Creates sessions and puts them through their life: options (large, to use the
    disk), start, close, delete."""

    def __init__(self, daemon: DaemonProcess, outcomes: Outcomes, cwd: Path) -> None:
        super().__init__(daemon, outcomes)
        self.cwd = cwd
        self.count = 0
        self.session_id: str | None = None

    def mutate(self, client: WireClient, method: str, params: dict[str, Any]) -> Any:
        reply = client.call(method, params)
        if "error" in reply:
            self.last_error = reply["error"]
            self.outcomes.failed(reply["error"])
            return None
        with self.outcomes.lock:
            self.outcomes.mutations_ok += 1
        self.done_ok += 1
        return reply["result"]

    def step(self, client: WireClient) -> None:
        self.count += 1
        if self.session_id is None:
            result = self.mutate(
                client,
                "agentSession.create",
                {"provider": "mock", "cwd": str(self.cwd), "start": False},
            )
            self.session_id = None if result is None else result["sessionId"]
            return
        sid = self.session_id
        match self.count % 5:
            case 0:
                options = {"replyText": "o" * 20_000, "chunks": 1 + self.count}
                self.mutate(
                    client, "agentSession.setOptions", {"sessionId": sid, "options": options}
                )
            case 1:
                self.mutate(client, "agentSession.start", {"sessionId": sid})
            case 2:
                self.mutate(client, "agentSession.close", {"sessionId": sid})
            case 3:
                title = f"life {self.count}"
                self.mutate(client, "agentSession.setOptions", {"sessionId": sid, "title": title})
            case _:
                if self.mutate(client, "agentSession.delete", {"sessionId": sid}) is not None:
                    self.session_id = None


class Reader(Worker):
    """Reads, and nothing but: each must be answered whatever the disk does."""

    def __init__(self, daemon: DaemonProcess, outcomes: Outcomes, session_ids: list[str]) -> None:
        super().__init__(daemon, outcomes)
        self.session_ids = session_ids

    def step(self, client: WireClient) -> None:
        for sid in self.session_ids:
            for method, params in (
                ("agentSession.get", {"sessionId": sid}),
                ("agentSession.history", {"sessionId": sid, "beforeSeq": 2**62, "limit": 50}),
            ):
                self.read(client, method, params)
        self.read(client, "agentSession.list", {})
        self.read(client, "daemon.status", {})

    def read(self, client: WireClient, method: str, params: dict[str, Any]) -> None:
        reply = client.call(method, params)
        with self.outcomes.lock:
            if "result" in reply:
                self.outcomes.reads_ok += 1
                self.done_ok += 1
            else:
                self.outcomes.read_failures.append({"method": method, **reply["error"]})


class WalGauge(threading.Thread):
    """The largest size the daemon's WAL file was seen at, sampled until ``stop``
    (a figure for the report: the log must not be what keeps the disk full)."""

    def __init__(self, state: Path) -> None:
        super().__init__(daemon=True)
        self.path = state / (DATABASE_NAME + "-wal")
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.002):
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, self.path.stat().st_size)

    def __enter__(self) -> WalGauge:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.join()


# ---- checks -------------------------------------------------------------------------------


def failing_while_reading(outcomes: Outcomes) -> Callable[[], bool]:
    """True once more mutations failed with storage_unavailable, and more reads were
    answered, than when this was called."""
    failed, reads = outcomes.errors[STORAGE_UNAVAILABLE], outcomes.reads_ok
    return lambda: (
        outcomes.errors[STORAGE_UNAVAILABLE] >= failed + sized(30, 300)
        and outcomes.reads_ok >= reads + 20
    )


def each_progresses(workers: list[Worker]) -> Callable[[], bool]:
    """True once every worker completed something more than when this was called;
    AssertionError at once, naming it, if a worker stopped (a stopped worker never
    progresses, and the wait would only time out without saying why)."""
    done = [w.done_ok for w in workers]

    def check() -> bool:
        stopped = [f"{type(w).__name__}: {w.crash!r}" for w in workers if w.crash is not None]
        assert not stopped, f"a worker stopped: {stopped}"
        return all(w.done_ok > n for w, n in zip(workers, done, strict=True))

    return check


def stalled(workers: list[Worker], before: list[int]) -> str:
    """Which workers completed nothing since ``before``, and the last refusal each got."""
    return "; ".join(
        f"{type(w).__name__} (last refusal: {w.last_error})"
        for w, n in zip(workers, before, strict=True)
        if w.done_ok <= n
    )


def journal(client: WireClient, session_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        after = events[-1]["seq"] if events else 0
        page = client.call(
            "agentSession.history", {"sessionId": session_id, "afterSeq": after, "limit": 1000}
        )["result"]
        events.extend(page["events"])
        if not page["hasMore"]:
            return events


def read_only(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(
        "file:" + urllib.parse.quote(str(db)) + "?mode=ro", uri=True, timeout=5.0
    )


# ---- the test -----------------------------------------------------------------------------


def test_a_full_disk_fails_mutations_loses_nothing_and_recovers_by_itself() -> None:
    with small_filesystem(TMPFS_SIZE) as mount_point:
        cwd = mount_point / "work"  # the agents' cwd, outside the state directory
        cwd.mkdir()
        config = mount_point / "agentsd.toml"
        config.write_text(CONFIG)
        state = mount_point / "state"
        ballast = mount_point / "ballast"
        outcomes = Outcomes()
        workers: list[Worker] = []
        cycles = sized(1, 5)  # fill, wait for the failures, free, wait for recovery
        ballast_bytes = 0
        recovered_s = 0.0
        with (
            WalGauge(state) as wal,
            start_daemon(state_dir=state, extra_args=["--config", str(config)]) as daemon,
            PingProbe(daemon.socket) as probe,
            daemon.connect() as client,
        ):
            try:
                session_ids = [
                    client.call("agentSession.create", {"provider": "mock", "cwd": str(cwd)})[
                        "result"
                    ]["sessionId"]
                    for _ in range(SENDERS)
                ]
                senders = [Sender(daemon, outcomes, sid) for sid in session_ids]
                lifecycle = Lifecycle(daemon, outcomes, cwd)
                reader = Reader(daemon, outcomes, session_ids)
                workers = [*senders, lifecycle, reader]
                for worker in workers:
                    worker.start()
                wait_until(
                    lambda: len(outcomes.acked_sends) >= 20 and lifecycle.done_ok >= 5,
                    PHASE_TIMEOUT_S,
                    "the workload gets going",
                )

                assert not outcomes.errors, f"errors before the disk filled: {outcomes.errors}"
                for _ in range(cycles):
                    # Fill the disk under the workload.
                    ballast_bytes = fill(ballast, outcomes.progress)
                    wait_until(
                        failing_while_reading(outcomes),
                        PHASE_TIMEOUT_S,
                        "mutations fail with storage_unavailable while reads go on",
                    )
                    # Space returns: the same daemon takes every client's mutations again.
                    freed_at = time.monotonic()
                    before = [w.done_ok for w in workers]
                    progressed = each_progresses(workers)
                    ballast.unlink()
                    try:
                        wait_until(
                            progressed,
                            PHASE_TIMEOUT_S,
                            "every client's mutations succeed again without a restart",
                        )
                    except AssertionError as exc:
                        usage = shutil.disk_usage(mount_point)
                        files = {p.name: p.stat().st_size for p in state.iterdir() if p.is_file()}
                        raise AssertionError(
                            f"{exc}\nstalled: {stalled(workers, before)}\n"
                            f"free {usage.free} of {usage.total} bytes; state files: {files}; "
                            f"the WAL at most {wal.peak} bytes"
                        ) from None
                    recovered_s = max(recovered_s, time.monotonic() - freed_at)
            finally:
                for worker in workers:
                    worker.stop.set()
                for worker in workers:
                    worker.join(timeout=IO_TIMEOUT_S * 2)
            for worker in workers:
                assert worker.crash is None, f"{type(worker).__name__}: {worker.crash!r}"
            assert daemon.process.poll() is None

            # Reads never failed; mutations failed only as they should.
            assert outcomes.read_failures == [], outcomes.read_failures[:5]
            unexpected = set(outcomes.errors) - {STORAGE_UNAVAILABLE}
            assert not unexpected, dict(outcomes.errors)
            assert outcomes.not_retryable == [], outcomes.not_retryable[:3]

            # Nothing acknowledged was lost; nothing refused was done.
            journals = {sid: journal(client, sid) for sid in session_ids}
            submitted: dict[str, set[str]] = {}
            for sid, events in journals.items():
                assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), sid
                submitted[sid] = {e["body"]["text"] for e in events if e["kind"] == "submission"}
            for sid, cmid, seq, text in outcomes.acked_sends:
                assert seq <= len(journals[sid]), f"acknowledged seq {seq} of {sid} is gone"
                event = journals[sid][seq - 1]
                assert event["kind"] == "submission", (sid, seq, event)
                assert event["body"]["clientMessageId"] == cmid, (sid, seq, event)
                assert event["body"]["text"] == text
            done_anyway = [
                text
                for text in outcomes.failed_sends
                if any(text in texts for texts in submitted.values())
            ]
            assert done_anyway == [], f"{len(done_anyway)} sends failed yet were journaled"
            probe.check()
            assert "Traceback" not in daemon.log(), daemon.log()
        # The daemon stopped cleanly (running_daemon checks the exit code): the file
        # is whole.
        with contextlib.closing(read_only(state / DATABASE_NAME)) as db:
            assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        report(
            "disk",
            f"tmpfs {TMPFS_SIZE}, {cycles} fill/free cycles (ballast {ballast_bytes // 1024} KiB): "
            f"{len(outcomes.acked_sends)} sends acknowledged, all in the journal; "
            f"mutation errors {dict(outcomes.errors)}; {outcomes.reads_ok} reads, none failed; "
            f"mutations succeeded again at most {recovered_s * 1000:.0f} ms after the "
            "ballast went; "
            f"the WAL at most {wal.peak // 1024} KiB; {probe.summary()}",
        )
