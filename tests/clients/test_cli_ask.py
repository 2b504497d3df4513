"""``agentsctl ask``, ``send --image/--file`` and ``new --resume-from`` end to end,
against a real daemon running the mock agent (which echoes prompts starting "echo ",
raises an approval for prompts containing "approve", and records each image it gets
as ``[image MEDIA_TYPE SHA256 LENGTH]``)."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agentsctl.ask import MARK
from agentsctl.cli import (
    EXIT_DAEMON_ERROR,
    EXIT_OK,
    EXIT_TURN_FAILED,
    EXIT_TURN_INTERRUPTED,
    EXIT_USAGE,
)
from agentsctl.daemon import quick_call
from agentsctl.render import Transcript
from tests.clients.test_cli_conversation import (
    EXIT_TIMEOUT_S,
    STREAM_TIMEOUT_S,
    _event,
    at,
    events,
    new_session,
    run,
    wait_for_event,
)
from tests.daemon_process import DaemonProcess

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(200))


def ask_sessions(daemon: DaemonProcess) -> list[dict[str, object]]:
    found = quick_call(daemon.socket, "agentSession.list", {})["sessions"]
    return [s for s in found if MARK in s["env"]]


def start_ask(daemon: DaemonProcess, cwd: Path, *argv: str) -> subprocess.Popen[str]:
    """``agentsctl ask`` in a subprocess run in ``cwd``."""
    return subprocess.Popen(
        [sys.executable, "-m", "agentsctl.cli", *at(daemon), "ask", *argv],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
    )


def created_in(daemon: DaemonProcess, cwd: Path) -> str:
    """The id of the ask session a subprocess creates in ``cwd``, once it exists."""
    deadline = time.monotonic() + STREAM_TIMEOUT_S
    while not (found := [s for s in ask_sessions(daemon) if s["cwd"] == str(cwd)]):
        if time.monotonic() >= deadline:
            raise AssertionError(f"no ask session in {cwd} within {STREAM_TIMEOUT_S} s")
        time.sleep(0.02)
    return str(found[0]["sessionId"])


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=STREAM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate(timeout=EXIT_TIMEOUT_S)
        raise AssertionError("ask did not exit") from None
    return process.returncode, out, err


def test_ask_creates_this_directorys_session_then_continues_it(
    daemon: DaemonProcess,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(daemon, capsys, "ask", "--provider", "mock", "echo hello there")
    assert code == EXIT_OK, err
    assert out == "hello there\n"
    (created,) = ask_sessions(daemon)
    sid = created["sessionId"]
    assert f"new mock session {sid} (default) in {tmp_path}" in err
    assert created["cwd"] == str(tmp_path)

    code, out, err = run(daemon, capsys, "ask", "--provider", "mock", "echo again")
    assert (code, out, err) == (EXIT_OK, "again\n", "")
    texts = [e["body"]["text"] for e in events(daemon, str(sid)) if e["kind"] == "submission"]
    assert texts == ["echo hello there", "echo again"]  # one conversation

    code, out, err = run(daemon, capsys, "ask", "--provider", "mock", "-s", "other", "echo two")
    assert code == EXIT_OK and out == "two\n"
    assert len(ask_sessions(daemon)) == 2
    elsewhere = tmp_path / "sub"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert run(daemon, capsys, "ask", "--provider", "mock", "echo here")[0] == EXIT_OK
    assert len(ask_sessions(daemon)) == 3  # another directory, another session


def test_ask_no_wait_returns_once_the_prompt_is_durable(
    daemon: DaemonProcess,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(daemon, capsys, "ask", "--provider", "mock", "--no-wait", "echo later")
    assert code == EXIT_OK
    assert out.startswith("seq ") and ": accepted" in out
    (session,) = ask_sessions(daemon)
    assert wait_for_event(daemon, str(session["sessionId"]), "submission")["body"]["text"] == (
        "echo later"
    )


def test_ask_exits_with_the_turns_outcome(daemon: DaemonProcess, tmp_path: Path) -> None:
    # An ask session made ahead, slow, so the turn can be interrupted mid-way.
    slow = ["--option", "chunks=200", "--option", "chunkDelayS=0.05", "--cwd", str(tmp_path)]
    sid = new_session(daemon, "--env", f"{MARK}=slow", *slow)
    process = start_ask(daemon, tmp_path, "--provider", "mock", "-s", "slow", "talk")
    wait_for_event(daemon, sid, "turn.started")
    assert quick_call(daemon.socket, "agentSession.interrupt", {"sessionId": sid})["interrupted"]
    code, _, err = finish(process)
    assert code == EXIT_TURN_INTERRUPTED, err
    assert "the turn interrupted" in err

    # The crash comes 3 s into the agent's life: after the prompt was delivered
    # (a CLI start), and before the 10 s turn ends.
    crashing = new_session(
        daemon,
        "--env",
        f"{MARK}=crash",
        "--option",
        "crashAfterS=3.0",
        "--option",
        "replyText=" + "long answer " * 40,  # 200 chunks of it: a 10 s turn
        *slow,
    )
    code, _, err = finish(start_ask(daemon, tmp_path, "--provider", "mock", "-s", "crash", "go"))
    assert code == EXIT_TURN_FAILED, err
    outcome = wait_for_event(daemon, crashing, "turn.completed")["body"]["outcome"]
    assert f"the turn {outcome}" in err


def test_ask_answers_no_approval_itself_and_says_how_to(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    process = start_ask(daemon, tmp_path, "--provider", "mock", "please approve this")
    sid = created_in(daemon, tmp_path)
    approval_id = wait_for_event(daemon, sid, "approval.requested")["body"]["approvalId"]
    assert process.poll() is None  # still waiting: nobody answered
    quick_call(
        daemon.socket,
        "agentSession.respond",
        {"sessionId": sid, "approvalId": approval_id, "decision": "accept"},
    )
    code, _, err = finish(process)
    assert code == EXIT_OK, err
    assert f"agentsctl approve {sid} {approval_id}" in err
    resolved = wait_for_event(daemon, sid, "approval.resolved")["body"]
    assert resolved["by"] == "client"


def test_send_attaches_images_and_files_from_the_clis_directory(
    daemon: DaemonProcess,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    sid = new_session(daemon)  # its cwd is the test's, not tmp_path
    (tmp_path / "shot.png").write_bytes(PNG)
    (tmp_path / "notes.txt").write_text("notes")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(
        daemon, capsys, "send", sid, "--image", "shot.png", "--file", "notes.txt", "echo see"
    )
    assert code == EXIT_OK, err
    assert ": accepted" in out
    (submission,) = [e for e in events(daemon, sid) if e["kind"] == "submission"]
    assert submission["body"]["attachments"] == [
        {
            "type": "image",
            "sha256": hashlib.sha256(PNG).hexdigest(),
            "byteLength": len(PNG),
            "mediaType": "image/png",
            "path": str(tmp_path / "shot.png"),
        },
        {"type": "file", "byteLength": 5, "path": str(tmp_path / "notes.txt")},
    ]
    # A text file is not an image.
    code, _, err = run(daemon, capsys, "send", sid, "--image", "notes.txt", "look")
    assert code == EXIT_DAEMON_ERROR
    assert "[attachment_refused]" in err
    assert run(daemon, capsys, "send", sid, "--image", "shot.png", " ")[0] == EXIT_USAGE


def test_new_resume_from_refuses_what_cannot_adopt(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(daemon, capsys, "new", "mock", "--resume-from", "abc")
    assert code == EXIT_DAEMON_ERROR
    assert "cannot adopt" in err and "[invalid_params]" in err
    code, _, err = run(daemon, capsys, "new", "codex", "--resume-from", "abc", "--stopped")
    assert code == EXIT_USAGE


def test_the_transcript_shows_attachments_and_imported_history() -> None:
    out = io.StringIO()
    transcript = Transcript(out)
    rows: list[tuple[str, dict[str, Any]]] = [
        ("session.created", {"provider": "codex", "cwd": "/w", "resumeFrom": "t-1"}),
        ("message.imported", {"role": "user", "text": "Remember KIWI"}),
        ("message.imported", {"role": "assistant", "text": "Noted."}),
        (
            "submission",
            {
                "clientMessageId": "m",
                "text": "look",
                "attachments": [
                    {"type": "image", "mediaType": "image/png", "byteLength": 9, "path": "/w/a.png"}
                ],
            },
        ),
    ]
    for seq, (kind, body) in enumerate(rows, 1):
        transcript.event(_event(seq, kind, **body))
    assert out.getvalue().splitlines() == [
        "-- session created (codex in /w, adopting t-1)",
        "> Remember KIWI",
        "Noted.",
        "> look",
        "  [image/png, 9 bytes] /w/a.png",
    ]


def test_queue_lists_what_a_queued_prompt_has_attached(
    daemon: DaemonProcess,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    sid = new_session(daemon, "--option", "chunks=400", "--option", "chunkDelayS=0.05")
    (tmp_path / "shot.png").write_bytes(PNG)
    monkeypatch.chdir(tmp_path)
    assert run(daemon, capsys, "send", sid, "go")[0] == EXIT_OK
    code, _, err = run(daemon, capsys, "send", "--queue", sid, "--image", "shot.png", "echo x")
    assert code == EXIT_OK, err
    code, out, _ = run(daemon, capsys, "queue", sid)
    assert code == EXIT_OK
    assert out.splitlines()[0].endswith("'echo x' (+1 attached)")
    quick_call(daemon.socket, "agentSession.interrupt", {"sessionId": sid})
