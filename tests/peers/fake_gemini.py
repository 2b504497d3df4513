"""A fake Gemini API on 127.0.0.1, for running the real Gemini CLI offline.

Gemini CLI reads ``GOOGLE_GEMINI_BASE_URL`` (its "gateway" auth type when set) and
sends ``POST /v1beta/models/MODEL:streamGenerateContent?alt=sse`` for a turn, and
``:generateContent`` / ``:countTokens`` for its side questions. The stream is
server-sent events, one ``data: {GenerateContentResponse}`` each:
``{candidates: [{content: {role: "model", parts: [...]}, finishReason?}],
usageMetadata?}``; a part is ``{text}`` or ``{functionCall: {name, args}}``.

Rule 1: every request is recorded (method, path, parsed JSON body) before it is
answered, so a test can assert what the agent sent, including after the fact.

Rule 2: turn replies are scripted per test. ``script(...)`` queues replies for the
next ``:streamGenerateContent`` requests in order; once the queue is empty,
``default`` answers. A reply is text streamed in chunks (optionally slowly, so a
test can cancel mid-stream), a function call (``run_shell_command``, which Gemini
CLI asks the client's permission for), or an HTTP error. ``:generateContent``
(its routing and "next speaker" side questions) gets a short JSON text answer,
``:countTokens`` a small count; anything else is a 404, so nothing non-essential
succeeds silently.

Rule 3: the server never blocks a test's teardown: ``close()`` ends every stream
in progress (slow streams poll a stop flag) and shuts every open connection;
handler threads are daemon threads.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

MODEL = "gemini-2.5-flash"  # a model Gemini CLI knows, so it asks for nothing else
API_KEY = "fake-gemini-key"


@attrs.frozen
class TextReply:
    """Model text streamed as ``chunks`` events, ``chunk_delay_s`` apart."""

    text: str
    chunks: int = 3
    chunk_delay_s: float = 0.0

    def pieces(self) -> list[str]:
        n = max(1, min(self.chunks, len(self.text)))
        size = -(-len(self.text) // n)  # ceil: at most n pieces
        return [self.text[i : i + size] for i in range(0, len(self.text), size)] or [""]


@attrs.frozen
class ShellCall:
    """A ``run_shell_command`` function call: Gemini CLI asks the client before it
    runs a command not on its allow list."""

    command: str

    def part(self) -> dict[str, Any]:
        return {
            "functionCall": {
                "name": "run_shell_command",
                "args": {"command": self.command, "description": f"Run {self.command}"},
            }
        }


@attrs.frozen
class HttpError:
    """A plain HTTP error (401 for a refused key, 500 for an outage)."""

    status: int
    message: str = "scripted failure"


Reply = TextReply | ShellCall | HttpError


@attrs.frozen
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # the parsed JSON body, or None


def contents_texts(body: Any, role: str) -> list[str]:
    """Every text part of ``role``'s contents in a request body: what the model was shown."""
    out: list[str] = []
    for content in (body or {}).get("contents", []):
        if content.get("role") == role:
            for part in content.get("parts") or []:
                if isinstance(part.get("text"), str):
                    out.append(part["text"])
    return out


def function_responses(body: Any) -> list[Mapping[str, Any]]:
    """The ``functionResponse`` parts the agent sends back to the model."""
    return [
        part["functionResponse"]
        for content in (body or {}).get("contents", [])
        for part in content.get("parts") or []
        if isinstance(part.get("functionResponse"), dict)
    ]


class FakeGemini:
    """The server; start it with ``running_fake_gemini()``."""

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
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

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
        """Queue replies for the next ``:streamGenerateContent`` requests, in order."""
        with self._cond:
            self._queue.extend(replies)

    def next_reply(self) -> Reply:
        with self._cond:
            return self._queue.popleft() if self._queue else self.default

    def record(self, request: Recorded) -> None:
        with self._cond:
            self._requests.append(request)
            self._cond.notify_all()

    def requests(self, action: str = ":streamGenerateContent") -> list[Recorded]:
        """Requests received so far whose path (without its query) ends with ``action``."""
        with self._cond:
            return [r for r in self._requests if r.path.split("?")[0].endswith(action)]

    def all_requests(self) -> list[Recorded]:
        with self._cond:
            return list(self._requests)

    def gemini_env(self, home: Path) -> dict[str, str]:
        """The environment that points Gemini CLI at this server with ``home`` as
        its home (``GEMINI_CLI_HOME``): a settings file there picks API-key auth and the
        model, and turns telemetry, update checks, IDE integration and usage statistics
        off (with them off, this server is the only address it connects to)."""
        settings_dir = home / ".gemini"
        settings_dir.mkdir(parents=True, exist_ok=True)
        (settings_dir / "settings.json").write_text(
            json.dumps(
                {
                    "security": {"auth": {"selectedType": "gemini-api-key"}},
                    "model": {"name": MODEL},
                    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
                    "privacy": {"usageStatisticsEnabled": False},
                    "telemetry": {"enabled": False},
                    "ide": {"enabled": False},
                },
                indent=2,
            )
        )
        return {
            "GEMINI_CLI_HOME": str(home),
            "GOOGLE_GEMINI_BASE_URL": self.base_url,
            "GEMINI_API_KEY": API_KEY,
        }


@contextlib.contextmanager
def running_fake_gemini(*replies: Reply) -> Iterator[FakeGemini]:
    fake = FakeGemini()
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
    fake: FakeGemini

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


def _usage() -> dict[str, Any]:
    return {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}


def _candidate(parts: list[dict[str, Any]], finish: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return candidate


def reply_events(reply: TextReply | ShellCall) -> Iterator[dict[str, Any]]:
    """The streamed responses of one scripted reply, in order."""
    if isinstance(reply, TextReply):
        pieces = reply.pieces()
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            event: dict[str, Any] = {
                "candidates": [_candidate([{"text": piece}], "STOP" if last else None)],
                "modelVersion": MODEL,
            }
            if last:
                event["usageMetadata"] = _usage()
            yield event
    else:
        yield {
            "candidates": [_candidate([reply.part()], "STOP")],
            "usageMetadata": _usage(),
            "modelVersion": MODEL,
        }


# Gemini CLI's side questions ask for JSON (a routing decision, whether the model
# should speak next): one small object that names the flash model and the user.
_SIDE_ANSWER = json.dumps(
    {"reasoning": "fake", "model_choice": "flash", "next_speaker": "user"}, separators=(",", ":")
)


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

    def _not_found(self) -> None:
        self._send_json(
            404, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}}
        )

    def do_GET(self) -> None:
        self._record()
        self._not_found()

    def do_POST(self) -> None:
        self._record()
        action = self.path.split("?")[0].rpartition(":")[2]
        if action == "countTokens":
            self._send_json(200, {"totalTokens": 10})
        elif action == "generateContent":
            self._send_json(
                200,
                {
                    "candidates": [_candidate([{"text": _SIDE_ANSWER}], "STOP")],
                    "usageMetadata": _usage(),
                    "modelVersion": MODEL,
                },
            )
        elif action == "streamGenerateContent":
            self._stream(self.server.fake.next_reply())
        else:
            self._not_found()

    def _stream(self, reply: Reply) -> None:
        if isinstance(reply, HttpError):
            self._send_json(
                reply.status,
                {"error": {"code": reply.status, "message": reply.message, "status": "INTERNAL"}},
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
            for i, event in enumerate(reply_events(reply)):
                # A slow model waits between pieces, but gives way to close().
                if i and delay_s and stopping.wait(delay_s):
                    return
                self._chunk(f"data: {json.dumps(event)}\r\n\r\n".encode())
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            # The agent hung up mid-stream (a cancel): nothing more to say.
            self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
