"""agentsd.resources in the fallback: figures of an agent's process group from
/proc, and at most one /proc scan a second however often a client asks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agentsd import resources
from agentsd.cgroup import CgroupRoot
from agentsd.procfs import current_scanner, scan_processes
from agentsd.resources import cached_resources, read_resources
from agentsd_protocol.api.session import ChildInfo
from tests.polling import eventually

# A group leader with one child of its own: two live members.
TWO = [
    sys.executable,
    "-c",
    "import subprocess, time; subprocess.Popen(['sleep', '100']); time.sleep(100)",
]


@pytest.fixture
def groups() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the group it leads, ours alone
        process.wait()


def _session(process: subprocess.Popen[bytes]) -> Any:
    child = ChildInfo(pid=process.pid, pgid=process.pid, generation="g", started_at=0.0)
    return SimpleNamespace(child=child, lease=SimpleNamespace(token=f"t{process.pid}"))


def _group(groups: list[subprocess.Popen[bytes]], argv: list[str]) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(argv, start_new_session=True)
    groups.append(process)
    return process


async def _members(pgid: int, want: int) -> None:
    await eventually(lambda: len(scan_processes().group_members(pgid)) >= want, timeout_s=30)


async def test_fallback_figures_are_the_process_group_and_scans_are_shared(
    groups: list[subprocess.Popen[bytes]],
) -> None:
    first = _group(groups, TWO)
    await _members(first.pid, 2)
    scanner = current_scanner()
    before = scanner.scans_completed
    [figures] = await read_resources(None, [_session(first)])
    assert figures is not None
    assert (figures.process_group, figures.cgroup, figures.processes) == (first.pid, None, 2)
    assert figures.memory_bytes is None and figures.cpu_us is not None
    # Asked again at once: the same scan answers.
    for _ in range(20):
        await read_resources(None, [_session(first)])
    assert scanner.scans_completed == before + 1
    # An agent started since: a scan that cannot show it is not used.
    second = _group(groups, ["sleep", "100"])
    found = await read_resources(None, [_session(first), _session(second)])
    assert [f.processes if f else None for f in found] == [2, 1]
    assert scanner.scans_completed == before + 2
    # No running agent: nothing is read.
    idle: Any = SimpleNamespace(child=None, lease=None)
    assert await read_resources(None, [idle]) == [None]
    assert scanner.scans_completed == before + 2


async def test_cached_figures_answer_only_from_a_fresh_index_that_shows_every_agent(
    groups: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fresh for the whole test, however slow the machine: what is asserted here is
    # which sessions the index can answer for, not how long it lasts.
    monkeypatch.setattr(resources, "SCAN_MAX_AGE_S", 3600.0)
    first = _group(groups, TWO)
    await _members(first.pid, 2)
    idle: Any = SimpleNamespace(child=None, lease=None)
    scanner = current_scanner()
    [scanned] = await read_resources(None, [_session(first)])
    before = scanner.scans_completed
    # The scan just made answers without another, and a session without an agent has none.
    assert cached_resources(None, [_session(first), idle]) == [scanned, None]
    # An agent the index cannot show: no answer from it, the caller scans.
    second = _group(groups, ["sleep", "100"])
    assert cached_resources(None, [_session(first), _session(second)]) is None
    # Cgroup figures are files read in a thread: never answered from the index.
    assert cached_resources(CgroupRoot(Path("/nonexistent")), [_session(first)]) is None
    assert scanner.scans_completed == before
