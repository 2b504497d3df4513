"""The connection half of the trio client: one socket to the daemon and its reader
task, around ``agentsd_protocol.client.core`` (which matches replies to requests and
routes notifications to their followers).

See Rules 1 and 2 of ``agentsctl.async_client``.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from agentsctl.daemon import DaemonDisconnected, DaemonNotRunning, DaemonUnreachable
from agentsd_protocol.client.core import (
    ClientCore,
    IncomingRequest,
    Notification,
    PendingCall,
    Routed,
)
from agentsd_protocol.errors import RpcError
from agentsd_protocol.methods import Method

P = TypeVar("P")
R = TypeVar("R")
T = TypeVar("T")

RECEIVE_BYTES = 64 * 1024  # one read; the daemon's large frames arrive over several
RECONNECT_DEADLINE_S = 30.0  # a daemon restart takes about a second; a systemd restart a few
BACKOFF_FIRST_S = 0.05  # first pause between reconnection attempts, doubled each time
BACKOFF_MAX_S = 1.0  # ... up to this
SEND_TIMEOUT_S = 30.0  # the daemon reads every connection continuously; this long means hung


class Route(abc.ABC):
    """What a connection needs from a subscription or a watch. Both methods run in the
    reader task and must not block."""

    @abc.abstractmethod
    def deliver(self, notification: Notification) -> None:
        """A notification for this route."""

    @abc.abstractmethod
    def connection_lost(self) -> None:
        """The connection failed; the route is gone with it."""


class Connection:
    """One socket to the daemon: its core (pending calls and routes) and the events
    its callers wait on.

    ``fail`` is synchronous and idempotent: it fails every pending call with
    ``DaemonDisconnected`` and wakes its caller, tells every route, and closes the
    socket (which ends the reader task).
    """

    def __init__(self, stream: trio.SocketStream, socket_path: str) -> None:
        self.stream = stream
        self.socket_path = socket_path
        self.core: ClientCore[Route] = ClientCore()
        self.waiting: dict[int, trio.Event] = {}
        self.send_lock = trio.Lock()
        self.failure: str | None = None

    @property
    def alive(self) -> bool:
        return self.failure is None

    def fail(self, reason: str) -> None:
        if self.failure is not None:
            return
        self.failure = reason
        routes = self.core.fail(DaemonDisconnected(reason, self.socket_path))
        for done in self.waiting.values():
            done.set()
        self.waiting.clear()
        for route in routes:
            route.connection_lost()
        self.stream.socket.close()  # trio wakes a reader blocked on it


async def open_stream(socket_path: str) -> trio.SocketStream:
    try:
        return await trio.open_unix_socket(socket_path)
    except (FileNotFoundError, ConnectionRefusedError):
        raise DaemonNotRunning(f"agentsd is not running at {socket_path}", socket_path) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise DaemonUnreachable(
            f"cannot reach agentsd at {socket_path}: {reason}", socket_path
        ) from None


class Connector:
    """The connection half of ``AsyncClient`` (Rules 1 and 2): the current connection,
    and calls on it. ``AsyncClient``'s docstring says what a call raises.
    """

    def __init__(
        self, nursery: trio.Nursery, socket_path: str, *, reconnect_deadline_s: float
    ) -> None:
        self.socket_path = socket_path
        self.reconnect_deadline_s = reconnect_deadline_s
        self._nursery = nursery
        self._conn: Connection | None = None
        self._connect_lock = trio.Lock()
        self._closed = False

    # -- connection and requests (Rules 1 and 2) ----------------------------------

    async def connection(self) -> Connection:
        conn = self._conn
        if conn is not None and conn.alive:
            return conn
        async with self._connect_lock:
            if self._closed:
                raise DaemonDisconnected("the client is closed", self.socket_path)
            conn = self._conn
            if conn is not None and conn.alive:
                return conn
            conn = Connection(await open_stream(self.socket_path), self.socket_path)
            self._conn = conn
            self._nursery.start_soon(self._read, conn)
            return conn

    def abort(self, reason: str) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.fail(reason)

    async def _read(self, conn: Connection) -> None:
        """The reader task of one connection: hand every message to the core, wake the
        callers whose replies came, deliver the routed notifications."""
        reason = f"agentsd at {self.socket_path} closed the connection"
        try:
            while conn.alive:
                data = await conn.stream.receive_some(RECEIVE_BYTES)
                if not data:
                    break
                for event in conn.core.receive_data(data):
                    if isinstance(event, PendingCall):
                        done = conn.waiting.pop(event.id, None)
                        if done is not None:
                            done.set()
                    elif isinstance(event, Routed):
                        event.route.deliver(event.notification)
                    elif isinstance(event, IncomingRequest):
                        # The daemon sends no requests today; answer one as any peer must.
                        await self._send(conn, conn.core.refuse(event))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            reason = f"the connection to agentsd at {self.socket_path} broke: {exc}"
        except RpcError as exc:  # the daemon sent bytes that are not JSON-RPC
            reason = f"agentsd at {self.socket_path} sent garbage: {exc.message}"
        except DaemonUnreachable as exc:  # answering a request of the daemon's failed
            reason = exc.message
        conn.fail(reason)

    async def _send(self, conn: Connection, frame: bytes) -> None:
        if not conn.alive:
            raise DaemonDisconnected(str(conn.failure), self.socket_path)
        async with conn.send_lock:
            # Shielded: a frame cut in half by a cancelled caller would garble every
            # frame after it. Bounded: a daemon that reads nothing for that long is hung.
            deadline = trio.current_time() + SEND_TIMEOUT_S
            with trio.CancelScope(deadline=deadline, shield=True) as scope:
                try:
                    await conn.stream.send_all(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    conn.fail(f"the connection to agentsd at {self.socket_path} broke: {exc}")
            if scope.cancelled_caught:
                conn.fail(f"agentsd at {self.socket_path} read nothing for {SEND_TIMEOUT_S} s")
            if not conn.alive:
                raise DaemonDisconnected(str(conn.failure), self.socket_path)

    async def request(
        self, method: Method[P, R], params: P | None = None, *, route: Route | None = None
    ) -> tuple[Connection, R]:
        """``call``, also saying on which connection it was answered; with ``route``,
        the notifications its result names go there (a streaming method)."""
        conn = await self.connection()
        call, frame = conn.core.request(method, params, route=route)
        done = conn.waiting[call.id] = trio.Event()
        try:
            await self._send(conn, frame)
            await done.wait()
        finally:
            if not call.done:  # cancelled: a late reply is dropped
                conn.core.forget(call)
                conn.waiting.pop(call.id, None)
        return conn, call.result()

    async def call(self, method: Method[P, R], params: P | None = None) -> R:
        """Send one request and wait for its reply, typed by ``method``; params None are
        left out. Raises as the class docstring says."""
        _, result = await self.request(method, params)
        return result

    async def retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run ``attempt`` until it succeeds, backing off while the daemon is unreachable
        or answers a retryable error, for at most ``reconnect_deadline_s``.

        Only for idempotent work (reads, or mutations with a fixed
        ``client_operation_id``). A non-retryable ``RpcError`` is raised at once; at the
        deadline the last failure is raised.
        """
        deadline = trio.current_time() + self.reconnect_deadline_s
        pause = BACKOFF_FIRST_S
        while True:
            try:
                return await attempt()
            except DaemonUnreachable:
                if self._closed or trio.current_time() + pause > deadline:
                    raise
            except RpcError as exc:
                if not exc.retryable or trio.current_time() + pause > deadline:
                    raise
            await trio.sleep(pause)
            pause = min(pause * 2, BACKOFF_MAX_S)

    @property
    def closed(self) -> bool:
        """``open_client``'s context has been left: nothing reconnects any more."""
        return self._closed

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` in the client's nursery (work that must outlive its caller)."""
        self._nursery.start_soon(fn)
