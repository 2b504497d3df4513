"""``agentsctl notify`` against a fake notification sink: a stand-in ``notify-send``
on PATH that records its arguments. Exactly one notification per turn completion
and per approval request, across a daemon SIGKILL and restart and a restart of the
notifier itself; nothing the user has seen is notified."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsctl.cli import EXIT_DAEMON_ERROR
from agentsctl.daemon import quick_call
from agentsctl.notify import Sink, describe, gvariant_string
from agentsd_protocol.api.attention import Notice
from tests.clients.test_cli_conversation import (
    STREAM_TIMEOUT_S,
    events,
    new_session,
    pending_approval,
    wait_for_event,
)
from tests.daemon_process import DaemonProcess, make_temp_dir, no_holder_config, running_daemon

FAKE_NOTIFY_SEND = """#!{python}
import json, os, sys
with open(os.environ["AGENTSD_TEST_NOTIFICATIONS"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


@pytest.fixture
def private_dir() -> Iterator[Path]:
    path = make_temp_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Notifier:
    """``agentsctl notify`` in a subprocess, with the fake ``notify-send`` first on PATH."""

    def __init__(self, base: Path, sock: Path, state: Path) -> None:
        fakes = base / "fakes"
        fakes.mkdir(exist_ok=True)
        program = fakes / "notify-send"
        program.write_text(FAKE_NOTIFY_SEND.format(python=sys.executable))
        program.chmod(0o755)
        self.record = base / "notifications.jsonl"
        self.stderr = (base / "notify.stderr").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "agentsctl.cli", "--socket", str(sock),
             "--state-dir", str(state), "notify"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            env={
                **os.environ,
                "PATH": f"{fakes}:{os.environ['PATH']}",
                "AGENTSD_TEST_NOTIFICATIONS": str(self.record),
            },
        )  # fmt: skip

    def shown(self) -> list[list[str]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def wait_count(self, count: int) -> list[list[str]]:
        deadline = time.monotonic() + STREAM_TIMEOUT_S
        while len(shown := self.shown()) < count:
            if self.process.poll() is not None:
                raise AssertionError(f"agentsctl notify exited {self.process.returncode}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"{len(shown)} notifications, not {count}: {shown}")
            time.sleep(0.05)
        return shown

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=STREAM_TIMEOUT_S)
        self.stderr.close()


def hint(argv: list[str], name: str) -> str:
    prefix = f"--hint={'int' if name == 'seq' else 'string'}:x-agentsd-{name}:"
    return next(a[len(prefix) :] for a in argv if a.startswith(prefix))


def key(argv: list[str]) -> tuple[str, int]:
    return hint(argv, "session"), int(hint(argv, "seq"))


def notable(daemon: DaemonProcess, session_ids: list[str]) -> set[tuple[str, int]]:
    """Every turn completion and approval request in the journals."""
    return {
        (session_id, e["seq"])
        for session_id in session_ids
        for e in events(daemon, session_id)
        if e["kind"] in ("turn.completed", "approval.requested")
    }


def send(sock: Path, session_id: str, text: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "agentsctl.cli", "--socket", str(sock), "send", session_id, text],
        capture_output=True,
        timeout=STREAM_TIMEOUT_S,
        check=True,
    )


def wait_turns(daemon: DaemonProcess, session_id: str, count: int) -> None:
    deadline = time.monotonic() + STREAM_TIMEOUT_S
    while sum(e["kind"] == "turn.completed" for e in events(daemon, session_id)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} turns in {session_id}"
        time.sleep(0.05)


def summary(argv: list[str]) -> str:
    return argv[argv.index("--") + 1]


def test_exactly_one_notification_per_completion_and_approval_across_restarts(
    private_dir: Path,
) -> None:
    """Without the holder (``holder = false``), so that the SIGKILL cuts beta's turn
    off and the next daemon notifies that completion."""
    state, sock = private_dir / "state", private_dir / "run" / "agentsd.sock"
    sessions: list[str] = []
    notifier = Notifier(private_dir, sock, state)
    try:
        with (
            no_holder_config() as config,
            running_daemon(state_dir=state, socket_path=sock, extra_args=config) as daemon,
        ):
            sessions.append(new_session(daemon, "--title", "alpha", "-m", "echo one"))
            shown = notifier.wait_count(1)
            assert summary(shown[0]) == "alpha: finished" and shown[0][-1] == "one"
            sessions.append(new_session(daemon, "--title", "beta", "-m", "please approve"))
            pending_approval(daemon, sessions[1])
            shown = notifier.wait_count(2)
            assert summary(shown[1]) == "beta: needs your approval"
            assert "--urgency=critical" in shown[1]
            # The daemon dies with beta's turn running and its approval pending.
            daemon.process.kill()
            daemon.process.wait(timeout=STREAM_TIMEOUT_S)
        with (
            no_holder_config() as config,
            running_daemon(state_dir=state, socket_path=sock, extra_args=config) as daemon,
        ):
            # Recovery cut beta's turn off: one notification for that completion;
            # alpha's, unseen still, and beta's approval are not shown again.
            shown = notifier.wait_count(3)
            assert summary(shown[2]) == "beta: cut off by a daemon restart"
            assert shown[2][-1] == f"`agentsctl continue {sessions[1]}` carries it on"
            # A later completion comes through the same notifier, once.
            sessions.append(new_session(daemon, "--title", "gamma", "-m", "echo three"))
            wait_for_event(daemon, sessions[2], "turn.completed")
            shown = notifier.wait_count(4)
            assert summary(shown[3]) == "gamma: finished"

            # While no notifier runs, gamma finishes again, then asks for approval: a
            # restarted notifier shows both (not only the latest), and nothing it
            # showed before.
            notifier.stop()
            send(sock, sessions[2], "echo gap")
            wait_for_event(daemon, sessions[2], "turn.completed")
            wait_turns(daemon, sessions[2], 2)
            send(sock, sessions[2], "please approve")
            pending_approval(daemon, sessions[2])
            notifier = Notifier(private_dir, sock, state)
            shown = notifier.wait_count(6)
            assert [summary(a) for a in shown[4:]] == [
                "gamma: finished",
                "gamma: needs your approval",
            ]
            assert shown[4][-1] == "gap"
            # Looking at alpha, then a new completion in it: notified; the seen
            # one never is.
            quick_call(sock, "agentSession.acknowledge", {"sessionId": sessions[0], "seq": 10**6})
            send(sock, sessions[0], "echo four")
            shown = notifier.wait_count(7)
            assert summary(shown[6]) == "alpha: finished" and shown[6][-1] == "four"
            # The barrier: a last completion, after which nothing else may have come.
            sessions.append(new_session(daemon, "--title", "delta", "-m", "echo five"))
            shown = notifier.wait_count(8)
            assert summary(shown[7]) == "delta: finished"
            keys = [key(argv) for argv in shown]
            assert len(keys) == len(set(keys)), shown
            assert set(keys) == notable(daemon, sessions)
            assert len(shown) == 8
    finally:
        notifier.stop()


def test_without_notify_send_or_gdbus_it_says_what_to_install(private_dir: Path) -> None:
    empty = private_dir / "empty-path"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "agentsctl.cli", "--socket", str(private_dir / "s.sock"),
         "notify"],
        capture_output=True, text=True, timeout=STREAM_TIMEOUT_S, check=False,
        env={**os.environ, "PATH": str(empty)},
    )  # fmt: skip
    assert done.returncode == EXIT_DAEMON_ERROR
    assert "notify-send or gdbus not found" in done.stderr
    assert "[notifier_missing]" in done.stderr


def test_a_damaged_cursor_file_is_refused_not_overwritten(private_dir: Path) -> None:
    cursor = private_dir / "cursor.json"
    cursor.write_text("[1, 2]")
    done = subprocess.run(
        [sys.executable, "-m", "agentsctl.cli", "--socket", str(private_dir / "s.sock"),
         "notify", "--via", "notify-send", "--cursor", str(cursor)],
        capture_output=True, text=True, timeout=STREAM_TIMEOUT_S, check=False,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == EXIT_DAEMON_ERROR, done.stderr
    assert cursor.read_text() == "[1, 2]"


def _notice(**fields: Any) -> Notice:
    base: dict[str, Any] = {
        "session_id": "s1",
        "seq": 7,
        "kind": "turn",
        "title": "-x <b>bold</b>",
        "text": "a <a href='x'>link</a>\x1b[2J",
        "outcome": "completed",
    }
    return Notice(**(base | fields))


def test_agent_text_is_no_option_markup_or_control_sequence() -> None:
    notice = _notice()
    argv = Sink("notify-send", "/usr/bin/notify-send").argv(*describe(notice), notice)
    dashdash = argv.index("--")
    assert argv[dashdash + 1 :] == [
        "-x <b>bold</b>: finished",  # a summary is plain text by the spec
        "a &lt;a href='x'&gt;link&lt;/a&gt;\\x1b[2J",
    ]


def test_the_gdbus_call_quotes_its_strings() -> None:
    notice = _notice(title="it's", text="two\nlines", kind="approval", outcome=None)
    argv = Sink("gdbus", "/usr/bin/gdbus").argv(*describe(notice), notice)
    assert "--method=org.freedesktop.Notifications.Notify" in argv
    args = argv[argv.index("--") + 1 :]
    assert (
        args[3] == gvariant_string("it's: needs your approval") == "'it\\'s: needs your approval'"
    )
    assert args[4] == "'two\\nlines'"
    assert "'urgency': <byte 2>" in args[6]
