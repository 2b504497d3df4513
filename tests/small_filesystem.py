"""A small tmpfs of its own, for tests that fill a disk (DESIGN.md invariant 8).

Mounting needs root (or CAP_SYS_ADMIN). Where the mount fails (a container that
forbids it) the test is skipped with the mount's error as the reason; under ``CI``
that skip is a failure (tests/conftest.py), and ``.ci/run`` runs as root. The mount
is always undone, in ``finally``.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_process import IO_TIMEOUT_S, make_temp_dir

__all__ = ["small_filesystem"]


@contextlib.contextmanager
def small_filesystem(size: str) -> Iterator[Path]:
    """A fresh tmpfs of ``size`` (as mount takes it: "16m"), unmounted (and its
    mount point removed) after."""
    mount_point = make_temp_dir()
    try:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mount_point)],
            capture_output=True,
            text=True,
            timeout=IO_TIMEOUT_S,
            check=False,
        )
        failure = (proc.stderr.strip() or f"exit {proc.returncode}") if proc.returncode else None
    except (OSError, subprocess.TimeoutExpired) as exc:
        failure = str(exc)
    if failure is not None:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {failure}")
    try:
        yield mount_point
    finally:
        unmounted = subprocess.run(["umount", str(mount_point)], check=False, timeout=IO_TIMEOUT_S)
        if unmounted.returncode != 0:  # still busy (a straggler): detach it now, free it later
            subprocess.run(["umount", "-l", str(mount_point)], check=True, timeout=IO_TIMEOUT_S)
        mount_point.rmdir()
