"""Conversation controls against the real ``codex app-server``, offline against
``fake_openai``: an image's bytes reach the model, an oversized one is refused
before anything is journaled, a queued prompt reaches the model only after the
running turn ended, and a thread started outside the daemon (by ``codex exec``) is
adopted with its history and continued."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from agentsctl.client import Client
from agentsd.providers.programs import CODEX, find_program
from agentsd_protocol.errors import RpcError
from tests.daemon_process import DaemonProcess, no_holder_config, running_daemon
from tests.e2e.test_sessions import DATABASE_NAME, db_rows, kill_carriers
from tests.peers.agents import CODEX_RELEASES, Release
from tests.peers.codex_peer import create_codex, send
from tests.peers.conftest import CALL_TIMEOUT_S, Deadline, Follower
from tests.peers.fake_openai import FakeOpenAI, TextReply, input_texts
from tests.peers.test_claude_prompts import MAX_IMAGE_BYTES, tiny_png

pytestmark = pytest.mark.skipif(
    find_program(CODEX) is None, reason="codex is not installed (the test extras ship it)"
)


def input_images(body: Any) -> list[str]:
    """The image URLs of the user messages of a Responses request body."""
    out: list[str] = []
    for item in (body or {}).get("input", []):
        if item.get("type") == "message" and item.get("role") == "user":
            for span in item.get("content") or []:
                if span.get("type") == "input_image":
                    out.append(str(span.get("image_url")))
    return out


def history(client: Client, sid: str) -> list[dict[str, Any]]:
    page = client.call("agentSession.history", {"sessionId": sid, "limit": 1000})
    events: list[dict[str, Any]] = page["events"]
    return events


@pytest.mark.parametrize("release", CODEX_RELEASES, ids=lambda r: r.id)
def test_an_images_bytes_reach_the_model(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
    release: Release,
) -> None:
    png = tiny_png()
    (workdir / "shot.png").write_bytes(png)
    fake.script(TextReply("A red square."))
    params = {"provider": "codex", "cwd": str(workdir), "env": codex_env}
    sid = client.call("agentSession.create", {**params, "command": release.command()})["sessionId"]
    with Follower(peer_daemon, sid, deadline) as follower:
        sent = client.call(
            "agentSession.send",
            {
                "sessionId": sid,
                "text": "What is in this picture?",
                "content": [{"type": "image", "path": "shot.png"}],
            },
        )
        assert sent["dispatch"] == "accepted", sent
        assert follower.wait_for("turn.completed")["body"]["outcome"] == "completed"
    (request,) = fake.requests()
    assert input_texts(request.body, "user")[-1] == "What is in this picture?"
    assert input_images(request.body) == ["data:image/png;base64," + base64.b64encode(png).decode()]


def test_an_oversized_image_is_refused_before_anything_is_journaled(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
) -> None:
    big = workdir / "big.png"
    big.write_bytes(tiny_png() + b"\0" * MAX_IMAGE_BYTES)
    sid = create_codex(client, workdir, codex_env)["sessionId"]
    before = history(client, sid)
    with pytest.raises(RpcError) as caught:
        client.call(
            "agentSession.send",
            {"sessionId": sid, "text": "look", "content": [{"type": "image", "path": str(big)}]},
        )
    assert caught.value.kind == "attachment_refused"
    assert caught.value.details["reason"] == "too_large"
    assert history(client, sid) == before
    assert fake.requests() == []


def test_a_queued_prompt_reaches_the_model_only_after_the_running_turn_ended(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    talk = "word " * 60
    held = threading.Event()  # the first turn runs until the prompt is queued
    fake.script(TextReply(talk, chunks=60, hold=held), TextReply("Queued answer."))
    sid = create_codex(client, workdir, codex_env)["sessionId"]
    with Follower(peer_daemon, sid, deadline) as follower:
        first = send(client, sid, "Talk for a while")
        follower.wait_for_delta()
        queued = client.call(
            "agentSession.send",
            {"sessionId": sid, "text": "QUEUED PROMPT", "delivery": "queue"},
        )
        assert queued["queued"] is True
        held.set()
        ended = follower.wait_for("turn.completed", lambda b: b["turnId"] == first["turnId"])
        assert ended["body"]["outcome"] == "completed"
        submitted = follower.wait_for("submission", lambda b: b["text"] == "QUEUED PROMPT")
        assert submitted["seq"] > ended["seq"]
        done = follower.wait_for("turn.completed", lambda b: b["turnId"] != first["turnId"])
        assert done["body"]["outcome"] == "completed"
    first_request, second_request = fake.requests()
    assert "QUEUED PROMPT" not in input_texts(first_request.body, "user")
    assert input_texts(second_request.body, "user")[-1] == "QUEUED PROMPT"
    # The second request carries the whole first answer: it came after that turn.
    assert talk.strip() in " ".join(input_texts(second_request.body, "assistant")).strip()


def codex_exec(workdir: Path, codex_env: dict[str, str], prompt: str) -> str:
    """Run the real ``codex exec`` in ``workdir``, outside the daemon, as a user in a
    terminal would; the id of the thread it started."""
    program = find_program(CODEX)
    assert program is not None
    done = subprocess.run(
        [program, "exec", "--skip-git-repo-check", "--json", prompt],
        cwd=workdir,
        env={**os.environ, **codex_env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=CALL_TIMEOUT_S,
        check=True,
    )
    for line in done.stdout.decode().splitlines():
        event = json.loads(line)
        if event.get("type") == "thread.started":
            return str(event["thread_id"])
    raise AssertionError(f"codex exec started no thread: {done.stdout!r}")


def test_adopting_a_thread_started_outside_brings_its_history_and_continues_it(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(TextReply("Noted: KIWI."), TextReply("The word was KIWI."))
    thread_id = codex_exec(workdir, codex_env, "Remember the word KIWI")
    assert len(fake.requests()) == 1
    created = client.call(
        "agentSession.create",
        {
            "provider": "codex",
            "cwd": str(workdir),
            "env": codex_env,
            "resumeFrom": {"handle": thread_id},
        },
    )
    sid = created["sessionId"]
    assert created["session"]["providerHandle"] == thread_id
    events = history(client, sid)
    imported = [e["body"] for e in events if e["kind"] == "message.imported"]
    assert [(m["role"], m["text"]) for m in imported] == [
        ("user", "Remember the word KIWI"),
        ("assistant", "Noted: KIWI."),
    ]
    kinds = [e["kind"] for e in events]
    assert kinds.index("message.imported") < kinds.index("child.ready")
    assert "submission" not in kinds  # nothing was sent again
    with Follower(peer_daemon, sid, deadline) as follower:
        sent = send(client, sid, "What was the word?")
        assert sent["dispatch"] == "accepted", sent
        assert follower.wait_for("turn.completed")["body"]["outcome"] == "completed"
    _, request = fake.requests()
    assert input_texts(request.body, "user")[-1] == "What was the word?"
    assert "Remember the word KIWI" in input_texts(request.body, "user")
    assert "Noted: KIWI." in input_texts(request.body, "assistant")
    # A restart of the adopted session resumes it; nothing is imported twice.
    client.call("agentSession.close", {"sessionId": sid})
    client.call("agentSession.start", {"sessionId": sid})
    again = [e for e in history(client, sid) if e["kind"] == "message.imported"]
    assert len(again) == 2


def test_adopting_a_thread_of_another_directory_or_none_fails_resume_failed(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
) -> None:
    fake.script(TextReply("Noted."))
    thread_id = codex_exec(workdir, codex_env, "Hello")
    elsewhere = workdir.parent / "elsewhere"
    elsewhere.mkdir()
    for cwd, handle in (
        (elsewhere, thread_id),
        (workdir, "01a23293-7749-78c2-b918-2f5e48e020d7"),  # no such thread here
    ):
        with pytest.raises(RpcError) as caught:
            client.call(
                "agentSession.create",
                {
                    "provider": "codex",
                    "cwd": str(cwd),
                    "env": codex_env,
                    "resumeFrom": {"handle": handle},
                },
            )
        assert caught.value.kind == "resume_failed", caught.value
        sid = caught.value.details["sessionId"]
        kinds = [e["kind"] for e in history(client, sid)]
        assert "message.imported" not in kinds and "child.ready" not in kinds
    assert len(fake.requests()) == 1  # only the terminal's own turn


def test_queued_prompts_survive_a_daemon_sigkill_paused_and_reach_codex_once_resumed(
    fake: FakeOpenAI, codex_env: dict[str, str], workdir: Path, deadline: Deadline
) -> None:
    """Without the holder (``holder = false``): the crash ends Codex, the queue stays."""
    talk = "word " * 400  # 400 chunks 50 ms apart: the turn outlives the daemon
    fake.script(TextReply(talk, chunks=400, chunk_delay_s=0.05), TextReply("Queued answer."))
    state = workdir.parent / "state"
    tokens: list[str] = []
    try:
        with (
            no_holder_config() as config,
            running_daemon(state_dir=state, extra_args=config) as first,
        ):
            with Client(first.socket, timeout_s=CALL_TIMEOUT_S) as client:
                sid = create_codex(client, workdir, codex_env)["sessionId"]
                with Follower(first, sid, deadline) as follower:
                    send(client, sid, "Talk for a while")
                    follower.wait_for_delta()
                    queued = client.call(
                        "agentSession.send",
                        {"sessionId": sid, "text": "QUEUED PROMPT", "delivery": "queue"},
                    )
                    assert queued["queued"] is True
            tokens = [r[0] for r in db_rows(state / DATABASE_NAME, "SELECT token FROM leases")]
            first.process.send_signal(signal.SIGKILL)
            assert first.wait() == -signal.SIGKILL

        with (
            no_holder_config() as config,
            running_daemon(state_dir=state, extra_args=config) as second,
            Client(second.socket, timeout_s=CALL_TIMEOUT_S) as client,
        ):
            listed = client.call("agentSession.queue", {"sessionId": sid})
            assert [p["text"] for p in listed["prompts"]] == ["QUEUED PROMPT"]
            assert listed["paused"] == "daemon-restart"
            assert len(fake.requests()) == 1  # never sent on its own
            with Follower(second, sid, deadline) as follower:
                resumed = client.call("agentSession.queue", {"sessionId": sid, "action": "resume"})
                assert resumed["sent"]["dispatch"] == "accepted", resumed
                done = follower.wait_for(
                    "turn.completed", lambda b: b["turnId"] == resumed["sent"]["turnId"]
                )
                assert done["body"]["outcome"] == "completed"
            client.call("agentSession.close", {"sessionId": sid})
        last = fake.requests()[-1]
        assert input_texts(last.body, "user")[-1] == "QUEUED PROMPT"
        assert "Talk for a while" in input_texts(last.body, "user")  # the same thread
    finally:
        kill_carriers(tokens)


def test_an_image_alone_is_a_prompt(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    png = tiny_png()
    fake.script(TextReply("A red square."))
    sid = create_codex(client, workdir, codex_env)["sessionId"]
    inline = {"type": "image", "data": base64.b64encode(png).decode(), "mediaType": "image/png"}
    with Follower(peer_daemon, sid, deadline) as follower:
        sent = client.call("agentSession.send", {"sessionId": sid, "content": [inline]})
        assert sent["dispatch"] == "accepted", sent
        assert follower.wait_for("turn.completed")["body"]["outcome"] == "completed"
    (request,) = fake.requests()
    assert input_images(request.body) == ["data:image/png;base64," + inline["data"]]
