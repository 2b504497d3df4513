"""The Unix socket the daemon listens on.

Rule 1: the socket is created 0600 inside a checked 0700 directory, with no window in
which it exists at its path with wider permissions: it is bound under a temporary
name in that directory (which nobody else may enter), chmod-ed, listening, and then
renamed into place. The process umask is never touched: the socket is bound again
while agents are being spawned (``agentsd.socket_keeper``), and they inherit it.

Rule 2: an existing socket file is removed only after confirming that nothing answers
on it; a live daemon there is an error naming the path. A non-socket file is never
removed.

Rule 3: every accepted connection is checked with SO_PEERCRED before a byte is read;
another uid is refused.

Rule 4: an accepted socket is served through ``SocketTransport``, the one place that
writes to a client's file descriptor directly.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import struct
from pathlib import Path

import trio

from agentsd.paths import ensure_private_dir

_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
# Bursts of CLI invocations and editor reconnects after a restart: a full backlog
# makes a client with a timeout fail to connect. The kernel caps it at
# net.core.somaxconn (4096 by default since Linux 5.4).
LISTEN_BACKLOG = 4096


class SocketInUse(Exception):
    pass


def _probe(path: Path) -> bool:
    """True when something accepts connections on ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def bind_socket(path: Path) -> socket.socket:
    """Bind and listen on ``path`` (blocking: run at start-up, and in a worker thread
    when the socket is bound again). Raises ``UnsafeDirectory``, ``SocketInUse`` and
    ``OSError``."""
    ensure_private_dir(path.parent)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketInUse(f"{path} exists and is not a socket; refusing to remove it")
        if _probe(path):
            raise SocketInUse(f"another daemon is answering on {path}")
        path.unlink()
    staging = path.parent / f".b{os.getpid()}"  # no longer than most socket names
    with contextlib.suppress(FileNotFoundError):
        staging.unlink()  # left by a crash of this pid's predecessor
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(staging))
        os.chmod(staging, 0o600)
        sock.listen(LISTEN_BACKLOG)
        os.rename(staging, path)
    except BaseException:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()
        raise
    return sock


class SocketTransport:
    """A connected socket: a reply is written straight to its file descriptor when
    nothing is queued before it, sparing a wake-up of the connection's writer task
    (the common case of one client waiting for one answer)."""

    __slots__ = ("stream",)

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream

    def write_now(self, data: bytes) -> int:
        try:
            # fileno() each time: it is -1 once the socket is closed, never a reused fd.
            return os.write(self.stream.socket.fileno(), data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise trio.BrokenResourceError(exc.strerror) from exc


def peer_credentials(sock: trio.socket.SocketType) -> tuple[int, int]:
    """(pid, uid) of the process that connected, as of its connect()."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, _gid = _UCRED.unpack(raw)
    return int(pid), int(uid)


# Linux 6.5: a pidfd of the peer as of its connect(); Python 3.11 has no constant.
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)


def peer_pidfd(sock: trio.socket.SocketType) -> int | None:
    """A pidfd of the process that connected (the caller closes it), None where the
    kernel has none to give; ProcessLookupError when that process is gone."""
    try:
        return int(sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD))
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            raise ProcessLookupError(errno.ESRCH, "the peer has exited") from exc
        return None


# accept() failures that mean "out of resources for now", not "listener broken".
TRANSIENT_ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
