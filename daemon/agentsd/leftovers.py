"""What is left of a child, and proof that nothing is: its process group and every
process carrying its spawn token (DESIGN.md invariants 1 and 5).

Two users: the close ladder of our own child (``agentsd.child``) proves with
`prove_gone` that nothing of it remains once it was reaped; and a daemon starting
up, or a close retrying an unproven exit, ends a previous child's leftovers with
`end_processes`, whose children these are not.

Rule 1: a process that is not our unreaped child is signalled only through a pidfd
opened and then checked against its recorded start time, so a recycled pid is never
signalled.

Rule 2: a pid alone is never proof. A recorded leader counts only while its start
time matches; its group counts while it lives or while a member carries its token.

Rule 3: every wait and every /proc scan is bounded by the `Ladder`; nothing here
raises on a failed scan: it reports the exit unproven instead.
"""

from __future__ import annotations

import enum
import os
import signal
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path

import attrs
import trio

from agentsd.cgroup import CgroupRoot, end_cgroups
from agentsd.config import Ladder
from agentsd.procfs import (
    ProcessTable,
    ProcInfo,
    ProcScanFailed,
    ProcScanner,
    is_same_process,
    read_proc_info,
)

__all__ = [
    "ChildIdentity",
    "EndOutcome",
    "EndReport",
    "Remains",
    "end_contained",
    "end_processes",
    "end_remains",
    "prove_gone",
    "reap_own_zombie",
    "signal_and_wait",
    "unproven_reason",
]


@attrs.frozen
class ChildIdentity:
    """What identifies a child across daemon restarts; a pid alone never does."""

    pid: int
    pgid: int
    start_time: int  # /proc/<pid>/stat field 22
    token: str


@attrs.frozen
class Remains:
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
    targets: Sequence[Remains], ladder: Ladder, scanner: ProcScanner
) -> list[list[ProcInfo]] | None:
    """Live processes per target from a fresh scan, None if no scan finished in time."""
    with trio.move_on_after(ladder.scan_timeout_s):
        try:
            table = await scanner.scan([t.token for t in targets])
        except ProcScanFailed:
            return None
        return [t.live(table) for t in targets]
    return None


async def prove_gone(
    targets: Sequence[Remains], ladder: Ladder, scanner: ProcScanner
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
        killed |= await signal_and_wait(stragglers, signal.SIGKILL, ladder.kill_wait_s)
    raise AssertionError("unreachable: the last round returns")


async def end_remains(
    targets: Sequence[Remains], ladder: Ladder, scanner: ProcScanner
) -> set[tuple[int, int]]:
    """End what lives of ``targets``: SIGTERM, up to ``term_grace_s``, then SIGKILL as
    in `prove_gone`. Every process is signalled through a verified pidfd. Returns
    who was signalled; what it could not end is left for the caller's own proof.
    Bounded by the ladder; never raises."""
    live = await _scan_live(targets, ladder, scanner)
    if live is None:
        return set()
    termed = await signal_and_wait(
        [p for procs in live for p in procs], signal.SIGTERM, ladder.term_grace_s
    )
    _, killed = await prove_gone(targets, ladder, scanner)
    return termed | killed


def unproven_reason(live: list[list[ProcInfo]] | None, ladder: Ladder) -> str | None:
    if live is None:
        return f"no /proc scan finished within {ladder.scan_timeout_s}s"
    pids = sorted(p.pid for procs in live for p in procs)
    if pids:
        return f"processes {pids} survived {ladder.proof_rounds} rounds of SIGKILL"
    return None


async def signal_and_wait(
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
    ``agentsd.child.open_child``. All identities are handled together, so the whole call takes
    about one ladder. An identity with pid and pgid 0 (a spawn that was never
    confirmed) is found by its token alone. Shielded and bounded; never raises.
    """
    targets = [Remains(pgid=i.pgid, token=i.token, leader=i) for i in identities]
    if not targets:
        return EndReport({})
    outcomes: dict[ChildIdentity, EndOutcome] = {}
    with trio.CancelScope(shield=True):
        live = await _scan_live(targets, ladder, scanner)
        if live is None:
            return EndReport(dict.fromkeys(identities, EndOutcome.UNPROVEN))
        running: list[Remains] = []
        for target, procs in zip(targets, live, strict=True):
            assert target.leader is not None
            if procs:
                running.append(target)
            else:
                outcomes[target.leader] = EndOutcome.ALREADY_GONE
        term = [p for procs in live for p in procs]
        await signal_and_wait(term, signal.SIGTERM, ladder.term_grace_s)
        remaining, _ = await prove_gone(running, ladder, scanner)
        for i, target in enumerate(running):
            assert target.leader is not None
            gone = remaining is not None and not remaining[i]
            outcomes[target.leader] = EndOutcome.ENDED if gone else EndOutcome.UNPROVEN
    return EndReport(outcomes)


def reap_own_zombie(identity: ChildIdentity) -> None:
    """Reap ``identity`` if it is this process's own child and has exited.

    A close ladder that gave up (its child could not be proven gone) no longer waits
    for the child; when the child ends later, it stays a zombie of the daemon until
    someone reaps it. The retry that proves it gone reaps it here, so the lease is
    released after ``wait()`` returned (invariant 1) and no zombie is left behind.
    The pid of an unreaped child cannot be reused, so a zombie with our pid as parent
    and the recorded start time is that child.
    """
    info = read_proc_info(identity.pid) if identity.pid > 0 else None
    if (
        info is not None
        and info.is_zombie
        and info.ppid == os.getpid()
        and info.start_time == identity.start_time
    ):
        os.waitpid(identity.pid, os.WNOHANG)


async def end_contained(
    identities: Sequence[ChildIdentity],
    ladder: Ladder,
    scanner: ProcScanner,
    root: CgroupRoot | None,
    *,
    sweep: bool,
    keep: Collection[str] = (),
) -> EndReport:
    """`end_processes`, after ending the identities' cgroups under ``root`` (with
    ``sweep``: every session cgroup there, which at start-up are all a previous
    daemon's, but those of the spawn tokens in ``keep``: agents taken over). A child
    whose cgroup was emptied counts ``ENDED``; one whose cgroup could not be emptied
    ``UNPROVEN``. Shielded and bounded; never raises."""
    by_path: dict[Path, bool | None] = {}
    if root is not None:
        spared = {root.for_token(token).path for token in keep}
        cgroups = (
            [c for c in root.existing() if c.path not in spared]
            if sweep
            else [root.for_token(i.token) for i in identities]
        )
        # Their children are no trio.Process's any more (a previous daemon's, or a
        # close ladder's that gave up): reaped here, before the lease goes.
        by_path = await end_cgroups(
            cgroups, ladder.kill_wait_s * (ladder.proof_rounds + 1), reap_children=True
        )
    report = await end_processes(identities, ladder, scanner)
    if root is None:
        return report
    outcomes = dict(report.outcomes)
    for identity in identities:
        contained = by_path.get(root.for_token(identity.token).path, False)
        if contained is None:
            outcomes[identity] = EndOutcome.UNPROVEN
        elif contained and outcomes.get(identity) is EndOutcome.ALREADY_GONE:
            outcomes[identity] = EndOutcome.ENDED
    return EndReport(outcomes)
