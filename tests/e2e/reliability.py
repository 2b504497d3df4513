"""The reliability suites in their long form, and the instruments they share.

    python -m tests.e2e.reliability          # long form: prints the README's figures
    python -m tests.e2e.reliability --ci     # the same suites at their CI sizes

The driver runs ``test_fuzz_live``, ``test_hostile_clients`` and ``test_full_disk``
under pytest with ``AGENTSD_RELIABILITY=long`` (more examples, more connections,
longer workloads). Each test writes what it measured to the file named by
``AGENTSD_RELIABILITY_REPORT`` (one JSON object a line); the driver prints those
lines after pytest's own summary. Every figure is a measurement of this run on this
machine, not a target: the tests assert counts (pings answered, connections cut,
mutations refused), never how long something took.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import msgspec

from agentsd_protocol.framing import FrameDecoder
from tests.daemon_process import IO_TIMEOUT_S, POLL_S, WireClient

LONG = os.environ.get("AGENTSD_RELIABILITY") == "long"
REPORT_ENV = "AGENTSD_RELIABILITY_REPORT"
SUITES = ("test_fuzz_live.py", "test_hostile_clients.py", "test_full_disk.py")

PROBE_INTERVAL_S = 0.02  # between the control connection's pings


def sized(ci: int, long: int) -> int:
    """``ci`` normally, ``long`` when the driver runs the long form."""
    return long if LONG else ci


def report(suite: str, text: str) -> None:
    """Record one figure line for the driver (a no-op under plain pytest)."""
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "ab") as out:
            out.write(msgspec.json.encode({"suite": suite, "text": text}) + b"\n")


def vm_rss_kib(pid: int) -> int:
    """The resident set size of ``pid`` (``VmRSS`` in /proc/<pid>/status), in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll ``check`` until true; the seconds it took. AssertionError naming ``what``
    after ``timeout_s``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(POLL_S)
    return time.monotonic() - started


def replies_until_closed(sock: socket.socket) -> list[Any]:
    """Every message the daemon sends on ``sock`` until it closes the connection (the
    framing is detected from the first bytes, as the daemon answers in the client's)."""
    decoder = FrameDecoder(max_frame_bytes=1 << 24)
    out: list[Any] = []
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not data:
            return out
        decoder.feed(data)
        out.extend(msgspec.json.decode(frame) for frame in decoder.frames())


class PingProbe:
    """A control connection pinging the daemon from a thread of its own for as long as
    the block runs: "nothing blocks the daemon" (invariant 8), counted, not timed.

    ``check()`` asserts that no ping went unanswered (a stalled loop leaves one
    waiting until the socket's ``IO_TIMEOUT_S``, a hang guard, fails the probe), that
    pings were answered, and that a ping sent during the check, while the block's
    attack is still in place, is answered too. How long pings took is a figure for
    the report (``summary()``), never an assertion: a loaded machine slows a ping
    without the daemon being blocked. Entering waits for the first answer, so a block
    that ends quickly still proved one ping instead of racing the probe's start.
    ``check()`` wakes the probe from its pause between pings, so the ping it waits for
    is sent at once: a fuzzer checks after each of thousands of examples, and waiting
    out the pause each time was most of its run.
    """

    def __init__(self, socket_path: Path) -> None:
        self._socket_path = socket_path
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by check() and on exit: ping now
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._answered = threading.Condition()
        self.pings = 0  # answered so far
        self.sent = 0  # sent so far (the one in flight included)
        self.max_s = 0.0  # the slowest answer: reported, not asserted
        self.failures: list[str] = []

    def __enter__(self) -> PingProbe:
        self._thread.start()
        self._wait_answered(1)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=IO_TIMEOUT_S * 2)

    def _run(self) -> None:
        try:
            with WireClient(self._socket_path, timeout_s=IO_TIMEOUT_S) as client:
                while not self._stop.is_set():
                    with self._answered:
                        self.sent += 1
                    started = time.monotonic()
                    client.ping()
                    took = time.monotonic() - started
                    with self._answered:
                        self.max_s = max(self.max_s, took)
                        self.pings += 1
                        self._answered.notify_all()
                    self._wake.wait(PROBE_INTERVAL_S)
                    self._wake.clear()
        except (OSError, AssertionError) as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            with self._answered:
                self._answered.notify_all()

    def _wait_answered(self, count: int) -> None:
        """Until ``count`` pings were answered or the probe failed (hang guard:
        the socket timeout of the ping in flight, twice for the one after it)."""
        with self._answered:
            self._answered.wait_for(
                lambda: self.pings >= count or bool(self.failures) or not self._thread.is_alive(),
                timeout=IO_TIMEOUT_S * 2,
            )

    def check(self) -> None:
        """Every ping so far was answered, and so is one sent from now on."""
        with self._answered:
            fresh = self.sent + 1  # the next ping is sent after this point
        self._wake.set()
        self._wait_answered(fresh)
        assert not self.failures, f"the control connection failed: {self.failures}"
        assert self.pings >= fresh, (
            f"the control connection answered {self.pings} pings; one sent during the "
            f"check ({fresh}) never came back"
        )

    def summary(self) -> str:
        return f"{self.pings} control pings, slowest {self.max_s * 1000:.1f} ms"


# ---- the driver ----------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ci", action="store_true", help="run the CI sizes instead")
    args = parser.parse_args(argv)
    here = Path(__file__).parent
    with tempfile.TemporaryDirectory(prefix="agentsd-reliability-") as tmp:
        report_path = Path(tmp) / "figures.jsonl"
        env = {**os.environ, REPORT_ENV: str(report_path)}
        env.pop("AGENTSD_RELIABILITY", None)
        if not args.ci:
            env["AGENTSD_RELIABILITY"] = "long"
        started = time.monotonic()
        code = subprocess.call(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
            + [str(here / suite) for suite in SUITES],
            env=env,
        )
        elapsed = time.monotonic() - started
        lines = report_path.read_bytes().splitlines() if report_path.exists() else []
    form = "CI" if args.ci else "long"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\nreliability ({form} form), {elapsed:.0f} s, pytest exit {code}; "
        f"{os.cpu_count()} CPUs, load average now {load}:"
    )
    suite = None
    for line in lines:
        figure = msgspec.json.decode(line)
        if figure["suite"] != suite:
            suite = figure["suite"]
            print(f"  {suite}:")
        print(f"    {figure['text']}")
    return code


if __name__ == "__main__":
    sys.exit(main())
