"""The restart in place (``agentsd.reexec``): what crosses the exec and what the new
image is told; the exec itself is exercised end to end in
``tests/e2e/test_restart_in_place.py``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

import pytest

from agentsd.reexec import image_argv
from agentsd.server import SOCKET_UNIT_NAME, ServiceManager
from agentsd.socket_keeper import KEPT_SOCKET_ENV, SocketHandover, SocketIdentity
from agentsd.systemd import InheritedSocket, Notifier
from tests.daemon.test_systemd import _drain, listener, notifier, short_dir, systemd_env

__all__ = ["listener", "notifier", "short_dir", "systemd_env"]  # fixtures


def test_reloading_is_stamped_on_the_monotonic_clock(
    listener: socket.socket, notifier: Notifier
) -> None:
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notifier.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    [datagram] = _drain(listener)
    reloading, stamp = datagram.decode().split("\n")
    assert reloading == "RELOADING=1"
    name, _, usec = stamp.partition("=")
    assert name == "MONOTONIC_USEC" and before <= int(usec) <= after


_SEAL = """
import json, os
from agentsd.reexec import seal_descriptors
stray_r, stray_w = os.pipe()
kept_r, kept_w = os.pipe()
os.set_inheritable(stray_r, True)  # as a careless library would leave one
sealed = seal_descriptors([kept_r])
print(json.dumps({
    "sealed": sealed == [stray_r],
    "stray": [os.get_inheritable(stray_r), os.get_inheritable(stray_w)],
    "kept": [os.get_inheritable(kept_r), os.get_inheritable(kept_w)],
    "stdio": [os.get_inheritable(fd) for fd in (0, 1, 2)],
    "again": seal_descriptors([kept_r]),
}))
"""


def test_only_the_kept_descriptors_and_stdio_stay_inheritable() -> None:
    """In a fresh interpreter, where this test alone decides which descriptors are
    open (pytest keeps inheritable ones of its own)."""
    out = subprocess.run(
        [sys.executable, "-c", _SEAL], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert json.loads(out) == {
        "sealed": True,
        "stray": [False, False],
        "kept": [True, False],
        "stdio": [True, True, True],
        "again": [],  # nothing else had been inheritable
    }


def test_the_next_image_is_told_what_systemd_told_this_one(
    systemd_env: pytest.MonkeyPatch,
) -> None:
    systemd_env.setenv("NOTIFY_SOCKET", "@agentsd-notify")
    systemd_env.setenv("LISTEN_FDNAMES", SOCKET_UNIT_NAME)  # without LISTEN_PID: not ours
    service = ServiceManager.from_env()
    # Read and removed: agents never inherit them.
    assert "NOTIFY_SOCKET" not in os.environ and "LISTEN_FDNAMES" not in os.environ
    listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        passed = InheritedSocket(fd=listening.fileno(), name=SOCKET_UNIT_NAME, sock=listening)
        activated = ServiceManager(
            notifier=service.notifier, inherited=[passed], variables=service.variables
        )
        env = activated.image_env()
        assert env["NOTIFY_SOCKET"] == "@agentsd-notify"
        # The same pid keeps the same descriptors: the variables name this process.
        assert env["LISTEN_PID"] == str(os.getpid())
        assert env["LISTEN_FDS"] == "1"
        assert env["LISTEN_FDNAMES"] == SOCKET_UNIT_NAME
        assert activated.kept_fds() == [listening.fileno()]
    finally:
        listening.close()
    # Not run by systemd: the next image is told nothing of it.
    plain = ServiceManager().image_env()
    assert not {"NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} & set(plain)
    assert ServiceManager().kept_fds() == []


def test_the_next_image_is_this_interpreter_running_the_package() -> None:
    argv = ["--socket", "/tmp/x.sock", "--state-dir", "/tmp/state"]
    assert image_argv(argv) == [sys.executable, "-m", "agentsd", *argv]


# --- the listener the daemon bound itself (agentsd.socket_keeper Rule 5) -------------


def _listening(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(1)
    return sock


def _handed(sock: socket.socket, path: Path) -> dict[str, str]:
    identity = SocketIdentity.at(path)
    assert isinstance(identity, SocketIdentity)
    return SocketHandover(sock=sock, identity=identity).env()


def test_the_next_image_adopts_the_listener_still_bound_at_its_path(short_dir: Path) -> None:
    path = short_dir / "agentsd.sock"
    sock = _listening(path)
    env = _handed(sock, path)
    fd = sock.detach()  # the descriptor now belongs to whoever adopts it
    adopted = SocketHandover.adopt(path, env)
    assert adopted.sock is not None
    try:
        assert env == {}  # read and removed: agents never see it
        assert adopted.sock.fileno() == fd
        assert not os.get_inheritable(fd)  # this image's agents do not get it
        assert adopted.identity == SocketIdentity.at(path)
    finally:
        adopted.sock.close()


def test_a_listener_whose_path_was_replaced_is_closed_not_adopted(short_dir: Path) -> None:
    path = short_dir / "agentsd.sock"
    sock = _listening(path)
    fd = sock.fileno()
    env = _handed(sock, path)
    sock.detach()  # the descriptor now belongs to whoever adopts it
    path.unlink()
    other = _listening(path)  # someone else's socket at the path now
    try:
        assert SocketHandover.adopt(path, env).sock is None
        with pytest.raises(OSError):
            os.fstat(fd)  # closed, not leaked
    finally:
        other.close()


@pytest.mark.parametrize("value", ["garbage", "1:2:3", "{fd}:0:0:0:0"])
def test_anything_else_handed_over_is_ignored(short_dir: Path, value: str) -> None:
    read_end, write_end = os.pipe()
    try:
        env = {KEPT_SOCKET_ENV: value.format(fd=read_end)}
        assert SocketHandover.adopt(short_dir / "agentsd.sock", env).sock is None
        assert env == {}
    finally:
        os.close(write_end)
        with suppress(OSError):
            os.close(read_end)
