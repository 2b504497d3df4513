"""A fake Anthropic Messages API on 127.0.0.1, for running the real Claude Code offline.

It speaks HTTP/1.1 (keep-alive; streamed replies use chunked transfer encoding) and
implements ``POST /v1/messages`` with server-sent events the way Claude Code reads
them: ``message_start``, ``content_block_start``, ``content_block_delta``
(``text_delta`` / ``input_json_delta``), ``content_block_stop``, ``message_delta``,
``message_stop``. ``POST /v1/messages/count_tokens`` gets a small count; every
other request is refused with 404, so nothing non-essential succeeds silently.

Each test scripts what the model answers (``script``): streamed text (optionally
slow, so a client can interrupt mid-stream), a tool call, an HTTP error, or one of
those made from the request it answers. When the script runs dry, ``default``
answers. Every request is recorded (``requests``) so a
test can check what Claude Code sent (for example its history after a resume).

Rule 1: the server never blocks its owner. It runs in daemon threads; ``close()``
returns within ``CLOSE_TIMEOUT_S`` even while a slow reply is still streaming
(that handler stops at its next write, or at its next chunk once ``close`` set the
stop flag).

Usage::

    with running_fake_anthropic() as fake:
        fake.script(TextReply("Hello!"), ToolUseReply({"command": "echo hi"}))
        env = fake.claude_env(home_dir)   # ANTHROPIC_BASE_URL and friends
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs

from tests.peers.fake_http import HOLD_POLL_S

MODEL = "claude-sonnet-4-5"  # what the fake says it is; Claude Code only echoes it
CLOSE_TIMEOUT_S = 5.0  # for the serving thread to end after shutdown(); generous
# How often serve_forever checks for shutdown(): its default, 0.5 s, was waited out at
# the close of every test with this fake (fake_http's servers poll as often).
SERVE_POLL_S = 0.05
WAIT_TIMEOUT_S = 30.0  # a request a test waits for arrives within a turn's time
MAX_BODY_BYTES = 64 * 1024 * 1024
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens, connecting fails at once  # Claude Code's first request carries a big system prompt


@attrs.frozen
class TextReply:
    """Stream ``text`` as ``text_delta`` events of ``chunk_chars`` characters, with
    ``delay_s`` before each chunk (0: as fast as the socket takes them). With
    ``hold``, every chunk after the first waits for that event to be set: the turn
    runs until the test lets it end."""

    text: str
    chunk_chars: int = 16
    delay_s: float = 0.0
    hold: threading.Event | None = None


@attrs.frozen
class ToolUseReply:
    """Ask for one tool call (``stop_reason: tool_use``); the input is streamed as
    ``input_json_delta`` pieces, as the real API does."""

    input: Mapping[str, Any]
    name: str = "Bash"
    text: str = ""  # optional text block before the tool call


@attrs.frozen
class ErrorReply:
    """Answer with an HTTP error and the API's error body."""

    status: int
    error_type: str
    message: str


@attrs.frozen
class ComputedReply:
    """A reply made from the request it answers, for a model that acts on what Claude
    Code told it (a path in its system prompt, say)."""

    compute: Callable[[RecordedRequest], TextReply | ToolUseReply | ErrorReply]


Reply = TextReply | ToolUseReply | ErrorReply | ComputedReply

AUTH_REFUSED = ErrorReply(401, "authentication_error", "invalid x-api-key")


@attrs.frozen
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # the decoded JSON body, or None
    at: float = attrs.field(factory=time.monotonic)  # arrival

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation a ``/v1/messages`` request carried (empty otherwise)."""
        if isinstance(self.body, dict) and isinstance(self.body.get("messages"), list):
            return list(self.body["messages"])
        return []

    def texts(self) -> list[str]:
        """Every text block of every message, in order (user prompts, assistant
        replies, tool results flattened to their text)."""
        out: list[str] = []
        for message in self.messages:
            out.extend(_texts(message.get("content")))
        return out


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    out.append(block["text"])
                elif "content" in block:
                    out.extend(_texts(block["content"]))
    return out


class FakeAnthropic:
    """The server's state: the script, the recorded requests, the stop flag."""

    def __init__(self, default: Reply | None = None) -> None:
        self.default: Reply = default or TextReply("OK.")
        self._lock = threading.Condition()
        self._script: list[Reply] = []
        self._requests: list[RecordedRequest] = []
        self.stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- scripting ------------------------------------------------------------------

    def script(self, *replies: Reply) -> None:
        """Queue replies for the next ``/v1/messages`` requests, in order."""
        with self._lock:
            self._script.extend(replies)

    def next_reply(self) -> Reply:
        with self._lock:
            return self._script.pop(0) if self._script else self.default

    # ---- records --------------------------------------------------------------------

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)
            self._lock.notify_all()

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def message_requests(self) -> list[RecordedRequest]:
        """The ``POST /v1/messages`` requests (the model calls), in arrival order."""
        return [r for r in self.requests if r.method == "POST" and _route(r.path) == "messages"]

    def wait_for_message_requests(
        self, count: int, timeout_s: float = WAIT_TIMEOUT_S
    ) -> list[RecordedRequest]:
        """Block until at least ``count`` model calls arrived; AssertionError after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                found = [
                    r for r in self._requests if r.method == "POST" and _route(r.path) == "messages"
                ]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"expected {count} model calls within {timeout_s} s, got {len(found)}"
                    )
                self._lock.wait(left)

    # ---- life -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "the fake server is not running"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.block_on_close = False  # a slow reply's thread must not hold up close()
        server.fake = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": SERVE_POLL_S},
            name="fake-anthropic",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(CLOSE_TIMEOUT_S)

    def claude_env(self, home: Path) -> dict[str, str]:
        """The environment that points Claude Code at this server and keeps it off
        the network and out of the user's own files: a dummy key, a private config
        directory and HOME under ``home``, no non-essential traffic, and a proxy
        that refuses everything not addressed to 127.0.0.1."""
        config = home / ".claude"
        config.mkdir(parents=True, exist_ok=True)
        return {
            "ANTHROPIC_BASE_URL": self.url,
            "ANTHROPIC_API_KEY": "sk-ant-fake-key-for-tests",
            "CLAUDE_CONFIG_DIR": str(config),
            "HOME": str(home),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            # Anything that still tries to leave the machine fails at once.
            "HTTPS_PROXY": DEAD_PROXY,
            "HTTP_PROXY": DEAD_PROXY,
            "NO_PROXY": "127.0.0.1,localhost",
        }


@contextlib.contextmanager
def running_fake_anthropic(default: Reply | None = None) -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic(default)
    fake.start()
    try:
        yield fake
    finally:
        fake.close()


def _route(path: str) -> str:
    bare = path.split("?", 1)[0].rstrip("/")
    if bare == "/v1/messages":
        return "messages"
    if bare == "/v1/messages/count_tokens":
        return "count_tokens"
    return "other"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real API; Claude Code reuses sockets
    server: ThreadingHTTPServer

    @property
    def fake(self) -> FakeAnthropic:
        fake: FakeAnthropic = self.server.fake  # type: ignore[attr-defined]
        return fake

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read ``requests`` instead."""

    def _record(self, body: Any) -> None:
        self.fake.record(
            RecordedRequest(
                method=self.command, path=self.path, headers=dict(self.headers), body=body
            )
        )

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            return None
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def _send_json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", f"req_fake_{uuid.uuid4().hex[:12]}")
        self.end_headers()
        self.wfile.write(data)

    def _refuse(self) -> None:
        self._send_json(
            404, {"type": "error", "error": {"type": "not_found_error", "message": "not here"}}
        )

    def do_GET(self) -> None:
        self._record(None)
        self._refuse()

    def do_POST(self) -> None:
        body = self._read_body()
        request = RecordedRequest(
            method=self.command, path=self.path, headers=dict(self.headers), body=body
        )
        self.fake.record(request)
        route = _route(self.path)
        if route == "count_tokens":
            self._send_json(200, {"input_tokens": 100})
        elif route == "messages" and isinstance(body, dict):
            reply = self.fake.next_reply()
            if isinstance(reply, ComputedReply):
                reply = reply.compute(request)
            self._answer(reply, stream=bool(body.get("stream")))
        else:
            self._refuse()

    # ---- the model's answer -------------------------------------------------------------

    def _answer(self, reply: TextReply | ToolUseReply | ErrorReply, *, stream: bool) -> None:
        if isinstance(reply, ErrorReply):
            self._send_json(
                reply.status,
                {"type": "error", "error": {"type": reply.error_type, "message": reply.message}},
            )
            return
        if not stream:
            self._send_json(200, _whole_message(reply))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        # Close after a stream: an interrupted client aborts mid-body, and a kept-alive
        # socket would make its next request wait for this body to drain.
        self.send_header("Connection", "close")
        self.send_header("request-id", f"req_fake_{uuid.uuid4().hex[:12]}")
        self.end_headers()
        hold = reply.hold if isinstance(reply, TextReply) else None
        deltas = 0
        try:
            for name, data, delay_s in _events(reply):
                if name == "content_block_delta" and hold is not None and deltas:
                    while not hold.wait(HOLD_POLL_S):
                        if self.fake.stopping.is_set():
                            return
                deltas += name == "content_block_delta"
                if delay_s and self.fake.stopping.wait(delay_s):
                    break
                self._chunk(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            # The client went away mid-stream (an interrupt aborts the request).
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def _message_start(stop_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": f"msg_fake_{uuid.uuid4().hex[:16]}",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }


def _chunks(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _events(reply: TextReply | ToolUseReply) -> Iterator[tuple[str, dict[str, Any], float]]:
    """The SSE events of one streamed reply: (event name, data, delay before it)."""
    yield "message_start", {"type": "message_start", "message": _message_start()}, 0.0
    index = 0
    text = reply.text
    delay_s = reply.delay_s if isinstance(reply, TextReply) else 0.0
    chunk_chars = reply.chunk_chars if isinstance(reply, TextReply) else 16
    if text or isinstance(reply, TextReply):
        yield (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "text", "text": ""},
            },
            0.0,
        )
        for piece in _chunks(text, chunk_chars):
            yield (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": piece},
                },
                delay_s,
            )
        yield "content_block_stop", {"type": "content_block_stop", "index": index}, 0.0
        index += 1
    stop_reason = "end_turn"
    if isinstance(reply, ToolUseReply):
        stop_reason = "tool_use"
        yield (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {
                    "type": "tool_use",
                    "id": f"toolu_fake_{uuid.uuid4().hex[:16]}",
                    "name": reply.name,
                    "input": {},
                },
            },
            0.0,
        )
        for piece in _chunks(json.dumps(dict(reply.input)), 12):
            yield (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                },
                0.0,
            )
        yield "content_block_stop", {"type": "content_block_stop", "index": index}, 0.0
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
        0.0,
    )
    yield "message_stop", {"type": "message_stop"}, 0.0


def _whole_message(reply: TextReply | ToolUseReply) -> dict[str, Any]:
    """The same reply, unstreamed (``stream: false`` requests)."""
    message = _message_start("end_turn")
    content: list[dict[str, Any]] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    if isinstance(reply, ToolUseReply):
        message["stop_reason"] = "tool_use"
        content.append(
            {
                "type": "tool_use",
                "id": f"toolu_fake_{uuid.uuid4().hex[:16]}",
                "name": reply.name,
                "input": dict(reply.input),
            }
        )
    message["content"] = content
    message["usage"] = {"input_tokens": 10, "output_tokens": 5}
    return message
