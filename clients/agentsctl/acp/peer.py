"""JSON-RPC 2.0 over newline-delimited JSON, in both directions: the I/O glue between
the editor's pipes and the bridge.

Rule 1: every inbound request runs in a task of its own, so a long
``session/prompt`` never holds up ``session/cancel`` or the editor's answers to the
bridge's own requests. Inbound notifications run in tasks too; ``$/cancel_request``
cancels the named request's task, which is then answered ``-32800``. trio starts new
tasks in no particular order, so each handler gets the message's ``arrival`` number:
the order in which the editor sent them.

Rule 2: one lock serialises writes; a message is written whole or not at all. Once
the editor's end is gone, writes are dropped and ``serve`` returns.

Rule 3: a line that is not JSON-RPC is answered ``-32700`` (a JSON array ``-32600``,
as ACP does not use batches) and skipped; the connection goes on.

Ids, replies to the bridge's own requests and the parsing of each line are
``agentsd_protocol.client.core``'s, as in every agentsd client; the editor's errors
stay ACP's (``AcpError``), never agentsd's classes.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import msgspec
import trio

from agentsctl.acp.schema import INTERNAL_ERROR, METHOD_NOT_FOUND, REQUEST_CANCELLED
from agentsd_protocol.client.core import ClientCore, IncomingRequest, Notification, PendingCall
from agentsd_protocol.errors import ErrorObject, FrameTooLarge, RpcError
from agentsd_protocol.framing import FrameDecoder, Framing, encode_frame
from agentsd_protocol.jsonrpc import (
    ErrorResponse,
    RequestId,
    encode_notification,
    encode_success,
)
from agentsd_protocol.methods import Method

log = logging.getLogger(__name__)

RECEIVE_BYTES = 64 * 1024  # one read from the editor's pipe
MAX_LINE_BYTES = 64 * 1024 * 1024  # a prompt may embed whole files; past this the editor is broken
WRITE_TIMEOUT_S = 30.0  # an editor that takes no line for this long is hung or gone
CANCEL_METHOD = "$/cancel_request"

_encoder = msgspec.json.Encoder()
_NO_PARAMS = msgspec.Raw(b"{}")  # what a handler gets for a message without params


class AcpError(Exception):
    """A JSON-RPC error: one to answer a request with, or one the editor answered."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_wire(self) -> ErrorObject:
        data = (
            self.data if isinstance(self.data, dict) or self.data is None else {"detail": self.data}
        )
        return ErrorObject(code=self.code, message=self.message, data=data)

    @classmethod
    def from_wire(cls, error: ErrorObject) -> AcpError:
        """The editor's error as it sent it: ACP codes are not agentsd's."""
        return cls(error.code, error.message, error.data)


@attrs.define(eq=False)
class Answer:
    """A handler's result plus what to run once it has been written (for work the
    editor must see only after the reply, such as requests after ``session/load``)."""

    result: Any
    then: Callable[[], None]


@attrs.frozen
class Received:
    """An inbound request or notification, as its handler gets it (Rule 1)."""

    method: str
    params: msgspec.Raw
    arrival: int  # its place in the order the editor sent messages


RequestHandler = Callable[[Received], Awaitable[Any]]
NotificationHandler = Callable[[Received], Awaitable[None]]


class OutgoingRequest:
    """A request the bridge sent to the editor (its id and reply are the core's)."""

    def __init__(self, peer: Peer, call: PendingCall[msgspec.Raw]) -> None:
        self.id = call.id
        self._peer = peer
        self._call = call
        self._done = trio.Event()
        self.cancel_sent = False

    async def wait(self) -> msgspec.Raw:
        """The editor's result; raises ``AcpError`` for its error reply (or a reply
        that is neither). Cancelling the wait forgets the request (a late reply is
        dropped)."""
        try:
            await self._done.wait()
        finally:
            self._peer._forget(self)
        try:
            return self._call.result()
        except RpcError as exc:  # the core's: a reply with neither result nor error
            raise AcpError(exc.code, exc.message) from None

    async def cancel(self) -> None:
        """Ask the editor to cancel it (``$/cancel_request``), once; it still answers."""
        if not self.cancel_sent and not self._done.is_set():
            self.cancel_sent = True
            await self._peer.notify(CANCEL_METHOD, {"requestId": self.id})


class Peer:
    """One JSON-RPC connection over a pair of byte streams (stdin and stdout)."""

    def __init__(
        self,
        send_stream: trio.abc.SendStream,
        receive_stream: trio.abc.ReceiveStream,
        *,
        on_request: RequestHandler,
        on_notification: NotificationHandler,
    ) -> None:
        self._send_stream = send_stream
        self._receive_stream = receive_stream
        self._on_request = on_request
        self._on_notification = on_notification
        self._write_lock = trio.Lock()
        self._core: ClientCore[None] = ClientCore(
            max_frame_bytes=MAX_LINE_BYTES, rebuild_error=AcpError.from_wire
        )
        self._arrivals = itertools.count()
        self._outgoing: dict[int, OutgoingRequest] = {}
        self._incoming: dict[RequestId, trio.CancelScope] = {}
        self._gone = trio.Event()  # the editor's end closed (Rule 2)

    async def serve(self) -> None:
        """Read and dispatch until the editor closes its end; then cancel what still
        runs and return. Handler tasks live in a nursery of this call."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read, nursery)
            await self._gone.wait()
            nursery.cancel_scope.cancel()

    async def notify(self, method: str, params: Any) -> None:
        await self._write(encode_frame(Framing.NDJSON, encode_notification(method, params)))

    async def request(self, method: str, params: Any) -> OutgoingRequest:
        """Send a request; ``wait()`` on the returned handle for the answer."""
        call, frame = self._core.request(Method(method, object, msgspec.Raw), params)
        request = self._outgoing[call.id] = OutgoingRequest(self, call)
        await self._write(frame)
        return request

    def _forget(self, request: OutgoingRequest) -> None:
        self._outgoing.pop(request.id, None)
        self._core.forget(request._call)

    # -- reading ----------------------------------------------------------------------

    async def _read(self, nursery: trio.Nursery) -> None:
        decoder = FrameDecoder(max_frame_bytes=MAX_LINE_BYTES, framing=Framing.NDJSON)
        try:
            while data := await self._receive_stream.receive_some(RECEIVE_BYTES):
                decoder.feed(bytes(data))
                for frame in decoder.frames():
                    await self._frame(nursery, frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the editor is gone as surely as at EOF
        except FrameTooLarge as exc:
            log.error("the editor sent a line over %d bytes: %s", MAX_LINE_BYTES, exc.message)
        self._gone.set()

    async def _frame(self, nursery: trio.Nursery, frame: bytes) -> None:
        if frame.lstrip()[:1] == b"[":
            await self._reply_error(None, AcpError(-32600, "Invalid request: batches are not used"))
            return
        try:
            events = self._core.receive_frame(frame)
        except AcpError as exc:
            # An error the editor could not attribute to a request: nothing to settle.
            log.warning("the editor answered an unknown request: %s", exc.message)
            return
        except RpcError as exc:
            await self._reply_error(None, AcpError(exc.code, exc.message))
            return
        for event in events:  # one, or none for a reply nobody waits for any more
            if isinstance(event, PendingCall):
                request = self._outgoing.get(event.id)
                if request is not None:
                    request._done.set()
            elif isinstance(event, Notification | IncomingRequest):
                await self._message(nursery, event)

    async def _message(self, nursery: trio.Nursery, event: Notification | IncomingRequest) -> None:
        # The core gives absent params as null; handlers take them as an empty object.
        params = _NO_PARAMS if bytes(event.params) == b"null" else event.params
        received = Received(event.method, params, next(self._arrivals))
        if isinstance(event, Notification):
            if event.method == CANCEL_METHOD:
                self._cancel_incoming(params)
            else:
                nursery.start_soon(self._notification, received)
            return
        request_id = event.id
        if request_id is None:
            await self._reply_error(None, AcpError(-32600, "Invalid request: id must not be null"))
            return
        scope = trio.CancelScope()
        self._incoming[request_id] = scope
        nursery.start_soon(self._request, scope, request_id, received)

    def _cancel_incoming(self, params: msgspec.Raw) -> None:
        try:
            request_id = msgspec.json.decode(params, type=dict[str, Any]).get("requestId")
        except msgspec.DecodeError:
            return
        scope = self._incoming.get(request_id) if isinstance(request_id, int | str) else None
        if scope is not None:
            scope.cancel()

    # -- handlers -----------------------------------------------------------------------

    async def _request(
        self, scope: trio.CancelScope, request_id: RequestId, received: Received
    ) -> None:
        method = received.method
        result: Any = None
        error: AcpError | None = None
        try:
            with scope:
                try:
                    result = await self._on_request(received)
                except AcpError as exc:
                    error = exc
                except Exception as exc:
                    # The boundary: whatever a handler raised becomes an error reply.
                    log.exception("%s failed", method)
                    error = AcpError(INTERNAL_ERROR, f"{method} failed: {type(exc).__name__}")
        finally:
            self._incoming.pop(request_id, None)
        if scope.cancelled_caught:
            error = AcpError(REQUEST_CANCELLED, "Request cancelled")
        if error is not None:
            await self._reply_error(request_id, error)
            return
        then = None
        if isinstance(result, Answer):
            result, then = result.result, result.then
        await self._write(encode_frame(Framing.NDJSON, encode_success(request_id, result)))
        if then is not None:
            then()

    async def _notification(self, received: Received) -> None:
        try:
            await self._on_notification(received)
        except AcpError as exc:
            log.warning("notification %s refused: %s", received.method, exc.message)
        except Exception:
            log.exception("notification %s failed", received.method)

    # -- writing ------------------------------------------------------------------------

    async def _reply_error(self, request_id: RequestId | None, error: AcpError) -> None:
        reply = _encoder.encode(ErrorResponse("2.0", request_id, error.to_wire()))
        await self._write(encode_frame(Framing.NDJSON, reply))

    async def _write(self, frame: bytes) -> None:
        if self._gone.is_set():
            return
        async with self._write_lock:
            # Shielded: a line cut in half by a cancelled writer would garble every
            # line after it. Bounded: an editor that reads nothing for that long is gone.
            with trio.CancelScope(
                deadline=trio.current_time() + WRITE_TIMEOUT_S, shield=True
            ) as scope:
                try:
                    await self._send_stream.send_all(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._gone.set()
            if scope.cancelled_caught:
                log.error("the editor read nothing for %.0f s; giving up on it", WRITE_TIMEOUT_S)
                self._gone.set()


def method_not_found(method: str) -> AcpError:
    return AcpError(METHOD_NOT_FOUND, f"Method not found: {method}")
