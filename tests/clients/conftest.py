"""Fixtures for the client and CLI tests: a scripted fake daemon and a real one.

The fake daemon is a stdlib Unix socket served by one thread running a test's
script; it tests what only a misbehaving peer can show (replies out of order, a
connection closed mid-reply). Everything else runs against a real ``agentsd``.
Socket paths stay under /tmp (the AF_UNIX path limit is 108 bytes).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon

FAKE_IO_TIMEOUT_S = 10.0  # a fake that waits longer than this has a bug in its script


class Peer:
    """The fake daemon's end of one accepted connection (newline-delimited JSON)."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self._buf = b""

    def recv(self) -> dict[str, Any]:
        """The next message from the client; AssertionError on EOF."""
        while b"\n" not in self._buf:
            data = self.conn.recv(65536)
            if not data:
                raise AssertionError("the client closed the connection")
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        message = json.loads(line)
        assert isinstance(message, dict), message
        return message

    def send(self, message: Any) -> None:
        self.send_raw(json.dumps(message).encode() + b"\n")

    def send_raw(self, data: bytes) -> None:
        self.conn.sendall(data)

    def reply(self, request: dict[str, Any], result: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": request["id"], "result": result})

    def notify(self, method: str, params: Any) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def wait_closed(self) -> None:
        """Block until the client closes its end (discarding what it sends)."""
        while self.conn.recv(65536):
            pass


Script = Callable[[Peer], None]


class FakeDaemon:
    """A listening socket whose first connection runs ``script`` in a thread.

    ``finish()`` joins the thread and re-raises what the script raised, so a broken
    expectation on the daemon side fails the test.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen()
        self._listener.settimeout(FAKE_IO_TIMEOUT_S)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def serve(self, script: Script) -> None:
        def run() -> None:
            try:
                conn, _ = self._listener.accept()
                with conn:
                    conn.settimeout(FAKE_IO_TIMEOUT_S)
                    script(Peer(conn))
            except BaseException as exc:
                self._error = exc

        self._thread = threading.Thread(target=run, name="fake-agentsd", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        if self._thread is not None:
            self._thread.join(FAKE_IO_TIMEOUT_S)
            assert not self._thread.is_alive(), "the fake daemon's script did not finish"
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def temp_dir() -> Iterator[Path]:
    """A fresh private directory under /tmp, short enough to hold a socket path."""
    path = make_temp_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake_daemon(temp_dir: Path) -> Iterator[FakeDaemon]:
    fake = FakeDaemon(temp_dir / "fake.sock")
    try:
        yield fake
        fake.finish()
    finally:
        fake.close()


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:
    """A real agentsd answering on its socket; SIGTERMed (killed on timeout) after."""
    with running_daemon() as process:
        yield process


@pytest.fixture
def isolated_env(temp_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reaches the user's own daemon, config or state: every path agentsd
    and agentsctl would default to points into ``temp_dir``."""
    for name in list(os.environ):
        if name.startswith("AGENTSD_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(temp_dir / "xdg-run"))
    monkeypatch.setenv("XDG_STATE_HOME", str(temp_dir / "xdg-state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(temp_dir / "xdg-config"))
    return temp_dir
