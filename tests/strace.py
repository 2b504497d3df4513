"""strace as a test's fault injector: syscalls of a running process made to wait in
the kernel (``-e inject=SYSCALLS:delay_enter=``), so what the code under test does
meanwhile is what it would do on a slow disk or with a fork stopped at its exec.

Where strace is missing or may not attach (no ptrace), a test using it is skipped
with the reason; CI installs strace (.ci/run)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

ATTACH_TIMEOUT_S = 30.0  # a hang guard: strace attaches in milliseconds
DETACH_TIMEOUT_S = 30.0


def _traced_by(pid: int, tracer: int) -> bool:
    """Whether every thread of ``pid`` is traced by ``tracer``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        if int(fields["TracerPid"].strip()) != tracer:
            return False
    return True


@contextlib.contextmanager
def delayed(pid: int, syscalls: str, delay_s: int, why: str) -> Iterator[subprocess.Popen[str]]:
    """Each of ``syscalls`` (comma-separated) made by process ``pid`` (all its
    threads, and the processes it forks from now on) waits ``delay_s`` in the kernel
    before it runs; yields the tracer, which `release` ends (the syscalls then run at
    once). ``why``: what the test needs strace for, said when it is skipped."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip(f"strace is not installed: {why}")
    tracer = subprocess.Popen(
        [
            strace,
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "-e",
            f"trace={syscalls}",
            "-e",
            f"inject={syscalls}:delay_enter={delay_s}s",
            "-p",
            str(pid),
        ],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        while not _traced_by(pid, tracer.pid):
            if tracer.poll() is not None:
                reason = tracer.stderr.read() if tracer.stderr else ""
                pytest.skip(f"strace could not attach to pid {pid}: {reason.strip()}")
            assert time.monotonic() < deadline, f"strace runs but did not attach to pid {pid}"
            time.sleep(0.01)
        yield tracer
    finally:
        release(tracer)
        if tracer.stderr is not None:
            tracer.stderr.close()


def release(tracer: subprocess.Popen[str]) -> None:
    """End the tracer: it detaches, and a delayed syscall runs at once."""
    if tracer.poll() is None:
        tracer.terminate()
    tracer.wait(timeout=DETACH_TIMEOUT_S)
