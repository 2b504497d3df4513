"""login_shell and agent_env: capturing what a login shell exports, and what agents
get of it. The shells are real processes (``tests.fake_shell`` scripts and the
system's ``sh``); nothing of the shell is mocked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from agentsd.agent_env import DAEMON_ONLY, AgentEnvironment, compose, resolve_mode
from agentsd.config import Config, ProviderConfig
from agentsd.login_shell import (
    CAPTURE_VARS,
    MAX_OUTPUT_BYTES,
    CaptureFailed,
    capture,
    login_shell,
    parse_output,
)
from agentsd.procfs import HOLDER_MARK_ENV, SPAWN_TOKEN_ENV
from tests.fake_shell import (
    BANNER,
    MULTI_LINE,
    profile_adding,
    profile_hanging,
    write_shell,
)
from tests.polling import eventually

BOUND_S = 1.0  # the capture bound these tests configure
SLACK_S = 10.0  # a hang guard past the bound: the point is "bounded", not "fast"
BASE_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8"}
MARKERS = ("agentsd-env-0123", "agentsd-end-4567")


def process_gone(pid: int) -> bool:
    """No process ``pid``, or only its zombie (dead, about to be reaped by init)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True


# -- parsing ---------------------------------------------------------------------------


def test_only_what_lies_between_the_markers_counts() -> None:
    output = (
        b"MOTD: welcome\nagentsd-env-0123 is not alone on this line\n"
        b"agentsd-env-0123\nA=1\0B=x=y\0MULTI=a\nb\0_=agentsd-env-0123\0"
        b"agentsd-end-4567\nlogout noise\n"
    )
    assert parse_output(output, MARKERS) == {
        "A": "1",
        "B": "x=y",
        "MULTI": "a\nb",
        "_": "agentsd-env-0123",
    }


@pytest.mark.parametrize(
    "output",
    [b"", b"agentsd-env-0123\nA=1\0", b"A=1\0agentsd-end-4567\n", b"just a banner\n"],
)
def test_output_without_both_markers_is_no_environment(output: bytes) -> None:
    assert parse_output(output, MARKERS) is None


def test_bytes_that_are_not_utf8_reach_the_agent_unchanged() -> None:
    output = b"agentsd-env-0123\nRAW=\xff\xfe\0agentsd-end-4567"
    env = parse_output(output, MARKERS)
    assert env is not None
    assert os.fsencode(env["RAW"]) == b"\xff\xfe"


def test_the_shell_is_shell_else_the_passwd_entrys() -> None:
    assert login_shell({"SHELL": "/bin/zsh"}) == "/bin/zsh"
    import pwd

    assert login_shell({}) == (pwd.getpwuid(os.getuid()).pw_shell or None)


# -- capturing (real shells) -----------------------------------------------------------


async def test_a_login_shell_that_adds_a_directory_gives_it_to_agents(tmp_path: Path) -> None:
    shell = write_shell(tmp_path / "shell", profile_adding("/opt/only-here/bin"))
    env = await capture(str(shell), BASE_ENV, BOUND_S + SLACK_S)
    assert env["PATH"] == "/opt/only-here/bin:/usr/bin:/bin"
    assert env["MULTI_LINE"] == MULTI_LINE
    assert env["SHELL"] == str(shell)
    assert env["LANG"] == "C.UTF-8"  # what the shell was given and kept
    assert BANNER not in "".join(env.values())
    assert not set(env) & (set(CAPTURE_VARS) | {"SHLVL", "PWD", "OLDPWD", "_"})


async def test_the_start_up_files_can_tell_they_run_for_agentsd(tmp_path: Path) -> None:
    shell = write_shell(tmp_path / "shell", 'SEEN="$AGENTSD_RESOLVING_ENVIRONMENT"; export SEEN')
    env = await capture(str(shell), BASE_ENV, BOUND_S + SLACK_S)
    assert env["SEEN"] == "1"


async def test_the_system_sh_works_as_a_login_shell() -> None:
    env = await capture("/bin/sh", BASE_ENV, BOUND_S + SLACK_S)
    assert env["HOME"] == "/"
    assert "PATH" in env


async def test_a_hanging_login_shell_fails_within_its_bound_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "background.pid"
    shell = write_shell(tmp_path / "shell", profile_hanging(pid_file))
    # The shell never prints: only the bound can end the capture, and the hang guard
    # (SLACK_S past it) fails a capture that never ends.
    with (
        trio.fail_after(BOUND_S + SLACK_S),
        pytest.raises(CaptureFailed, match=rf"did not print its environment within {BOUND_S:g} s"),
    ):
        await capture(str(shell), BASE_ENV, BOUND_S)
    background = int(pid_file.read_text())
    await eventually(lambda: process_gone(background))


async def test_a_background_job_of_a_working_shell_dies_with_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "background.pid"
    shell = write_shell(tmp_path / "shell", f"sleep 300 &\necho $! > {pid_file}")
    await capture(str(shell), BASE_ENV, BOUND_S + SLACK_S)
    background = int(pid_file.read_text())
    await eventually(lambda: process_gone(background))


@pytest.mark.parametrize(
    ("profile", "reason"),
    [
        pytest.param("echo 'not today' >&2; exit 1", "exited 1 without printing", id="exits"),
        pytest.param("kill -9 $$", "killed by signal 9", id="killed"),
        # One byte past the bound fails, whatever the read that crossed it held.
        pytest.param(
            f"head -c {MAX_OUTPUT_BYTES + 1} /dev/zero",
            "printed more than",
            id="flood",
        ),
        # The environment itself would cross the bound: it is not taken.
        pytest.param(
            f"head -c {MAX_OUTPUT_BYTES - 16} /dev/zero",
            "printed more than",
            id="flood-then-environment",
        ),
    ],
)
async def test_a_broken_login_shell_is_a_reason_not_a_crash(
    tmp_path: Path, profile: str, reason: str
) -> None:
    shell = write_shell(tmp_path / "shell", profile)
    with pytest.raises(CaptureFailed, match=reason):
        await capture(str(shell), BASE_ENV, BOUND_S + SLACK_S)


async def test_a_missing_login_shell_is_a_reason(tmp_path: Path) -> None:
    with pytest.raises(CaptureFailed, match="cannot run the login shell"):
        await capture(str(tmp_path / "no-such-shell"), BASE_ENV, BOUND_S)


async def test_a_cancelled_capture_ends_the_shells_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "background.pid"
    shell = write_shell(tmp_path / "shell", profile_hanging(pid_file))
    # Cancelled once the shell runs its start-up files (its background job exists),
    # long before the capture's own bound: the window is hit, not timed.
    with trio.fail_after(SLACK_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(capture, str(shell), BASE_ENV, BOUND_S + 3 * SLACK_S)
            await eventually(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
            nursery.cancel_scope.cancel()
    background = int(pid_file.read_text())
    await eventually(lambda: process_gone(background))


# -- what agents get (agent_env) -----------------------------------------------------


@pytest.mark.parametrize(
    ("configured", "under_systemd", "mode"),
    [
        ("auto", True, "login-shell"),
        ("auto", False, "inherit"),
        ("login-shell", False, "login-shell"),
        ("inherit", True, "inherit"),
    ],
)
def test_auto_means_the_login_shell_only_under_the_service_manager(
    configured: str, under_systemd: bool, mode: str
) -> None:
    assert resolve_mode(configured, under_service_manager=under_systemd) == mode


def test_agents_are_not_users_the_daemons_own_variables_never_reach_an_agent() -> None:
    """Invariant 9: whatever the shell or the daemon's parent exported, an agent gets
    neither the daemon's notify socket, its socket-activation or watchdog variables,
    nor a spawn token but its own, nor a holder's mark; the runtime dir and bus are the daemon's."""
    daemon = {
        "PATH": "/usr/bin",
        "XDG_RUNTIME_DIR": "/run/user/1000",
        "WATCHDOG_USEC": "30000000",
        "WATCHDOG_PID": "1",
        SPAWN_TOKEN_ENV: "0" * 32,
        HOLDER_MARK_ENV: "1" * 32,
        "DISABLE_AUTO_UPDATE": "false",
    }
    captured = {
        "PATH": "/home/u/.local/bin:/usr/bin",
        "XDG_RUNTIME_DIR": "/tmp/elsewhere",
        "NOTIFY_SOCKET": "/run/user/1000/systemd/notify",
        "LISTEN_FDS": "1",
        "LISTEN_PID": "1",
        "LISTEN_FDNAMES": "agentsd.socket",
        "EDITOR": "vim",
        HOLDER_MARK_ENV: "2" * 32,
    }
    for env in (compose(captured, daemon), compose(None, daemon)):
        assert not set(env) & DAEMON_ONLY
        assert HOLDER_MARK_ENV not in env
        assert env["XDG_RUNTIME_DIR"] == "/run/user/1000"
        assert env["DISABLE_AUTO_UPDATE"] == "false"  # the daemon's own, not the capture's
    assert compose(captured, daemon)["PATH"] == "/home/u/.local/bin:/usr/bin"
    assert compose(captured, daemon)["EDITOR"] == "vim"
    assert compose(None, daemon)["PATH"] == "/usr/bin"


async def test_a_failed_capture_falls_back_to_the_daemons_environment_and_says_why(
    tmp_path: Path,
) -> None:
    config = Config(agent_env="login-shell", login_shell_timeout_s=BOUND_S)
    daemon = {**BASE_ENV, "SHELL": str(tmp_path / "no-such-shell")}
    snapshot = await AgentEnvironment(config, "login-shell", daemon).snapshot()
    assert snapshot.state == "fallback"
    assert "cannot run the login shell" in snapshot.detail
    assert snapshot.env == compose(None, daemon)


async def test_each_refresh_takes_a_new_snapshot_and_the_old_one_stays_as_it_was(
    tmp_path: Path,
) -> None:
    path_file = tmp_path / "path"
    path_file.write_text("/first")
    shell = write_shell(tmp_path / "shell", f'PATH="$(cat {path_file}):$PATH"; export PATH')
    config = Config(agent_env="login-shell", login_shell_timeout_s=BOUND_S + SLACK_S)
    agent_env = AgentEnvironment(config, "login-shell", {**BASE_ENV, "SHELL": str(shell)})
    first = await agent_env.snapshot()
    assert await agent_env.snapshot() is first  # taken once, then shared
    path_file.write_text("/second")
    second = await agent_env.refresh()
    assert (first.state, second.state) == ("captured", "captured")
    assert first.env["PATH"].startswith("/first:")
    assert second.env["PATH"].startswith("/second:")
    assert agent_env.current is second


async def test_programs_are_located_on_the_agents_path(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    agent = bin_dir / "my-agent"
    agent.write_text("#!/bin/sh\n")
    agent.chmod(0o755)
    shell = write_shell(tmp_path / "shell", profile_adding(bin_dir))
    config = Config(
        agent_env="login-shell",
        login_shell_timeout_s=BOUND_S + SLACK_S,
        providers={"mock": ProviderConfig(command=["my-agent", "--flag"])},
    )
    snapshot = await AgentEnvironment(
        config, "login-shell", {**BASE_ENV, "SHELL": str(shell)}
    ).snapshot()
    found = {program.provider: program for program in snapshot.programs}
    assert found["mock"].path == str(agent)
    assert found["mock"].source == "PATH"
    assert {"codex", "claude"} <= set(found)
