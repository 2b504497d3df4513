"""Conversation controls against the real Claude Code CLI, offline against
``fake_anthropic``: an image's bytes reach the model, an oversized one is refused
before anything is journaled, a queued prompt reaches the model only after the
running turn ended, an interrupt after a steer starts no turn of its own, and a
conversation started outside the daemon is adopted with its history."""

from __future__ import annotations

import base64
import os
import signal
import struct
import subprocess
import threading
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest

from agentsctl.client import Client
from agentsd_protocol.errors import RpcError
from tests.daemon_process import DaemonProcess, no_holder_config, running_daemon
from tests.e2e.test_sessions import DATABASE_NAME, db_rows, kill_carriers
from tests.peers.agents import CLAUDE_RELEASES, Release
from tests.peers.fake_anthropic import (
    FakeAnthropic,
    RecordedRequest,
    TextReply,
)
from tests.peers.test_claude import (
    CALL_TIMEOUT_S,
    CLAUDE_PROGRAM,
    Conversation,
    alarm,  # noqa: F401 (the autouse bound of every test here too)
    conversation,
    daemon,
    eventually,
    fake,
    home,
    journal_of,
    needs_claude,
)

__all__ = ["daemon", "fake", "home"]  # the fixtures this module shares with test_claude
pytestmark = needs_claude
MAX_IMAGE_BYTES = 5 * 1024 * 1024  # agentsd.attachments.MAX_IMAGE_BYTES


def tiny_png(width: int = 2, height: int = 2) -> bytes:
    """A valid RGB PNG (Claude Code may decode an image before sending it)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\0" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def image_blocks(request: RecordedRequest) -> list[dict[str, Any]]:
    """The image blocks of the user messages of a recorded Messages request."""
    found = []
    for message in request.messages:
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list):
            found += [b for b in content if isinstance(b, dict) and b.get("type") == "image"]
    return found


@pytest.mark.parametrize("release", CLAUDE_RELEASES, ids=lambda r: r.id)
def test_an_images_bytes_reach_the_model(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path, release: Release
) -> None:
    png = tiny_png()
    (home / "work" / "shot.png").write_bytes(png)
    fake.script(TextReply("A red square."))
    command = release.command()
    with conversation(daemon, fake.claude_env(home), home / "work", command=command) as convo:
        sent = convo.call(
            "agentSession.send",
            text="What is in this picture?",
            content=[{"type": "image", "path": "shot.png"}],
        )
        assert sent["dispatch"] == "accepted", sent
        assert convo.wait_for("turn.completed")["body"]["outcome"] == "completed"
        request = fake.message_requests()[-1]
        (image,) = image_blocks(request)
        assert image["source"] == {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(png).decode(),
        }
        # Claude Code ends the prompt's text with a newline of its own.
        assert "What is in this picture?" in [t.strip() for t in request.texts()]


def test_an_oversized_image_is_refused_before_anything_is_journaled(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    big = home / "work" / "big.png"
    big.write_bytes(tiny_png() + b"\0" * MAX_IMAGE_BYTES)
    with conversation(daemon, fake.claude_env(home), home / "work") as convo:
        before = convo.history()
        with pytest.raises(RpcError) as caught:
            convo.call(
                "agentSession.send", text="look", content=[{"type": "image", "path": str(big)}]
            )
        assert caught.value.kind == "attachment_refused"
        assert caught.value.details["reason"] == "too_large"
        assert convo.history() == before
        assert fake.message_requests() == []


def test_a_queued_prompt_reaches_the_model_only_after_the_running_turn_ended(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    story = "Once upon a time, " * 40
    held = threading.Event()  # the story's turn runs until the prompt is queued
    fake.script(TextReply(story, chunk_chars=5, hold=held), TextReply("Queued answer."))
    with conversation(daemon, fake.claude_env(home), home / "work") as convo:
        first = convo.send("Tell me a story")
        item = convo.wait_for("item.started")
        convo.wait_for_delta(item["body"]["itemId"])
        queued = convo.call("agentSession.send", text="QUEUED PROMPT", delivery="queue")
        assert queued["queued"] is True
        held.set()
        ended = convo.wait_for("turn.completed", lambda b: b.get("turnId") == first["turnId"])
        assert ended["body"]["outcome"] == "completed"
        submitted = convo.wait_for("submission", lambda b: b["text"] == "QUEUED PROMPT")
        assert submitted["seq"] > ended["seq"]
        done = convo.wait_for("turn.completed", after_seq=submitted["seq"])
        assert done["body"]["outcome"] == "completed"
        requests = fake.message_requests()
        # The story's request did not carry the queued prompt; the next one did,
        # after the whole story.
        carrying = [i for i, r in enumerate(requests) if "QUEUED PROMPT" in r.texts()]
        assert carrying and all(i > 0 for i in carrying)
        later = requests[carrying[0]]
        assert story.strip() in " ".join(later.texts())
        assert "QUEUED PROMPT" not in requests[0].texts()


@pytest.mark.parametrize("release", CLAUDE_RELEASES, ids=lambda r: r.id)
def test_an_interrupt_after_a_steer_starts_no_turn_of_its_own(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path, release: Release
) -> None:
    """Claude Code takes a prompt sent mid-turn up at the turn's next model call.
    Interrupting the turn before that must not leave the steered prompt to start
    a turn nobody asked for once the interrupted one ended: it is withdrawn, and
    the journal says so."""
    story = "Once upon a time, " * 200
    fake.script(TextReply(story, chunk_chars=5, delay_s=0.05))
    command = release.command()
    with conversation(daemon, fake.claude_env(home), home / "work", command=command) as convo:
        first = convo.send("Tell me a long story")
        item = convo.wait_for("item.started")
        convo.wait_for_delta(item["body"]["itemId"])
        steer = convo.send("And make it about a cat")
        assert steer["dispatch"] == "accepted", steer
        assert convo.call("agentSession.interrupt")["interrupted"] is True
        ended = convo.wait_for("turn.completed")
        assert ended["body"]["turnId"] == first["turnId"]
        assert ended["body"]["outcome"] == "interrupted"
        withdrawn = convo.wait_for(
            "submission.dispatched",
            lambda b: (
                b["clientMessageId"] == steer["clientMessageId"] and b["outcome"] == "rejected"
            ),
        )
        assert "interrupted" in withdrawn["body"]["reason"]
        # The agent is settled: a prompt sent now is answered as a turn of its own,
        # and no turn ran in between.
        fake.script(TextReply("Next answer."))
        again = convo.send("Are you there?")
        assert again["dispatch"] == "accepted"
        done = convo.wait_for("turn.completed", after_seq=ended["seq"])
        assert done["body"]["turnId"] == again["turnId"] != first["turnId"]
        assert done["body"]["outcome"] == "completed"
        assert [b["turnId"] for b in convo.of_kind("turn.started")] == [
            first["turnId"],
            again["turnId"],
        ]
        assert eventually(lambda: convo.info()["status"] == "idle", "the session is idle")
        requests = fake.message_requests()
        assert len(requests) == 2
        assert all("And make it about a cat" not in r.texts() for r in requests)
        assert "Are you there?" in [t.strip() for t in requests[1].texts()]


def claude_print(home: Path, fake: FakeAnthropic, prompt: str) -> str:
    """Run the real ``claude -p`` in ``home/work``, outside the daemon, as a user in
    a terminal would; the session id it used."""
    session_id = str(uuid.uuid4())
    assert CLAUDE_PROGRAM is not None
    subprocess.run(
        [CLAUDE_PROGRAM, "-p", prompt, "--session-id", session_id],
        cwd=home / "work",
        env={**os.environ, **fake.claude_env(home)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=CALL_TIMEOUT_S,
        check=True,
    )
    return session_id


def test_adopting_a_session_started_outside_brings_its_history_and_continues_it(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    fake.script(TextReply("Noted: KIWI."), TextReply("The word was KIWI."))
    handle = claude_print(home, fake, "Remember the word KIWI")
    assert len(fake.message_requests()) == 1
    with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
        created = client.call(
            "agentSession.create",
            {
                "provider": "claude",
                "cwd": str(home / "work"),
                "env": fake.claude_env(home),
                "resumeFrom": {"handle": handle},
            },
        )
        sid = created["sessionId"]
        assert created["session"]["providerHandle"] == handle
        convo = Conversation(client, sid)
        imported = [e["body"] for e in convo.history() if e["kind"] == "message.imported"]
        assert [(m["role"], m["text"]) for m in imported] == [
            ("user", "Remember the word KIWI"),
            ("assistant", "Noted: KIWI."),
        ]
        sent = convo.send("What was the word?")
        assert sent["dispatch"] == "accepted", sent
        assert convo.wait_for("turn.completed")["body"]["outcome"] == "completed"
        texts = [t.strip() for t in fake.message_requests()[-1].texts()]
        assert "Remember the word KIWI" in texts
        assert "Noted: KIWI." in texts
        assert texts.index("Remember the word KIWI") < texts.index("What was the word?")
        client.call("agentSession.delete", {"sessionId": sid})


def test_adopting_a_session_of_another_directory_or_account_fails_resume_failed(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    fake.script(TextReply("Noted."))
    handle = claude_print(home, fake, "Hello")
    elsewhere = home / "elsewhere"
    elsewhere.mkdir()
    other_account = {**fake.claude_env(home), "CLAUDE_CONFIG_DIR": str(home / "other")}
    with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
        for cwd, env in (
            (elsewhere, fake.claude_env(home)),
            (home / "work", other_account),
        ):
            with pytest.raises(RpcError) as caught:
                client.call(
                    "agentSession.create",
                    {
                        "provider": "claude",
                        "cwd": str(cwd),
                        "env": env,
                        "resumeFrom": {"handle": handle},
                    },
                )
            assert caught.value.kind == "resume_failed", caught.value
            sid = caught.value.details["sessionId"]
            kinds = [e["kind"] for e in journal_of(daemon, sid)]
            assert "message.imported" not in kinds and "child.ready" not in kinds
            # The failed session keeps the handle (conversation_in_use for another
            # adoption) until it is deleted, as a user retrying elsewhere would.
            client.call("agentSession.delete", {"sessionId": sid})
    assert len(fake.message_requests()) == 1  # only the terminal's own turn


def test_queued_prompts_survive_a_daemon_sigkill_paused_and_reach_claude_once_resumed(
    fake: FakeAnthropic, home: Path
) -> None:
    """Without the holder (``holder = false``): the crash ends Claude, the queue stays."""
    story = "Once upon a time, " * 400  # 5 chars per 50 ms: the turn outlives the daemon
    fake.script(TextReply(story, chunk_chars=5, delay_s=0.05), TextReply("Queued answer."))
    state = home / "state"
    tokens: list[str] = []
    try:
        with (
            no_holder_config() as config,
            running_daemon(state_dir=state, extra_args=config) as first,
            Client(first.socket, timeout_s=CALL_TIMEOUT_S) as client,
        ):
            params = {"provider": "claude", "cwd": str(home / "work"), "env": fake.claude_env(home)}
            sid = client.call("agentSession.create", params)["sessionId"]
            convo = Conversation(client, sid)
            convo.send("Tell me a long story")
            item = convo.wait_for("item.started")
            convo.wait_for_delta(item["body"]["itemId"])
            queued = convo.call("agentSession.send", text="QUEUED PROMPT", delivery="queue")
            assert queued["queued"] is True
            tokens = [r[0] for r in db_rows(state / DATABASE_NAME, "SELECT token FROM leases")]
            first.process.send_signal(signal.SIGKILL)
            assert first.wait() == -signal.SIGKILL
        with (
            no_holder_config() as config,
            running_daemon(state_dir=state, extra_args=config) as second,
            Client(second.socket, timeout_s=CALL_TIMEOUT_S) as client,
        ):
            convo = Conversation(client, sid)
            listed = convo.call("agentSession.queue")
            assert [p["text"] for p in listed["prompts"]] == ["QUEUED PROMPT"]
            assert listed["paused"] == "daemon-restart"
            assert all("QUEUED PROMPT" not in r.texts() for r in fake.message_requests())
            resumed = convo.call("agentSession.queue", action="resume")
            assert resumed["sent"]["dispatch"] == "accepted", resumed
            done = convo.wait_for(
                "turn.completed", lambda b: b.get("turnId") == resumed["sent"]["turnId"]
            )
            assert done["body"]["outcome"] == "completed"
            texts = [t.strip() for t in fake.message_requests()[-1].texts()]
            assert "QUEUED PROMPT" in texts
            assert "Tell me a long story" in texts  # the same conversation, resumed
            client.call("agentSession.delete", {"sessionId": sid})
    finally:
        kill_carriers(tokens)
