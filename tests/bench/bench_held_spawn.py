"""A held agent's spawn into its cgroup (``holder = true``): the holder cloning it
there (``agentsd.holder`` Rule 1) against the shell shim that joins ``cgroup.procs``
(what a holder of an earlier release is sent), and against the daemon's own spawn
through its fork server (``holder = false``), in the same run.

Figures (``python -m tests.bench held_spawn``): from ``open_held_child`` (or
``open_child``) being entered until the agent (``cat``) echoes a byte back, p50 of
``SPAWNS`` rounds alternating the three ways after an idle pause each (a lone
spawn: a ``cgroup.procs`` write right after another one skips the kernel's RCU
grace period, so bursts would flatter the shim), with the ratio and difference to
the fork server's. Needs a writable cgroup v2 directory (``tests.cgroup_root``);
nothing asserts.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import trio

from agentsd.cgroup import CgroupRoot
from agentsd.child import ChildSpec, new_spawn_token, open_child
from agentsd.held_child import HeldExit, open_held_child
from agentsd.holder_link import HolderLink, open_holder_keeper
from agentsd.spawner import use_fork_server
from tests.bench.bench_spawn import FAST, IDLE_S, _spawned
from tests.cgroup_root import cgroup_root, unavailable

SPAWNS = 100  # per way


def _spec(root: CgroupRoot) -> ChildSpec:
    return ChildSpec(
        argv=["/bin/cat"], cwd="/", env={}, token=new_spawn_token(), cgroup_root=root, base_env={}
    )


def _exited(outcome: HeldExit) -> None:
    return None


async def _held(link: HolderLink, root: CgroupRoot, clone: bool) -> float:
    link.clones_into_cgroups = clone
    started = time.perf_counter()
    async with open_held_child(_spec(root), FAST, _spawned, _exited, link) as child:
        await child.stdin.send_all(b"x")
        await child.stdout.receive_some(1)
        took = time.perf_counter() - started
    return took


async def _direct(root: CgroupRoot) -> float:
    use_fork_server(True)
    started = time.perf_counter()
    async with open_child(_spec(root), FAST, _spawned, _exited) as child:
        await child.stdin.send_all(b"x")
        await child.stdout.receive_some(1)
        took = time.perf_counter() - started
    return took


async def _measure(root: CgroupRoot, state: Path) -> dict[str, float]:
    took: dict[str, list[float]] = {"fork server": [], "holder clone": [], "holder shim": []}
    async with open_holder_keeper(state) as keeper:
        link = await keeper.link()
        cloning = link.clones_into_cgroups
        for _ in range(SPAWNS):
            await trio.sleep(IDLE_S)
            took["fork server"].append(await _direct(root))
            await trio.sleep(IDLE_S)
            took["holder clone"].append(await _held(link, root, True))
            await trio.sleep(IDLE_S)
            took["holder shim"].append(await _held(link, root, False))
        link.clones_into_cgroups = cloning
    return {way: statistics.median(times) for way, times in took.items()}


def main() -> None:
    reason = unavailable()
    if reason is not None:
        print(f"   skipped: {reason}")
        return
    with cgroup_root() as path, tempfile.TemporaryDirectory(dir="/tmp") as state:
        p50 = trio.run(_measure, CgroupRoot(path), Path(state))
    base = p50["fork server"]
    for way, value in p50.items():
        print(
            f"   lone spawn into its cgroup, {way}: p50 {value * 1000:.2f} ms "
            f"({value / base:.2f}x, {(value - base) * 1000:+.2f} ms of the fork server's)"
        )
