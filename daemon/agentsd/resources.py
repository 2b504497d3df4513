"""What each running agent uses: CPU time, processes and memory (issue 17 item 5).

Rule 1: with a cgroup (``agentsd.cgroup``) the figures are the cgroup's own files:
``cpu.stat`` ``usage_usec`` (everything that ever ran in it, exited processes
included), ``cgroup.procs`` (processes now) and, where the memory controller is
enabled for it, ``memory.current`` and ``memory.peak``. In the fallback they are
what ``/proc`` says of the agent's process group: its live members, and their CPU
time with that of the children they waited for; memory is None there (a sum of
resident sizes counts shared pages once per process: no honest figure), and so is
anything a process that left the group (``setsid``) uses.

Rule 2: ``get`` and ``list`` read the figures when asked (`read_resources`): the
cgroup's files in a worker thread; in the fallback, an index of the process groups
built from a ``/proc`` scan at most ``SCAN_MAX_AGE_S`` old (a scan of every process
takes milliseconds: a client polling ``get`` costs one a second, not one a call,
and a fresh index answers without leaving the trio thread).

Rule 3: the status feed carries the latest sample, taken every ``SAMPLE_INTERVAL_S``
while anyone watches (`run_sampler`); a new sample is a content change of the
summary, paced like streaming text (``agentsd.status_board`` Rule 2).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import trio

from agentsd.cgroup import CgroupRoot
from agentsd.procfs import ProcessTable, current_scanner
from agentsd_protocol.api.session import Resources

if TYPE_CHECKING:
    from agentsd.session import Session
    from agentsd.supervisor import Supervisor

__all__ = [
    "SAMPLE_INTERVAL_S",
    "SCAN_MAX_AGE_S",
    "cached_resources",
    "read_resources",
    "run_sampler",
]

SAMPLE_INTERVAL_S = 5.0  # a status bar's CPU and memory figures: fresh enough, cheap
SCAN_MAX_AGE_S = 1.0  # fallback figures a second old at most: one /proc scan a second
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@attrs.frozen
class _GroupIndex:
    """The figures of every process group, as one /proc scan saw its live members;
    built once per scan so that a lookup is all a ``get`` pays."""

    taken_at: float  # trio.current_time() when the scan was asked for
    groups: dict[int, Resources]

    @classmethod
    def of(cls, table: ProcessTable, taken_at: float) -> _GroupIndex:
        counts: dict[int, list[int]] = {}
        for info in table.processes.values():
            if not info.is_zombie:
                entry = counts.setdefault(info.pgid, [0, 0])
                entry[0] += 1
                entry[1] += info.cpu_ticks
        groups = {
            pgid: Resources(
                process_group=pgid,
                cpu_us=ticks * 1_000_000 // _CLOCK_TICKS_PER_S,
                processes=processes,
            )
            for pgid, (processes, ticks) in counts.items()
        }
        return cls(taken_at=taken_at, groups=groups)


_INDEX: trio.lowlevel.RunVar[_GroupIndex | None] = trio.lowlevel.RunVar(
    "agentsd_resources_group_index", default=None
)


def cached_resources(
    root: CgroupRoot | None, sessions: Sequence[Session]
) -> list[Resources | None] | None:
    """What `read_resources` would return, when it can be answered now from the
    fallback's index (Rule 2) without a scan or a thread; None when it cannot. A
    ``get`` polled by a client pays a lookup, not a coroutine and two passes."""
    if root is not None:
        return None
    index = _INDEX.get()
    if index is None or trio.current_time() - index.taken_at > SCAN_MAX_AGE_S:
        return None
    groups = index.groups
    figures: list[Resources | None] = []
    for session in sessions:
        child = session.child
        if child is None:
            figures.append(None)
        elif (found := groups.get(child.pgid)) is not None:
            figures.append(found)
        else:
            return None  # an agent started since the scan: one it was made before cannot show it
    return figures


async def read_resources(
    root: CgroupRoot | None, sessions: Sequence[Session]
) -> list[Resources | None]:
    """The figures of each session's running agent, None for a session without one
    (Rules 1 and 2). Raises nothing: figures that cannot be read are None."""
    if root is not None:
        tokens = [
            s.lease.token if s.child is not None and s.lease is not None else None for s in sessions
        ]
        if not any(tokens):
            return [None] * len(sessions)
        return await trio.to_thread.run_sync(
            lambda: [None if t is None else _from_cgroup(root, t) for t in tokens]
        )
    pgids = [None if s.child is None else s.child.pgid for s in sessions]
    if not any(pgids):
        return [None] * len(sessions)
    figures = cached_resources(root, sessions)
    if figures is not None:
        return figures
    index = _INDEX.get()
    if index is None or trio.current_time() - index.taken_at > SCAN_MAX_AGE_S:
        index = await _scan()
    if index is not None and any(g is not None and g not in index.groups for g in pgids):
        # An agent started since the scan: one it was made before cannot show it.
        index = await _scan()
    if index is None:
        return [None] * len(sessions)
    return [None if g is None else index.groups.get(g) for g in pgids]


async def _scan() -> _GroupIndex | None:
    """A process-group index from a scan begun now; None if /proc cannot be read.
    Concurrent callers share a scan (``agentsd.procfs.ProcScanner``)."""
    now = trio.current_time()
    try:
        table = await current_scanner().scan()
    except OSError:
        return None
    index = _GroupIndex.of(table, now)
    _INDEX.set(index)
    return index


def _from_cgroup(root: CgroupRoot, token: str) -> Resources | None:
    cgroup = root.for_token(token)
    try:
        found = cgroup.figures()
    except (OSError, ValueError):
        return None
    if found is None:
        return None
    return Resources(
        cgroup=str(cgroup.path),
        cpu_us=found.cpu_us,
        processes=found.processes,
        memory_bytes=found.memory_bytes,
        memory_peak_bytes=found.memory_peak_bytes,
    )


async def run_sampler(supervisor: Supervisor, interval_s: float = SAMPLE_INTERVAL_S) -> None:
    """Never returns: every ``interval_s``, while the status board has a watcher,
    sample the running agents' figures into ``Session.resources`` and tell the board
    of each that changed (Rule 3)."""
    board = supervisor.board
    while True:
        await trio.sleep(interval_s)
        if not board.watched:
            continue
        sessions = [s for s in supervisor.sessions.values() if s.child is not None]
        root = supervisor.containment.root
        figures = await read_resources(root, sessions)
        for session, resources in zip(sessions, figures, strict=True):
            if resources != session.resources:
                session.resources = resources
                board.changed(session)
