"""procfs: parsing /proc, identity by (pid, start time), token scans, coalesced scans."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from agentsd.procfs import (
    HOLDER_MARK_ENV,
    SPAWN_TOKEN_ENV,
    ProcessTable,
    ProcScanFailed,
    ProcScanner,
    current_scanner,
    is_same_process,
    parse_stat,
    read_proc_info,
    read_start_time,
    scan_processes,
)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(3600)"]


def _started(proc: subprocess.Popen[bytes], entry: bytes) -> None:
    """Wait until ``proc``'s exec has set up its environment, which holds ``entry``:
    Popen returns once the exec closed its pipe, before the kernel wrote the new
    environment (/proc then shows none)."""
    deadline = time.monotonic() + 10
    while entry not in Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0"):
        assert time.monotonic() < deadline, "the sleeper never finished its exec"
        time.sleep(0.001)


@pytest.fixture
def sleeper() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A process in its own group carrying a fresh spawn token; killed and reaped after."""
    token = os.urandom(8).hex()
    proc = subprocess.Popen(SLEEPER, env={SPAWN_TOKEN_ENV: token}, start_new_session=True)
    try:
        _started(proc, f"{SPAWN_TOKEN_ENV}={token}".encode())
        yield proc, token
    finally:
        proc.kill()
        proc.wait()


@given(comm=st.binary(max_size=15).map(lambda b: b.replace(b"\0", b"")))
def test_parse_stat_survives_any_comm(comm: bytes) -> None:
    # comm is up to 15 arbitrary bytes: spaces and parentheses included.
    raw = b"42 (" + comm + b") S 1 40 40 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 987654 0 0\n"
    info = parse_stat(42, raw)
    assert (info.pid, info.ppid, info.pgid, info.state, info.start_time) == (42, 1, 40, "S", 987654)


def test_parse_stat_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_stat(1, b"1 (x) S 0")
    with pytest.raises(ValueError):
        parse_stat(1, b"no parenthesis here")


def test_identity_is_pid_and_start_time() -> None:
    me = os.getpid()
    start = read_start_time(me)
    assert start is not None
    assert is_same_process(me, start)
    assert not is_same_process(me, start + 1)  # a pid alone is never proof


def test_vanished_pid_has_no_start_time() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert read_start_time(proc.pid) is None
    assert read_proc_info(proc.pid) is None


def test_zombie_is_not_the_same_process() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Wait for the exit without reaping: waitid with WNOWAIT.
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        info = read_proc_info(proc.pid)
        assert info is not None and info.is_zombie
        assert not is_same_process(proc.pid, info.start_time)
        assert read_start_time(proc.pid) == info.start_time  # still identifiable
        assert info not in scan_processes().group_members(info.pgid)
    finally:
        proc.wait()


def test_scan_finds_group_members_and_token_carriers(
    sleeper: tuple[subprocess.Popen[bytes], str],
) -> None:
    proc, token = sleeper
    table = scan_processes([token, "another-token"])
    assert [p.pid for p in table.group_members(proc.pid)] == [proc.pid]
    assert [p.pid for p in table.carrying(token)] == [proc.pid]
    assert table.carrying("another-token") == []
    assert table.carrying("never-asked") == []


def test_scan_without_tokens_reads_no_environment(
    sleeper: tuple[subprocess.Popen[bytes], str],
) -> None:
    proc, token = sleeper
    table = scan_processes()
    assert table.get(proc.pid) is not None
    assert table.tokens == {}
    assert table.carrying(token) == []


def test_token_must_be_a_whole_variable() -> None:
    token = os.urandom(8).hex()
    env = {"X_" + SPAWN_TOKEN_ENV: token, SPAWN_TOKEN_ENV: token + "-longer"}
    proc = subprocess.Popen(SLEEPER, env=env)
    try:
        assert scan_processes([token]).carrying(token) == []
    finally:
        proc.kill()
        proc.wait()


def _fake_table() -> ProcessTable:
    return ProcessTable(processes={}, tokens={})


async def test_concurrent_scans_are_coalesced(
    sleeper: tuple[subprocess.Popen[bytes], str],
) -> None:
    proc, token = sleeper
    scanner = ProcScanner()
    results: dict[int, ProcessTable] = {}

    async def ask(i: int) -> None:
        results[i] = await scanner.scan([token] if i == 199 else [f"token-{i}"])

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(ask, i)
    assert len(results) == 200
    assert scanner.scans_completed <= 2
    # The last caller's token joined a shared scan and was still looked for.
    assert [p.pid for p in results[199].carrying(token)] == [proc.pid]


def test_scan_finds_what_carries_a_holder_mark_apart_from_tokens() -> None:
    """A holder's mark is its own variable: a token of the same value is no mark, a
    mark no token, and only a whole variable counts."""
    mark = os.urandom(16).hex()
    marked = subprocess.Popen(SLEEPER, env={HOLDER_MARK_ENV: mark})
    others = [
        subprocess.Popen(SLEEPER, env=env)
        for env in (
            {SPAWN_TOKEN_ENV: mark},
            {"X_" + HOLDER_MARK_ENV: mark},
            {HOLDER_MARK_ENV: mark + "0"},
        )
    ]
    try:
        table = scan_processes([mark], [mark])
        assert [p.pid for p in table.marked(mark)] == [marked.pid]
        assert [p.pid for p in table.carrying(mark)] == [others[0].pid]
        assert scan_processes([mark]).marked(mark) == []  # not asked about
    finally:
        for proc in (marked, *others):
            proc.kill()
            proc.wait()


@pytest.fixture
def marked() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A process carrying a fresh holder mark; killed and reaped after."""
    mark = os.urandom(16).hex()
    proc = subprocess.Popen(SLEEPER, env={HOLDER_MARK_ENV: mark})
    try:
        _started(proc, f"{HOLDER_MARK_ENV}={mark}".encode())
        yield proc, mark
    finally:
        proc.kill()
        proc.wait()


async def test_a_scanner_looks_for_marks_and_tokens_asked_for_together(
    sleeper: tuple[subprocess.Popen[bytes], str], marked: tuple[subprocess.Popen[bytes], str]
) -> None:
    (proc, token), (marked_proc, mark) = sleeper, marked
    with trio.fail_after(10):
        table = await ProcScanner().scan([token], [mark])
    assert [p.pid for p in table.marked(mark)] == [marked_proc.pid]
    assert [p.pid for p in table.carrying(token)] == [proc.pid]


class _GatedScan:
    """A scan function that blocks in its worker thread until released."""

    def __init__(self) -> None:
        self.started = threading.Semaphore(0)
        self.release = threading.Semaphore(0)
        self.calls: list[frozenset[str]] = []

    def __call__(self, tokens: frozenset[str], marks: frozenset[str]) -> ProcessTable:
        self.calls.append(tokens)
        self.started.release()
        self.release.acquire()
        return _fake_table()


async def test_a_caller_never_gets_a_scan_that_started_before_it_asked() -> None:
    gate = _GatedScan()
    scanner = ProcScanner(gate)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(scanner.scan, ["first"])
            await trio.to_thread.run_sync(gate.started.acquire)
            late_done = trio.Event()

            async def late() -> None:
                await scanner.scan(["late"])
                late_done.set()

            nursery.start_soon(late)
            await trio.testing.wait_all_tasks_blocked()
            gate.release.release()  # the first scan ends; "late" must not take it
            await trio.to_thread.run_sync(gate.started.acquire)
            assert not late_done.is_set()
            gate.release.release()
            await late_done.wait()
    assert gate.calls == [frozenset({"first"}), frozenset({"late"})]
    assert scanner.scans_completed == 2


async def test_a_cancelled_waiter_leaves_and_the_next_caller_runs_the_batch() -> None:
    gate = _GatedScan()
    scanner = ProcScanner(gate)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(scanner.scan, ["first"])
            await trio.to_thread.run_sync(gate.started.acquire)
            with trio.move_on_after(0.01) as waited:
                await scanner.scan(["waiter"])
            assert waited.cancelled_caught
            gate.release.release()
        gate.release.release()  # pre-release the next scan
        await scanner.scan(["next"])
    assert gate.calls[1] == frozenset({"waiter", "next"})


async def test_a_failed_scan_raises_for_every_caller() -> None:
    def broken(tokens: frozenset[str], marks: frozenset[str]) -> ProcessTable:
        raise OSError("no /proc here")

    scanner = ProcScanner(broken)
    with trio.fail_after(10):
        with pytest.raises(ProcScanFailed):
            await scanner.scan()
        with pytest.raises(ProcScanFailed):
            await scanner.scan()


async def test_current_scanner_is_shared_within_a_run() -> None:
    with trio.fail_after(10):
        scanner = current_scanner()
        await scanner.scan()
        assert current_scanner() is scanner
        assert scanner.scans_completed == 1
