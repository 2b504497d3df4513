"""The synchronous client library: one blocking connection to the daemon.

Requests, replies and notifications are ``agentsd_protocol.client.core``'s (its Rules
1 to 4: ids, matching, errors rebuilt); this module is the socket glue around it.

Rule 1: ``call(methods.X, params)`` is typed by the method it names; a method named
by a string (outside the registry, or to send params as plain JSON) gets plain JSON
values back.

Rule 2: notifications that arrive while a reply is awaited are kept, in order, for
``notifications()`` and ``next_notification()``; nothing the daemon sends is lost
while the connection lives.

Rule 3: once the connection has failed (closed by the daemon, broken, or the daemon
sent something that is not JSON-RPC, including an error it could not attribute to a
request) the client is closed for good and every later call raises
``DaemonDisconnected``. A timeout does not break it.

A ``Client`` is not thread-safe.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar, overload

import msgspec

from agentsctl.daemon import DaemonDisconnected, DaemonUnreachable, connect, receive, send
from agentsd_protocol.client.core import ClientCore, IncomingRequest, Notification, PendingCall
from agentsd_protocol.errors import RpcError
from agentsd_protocol.methods import Method, untyped
from agentsd_protocol.paths import default_socket_path

__all__ = ["Client", "DaemonDisconnected", "DaemonUnreachable", "Notification"]

P = TypeVar("P")
R = TypeVar("R")
UntypedParams = msgspec.Struct | dict[str, Any] | None


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
        self._core: ClientCore[None] = ClientCore()
        self._submitted: set[int] = set()  # ids submitted and not yet collected by ``wait``
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
    def call(self, method: Method[P, R], params: P | None = None) -> R: ...

    @overload
    def call(self, method: str, params: UntypedParams = None) -> Any: ...

    def call(self, method: Method[Any, Any] | str, params: Any = None) -> Any:
        """Send one request and wait for its reply (Rule 1). Params None are left out.

        Raises the daemon's ``RpcError`` subclass for an error reply, ``TimeoutError``
        after ``timeout_s`` without the reply (the late reply will be dropped),
        ``DaemonDisconnected`` if the connection fails first, and ``ParseError`` if the
        daemon sends something that is not JSON-RPC or a result that does not fit.
        """
        call = self.submit(method, params)
        try:
            return self.wait(call)
        except TimeoutError:
            self._core.forget(call)
            self._submitted.discard(call.id)
            raise

    @overload
    def submit(self, method: Method[P, R], params: P | None = None) -> PendingCall[R]: ...

    @overload
    def submit(self, method: str, params: UntypedParams = None) -> PendingCall[Any]: ...

    def submit(self, method: Method[Any, Any] | str, params: Any = None) -> PendingCall[Any]:
        """Send a request without waiting; collect its reply with ``wait(call)``.

        Several submitted requests may be outstanding at once (pipelining).
        """
        sock = self._live_socket()
        call, frame = self._core.request(
            untyped(method) if isinstance(method, str) else method, params
        )
        try:
            send(sock, frame, self.socket_path)
        except DaemonDisconnected as exc:
            self._fail(exc.message)
            raise
        self._submitted.add(call.id)
        return call

    def wait(self, call: PendingCall[R]) -> R:
        """Wait for the reply to a submitted request; raises as ``call`` does.

        On ``TimeoutError`` the request stays pending and may be waited for again.
        """
        if call.id not in self._submitted:
            raise ValueError(f"request {call.id} is not pending on this client")
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while not call.done:
            try:
                self._read_more(deadline)
            except TimeoutError:
                raise TimeoutError(
                    f"agentsd at {self.socket_path} did not answer {call.method.name} "
                    f"(request {call.id}) within {self.timeout_s} s"
                ) from None
        self._submitted.discard(call.id)
        return call.result()

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
        self._core.fail(DaemonDisconnected(reason, self.socket_path))
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _read_more(self, deadline: float | None) -> None:
        """Receive once and hand every complete message to the core.

        Raises a bare ``TimeoutError`` at ``deadline`` (callers say what was late),
        ``DaemonDisconnected`` when the connection ends, and the core's protocol
        errors (closing it).
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
            if self._core.pending:
                message += " with requests unanswered"
            self._eof = True
            self._fail(message)
            raise DaemonDisconnected(message, self.socket_path)
        try:
            for event in self._core.receive_data(data):
                if isinstance(event, Notification):
                    self._notifications.append(event)
                elif isinstance(event, IncomingRequest):
                    # The daemon sends no requests today; answer one as any peer must.
                    send(sock, self._core.refuse(event), self.socket_path)
        except (RpcError, DaemonDisconnected) as exc:
            self._fail(exc.message)
            raise
