"""Reading a Claude Code transcript for adoption: what counts as the conversation,
and the bounds on what is imported."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agentsd.providers import claude_transcript
from agentsd.providers.claude_transcript import project_slug, transcript_history
from agentsd.providers.imported import MAX_IMPORTED_MESSAGES, MAX_IMPORTED_TEXT_BYTES


def write(path: Path, *entries: Any) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries) + "not json\n")
    return path


def user(content: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "user", "message": {"role": "user", "content": content}, **extra}


def assistant(message_id: str, *blocks: dict[str, Any]) -> dict[str, Any]:
    message = {"id": message_id, "role": "assistant", "content": list(blocks)}
    return {"type": "assistant", "message": message}


def test_the_slug_is_the_cwd_with_every_other_character_a_dash() -> None:
    assert project_slug("/tmp/ad-ar_1ff5q/work") == "-tmp-ad-ar-1ff5q-work"
    assert project_slug("/home/me/src/my.app") == "-home-me-src-my-app"


def test_only_what_the_user_saw_is_imported(tmp_path: Path) -> None:
    path = write(
        tmp_path / "t.jsonl",
        {"type": "queue-operation", "operation": "enqueue", "content": "hi"},
        user("Fix the bug"),
        user("<command-name>/model</command-name>", isMeta=True),
        assistant("m1", {"type": "thinking", "thinking": "hmm"}),
        assistant("m1", {"type": "text", "text": "Looking."}),
        assistant("m1", {"type": "tool_use", "id": "t", "name": "Bash", "input": {}}),
        user([{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]),
        assistant("m2", {"type": "text", "text": "Fixed"}),
        assistant("m2", {"type": "text", "text": "it."}),
        user([{"type": "text", "text": "Thanks"}]),
        user("side", isSidechain=True),
        {"type": "api-request-blob", "message": {"role": "user", "content": "internal"}},
    )
    assert [(m.role, m.text) for m in transcript_history(path)] == [
        ("user", "Fix the bug"),
        ("assistant", "Looking."),
        ("assistant", "Fixed\n\nit."),
        ("user", "Thanks"),
    ]


def test_the_import_is_bounded(tmp_path: Path) -> None:
    many = [user(f"prompt {i}") for i in range(MAX_IMPORTED_MESSAGES + 5)]
    long = user("x" * (MAX_IMPORTED_TEXT_BYTES + 10))
    messages = transcript_history(write(tmp_path / "t.jsonl", *many, long))
    assert len(messages) == MAX_IMPORTED_MESSAGES
    assert messages[0].text == "prompt 6"  # the latest ones
    assert messages[-1].truncated and len(messages[-1].text) == MAX_IMPORTED_TEXT_BYTES


def test_a_symlink_or_a_device_is_refused_not_read(tmp_path: Path) -> None:
    """The agent writes under its config dir: a transcript pointing at /dev/zero
    would otherwise be read until memory runs out."""
    link = tmp_path / "zero.jsonl"
    link.symlink_to("/dev/zero")
    with pytest.raises(OSError, match="symbolic link"):
        transcript_history(link)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)  # no writer: a plain open would block forever
    with pytest.raises(OSError, match="not a regular file"):
        transcript_history(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        transcript_history(Path("/dev/zero"))


def test_an_over_long_line_is_skipped_and_the_rest_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claude_transcript, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(claude_transcript, "SKIP_CHUNK_BYTES", 64)
    huge = user("x" * 5000)
    path = write(tmp_path / "t.jsonl", user("before"), huge, user("after"))
    assert [m.text for m in transcript_history(path)] == ["before", "after"]


def test_reading_stops_at_the_bound_even_without_a_newline(tmp_path: Path) -> None:
    """A sparse file of zeros far past ``MAX_TRANSCRIPT_BYTES`` with no newline
    before a valid line: the line is never reached, and nothing is imported."""
    path = tmp_path / "t.jsonl"
    with path.open("wb") as f:
        f.truncate(claude_transcript.MAX_TRANSCRIPT_BYTES * 4)
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + json.dumps(user("past the bound")).encode() + b"\n")
    assert transcript_history(path) == []


def test_the_bound_counts_every_line_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claude_transcript, "MAX_TRANSCRIPT_BYTES", 2000)
    early = [user(f"message {i}") for i in range(5)]
    path = write(tmp_path / "t.jsonl", *early, user("y" * 3000), user("late"))
    texts = [m.text for m in transcript_history(path)]
    assert texts == [f"message {i}" for i in range(5)]
