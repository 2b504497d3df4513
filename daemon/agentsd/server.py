"""The daemon's life: lock, store, recovery, listen, serve, then close everything.

Rule 1: nothing is served before recovery finished (DESIGN.md invariant 5): the
socket is bound only after the previous daemon's children were dealt with.

Rule 2: shutdown is cancellation. SIGTERM, SIGINT and ``daemon.shutdown`` cancel the
serving scope; connections end, then every session closes concurrently, then the
socket file is removed and the lock released.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from agentsd.app import App
from agentsd.config import Config
from agentsd.connection import Connection
from agentsd.listener import TRANSIENT_ACCEPT_ERRNOS, bind_socket, peer_uid
from agentsd.paths import StateLock, ensure_private_dir

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 4096  # each costs a few KiB; far beyond any real set of clients
ACCEPT_RETRY_S = 0.1  # back off when out of file descriptors, as trio's serve_listeners does


async def serve_daemon(
    config: Config,
    *,
    socket_path: Path,
    state_dir: Path,
    task_status: trio.TaskStatus[App] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until shutdown is requested. ``task_status.started(app)`` is
    called once the socket accepts connections."""
    ensure_private_dir(state_dir)
    lock = StateLock(state_dir, socket_path)
    lock.acquire()
    try:
        app = App(config, socket_path=socket_path, state_dir=state_dir)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            listen_sock = bind_socket(socket_path)
            try:
                listener = trio.socket.from_stdlib_socket(listen_sock)
                with app.serving_scope:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_watch_signals, signals, app)
                        nursery.start_soon(_serve_connections, listener, app, nursery)
                        log.info("agentsd %s serving on %s", app.version, socket_path)
                        task_status.started(app)
            finally:
                listen_sock.close()
                _unlink_socket(socket_path)
        log.info("agentsd stopped")
    finally:
        lock.release()


def _unlink_socket(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def _watch_signals(signals: AsyncIterator[int], app: App) -> None:
    async for signum in signals:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        app.request_shutdown()
        return


async def _serve_connections(
    listener: trio.socket.SocketType, app: App, nursery: trio.Nursery
) -> None:
    my_uid = os.geteuid()
    while True:
        try:
            sock, _addr = await listener.accept()
        except OSError as exc:
            if exc.errno in TRANSIENT_ACCEPT_ERRNOS:
                log.warning("accept failed (%s); retrying", os.strerror(exc.errno or 0))
                await trio.sleep(ACCEPT_RETRY_S)
                continue
            raise
        uid = peer_uid(sock)
        if uid != my_uid:
            log.warning("refused a connection from uid %d", uid)
            sock.close()
            continue
        if len(app.connections) >= MAX_CONNECTIONS:
            log.warning("refused a connection: %d connections already open", MAX_CONNECTIONS)
            sock.close()
            continue
        nursery.start_soon(_run_connection, app, trio.SocketStream(sock))


async def _run_connection(app: App, stream: trio.SocketStream) -> None:
    connection = Connection(app, stream)
    app.connections.add(connection)
    try:
        await connection.serve()
    finally:
        app.connections.discard(connection)
