"""The socket and the directories around it, start-up refusals, and clean stops.

Every daemon start and stop here is bounded (``running_daemon``, ``run_daemon``), and
so is every socket operation.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon_process import (
    IO_TIMEOUT_S,
    POLL_S,
    DaemonProcess,
    make_temp_dir,
    run_daemon,
    running_daemon,
)

NOBODY = 65534
EXIT_FAILURE = 1  # agentsd.main: could not start


@pytest.fixture
def base() -> Iterator[Path]:
    path = make_temp_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def assert_refused(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The daemon exited 1 with an ``agentsd: ...`` message containing every needle,
    and no traceback."""
    stderr = proc.stderr
    assert proc.returncode == EXIT_FAILURE, (proc.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    assert "agentsd: " in stderr, stderr
    for needle in needles:
        assert needle in stderr, (needle, stderr)
    return stderr


def test_socket_is_0600_in_a_0700_directory(base: Path) -> None:
    sock = base / "run" / "agentsd.sock"
    with running_daemon(state_dir=base / "state", socket_path=sock):
        assert stat.S_ISSOCK(os.lstat(sock).st_mode)
        assert mode_of(sock) == 0o600
        assert mode_of(sock.parent) == 0o700
        assert mode_of(base / "state") == 0o700
        assert mode_of(base / "state" / "agentsd.lock") == 0o600


def connect_as(uid: int, gid: int, path: Path) -> dict[str, object]:
    """Fork a child that drops to ``uid``/``gid``, connects to ``path`` and pings;
    return what it saw. (The venv's interpreter lives under /root, which ``nobody``
    cannot execute, hence fork rather than a subprocess.)"""
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork() in a process with threads; the child only
        # makes system calls and exits.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        outcome: dict[str, object] = {"connected": False, "received": "", "error": None}
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(IO_TIMEOUT_S)
                client.connect(str(path))
                outcome["connected"] = True
                try:
                    client.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping"}\n')
                    received = b""
                    while chunk := client.recv(65536):
                        received += chunk
                    outcome["received"] = received.decode(errors="replace")
                except (ConnectionResetError, BrokenPipeError) as exc:
                    outcome["error"] = type(exc).__name__
        except BaseException as exc:
            outcome["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(write_fd, json.dumps(outcome).encode())
            os._exit(0)
    os.close(write_fd)
    try:
        data = b""
        with os.fdopen(read_fd, "rb") as pipe:
            data = pipe.read()
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    outcome = json.loads(data)
    assert isinstance(outcome, dict)
    return outcome


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another uid")
def test_a_client_of_another_uid_is_refused(base: Path) -> None:
    sock = base / "run" / "agentsd.sock"
    with running_daemon(state_dir=base / "state", socket_path=sock) as daemon:
        # The daemon checks its directory only at start; open the way for `nobody`
        # for this test only, so that SO_PEERCRED is what refuses it.
        try:
            os.chmod(base, 0o711)
            os.chmod(sock.parent, 0o711)
            os.chmod(sock, 0o666)
            outcome = connect_as(NOBODY, NOBODY, sock)
        finally:
            os.chmod(sock, 0o600)
            os.chmod(sock.parent, 0o700)
            os.chmod(base, 0o700)
        assert outcome["connected"] is True, outcome
        assert outcome["received"] == "", outcome  # closed (or reset) with no reply
        assert outcome["error"] in (None, "ConnectionResetError", "BrokenPipeError"), outcome
        wait_for_log(daemon, f"refused a connection from uid {NOBODY}")
        daemon.ping()


def wait_for_log(daemon: DaemonProcess, needle: str) -> None:
    deadline = time.monotonic() + IO_TIMEOUT_S
    while needle not in daemon.log():
        assert time.monotonic() < deadline, f"{needle!r} not in the log:\n{daemon.log()}"
        time.sleep(POLL_S)


def test_a_stale_socket_file_is_replaced(base: Path) -> None:
    sock = base / "run" / "agentsd.sock"
    sock.parent.mkdir(mode=0o700)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)
    with running_daemon(state_dir=base / "state", socket_path=sock) as daemon:
        daemon.ping()


def test_a_regular_file_at_the_socket_path_is_kept_and_refused(base: Path) -> None:
    sock = base / "run" / "agentsd.sock"
    sock.parent.mkdir(mode=0o700)
    sock.write_text("precious")
    proc = run_daemon(["--socket", str(sock), "--state-dir", str(base / "state")])
    assert_refused(proc, str(sock), "not a socket")
    assert sock.read_text() == "precious"


def test_a_second_daemon_on_the_same_state_dir_names_the_first(base: Path) -> None:
    state = base / "state"
    with running_daemon(state_dir=state, socket_path=base / "run" / "agentsd.sock") as first:
        proc = run_daemon(
            ["--socket", str(base / "run2" / "agentsd.sock"), "--state-dir", str(state)]
        )
        assert_refused(proc, "already running", f"pid {first.process.pid}")
        first.ping()


def test_a_second_daemon_on_the_same_socket_is_refused(base: Path) -> None:
    sock = base / "run" / "agentsd.sock"
    with running_daemon(state_dir=base / "state", socket_path=sock) as first:
        proc = run_daemon(["--socket", str(sock), "--state-dir", str(base / "state2")])
        assert_refused(proc, str(sock))
        assert stat.S_ISSOCK(os.lstat(sock).st_mode)
        first.ping()


def unsafe_symlink(path: Path) -> str:
    real = path.parent / "real"
    real.mkdir(mode=0o700)
    path.symlink_to(real)
    return "symlink"


def unsafe_group(path: Path) -> str:
    path.mkdir(mode=0o700)
    os.chmod(path, 0o750)
    return "chmod 700"


def unsafe_world(path: Path) -> str:
    path.mkdir(mode=0o700)
    os.chmod(path, 0o701)
    return "chmod 700"


def unsafe_owner(path: Path) -> str:
    path.mkdir(mode=0o700)
    os.chown(path, NOBODY, NOBODY)
    return f"belongs to uid {NOBODY}"


UNSAFE = {
    "symlink": unsafe_symlink,
    "group-access": unsafe_group,
    "world-access": unsafe_world,
    "other-owner": unsafe_owner,
}


@pytest.mark.parametrize("which", ["runtime", "state"])
@pytest.mark.parametrize("make_unsafe", list(UNSAFE.values()), ids=list(UNSAFE))
def test_an_unsafe_directory_refuses_the_start(
    base: Path, which: str, make_unsafe: Callable[[Path], str]
) -> None:
    if make_unsafe is unsafe_owner and os.geteuid() != 0:
        pytest.skip("needs root to chown")
    runtime, state = base / "run", base / "state"
    unsafe = runtime if which == "runtime" else state
    needle = make_unsafe(unsafe)
    proc = run_daemon(["--socket", str(runtime / "agentsd.sock"), "--state-dir", str(state)])
    assert_refused(proc, str(unsafe), needle)
    assert not (runtime / "agentsd.sock").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_stops_the_daemon_cleanly(base: Path, signum: signal.Signals) -> None:
    sock = base / "run" / "agentsd.sock"
    with running_daemon(state_dir=base / "state", socket_path=sock) as daemon:
        with daemon.connect() as idle_client:
            idle_client.ping()
            assert daemon.stop(signum) == 0, daemon.log()
            assert idle_client.recv_frame() is None  # its connection was closed
        assert not sock.exists()
        assert "Traceback" not in daemon.log()
    # The lock went with it: a new daemon takes the same state directory.
    with running_daemon(state_dir=base / "state", socket_path=sock) as again:
        again.ping()


def test_daemon_shutdown_replies_then_exits_zero(base: Path) -> None:
    sock = base / "run" / "agentsd.sock"
    with running_daemon(state_dir=base / "state", socket_path=sock) as daemon:
        with daemon.connect() as client:
            reply = client.call("daemon.shutdown", {})
            assert reply == {"jsonrpc": "2.0", "id": 1, "result": {"stopping": True}}
            assert client.recv_frame() is None
        assert daemon.wait() == 0, daemon.log()
        assert not sock.exists()
        assert "Traceback" not in daemon.log()
