"""A fake OpenAI Responses API on 127.0.0.1, for driving the real ``codex`` offline.

Replies are scripted per test (``fake_http``'s rules: every request recorded,
``script(...)`` answering the next ``POST /v1/responses`` requests in order, then
``default``, and a ``close()`` that never blocks): text streamed in chunks
(optionally slowly, or held, so a test can interrupt mid-stream), a shell tool call
(so Codex asks for command approval), any function call, or an HTTP error.

Streams are server-sent events in chunked transfer encoding, as ``reqwest`` expects
of a stream without a length.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from tests.peers.fake_http import (
    FakeServer,
    HttpError,
    JsonHandler,
    Recorded,
    TextReply,
    before_piece,
)

__all__ = ["HttpError", "Recorded", "TextReply"]  # shared with fake_gemini, named from here

MODEL = "fake-model"
API_KEY_ENV = "FAKE_OPENAI_KEY"
_ids = itertools.count(1)


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


Reply = TextReply | ShellCall | FunctionCall | HttpError


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


class FakeOpenAI(FakeServer[Reply]):
    """The server; start it with ``running_fake_openai()``."""

    def __init__(self) -> None:
        super().__init__(_Handler, TextReply("ok"))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def requests(self, path_suffix: str = "/responses") -> list[Recorded]:
        """Requests received so far whose path ends with ``path_suffix``."""
        return self.recorded(lambda r: r.path.endswith(path_suffix))

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


class _Handler(JsonHandler):
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
        reply: Reply = self.server.fake.next_reply()
        if isinstance(reply, HttpError):
            self._send_json(
                reply.status,
                {"error": {"message": reply.message, "type": "invalid_request_error"}},
            )
            return
        self._start_stream()
        pieces = itertools.count()
        try:
            for event in reply_events(reply, f"resp_{next(_ids)}"):
                # A slow or held model waits between deltas, but gives way to close().
                delta = event["type"] == "response.output_text.delta"
                if delta and not before_piece(reply, next(pieces), self.server.fake.stopping):
                    return
                self._chunk(_sse(event))
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            # The agent hung up mid-stream (an interrupt): nothing more to say.
            self.close_connection = True


def shell_call_outputs(body: Any) -> Sequence[str]:
    """The outputs of function calls the agent reports back to the model."""
    return [
        str(item.get("output"))
        for item in (body or {}).get("input", [])
        if item.get("type") == "function_call_output"
    ]
