"""The agents' environment through a real daemon: captured from a (fake) login shell,
bounded, refreshed on request, reported by ``daemon.status``, and without the
daemon's own variables.

Each daemon runs as under systemd: a PATH reduced to /usr/bin:/bin, and its own
session (no controlling terminal, so SIGHUP means "reload"). The login shells are
``tests.fake_shell`` scripts; the agent is the mock agent, started through a wrapper
that exists only in the directory the login shell adds to PATH.
"""

from __future__ import annotations

import contextlib
import os
import pty
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import trio

from tests.daemon_process import (
    DaemonProcess,
    daemon_command,
    daemon_env,
    make_temp_dir,
    wait_until_serving,
)
from tests.e2e.notify_listener import NotifyListener
from tests.e2e.test_sessions import create, open_rpc
from tests.fake_shell import (
    MULTI_LINE,
    profile_adding,
    profile_hanging,
    profile_reading,
    profile_waiting,
    write_shell,
)
from tests.polling import eventually

TEST_TIMEOUT_S = 60.0
BOUND_S = 2.0  # login_shell_timeout_s in these tests
SLACK_S = 15.0  # a hang guard past the bound on a shared machine: bounded, not fast
SYSTEMD_PATH = "/usr/bin:/bin"  # what a user manager gives its services, about


@contextlib.contextmanager
def service_like_daemon(base: Path, config: str, env: Mapping[str, str]) -> Iterator[DaemonProcess]:
    """A real agentsd with ``config``, PATH reduced to ``SYSTEMD_PATH``, ``env`` on
    top, in a session of its own; SIGTERMed (killed on timeout) afterwards."""
    config_path = base / "config.toml"
    config_path.write_text(config)
    log_path = base / "agentsd.log"
    socket_path = base / "run" / "agentsd.sock"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            daemon_command(socket_path, base / "state", ["--config", str(config_path)]),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=daemon_env(base, {"PATH": SYSTEMD_PATH, **env}),
            start_new_session=True,
        )
    daemon = DaemonProcess(socket_path, base / "state", process, log_path)
    try:
        wait_until_serving(daemon)
        yield daemon
        assert daemon.stop() == 0, daemon.log()
    except BaseException as exc:
        exc.add_note(f"agentsd log:\n{daemon.log()}")
        raise
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    base = make_temp_dir()
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def agent_wrapper(directory: Path) -> Path:
    """``my-agent``: the mock agent, reachable only through ``directory``."""
    directory.mkdir(exist_ok=True)
    wrapper = directory / "my-agent"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m agentsd.providers.mock_agent "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def environ(pid: int) -> dict[str, str]:
    """The environment process ``pid`` was started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    entries = (entry.partition(b"=") for entry in raw.split(b"\0") if entry)
    return {os.fsdecode(name): os.fsdecode(value) for name, _, value in entries}


def agent_pid(session: dict[str, Any]) -> int:
    """The pid of the session's agent: the mock agent the wrapper exec'd."""
    child = session["child"]
    assert child is not None, session
    return int(child["pid"])


def config(**values: str) -> str:
    lines = [f"login_shell_timeout_s = {BOUND_S}"]
    lines += [f"{name} = {value}" for name, value in values.items() if name != "providers"]
    if "providers" in values:
        lines.append(values["providers"])
    return "\n".join(lines) + "\n"


async def status(daemon: DaemonProcess) -> dict[str, Any]:
    async with open_rpc(daemon.socket) as rpc:
        result: dict[str, Any] = await rpc.call("daemon.status")
    agent_env: dict[str, Any] = result["agentEnv"]
    return agent_env


# -- tests -------------------------------------------------------------------------


async def test_an_agent_only_the_login_shell_finds_starts_and_gets_none_of_the_daemons_variables(
    tmp_path: Path,
) -> None:
    with scratch() as base:
        bin_dir = base / "login-bin"
        wrapper = agent_wrapper(bin_dir)
        # Start-up files that print noise and export what must never reach an agent.
        profile = (
            profile_adding(bin_dir) + "\nexport NOTIFY_SOCKET=/run/user/0/systemd/notify"
            "\nexport LISTEN_FDS=1 LISTEN_PID=1 LISTEN_FDNAMES=agentsd.socket"
        )
        shell = write_shell(base / "shell", profile)
        settings = config(
            agent_env='"login-shell"', providers='[providers.mock]\ncommand = ["my-agent"]'
        )
        env = {"SHELL": str(shell), "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}
        with service_like_daemon(base, settings, env) as daemon, trio.fail_after(TEST_TIMEOUT_S):
            async with open_rpc(daemon.socket) as rpc:
                session = await create(rpc, tmp_path)
                assert session["phase"] == "running", session
                got = environ(agent_pid(session))
            assert got["PATH"] == f"{bin_dir}:{SYSTEMD_PATH}"
            assert got["MULTI_LINE"] == MULTI_LINE
            assert got["SHELL"] == str(shell)
            leaked = {"NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"}
            leaked |= {"WATCHDOG_USEC", "WATCHDOG_PID", "AGENTSD_RESOLVING_ENVIRONMENT"}
            assert not leaked & set(got), leaked & set(got)
            assert got["AGENTSD_SPAWN_TOKEN"]  # its own, as every agent's

            reported = await status(daemon)
            assert (reported["mode"], reported["state"]) == ("login-shell", "captured")
            assert reported["path"] == got["PATH"]
            assert reported["daemonPath"] == SYSTEMD_PATH
            programs = {p["provider"]: p for p in reported["programs"]}
            assert programs["mock"]["path"] == str(wrapper)


async def test_a_hanging_login_shell_delays_only_the_first_start_and_by_its_bound(
    tmp_path: Path,
) -> None:
    with scratch() as base:
        background = base / "background.pid"
        shell = write_shell(base / "shell", profile_hanging(background))
        settings = config(agent_env='"login-shell"')
        with service_like_daemon(base, settings, {"SHELL": str(shell)}) as daemon:
            with trio.fail_after(TEST_TIMEOUT_S):
                # The first start waits for the capture, which only its bound ends
                # (the shell hangs for minutes), then starts the agent anyway.
                async with open_rpc(daemon.socket) as rpc:
                    session = await create(rpc, tmp_path)
                assert session["phase"] == "running", session
                reported = await status(daemon)
                assert reported["state"] == "fallback"
                assert f"did not print its environment within {BOUND_S:g} s" in reported["detail"]
                assert reported["path"] == SYSTEMD_PATH  # the daemon's own
                assert "agents get the daemon's own environment" in daemon.log()
                pid = int(background.read_text())
                await eventually(lambda: not Path(f"/proc/{pid}").exists(), timeout_s=SLACK_S)


async def test_serving_does_not_wait_for_the_login_shell(tmp_path: Path) -> None:
    """The daemon answers while the capture is under way: the shell here finishes only
    when the test says so, and its bound lies past the hang guard, so "pending" is
    what a status must say, however slow the machine."""
    with scratch() as base:
        release = base / "release"
        shell = write_shell(base / "shell", profile_waiting(release))
        settings = f'agent_env = "login-shell"\nlogin_shell_timeout_s = {2 * TEST_TIMEOUT_S}\n'
        with service_like_daemon(base, settings, {"SHELL": str(shell)}) as daemon:
            with trio.fail_after(TEST_TIMEOUT_S):
                assert (await status(daemon))["state"] == "pending"
                release.touch()
                async with open_rpc(daemon.socket) as rpc:
                    session = await create(rpc, tmp_path)
                assert session["phase"] == "running", session
                assert (await status(daemon))["state"] == "captured"


async def test_reload_env_gives_the_next_start_the_new_environment_and_running_agents_keep_theirs(
    tmp_path: Path,
) -> None:
    with scratch() as base:
        path_file = base / "path"
        path_file.write_text("/first")
        shell = write_shell(base / "shell", profile_reading(path_file))
        settings = config(agent_env='"login-shell"')
        with service_like_daemon(base, settings, {"SHELL": str(shell)}) as daemon:
            with trio.fail_after(TEST_TIMEOUT_S):
                async with open_rpc(daemon.socket) as rpc:
                    before = await create(rpc, tmp_path)
                    path_file.write_text("/second")
                    reloaded = await rpc.call("daemon.reloadEnv", {})
                    assert reloaded["agentEnv"]["path"] == f"/second:{SYSTEMD_PATH}"
                    after = await create(rpc, tmp_path)
                    assert environ(agent_pid(before))["PATH"] == f"/first:{SYSTEMD_PATH}"
                    assert environ(agent_pid(after))["PATH"] == f"/second:{SYSTEMD_PATH}"

                    # SIGHUP does the same for a daemon without a terminal.
                    path_file.write_text("/third")
                    daemon.process.send_signal(signal.SIGHUP)

                    async def third() -> bool:
                        return bool((await status(daemon))["path"].startswith("/third:"))

                    await eventually(third, timeout_s=BOUND_S + SLACK_S)
                    last = await create(rpc, tmp_path)
                    assert environ(agent_pid(last))["PATH"] == f"/third:{SYSTEMD_PATH}"
                    assert environ(agent_pid(before))["PATH"] == f"/first:{SYSTEMD_PATH}"


async def test_auto_captures_when_systemd_started_the_daemon(tmp_path: Path) -> None:
    with scratch() as base, NotifyListener.bound(base) as notify:
        shell = write_shell(base / "shell", profile_adding("/opt/from-login"))
        env = {**notify.env, "SHELL": str(shell)}
        with service_like_daemon(base, config(), env) as daemon, trio.fail_after(TEST_TIMEOUT_S):
            async with open_rpc(daemon.socket) as rpc:
                session = await create(rpc, tmp_path)
            assert environ(agent_pid(session))["PATH"] == f"/opt/from-login:{SYSTEMD_PATH}"
            reported = await status(daemon)
            assert (reported["configured"], reported["mode"]) == ("auto", "login-shell")


async def test_auto_inherits_when_no_service_manager_started_the_daemon(tmp_path: Path) -> None:
    with scratch() as base:
        shell = write_shell(base / "shell", profile_adding("/opt/from-login"))
        with service_like_daemon(base, config(), {"SHELL": str(shell)}) as daemon:
            with trio.fail_after(TEST_TIMEOUT_S):
                async with open_rpc(daemon.socket) as rpc:
                    session = await create(rpc, tmp_path)
                assert environ(agent_pid(session))["PATH"] == SYSTEMD_PATH
                reported = await status(daemon)
                assert (reported["mode"], reported["state"]) == ("inherit", "inherited")


_WITH_TERMINAL = (
    "import fcntl, os, sys, termios; os.setsid(); "
    "fd = os.open(sys.argv[1], os.O_RDWR); fcntl.ioctl(fd, termios.TIOCSCTTY, 0); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)
"""Run the rest of the command line with the terminal ``argv[1]`` as its controlling
terminal, as a shell in a terminal emulator has."""


def test_in_a_terminal_sighup_is_a_hang_up_and_the_daemon_shuts_down_cleanly() -> None:
    with scratch() as base:
        master, terminal = pty.openpty()
        log_path = base / "agentsd.log"
        socket_path = base / "run" / "agentsd.sock"
        argv = [sys.executable, "-c", _WITH_TERMINAL, os.ttyname(terminal)]
        try:
            with log_path.open("wb") as log_file:
                process = subprocess.Popen(
                    [*argv, *daemon_command(socket_path, base / "state")],
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=daemon_env(base),
                )
            daemon = DaemonProcess(socket_path, base / "state", process, log_path)
            try:
                wait_until_serving(daemon)
                assert daemon.stop(signal.SIGHUP) == 0, daemon.log()
                assert "received SIGHUP; shutting down" in daemon.log()
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        finally:
            os.close(terminal)
            os.close(master)
