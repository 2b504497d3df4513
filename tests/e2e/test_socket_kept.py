"""The socket is the daemon's to keep (issue 18): deleted, or its runtime directory
removed and created again, the daemon binds it again with the start-up checks, open
connections go on, and ``agentsctl`` tells a daemon whose socket is gone from no
daemon at all, and can stop it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsctl.daemon import lock_holder
from tests.daemon_process import (
    IO_TIMEOUT_S,
    POLL_S,
    DaemonProcess,
    WireClient,
    make_temp_dir,
    running_daemon,
)
from tests.e2e.reliability import PingProbe
from tests.e2e.test_socket_safety import wait_for_log

REBOUND_WITHIN_S = 10.0  # the daemon checks every second; the machine is shared
CLI_TIMEOUT_S = 60.0
EXIT_UNREACHABLE = 3  # agentsctl.cli


@pytest.fixture
def base() -> Iterator[Path]:
    path = make_temp_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def wait_answering(path: Path, within_s: float = REBOUND_WITHIN_S) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            with WireClient(path, timeout_s=IO_TIMEOUT_S) as client:
                client.ping()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise AssertionError(f"nothing answered at {path} within {within_s} s") from None
            time.sleep(POLL_S)


def create_session(client: WireClient, cwd: Path) -> str:
    reply = client.call(
        "agentSession.create", {"provider": "mock", "cwd": str(cwd), "start": False}
    )
    session_id: str = reply["result"]["sessionId"]
    return session_id


def listed(client: WireClient) -> set[str]:
    return {s["sessionId"] for s in client.call("agentSession.list", {})["result"]["sessions"]}


def cli(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentsctl.cli", "--socket", str(daemon.socket),
         "--state-dir", str(daemon.state_dir), *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
        check=False,
    )  # fmt: skip


def test_a_deleted_socket_is_bound_again_and_open_connections_go_on(base: Path) -> None:
    sock = base / "rt" / "agentsd" / "agentsd.sock"
    with running_daemon(state_dir=base / "state", socket_path=sock) as daemon:
        with WireClient(sock) as old, PingProbe(sock) as probe:
            session_id = create_session(old, base)
            sock.unlink()
            old.ping()  # served on the connection accepted before
            wait_answering(sock)
            old.ping()
            probe.check()
        assert stat.S_ISSOCK(os.lstat(sock).st_mode) and mode_of(sock) == 0o600
        with WireClient(sock) as fresh:
            assert session_id in listed(fresh)
        assert "bound again" in daemon.log()


def test_a_runtime_dir_removed_and_created_again_gets_the_socket_back(base: Path) -> None:
    runtime = base / "rt"
    sock = runtime / "agentsd" / "agentsd.sock"
    with running_daemon(state_dir=base / "state", socket_path=sock) as daemon:
        with WireClient(sock) as old, PingProbe(sock) as probe:
            session_id = create_session(old, base)
            shutil.rmtree(runtime)  # a logout without lingering
            old.ping()
            # A bind attempt was made while the runtime dir was gone (its failure is
            # logged: counted, not waited for) and did not create the directory.
            wait_for_log(daemon, "not bound yet")
            assert not runtime.exists()
            runtime.mkdir(mode=0o700)  # the next login
            wait_answering(sock)
            assert mode_of(sock.parent) == 0o700 and mode_of(sock) == 0o600
            assert session_id in listed(old)
            probe.check()
        with WireClient(sock) as fresh:
            assert session_id in listed(fresh)
        assert "waiting for" in daemon.log()


def test_status_waits_for_a_daemon_binding_its_socket_again(base: Path) -> None:
    sock = base / "rt" / "agentsd" / "agentsd.sock"
    with running_daemon(state_dir=base / "state", socket_path=sock) as daemon:
        sock.unlink()
        done = cli(daemon, "status")
        assert done.returncode == 0, done.stderr
        assert f"pid {daemon.process.pid}" in done.stdout
        assert "started agentsd" not in done.stderr


def test_status_and_stop_when_the_socket_is_gone_and_the_daemon_holds_the_lock(
    base: Path,
) -> None:
    runtime = base / "rt"
    sock = runtime / "agentsd" / "agentsd.sock"
    with running_daemon(state_dir=base / "state", socket_path=sock) as daemon:
        holder = lock_holder(daemon.state_dir)
        assert holder is not None and holder.pid == daemon.process.pid
        shutil.rmtree(runtime)  # and it does not come back: the socket cannot be bound

        status = cli(daemon, "status")
        assert status.returncode == EXIT_UNREACHABLE, status
        assert f"agentsd (pid {daemon.process.pid}) holds" in status.stderr
        assert "agentsctl daemon stop" in status.stderr
        assert "exited before answering" not in status.stderr
        assert daemon.process.poll() is None
        assert lock_holder(daemon.state_dir) is not None  # no second daemon took over

        stop = cli(daemon, "daemon", "stop")
        assert stop.returncode == 0, stop
        assert "not running" not in stop.stdout
        assert f"agentsd (pid {daemon.process.pid}) stopped" in stop.stdout
        assert daemon.wait() == 0  # SIGTERM: the clean shutdown
        assert lock_holder(daemon.state_dir) is None

        after = cli(daemon, "daemon", "stop")
        assert after.returncode == 0 and "is not running" in after.stdout


def test_no_daemon_is_told_from_a_stale_lock_file(base: Path) -> None:
    state = base / "state"
    state.mkdir(mode=0o700)
    # The lock file a SIGKILLed daemon leaves: it names a pid that holds no lock.
    (state / "agentsd.lock").write_text(f"{os.getpid()}\n{base / 's.sock'}\n\n")
    assert lock_holder(state) is None


def test_the_client_names_the_lock_file_as_the_daemon_does() -> None:
    from agentsctl import daemon as client_side
    from agentsd import paths

    assert client_side.LOCK_NAME == paths.LOCK_NAME
