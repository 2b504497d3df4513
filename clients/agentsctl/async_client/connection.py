"""The connection half of the trio client: one socket to the daemon, its reader task,
requests matched to replies by id, and notifications routed to their followers.

See Rules 1 and 2 of ``agentsctl.async_client``.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import msgspec
import trio
from msgspec import UNSET

from agentsctl.daemon import DaemonDisconnected, DaemonNotRunning, DaemonUnreachable
from agentsd_protocol.errors import MethodNotFound, ParseError, RpcError, error_from_wire
from agentsd_protocol.framing import FrameDecoder, Framing, encode_frame
from agentsd_protocol.jsonrpc import (
    ClientIncoming,
    decode_client_frame,
    encode_error,
    encode_request,
)

T = TypeVar("T")

RECEIVE_BYTES = 64 * 1024  # one read; the daemon's large frames arrive over several
RECONNECT_DEADLINE_S = 30.0  # a daemon restart takes about a second; a systemd restart a few
BACKOFF_FIRST_S = 0.05  # first pause between reconnection attempts, doubled each time
BACKOFF_MAX_S = 1.0  # ... up to this
SEND_TIMEOUT_S = 30.0  # the daemon reads every connection continuously; this long means hung


class _RouteProbe(msgspec.Struct, rename="camel"):
    """Which subscription or watch a notification belongs to."""

    subscription_id: str | None = None
    watch_id: str | None = None


_probe_decoder = msgspec.json.Decoder(_RouteProbe)


OnReply = Callable[["Connection", ClientIncoming], None]


class Waiter:
    """One request in flight. ``on_reply`` runs in the reader, before it reads the next
    frame, so a subscription is routed before its first notification can arrive."""

    def __init__(self, on_reply: OnReply | None) -> None:
        self.on_reply = on_reply
        self.done = trio.Event()
        self.reply: ClientIncoming | None = None
        self.failure: DaemonDisconnected | None = None


class Route(abc.ABC):
    """What a connection needs from a subscription or a watch. Both methods run in the
    reader task and must not block."""

    @abc.abstractmethod
    def deliver(self, method: str, params: msgspec.Raw) -> None:
        """A notification for this route."""

    @abc.abstractmethod
    def connection_lost(self) -> None:
        """The connection failed; the route is gone with it."""


class Connection:
    """One socket to the daemon, its pending requests and its routes.

    ``fail`` is synchronous and idempotent: it wakes every waiter with
    ``DaemonDisconnected``, tells every route, and closes the socket (which ends the
    reader task).
    """

    def __init__(self, stream: trio.SocketStream, socket_path: str) -> None:
        self.stream = stream
        self.socket_path = socket_path
        self.decoder = FrameDecoder(framing=Framing.NDJSON)
        self.pending: dict[int, Waiter] = {}
        self.routes: dict[str, Route] = {}
        self.send_lock = trio.Lock()
        self.failure: str | None = None

    @property
    def alive(self) -> bool:
        return self.failure is None

    def fail(self, reason: str) -> None:
        if self.failure is not None:
            return
        self.failure = reason
        for waiter in self.pending.values():
            waiter.failure = DaemonDisconnected(reason, self.socket_path)
            waiter.done.set()
        self.pending.clear()
        routes, self.routes = list(self.routes.values()), {}
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
    requests matched to replies, and the routes of followers. ``AsyncClient``'s
    docstring says what a call raises.
    """

    def __init__(
        self, nursery: trio.Nursery, socket_path: str, *, reconnect_deadline_s: float
    ) -> None:
        self.socket_path = socket_path
        self.reconnect_deadline_s = reconnect_deadline_s
        self._nursery = nursery
        self._conn: Connection | None = None
        self._connect_lock = trio.Lock()
        self._ids = itertools.count(1)
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
        """The reader task of one connection: dispatch every message until it ends."""
        reason = f"agentsd at {self.socket_path} closed the connection"
        try:
            while conn.alive:
                data = await conn.stream.receive_some(RECEIVE_BYTES)
                if not data:
                    break
                conn.decoder.feed(data)
                for frame in conn.decoder.frames():
                    for message in decode_client_frame(frame):
                        await self._dispatch(conn, message)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            reason = f"the connection to agentsd at {self.socket_path} broke: {exc}"
        except RpcError as exc:  # the daemon sent bytes that are not JSON-RPC
            reason = f"agentsd at {self.socket_path} sent garbage: {exc.message}"
        except DaemonUnreachable as exc:  # answering a request of the daemon's failed
            reason = exc.message
        conn.fail(reason)

    async def _dispatch(self, conn: Connection, message: ClientIncoming) -> None:
        if message.method is not UNSET:
            if message.id is UNSET:
                params = message.params if message.params is not UNSET else msgspec.Raw(b"null")
                self._route(conn, message.method, params)
            else:
                # The daemon sends no requests today; answer one as any peer must.
                refusal = MethodNotFound(f"Method not found: {message.method}")
                await self._send(conn, encode_error(message.id, refusal))
            return
        if not isinstance(message.id, int):
            # id null (or foreign): an error about a frame the daemon could not parse.
            # Nothing can be matched any more; fail the connection so callers retry.
            raise ParseError("Parse error: the daemon could not read a request")
        waiter = conn.pending.pop(message.id, None)
        if waiter is None:
            return  # its caller gave up (Rule 1)
        waiter.reply = message
        if waiter.on_reply is not None and message.error is UNSET:
            waiter.on_reply(conn, message)
        waiter.done.set()

    def _route(self, conn: Connection, method: str, params: msgspec.Raw) -> None:
        try:
            probe = _probe_decoder.decode(params)
        except msgspec.DecodeError:
            return  # a notification this client does not know
        key = probe.subscription_id or probe.watch_id
        route = conn.routes.get(key) if key is not None else None
        if route is not None:
            route.deliver(method, params)

    async def _send(self, conn: Connection, body: bytes) -> None:
        if not conn.alive:
            raise DaemonDisconnected(str(conn.failure), self.socket_path)
        async with conn.send_lock:
            # Shielded: a frame cut in half by a cancelled caller would garble every
            # frame after it. Bounded: a daemon that reads nothing for that long is hung.
            deadline = trio.current_time() + SEND_TIMEOUT_S
            with trio.CancelScope(deadline=deadline, shield=True) as scope:
                try:
                    await conn.stream.send_all(encode_frame(Framing.NDJSON, body))
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    conn.fail(f"the connection to agentsd at {self.socket_path} broke: {exc}")
            if scope.cancelled_caught:
                conn.fail(f"agentsd at {self.socket_path} read nothing for {SEND_TIMEOUT_S} s")
            if not conn.alive:
                raise DaemonDisconnected(str(conn.failure), self.socket_path)

    async def request(
        self,
        method: str,
        params: msgspec.Struct | dict[str, Any] | None,
        *,
        on_reply: OnReply | None = None,
    ) -> tuple[Connection, ClientIncoming]:
        conn = await self.connection()
        request_id = next(self._ids)
        waiter = Waiter(on_reply)
        conn.pending[request_id] = waiter
        try:
            await self._send(conn, encode_request(method, params, request_id))
            await waiter.done.wait()
        finally:
            conn.pending.pop(request_id, None)
        if waiter.failure is not None:
            raise waiter.failure
        assert waiter.reply is not None
        return conn, waiter.reply

    @overload
    async def call(
        self,
        method: str,
        params: msgspec.Struct | dict[str, Any] | None = None,
        *,
        result_type: type[T],
    ) -> T: ...

    @overload
    async def call(
        self,
        method: str,
        params: msgspec.Struct | dict[str, Any] | None = None,
        *,
        result_type: None = None,
    ) -> Any: ...

    async def call(
        self,
        method: str,
        params: msgspec.Struct | dict[str, Any] | None = None,
        *,
        result_type: type[T] | None = None,
    ) -> T | Any:
        """Send one request and wait for its reply, decoded as ``result_type`` (plain
        JSON values without it). Raises as the class docstring says."""
        _, reply = await self.request(method, params)
        return decode_result(reply, result_type)

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


def decode_result(reply: ClientIncoming, result_type: type[T] | None) -> T | Any:
    if reply.error is not UNSET:
        raise error_from_wire(reply.error)
    if reply.result is UNSET:
        raise ParseError("Parse error: a reply with neither result nor error")
    try:
        if result_type is None:
            return msgspec.json.decode(reply.result)
        return msgspec.json.decode(reply.result, type=result_type)
    except msgspec.DecodeError as exc:
        raise ParseError(f"Parse error in a result from the daemon: {exc}") from None
