"""Keeping the daemon's socket at its path for the daemon's whole life.

A daemon left running for months meets a socket file deleted by a clean-up script,
or its whole ``$XDG_RUNTIME_DIR`` removed and created again when the user logs out
without lingering. Its agents keep running; without this, nobody could reach them.

Rule 1: the path is ours while the ``(st_dev, st_ino)`` of the socket file and of its
directory are those seen right after binding. They are compared every
``SOCKET_CHECK_S`` (two ``lstat`` calls: microseconds).

Rule 2: once the path is not ours, the old listener is closed and the socket is bound
again by ``agentsd.listener.bind_socket``, with the same checks as at start-up (a 0700
directory of ours, a 0600 socket, never over a non-socket or a live daemon), in a
worker thread. The directory above ours (``$XDG_RUNTIME_DIR``) is never created here:
it belongs to the login manager, and the daemon waits for it to come back. Until the
bind succeeds it is retried every interval, each new reason logged once.

Rule 3: connections already accepted are not this module's: they live in the
caller's nursery and go on being served whatever happens to the path.

Rule 4: when the daemon ends, the path is unlinked only if it is still ours.

Rule 5 (a restart in place, ``agentsd.reexec``): when the daemon ends to execute
itself again, a listener whose path is still ours is neither closed nor unlinked but
handed to the next image (`SocketHandover`), which serves it as it is: a client that
connects meanwhile waits in its backlog, as under socket activation. The next image
takes it only if the path is still the same file in the same directory; otherwise
it closes it and binds as at any start.

A socket-activated listener belongs to the socket unit; this module never sees it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import NoReturn

import attrs
import trio

from agentsd.listener import SocketInUse, bind_socket
from agentsd.paths import UnsafeDirectory

log = logging.getLogger(__name__)

SOCKET_CHECK_S = 1.0  # how long a lost socket may go unnoticed (Rule 1)

ServeListener = Callable[[trio.socket.SocketType], Awaitable[None]]
KEPT_SOCKET_ENV = "AGENTSD_KEPT_SOCKET"  # fd:dev:ino:dirdev:dirino, for the next image


@attrs.frozen
class SocketIdentity:
    """Which inodes the socket file and its directory are (Rule 1)."""

    socket: tuple[int, int]
    directory: tuple[int, int]

    @classmethod
    def at(cls, path: Path) -> SocketIdentity | str:
        """The identity found at ``path`` now, or why there is none."""
        try:
            directory = os.lstat(path.parent)
        except OSError:
            return f"its directory {path.parent} was removed"
        try:
            sock = os.lstat(path)
        except OSError:
            return "it was removed"
        return cls((sock.st_dev, sock.st_ino), (directory.st_dev, directory.st_ino))

    def lost(self, path: Path) -> str | None:
        """Why ``path`` is no longer this socket, or None while it is."""
        now = SocketIdentity.at(path)
        if isinstance(now, str):
            return now
        if now.directory != self.directory:
            return f"its directory {path.parent} was created again"
        if now.socket != self.socket:
            return "another file took its place"
        return None


@attrs.define(eq=False)
class SocketHandover:
    """The listener handed from one image of the daemon to the next (Rule 5).

    ``wanted`` says, when the keeper ends, whether a next image will take it. The
    keeper then leaves it in ``sock`` with its ``identity`` (if the path was still
    ours); `env` describes it for the next image, which `adopt`s it."""

    wanted: Callable[[], bool] = lambda: False
    sock: socket.socket | None = None
    identity: SocketIdentity | None = None

    def env(self) -> dict[str, str]:
        """The variable that tells the next image (none when nothing is handed)."""
        if self.sock is None or self.identity is None:
            return {}
        (dev, ino), (dir_dev, dir_ino) = self.identity.socket, self.identity.directory
        return {KEPT_SOCKET_ENV: f"{self.sock.fileno()}:{dev}:{ino}:{dir_dev}:{dir_ino}"}

    @classmethod
    def adopt(cls, path: Path, environ: MutableMapping[str, str] = os.environ) -> SocketHandover:
        """What the previous image handed over, read (and removed: agents never
        see it) from ``environ``; an empty handover when nothing valid was. A
        descriptor that is not a listening socket still bound at ``path`` is closed."""
        value = environ.pop(KEPT_SOCKET_ENV, None)
        if value is None:
            return cls()
        try:
            fd, dev, ino, dir_dev, dir_ino = (int(part) for part in value.split(":"))
        except ValueError:
            log.warning("ignoring %s=%r: not fd:dev:ino:dirdev:dirino", KEPT_SOCKET_ENV, value)
            return cls()
        try:
            sock = socket.socket(fileno=fd)
        except OSError as exc:
            log.warning("the socket handed over (fd %d) cannot be used: %s", fd, exc)
            return cls()
        identity = SocketIdentity((dev, ino), (dir_dev, dir_ino))
        listening = sock.family == socket.AF_UNIX and sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_ACCEPTCONN
        )
        if not listening or identity.lost(path) is not None:
            log.warning("the socket handed over is no longer %s's; binding it again", path)
            sock.close()
            return cls()
        sock.set_inheritable(False)
        return cls(sock=sock, identity=identity)


async def serve_kept_socket(
    path: Path,
    serve_listener: ServeListener,
    *,
    handover: SocketHandover | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Bind ``path`` (or serve the listener ``handover`` brought from the previous
    image), run ``serve_listener`` on it, and bind it again whenever it is lost
    (Rules 1 and 2). ``task_status.started()`` once it first listens; the first
    bind's ``SocketInUse``, ``UnsafeDirectory`` or ``OSError`` propagate (the daemon
    refuses to start). Never returns; on cancellation the listener is closed and the
    path unlinked if still ours (Rule 4), unless ``handover`` wants it for the next
    image: then it is left there, open (Rule 5)."""
    handover = handover if handover is not None else SocketHandover()
    sock: socket.socket
    identity: SocketIdentity | None
    if handover.sock is not None:
        sock, identity = handover.sock, handover.identity
        handover.sock = handover.identity = None
    else:
        sock = bind_socket(path)
        identity = _identity_after_bind(path)
    try:
        task_status.started()
        while True:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve_listener, trio.socket.from_stdlib_socket(sock))
                reason = await _until_lost(path, identity)
                nursery.cancel_scope.cancel()
            sock.close()
            log.warning("socket %s is no longer ours: %s; binding it again", path, reason)
            sock = await _bind_again(path)
            identity = _identity_after_bind(path)
            log.info("socket %s bound again", path)
    finally:
        if handover.wanted() and identity is not None and identity.lost(path) is None:
            handover.sock, handover.identity = sock, identity  # Rule 5
        else:
            sock.close()
            _unlink_if_ours(path, identity)


def _unlink_if_ours(path: Path, identity: SocketIdentity | None) -> None:
    """Rule 4: a path that is no longer ours is someone else's to remove."""
    if identity is not None and identity.lost(path) is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _identity_after_bind(path: Path) -> SocketIdentity | None:
    found = SocketIdentity.at(path)
    # Removed in the instant since the bind: None never matches, so the next check
    # binds again.
    return found if isinstance(found, SocketIdentity) else None


async def _until_lost(path: Path, identity: SocketIdentity | None) -> str:
    while True:
        reason = "it was removed" if identity is None else identity.lost(path)
        if reason is not None:
            return reason
        await trio.sleep(SOCKET_CHECK_S)


async def _bind_again(path: Path) -> socket.socket:
    """Retry every ``SOCKET_CHECK_S`` until the socket is bound again (Rule 2)."""
    last_reason = ""
    while True:
        outcome = await trio.to_thread.run_sync(_try_bind, path)
        if isinstance(outcome, socket.socket):
            return outcome
        if outcome != last_reason:
            log.warning("socket %s not bound yet: %s", path, outcome)
            last_reason = outcome
        await trio.sleep(SOCKET_CHECK_S)


def _try_bind(path: Path) -> socket.socket | str:
    """The bound socket, or why it cannot be bound now."""
    if not os.path.isdir(path.parent.parent):
        return f"waiting for {path.parent.parent} to exist again"
    try:
        return bind_socket(path)
    except (SocketInUse, UnsafeDirectory) as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot bind {path}: {exc.strerror or exc}"
