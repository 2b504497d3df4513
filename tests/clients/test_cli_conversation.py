"""``agentsctl`` conversation commands end to end: send, log, interrupt, approve,
new -m and attach, against a real daemon running the mock agent (which raises an
approval for prompts containing "approve" and echoes prompts starting "echo ").

In-process ``main(argv)`` where the command ends by itself; a subprocess (stdout
read by a thread, every wait under a deadline) for the streams, which end by SIGINT.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pty
import queue
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentsctl.attach import approve_command
from agentsctl.cli import (
    EXIT_BROKEN_PIPE,
    EXIT_DAEMON_ERROR,
    EXIT_OK,
    EXIT_SESSION_GONE,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    main,
)
from agentsctl.daemon import quick_call
from agentsctl.follow import CaughtUp, Follower, Note, SessionGone
from agentsctl.render import Transcript
from agentsctl.target import Target
from agentsd_protocol.api.stream import DeltaNotification, JournalEvent
from agentsd_protocol.errors import SessionNotFound
from tests.clients.conftest import FakeDaemon, Peer
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon

STREAM_TIMEOUT_S = 30.0  # for one expected line from a streaming CLI on a loaded machine
EXIT_TIMEOUT_S = 15.0  # for a CLI to exit after SIGINT or its session's deletion
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|\r")


def at(daemon: DaemonProcess) -> list[str]:
    return ["--socket", str(daemon.socket)]


def new_session(daemon: DaemonProcess, *extra: str) -> str:
    """A running mock session's id, created through the CLI in a subprocess (so the
    test's own stdout capture stays clean)."""
    done = subprocess.run(
        [sys.executable, "-m", "agentsctl.cli", *at(daemon), "new", "--provider", "mock", *extra],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=STREAM_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == EXIT_OK, done.stderr
    return done.stdout.splitlines()[0].strip()


def run(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str]:
    """``main`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = main([*at(daemon), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def events(daemon: DaemonProcess, session_id: str) -> list[dict[str, Any]]:
    result = quick_call(
        daemon.socket, "agentSession.history", {"sessionId": session_id, "limit": 1000}
    )
    found: list[dict[str, Any]] = result["events"]
    return found


def wait_for_event(
    daemon: DaemonProcess, session_id: str, kind: str, timeout_s: float = STREAM_TIMEOUT_S
) -> dict[str, Any]:
    """The last journal event of ``kind``, polled for under a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [e for e in events(daemon, session_id) if e["kind"] == kind]
        if found:
            return found[-1]
        if time.monotonic() >= deadline:
            raise AssertionError(f"no {kind} in {session_id}'s journal within {timeout_s} s")
        time.sleep(0.02)


def wait_until_idle(daemon: DaemonProcess, session_id: str) -> None:
    deadline = time.monotonic() + STREAM_TIMEOUT_S
    while (
        quick_call(daemon.socket, "agentSession.get", {"sessionId": session_id})["session"][
            "status"
        ]
        != "idle"
    ):
        if time.monotonic() >= deadline:
            raise AssertionError(f"{session_id} still busy after {STREAM_TIMEOUT_S} s")
        time.sleep(0.02)


def pending_approval(daemon: DaemonProcess, session_id: str) -> str:
    approval_id: str = wait_for_event(daemon, session_id, "approval.requested")["body"][
        "approvalId"
    ]
    return approval_id


class Cli:
    """A CLI subprocess whose stdout is read line by line by a thread."""

    def __init__(self, *argv: str, stdin: int | None = subprocess.DEVNULL) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agentsctl.cli", *argv],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "NO_COLOR": "1"},
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        assert self.process.stdout is not None
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()

    def _read(self, stream: io.TextIOBase) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout_s: float = STREAM_TIMEOUT_S) -> str:
        """The first new line matching ``pattern`` (a regex); AssertionError at the
        deadline or at EOF, showing what was read."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(0.0, remaining))
            except queue.Empty:
                raise AssertionError(
                    f"no line matching {pattern!r} within {timeout_s} s; read:\n"
                    + "\n".join(self.lines)
                ) from None
            if line is None:
                raise AssertionError(
                    f"EOF before a line matching {pattern!r} (exit {self.process.poll()}); "
                    f"read:\n" + "\n".join(self.lines) + f"\nstderr:\n{self.stderr()}"
                )
            self.lines.append(line)
            if re.search(pattern, line):
                return line

    def interrupt(self) -> int:
        """SIGINT, then the exit status (killed and failed after EXIT_TIMEOUT_S)."""
        self.process.send_signal(signal.SIGINT)
        return self.wait()

    def wait(self) -> int:
        try:
            return self.process.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=EXIT_TIMEOUT_S)
            raise AssertionError(f"the CLI did not exit within {EXIT_TIMEOUT_S} s") from None

    def rest(self) -> list[str]:
        """Every line after the process exited."""
        while (line := self._queue.get(timeout=EXIT_TIMEOUT_S)) is not None:
            self.lines.append(line)
        return self.lines

    def stderr(self) -> str:
        if self.process.poll() is None or self.process.stderr is None:
            return "(still running)"
        return self.process.stderr.read()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=EXIT_TIMEOUT_S)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    """One real agentsd for this module's tests: each makes its own sessions and none
    stops or reconfigures it (the restart test runs daemons of its own), so a start
    per test (23 of them) bought nothing."""
    with running_daemon() as process:
        yield process


@pytest.fixture
def clis() -> Iterator[list[Cli]]:
    """CLI subprocesses a test starts; every one is killed if still running after."""
    started: list[Cli] = []
    yield started
    for cli in started:
        cli.close()


# -- send -------------------------------------------------------------------------


def test_send_prints_the_seq_and_the_dispatch_outcome(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon)
    code, out, _ = run(daemon, capsys, "send", session_id, "echo", "hello", "world")
    assert code == EXIT_OK
    match = re.fullmatch(r"seq (\d+): accepted(, turn \S+)?\n", out)
    assert match, out
    submission = events(daemon, session_id)[int(match.group(1)) - 1]
    assert submission["kind"] == "submission"
    assert submission["body"]["text"] == "echo hello world"
    assert submission["body"]["operationId"]  # a clientOperationId went with it
    wait_until_idle(daemon, session_id)

    code, out, _ = run(daemon, capsys, "send", session_id, "--json", "echo again")
    assert code == EXIT_OK
    result = json.loads(out)
    assert result["dispatch"] == "accepted"
    assert isinstance(result["seq"], int) and result["seq"] > int(match.group(1))


def test_each_send_is_a_new_operation(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon)
    for _ in range(2):
        assert run(daemon, capsys, "send", session_id, "echo same")[0] == EXIT_OK
        wait_until_idle(daemon, session_id)
    submissions = [e["body"] for e in events(daemon, session_id) if e["kind"] == "submission"]
    assert [s["text"] for s in submissions] == ["echo same", "echo same"]
    assert submissions[0]["operationId"] != submissions[1]["operationId"]


def test_send_to_an_unknown_session_exits_1(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(daemon, capsys, "send", "no-such-session", "hello")
    assert code == EXIT_DAEMON_ERROR
    assert err.strip().endswith("[session_not_found]"), err


# -- new -m -----------------------------------------------------------------------


def test_new_with_a_message_creates_and_sends(
    daemon: DaemonProcess,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(daemon, capsys, "new", "--provider", "mock", "-m", "echo first words")
    assert code == EXIT_OK
    session_id = out.strip()
    assert re.fullmatch(r"\S+", session_id), out
    session = quick_call(daemon.socket, "agentSession.get", {"sessionId": session_id})["session"]
    assert session["cwd"] == str(tmp_path)  # --cwd defaults to here, made absolute
    completed = wait_for_event(daemon, session_id, "item.completed")
    assert completed["body"]["text"] == "first words"

    code, out, _ = run(daemon, capsys, "new", "mock", "--cwd", ".", "-m", "echo x", "--json")
    assert code == EXIT_OK
    document = json.loads(out)
    assert document["session"]["cwd"] == str(tmp_path)
    assert document["send"]["dispatch"] == "accepted"


# -- log --------------------------------------------------------------------------


def test_log_prints_the_conversation_as_text_json_and_jsonl(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon, "-m", "echo the answer is 42")
    wait_for_event(daemon, session_id, "turn.completed")
    journal = events(daemon, session_id)

    code, out, _ = run(daemon, capsys, "log", session_id)
    assert code == EXIT_OK
    lines = out.splitlines()
    assert "> echo the answer is 42" in lines
    assert lines[lines.index("> echo the answer is 42") + 1] == "the answer is 42"

    code, out, _ = run(daemon, capsys, "log", session_id, "--json")
    assert code == EXIT_OK
    document = json.loads(out)
    assert document["sessionId"] == session_id
    assert [e["seq"] for e in document["events"]] == [e["seq"] for e in journal]

    code, out, _ = run(daemon, capsys, "log", session_id, "--jsonl", "--after-seq", "2")
    assert code == EXIT_OK
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows == journal[2:]


def test_log_pages_through_a_long_journal(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon, "--option", "chunks=1")
    for n in range(5):
        assert run(daemon, capsys, "send", session_id, f"echo {n}")[0] == EXIT_OK
        wait_until_idle(daemon, session_id)
    journal = events(daemon, session_id)
    import agentsctl.commands_conversation as conversation

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(conversation, "LOG_PAGE_EVENTS", 7)  # many pages, odd boundaries
        code, out, _ = run(daemon, capsys, "log", session_id, "--jsonl")
    assert code == EXIT_OK
    assert [json.loads(line)["seq"] for line in out.splitlines()] == [e["seq"] for e in journal]


def test_log_follow_jsonl_streams_new_events(daemon: DaemonProcess, clis: list[Cli]) -> None:
    session_id = new_session(daemon)
    head = len(events(daemon, session_id))
    cli = Cli(*at(daemon), "log", session_id, "--follow", "--jsonl")
    clis.append(cli)
    for _ in range(head):
        json.loads(cli.wait_for(r"^\{"))  # the catch-up
    quick_call(
        daemon.socket, "agentSession.send", {"sessionId": session_id, "text": "echo streamed"}
    )
    seen: list[dict[str, Any]] = []
    while not any(e["kind"] == "turn.completed" for e in seen):
        seen.append(json.loads(cli.wait_for(r"^\{")))
    assert [e["seq"] for e in seen] == list(range(head + 1, head + 1 + len(seen)))
    assert {"kind": "item.completed"}.items() <= next(
        e for e in seen if e["kind"] == "item.completed"
    ).items()
    assert all(e["kind"] != "delta" for e in seen)  # the log is the journal
    assert cli.interrupt() == EXIT_OK


def test_log_follow_shows_streamed_text_once(daemon: DaemonProcess, clis: list[Cli]) -> None:
    session_id = new_session(daemon, "--option", "chunks=12")
    cli = Cli(*at(daemon), "log", session_id, "--follow")
    clis.append(cli)
    cli.wait_for(r"agent ready")
    text = "echo " + " ".join(f"word{n}" for n in range(30))
    quick_call(daemon.socket, "agentSession.send", {"sessionId": session_id, "text": text})
    cli.wait_for(re.escape("> " + text))
    line = cli.wait_for(r"word29")
    assert line == text.removeprefix("echo "), line  # deltas and snapshots, never twice
    assert cli.interrupt() == EXIT_OK


# -- interrupt --------------------------------------------------------------------


def test_interrupt_with_nothing_running_says_so(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon)
    code, out, _ = run(daemon, capsys, "interrupt", session_id)
    assert code == EXIT_OK
    assert out == f"{session_id}: nothing to interrupt (no turn is running)\n"
    code, out, _ = run(daemon, capsys, "interrupt", session_id, "--json")
    assert code == EXIT_OK
    assert json.loads(out) == {"interrupted": False, "reason": "no turn is running", "seq": None}


def test_interrupt_ends_a_running_turn(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon, "--option", "chunks=200", "--option", "chunkDelayS=0.05")
    assert run(daemon, capsys, "send", session_id, "echo " + "long " * 200)[0] == EXIT_OK
    wait_for_event(daemon, session_id, "turn.started")
    code, out, _ = run(daemon, capsys, "interrupt", session_id)
    assert code == EXIT_OK
    assert out == f"{session_id}: interrupted\n"
    assert wait_for_event(daemon, session_id, "turn.completed")["body"]["outcome"] == "interrupted"


# -- approve ----------------------------------------------------------------------


def test_approve_accepts_and_a_second_answer_is_already_resolved(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon, "-m", "please approve this")
    approval_id = pending_approval(daemon, session_id)
    code, out, _ = run(daemon, capsys, "approve", session_id, approval_id)
    assert code == EXIT_OK
    assert re.fullmatch(rf"{approval_id}: accept \(seq \d+\)\n", out), out
    resolved = wait_for_event(daemon, session_id, "approval.resolved")["body"]
    assert resolved["decision"] == "accept"
    tool = wait_for_event(daemon, session_id, "item.completed")["body"]
    assert tool["status"] == "completed"

    code, _, err = run(daemon, capsys, "approve", session_id, approval_id, "--decline")
    assert code == EXIT_DAEMON_ERROR
    assert err == (
        f"error: approval {approval_id} was already answered by client: accept [already_resolved]\n"
    )


def test_approve_declines(daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]) -> None:
    session_id = new_session(daemon, "-m", "approve it")
    approval_id = pending_approval(daemon, session_id)
    code, out, _ = run(daemon, capsys, "approve", session_id, approval_id, "--decline", "--json")
    assert code == EXIT_OK
    assert json.loads(out)["decision"] == "decline"
    assert wait_for_event(daemon, session_id, "approval.resolved")["body"]["decision"] == "decline"
    completed = wait_for_event(daemon, session_id, "turn.completed")
    texts = [
        e["body"].get("text") for e in events(daemon, session_id) if e["kind"] == "item.completed"
    ]
    assert "Command declined." in texts
    assert completed["body"]["outcome"] == "completed"


def test_approve_with_a_decision_the_approval_does_not_offer_exits_1(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon, "-m", "approve")
    approval_id = pending_approval(daemon, session_id)
    code, _, err = run(daemon, capsys, "approve", session_id, approval_id, "--decision", "maybe")
    assert code == EXIT_DAEMON_ERROR
    assert err.strip().endswith("[invalid_params]"), err


# -- mutations across a dropped connection ------------------------------------------


def test_a_mutation_is_retried_once_with_the_same_operation_id(
    fake_daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[dict[str, Any]] = []

    def script(first: Peer) -> None:
        seen.append(first.recv())  # taken, then the connection drops before the reply
        first.conn.close()
        conn, _ = fake_daemon._listener.accept()
        with conn:
            second = Peer(conn)
            request = second.recv()
            seen.append(request)
            second.reply(request, {"approvalId": "ap-1", "decision": "accept", "seq": 9})
            second.wait_closed()

    fake_daemon.serve(script)
    code = main(["--no-start", "--socket", str(fake_daemon.path), "approve", "s1", "ap-1"])
    fake_daemon.finish()
    out, err = capsys.readouterr()
    assert code == EXIT_OK, err
    assert out == "ap-1: accept (seq 9)\n"
    assert "retrying agentSession.respond" in err
    first, second = (request["params"] for request in seen)
    assert first == second
    assert re.fullmatch(r"[0-9a-f-]{36}", first["clientOperationId"])
    assert first["decision"] == "accept"


def test_a_second_drop_exits_3(fake_daemon: FakeDaemon, capsys: pytest.CaptureFixture[str]) -> None:
    def script(first: Peer) -> None:
        first.recv()
        first.conn.close()
        conn, _ = fake_daemon._listener.accept()
        with conn:
            Peer(conn).recv()

    fake_daemon.serve(script)
    code = main(["--no-start", "--socket", str(fake_daemon.path), "interrupt", "s1"])
    fake_daemon.finish()
    assert code == EXIT_UNREACHABLE
    assert "closed the connection" in capsys.readouterr().err


# -- attach -----------------------------------------------------------------------


def test_attach_without_a_terminal_streams_and_hints_and_detaches_on_sigint(
    daemon: DaemonProcess, clis: list[Cli], capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon, "-m", "echo before attaching")
    wait_until_idle(daemon, session_id)
    cli = Cli(*at(daemon), "attach", session_id)
    clis.append(cli)
    cli.wait_for(r"^> echo before attaching$")
    cli.wait_for(r"^before attaching$")  # caught up from the journal
    assert run(daemon, capsys, "send", session_id, "echo live words")[0] == EXIT_OK
    cli.wait_for(r"^> echo live words$")
    cli.wait_for(r"^live words$")
    assert run(daemon, capsys, "send", session_id, "now approve something")[0] == EXIT_OK
    approval_id = pending_approval(daemon, session_id)
    cli.wait_for(rf"^\? approval {approval_id} \(command\): Run `ls -la`$")
    hint = cli.wait_for(r"^  to accept: ")
    assert (
        hint
        == f"  to accept: agentsctl --socket {daemon.socket} approve {session_id} {approval_id}"
    )
    cli.wait_for(rf"^  to decline: .* approve {session_id} {approval_id} --decline$")

    assert cli.interrupt() == EXIT_OK
    assert "detached" in cli.stderr()
    session = quick_call(daemon.socket, "agentSession.get", {"sessionId": session_id})["session"]
    assert (session["phase"], session["status"]) == ("running", "attention")


def test_attach_answers_an_approval_from_the_terminal(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon)
    master, slave = pty.openpty()
    cooked = termios.tcgetattr(slave)
    process = subprocess.Popen(
        [sys.executable, "-m", "agentsctl.cli", *at(daemon), "attach", session_id],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
    )
    screen = Screen(master)
    try:
        screen.wait_for("Ctrl-C detaches")
        screen.wait_for("agent ready")
        assert run(daemon, capsys, "send", session_id, "please approve")[0] == EXIT_OK
        approval_id = pending_approval(daemon, session_id)
        screen.wait_for(f"approval {approval_id}: [a]ccept/[d]ecline? ")
        os.write(master, b"xa")  # a key that answers nothing, then accept
        screen.wait_for(f"-- approval {approval_id}: accept (by client)")
        screen.wait_for("Command approved.")
        resolved = wait_for_event(daemon, session_id, "approval.resolved")["body"]
        assert resolved["decision"] == "accept"
        wait_until_idle(daemon, session_id)

        # Ctrl-C while a question waits: detached, the terminal as it was.
        assert run(daemon, capsys, "send", session_id, "approve once more")[0] == EXIT_OK
        screen.wait_for(r"[a]ccept/[d]ecline? ")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=EXIT_TIMEOUT_S) == EXIT_OK
        assert "detached" in screen.drain()
        assert termios.tcgetattr(slave) == cooked
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=EXIT_TIMEOUT_S)
        os.close(slave)
        os.close(master)
    session = quick_call(daemon.socket, "agentSession.get", {"sessionId": session_id})["session"]
    assert (session["phase"], session["status"]) == ("running", "attention")


def test_a_closed_stdout_reader_exits_141(daemon: DaemonProcess) -> None:
    session_id = new_session(daemon, "-m", "echo x")
    probe = (
        "import os, sys\n"
        "read, write = os.pipe()\n"
        "os.close(read)\n"
        "os.dup2(write, 1)\n"
        "from agentsctl.cli import main\n"
        f"sys.exit(main(['--socket', {str(daemon.socket)!r}, 'log', {session_id!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=STREAM_TIMEOUT_S
    )
    assert (done.returncode, done.stderr) == (EXIT_BROKEN_PIPE, "")


class Screen:
    """What a program wrote to a pseudo-terminal, escape sequences removed."""

    def __init__(self, master: int) -> None:
        self.master = master
        self.text = ""
        self._seen = 0

    def _read(self, timeout_s: float) -> bool:
        readable, _, _ = select.select([self.master], [], [], timeout_s)
        if not readable:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the program exited and closed the terminal
            return False
        if not data:
            return False
        self.text += ANSI.sub("", data.decode(errors="replace"))
        return True

    def wait_for(self, needle: str, timeout_s: float = STREAM_TIMEOUT_S) -> None:
        """Wait until ``needle`` appears after what earlier waits matched."""
        deadline = time.monotonic() + timeout_s
        while (at := self.text.find(needle, self._seen)) < 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._read(min(remaining, 0.5)):
                raise AssertionError(f"{needle!r} did not appear; the screen:\n{self.text}")
        self._seen = at + len(needle)

    def drain(self) -> str:
        while self._read(0.5):
            if not select.select([self.master], [], [], 0)[0]:
                break
        return self.text


def test_two_attaches_see_the_same_conversation(
    daemon: DaemonProcess, clis: list[Cli], capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon, "--option", "chunks=7")
    first = Cli(*at(daemon), "attach", session_id)
    second = Cli(*at(daemon), "attach", session_id, "--no-input")
    clis += [first, second]
    for cli in (first, second):
        cli.wait_for(r"agent ready")
    assert run(daemon, capsys, "send", session_id, "echo one two three four five")[0] == EXIT_OK
    wait_until_idle(daemon, session_id)  # a prompt sent during a turn steers it instead
    assert run(daemon, capsys, "send", session_id, "approve the command")[0] == EXIT_OK
    approval_id = pending_approval(daemon, session_id)
    for cli in (first, second):
        cli.wait_for(rf"approval {approval_id} \(command\)")
    assert run(daemon, capsys, "approve", session_id, approval_id)[0] == EXIT_OK
    wait_until_idle(daemon, session_id)
    assert run(daemon, capsys, "send", session_id, "echo the end")[0] == EXIT_OK
    for cli in (first, second):
        cli.wait_for(r"^the end$")
        assert cli.interrupt() == EXIT_OK
    assert first.rest() == second.rest()
    transcript = first.lines
    for line in (
        "> echo one two three four five",
        "one two three four five",
        "> approve the command",
        f"-- approval {approval_id}: accept (by client)",
        "* shell ls -la [completed]",
        "Command approved.",
        "> echo the end",
        "the end",
    ):
        assert line in transcript, (line, transcript)


@pytest.fixture
def private_dir() -> Iterator[Path]:
    path = make_temp_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_attach_follows_across_a_daemon_restart(clis: list[Cli], private_dir: Path) -> None:
    state, sock = private_dir / "state", private_dir / "run" / "agentsd.sock"
    with running_daemon(state_dir=state, socket_path=sock) as daemon:
        session_id = new_session(daemon, "-m", "echo before the restart")
        wait_until_idle(daemon, session_id)
        cli = Cli("--socket", str(sock), "attach", session_id)
        clis.append(cli)
        cli.wait_for(r"^before the restart$")
    # The daemon is gone (SIGTERM, exit 0); attach keeps trying until one answers.
    with running_daemon(state_dir=state, socket_path=sock):
        cli.wait_for(r"^-- agent exited: ")  # journaled as the first daemon stopped
        quick_call(sock, "agentSession.send", {"sessionId": session_id, "text": "echo after it"})
        cli.wait_for(r"^> echo after it$")
        cli.wait_for(r"^after it$")
        assert cli.interrupt() == EXIT_OK
        err = cli.stderr()
        assert "reconnecting" in err and "reconnected; resuming after seq" in err, err
    assert cli.lines.count("> echo before the restart") == 1  # nothing shown twice


def test_attach_exits_4_when_the_session_is_deleted(
    daemon: DaemonProcess, clis: list[Cli], capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon)
    cli = Cli(*at(daemon), "attach", session_id)
    clis.append(cli)
    cli.wait_for(r"agent ready")
    assert run(daemon, capsys, "rm", session_id)[0] == EXIT_OK
    assert cli.wait() == EXIT_SESSION_GONE
    err = cli.stderr()
    # Told by agentSession.ended, with its reason; nothing is resubscribed.
    assert f"session {session_id} was deleted (reason: deleted)" in err, err
    assert "resubscribing" not in err and "reconnecting" not in err, err


def test_log_follow_exits_4_when_the_session_is_deleted(
    daemon: DaemonProcess, clis: list[Cli], capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(daemon)
    head = len(events(daemon, session_id))
    cli = Cli(*at(daemon), "log", session_id, "--follow", "--jsonl")
    clis.append(cli)
    for _ in range(head):
        json.loads(cli.wait_for(r"^\{"))  # the catch-up
    assert run(daemon, capsys, "rm", session_id)[0] == EXIT_OK
    assert cli.wait() == EXIT_SESSION_GONE
    shown = [json.loads(line)["seq"] for line in cli.rest()]
    assert shown == list(range(1, len(shown) + 1)), shown  # the log stays the journal
    err = cli.stderr()
    assert f"session {session_id} was deleted (reason: deleted)" in err, err
    assert f"following ended after seq {shown[-1]}" in err, err


def test_attach_to_an_unknown_session_exits_1(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(daemon, capsys, "attach", "no-such-session")
    assert code == EXIT_DAEMON_ERROR
    assert err.strip().endswith("[session_not_found]"), err


def test_attach_jsonl_prints_events_and_deltas(daemon: DaemonProcess, clis: list[Cli]) -> None:
    session_id = new_session(daemon)
    cli = Cli(*at(daemon), "attach", session_id, "--jsonl")
    clis.append(cli)
    cli.wait_for(r'"kind":"child.ready"')
    quick_call(
        daemon.socket, "agentSession.send", {"sessionId": session_id, "text": "echo abc def"}
    )
    rows = [json.loads(cli.wait_for(r'"kind":"delta"'))]
    rows.append(json.loads(cli.wait_for(r'"kind":"turn.completed"')))
    assert rows[0]["offset"] == 0 and "seq" not in rows[0]
    assert cli.interrupt() == EXIT_OK


# -- the transcript ---------------------------------------------------------------


def _event(seq: int, kind: str, **body: Any) -> JournalEvent:
    """A journal event as the daemon sends it: ``body`` by its wire names."""
    return JournalEvent(
        seq=seq, ts=0.0, fence=1, kind=kind, body=msgspec.Raw(msgspec.json.encode(body))
    )


def _delta(offset: int, text: str, item_id: str = "m1") -> DeltaNotification:
    return DeltaNotification(
        subscription_id="s", session_id="x", item_id=item_id, offset=offset, text=text, after_seq=0
    )


def test_the_transcript_shows_each_character_once_whatever_the_order() -> None:
    out = io.StringIO()
    transcript = Transcript(out)
    transcript.event(_event(1, "item.started", itemId="m1", type="agentMessage"))
    transcript.delta(_delta(0, "Hello"))
    transcript.event(_event(2, "item.updated", itemId="m1", text="Hello, wor"))  # snapshot ahead
    transcript.delta(_delta(5, ", wo"))  # already shown
    transcript.delta(_delta(9, "rld"))  # overlaps: only "ld" is new
    transcript.delta(_delta(20, "lost"))  # a gap: dropped, the snapshot fills it
    transcript.event(
        _event(3, "item.completed", itemId="m1", type="agentMessage", text="Hello, world!")
    )
    transcript.delta(_delta(12, "!"))  # a late delta of a finished item
    transcript.event(_event(4, "turn.completed", turnId="t1", outcome="completed"))
    assert out.getvalue() == "Hello, world!\n"


def test_the_transcript_says_an_agent_was_reattached_and_streams_on() -> None:
    """A daemon took the agent over mid-message: one line says so, and the text goes
    on from the snapshot without repeating what was shown."""
    out = io.StringIO()
    transcript = Transcript(out)
    transcript.event(_event(1, "item.started", itemId="m1", type="agentMessage"))
    transcript.delta(_delta(0, "Hello"))
    transcript.event(
        _event(2, "child.reattached", pid=4242, fence=3, generation="g", previousFence=2, fromSeq=1)
    )
    transcript.event(_event(3, "item.updated", itemId="m1", text="Hello, wor"))
    transcript.delta(_delta(10, "ld"))
    transcript.event(
        _event(4, "item.completed", itemId="m1", type="agentMessage", text="Hello, world")
    )
    lines = out.getvalue().splitlines()
    assert any("agent reattached (pid 4242)" in line for line in lines), lines
    assert "".join(line for line in lines if "reattached" not in line) == "Hello, world"


def test_the_transcript_ends_partial_text_before_other_lines() -> None:
    out = io.StringIO()
    transcript = Transcript(out)
    transcript.delta(_delta(0, "thinking about"))
    transcript.event(_event(1, "agent.error", message="boom"))
    transcript.delta(_delta(0, "other", item_id="m2"))
    transcript.delta(_delta(14, " it"))
    transcript.end_line()
    assert out.getvalue() == "thinking about\n! agent error: boom\nother\n it\n"


def test_the_transcript_says_why_the_agent_ended_and_why_its_conversation_changed() -> None:
    out = io.StringIO()
    transcript = Transcript(out)
    transcript.event(
        _event(
            1,
            "thread.superseded",
            previousHandle="th-1",
            handle="th-2",
            reason="codex never saved thread th-1, which had no turn",
        )
    )
    transcript.event(
        _event(
            2,
            "child.exited",
            cause="failed",
            returncode=1,
            error={"kind": "agent_exited", "message": "it exited"},
            stderrTail="warming up\n\x1b[31merror: bad flag\n",
        )
    )
    assert out.getvalue().splitlines() == [
        "-- new conversation th-2 in place of th-1: codex never saved thread th-1, which had "
        "no turn",
        "-- agent exited: failed, code 1, agent_exited: it exited",
        "  its stderr ends:",
        "  | warming up",
        "  | \\x1b[31merror: bad flag",
    ]


# -- usage ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["send", "s1"],
        ["attach"],
        ["log", "s1", "--json", "--jsonl"],
        ["log", "s1", "--follow", "--json"],
        ["approve", "s1", "ap-1", "--decline", "--decision", "accept"],
        ["approve", "s1"],
        ["new", "-m", "hi"],
        ["new", "mock", "--provider", "codex"],
        ["log", "s1", "--after-seq", "-1"],
        ["interrupt"],
    ],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(["--no-start", "--socket", "/nonexistent/agentsd.sock", *argv])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    assert code == EXIT_USAGE
    assert "usage: agentsctl" in capsys.readouterr().err


def test_the_conversation_commands_never_import_trio_or_agentsd(daemon: DaemonProcess) -> None:
    session_id = new_session(daemon, "-m", "echo x")
    probe = (
        "import sys\n"
        "from agentsctl.cli import main\n"
        f"base = ['--no-start', '--socket', {str(daemon.socket)!r}]\n"
        f"codes = [main([*base, 'log', {session_id!r}]), main([*base, 'interrupt', {session_id!r}])]\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('trio', 'agentsd'))\n"
        "print('HEAVY', codes, ','.join(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=STREAM_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "HEAVY [0, 0] "


# -- the follower, against a scripted daemon ---------------------------------------


def _event_params(subscription: str, seq: int) -> dict[str, Any]:
    event = {
        "seq": seq,
        "ts": 0.0,
        "fence": 1,
        "kind": "agent.error",
        "body": {"message": str(seq)},
    }
    return {"subscriptionId": subscription, "sessionId": "s1", "seq": seq, "event": event}


def _serve_following(peer: Peer, after_seq: int, subscription: str, head_seq: int) -> None:
    subscribe = peer.recv()
    assert subscribe["method"] == "agentSession.subscribe"
    assert subscribe["params"] == {"sessionId": "s1", "afterSeq": after_seq}
    peer.reply(subscribe, {"subscriptionId": subscription, "headSeq": head_seq})


def test_the_follower_resumes_from_its_cursor_after_lagged_and_a_dropped_connection(
    fake_daemon: FakeDaemon,
) -> None:
    def script(peer: Peer) -> None:
        _serve_following(peer, 0, "sub-1", 2)
        for seq in (1, 2):
            peer.notify("agentSession.event", _event_params("sub-1", seq))
        peer.notify(
            "agentSession.lagged",
            {"subscriptionId": "sub-1", "sessionId": "s1", "resumeAfterSeq": 2},
        )
        subscribe = peer.recv()
        assert subscribe["params"] == {"sessionId": "s1", "afterSeq": 2}
        peer.reply(subscribe, {"subscriptionId": "sub-2", "headSeq": 3})
        peer.notify("agentSession.event", _event_params("sub-1", 3))  # the ended one's: ignored
        peer.notify("agentSession.event", _event_params("sub-2", 2))  # a duplicate: dropped
        peer.notify("agentSession.event", _event_params("sub-2", 3))
        delta = {"subscriptionId": "sub-2", "sessionId": "s1", "itemId": "m", "offset": 0}
        peer.notify("agentSession.delta", {**delta, "text": "hi", "afterSeq": 3})
        peer.conn.close()  # the daemon went away
        conn, _ = fake_daemon._listener.accept()
        with conn:
            again = Peer(conn)
            _serve_following(again, 3, "sub-3", 4)
            again.notify("agentSession.event", _event_params("sub-3", 4))
            # Deleted: told once, with no status change to watch for.
            ended = {"subscriptionId": "sub-3", "sessionId": "s1", "lastSeq": 4}
            again.notify("agentSession.ended", {**ended, "reason": "deleted"})
            again.wait_closed()

    fake_daemon.serve(script)
    args = argparse.Namespace(socket=str(fake_daemon.path), state_dir=None, no_start=True)
    seen: list[str] = []
    with Follower(Target(args), "s1") as follower:
        follower.open()
        with pytest.raises(SessionGone) as gone:
            while True:
                item = follower.next(STREAM_TIMEOUT_S)
                assert item is not None, seen
                if isinstance(item, JournalEvent):
                    seen.append(f"event {item.seq}")
                elif isinstance(item, DeltaNotification):
                    seen.append(f"delta {item.text}")
                elif isinstance(item, CaughtUp):
                    seen.append(f"caught up {item.seq}")
                elif isinstance(item, Note):
                    seen.append(item.text.partition(";")[0])
    fake_daemon.finish()
    assert seen == [
        "event 1",
        "event 2",
        "caught up 2",
        "fell behind",
        "event 3",
        "caught up 3",
        "delta hi",
        f"agentsd at {fake_daemon.path} closed the connection",
        "reconnected",
        "event 4",
        "caught up 4",
    ]
    assert (gone.value.reason, gone.value.last_seq) == ("deleted", 4)


def test_the_follower_reports_a_session_deleted_while_it_was_disconnected(
    fake_daemon: FakeDaemon,
) -> None:
    def script(peer: Peer) -> None:
        _serve_following(peer, 0, "sub-1", 1)
        peer.notify("agentSession.event", _event_params("sub-1", 1))
        peer.conn.close()  # the daemon went away; the session is deleted meanwhile
        conn, _ = fake_daemon._listener.accept()
        with conn:
            again = Peer(conn)
            subscribe = again.recv()
            assert subscribe["params"] == {"sessionId": "s1", "afterSeq": 1}
            error = msgspec.to_builtins(SessionNotFound("no session 's1'").to_wire())
            again.send({"jsonrpc": "2.0", "id": subscribe["id"], "error": error})
            again.wait_closed()

    fake_daemon.serve(script)
    args = argparse.Namespace(socket=str(fake_daemon.path), state_dir=None, no_start=True)
    with Follower(Target(args), "s1") as follower:
        follower.open()
        with pytest.raises(SessionGone) as gone:
            while True:
                assert follower.next(STREAM_TIMEOUT_S) is not None
    fake_daemon.finish()
    assert (gone.value.reason, gone.value.last_seq) == ("not found on resubscribe", 1)
    assert str(gone.value) == (
        "session s1 was deleted (reason: not found on resubscribe); following ended after seq 1"
    )


@pytest.mark.parametrize("option", ["accept", "decline", "Use Redis", "it's $HOME; `x`"])
def test_an_approve_hint_is_a_command_line_a_shell_runs_as_printed(option: str) -> None:
    args = argparse.Namespace(socket="/tmp/my dir/agentsd.sock", state_dir=None, no_start=False)
    line = approve_command(Target(args), "s1", "ap-1-r1", option)
    words = shlex.split(line)
    assert words[:5] == ["agentsctl", "--socket", "/tmp/my dir/agentsd.sock", "approve", "s1"]
    answer = {"accept": [], "decline": ["--decline"]}.get(option, ["--decision", option])
    assert words[5:] == ["ap-1-r1", *answer]


# -- send --queue / --interrupt, queue ---------------------------------------------


def test_send_queue_holds_prompts_that_queue_lists_edits_withdraws_and_resumes(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    session_id = new_session(
        daemon, "--option", "chunks=400", "--option", "chunkDelayS=0.05", "--title", "q"
    )
    assert run(daemon, capsys, "send", session_id, "go")[0] == EXIT_OK
    for text in ("echo one", "echo two", "echo three", "echo four"):
        code, out, _ = run(daemon, capsys, "send", "--queue", session_id, text)
        assert code == EXIT_OK
        assert re.fullmatch(r"seq \d+: queued as [0-9a-f]+\n", out), out
    code, out, _ = run(daemon, capsys, "queue", session_id)
    assert code == EXIT_OK
    assert [line.split(" ", 2)[2] for line in out.splitlines()] == [
        "'echo one'",
        "'echo two'",
        "'echo three'",
        "'echo four'",
    ]
    code, out, _ = run(daemon, capsys, "queue", session_id, "--send-now", "4")
    assert code == EXIT_OK and re.search(r"seq \d+: accepted", out.splitlines()[-1]), out
    code, out, _ = run(daemon, capsys, "queue", session_id, "--edit", "2", "echo TWO")
    assert code == EXIT_OK and "'echo TWO'" in out
    code, out, _ = run(daemon, capsys, "queue", session_id, "--withdraw", "3")
    assert code == EXIT_OK and out.startswith("withdrawn: echo three\n")
    # An interrupt-and-send pauses what is left; --resume sends it, in order.
    code, out, _ = run(daemon, capsys, "send", "--interrupt", session_id, "echo now")
    assert code == EXIT_OK, out
    code, out, _ = run(daemon, capsys, "queue", session_id)
    assert out.splitlines()[0].startswith("paused (interrupted)")
    code, out, _ = run(daemon, capsys, "queue", session_id, "--resume")
    assert code == EXIT_OK and "paused" not in out
    deadline = time.monotonic() + STREAM_TIMEOUT_S
    while time.monotonic() < deadline:
        texts = [e["body"]["text"] for e in events(daemon, session_id) if e["kind"] == "submission"]
        if len(texts) == 5:
            break
        time.sleep(0.1)
    assert texts == ["go", "echo four", "echo now", "echo one", "echo TWO"]
    bash = run(daemon, capsys, "completion", "bash")[1]
    assert "--send-now" in bash and "--queue" in bash


def test_the_transcript_escapes_what_others_wrote_before_it_reaches_the_terminal() -> None:
    """Prompts, tool input, approvals and agents' errors are anyone's text: an escape
    sequence or a carriage return in them is shown escaped, never sent raw."""
    out = io.StringIO()
    transcript = Transcript(out)
    hostile = "\x1b]0;pwned\x07\x1b[2J\rfake"
    transcript.event(_event(1, "submission", clientMessageId="c1", text=f"run {hostile}"))
    transcript.event(
        _event(
            2,
            "item.completed",
            itemId="t1",
            type="commandExecution",
            input={"command": f"ls {hostile}"},
            status="completed",
        )
    )
    transcript.event(
        _event(
            3,
            "approval.requested",
            approvalId="ap-1",
            nativeId="1",
            approvalKind="command",
            title=f"Run {hostile}",
            detail=f"detail {hostile}",
            options=["accept", "decline"],
        )
    )
    transcript.event(_event(4, "agent.error", message=f"boom {hostile}"))
    shown = out.getvalue()
    assert "\x1b" not in shown and "\r" not in shown and "\x07" not in shown, repr(shown)
    assert shown.count("\\x1b]0;pwned") == 5, shown  # prompt, tool, title, detail, error


def test_the_transcript_shows_a_cut_off_turn_and_its_continuation_as_the_daemons() -> None:
    out = io.StringIO()
    transcript = Transcript(out)
    transcript.event(_event(1, "submission", clientMessageId="c1", text="do it"))
    transcript.event(
        _event(2, "turn.completed", turnId="t1", outcome="interrupted", reason="daemon-restart")
    )
    transcript.event(
        _event(3, "submission", clientMessageId="c2", text="Carry on.", continuesSeq=2)
    )
    assert out.getvalue().splitlines() == [
        "> do it",
        "-- turn t1 cut off by a daemon restart; `agentsctl continue` carries it on",
        "-- continued: the agent was asked to carry on the turn cut off at seq 2",
    ]
