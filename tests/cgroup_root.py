"""A private cgroup v2 root for a test, removed afterwards with everything in it.

``AGENTSD_TEST_CGROUP_PARENT`` names the writable cgroup v2 directory test roots are
made in (default ``/sys/fs/cgroup/unified``, this machine's hybrid mount). Setting
``AGENTSD_TEST_CGROUP=1`` runs every test daemon (``tests.daemon_process``) in
cgroup mode: the second CI pass over the e2e session tests.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from agentsd.cgroup import CgroupRoot

PARENT = Path(os.environ.get("AGENTSD_TEST_CGROUP_PARENT", "/sys/fs/cgroup/unified"))
EMPTY_TIMEOUT_S = 10.0  # cgroup.kill empties a cgroup in milliseconds
POLL_S = 0.01


def daemons_in_cgroup_mode() -> bool:
    return os.environ.get("AGENTSD_TEST_CGROUP") == "1"


def unavailable() -> str | None:
    """Why no test cgroup root can be made here, or None."""
    if not (PARENT / "cgroup.controllers").exists():
        return f"{PARENT} is not a cgroup v2 directory"
    if not os.access(PARENT, os.W_OK):
        return f"{PARENT} is not writable"
    return None


@contextlib.contextmanager
def cgroup_root() -> Iterator[Path]:
    """A fresh cgroup directory under `PARENT`; on exit every session cgroup in it is
    killed and removed, then the root itself."""
    path = PARENT / f"agentsd-test-{os.urandom(6).hex()}"
    path.mkdir()
    try:
        yield path
    finally:
        for cgroup in CgroupRoot(path).existing():
            cgroup.kill()
            deadline = time.monotonic() + EMPTY_TIMEOUT_S
            # A synchronous fixture: a short bounded poll, not the daemon's inotify wait.
            while cgroup.populated() and time.monotonic() < deadline:
                time.sleep(POLL_S)
            cgroup.remove()
        path.rmdir()
