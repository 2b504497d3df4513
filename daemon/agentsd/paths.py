"""Creating and checking the daemon's private directories, and the state-dir lock.

Rule 1: every directory the daemon keeps secrets or its socket in is a real directory
(never a symlink), owned by us, with no group or world access; otherwise the daemon
refuses to start with a message that says what is wrong and how to fix it.

Rule 2: one daemon per state directory. The lock is held for the daemon's whole life
(the kernel drops it when the process dies, so a SIGKILLed daemon leaves no stale
lock); a second daemon names the first in its error.

Rule 3: the lock file names its holder, one value a line: pid, socket path, and the
process's start time (clock ticks after boot, /proc/PID/stat field 22). A client
that cannot reach the socket finds the daemon by it (``agentsctl.daemon``): the pid
alone could be reused, the pid with its start time cannot.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from agentsd.procfs import read_start_time

LOCK_NAME = "agentsd.lock"


class UnsafeDirectory(Exception):
    pass


class AlreadyRunning(Exception):
    pass


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (0700) if missing, then verify it is safe to use."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        pass  # a dangling symlink or a file: reported below
    except OSError as exc:
        raise UnsafeDirectory(f"cannot create directory {path}: {exc.strerror}") from None
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise UnsafeDirectory(f"cannot inspect {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(f"{path} is a symlink; refusing to use it (remove it and retry)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{path} exists and is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeDirectory(
            f"{path} belongs to uid {st.st_uid}, not to us (uid {os.geteuid()}); refusing to use it"
        )
    if st.st_mode & 0o077:
        raise UnsafeDirectory(
            f"{path} is accessible to group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"run `chmod 700 {path}` and retry"
        )
    return path


class StateLock:
    """An exclusive ``flock`` on ``<state_dir>/agentsd.lock`` for the daemon's life."""

    def __init__(self, state_dir: Path, socket_path: Path) -> None:
        self.path = state_dir / LOCK_NAME
        self._socket_path = socket_path
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").split()
            os.close(fd)
            who = f"pid {holder[0]}, socket {holder[1]}" if len(holder) >= 2 else "unknown pid"
            raise AlreadyRunning(
                f"another agentsd is already running on state directory {self.path.parent} ({who})"
            ) from None
        os.ftruncate(fd, 0)
        pid = os.getpid()
        started = read_start_time(pid)
        os.pwrite(fd, f"{pid}\n{self._socket_path}\n{started or ''}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
