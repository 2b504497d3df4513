"""A fake Gemini API on 127.0.0.1, for running the real Gemini CLI offline.

Gemini CLI reads ``GOOGLE_GEMINI_BASE_URL`` (its "gateway" auth type when set) and
sends ``POST /v1beta/models/MODEL:streamGenerateContent?alt=sse`` for a turn, and
``:generateContent`` / ``:countTokens`` for its side questions. The stream is
server-sent events, one ``data: {GenerateContentResponse}`` each:
``{candidates: [{content: {role: "model", parts: [...]}, finishReason?}],
usageMetadata?}``; a part is ``{text}`` or ``{functionCall: {name, args}}``.

Turn replies are scripted per test (``fake_http``'s rules: every request recorded,
``script(...)`` answering the next ``:streamGenerateContent`` requests in order, then
``default``, and a ``close()`` that never blocks): text streamed in chunks
(optionally slowly, or held, so a test can cancel mid-stream), a function call
(``run_shell_command``, which Gemini CLI asks the client's permission for), or an
HTTP error. ``:generateContent`` (its routing and "next speaker" side questions)
gets a short JSON text answer, ``:countTokens`` a small count; anything else is a
404, so nothing non-essential succeeds silently.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
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

__all__ = ["HttpError", "Recorded", "TextReply"]  # shared with fake_openai, named from here

MODEL = "gemini-2.5-flash"  # a model Gemini CLI knows, so it asks for nothing else
API_KEY = "fake-gemini-key"


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


Reply = TextReply | ShellCall | HttpError


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


class FakeGemini(FakeServer[Reply]):
    """The server; start it with ``running_fake_gemini()``."""

    def __init__(self) -> None:
        super().__init__(_Handler, TextReply("ok"))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def requests(self, action: str = ":streamGenerateContent") -> list[Recorded]:
        """Requests received so far whose path (without its query) ends with ``action``."""
        return self.recorded(lambda r: r.path.split("?")[0].endswith(action))

    def all_requests(self) -> list[Recorded]:
        return self.recorded()

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


class _Handler(JsonHandler):
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
        self._start_stream()
        try:
            for i, event in enumerate(reply_events(reply)):
                # A slow or held model waits between pieces, but gives way to close().
                if not before_piece(reply, i, self.server.fake.stopping):
                    return
                self._chunk(f"data: {json.dumps(event)}\r\n\r\n".encode())
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            # The agent hung up mid-stream (a cancel): nothing more to say.
            self.close_connection = True
