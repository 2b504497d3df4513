"""A fake OpenAI Responses API on 127.0.0.1, for driving the real ``codex`` offline.

Rule 1: every request is recorded (method, path, parsed JSON body) before it is
answered, so a test can assert what the agent sent, including after the fact.

Rule 2: replies are scripted per test. ``script(...)`` queues replies that answer the
next ``POST /v1/responses`` requests in order; once the queue is empty, ``default``
answers. A reply is text streamed in chunks (optionally slowly, so a test can
interrupt mid-stream), a shell tool call (so Codex asks for command approval), or
an HTTP error.

Rule 3: the server never blocks a test's teardown, and once closed it is gone for
the agent too: ``close()`` ends every stream in progress (slow streams poll a stop
flag) and shuts every open connection, including idle keep-alive ones a client
would otherwise reuse; handler threads are daemon threads.

The server is the stdlib's threading HTTP/1.1 server: one thread per connection,
keep-alive, streamed bodies in chunked transfer encoding as ``reqwest`` expects of
a server-sent-event stream without a length.
"""

from __future__ import annotations

import contextlib
import http.server
import itertools
import json
import socket
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

MODEL = "fake-model"
API_KEY_ENV = "FAKE_OPENAI_KEY"
_ids = itertools.count(1)


@attrs.frozen
class TextReply:
    """An assistant message streamed as ``chunks`` deltas, ``chunk_delay_s`` apart."""

    text: str
    chunks: int = 3
    chunk_delay_s: float = 0.0

    def pieces(self) -> list[str]:
        n = max(1, min(self.chunks, len(self.text)))
        size = -(-len(self.text) // n)  # ceil: at most n pieces
        return [self.text[i : i + size] for i in range(0, len(self.text), size)] or [""]


@attrs.frozen
class ShellCall:
    """An ``exec_command`` function call (the shell tool Codex offers a model it has
    no metadata for). ``escalate`` asks to run outside the sandbox, which makes Codex
    request the client's approval under the ``on-request`` policy."""

    command: str
    escalate: bool = True
    call_id: str = attrs.field(factory=lambda: f"call_{next(_ids)}")

    def arguments(self) -> str:
        args: dict[str, Any] = {"cmd": self.command, "tty": False, "login": False}
        if self.escalate:
            args["sandbox_permissions"] = "require_escalated"
            args["justification"] = f"May I run {self.command!r}?"
        return json.dumps(args)


@attrs.frozen
class FunctionCall:
    """A call of any function tool Codex offers, by name (``update_plan``, ...), with
    its arguments as JSON."""

    name: str
    arguments: dict[str, Any]
    call_id: str = attrs.field(factory=lambda: f"call_{next(_ids)}")


@attrs.frozen
class HttpError:
    """A plain HTTP error (401 for a refused key, 500 for an outage)."""

    status: int
    message: str = "scripted failure"


Reply = TextReply | ShellCall | FunctionCall | HttpError


@attrs.frozen
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # the parsed JSON body, or None


def input_texts(body: Any, role: str) -> list[str]:
    """Every ``input_text``/``output_text`` span of ``role``'s messages in a
    Responses request body: what the model was shown."""
    out: list[str] = []
    for item in (body or {}).get("input", []):
        if item.get("type") == "message" and item.get("role") == role:
            for span in item.get("content") or []:
                if span.get("type") in ("input_text", "output_text"):
                    out.append(str(span.get("text", "")))
    return out


class FakeOpenAI:
    """The server; start it with ``running_fake_openai()``."""

    def __init__(self) -> None:
        self.default: Reply = TextReply("ok")
        self._queue: deque[Reply] = deque()
        self._requests: list[Recorded] = []
        self._cond = threading.Condition()
        self.stopping = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

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

    # -- scripting and inspection ----------------------------------------------------

    def script(self, *replies: Reply) -> None:
        """Queue replies for the next ``/responses`` requests, in order."""
        with self._cond:
            self._queue.extend(replies)

    def next_reply(self) -> Reply:
        with self._cond:
            return self._queue.popleft() if self._queue else self.default

    def record(self, request: Recorded) -> None:
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()

    def requests(self, path_suffix: str = "/responses") -> list[Recorded]:
        """Requests received so far whose path ends with ``path_suffix``."""
        with self._cond:
            return [r for r in self._requests if r.path.endswith(path_suffix)]

    def write_codex_home(self, home: Path, *, extra: str = "") -> Path:
        """A ``CODEX_HOME`` whose config points Codex at this server, with plugin
        sync and other network features off. Returns ``home``."""
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'model_provider = "fake"\n'
            f'model = "{MODEL}"\n'
            f"\n"
            f"[model_providers.fake]\n"
            f'name = "Fake OpenAI"\n'
            f'base_url = "{self.base_url}"\n'
            f'wire_api = "responses"\n'
            f'env_key = "{API_KEY_ENV}"\n'
            f"request_max_retries = 0\n"
            f"stream_max_retries = 0\n"
            f"\n"
            f"[features]\n"
            f"plugins = false\n"
            f"remote_plugin = false\n"
            f"apps = false\n"
            f"unbounded_connection_retries = false\n"
            f"{extra}"
        )
        return home


@contextlib.contextmanager
def running_fake_openai(*replies: Reply) -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    fake.script(*replies)
    fake.start()
    try:
        yield fake
    finally:
        fake.close()


# -- the HTTP side ---------------------------------------------------------------------


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # Rule 3
    block_on_close = False
    fake: FakeOpenAI

    def __init__(self, address: tuple[str, int], handler: type[_Handler]) -> None:
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


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


def _usage() -> dict[str, Any]:
    return {
        "input_tokens": 10,
        "input_tokens_details": None,
        "output_tokens": 5,
        "output_tokens_details": None,
        "total_tokens": 15,
    }


def reply_events(
    reply: TextReply | ShellCall | FunctionCall, response_id: str
) -> Iterator[dict[str, Any]]:
    """The server-sent events of one scripted reply, in order."""
    yield {"type": "response.created", "response": {"id": response_id}}
    if isinstance(reply, TextReply):
        item_id = f"msg_{next(_ids)}"
        yield {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"type": "message", "role": "assistant", "id": item_id, "content": []},
        }
        for piece in reply.pieces():
            yield {
                "type": "response.output_text.delta",
                "item_id": item_id,
                "output_index": 0,
                "content_index": 0,
                "delta": piece,
            }
        yield {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {
                "type": "message",
                "role": "assistant",
                "id": item_id,
                "content": [{"type": "output_text", "text": reply.text}],
            },
        }
    else:
        yield {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {
                "type": "function_call",
                "id": f"fc_{next(_ids)}",
                "call_id": reply.call_id,
                "name": reply.name if isinstance(reply, FunctionCall) else "exec_command",
                "arguments": json.dumps(reply.arguments)
                if isinstance(reply, FunctionCall)
                else reply.arguments(),
            },
        }
    yield {"type": "response.completed", "response": {"id": response_id, "usage": _usage()}}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, chunked streams
    server: _Server

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

    def do_GET(self) -> None:
        self._record()
        if self.path.split("?")[0].endswith("/models"):
            self._send_json(200, {"object": "list", "data": []})
        else:
            self._send_json(404, {"error": {"message": "not found", "type": "not_found"}})

    def do_POST(self) -> None:
        self._record()
        if not self.path.split("?")[0].endswith("/responses"):
            self._send_json(404, {"error": {"message": "not found", "type": "not_found"}})
            return
        reply = self.server.fake.next_reply()
        if isinstance(reply, HttpError):
            self._send_json(
                reply.status,
                {"error": {"message": reply.message, "type": "invalid_request_error"}},
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        delay_s = reply.chunk_delay_s if isinstance(reply, TextReply) else 0.0
        stopping = self.server.fake.stopping
        try:
            for event in reply_events(reply, f"resp_{next(_ids)}"):
                # A slow model waits between deltas, but gives way to close().
                slow = delay_s and event["type"] == "response.output_text.delta"
                if slow and stopping.wait(delay_s):
                    return
                self._chunk(_sse(event))
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            # The agent hung up mid-stream (an interrupt): nothing more to say.
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def shell_call_outputs(body: Any) -> Sequence[str]:
    """The outputs of function calls the agent reports back to the model."""
    return [
        str(item.get("output"))
        for item in (body or {}).get("input", [])
        if item.get("type") == "function_call_output"
    ]
