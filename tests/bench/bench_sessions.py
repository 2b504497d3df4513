"""Supervised sessions at scale, each figure next to a baseline from the same run.

Figures (``python -m tests.bench sessions``):

- create + ready + close of one mock-agent session through the whole daemon (lease,
  spawn, identity, handshake, close ladder, proof of exit, release: every step
  durable), against a bare ``posix_spawn`` + ``waitpid`` of the same program, with
  and without its handshake (target: at most 1.6x the bare spawn, plus the
  handshake);
- ``agentSession.get`` p50 with ``LIVE_FOR_GET`` live sessions, against
  ``daemon.ping`` (target: at most 1.5x);
- daemon RSS per live session with ``SESSIONS`` sessions whose child is a tiny shell
  (children are separate processes: not counted) (target: at most 32 KiB);
- closing all of them at once, children that ignore stdin EOF and SIGTERM, against
  one ladder's grace (target: at most 2x);
- the same close-all in a second daemon with a cgroup root (``tests.cgroup_root``,
  where one can be made): the last rung is ``cgroup.kill`` and the proof ``populated
  0``, against the first daemon's SIGKILL to each group and /proc scans.

A daemon made by ``running_daemon`` under ``AGENTSD_TEST_CGROUP=1`` has a cgroup
root of its own: the first daemon is then in cgroup mode too, and the comparison
says so.

Nothing here asserts: the machine is shared.
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec

from agentsctl.client import Client
from agentsd_protocol import methods
from agentsd_protocol.api import session as s
from agentsd_protocol.api.daemon import StatusParams
from tests.cgroup_root import cgroup_root, unavailable
from tests.daemon_process import DaemonProcess, running_daemon

ROUNDS = 12  # create/ready/close pairs
SESSIONS = 500
LIVE_FOR_GET = 100
ROUND_TRIPS = 1000  # per get/ping measurement
LATENCY_ROUNDS = 3  # paired get/ping rounds; the ratio is their median
CONNECTIONS = 8  # concurrent creates and closes are spread over these
EOF_GRACE_S, TERM_GRACE_S, KILL_WAIT_S = 0.5, 0.5, 1.0
LADDER_GRACE_S = EOF_GRACE_S + TERM_GRACE_S  # what a child deaf to EOF and SIGTERM costs

SPAWN_TARGET = 1.6
GET_TARGET = 1.5
RSS_TARGET_KIB = 32
CLOSE_TARGET = 2.0

MOCK = [sys.executable, "-m", "agentsd.providers.mock_agent"]
INITIALIZE = b'{"type":"initialize","handle":null}\n'
# The smallest agent the mock adapter accepts: answer the handshake, then sleep,
# deaf to stdin EOF and to SIGTERM (an ignored signal stays ignored across exec).
STUBBORN_TINY = [
    "/bin/sh",
    "-c",
    "trap '' TERM; read -r line; "
    'printf \'%s\\n\' \'{"type":"initialized","handle":"tiny"}\'; exec sleep 86400',
]

_encoder = msgspec.json.Encoder()


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


@contextmanager
def short_ladder_config() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(
            f"[ladder]\neof_grace_s = {EOF_GRACE_S}\nterm_grace_s = {TERM_GRACE_S}\n"
            f"kill_wait_s = {KILL_WAIT_S}\n"
        )
        yield path


# ---- the baseline: a bare spawn of the same program --------------------------------


def bare_spawn_s(handshake: bool) -> float:
    """posix_spawn the mock agent with pipes, optionally complete its handshake,
    close its stdin (it exits on EOF) and waitpid it."""
    child_in, parent_out = os.pipe()
    parent_in, child_out = os.pipe()
    started = time.perf_counter()
    pid = os.posix_spawn(
        MOCK[0],
        MOCK,
        os.environ,
        file_actions=[
            (os.POSIX_SPAWN_DUP2, child_in, 0),
            (os.POSIX_SPAWN_DUP2, child_out, 1),
            (os.POSIX_SPAWN_CLOSE, parent_out),
            (os.POSIX_SPAWN_CLOSE, parent_in),
        ],
        setsid=True,
    )
    os.close(child_in)
    os.close(child_out)
    try:
        if handshake:
            os.write(parent_out, INITIALIZE)
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = os.read(parent_in, 4096)
                if not chunk:
                    raise ConnectionError("the mock agent exited during its handshake")
                reply += chunk
        os.close(parent_out)
        os.waitpid(pid, 0)
        return time.perf_counter() - started
    finally:
        os.close(parent_in)


def daemon_cycle_s(client: Client) -> float:
    started = time.perf_counter()
    created = client.call(methods.CREATE, s.CreateParams(provider="mock", cwd="/tmp"))
    client.call(methods.CLOSE, s.CloseParams(session_id=created.session_id))
    elapsed = time.perf_counter() - started
    # Keep the registry as it was.
    client.call(methods.DELETE, s.DeleteParams(session_id=created.session_id))
    return elapsed


# ---- round trips ----------------------------------------------------------------------


def round_trip_us(sock: socket.socket, request: bytes) -> float:
    started = time.perf_counter_ns()
    sock.sendall(request)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        reply += chunk
    return (time.perf_counter_ns() - started) / 1000


def p50_us(path: Path, request: bytes) -> float:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10.0)
        sock.connect(str(path))
        for _ in range(ROUND_TRIPS // 5):
            round_trip_us(sock, request)
        return statistics.median(round_trip_us(sock, request) for _ in range(ROUND_TRIPS))


def encoded(method: str, params: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": method}
    if params is not None:
        message["params"] = params
    return _encoder.encode(message) + b"\n"


# ---- many at once ----------------------------------------------------------------------


def pipelined(clients: list[Client], calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Submit every call at once, spread over ``clients``; the results in order."""
    submitted = [
        (clients[i % len(clients)], clients[i % len(clients)].submit(method, params))
        for i, (method, params) in enumerate(calls)
    ]
    return [client.wait(call) for client, call in submitted]


def create_tiny(clients: list[Client], count: int) -> list[str]:
    params = {"provider": "mock", "cwd": "/tmp", "command": STUBBORN_TINY}
    results = pipelined(clients, [("agentSession.create", params)] * count)
    phases = {r["session"]["phase"] for r in results}
    if phases != {"running"}:
        raise RuntimeError(f"tiny sessions did not all start: {phases}")
    return [r["sessionId"] for r in results]


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def verdict(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def run(daemon: DaemonProcess) -> float:
    pid = daemon.process.pid
    with Client(daemon.socket, timeout_s=120) as client:
        daemon_cycle_s(client)  # warm up: every code path loaded once
        bare_spawn_s(True)
        daemon_s, plain_s, shaken_s = [], [], []
        for _ in range(ROUNDS):
            daemon_s.append(daemon_cycle_s(client))
            plain_s.append(bare_spawn_s(False))
            shaken_s.append(bare_spawn_s(True))
        cycle = statistics.median(daemon_s)
        plain = statistics.median(plain_s)
        shaken = statistics.median(shaken_s)
        handshake = max(0.0, shaken - plain)
        allowed = SPAWN_TARGET * plain + handshake
        print(
            f"   create+ready+close  daemon {cycle * 1e3:7.1f} ms   bare spawn+wait "
            f"{plain * 1e3:6.1f} ms (+handshake {shaken * 1e3:6.1f} ms)   "
            f"ratio {cycle / plain:.2f}x, {cycle / shaken:.2f}x with the handshake "
            f"(target <= {SPAWN_TARGET}x + handshake = {allowed * 1e3:.1f} ms) "
            f"{verdict(cycle <= allowed)}"
        )

        rss_before = vm_rss_kib(pid)
        clients = [Client(daemon.socket, timeout_s=120) for _ in range(CONNECTIONS)]
        try:
            sids = create_tiny(clients, LIVE_FOR_GET)
            get = encoded("agentSession.get", {"sessionId": sids[0]})
            ping = encoded("daemon.ping")
            pairs = []
            for i in range(LATENCY_ROUNDS):
                first, second = (get, ping) if i % 2 == 0 else (ping, get)
                a, b = p50_us(daemon.socket, first), p50_us(daemon.socket, second)
                pairs.append((a, b) if first is get else (b, a))
            get_p50 = statistics.median(g for g, _ in pairs)
            ping_p50 = statistics.median(p for _, p in pairs)
            get_ratio = statistics.median(g / p for g, p in pairs)
            print(
                f"   get p50 ({LIVE_FOR_GET} live)    {get_p50:7.1f} us   ping {ping_p50:7.1f} us   "
                f"ratio {get_ratio:.2f}x (target <= {GET_TARGET}x) "
                f"{verdict(get_ratio <= GET_TARGET)}"
            )

            sids += create_tiny(clients, SESSIONS - LIVE_FOR_GET)
            running = client.call(methods.LIST, s.ListParams(state="running")).sessions
            if len(running) != SESSIONS:
                raise RuntimeError(f"{len(running)} sessions run, not {SESSIONS}")
            rss_after = vm_rss_kib(pid)
            per_session = (rss_after - rss_before) / SESSIONS
            print(
                f"   RSS per session     {per_session:7.1f} KiB ({SESSIONS} live: "
                f"{rss_before / 1024:.1f} -> {rss_after / 1024:.1f} MiB, children excluded) "
                f"(target <= {RSS_TARGET_KIB} KiB) {verdict(per_session <= RSS_TARGET_KIB)}"
            )

            close_s, killed = close_all(clients, sids)
            print(
                f"   close all {SESSIONS}       {close_s:7.2f} s   one ladder's grace "
                f"{LADDER_GRACE_S:.2f} s   ratio {close_s / LADDER_GRACE_S:.2f}x "
                f"(target <= {CLOSE_TARGET}x) {verdict(close_s <= CLOSE_TARGET * LADDER_GRACE_S)}"
                f"   ({killed} needed SIGKILL; {containment(client)})"
            )
            return close_s
        finally:
            for extra in clients:
                extra.close()


def close_all(clients: list[Client], sids: list[str]) -> tuple[float, int]:
    """Close every session at once; the time it took and how many needed SIGKILL."""
    closes = [("agentSession.close", {"sessionId": sid}) for sid in sids]
    results: list[Any] = []
    close_s = timed(lambda: results.extend(pipelined(clients, closes)))
    killed = sum(1 for r in results if (r["session"]["lastExit"] or {}).get("signal") == 9)
    return close_s, killed


def containment(client: Client) -> str:
    return client.call(methods.STATUS, StatusParams()).containment.mode


def close_all_in_cgroups(daemon: DaemonProcess) -> tuple[float, int, str]:
    """``SESSIONS`` tiny sessions created and closed at once in ``daemon``."""
    clients = [Client(daemon.socket, timeout_s=120) for _ in range(CONNECTIONS)]
    try:
        sids = create_tiny(clients, SESSIONS)
        close_s, killed = close_all(clients, sids)
        return close_s, killed, containment(clients[0])
    finally:
        for extra in clients:
            extra.close()


def main() -> None:
    with short_ladder_config() as config:
        with running_daemon(extra_args=["--config", str(config)]) as d:
            ladder_s = run(d)
        reason = unavailable()
        if reason is not None:
            print(f"   close all {SESSIONS} in cgroups: skipped ({reason})")
        else:
            with (
                cgroup_root() as root,
                running_daemon(
                    extra_args=["--config", str(config), "--cgroup-root", str(root)]
                ) as d,
            ):
                cgroup_s, killed, mode = close_all_in_cgroups(d)
            print(
                f"   close all {SESSIONS} in cgroups {cgroup_s:7.2f} s ({mode}: cgroup.kill, "
                f"populated 0)   vs the first daemon {ladder_s:.2f} s   ratio "
                f"{cgroup_s / ladder_s:.2f}x   ({killed} ended by SIGKILL)"
            )
    print(f"   (medians of {ROUNDS} cycles; {os.cpu_count()} cpus, shared)")
