"""``agentsctl doctor``: what it finds, and its exit status, on real and broken setups.

The agent binaries come from the test extras (``openai-codex-cli-bin`` and
``claude-agent-sdk`` in this virtualenv); the daemon is a real ``agentsd``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from agentsctl.cli import EXIT_DAEMON_ERROR, EXIT_OK, main
from agentsctl.doctor import PROGRAMS, find_program
from tests.daemon_process import DaemonProcess, running_daemon

LEVELS = {"ok", "info", "warn", "fail", "skip"}


def doctor(
    capsys: pytest.CaptureFixture[str], socket_path: Path, state_dir: Path
) -> tuple[int, dict[str, dict[str, Any]]]:
    """Run ``doctor --json``: its exit status and its checks by name."""
    capsys.readouterr()
    code = main(["--socket", str(socket_path), "--state-dir", str(state_dir), "doctor", "--json"])
    document = json.loads(capsys.readouterr().out)
    checks = {check["name"]: check for check in document["checks"]}
    assert document["ok"] == (code == EXIT_OK)
    assert all(check["status"] in LEVELS for check in checks.values())
    return code, checks


def test_doctor_finds_both_agents_in_this_environment(
    isolated_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # so the packaged binaries are what it finds
    _, checks = doctor(capsys, isolated_env / "run" / "s.sock", isolated_env / "state")
    for program in PROGRAMS:
        check = checks[program.name]
        assert check["status"] == "ok", check
        assert check["facts"]["from"] == f"the {program.package} package"
        assert Path(check["facts"]["path"]).is_relative_to(Path(sys.prefix))
        assert check["facts"]["version"]
    assert "codex-cli" in checks["codex"]["facts"]["version"]
    assert "Claude Code" in checks["claude"]["facts"]["version"]


def test_finding_an_agent_never_imports_its_package() -> None:
    for program in PROGRAMS:
        assert find_program(program) is not None
        assert program.module not in sys.modules


def test_a_missing_socket_is_reported_but_is_not_a_failure(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    socket_path = isolated_env / "run" / "agentsd.sock"
    code, checks = doctor(capsys, socket_path, isolated_env / "state")
    assert checks["socket"]["status"] == "warn"
    assert checks["socket"]["detail"] == f"{socket_path} does not exist: no daemon is running"
    assert checks["socket"]["facts"]["answers"] is False
    for name in ("runtime dir", "state dir", "database"):
        assert checks[name]["status"] == "info", checks[name]  # created at the first start
    assert code == EXIT_OK
    assert not socket_path.parent.exists()  # the doctor only looks


def test_a_runtime_dir_open_to_others_fails(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime = isolated_env / "run"
    runtime.mkdir(mode=0o755)
    runtime.chmod(0o755)
    code, checks = doctor(capsys, runtime / "agentsd.sock", isolated_env / "state")
    assert code == EXIT_DAEMON_ERROR
    check = checks["runtime dir"]
    assert check["status"] == "fail"
    assert "mode 0755" in check["detail"]
    assert check["hint"] == f"chmod 700 {runtime}"


def test_a_state_dir_that_is_a_symlink_fails(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = isolated_env / "real"
    real.mkdir(mode=0o700)
    (isolated_env / "state").symlink_to(real)
    code, checks = doctor(capsys, isolated_env / "s.sock", isolated_env / "state")
    assert code == EXIT_DAEMON_ERROR
    assert checks["state dir"]["status"] == "fail"
    assert "symlink" in checks["state dir"]["detail"]


def test_a_stale_socket_is_reported(isolated_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = isolated_env / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))  # bound, never listening: what a crashed daemon leaves
    path.chmod(0o600)
    _, checks = doctor(capsys, path, isolated_env / "state")
    assert checks["socket"]["status"] == "warn"
    assert "stale" in checks["socket"]["detail"]


def test_a_broken_agent_binary_fails(
    isolated_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = isolated_env / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "codex"
    fake.write_text("#!/bin/sh\necho 'codex: cannot load' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    code, checks = doctor(capsys, isolated_env / "s.sock", isolated_env / "state")
    assert code == EXIT_DAEMON_ERROR
    assert checks["codex"]["status"] == "fail"
    assert checks["codex"]["facts"]["from"] == "PATH"
    assert "exited 3: codex: cannot load" in checks["codex"]["detail"]
    assert checks["claude"]["status"] == "ok"


def test_with_a_running_daemon_everything_needed_passes(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    code, checks = doctor(capsys, daemon.socket, daemon.state_dir)
    assert code == EXIT_OK, checks
    assert checks["socket"]["status"] == "ok"
    assert checks["socket"]["facts"]["pid"] == daemon.process.pid
    assert checks["runtime dir"]["status"] == "ok"
    assert checks["state dir"]["status"] == "ok"
    database = checks["database"]
    assert database["status"] == "ok", database
    assert database["facts"]["schemaVersion"] >= 1
    assert database["facts"]["journalMode"] == "wal"
    assert checks["daemon"]["status"] == "ok"
    # What the daemon sees: its agents' environment and programs, not this shell's.
    agent_env = checks["agent env"]
    assert agent_env["status"] == "ok", agent_env
    assert agent_env["facts"]["mode"] == "inherit"
    assert checks["agent PATH"]["facts"]["path"] == agent_env["facts"]["daemonPath"]
    for program in PROGRAMS:
        assert checks[f"{program.name} (daemon)"]["status"] == "ok"
    assert checks["linger"]["status"] in LEVELS
    assert checks["service"]["status"] in LEVELS
    assert checks["storage"]["status"] == "ok"


def test_a_state_dir_made_read_only_under_the_daemon_fails_storage(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon.state_dir.chmod(0o500)
    try:
        code, checks = doctor(capsys, daemon.socket, daemon.state_dir)
    finally:
        daemon.state_dir.chmod(0o700)
    assert code == EXIT_DAEMON_ERROR
    storage = checks["storage"]
    assert storage["status"] == "fail", storage
    assert "not writable" in storage["detail"] and storage["hint"]


def test_the_human_report_has_one_line_per_check_and_a_verdict(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runtime = isolated_env / "run"
    runtime.mkdir(mode=0o700)
    runtime.chmod(0o777)
    code = main(["--socket", str(runtime / "s.sock"), "--state-dir", str(isolated_env), "doctor"])
    out = capsys.readouterr().out
    assert code == EXIT_DAEMON_ERROR
    lines = out.splitlines()
    for name in ("codex", "claude", "runtime dir", "socket", "state dir", "database", "linger"):
        assert any(line.split()[0] in LEVELS and f" {name} " in line for line in lines), name
    assert f"-> chmod 700 {runtime}" in out
    assert lines[-1].startswith("1 check(s) failed")


def test_without_a_daemon_its_view_is_skipped(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, checks = doctor(capsys, isolated_env / "run" / "s.sock", isolated_env / "state")
    assert checks["agent env"]["status"] == "skip"


def test_a_program_the_daemons_agents_cannot_find_is_a_warning_with_a_hint(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = isolated_env / "config.toml"
    config.write_text('[providers.mock]\ncommand = ["no-such-agent"]\n')
    with running_daemon(extra_args=["--config", str(config)]) as daemon:
        _, checks = doctor(capsys, daemon.socket, daemon.state_dir)
    check = checks["mock (daemon)"]
    assert check["status"] == "warn"
    assert "the daemon's agents do not find no-such-agent" in check["detail"]
    assert "agentsctl daemon reload-env" in check["hint"]
    assert "[providers.mock] command" in check["hint"]


def test_an_acp_agent_the_daemons_agents_cannot_find_points_at_its_agents_table(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = isolated_env / "config.toml"
    config.write_text('[agents.opencode]\ncommand = ["no-such-opencode", "acp"]\n')
    with running_daemon(extra_args=["--config", str(config)]) as daemon:
        _, checks = doctor(capsys, daemon.socket, daemon.state_dir)
    check = checks["opencode (daemon)"]
    assert check["status"] == "warn"
    assert "the daemon's agents do not find no-such-opencode" in check["detail"]
    assert "[agents.opencode] command" in check["hint"]


def test_doctor_never_starts_a_daemon(
    isolated_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    socket_path = isolated_env / "run" / "agentsd.sock"
    main(["--socket", str(socket_path), "--state-dir", str(isolated_env / "state"), "doctor"])
    assert "started agentsd" not in capsys.readouterr().err
    assert not socket_path.exists()
