"""One client connection's requests, replies and notifications, without the socket.

h11's discipline: ``ClientCore`` never touches a socket. The stdlib client, the trio
client and the ACP bridge's peer feed it the bytes they read (``receive_data``) and
write the bytes it returns (``request``, ``refuse``); their I/O glue is a few dozen
lines each.

Rule 1: every request gets a fresh positive integer id; a reply is matched to its
request by id alone. Replies may come in any order; one to a request that was
forgotten (its caller gave up) or never made is dropped.

Rule 2: a reply settles its ``PendingCall`` as its frame is read: the result decoded
as the method's result type, or the error rebuilt as the exception the daemon raised
(``errors.error_from_wire``). A result that does not fit its type is a ``ParseError``
for that call alone.

Rule 3: a call of a streaming method (``Method.stream_key``) may name a route. Its
successful reply routes every later notification that carries its key
(``subscriptionId``, ``watchId`` or ``feedId``) to that route, before the next message is read,
so none can be missed. Every other notification comes out unrouted, in order.

Rule 4: bytes that are not JSON-RPC raise ``ParseError`` (or ``FrameTooLarge``), and an
error reply with a null id (the peer could not read a request, so nothing can be
matched any more) raises that error. After either the connection is broken: the glue
closes it and calls ``fail``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
from msgspec import UNSET

from agentsd_protocol.errors import (
    ErrorObject,
    MethodNotFound,
    ParseError,
    error_from_wire,
)
from agentsd_protocol.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, Framing, encode_frame
from agentsd_protocol.jsonrpc import (
    ClientIncoming,
    RequestId,
    decode_client_frame,
    encode_error,
    encode_request,
)
from agentsd_protocol.methods import Method

P = TypeVar("P")
R = TypeVar("R")
T = TypeVar("T")
RouteT = TypeVar("RouteT")

_NULL = msgspec.Raw(b"null")


class Notification(msgspec.Struct, frozen=True):
    """A notification, params still encoded."""

    method: str
    params: msgspec.Raw = _NULL

    def decode(self, params_type: type[T]) -> T:
        """The params as ``params_type`` (``msgspec.ValidationError`` if they do not fit)."""
        return msgspec.json.decode(self.params, type=params_type)


@dataclass(frozen=True, slots=True)
class Routed(Generic[RouteT]):
    """A notification for a route (Rule 3)."""

    route: RouteT
    notification: Notification


@dataclass(frozen=True, slots=True)
class IncomingRequest:
    """A request from the other end; answer it (``ClientCore.refuse``, or otherwise)."""

    id: RequestId | None
    method: str
    params: msgspec.Raw


class PendingCall(Generic[R]):
    """One request sent; ``done`` once its reply (or the connection's end) settled it."""

    __slots__ = ("_error", "_result", "done", "id", "method")

    _result: R

    def __init__(self, request_id: int, method: Method[Any, R]) -> None:
        self.id = request_id
        self.method = method
        self.done = False
        self._error: BaseException | None = None

    def result(self) -> R:
        """The result; raises the error that settled the call (Rule 2), or
        ``RuntimeError`` if it is not settled yet."""
        if not self.done:
            raise RuntimeError(f"{self.method.name} (request {self.id}) has no reply yet")
        if self._error is not None:
            raise self._error
        return self._result

    def _succeed(self, result: R) -> None:
        self._result, self.done = result, True

    def _fail(self, error: BaseException) -> None:
        self._error, self.done = error, True


Event = PendingCall[Any] | Notification | Routed[RouteT] | IncomingRequest


class _RouteProbe(msgspec.Struct, rename="camel"):
    """Which route a notification belongs to (Rule 3)."""

    subscription_id: str | None = None
    watch_id: str | None = None
    feed_id: str | None = None


_probe_decoder = msgspec.json.Decoder(_RouteProbe)


class ClientCore(Generic[RouteT]):
    """The state of one connection (Rules 1-4). Not thread-safe; one per connection.

    ``rebuild_error`` turns an error reply into the exception its call raises: the
    daemon's classes by default; a peer speaking another protocol brings its own.
    """

    def __init__(
        self,
        *,
        framing: Framing = Framing.NDJSON,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        rebuild_error: Callable[[ErrorObject], Exception] = error_from_wire,
    ) -> None:
        self._framing = framing
        self._decoder = FrameDecoder(max_frame_bytes=max_frame_bytes, framing=framing)
        self._rebuild_error = rebuild_error
        self._ids = itertools.count(1)
        self._pending: dict[RequestId, PendingCall[Any]] = {}
        self._route_on_reply: dict[int, RouteT] = {}
        self._routes: dict[str, RouteT] = {}

    @property
    def pending(self) -> int:
        """How many requests await their reply."""
        return len(self._pending)

    # -- sending -------------------------------------------------------------------

    def request(
        self, method: Method[P, R], params: P | None = None, *, route: RouteT | None = None
    ) -> tuple[PendingCall[R], bytes]:
        """A new pending call and the framed bytes to send for it. Params None are left
        out (the method's defaults). ``route``: see Rule 3."""
        if route is not None and method.stream_key is None:
            raise ValueError(f"{method.name} is not a streaming method: it has no route")
        call = PendingCall(next(self._ids), method)
        self._pending[call.id] = call
        if route is not None:
            self._route_on_reply[call.id] = route
        body = encode_request(method.name, params, call.id)
        return call, encode_frame(self._framing, body)

    def forget(self, call: PendingCall[Any]) -> None:
        """Its caller gave up: a late reply is dropped (Rule 1)."""
        self._pending.pop(call.id, None)
        self._route_on_reply.pop(call.id, None)

    def refuse(self, request: IncomingRequest) -> bytes:
        """The framed ``MethodNotFound`` answer to a request this end does not serve."""
        refusal = MethodNotFound(f"Method not found: {request.method}")
        return encode_frame(self._framing, encode_error(request.id, refusal))

    # -- routes --------------------------------------------------------------------

    def drop_route(self, key: str, route: RouteT) -> None:
        """Stop routing ``key`` to ``route`` (if it still goes there)."""
        if self._routes.get(key) is route:
            del self._routes[key]

    # -- receiving -----------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[Event[RouteT]]:
        """Everything the bytes complete, in order. Raises as Rule 4 says."""
        events: list[Event[RouteT]] = []
        for frame in self._decoder.feed_frames(data):
            events.extend(self.receive_frame(frame))
        return events

    def receive_frame(self, frame: bytes) -> list[Event[RouteT]]:
        """One frame (a message or a batch): its events, in order (Rule 4)."""
        events: list[Event[RouteT]] = []
        for message in decode_client_frame(frame):
            event = self._receive(message)
            if event is not None:
                events.append(event)
        return events

    def _receive(self, message: ClientIncoming) -> Event[RouteT] | None:
        if message.method is not UNSET:
            params = message.params if message.params is not UNSET else _NULL
            if message.id is not UNSET:
                return IncomingRequest(message.id, message.method, params)
            notification = Notification(message.method, params)
            route = self._route(params)
            return notification if route is None else Routed(route, notification)
        if message.id is UNSET:
            raise ParseError("Parse error: a message with neither method nor id")
        if message.id is None:
            if message.error is not UNSET:
                raise self._rebuild_error(message.error)
            raise ParseError("Parse error: a reply with a null id")
        call = self._pending.pop(message.id, None)
        if call is None:
            return None  # its caller gave up, or it was never ours (Rule 1)
        route = self._route_on_reply.pop(call.id, None)
        self._settle(call, message, route)
        return call

    def _settle(self, call: PendingCall[Any], reply: ClientIncoming, route: RouteT | None) -> None:
        if reply.error is not UNSET:
            call._fail(self._rebuild_error(reply.error))
            return
        if reply.result is UNSET:
            call._fail(ParseError("Parse error: a reply with neither result nor error"))
            return
        try:
            result = call.method.decode_result(reply.result)
        except msgspec.DecodeError as exc:
            name = call.method.name
            call._fail(
                ParseError(f"Parse error in the result of {name} (request {call.id}): {exc}")
            )
            return
        call._succeed(result)
        key = call.method.stream_key
        if route is not None and key is not None:
            self._routes[key(result)] = route

    def _route(self, params: msgspec.Raw) -> RouteT | None:
        if not self._routes:
            return None  # no probe: most connections follow nothing
        try:
            probe = _probe_decoder.decode(params)
        except msgspec.DecodeError:
            return None  # a notification this client does not know
        key = probe.subscription_id or probe.watch_id or probe.feed_id
        return None if key is None else self._routes.get(key)

    # -- the end -------------------------------------------------------------------

    def fail(self, error: Exception) -> list[RouteT]:
        """The connection is gone: every pending call fails with ``error``. Returns the
        routes it fed, which are dropped."""
        for call in self._pending.values():
            call._fail(error)
        self._pending.clear()
        self._route_on_reply.clear()
        routes = list(self._routes.values())
        self._routes.clear()
        return routes
