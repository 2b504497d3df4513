"""What the fake model servers (``fake_openai``, ``fake_gemini``) share: the scripted
reply queue, the request record, a threading HTTP/1.1 server that can drop every
connection it holds, and the handler's plumbing (JSON bodies, chunked streams).

Rule 1: every request is recorded (method, path, headers, parsed JSON body) before it
is answered, so a test can assert what the agent sent, including after the fact.

Rule 2: replies are scripted per test: ``script(...)`` queues replies for the next
model calls in order; once the queue is empty, ``default`` answers.

Rule 3: the server never blocks a test's teardown, and once closed it is gone for
the agent too: ``close()`` ends every stream in progress (a slow or held stream
polls a stop flag) and shuts every open connection, including idle keep-alive ones
a client would otherwise reuse; handler threads are daemon threads.

A streamed text reply can be held (``TextReply.hold``): its first piece streams, and
the rest waits until the test sets the event. A test that needs a turn still running
while it checks something holds the turn open by that, not by a clock.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import attrs

HOLD_POLL_S = 0.05  # a held stream looks at the stop flag this often


@attrs.frozen
class TextReply:
    """Model text streamed as ``chunks`` pieces, ``chunk_delay_s`` apart; with
    ``hold``, every piece after the first waits for that event to be set."""

    text: str
    chunks: int = 3
    chunk_delay_s: float = 0.0
    hold: threading.Event | None = None

    def pieces(self) -> list[str]:
        n = max(1, min(self.chunks, len(self.text)))
        size = -(-len(self.text) // n)  # ceil: at most n pieces
        return [self.text[i : i + size] for i in range(0, len(self.text), size)] or [""]

    def before_piece(self, index: int, stopping: threading.Event) -> bool:
        """Wait as this reply says before its ``index``-th piece (after the first:
        the hold, then the delay); False once the server is closing."""
        if index == 0:
            return not stopping.is_set()
        if self.hold is not None:
            while not self.hold.wait(HOLD_POLL_S):
                if stopping.is_set():
                    return False
        return not (self.chunk_delay_s and stopping.wait(self.chunk_delay_s))


def before_piece(reply: object, index: int, stopping: threading.Event) -> bool:
    """``TextReply.before_piece`` for a reply of any kind (only text is paced)."""
    return not isinstance(reply, TextReply) or reply.before_piece(index, stopping)


@attrs.frozen
class HttpError:
    """A plain HTTP error (401 for a refused key, 500 for an outage)."""

    status: int
    message: str = "scripted failure"


@attrs.frozen
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # the parsed JSON body, or None


R = TypeVar("R")


class FakeServer(Generic[R]):
    """A fake model server's state and life; start it with ``start()`` (or a
    module's ``running_...()``)."""

    def __init__(self, handler: type[JsonHandler], default: R) -> None:
        self.default: R = default
        self._queue: deque[R] = deque()
        self._requests: list[Recorded] = []
        self._cond = threading.Condition()
        self.stopping = threading.Event()
        self._server = TrackingServer(("127.0.0.1", 0), handler)
        self._server.fake = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop serving (idempotent): the port refuses connections afterwards."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._server.drop_connections()
        self._thread.join(timeout=5)

    def script(self, *replies: R) -> None:
        """Queue replies for the next model calls, in order."""
        with self._cond:
            self._queue.extend(replies)

    def next_reply(self) -> R:
        with self._cond:
            return self._queue.popleft() if self._queue else self.default

    def record(self, request: Recorded) -> None:
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()

    def recorded(self, where: Callable[[Recorded], bool] = lambda r: True) -> list[Recorded]:
        """The requests received so far that ``where`` keeps, in arrival order."""
        with self._cond:
            return [r for r in self._requests if where(r)]


class TrackingServer(http.server.ThreadingHTTPServer):
    """The stdlib's threading server, knowing its open connections (Rule 3)."""

    daemon_threads = True
    block_on_close = False
    fake: FakeServer[Any]

    def __init__(self, address: tuple[str, int], handler: type[JsonHandler]) -> None:
        super().__init__(address, handler)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Shut every connection still open; their handler threads then end."""
        with self._open_lock:
            conns = list(self._open)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class JsonHandler(http.server.BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1 with JSON bodies and chunked server-sent-event streams."""

    protocol_version = "HTTP/1.1"
    server: TrackingServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a quiet test run; the recorded requests are the log

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def _record(self) -> Any:
        """Read the body and record the request (Rule 1); the parsed body."""
        body = self._read_body()
        self.server.fake.record(
            Recorded(
                method=self.command,
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
        )
        return body

    def _send_json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self) -> None:
        """The headers of a server-sent-event stream without a length."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
