"""An agent child process: spawn, identity, the close ladder, and proof of exit.

Rules this module keeps (DESIGN.md sections 2 and 6):

1. A child runs in its own session and process group (pgid == pid) with a spawn
   token in its environment, so everything it starts can be found again: by group,
   or by token when a descendant called ``setsid()``.
2. Its identity (pid, pgid, start time, token) reaches the caller before the body
   runs, so the caller can make it durable before any handshake.
3. Leaving `open_child` always runs the close ladder, whatever ended the body
   (return, exception, cancellation). Every await in it is shielded and has a time
   bound, and it never raises: the body's exception propagates unchanged.
4. Exit is proven, not assumed: the child was reaped, its group is empty and no
   live process carries its token. Otherwise `Child.unproven_reason` says why and
   the caller keeps the lease held.
5. A process that is not our unreaped child is signalled only through a pidfd
   opened and then checked against its recorded start time, so a recycled pid is
   never signalled. `os.killpg` is used only while our child is unreaped, which
   keeps its pid, and so its group id, from being reused.
6. No PR_SET_PDEATHSIG: trio spawns from a worker thread and the signal would fire
   when that thread exits. Crash safety is recovery at start (`end_processes`).
"""

from __future__ import annotations

import enum
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import attrs
import trio

from agentsd.procfs import (
    SPAWN_TOKEN_ENV,
    ProcessTable,
    ProcInfo,
    ProcScanFailed,
    ProcScanner,
    current_scanner,
    is_same_process,
    read_start_time,
)

__all__ = [
    "SPAWN_TOKEN_ENV",
    "Child",
    "ChildIdentity",
    "ChildSpec",
    "EndOutcome",
    "EndReport",
    "ExitProof",
    "Ladder",
    "end_processes",
    "new_spawn_token",
    "open_child",
]


SPAWN_THREADS = 4  # worker threads that spawn at once; see `_spawn_limiter`


def new_spawn_token() -> str:
    """A fresh, unguessable spawn token (128 bits, hex)."""
    return os.urandom(16).hex()


@attrs.frozen
class ChildSpec:
    """What to run. ``env`` is the complete environment, or with ``inherit_env`` the
    variables set over the daemon's own environment; the spawn token is added to it.
    stderr is appended to ``stderr_path`` (created 0600 if missing; its directory must
    exist) or discarded."""

    argv: list[str]
    cwd: str
    env: Mapping[str, str]
    token: str
    stderr_path: Path | None = None
    # The merged environment is built at the spawn and dropped right after it: a
    # copy of the daemon's environment per live child is kilobytes per session.
    inherit_env: bool = False


@attrs.frozen
class ChildIdentity:
    """What identifies a child across daemon restarts; a pid alone never does."""

    pid: int
    pgid: int
    start_time: int  # /proc/<pid>/stat field 22
    token: str


@attrs.frozen
class Ladder:
    """Bounds of the close ladder. Each wait ends as soon as its condition holds."""

    eof_grace_s: float = 2.0  # after stdin EOF; agents exit on EOF in milliseconds
    term_grace_s: float = 3.0  # after SIGTERM; lets an agent end its own tools
    kill_wait_s: float = 2.0  # after SIGKILL, which cannot be ignored: only the reap
    proof_rounds: int = 3  # straggler re-scans and SIGKILLs before giving up on proof
    scan_timeout_s: float = 5.0  # one /proc scan takes milliseconds; this is a safety net


@attrs.frozen
class ExitProof:
    """The child was reaped, its group is empty and no live process carries its
    token. Exactly one of ``returncode`` (normal exit) and ``signal`` is set."""

    returncode: int | None
    signal: int | None
    stragglers_killed: int  # processes other than the child that had to be signalled

    @classmethod
    def from_returncode(cls, returncode: int, stragglers_killed: int) -> ExitProof:
        if returncode < 0:
            return cls(returncode=None, signal=-returncode, stragglers_killed=stragglers_killed)
        return cls(returncode=returncode, signal=None, stragglers_killed=stragglers_killed)


@attrs.define(eq=False)
class Child:
    """A running child, owned by the task inside `open_child`.

    The body reads ``stdout`` and writes ``stdin``; it may close ``stdin`` early
    (asking the child to exit) but `open_child` owns both streams and closes them.
    ``exit_proof`` or ``unproven_reason`` is set when `open_child` exits.
    """

    identity: ChildIdentity
    process: trio.Process
    stdin: trio.abc.SendStream
    stdout: trio.abc.ReceiveStream
    exit_proof: ExitProof | None = None
    unproven_reason: str | None = None

    async def wait(self) -> int:
        """Wait for the child itself to exit (and reap it); its returncode."""
        return await self.process.wait()


@attrs.define(eq=False)
class _Outcome:
    exit_proof: ExitProof | None = None
    unproven_reason: str | None = None


@asynccontextmanager
async def open_child(
    spec: ChildSpec,
    ladder: Ladder,
    on_spawned: Callable[[ChildIdentity], Awaitable[None]],
    *,
    scanner: ProcScanner | None = None,
) -> AsyncIterator[Child]:
    """Spawn ``spec`` and yield the running `Child`; end it on exit.

    ``on_spawned(identity)`` is awaited right after the spawn, before the body; the
    caller writes the identity durably there. If it raises, the ladder runs and the
    exception propagates.

    On exit, whatever the cause, the close ladder runs shielded and bounded (at most
    ``eof_grace_s + term_grace_s + kill_wait_s`` plus ``proof_rounds`` straggler
    rounds of ``kill_wait_s``, each scan capped by ``scan_timeout_s``; in practice
    no longer than the child takes to exit): close stdin, wait; SIGTERM the group
    and every token carrier, wait; SIGKILL them, wait for the reap; then prove exit.
    It sets ``exit_proof`` or ``unproven_reason`` and never raises. It closes both
    pipes; the child is reaped unless ``unproven_reason`` says it still ran.

    Raises OSError if the program cannot be started (nothing is left running), and
    whatever ``on_spawned`` or the body raise. ``scanner`` defaults to the run's
    shared `current_scanner()`, so concurrent closes share /proc scans.
    """
    scanner = scanner if scanner is not None else current_scanner()
    process = await _spawn(spec)
    # From here on nothing may stand between the spawn and the try: the ladder
    # must run even if the very next checkpoint is cancelled.
    outcome = _Outcome()
    child: Child | None = None
    try:
        assert process.stdin is not None and process.stdout is not None
        start_time = await trio.to_thread.run_sync(
            read_start_time, process.pid, limiter=_spawn_limiter()
        )
        if start_time is None:  # cannot happen while the child is unreaped
            raise ProcessLookupError(f"child {process.pid} vanished before it was identified")
        identity = ChildIdentity(
            pid=process.pid, pgid=process.pid, start_time=start_time, token=spec.token
        )
        child = Child(
            identity=identity, process=process, stdin=process.stdin, stdout=process.stdout
        )
        await on_spawned(identity)
        yield child
    finally:
        await _close(process, spec.token, ladder, scanner, outcome)
        if child is not None:
            child.exit_proof = outcome.exit_proof
            child.unproven_reason = outcome.unproven_reason


async def _spawn(spec: ChildSpec) -> trio.Process:
    """Start ``spec``; its environment lives only as long as this call."""
    limiter = _spawn_limiter()
    stderr = subprocess.DEVNULL
    if spec.stderr_path is not None:
        stderr = await trio.to_thread.run_sync(_open_append, spec.stderr_path, limiter=limiter)
    try:
        async with limiter:  # open_process runs Popen in a thread of its own
            # Built here, not before the wait: a burst queued above holds no copies.
            base = os.environ if spec.inherit_env else {}
            env = {**base, **spec.env, SPAWN_TOKEN_ENV: spec.token}
            return await trio.lowlevel.open_process(
                spec.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=spec.cwd,
                env=env,
                start_new_session=True,  # own session and group: pgid == pid
                close_fds=True,  # never hand the daemon's socket or database to an agent
            )
    finally:
        if stderr != subprocess.DEVNULL:
            os.close(stderr)  # the child holds its own copy


_SPAWN_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar(
    "agentsd_spawn_limiter"
)


def _spawn_limiter() -> trio.CapacityLimiter:
    """The worker threads of spawning: a burst of starts queues here, rather than
    raising trio's thread pool to its limit, each thread's stack and state staying
    resident after the burst. A spawn is a CPU-bound fork and exec: more threads
    than cores would not make a burst finish sooner."""
    try:
        return _SPAWN_LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(SPAWN_THREADS)
        _SPAWN_LIMITER.set(limiter)
        return limiter


def _open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)


async def _close(
    process: trio.Process, token: str, ladder: Ladder, scanner: ProcScanner, outcome: _Outcome
) -> None:
    """The close ladder. Shielded, every step bounded, never raises."""
    pgid = process.pid
    signalled: set[tuple[int, int]] = set()  # (pid, start time) signalled individually
    with trio.CancelScope(shield=True):
        assert process.stdin is not None and process.stdout is not None
        await process.stdin.aclose()
        steps = (
            (None, ladder.eof_grace_s),
            (signal.SIGTERM, ladder.term_grace_s),
            (signal.SIGKILL, ladder.kill_wait_s),
        )
        for sig, wait_s in steps:
            # `returncode` reaps an exited child. Until then its pid (and so its
            # group id) cannot be reused, which makes killpg safe here.
            if process.returncode is not None:
                break
            with trio.move_on_after(wait_s):
                if sig is not None:
                    with suppress(ProcessLookupError, PermissionError):
                        os.killpg(pgid, sig)
                    signalled |= await _signal_carriers(token, pgid, sig, scanner)
                await process.wait()
        if process.returncode is None:
            outcome.unproven_reason = (
                f"child {_describe(process)} still ran {ladder.kill_wait_s}s after SIGKILL"
            )
        else:
            live, killed = await _prove_gone(
                [_Target(pgid=pgid, token=token, leader=None)], ladder, scanner
            )
            signalled |= killed
            outcome.unproven_reason = _unproven_reason(live, ladder)
            if outcome.unproven_reason is None:
                outcome.exit_proof = ExitProof.from_returncode(process.returncode, len(signalled))
        await process.stdout.aclose()


async def _signal_carriers(
    token: str, pgid: int, sig: int, scanner: ProcScanner
) -> set[tuple[int, int]]:
    """Signal the token carriers outside group ``pgid``: a descendant that called
    setsid() left the group but still carries the token. If the scan fails or the
    step's deadline cuts it short, the proof scans again and kills what it finds."""
    try:
        table = await scanner.scan([token])
    except ProcScanFailed:
        return set()
    carriers = [p for p in table.carrying(token) if p.pgid != pgid]
    return await _signal_and_wait(carriers, sig, None)


def _describe(process: trio.Process) -> str:
    return f"pid {process.pid} ({process.args!r})"


@attrs.frozen
class _Target:
    """Everything belonging to one child: its group (pgid) and its token carriers.

    ``leader`` is the recorded child when it is not ours to reap (daemon restart):
    it counts as ours only while its start time matches.
    """

    pgid: int
    token: str
    leader: ChildIdentity | None

    def live(self, table: ProcessTable) -> list[ProcInfo]:
        """The live processes of this target, per ``table``.

        The group counts when the recorded leader still runs, when there is no
        recorded leader (our reaped child: its group id stays reserved while any
        member lives), or when a member carries the token; a group id seen with
        none of those could have been reused.
        """
        carriers = table.carrying(self.token)
        # pid/pgid 0 stands for "never identified" (only the token can find what
        # it spawned); group 0 holds the kernel's and init's own processes.
        members = table.group_members(self.pgid) if self.pgid > 0 else []
        leader_alive = False
        if self.leader is not None and self.leader.pid > 0:
            info = table.get(self.leader.pid)
            leader_alive = (
                info is not None
                and not info.is_zombie
                and info.start_time == self.leader.start_time
            )
        carrier_pids = {p.pid for p in carriers}
        group_ours = (
            self.leader is None or leader_alive or any(m.pid in carrier_pids for m in members)
        )
        found = {p.pid: p for p in carriers}
        if group_ours:
            found.update((m.pid, m) for m in members)
        return list(found.values())


def _keys(procs: Iterable[ProcInfo]) -> set[tuple[int, int]]:
    return {(p.pid, p.start_time) for p in procs}


async def _scan_live(
    targets: Sequence[_Target], ladder: Ladder, scanner: ProcScanner
) -> list[list[ProcInfo]] | None:
    """Live processes per target from a fresh scan, None if no scan finished in time."""
    with trio.move_on_after(ladder.scan_timeout_s):
        try:
            table = await scanner.scan([t.token for t in targets])
        except ProcScanFailed:
            return None
        return [t.live(table) for t in targets]
    return None


async def _prove_gone(
    targets: Sequence[_Target], ladder: Ladder, scanner: ProcScanner
) -> tuple[list[list[ProcInfo]] | None, set[tuple[int, int]]]:
    """Scan; SIGKILL what lives; repeat, at most ``proof_rounds`` times.

    Returns what still lived per target at the last scan (all empty: exit proven;
    None: no scan finished in time) and every process that was killed.
    """
    killed: set[tuple[int, int]] = set()
    for attempt in range(ladder.proof_rounds + 1):
        live = await _scan_live(targets, ladder, scanner)
        stragglers = [p for procs in live or () for p in procs]
        if live is None or not stragglers or attempt == ladder.proof_rounds:
            return live, killed
        killed |= await _signal_and_wait(stragglers, signal.SIGKILL, ladder.kill_wait_s)
    raise AssertionError("unreachable: the last round returns")


def _unproven_reason(live: list[list[ProcInfo]] | None, ladder: Ladder) -> str | None:
    if live is None:
        return f"no /proc scan finished within {ladder.scan_timeout_s}s"
    pids = sorted(p.pid for procs in live for p in procs)
    if pids:
        return f"processes {pids} survived {ladder.proof_rounds} rounds of SIGKILL"
    return None


async def _signal_and_wait(
    procs: Sequence[ProcInfo], sig: int, wait_s: float | None
) -> set[tuple[int, int]]:
    """Signal each process that still is what ``procs`` recorded (pid and start
    time, not a zombie), then wait up to ``wait_s`` until all of them have exited
    (a zombie counts; None: do not wait). Returns who was signalled.

    Bounded: the signalling thread has a private limiter, so it never queues behind
    other work's threads, and it only makes a few syscalls per process.
    """
    if not procs:
        return set()
    signalled: dict[ProcInfo, int] = {}
    try:
        # Cancellation can only strike before the thread starts (nothing opened
        # yet); once it runs, its result, with the fds it opened, is returned.
        signalled = await trio.to_thread.run_sync(
            _signal_verified_sync, procs, sig, limiter=_signal_limiter()
        )
        if wait_s is not None:
            with trio.move_on_after(wait_s):
                for fd in signalled.values():
                    await trio.lowlevel.wait_readable(fd)
    finally:
        for fd in signalled.values():
            trio.lowlevel.notify_closing(fd)
            os.close(fd)
    return _keys(signalled)


_SIGNAL_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar(
    "agentsd_signal_limiter"
)


def _signal_limiter() -> trio.CapacityLimiter:
    try:
        return _SIGNAL_LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(4)  # a few syscalls per process: 4 threads is plenty
        _SIGNAL_LIMITER.set(limiter)
        return limiter


def _signal_verified_sync(procs: Sequence[ProcInfo], sig: int) -> dict[ProcInfo, int]:
    signalled: dict[ProcInfo, int] = {}
    for proc in procs:
        try:
            fd = os.pidfd_open(proc.pid)
        except OSError:  # gone already
            continue
        try:
            # The pidfd refers to whoever had the pid when it was opened; if that
            # process still shows the recorded start time now, it is the one we
            # recorded, and signalling through the fd cannot hit a recycled pid.
            if is_same_process(proc.pid, proc.start_time):
                signal.pidfd_send_signal(fd, sig)
                signalled[proc] = fd
                continue
        except OSError:
            pass
        os.close(fd)
    return signalled


class EndOutcome(enum.Enum):
    ENDED = "ended"  # something still ran, and all of it is gone now
    ALREADY_GONE = "already-gone"  # nothing of it ran any more
    UNPROVEN = "unproven"  # something may still run; keep its lease held


@attrs.frozen
class EndReport:
    outcomes: Mapping[ChildIdentity, EndOutcome]

    def _count(self, outcome: EndOutcome) -> int:
        return sum(1 for o in self.outcomes.values() if o is outcome)

    @property
    def ended(self) -> int:
        return self._count(EndOutcome.ENDED)

    @property
    def already_gone(self) -> int:
        return self._count(EndOutcome.ALREADY_GONE)

    @property
    def unproven(self) -> int:
        return self._count(EndOutcome.UNPROVEN)


async def end_processes(
    identities: Sequence[ChildIdentity], ladder: Ladder, scanner: ProcScanner
) -> EndReport:
    """End the recorded children of a previous daemon, and all their descendants.

    These are not our children: they cannot be waited for, and their pids may have
    been recycled. A recorded child counts only while its start time matches; its
    group counts while it lives (or while a member carries its token); every
    process carrying its token counts. Each is signalled through a verified pidfd:
    SIGTERM, up to ``term_grace_s``; then SIGKILL and re-scans as in the proof of
    `open_child`. All identities are handled together, so the whole call takes
    about one ladder. An identity with pid and pgid 0 (a spawn that was never
    confirmed) is found by its token alone. Shielded and bounded; never raises.
    """
    targets = [_Target(pgid=i.pgid, token=i.token, leader=i) for i in identities]
    if not targets:
        return EndReport({})
    outcomes: dict[ChildIdentity, EndOutcome] = {}
    with trio.CancelScope(shield=True):
        live = await _scan_live(targets, ladder, scanner)
        if live is None:
            return EndReport(dict.fromkeys(identities, EndOutcome.UNPROVEN))
        running: list[_Target] = []
        for target, procs in zip(targets, live, strict=True):
            assert target.leader is not None
            if procs:
                running.append(target)
            else:
                outcomes[target.leader] = EndOutcome.ALREADY_GONE
        term = [p for procs in live for p in procs]
        await _signal_and_wait(term, signal.SIGTERM, ladder.term_grace_s)
        remaining, _ = await _prove_gone(running, ladder, scanner)
        for i, target in enumerate(running):
            assert target.leader is not None
            gone = remaining is not None and not remaining[i]
            outcomes[target.leader] = EndOutcome.ENDED if gone else EndOutcome.UNPROVEN
    return EndReport(outcomes)
