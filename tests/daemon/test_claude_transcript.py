"""Reading a Claude Code transcript for adoption: what counts as the conversation,
and the bounds on what is imported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
