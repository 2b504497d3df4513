"""Seen and unseen, as a person sees it: ``agentsctl watch`` in a real terminal
(tmux: send-keys, capture-pane) and ``agentsctl status --format``, against a real
daemon running the mock agent, across daemon restarts."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsctl.cli import EXIT_OK, EXIT_UNREACHABLE
from tests.clients.test_cli_conversation import (
    STREAM_TIMEOUT_S,
    Cli,
    new_session,
    pending_approval,
    wait_for_event,
    wait_until_idle,
)
from tests.daemon_process import make_temp_dir, running_daemon

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


def status_line(sock: Path, template: str) -> tuple[int, str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentsctl.cli",
            "--socket",
            str(sock),
            "status",
            "--format",
            template,
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=STREAM_TIMEOUT_S,
        check=False,
    )
    return done.returncode, done.stdout.strip()


def wait_status(sock: Path, template: str, wanted: str) -> None:
    deadline = time.monotonic() + STREAM_TIMEOUT_S
    while (line := status_line(sock, template)) != (EXIT_OK, wanted):
        if time.monotonic() >= deadline:
            raise AssertionError(f"status --format {template!r} is {line}, not {wanted!r}")
        time.sleep(0.05)


class Tmux:
    """A private tmux server with one window."""

    def __init__(self, base: Path) -> None:
        self.socket = str(base / "tmux.sock")

    def tmux(self, *argv: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, *argv], capture_output=True, text=True, check=True
        )
        return done.stdout

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-x", "150", "-y", "20", command)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p")

    def wait_screen(self, test: str, *, absent: bool = False) -> str:
        deadline = time.monotonic() + STREAM_TIMEOUT_S
        while True:
            screen = self.screen()
            if (test in screen) != absent:
                return screen
            if time.monotonic() >= deadline:
                raise AssertionError(f"{test!r} {'still' if absent else 'not'} on:\n{screen}")
            time.sleep(0.05)

    def kill(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, check=False)


@pytest.fixture
def private_dir() -> Iterator[Path]:
    path = make_temp_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_unseen_until_attached_unseen_again_after_an_approval_across_restarts(
    private_dir: Path,
) -> None:
    state, sock = private_dir / "state", private_dir / "run" / "agentsd.sock"
    counts = "{unseen} unseen, {attention} need you: {needs}"
    with running_daemon(state_dir=state, socket_path=sock) as daemon:
        session_id = new_session(daemon, "--title", "alpha", "-m", "echo all done")
        wait_for_event(daemon, session_id, "turn.completed")
        wait_until_idle(daemon, session_id)
        # Finished while nobody was attached: unseen.
        wait_status(sock, counts, "1 unseen, 0 need you: alpha")
    assert status_line(sock, counts) == (EXIT_UNREACHABLE, "")  # no daemon: an empty line

    tmux = Tmux(private_dir)
    with running_daemon(state_dir=state, socket_path=sock) as daemon:
        try:
            # Still unseen after the restart, in the status line and in watch.
            wait_status(sock, counts, "1 unseen, 0 need you: alpha")
            tmux.start(f"{sys.executable} -m agentsctl.cli --socket {sock} watch")
            screen = tmux.wait_screen("alpha")
            row = next(line for line in screen.splitlines() if "alpha" in line)
            assert row.startswith("*") and "finished: all done" in row, screen

            # Attaching shows it: seen, in watch (redrawn in place) and the status line.
            attach = Cli("--socket", str(sock), "attach", session_id)
            try:
                attach.wait_for(r"^all done$")
                wait_status(sock, counts, "0 unseen, 0 need you:")
                screen = tmux.wait_screen("finished:", absent=True)
                assert screen.count("alpha") == 1, screen
                row = next(line for line in screen.splitlines() if "alpha" in line)
                assert not row.startswith("*"), screen
            finally:
                assert attach.interrupt() == EXIT_OK
                attach.close()

            # A later approval makes it unseen again.
            subprocess.run(
                [sys.executable, "-m", "agentsctl.cli", "--socket", str(sock), "send",
                 session_id, "please approve"],
                capture_output=True, timeout=STREAM_TIMEOUT_S, check=True,
            )  # fmt: skip
            pending_approval(daemon, session_id)
            wait_status(sock, counts, "1 unseen, 1 need you: alpha")
            screen = tmux.wait_screen("approve:")
            row = next(line for line in screen.splitlines() if "alpha" in line)
            assert row.startswith("*") and "attention" in row, screen
        finally:
            tmux.kill()
    with running_daemon(state_dir=state, socket_path=sock):
        # The restart cancelled the approval, but it was never seen.
        wait_status(sock, "{unseen} unseen", "1 unseen")


def test_watch_shows_reconnecting_across_a_daemon_restart_then_goes_on(
    private_dir: Path,
) -> None:
    state, sock = private_dir / "state", private_dir / "run" / "agentsd.sock"
    tmux = Tmux(private_dir)
    try:
        with running_daemon(state_dir=state, socket_path=sock) as daemon:
            new_session(daemon, "--title", "alpha", "-m", "echo one")
            tmux.start(f"{sys.executable} -m agentsctl.cli --socket {sock} watch")
            tmux.wait_screen("alpha")
        # The daemon stopped: watch says so and keeps going.
        screen = tmux.wait_screen("reconnecting")
        assert "alpha" not in screen, screen
        with running_daemon(state_dir=state, socket_path=sock) as daemon:
            screen = tmux.wait_screen("alpha")
            assert "reconnecting" not in screen, screen
            # And it follows the new daemon live.
            new_session(daemon, "--title", "beta", "-m", "echo two")
            screen = tmux.wait_screen("beta")
            assert "alpha" in screen, screen
    finally:
        tmux.kill()
