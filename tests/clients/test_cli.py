"""``agentsctl`` end to end against a real daemon: in-process ``main(argv)`` where
the command leaves no process behind, a subprocess where it starts or execs one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsctl.cli import (
    COMMANDS,
    EXIT_DAEMON_ERROR,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    build_parser,
    command_word,
    main,
)
from agentsctl.commands_daemon import format_duration
from agentsctl.daemon import process_gone, quick_call, wait_until_answering
from tests.daemon_process import STOP_TIMEOUT_S, DaemonProcess, running_daemon

CLI_TIMEOUT_S = 60.0  # one CLI run, including a daemon start on a loaded machine
ERROR_LINE = re.compile(r"^error: .+ \[[a-z_]+\]$")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m agentsctl.cli ARGS`` in the current (test-isolated) environment."""
    return subprocess.run(
        [sys.executable, "-m", "agentsctl.cli", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def at(daemon: DaemonProcess) -> list[str]:
    return ["--socket", str(daemon.socket)]


def wait_process_gone(pid: int, deadline_s: float = STOP_TIMEOUT_S) -> None:
    """Fail (after killing it) if ``pid`` outlives ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while not process_gone(pid):
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"agentsd (pid {pid}) still running {deadline_s} s after stop")
        time.sleep(0.01)


@pytest.fixture
def own_paths(isolated_env: Path) -> Iterator[list[str]]:
    """``--socket``/``--state-dir`` for a daemon the test itself starts through the CLI;
    whatever still answers there afterwards is stopped, and must stop."""
    args = [
        "--socket",
        str(isolated_env / "run" / "agentsd.sock"),
        "--state-dir",
        str(isolated_env / "state"),
    ]
    yield args
    try:
        pid = quick_call(args[1], "daemon.status", timeout_s=5.0)["pid"]
    except Exception:
        return  # nothing answers: nothing leaked
    stop = run_cli(*args, "daemon", "stop")
    wait_process_gone(pid)
    assert stop.returncode == EXIT_OK, stop.stderr


# -- status -----------------------------------------------------------------------


def test_status_prints_a_human_summary(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*at(daemon), "status"]) == EXIT_OK
    out = capsys.readouterr().out
    assert re.match(rf"agentsd \S+ \(pid {daemon.process.pid}\), up ", out)
    for label in ("socket:", "state dir:", "connections:", "sessions:", "recovery:"):
        assert label in out
    for label in ("agent env:", "agent PATH:", "agent bins:"):
        assert label in out
    assert str(daemon.socket) in out
    assert str(daemon.state_dir) in out


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.04, "0.0s"), (59.96, "60.0s"), (61, "1m 1s"), (3 * 3600 + 125, "3h 2m"), (90000, "1d 1h")],
)
def test_uptime_reads_like_uptime(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_status_json_is_the_raw_result(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*at(daemon), "status", "--json"]) == EXIT_OK
    result = json.loads(capsys.readouterr().out)
    assert result["pid"] == daemon.process.pid
    assert isinstance(result["version"], str)
    assert result["socket"] == str(daemon.socket)


def test_no_start_with_no_daemon_exits_3_with_a_hint(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    socket_path = isolated_env / "none.sock"
    assert main(["--no-start", "--socket", str(socket_path), "status"]) == EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert f"agentsd is not running at {socket_path}" in err
    assert "(start it with `agentsctl daemon start` or `make run`)" in err
    assert not socket_path.exists()


def test_socket_and_state_dir_come_from_the_environment(
    isolated_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTSD_SOCKET", str(isolated_env / "env.sock"))
    assert main(["--no-start", "status"]) == EXIT_UNREACHABLE
    assert str(isolated_env / "env.sock") in capsys.readouterr().err
    monkeypatch.delenv("AGENTSD_SOCKET")
    expected = isolated_env / "xdg-run" / "agentsd" / "agentsd.sock"
    assert main(["--no-start", "status"]) == EXIT_UNREACHABLE
    assert str(expected) in capsys.readouterr().err


def test_a_command_that_needs_the_daemon_starts_it(own_paths: list[str]) -> None:
    done = run_cli(*own_paths, "status", "--json")
    assert done.returncode == EXIT_OK, done.stderr
    assert "started agentsd" in done.stderr
    status = json.loads(done.stdout)
    assert status["socket"] == own_paths[1]
    assert status["stateDir"] == own_paths[3]
    assert (Path(own_paths[3]) / "agentsd.log").stat().st_mode & 0o077 == 0
    again = run_cli(*own_paths, "status", "--json")
    assert again.returncode == EXIT_OK, again.stderr
    assert "started" not in again.stderr
    assert json.loads(again.stdout)["pid"] == status["pid"]
    stop = run_cli(*own_paths, "daemon", "stop")
    assert stop.returncode == EXIT_OK, stop.stderr
    assert "stopped" in stop.stdout
    wait_process_gone(status["pid"])
    assert not Path(own_paths[1]).exists()


# -- daemon start / stop / ping ---------------------------------------------------


def test_daemon_start_detaches_and_a_second_start_says_so(own_paths: list[str]) -> None:
    first = run_cli(*own_paths, "daemon", "start")
    assert first.returncode == EXIT_OK, first.stderr
    assert "agentsd started (pid" in first.stdout
    second = run_cli(*own_paths, "daemon", "start")
    assert second.returncode == EXIT_OK, second.stderr
    assert "already running" in second.stdout
    status = quick_call(own_paths[1], "daemon.status")
    # Detached: a session of its own, and not a child of the CLI that started it.
    assert os.getsid(status["pid"]) == status["pid"]


def test_daemon_start_foreground_execs_the_daemon(own_paths: list[str]) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "agentsctl.cli", *own_paths, "daemon", "start", "--foreground"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_answering(own_paths[1], pid=process.pid)
        assert quick_call(own_paths[1], "daemon.status")["pid"] == process.pid
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOP_TIMEOUT_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)


def test_daemon_stop_waits_until_it_is_gone(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*at(daemon), "daemon", "stop"]) == EXIT_OK
    assert f"agentsd at {daemon.socket} stopped" in capsys.readouterr().out
    assert not daemon.socket.exists()
    assert daemon.wait() == 0


def test_daemon_stop_with_none_running_exits_0(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    socket_path = isolated_env / "none.sock"
    assert main(["--socket", str(socket_path), "daemon", "stop"]) == EXIT_OK
    assert f"agentsd is not running at {socket_path}" in capsys.readouterr().out


def test_daemon_ping_prints_the_round_trip(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*at(daemon), "daemon", "ping"]) == EXIT_OK
    assert re.fullmatch(
        rf"pong from agentsd at {re.escape(str(daemon.socket))}: \d+\.\d\d ms\n",
        capsys.readouterr().out,
    )


def test_daemon_ping_never_starts_a_daemon(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    socket_path = isolated_env / "none.sock"
    assert main(["--socket", str(socket_path), "daemon", "ping"]) == EXIT_UNREACHABLE
    assert "not running" in capsys.readouterr().err
    assert not socket_path.exists()


def test_daemon_reload_env_reports_what_agents_get(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*at(daemon), "daemon", "reload-env"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "agent env:   inherit: the daemon's own environment" in out
    assert f"agent PATH:  {os.environ['PATH']}" in out


def test_daemon_reload_env_with_a_broken_login_shell_exits_1_saying_why(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = isolated_env / "config.toml"
    config.write_text('agent_env = "login-shell"\nlogin_shell_timeout_s = 5\n')
    missing = isolated_env / "no-such-shell"
    with running_daemon(extra_args=["--config", str(config)], env={"SHELL": str(missing)}) as d:
        capsys.readouterr()
        assert main([*at(d), "daemon", "reload-env"]) == EXIT_DAEMON_ERROR
    captured = capsys.readouterr()
    assert "login-shell FAILED, agents get the daemon's own environment" in captured.out
    assert f"cannot run the login shell {missing}" in captured.err
    assert "[login_shell_failed]" in captured.err


def test_daemon_reload_env_never_starts_a_daemon(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    socket_path = isolated_env / "none.sock"
    assert main(["--socket", str(socket_path), "daemon", "reload-env"]) == EXIT_OK
    assert f"agentsd is not running at {socket_path}" in capsys.readouterr().out
    assert not socket_path.exists()


# -- usage and help ---------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["no-such-command"],
        ["daemon"],
        ["status", "--bogus"],
        ["new", "mock", "--env", "NOEQUALS"],
    ],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == EXIT_USAGE
    assert "usage: agentsctl" in capsys.readouterr().err


def test_bad_usage_exits_2_from_the_console() -> None:
    done = run_cli("no-such-command")
    assert done.returncode == EXIT_USAGE
    assert "invalid choice" in done.stderr


def test_help_lists_every_command_and_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert f"  {command.name} " in out
    assert "exit status:" in out
    for code in (EXIT_OK, EXIT_DAEMON_ERROR, EXIT_USAGE, EXIT_UNREACHABLE):
        assert re.search(rf"^  {code}  \S", out, re.MULTILINE)
    assert "--no-start" in out
    assert "AGENTSD_SOCKET" in out


# -- cold start -------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["--socket", "/s", "--no-start", "status", "--json"],
        ["--socket=/s", "--state-dir", "ls", "ls", "--provider", "mock"],
        ["daemon", "start", "--foreground", "--log-level", "debug"],
        ["--state-dir", "/d", "new", "mock", "--env", "A=1", "--command", "agent --flag"],
        ["rm", "abc"],
    ],
)
def test_the_partial_parser_parses_as_the_whole_one(argv: list[str]) -> None:
    word = command_word(argv)
    assert word is not None
    assert vars(build_parser(word).parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_command_word_ignores_option_values_and_unknown_words() -> None:
    assert command_word(["--socket", "status", "ls"]) == "ls"
    assert command_word(["--no-start", "-h"]) is None
    assert command_word(["bogus", "status"]) is None
    assert command_word(["daemon", "stop"]) == "daemon"


def test_the_cli_never_imports_trio_agentsd_or_msgspec(daemon: DaemonProcess) -> None:
    """trio and the daemon never; msgspec not on ``status``'s path (its cold-start
    budget, see tests/bench/bench_cli.py)."""
    probe = (
        "import sys\n"
        "from agentsctl.cli import main\n"
        f"code = main(['--no-start', '--socket', {str(daemon.socket)!r}, 'status'])\n"
        "heavy = sorted(m for m in ('trio', 'agentsd', 'msgspec') if m in sys.modules)\n"
        "print('HEAVY', code, ','.join(heavy))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "HEAVY 0 "


# -- sessions ---------------------------------------------------------------------


def test_session_commands(daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]) -> None:
    base = at(daemon)
    assert main([*base, "new", "mock", "--stopped", "--title", "first"]) == EXIT_OK
    session_id = capsys.readouterr().out.strip()
    assert re.fullmatch(r"\S+", session_id)

    assert main([*base, "ls", "--json"]) == EXIT_OK
    listed = json.loads(capsys.readouterr().out)
    assert [(s["sessionId"], s["title"]) for s in listed["sessions"]] == [(session_id, "first")]
    assert main([*base, "ls"]) == EXIT_OK
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["SESSION", "PROVIDER", "PHASE", "STATUS", "TITLE", "CWD"]
    assert table[1].split()[:5] == [session_id, "mock", "stopped", "idle", "first"]

    assert main([*base, "show", session_id, "--json"]) == EXIT_OK
    shown = json.loads(capsys.readouterr().out)["session"]
    assert (shown["sessionId"], shown["phase"], shown["cwd"]) == (
        session_id,
        "stopped",
        os.getcwd(),
    )
    assert main([*base, "show", session_id]) == EXIT_OK
    assert f"session:   {session_id}" in capsys.readouterr().out

    assert main([*base, "close", session_id]) == EXIT_OK
    assert "agent was not running" in capsys.readouterr().out
    assert main([*base, "rm", session_id]) == EXIT_OK
    assert f"{session_id}: deleted" in capsys.readouterr().out

    assert main([*base, "show", session_id]) == EXIT_DAEMON_ERROR
    err = capsys.readouterr().err.strip()
    assert ERROR_LINE.match(err), err
    assert err.endswith("[session_not_found]")


def test_a_daemon_error_exits_1_with_message_and_kind(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*at(daemon), "new", "mock", "--cwd", "/nonexistent/dir/for/agentsd"])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_DAEMON_ERROR
    assert ERROR_LINE.match(err), err
