"""What Linux ``/proc`` says about processes: start times, groups, spawn tokens.

Everything here except `ProcScanner` is blocking (it reads files under ``/proc``);
callers in trio run it through `trio.to_thread.run_sync`. `ProcScanner` is the trio
face: it runs `scan_processes` in a worker thread and shares each scan among all the
tasks that asked for one while it was pending.

Rules this module keeps:

1. A pid alone never identifies a process. Identity is (pid, start time), and a
   zombie is dead: it can neither run nor be signalled into doing anything.
2. Processes that vanish or that we may not inspect while a scan runs are skipped
   silently; a scan never fails because the process table changed under it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Mapping
from functools import partial

import attrs
import trio

SPAWN_TOKEN_ENV = "AGENTSD_SPAWN_TOKEN"
# The holder's own environment carries it (``agentsd.holder_link`` starts the holder
# with it, ``agentsd.holder`` Rule 1): so does a fork of the holder until it execs the
# agent, whose environment never does.
HOLDER_MARK_ENV = "AGENTSD_HOLDER_MARK"

_PROC = "/proc"
_TOKEN_PREFIX = SPAWN_TOKEN_ENV.encode() + b"="
_MARK_PREFIX = HOLDER_MARK_ENV.encode() + b"="
_STAT_BYTES = 1024  # a stat line is a few hundred bytes
_READ_BYTES = 16 * 1024  # most environments fit
# Fields after the ")" that closes comm, counted from field 3 (state) of proc(5).
_STATE, _PPID, _PGRP, _STARTTIME = 0, 1, 2, 19
_UTIME, _STIME, _CUTIME, _CSTIME = 11, 12, 13, 14


@attrs.frozen
class ProcInfo:
    """One line of the process table, as ``/proc/<pid>/stat`` showed it."""

    pid: int
    ppid: int
    pgid: int
    state: str  # one character: R, S, D, Z, T, ...
    start_time: int  # clock ticks after boot; with pid, the process's identity
    # CPU time in clock ticks, user and system, its own and that of the children it
    # waited for (utime + stime + cutime + cstime)
    cpu_ticks: int = 0

    @property
    def is_zombie(self) -> bool:
        return self.state == "Z"


def parse_stat(pid: int, raw: bytes) -> ProcInfo:
    """Parse the contents of ``/proc/<pid>/stat``; ValueError if it is not one."""
    # comm (field 2) may hold spaces and parentheses: split after the last ")".
    fields = raw[raw.rindex(b")") + 2 :].split()
    if len(fields) <= _STARTTIME:
        raise ValueError(f"not a stat line: {raw[:100]!r}")
    return ProcInfo(
        pid=pid,
        ppid=int(fields[_PPID]),
        pgid=int(fields[_PGRP]),
        state=fields[_STATE].decode("ascii", "replace"),
        start_time=int(fields[_STARTTIME]),
        cpu_ticks=sum(int(fields[i]) for i in (_UTIME, _STIME, _CUTIME, _CSTIME)),
    )


def _read_whole(path: str, first: int) -> bytes:
    """The contents of a /proc file: open, read to the end, close. A scan reads two
    files of every process; a buffered ``open()`` would add an fstat, an ioctl and
    an lseek to each, and a scan of a close-all of hundreds runs several times.
    ``first``: the size of the first read, which most files fit in."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunk = os.read(fd, first)
        if len(chunk) < first:
            # procfs fills a read up to its size unless the end came first; one
            # more read would only confirm the end.
            return chunk
        chunks = [chunk]
        while chunk := os.read(fd, _READ_BYTES):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_proc_info(pid: int) -> ProcInfo | None:
    """The stat line of ``pid``, or None if no such process exists (any more)."""
    try:
        raw = _read_whole(f"{_PROC}/{pid}/stat", _STAT_BYTES)
    except (FileNotFoundError, ProcessLookupError):
        return None
    if not raw:  # the process was reaped while we read
        return None
    return parse_stat(pid, raw)


def read_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks), None if gone.

    A zombie still has a start time: an unreaped child can always be identified.
    """
    info = read_proc_info(pid)
    return None if info is None else info.start_time


def is_same_process(pid: int, start_time: int) -> bool:
    """True iff ``pid`` is alive (not a zombie) and started at ``start_time``."""
    info = read_proc_info(pid)
    return info is not None and not info.is_zombie and info.start_time == start_time


def _read_environ(pid: int) -> bytes | None:
    """The environment of ``pid`` as it was exec'd, None if it cannot be read."""
    try:
        return _read_whole(f"{_PROC}/{pid}/environ", _READ_BYTES)
    except OSError:  # gone, another user's, or a kernel thread: not ours either way
        return None


def _find_value(environ: bytes, prefix: bytes, wanted: Collection[bytes]) -> str | None:
    """The value of the variable ``prefix`` names in ``environ`` if it is one of
    ``wanted``."""
    start = 0
    while (at := environ.find(prefix, start)) != -1:
        start = at + len(prefix)
        if at > 0 and environ[at - 1] != 0:
            continue  # the prefix is the tail of another variable, e.g. X_AGENTSD_...
        end = environ.find(b"\0", start)
        value = environ[start:] if end == -1 else environ[start:end]
        if value in wanted:
            return value.decode()
    return None


@attrs.frozen
class ProcessTable:
    """A snapshot of every process, with the spawn tokens that were asked about.

    A snapshot is stale the moment it is taken; it is evidence of what existed, and
    emptiness is evidence only for a scan that started after the last signal.

    One scan serves every close of a close-all: its live processes are indexed by
    group and by token once, when it is made, so that each close's lookup costs
    what it finds, not a pass over every process (N closes: N lookups, not N^2).
    """

    processes: Mapping[int, ProcInfo]
    tokens: Mapping[int, str]  # pid -> spawn token, only for tokens asked about
    marks: Mapping[int, str] = attrs.field(factory=dict)  # pid -> holder mark, as tokens
    _by_group: Mapping[int, list[ProcInfo]] = attrs.field(init=False, repr=False)
    _by_token: Mapping[str, list[ProcInfo]] = attrs.field(init=False, repr=False)

    @_by_group.default
    def _index_groups(self) -> Mapping[int, list[ProcInfo]]:
        groups: dict[int, list[ProcInfo]] = {}
        for p in self.processes.values():
            if not p.is_zombie:
                groups.setdefault(p.pgid, []).append(p)
        return groups

    @_by_token.default
    def _index_tokens(self) -> Mapping[str, list[ProcInfo]]:
        carriers: dict[str, list[ProcInfo]] = {}
        for pid, token in self.tokens.items():
            if not self.processes[pid].is_zombie:
                carriers.setdefault(token, []).append(self.processes[pid])
        return carriers

    def get(self, pid: int) -> ProcInfo | None:
        return self.processes.get(pid)

    def group_members(self, pgid: int) -> list[ProcInfo]:
        """Live (non-zombie) members of process group ``pgid``."""
        return list(self._by_group.get(pgid, ()))

    def carrying(self, token: str) -> list[ProcInfo]:
        """Live processes whose environment carries ``AGENTSD_SPAWN_TOKEN=token``.

        Only tokens passed to the scan are known; any other token yields [].
        """
        return list(self._by_token.get(token, ()))

    def marked(self, mark: str) -> list[ProcInfo]:
        """Live processes whose environment carries ``AGENTSD_HOLDER_MARK=mark``: the
        holder of that mark and its forks that have not exec'd (or a process that
        copied the mark: agents can read it). Only marks passed to the scan are known."""
        return [
            self.processes[pid]
            for pid, value in self.marks.items()
            if value == mark and not self.processes[pid].is_zombie
        ]


def scan_processes(tokens: Collection[str] = (), marks: Collection[str] = ()) -> ProcessTable:
    """Read the stat line of every process, and the environment of each live one
    when ``tokens`` or ``marks`` are given (a process listing one is recorded).

    Raises OSError only if ``/proc`` itself cannot be listed.
    """
    wanted = frozenset(t.encode() for t in tokens)
    wanted_marks = frozenset(m.encode() for m in marks)
    processes: dict[int, ProcInfo] = {}
    carriers: dict[int, str] = {}
    marked: dict[int, str] = {}
    for name in os.listdir(_PROC):
        if not name.isdigit():
            continue
        pid = int(name)
        info = read_proc_info(pid)
        if info is None:
            continue
        processes[pid] = info
        if not (wanted or wanted_marks) or info.is_zombie:
            continue
        environ = _read_environ(pid)
        if environ is None:
            continue
        if wanted and (token := _find_value(environ, _TOKEN_PREFIX, wanted)) is not None:
            carriers[pid] = token
        if wanted_marks and (mark := _find_value(environ, _MARK_PREFIX, wanted_marks)):
            marked[pid] = mark
    return ProcessTable(processes=processes, tokens=carriers, marks=marked)


@attrs.define(eq=False)
class _Batch:
    tokens: set[str] = attrs.Factory(set)
    marks: set[str] = attrs.Factory(set)
    done: trio.Event = attrs.Factory(trio.Event)
    table: ProcessTable | None = None
    error: BaseException | None = None


class ProcScanFailed(OSError):
    """A coalesced /proc scan failed; the cause is chained."""


class ProcScanner:
    """Coalesces /proc scans: concurrent callers share one scan in a worker thread.

    A caller always gets a scan that *started after it asked* (it may have just
    sent a signal, and only a later scan is evidence of the result), and that
    includes its tokens. While one scan runs, every new request joins the next
    batch; when the running scan ends, one waiter of that batch runs it for all.
    So N simultaneous callers cause at most two scans, never N.

    Cancellation: a caller waiting for someone else's scan leaves at once. The
    caller that runs a scan is not interrupted mid-scan (a worker thread cannot
    be, and the scan takes milliseconds); it publishes the result to the others,
    then sees its own cancellation at its next checkpoint.
    """

    def __init__(
        self, scan: Callable[[frozenset[str], frozenset[str]], ProcessTable] = scan_processes
    ) -> None:
        self._scan = scan  # replaceable so tests can control when a scan ends
        self._running: _Batch | None = None
        self._pending: _Batch | None = None
        # One thread at most, and never queued behind other work's threads.
        self._limiter = trio.CapacityLimiter(1)
        self.scans_completed = 0

    async def scan(self, tokens: Iterable[str] = (), marks: Iterable[str] = ()) -> ProcessTable:
        """A fresh `ProcessTable` that knows at least ``tokens`` and ``marks``.

        Raises `ProcScanFailed` if ``/proc`` cannot be read.
        """
        if self._pending is None:
            self._pending = _Batch()
        batch = self._pending
        batch.tokens.update(tokens)
        batch.marks.update(marks)
        while not batch.done.is_set():
            running = self._running
            if running is None:
                await self._run(batch)
            else:
                await running.done.wait()
        if batch.table is None:
            raise ProcScanFailed("scanning /proc failed") from batch.error
        return batch.table

    async def _run(self, batch: _Batch) -> None:
        self._pending = None
        self._running = batch
        try:
            # Shielded so that the batch others wait on always completes; bounded
            # because the thread only reads /proc (milliseconds) and the private
            # limiter never waits behind another thread.
            with trio.CancelScope(shield=True):
                batch.table = await trio.to_thread.run_sync(
                    partial(self._scan, frozenset(batch.tokens), frozenset(batch.marks)),
                    limiter=self._limiter,
                )
        except OSError as exc:
            batch.error = exc
        finally:
            self._running = None
            self.scans_completed += 1
            batch.done.set()


_DEFAULT_SCANNER: trio.lowlevel.RunVar[ProcScanner] = trio.lowlevel.RunVar("agentsd_proc_scanner")


def current_scanner() -> ProcScanner:
    """The scanner shared by everything in this trio run (created on first use)."""
    try:
        return _DEFAULT_SCANNER.get()
    except LookupError:
        scanner = ProcScanner()
        _DEFAULT_SCANNER.set(scanner)
        return scanner
