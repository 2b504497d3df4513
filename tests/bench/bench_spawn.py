"""Spawning an agent child into its own cgroup vs today's spawn, in the same run.

Figures (``python -m tests.bench spawn``):

- spawn: from ``open_child`` being entered until the agent (``cat``) echoes a byte
  back: cgroup made, spawn, identity read. Three ways, paired and alternating in
  rounds: no cgroup (the fallback), the fork server cloning the agent into its
  cgroup (``agentsd.spawner``: what cgroup mode does), and the shell shim that
  joins ``cgroup.procs`` then execs (what it did before, and its fallback). p50 of
  the rounds, with the ratio and difference to no cgroup (target: at most 1.1x +
  2 ms). Also taken with a 200 MiB heap, nearer a busy daemon's size: a spawn that
  cannot vfork pays for the parent's size.
- burst: ``BURST`` spawns at once, the three ways: the time until the last agent
  answered, per spawn (no close overlaps them; before the fork server this figure
  included the closes, and cgroup mode's were most of its extra).
- close-all: ``CHILDREN`` children that ignore stdin EOF and SIGTERM, closed at once
  with zero graces: today's ladder (SIGKILL to each group, then /proc scans for
  proof) vs ``cgroup.kill`` and ``populated 0``.
- where the fork server's time goes: making the cgroup, the request's round trip
  (the clone of ``true``: until the server's reply) against ``subprocess.Popen``
  of it (the daemon's own vfork, until the constructor returns), the server's CPU
  time per clone and the page faults of a cloned ``true`` against a vforked one
  (the clone runs a copy of the server's Python until it execs);
- where the shim's time goes: the shell alone (``sh -c 'exec "$@"'`` against the
  program itself, spawned and reaped), a ``cgroup.procs`` write after the
  hierarchy was idle for a while (what a lone spawn through the shim pays) and one
  right after another write.

Needs a writable cgroup v2 directory (``tests.cgroup_root``); nothing asserts.

Measured here (Linux 6.18, cgroup2 mounted without ``favordynmods``): a write to
``cgroup.procs`` and ``cgroup.kill`` each take ``cgroup_threadgroup_rwsem`` for
writing, which waits for an RCU grace period (10-15 ms) unless another writer went
just before. A process cloned with ``CLONE_INTO_CGROUP`` takes it only for
reading: the fork server's spawn waits for no grace period.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

from agentsd.cgroup import CgroupRoot, SessionCgroup
from agentsd.child import SHELL, ChildExit, ChildSpec, new_spawn_token, open_child
from agentsd.config import Ladder
from agentsd.leftovers import ChildIdentity
from agentsd.spawner import ForkServer, _payload, fork_server, use_fork_server
from tests.cgroup_root import cgroup_root, unavailable

SPAWNS = 200  # per mode and heap size
PIECES = 100  # samples of each piece of a spawn
IDLE_S = 0.1  # no cgroup migration for this long: longer than an RCU grace period
BURST = 20  # spawns at once, as when a restarted daemon's sessions start again
BURSTS = 5
CHILDREN = 200  # closed at once
BALLAST_BYTES = 200 * 1024 * 1024
TARGET_RATIO = 1.1
TARGET_EXTRA_MS = 2.0
FAST = Ladder(eof_grace_s=0.0, term_grace_s=0.0, kill_wait_s=5.0)
STUBBORN = [
    sys.executable,
    "-c",
    "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.pause()",
]


def _spec(root: CgroupRoot | None, argv: list[str]) -> ChildSpec:
    return ChildSpec(
        argv=argv, cwd="/", env={}, token=new_spawn_token(), cgroup_root=root, base_env={}
    )


async def _spawned(identity: ChildIdentity) -> None:
    return None


def _exited(outcome: ChildExit) -> None:
    return None


async def _spawn_once(root: CgroupRoot | None) -> float:
    started = time.perf_counter()
    async with open_child(_spec(root, ["/bin/cat"]), FAST, _spawned, _exited) as child:
        await child.stdin.send_all(b"x")
        await child.stdout.receive_some(1)  # the agent itself runs
        took = time.perf_counter() - started
    return took


Ways = tuple[float, float, float]  # no cgroup, fork server, shell shim


async def _spawn_way(root: CgroupRoot, way: int) -> float:
    use_fork_server(way == 1)
    return await _spawn_once(None if way == 0 else root)


async def _spawns(root: CgroupRoot) -> tuple[Ways, Ways]:
    """p50s of paired, alternating rounds (the cores are shared): no cgroup and
    the fork server, then no cgroup and the shim. Never the server and the shim
    in one loop: a daemon uses one or the other, and the shim's cgroup.procs
    writes change what the kernel's lock costs the spawns around them."""
    pairs: list[Ways] = []
    for contained in (1, 2):
        took: dict[int, list[float]] = {0: [], contained: []}
        for _ in range(SPAWNS):
            for way in (0, contained):
                took[way].append(await _spawn_way(root, way))
        plain, other = statistics.median(took[0]), statistics.median(took[contained])
        pairs.append((plain, other, other))
    (plain_1, server, _), (plain_2, shim, _) = pairs
    return (plain_1, server, server), (plain_2, shim, shim)


async def _close_all(root: CgroupRoot | None) -> float:
    ready = trio.Event()

    async def one(send_up: trio.MemorySendChannel[None]) -> None:
        async with open_child(_spec(root, STUBBORN), FAST, _spawned, _exited):
            await send_up.send(None)
            await ready.wait()

    send, receive = trio.open_memory_channel[None](CHILDREN)
    async with trio.open_nursery() as nursery:
        for _ in range(CHILDREN):
            nursery.start_soon(one, send)
        for _ in range(CHILDREN):
            await receive.receive()
        await trio.sleep(0.5)  # let every interpreter reach signal.pause()
        started = time.perf_counter()
        ready.set()
    return time.perf_counter() - started


def _spawn_wait_s(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - started


def _join_s(cgroup: Path, idle_s: float) -> float:
    """Write a sleeping process into ``cgroup`` after ``idle_s`` without any
    cgroup migration; how long the write took."""
    with subprocess.Popen(["/bin/sleep", "30"]) as sleeper:
        time.sleep(idle_s)
        started = time.perf_counter()
        (cgroup / "cgroup.procs").write_text(str(sleeper.pid))
        took = time.perf_counter() - started
        sleeper.kill()
    return took


def _where_the_time_goes(root: Path) -> None:
    true = shutil.which("true") or "/bin/true"
    bare = statistics.median(_spawn_wait_s([true]) for _ in range(PIECES))
    shim = statistics.median(
        _spawn_wait_s([SHELL, "-c", 'exec "$@"', "sh", true]) for _ in range(PIECES)
    )
    cgroup = root / "pieces"
    cgroup.mkdir()
    try:
        cold = statistics.median(_join_s(cgroup, IDLE_S) for _ in range(PIECES // 4))
        warm = []
        for _ in range(PIECES // 4):
            _join_s(cgroup, IDLE_S)
            warm.append(_join_s(cgroup, 0.0))
    finally:
        SessionCgroup(cgroup).kill()
        while SessionCgroup(cgroup).populated():
            time.sleep(0.01)
        cgroup.rmdir()
    print(
        f"   pieces: spawn+reap of true {bare * 1000:.2f} ms, through the sh shim "
        f"{shim * 1000:.2f} ms (+{(shim - bare) * 1000:.2f} ms); a cgroup.procs write "
        f"after {IDLE_S * 1000:.0f} ms idle {cold * 1000:.2f} ms, right "
        f"after another {statistics.median(warm) * 1000:.2f} ms "
        f"(cgroup2 mount options: {_mount_options(root)})",
        flush=True,
    )


async def _server_pieces(root: CgroupRoot, server: ForkServer) -> None:
    """Where a spawn through the fork server spends its time (see the docstring)."""
    true = shutil.which("true") or "/bin/true"
    payload = _payload(true, [true], "/", {})
    made, trips, popens, faults, plain_faults = [], [], [], [], []
    cpu_before = _cpu_s(server.process.pid)
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for _ in range(PIECES):
            started = time.perf_counter()
            cgroup = root.create(new_spawn_token())
            made.append(time.perf_counter() - started)
            fd = os.open(cgroup.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                started = time.perf_counter()
                pid, _err, _step = await server.clone(fd, (devnull, devnull, devnull), payload)
                trips.append(time.perf_counter() - started)
            finally:
                os.close(fd)
            faults.append(await trio.to_thread.run_sync(_faults_of, pid))
            cgroup.remove()
            took, plain = await trio.to_thread.run_sync(_vfork_true, true, devnull)
            popens.append(took)
            plain_faults.append(plain)
    finally:
        os.close(devnull)
    cpu_ms = (_cpu_s(server.process.pid) - cpu_before) / PIECES * 1000
    print(
        f"   fork server pieces: cgroup mkdir {statistics.median(made) * 1000:.2f} ms, "
        f"request round trip {statistics.median(trips) * 1000:.2f} ms (a vfork Popen "
        f"{statistics.median(popens) * 1000:.2f} ms), server CPU {cpu_ms:.2f} ms a clone, "
        f"page faults of true cloned {statistics.median(faults):.0f}, vforked "
        f"{statistics.median(plain_faults):.0f}",
        flush=True,
    )


def _faults_of(pid: int) -> int:
    """Reap our exited child ``pid``: its minor page faults."""
    return os.wait4(pid, 0)[2].ru_minflt


def _vfork_true(true: str, devnull: int) -> tuple[float, int]:
    """``subprocess.Popen`` of ``true`` (a vfork): how long its constructor took,
    and the page faults of the child."""
    started = time.perf_counter()
    popen = subprocess.Popen([true], stdin=devnull, stdout=devnull, stderr=devnull)
    took = time.perf_counter() - started
    faults = _faults_of(popen.pid)
    popen.returncode = 0
    return took, faults


def _cpu_s(pid: int) -> float:
    """utime + stime of ``pid``, in seconds (clock ticks: a mean over many clones)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _mount_options(path: Path) -> str:
    best = ""
    options = "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        _device, mount, kind, opts, *_ = line.split()
        if kind == "cgroup2" and str(path).startswith(mount) and len(mount) > len(best):
            best, options = mount, opts
    return options


async def _burst(root: CgroupRoot, way: int) -> float:
    """``BURST`` spawns at once: the time until the last agent answered, per spawn.
    Every child stays open until then, so no close overlaps the spawns."""
    use_fork_server(way == 1)
    answered: list[float] = []
    all_answered = trio.Event()

    async def one() -> None:
        spec = _spec(None if way == 0 else root, ["/bin/cat"])
        async with open_child(spec, FAST, _spawned, _exited) as child:
            await child.stdin.send_all(b"x")
            await child.stdout.receive_some(1)
            answered.append(time.perf_counter())
            if len(answered) == BURST:
                all_answered.set()
            await all_answered.wait()

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(BURST):
            nursery.start_soon(one)
    return (max(answered) - started) / BURST


def _report_spawn(label: str, name: str, plain: float, contained: float) -> None:
    ratio = contained / plain
    extra_ms = (contained - plain) * 1000
    ok = contained <= plain * TARGET_RATIO + TARGET_EXTRA_MS / 1000
    print(
        f"   spawn {label}: no cgroup p50 {plain * 1000:.2f} ms, {name} p50 "
        f"{contained * 1000:.2f} ms: {ratio:.2f}x, {extra_ms:+.2f} ms "
        f"(target <= {TARGET_RATIO}x + {TARGET_EXTRA_MS:g} ms: {'met' if ok else 'MISSED'})",
        flush=True,
    )


def _report_ways(label: str, ways: tuple[Ways, Ways]) -> None:
    (plain_1, server, _), (plain_2, shim, _) = ways
    _report_spawn(label, "fork server", plain_1, server)
    _report_spawn(label, "old shim", plain_2, shim)


async def _bursts(root: CgroupRoot) -> tuple[Ways, Ways]:
    """As `_spawns`, for bursts."""
    pairs: list[tuple[float, float]] = []
    for contained in (1, 2):
        took: dict[int, list[float]] = {0: [], contained: []}
        for _ in range(BURSTS):
            for way in (0, contained):
                took[way].append(await _burst(root, way))
        pairs.append((statistics.median(took[0]), statistics.median(took[contained])))
    (plain_1, server), (plain_2, shim) = pairs
    return (plain_1, server, server), (plain_2, shim, shim)


async def _main(path: Path) -> None:
    root = CgroupRoot(path)
    print(f"   load average before: {_load()}", flush=True)
    server = await fork_server()
    if server is None:
        print("   no fork server: the figures below are the shim's", flush=True)
    _report_ways("(bench heap)", await _spawns(root))
    ballast = bytearray(os.urandom(1024)) * (BALLAST_BYTES // 1024)  # touched pages
    _report_ways("(+200 MiB heap)", await _spawns(root))
    del ballast
    await trio.to_thread.run_sync(_where_the_time_goes, path)
    if server is not None:
        await _server_pieces(root, server)
    _report_ways(f"(burst of {BURST} at once, per spawn)", await _bursts(root))
    use_fork_server(True)
    today = await _close_all(None)
    cgroup = await _close_all(root)
    print(
        f"   close-all of {CHILDREN} stubborn children at once: today's ladder "
        f"{today:.2f} s, cgroup.kill {cgroup:.2f} s: {cgroup / today:.2f}x",
        flush=True,
    )
    print(f"   load average after: {_load()}", flush=True)


def _load() -> str:
    """The 1, 5 and 15 minute load averages: the cores are shared."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    reason = unavailable()
    if reason is not None:
        print(f"   skipped: {reason}")
        return
    with cgroup_root() as path:
        trio.run(_main, path)
