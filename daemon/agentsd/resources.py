"""What each running agent uses: CPU time, processes and memory (issue 17 item 5).

Rule 1: with a cgroup (``agentsd.cgroup``) the figures are the cgroup's own files:
``cpu.stat`` ``usage_usec`` (everything that ever ran in it, exited processes
included), ``cgroup.procs`` (processes now) and, where the memory controller is
enabled for it, ``memory.current`` and ``memory.peak``. In the fallback they are
what ``/proc`` says of the agent's process group: its live members, and their CPU
time with that of the children they waited for; memory is None there (a sum of
resident sizes counts shared pages once per process: no honest figure), and so is
anything a process that left the group (``setsid``) uses.

Rule 2: ``get`` and ``list`` read the figures when asked (`read_resources`, one
worker thread per page); the status feed carries the latest sample, taken every
``SAMPLE_INTERVAL_S`` while anyone watches (`run_sampler`), and a new sample is a
content change of the summary, paced like streaming text (``agentsd.status_board``
Rule 2).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from agentsd.cgroup import CgroupRoot
from agentsd.procfs import scan_processes
from agentsd_protocol.api.session import Resources

if TYPE_CHECKING:
    from agentsd.session import Session
    from agentsd.supervisor import Supervisor

__all__ = ["SAMPLE_INTERVAL_S", "read_resources", "run_sampler"]

SAMPLE_INTERVAL_S = 5.0  # a status bar's CPU and memory figures: fresh enough, cheap
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def read_resources(root: CgroupRoot | None, sessions: Sequence[Session]) -> list[Resources | None]:
    """The figures of each session's running agent, None for a session without one
    (Rule 1). Blocking: reads cgroupfs or ``/proc``; run it in a worker thread."""
    running = [
        (s.lease.token, s.child.pgid) if s.child is not None and s.lease is not None else None
        for s in sessions
    ]
    if not any(running):
        return [None] * len(sessions)
    if root is not None:
        return [None if r is None else _from_cgroup(root, r[0]) for r in running]
    table = scan_processes()
    out: list[Resources | None] = []
    for r in running:
        if r is None:
            out.append(None)
            continue
        members = table.group_members(r[1])
        if not members:
            out.append(None)
            continue
        ticks = sum(p.cpu_ticks for p in members)
        out.append(
            Resources(
                process_group=r[1],
                cpu_us=ticks * 1_000_000 // _CLOCK_TICKS_PER_S,
                processes=len(members),
            )
        )
    return out


def _from_cgroup(root: CgroupRoot, token: str) -> Resources | None:
    cgroup = root.for_token(token)
    found = cgroup.figures()
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
    of each that changed (Rule 2)."""
    board = supervisor.board
    while True:
        await trio.sleep(interval_s)
        if not board.watched:
            continue
        sessions = [s for s in supervisor.sessions.values() if s.child is not None]
        root = supervisor.containment.root
        figures = await trio.to_thread.run_sync(read_resources, root, sessions)
        for session, resources in zip(sessions, figures, strict=True):
            if resources != session.resources:
                session.resources = resources
                board.changed(session)
