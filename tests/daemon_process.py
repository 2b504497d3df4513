"""Start a real ``agentsd`` in a subprocess for end-to-end tests and benchmarks.

Everything here is blocking stdlib code with a deadline on every wait: no fixed
sleeps, and a daemon that does not stop on SIGTERM fails the test loudly.

Socket paths live under ``/tmp`` because AF_UNIX paths are limited to 108 bytes and
pytest's ``tmp_path`` is longer than that.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from agentsd_protocol.errors import FrameTooLarge, ParseError
from agentsd_protocol.framing import FrameDecoder, Framing, encode_frame
from tests.cgroup_root import cgroup_root, daemons_in_cgroup_mode

START_TIMEOUT_S = 20.0  # importing trio alone takes ~0.25 s; the machine is shared
STOP_TIMEOUT_S = 10.0  # a clean shutdown takes milliseconds today
IO_TIMEOUT_S = 10.0  # one socket operation against a local daemon
POLL_S = 0.01  # between readiness probes while waiting for a deadline

_encoder = msgspec.json.Encoder()


def make_temp_dir() -> Path:
    """A fresh private (0700) directory short enough to hold a socket path."""
    return Path(tempfile.mkdtemp(dir="/tmp", prefix="ad-"))


@contextlib.contextmanager
def no_holder_config(extra: str = "") -> Iterator[list[str]]:
    """``--config`` arguments for a daemon that starts its agents itself (``holder =
    false``): what a crash does to agents without the holder, which ends them.
    ``extra``: more of the config file (TOML), after that line."""
    base = make_temp_dir()
    try:
        path = base / "config.toml"
        path.write_text(f"holder = false\n{extra}")
        yield ["--config", str(path)]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def daemon_command(socket_path: Path, state_dir: Path, extra_args: Sequence[str] = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "agentsd",
        "--socket",
        str(socket_path),
        "--state-dir",
        str(state_dir),
        *extra_args,
    ]


def daemon_env(base: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a test daemon: the user's own config and sockets never leak in."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("AGENTSD_")}
    out["XDG_CONFIG_HOME"] = str(base / "config")
    out["XDG_STATE_HOME"] = str(base / "xdg-state")
    out["XDG_RUNTIME_DIR"] = str(base / "xdg-run")
    out["PYTHONUNBUFFERED"] = "1"
    if env:
        out.update(env)
    return out


class WireClient:
    """A blocking JSON-RPC client over the daemon's socket, in either framing.

    Every receive is bounded by ``timeout_s``; a timeout raises ``TimeoutError``.
    """

    def __init__(
        self,
        path: Path,
        framing: Framing = Framing.NDJSON,
        timeout_s: float = IO_TIMEOUT_S,
    ) -> None:
        self.framing = framing
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.connect(str(path))
        except BaseException:
            self.sock.close()
            raise
        self._decoder = FrameDecoder(framing=framing)
        self._next_id = 0

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_body(self, body: bytes) -> None:
        self.sock.sendall(encode_frame(self.framing, body))

    def send(self, message: Any) -> None:
        self.send_body(_encoder.encode(message))

    def recv_frame(self) -> bytes | None:
        """The next frame, or None once the daemon closed the connection (EOF or reset)."""
        while True:
            for frame in self._decoder.frames():
                return frame
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self._decoder.feed(data)

    def recv(self) -> Any:
        """The next message, decoded; AssertionError if the connection closed instead."""
        frame = self.recv_frame()
        if frame is None:
            raise AssertionError("the daemon closed the connection instead of replying")
        return msgspec.json.decode(frame)

    def call(self, method: str, params: Any = None) -> Any:
        """Send one request and return its whole reply object (result or error)."""
        self._next_id += 1
        request: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            request["params"] = params
        self.send(request)
        reply = self.recv()
        assert isinstance(reply, dict), reply
        assert reply.get("id") == self._next_id, reply
        return reply

    def ping(self) -> None:
        """``daemon.ping`` answers ``pong``; notifications before the reply (of a
        subscription made on this connection, whose session is busy) are passed over."""
        self._next_id += 1
        self.send({"jsonrpc": "2.0", "id": self._next_id, "method": "daemon.ping"})
        reply = self.recv()
        while isinstance(reply, dict) and "method" in reply and "id" not in reply:
            reply = self.recv()
        assert isinstance(reply, dict) and reply.get("id") == self._next_id, reply
        assert reply.get("result") == {"pong": True}, reply

    def recv_until_closed(self) -> list[bytes]:
        """Every frame until the daemon closes the connection."""
        frames: list[bytes] = []
        with contextlib.suppress(ParseError, FrameTooLarge):
            while (frame := self.recv_frame()) is not None:
                frames.append(frame)
        return frames


class DaemonProcess:
    """A running daemon started by ``running_daemon``."""

    def __init__(
        self, socket: Path, state_dir: Path, process: subprocess.Popen[bytes], log: Path
    ) -> None:
        self.socket = socket
        self.state_dir = state_dir
        self.process = process
        self.log_path = log

    def log(self) -> str:
        """Everything the daemon wrote to stderr so far."""
        return self.log_path.read_text(errors="replace")

    def connect(self, framing: Framing = Framing.NDJSON) -> WireClient:
        return WireClient(self.socket, framing)

    def request(self, obj: Any, framing: Framing = Framing.NDJSON) -> dict[str, Any]:
        """Send one message on a fresh connection and return the one reply."""
        with self.connect(framing) as client:
            client.send(obj)
            reply = client.recv()
        assert isinstance(reply, dict), reply
        return reply

    def ping(self) -> None:
        reply = self.request({"jsonrpc": "2.0", "id": "ping", "method": "daemon.ping"})
        assert reply == {"jsonrpc": "2.0", "id": "ping", "result": {"pong": True}}, reply

    def wait(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Wait for the daemon to exit on its own; AssertionError if it does not."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"agentsd (pid {self.process.pid}) still running after {timeout_s} s"
            ) from None

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Send ``signum`` and wait for the exit; SIGKILL and fail loudly on a timeout."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=timeout_s)
            raise AssertionError(
                f"agentsd (pid {self.process.pid}) ignored {signal.Signals(signum).name} for "
                f"{timeout_s} s and had to be killed; its log:\n{self.log()}"
            ) from None


def wait_until_serving(daemon: DaemonProcess, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll ``daemon.ping`` until it answers; AssertionError if the daemon exits first
    or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        code = daemon.process.poll()
        if code is not None:
            raise AssertionError(
                f"agentsd exited with {code} while starting; its log:\n{daemon.log()}"
            )
        try:
            with WireClient(daemon.socket, timeout_s=max(0.1, deadline - time.monotonic())) as c:
                c.ping()
            return
        except (OSError, AssertionError) as exc:
            last_error = exc
        time.sleep(POLL_S)
    raise AssertionError(
        f"agentsd did not answer daemon.ping within {timeout_s} s ({last_error!r}); "
        f"its log:\n{daemon.log()}"
    )


@contextlib.contextmanager
def running_daemon(
    state_dir: Path | None = None,
    socket_path: Path | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[DaemonProcess]:
    """Start ``python -m agentsd``, wait until it answers ``daemon.ping``, yield it.

    With ``AGENTSD_TEST_CGROUP=1`` the daemon runs in cgroup mode, in a test cgroup
    root of its own (``tests.cgroup_root``). On exit a daemon still running gets SIGTERM and must exit 0 within
    ``STOP_TIMEOUT_S``; otherwise it is killed and the block fails with its log. If
    the block raises, the daemon is killed and its log is attached to the exception
    as a note. The temporary directory made here (the log, plus the state directory
    and socket unless given) is removed afterwards.
    """
    if daemons_in_cgroup_mode() and "--cgroup-root" not in extra_args:
        with (
            cgroup_root() as root,
            running_daemon(
                state_dir, socket_path, [*extra_args, "--cgroup-root", str(root)], env
            ) as daemon,
        ):
            yield daemon
        return
    base = make_temp_dir()
    state = state_dir if state_dir is not None else base / "state"
    sock = socket_path if socket_path is not None else base / "run" / "agentsd.sock"
    log_path = base / "agentsd.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            daemon_command(sock, state, extra_args),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=daemon_env(base, env),
        )
    daemon = DaemonProcess(sock, state, process, log_path)
    try:
        wait_until_serving(daemon)
        yield daemon
    except BaseException as exc:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=STOP_TIMEOUT_S)
        exc.add_note(f"agentsd log ({sock}):\n{daemon.log()}")
        shutil.rmtree(base, ignore_errors=True)
        raise
    try:
        if process.poll() is None:
            code = daemon.stop()
            if code != 0:
                raise AssertionError(f"agentsd exited {code} on SIGTERM; its log:\n{daemon.log()}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_daemon(
    args: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float = START_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m agentsd ARGS`` that is expected to exit by itself (a refusal
    to start); its output is captured."""
    base = make_temp_dir()
    try:
        return subprocess.run(
            [sys.executable, "-m", "agentsd", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=daemon_env(base, env),
            timeout=timeout_s,
            check=False,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
