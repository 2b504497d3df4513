"""``daemon.ping`` against a minimal trio + msgspec NDJSON server, in the same run.

Both servers run in their own subprocess of the same interpreter; this process is
the client. Figures:

- sequential p50/p99 latency of one blocking stdlib-socket client (target: the
  daemon's p50 at most 1.3x the baseline's);
- throughput of 64 concurrent clients, each with one request in flight, driven by
  one ``selectors`` loop that costs far less per request than either server
  (target: at least 0.6x the baseline's requests/s).

Run with ``python -m tests.bench ping``. Nothing here asserts: the machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import msgspec

from tests.daemon_process import POLL_S, START_TIMEOUT_S, make_temp_dir, running_daemon

WARMUP_ROUND_TRIPS = 300
ROUND_TRIPS = 2000
CLIENTS = 64
WARMUP_S = 0.5
MEASURE_S = 2.0
ROUNDS = 3  # paired daemon/baseline rounds; the ratio is their median (the cores are shared)
LATENCY_TARGET = 1.3  # daemon p50 / baseline p50, at most
THROUGHPUT_TARGET = 0.6  # daemon req/s / baseline req/s, at least

T = TypeVar("T")
REQUEST = b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping"}\n'
REPO_ROOT = Path(__file__).resolve().parents[2]


# ---- the baseline server (runs in its own process) ------------------------------------


class _Request(msgspec.Struct):
    id: int | str | None = None
    method: str = ""


class _Pong(msgspec.Struct):
    pong: bool = True


class _Reply(msgspec.Struct):
    jsonrpc: str
    id: int | str | None
    result: _Pong


def serve_baseline(path: str) -> None:
    """Newline-delimited JSON echo: decode each request, reply ``{"pong": true}``."""
    import trio

    decoder = msgspec.json.Decoder(_Request)
    encoder = msgspec.json.Encoder()
    pong = _Pong()

    async def handle(stream: trio.SocketStream) -> None:
        buf = b""
        async with stream:
            with contextlib.suppress(trio.BrokenResourceError):  # the client left
                while data := await stream.receive_some(65536):
                    buf += data
                    *lines, buf = buf.split(b"\n")
                    out = b"".join(
                        encoder.encode(_Reply("2.0", decoder.decode(line).id, pong)) + b"\n"
                        for line in lines
                        if line
                    )
                    if out:
                        await stream.send_all(out)

    async def run() -> None:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(path)
        sock.listen(512)
        listener = trio.SocketListener(sock)
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, handle, [listener])
                async for _ in signals:
                    nursery.cancel_scope.cancel()

    trio.run(run)


@contextlib.contextmanager
def running_baseline() -> Iterator[Path]:
    base = make_temp_dir()
    path = base / "baseline.sock"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.bench_ping", "--baseline-server", str(path)],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with connect(path) as sock:
                    round_trip(sock)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the baseline server did not start") from None
                time.sleep(POLL_S)
        yield path
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        path.unlink(missing_ok=True)
        base.rmdir()


# ---- the client --------------------------------------------------------------------------


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10.0)
    sock.connect(str(path))
    return sock


def round_trip(sock: socket.socket) -> None:
    sock.sendall(REQUEST)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        reply += chunk


def latency_us(path: Path) -> tuple[float, float]:
    """p50 and p99 of sequential round trips on one connection, in microseconds."""
    with connect(path) as sock:
        for _ in range(WARMUP_ROUND_TRIPS):
            round_trip(sock)
        samples = []
        for _ in range(ROUND_TRIPS):
            started = time.perf_counter_ns()
            round_trip(sock)
            samples.append((time.perf_counter_ns() - started) / 1000)
    quantiles = statistics.quantiles(samples, n=100)
    return statistics.median(samples), quantiles[98]


def throughput_rps(path: Path) -> float:
    """Requests/s with ``CLIENTS`` connections, each with one request in flight."""
    socks = [connect(path) for _ in range(CLIENTS)]
    selector = selectors.DefaultSelector()
    try:
        for sock in socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ, bytearray())
            sock.send(REQUEST)
        done = 0
        counted_from = time.monotonic() + WARMUP_S
        ends = counted_from + MEASURE_S
        done_at_start: int | None = None
        while (now := time.monotonic()) < ends:
            if done_at_start is None and now >= counted_from:
                done_at_start = done
            for key, _ in selector.select(timeout=1.0):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                data = conn.recv(65536)
                if not data:
                    raise ConnectionError("server closed a connection")
                buf: bytearray = key.data
                buf += data
                replies = buf.count(b"\n")
                if replies:
                    del buf[: buf.rindex(b"\n") + 1]
                    done += replies
                    conn.send(REQUEST * replies)
        return (done - (done_at_start or 0)) / MEASURE_S
    finally:
        selector.close()
        for sock in socks:
            sock.close()


# ---- the report ----------------------------------------------------------------------------


def paired(measure_daemon: Callable[[], T], measure_base: Callable[[], T]) -> list[tuple[T, T]]:
    """``ROUNDS`` back-to-back pairs, alternating which goes first, so that load from
    elsewhere on the shared machine hits both sides of a ratio alike."""
    pairs = []
    for i in range(ROUNDS):
        if i % 2:
            b = measure_base()
            d = measure_daemon()
        else:
            d = measure_daemon()
            b = measure_base()
        pairs.append((d, b))
    return pairs


def main() -> None:
    with running_daemon() as daemon, running_baseline() as baseline:
        lat = paired(lambda: latency_us(daemon.socket), lambda: latency_us(baseline))
        rps = paired(lambda: throughput_rps(daemon.socket), lambda: throughput_rps(baseline))

    d50 = statistics.median(d[0] for d, _ in lat)
    b50 = statistics.median(b[0] for _, b in lat)
    d99 = statistics.median(d[1] for d, _ in lat)
    b99 = statistics.median(b[1] for _, b in lat)
    lat_ratio = statistics.median(d[0] / b[0] for d, b in lat)
    d_rps = statistics.median(d for d, _ in rps)
    b_rps = statistics.median(b for _, b in rps)
    rps_ratio = statistics.median(d / b for d, b in rps)
    print(
        f"   latency p50   daemon {d50:8.1f} us   baseline {b50:8.1f} us   "
        f"ratio {lat_ratio:.2f}x (target <= {LATENCY_TARGET}x) "
        f"{'ok' if lat_ratio <= LATENCY_TARGET else 'MISSED'}"
    )
    print(f"   latency p99   daemon {d99:8.1f} us   baseline {b99:8.1f} us")
    print(
        f"   {CLIENTS} clients    daemon {d_rps:8.0f} /s   baseline {b_rps:8.0f} /s   "
        f"ratio {rps_ratio:.2f}x (target >= {THROUGHPUT_TARGET}x) "
        f"{'ok' if rps_ratio >= THROUGHPUT_TARGET else 'MISSED'}"
    )
    print(
        f"   (medians of {ROUNDS} paired rounds; {ROUND_TRIPS} round trips, "
        f"{MEASURE_S:.0f} s of load each; {os.cpu_count()} cpus, shared)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline-server", metavar="SOCKET", required=True)
    serve_baseline(parser.parse_args().baseline_server)
