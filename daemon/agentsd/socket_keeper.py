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

A socket-activated listener belongs to the socket unit; this module never sees it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn

import attrs
import trio

from agentsd.listener import SocketInUse, bind_socket
from agentsd.paths import UnsafeDirectory

log = logging.getLogger(__name__)

SOCKET_CHECK_S = 1.0  # how long a lost socket may go unnoticed (Rule 1)

ServeListener = Callable[[trio.socket.SocketType], Awaitable[None]]


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


async def serve_kept_socket(
    path: Path,
    serve_listener: ServeListener,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Bind ``path``, run ``serve_listener`` on it, and bind it again whenever it is
    lost (Rules 1 and 2). ``task_status.started()`` once it first listens; the first
    bind's ``SocketInUse``, ``UnsafeDirectory`` or ``OSError`` propagate (the daemon
    refuses to start). Never returns; on cancellation the listener is closed and the
    path unlinked if still ours (Rule 4)."""
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
