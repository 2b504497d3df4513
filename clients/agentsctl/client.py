"""The synchronous client library: one blocking connection to the daemon.

Rule 1: requests carry fresh integer ids; a reply is matched to its request by id
alone, so replies may arrive in any order and a reply nobody waits for any more (its
call timed out) is dropped.

Rule 2: notifications that arrive while a reply is awaited are kept, in order, for
``notifications()`` and ``next_notification()``; nothing the daemon sends is lost
while the connection lives.

Rule 3: once the connection has failed (closed by the daemon, broken, or the daemon
sent something that is not JSON-RPC) the client is closed for good and every later
call raises ``DaemonDisconnected``. A timeout does not break it.

All framing and JSON-RPC decoding is ``agentsd_protocol``'s; this module is the
socket glue around it. A ``Client`` is not thread-safe.
"""

from __future__ import annotations

import builtins
import os
import socket
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

import msgspec
from msgspec import UNSET

from agentsctl.daemon import DaemonDisconnected, DaemonUnreachable, connect, receive, send
from agentsd_protocol.api import daemon as d
from agentsd_protocol.api import session as s
from agentsd_protocol.errors import MethodNotFound, ParseError, RpcError, error_from_wire
from agentsd_protocol.framing import FrameDecoder, Framing, encode_frame
from agentsd_protocol.jsonrpc import (
    ClientIncoming,
    RequestId,
    decode_client_frame,
    encode_error,
    encode_request,
)
from agentsd_protocol.paths import default_socket_path

__all__ = ["Client", "DaemonDisconnected", "DaemonUnreachable", "Notification"]

T = TypeVar("T")


class Notification(msgspec.Struct, frozen=True):
    """A notification from the daemon, params still encoded."""

    method: str
    params: msgspec.Raw = msgspec.Raw(b"null")

    def decode(self, params_type: type[T]) -> T:
        """The params as ``params_type`` (``msgspec.ValidationError`` if they do not fit)."""
        return msgspec.json.decode(self.params, type=params_type)


class Client:
    """A blocking JSON-RPC 2.0 connection to agentsd, over newline-delimited JSON.

    ``path`` defaults to ``agentsd_protocol.paths.default_socket_path()``.
    ``timeout_s`` bounds the connect and each wait for a reply (None waits forever).
    Connecting raises ``DaemonUnreachable``. Close it with ``close()`` or a ``with``
    block.
    """

    def __init__(self, path: str | Path | None = None, *, timeout_s: float | None = 30.0) -> None:
        self.socket_path = Path(path) if path is not None else default_socket_path()
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = connect(self.socket_path, timeout_s)
        self._decoder = FrameDecoder(framing=Framing.NDJSON)
        self._next_id = 1
        self._pending: dict[RequestId, str] = {}  # submitted, not yet collected: id -> method
        self._replies: dict[RequestId | None, ClientIncoming] = {}
        self._notifications: deque[Notification] = deque()
        self._failure: str | None = None  # why the connection is closed (Rule 3)
        self._eof = False  # the daemon closed the connection cleanly

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent). Pending calls are abandoned."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._failure is None:
            self._failure = "the client was closed"

    @property
    def closed(self) -> bool:
        return self._sock is None

    # -- requests ---------------------------------------------------------------

    @overload
    def call(
        self,
        method: str,
        params: msgspec.Struct | dict[str, Any] | None = None,
        *,
        result_type: type[T],
    ) -> T: ...

    @overload
    def call(
        self,
        method: str,
        params: msgspec.Struct | dict[str, Any] | None = None,
        *,
        result_type: None = None,
    ) -> Any: ...

    def call(
        self,
        method: str,
        params: msgspec.Struct | dict[str, Any] | None = None,
        *,
        result_type: type[T] | None = None,
    ) -> T | Any:
        """Send one request and wait for its reply.

        The result is decoded as ``result_type`` when given, else into plain JSON
        values. Raises the daemon's ``RpcError`` subclass for an error reply,
        ``TimeoutError`` after ``timeout_s`` without the reply (the late reply will be
        dropped), ``DaemonDisconnected`` if the connection fails first, and
        ``ParseError`` if the daemon sends something that is not JSON-RPC or a result
        that does not fit ``result_type``.
        """
        request_id = self.submit(method, params)
        try:
            return self.wait(request_id, result_type=result_type)
        except TimeoutError:
            del self._pending[request_id]
            raise

    def submit(self, method: str, params: msgspec.Struct | dict[str, Any] | None = None) -> int:
        """Send a request without waiting; collect its reply with ``wait(id)``.

        Several submitted requests may be outstanding at once (pipelining).
        """
        sock = self._live_socket()
        request_id = self._next_id
        self._next_id += 1
        frame = encode_frame(Framing.NDJSON, encode_request(method, params, request_id))
        try:
            send(sock, frame, self.socket_path)
        except DaemonDisconnected as exc:
            self._fail(exc.message)
            raise
        self._pending[request_id] = method
        return request_id

    @overload
    def wait(self, request_id: int, *, result_type: type[T]) -> T: ...

    @overload
    def wait(self, request_id: int, *, result_type: None = None) -> Any: ...

    def wait(self, request_id: int, *, result_type: type[T] | None = None) -> T | Any:
        """Wait for the reply to a submitted request; raises as ``call`` does.

        On ``TimeoutError`` the request stays pending and may be waited for again.
        An error reply the daemon could not attribute to a request (id null: it could
        not parse what it received) fails the wait that reads it.
        """
        if request_id not in self._pending:
            raise ValueError(f"request {request_id} is not pending on this client")
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while request_id not in self._replies and None not in self._replies:
            try:
                self._read_more(deadline)
            except TimeoutError:
                method = self._pending[request_id]
                raise TimeoutError(
                    f"agentsd at {self.socket_path} did not answer {method} "
                    f"(request {request_id}) within {self.timeout_s} s"
                ) from None
        reply = self._replies.pop(request_id if request_id in self._replies else None)
        del self._pending[request_id]
        if reply.error is not UNSET:
            raise error_from_wire(reply.error)
        if reply.result is UNSET:
            raise ParseError("Parse error: a reply with neither result nor error")
        try:
            if result_type is None:
                return msgspec.json.decode(reply.result)
            return msgspec.json.decode(reply.result, type=result_type)
        except msgspec.DecodeError as exc:
            raise ParseError(f"Parse error in the result of request {request_id}: {exc}") from None

    # -- notifications ----------------------------------------------------------

    def notifications(self) -> Iterator[Notification]:
        """Every notification, in arrival order, blocking on the socket for more.

        Ends when the daemon closes the connection; raises ``DaemonDisconnected`` if
        it breaks. Replies that arrive meanwhile are kept for their ``wait``.
        """
        while True:
            while self._notifications:
                yield self._notifications.popleft()
            if self._eof:
                return
            try:
                self._read_more(None)
            except DaemonDisconnected:
                if not self._eof:
                    raise

    def next_notification(self, timeout_s: float | None) -> Notification | None:
        """The next notification, or None if none arrives within ``timeout_s``.

        Raises ``DaemonDisconnected`` if the connection ends first.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._notifications:
            try:
                self._read_more(deadline)
            except TimeoutError:
                return None
        return self._notifications.popleft()

    # -- typed methods ----------------------------------------------------------

    def ping(self) -> d.PingResult:
        return self.call("daemon.ping", result_type=d.PingResult)

    def status(self) -> d.StatusResult:
        return self.call("daemon.status", result_type=d.StatusResult)

    def shutdown(self) -> d.ShutdownResult:
        """Ask the daemon to close every session and exit; it replies first."""
        return self.call("daemon.shutdown", result_type=d.ShutdownResult)

    def discover(self) -> dict[str, Any]:
        """This API as an OpenRPC document."""
        return self.call("rpc.discover", result_type=dict[str, Any])

    def create(
        self,
        provider: str,
        cwd: str | os.PathLike[str],
        *,
        title: str | None = None,
        options: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        command: Sequence[str] | None = None,
        start: bool = True,
        client_operation_id: str | None = None,
    ) -> s.CreateResult:
        params = s.CreateParams(
            provider=provider,
            cwd=os.fspath(cwd),
            title=title,
            options=options or {},
            env=env or {},
            command=None if command is None else builtins.list(command),
            start=start,
            client_operation_id=client_operation_id,
        )
        return self.call("agentSession.create", params, result_type=s.CreateResult)

    def get(self, session_id: str) -> s.GetResult:
        return self.call(
            "agentSession.get", s.GetParams(session_id=session_id), result_type=s.GetResult
        )

    def start(
        self,
        session_id: str,
        *,
        client_operation_id: str | None = None,
        expected_fence: int | None = None,
    ) -> s.StartResult:
        params = s.StartParams(
            session_id=session_id,
            client_operation_id=client_operation_id,
            expected_fence=expected_fence,
        )
        return self.call("agentSession.start", params, result_type=s.StartResult)

    def close_session(
        self,
        session_id: str,
        *,
        client_operation_id: str | None = None,
        expected_fence: int | None = None,
    ) -> s.CloseResult:
        """``agentSession.close``: end the agent child, keep the record and journal.

        (Named so because ``close()`` closes this connection.)
        """
        params = s.CloseParams(
            session_id=session_id,
            client_operation_id=client_operation_id,
            expected_fence=expected_fence,
        )
        return self.call("agentSession.close", params, result_type=s.CloseResult)

    def delete(
        self,
        session_id: str,
        *,
        client_operation_id: str | None = None,
        expected_fence: int | None = None,
    ) -> s.DeleteResult:
        params = s.DeleteParams(
            session_id=session_id,
            client_operation_id=client_operation_id,
            expected_fence=expected_fence,
        )
        return self.call("agentSession.delete", params, result_type=s.DeleteResult)

    def list(self, *, state: s.Phase | None = None, provider: str | None = None) -> s.ListResult:
        # Defined last: inside the class body, later annotations would see this
        # method instead of the builtin ``list``.
        params = s.ListParams(state=state, provider=provider)
        return self.call("agentSession.list", params, result_type=s.ListResult)

    # -- the socket -------------------------------------------------------------

    def _live_socket(self) -> socket.socket:
        if self._sock is None:
            raise DaemonDisconnected(
                f"the connection to agentsd at {self.socket_path} is closed: {self._failure}",
                self.socket_path,
            )
        return self._sock

    def _fail(self, reason: str) -> None:
        """Close for good (Rule 3), remembering why."""
        self._failure = reason
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _read_more(self, deadline: float | None) -> None:
        """Receive once and dispatch every complete message.

        Raises a bare ``TimeoutError`` at ``deadline`` (callers say what was late), ``DaemonDisconnected`` when the
        connection ends, ``ParseError``/``FrameTooLarge`` on garbage (closing it).
        """
        sock = self._live_socket()
        if deadline is None:
            sock.settimeout(None)
        else:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            sock.settimeout(remaining)
        try:
            data = receive(sock, self.socket_path)
        except DaemonDisconnected as exc:
            self._fail(exc.message)
            raise
        if not data:
            message = f"agentsd at {self.socket_path} closed the connection"
            if self._pending:
                message += " with requests unanswered"
            self._eof = True
            self._fail(message)
            raise DaemonDisconnected(message, self.socket_path)
        try:
            self._decoder.feed(data)
            for frame in self._decoder.frames():
                for message_ in decode_client_frame(frame):
                    self._dispatch(message_)
        except (RpcError, DaemonDisconnected) as exc:
            self._fail(exc.message)
            raise

    def _dispatch(self, message: ClientIncoming) -> None:
        if message.method is not UNSET:
            if message.id is UNSET:
                params = message.params if message.params is not UNSET else msgspec.Raw(b"null")
                self._notifications.append(Notification(method=message.method, params=params))
            else:
                # The daemon sends no requests today; answer one as any peer must.
                refusal = MethodNotFound(f"Method not found: {message.method}")
                reply = encode_error(message.id, refusal)
                send(self._live_socket(), encode_frame(Framing.NDJSON, reply), self.socket_path)
            return
        if message.id is UNSET:
            raise ParseError("Parse error: a message with neither method nor id")
        if message.id in self._pending or (message.id is None and self._pending):
            self._replies[message.id] = message
        # Otherwise it answers a request whose caller gave up (Rule 1): dropped.
