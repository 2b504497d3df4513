"""The daemon seen from a client: reaching it, asking it one quick question, starting
it detached, and waiting for it to answer or to be gone.

Rule 1: this module imports the standard library only. ``agentsctl status`` goes
through here and nothing heavier, because its cold start is budgeted at 3x
``python -c pass`` and importing msgspec alone costs about 4x on the reference
machine (it pulls in typing_extensions, inspect, uuid and decimal). The typed
``agentsctl.client.Client`` is built on ``connect`` below and speaks through
``agentsd_protocol``; ``Link`` speaks the same JSON-RPC 2.0 over newline-delimited
JSON with the stdlib ``json`` codec, for the handful of ``daemon.*`` calls on the
CLI's hot path and in its polling loops.

Rule 2: every failure to reach or keep the daemon is a ``DaemonUnreachable`` (or a
subclass) that names the socket path; an error the daemon *answered* is the
``agentsd_protocol.errors.RpcError`` subclass it raised, rebuilt by
``error_from_wire`` (imported only on that path, so only errors pay for msgspec).

Rule 3: a daemon started from here is nobody's child: it is spawned through a
short-lived intermediate, in its own session, so the caller never has a child to reap
and a terminal's hangup or Ctrl-C never reaches it.

Rule 4: "nothing answers at the socket" is not "no daemon". The daemon holding the
state directory's lock is named by the lock file (pid, socket, start time; see
``agentsd.paths`` Rule 3) and is believed only when the kernel says that pid holds
the lock (/proc/locks), the pid still has the recorded start time, and its command
line runs agentsd. Such a daemon whose socket is gone is a ``DaemonSocketLost``,
never a reason to start a second one or to say "not running".
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

# typing costs a few ms of cold start and is needed by the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, NoReturn

# The daemon's frame limit (agentsd_protocol.framing.DEFAULT_MAX_FRAME_BYTES), repeated
# here because that module imports msgspec; a test keeps the two equal.
MAX_REPLY_BYTES = 8 * 1024 * 1024
RECV_BYTES = 65536  # one read; replies to daemon.* calls fit in one
START_DEADLINE_S = 10.0  # trio's import alone takes ~0.25 s; recovery at start may take more
STOP_DEADLINE_S = 15.0  # shutdown closes every session: about one kill ladder
PROBE_TIMEOUT_S = 1.0  # one ping while polling; a healthy daemon answers in ~1 ms
POLL_FIRST_S = 0.01  # first pause between polls, doubled up to POLL_MAX_S
POLL_MAX_S = 0.1

StrPath = str | os.PathLike[str]


class DaemonUnreachable(Exception):
    """No daemon could be reached at ``socket_path``, or the connection to it failed."""

    def __init__(self, message: str, socket_path: StrPath) -> None:
        super().__init__(message)
        self.message = message
        self.socket_path = os.fspath(socket_path)


class DaemonNotRunning(DaemonUnreachable):
    """Nothing listens at ``socket_path`` (no socket file, or connection refused)."""


class DaemonDisconnected(DaemonUnreachable):
    """The daemon closed the connection, or it broke, before the awaited reply arrived.

    Whether a mutation sent on it took effect is unknown: retry it with the same
    ``clientOperationId`` to find out safely.
    """


class DaemonStartFailed(DaemonUnreachable):
    """A daemon was started but did not come to answer (see its log)."""


class DaemonSocketLost(DaemonUnreachable):
    """A daemon holds the state directory's lock but does not answer at
    ``socket_path`` (Rule 4); ``holder`` names it."""

    def __init__(self, message: str, socket_path: StrPath, holder: LockHolder) -> None:
        super().__init__(message, socket_path)
        self.holder = holder


LOCK_NAME = "agentsd.lock"  # agentsd.paths.LOCK_NAME; a test keeps the two equal


class LockHolder:
    """The daemon named by a state directory's lock file (Rule 4)."""

    __slots__ = ("pid", "socket_path", "start_time")

    def __init__(self, pid: int, socket_path: str, start_time: int | None) -> None:
        self.pid = pid
        self.socket_path = socket_path
        self.start_time = start_time

    def is_running(self) -> bool:
        """Whether this very process (same pid and start time) still runs."""
        return not process_gone(self.pid) and (
            self.start_time is None or _start_time(self.pid) == self.start_time
        )


def lock_holder(state_dir: StrPath) -> LockHolder | None:
    """The running daemon that holds ``state_dir``'s lock, verified (Rule 4); None
    when no daemon holds it."""
    path = os.path.join(os.fspath(state_dir), LOCK_NAME)
    try:
        with open(path, "rb") as lock_file:
            st = os.fstat(lock_file.fileno())
            lines = lock_file.read(8192).decode(errors="replace").split("\n")
    except OSError:
        return None
    try:
        pid = int(lines[0])
        start_time = int(lines[2]) if len(lines) > 2 and lines[2] else None
    except (ValueError, IndexError):
        return None
    holder = LockHolder(pid, lines[1] if len(lines) > 1 else "", start_time)
    locked_by = _flock_holders(st.st_dev, st.st_ino)
    if locked_by is not None and pid not in locked_by:
        return None  # a stale file: the daemon that wrote it is gone
    if not holder.is_running() or not _runs_agentsd(pid):
        return None
    return holder


def _flock_holders(dev: int, ino: int) -> set[int] | None:
    """The pids holding a lock on the file (dev, ino) per /proc/locks; None when the
    kernel does not say."""
    wanted = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    try:
        with open("/proc/locks", "rb") as locks:
            text = locks.read().decode(errors="replace")
    except OSError:
        return None
    pids = set()
    for line in text.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 00:2f:5678 0 EOF"; a waiter has "->" after the id.
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == wanted:
            pids.add(int(fields[4]))
    return pids


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # Field 22, counted after the parenthesised command name (field 2).
            return int(stat.read().rpartition(b")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _runs_agentsd(pid: int) -> bool:
    """Whether ``pid``'s command line runs agentsd (``python -m agentsd`` or the
    ``agentsd`` script)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            words = cmdline.read().split(b"\0")
    except OSError:
        return False
    return any(word == b"agentsd" or word.endswith(b"/agentsd") for word in words)


def default_state_dir(env: Mapping[str, str] = os.environ) -> str:
    """``agentsd_protocol.paths.default_state_dir`` as a str, without importing
    pathlib (about 0.3x of ``python -c pass``; Rule 1). A test keeps the two equal."""
    if explicit := env.get("AGENTSD_STATE_DIR"):
        return explicit
    if xdg := env.get("XDG_STATE_HOME"):
        return os.path.join(xdg, "agentsd")
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".local", "state", "agentsd")


def default_socket_path(env: Mapping[str, str] = os.environ, state_dir: str | None = None) -> str:
    """``agentsd_protocol.paths.default_socket_path`` as a str, without pathlib."""
    if explicit := env.get("AGENTSD_SOCKET"):
        return explicit
    if runtime := env.get("XDG_RUNTIME_DIR"):
        return os.path.join(runtime, "agentsd", "agentsd.sock")
    return os.path.join(state_dir or default_state_dir(env), "run", "agentsd.sock")


def connect(socket_path: StrPath, timeout_s: float | None) -> socket.socket:
    """Open a connected Unix stream socket to the daemon; the caller closes it.

    ``timeout_s`` bounds the connect and stays set as the socket's timeout.
    Raises ``DaemonNotRunning`` when nothing listens there and ``DaemonUnreachable``
    (with the path and the reason) on any other failure.
    """
    path = os.fspath(socket_path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        sock.connect(path)
    except BaseException as exc:
        sock.close()
        if isinstance(exc, FileNotFoundError | ConnectionRefusedError):
            raise DaemonNotRunning(f"agentsd is not running at {path}", path) from None
        if isinstance(exc, OSError):
            reason = exc.strerror or str(exc)
            raise DaemonUnreachable(f"cannot reach agentsd at {path}: {reason}", path) from None
        raise
    return sock


def receive(sock: socket.socket, socket_path: StrPath) -> bytes:
    """One ``recv``; ``b""`` means the daemon closed the connection.

    Raises ``TimeoutError`` when the socket's timeout passes and
    ``DaemonDisconnected`` when the connection broke.
    """
    try:
        return sock.recv(RECV_BYTES)
    except TimeoutError:
        raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise DaemonDisconnected(
            f"connection to agentsd at {os.fspath(socket_path)} broke: {reason}", socket_path
        ) from None


def send(sock: socket.socket, data: bytes, socket_path: StrPath) -> None:
    """Send all of ``data``; ``DaemonDisconnected`` if the connection is gone."""
    try:
        sock.sendall(data)
    except TimeoutError:
        raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise DaemonDisconnected(
            f"connection to agentsd at {os.fspath(socket_path)} broke: {reason}", socket_path
        ) from None


def _raise_parse_error(message: str) -> NoReturn:
    from agentsd_protocol.errors import ParseError

    raise ParseError(message)


def _raise_wire_error(error: object) -> NoReturn:
    import msgspec

    from agentsd_protocol.errors import ErrorObject, error_from_wire

    try:
        wire = msgspec.convert(error, ErrorObject)
    except msgspec.ValidationError as exc:
        _raise_parse_error(f"Parse error in an error from the daemon: {exc}")
    raise error_from_wire(wire)


class Link:
    """A blocking JSON-RPC 2.0 connection using the stdlib ``json`` codec.

    One request at a time; notifications that arrive meanwhile are dropped (the
    ``daemon.*`` methods used here subscribe to nothing). After any exception but an
    error reply the link is unusable. Not thread-safe. The connection is closed by
    ``close`` or by leaving the ``with`` block.
    """

    def __init__(self, socket_path: StrPath, *, timeout_s: float | None = 10.0) -> None:
        """Connect; ``DaemonUnreachable`` if no daemon answers at ``socket_path``."""
        self.socket_path = os.fspath(socket_path)
        self.timeout_s = timeout_s
        self._sock = connect(self.socket_path, timeout_s)
        self._buf = b""
        self._next_id = 1

    def __enter__(self) -> Link:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self._sock.close()

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send one request and return its result as plain JSON values.

        Raises the daemon's ``RpcError`` subclass for an error reply,
        ``DaemonDisconnected`` if the connection closes first, ``TimeoutError`` after
        ``timeout_s`` without the reply, and ``ParseError`` if the daemon sends
        something that is not JSON-RPC.
        """
        request_id = self._next_id
        self._next_id += 1
        request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
        send(
            self._sock,
            json.dumps(request, separators=(",", ":")).encode() + b"\n",
            self.socket_path,
        )
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            for message in self._read_messages(deadline, method):
                if not isinstance(message, dict):
                    _raise_parse_error(
                        "Parse error: the daemon sent a message that is not an object"
                    )
                if "method" in message:
                    continue  # a notification
                if message.get("id", request_id) not in (request_id, None):
                    continue  # a reply to nothing we wait for
                # id null: an error about a request the daemon could not parse, and
                # this one is the only request outstanding.
                if "error" in message:
                    _raise_wire_error(message["error"])
                if "result" not in message:
                    _raise_parse_error("Parse error: a reply with neither result nor error")
                return message["result"]

    def _read_messages(self, deadline: float | None, method: str) -> list[Any]:
        while (newline := self._buf.find(b"\n")) < 0:
            if len(self._buf) > MAX_REPLY_BYTES:
                _raise_parse_error(f"Parse error: a reply larger than {MAX_REPLY_BYTES} bytes")
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"agentsd at {self.socket_path} did not answer {method} "
                        f"within {self.timeout_s} s"
                    )
                self._sock.settimeout(remaining)
            try:
                data = receive(self._sock, self.socket_path)
            except TimeoutError:
                continue  # the deadline check above reports it
            if not data:
                raise DaemonDisconnected(
                    f"agentsd at {self.socket_path} closed the connection before answering {method}",
                    self.socket_path,
                )
            self._buf += data
        line, self._buf = self._buf[:newline], self._buf[newline + 1 :]
        if not line.strip():
            return []
        try:
            decoded = json.loads(line)
        except ValueError as exc:
            _raise_parse_error(f"Parse error in a message from the daemon: {exc}")
        # A batch reply is a JSON array of replies.
        return decoded if isinstance(decoded, list) else [decoded]


def quick_call(
    socket_path: StrPath,
    method: str,
    params: dict[str, Any] | None = None,
    *,
    timeout_s: float | None = 10.0,
) -> Any:
    """Connect, make one call, close. Raises what ``Link`` and ``connect`` raise."""
    with Link(socket_path, timeout_s=timeout_s) as link:
        return link.call(method, params)


def answers(socket_path: StrPath, *, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a daemon at ``socket_path`` answers ``daemon.ping`` now.

    A daemon that answers with an error (for example ``shutting_down``) answers.
    """
    try:
        quick_call(socket_path, "daemon.ping", timeout_s=timeout_s)
    except (DaemonUnreachable, TimeoutError):
        return False
    except Exception as exc:  # an RpcError is still an answer
        from agentsd_protocol.errors import RpcError

        if isinstance(exc, RpcError):
            return True
        raise
    return True


def listening(socket_path: StrPath) -> bool:
    """Whether anything accepts connections at ``socket_path`` now."""
    try:
        connect(socket_path, PROBE_TIMEOUT_S).close()
    except DaemonUnreachable:
        return False
    return True


def daemon_argv(
    socket_path: StrPath,
    *,
    state_dir: StrPath | None = None,
    log_level: str | None = None,
    config: StrPath | None = None,
) -> list[str]:
    """The command that runs the daemon with the same interpreter as this process."""
    argv = [sys.executable, "-m", "agentsd", "--socket", os.fspath(socket_path)]
    if state_dir is not None:
        argv += ["--state-dir", os.fspath(state_dir)]
    if log_level is not None:
        argv += ["--log-level", log_level]
    if config is not None:
        argv += ["--config", os.fspath(config)]
    return argv


# Runs in the intermediate: spawn the daemon in a new session with stdout joined to
# stderr (the log), print its pid, exit. The daemon is thereby re-parented away from
# the caller at once (Rule 3). posix_spawn leaves no Popen object behind to warn.
_DETACH = (
    "import os, sys\n"
    "pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ, setsid=True,\n"
    "                     file_actions=[(os.POSIX_SPAWN_DUP2, 2, 1)])\n"
    "print(pid)\n"
)


def spawn_detached(argv: Sequence[str], log_path: StrPath) -> int:
    """Start ``argv`` as a detached daemon and return its pid.

    The process runs in its own session with stdin from /dev/null and stdout and
    stderr appended to ``log_path`` (its directory is created 0700). It is not a
    child of this process. Raises ``OSError`` if it cannot be spawned.
    """
    import subprocess  # only here: it costs cold start (threading, signal, contextlib)

    log = os.fspath(log_path)
    os.makedirs(os.path.dirname(log) or ".", mode=0o700, exist_ok=True)
    # 0600: the daemon logs session titles, paths and agent errors.
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with open(fd, "ab") as log_file:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _DETACH, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_file,
            check=False,
        )
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        raise OSError(f"could not spawn {argv[0]} (see {log})")
    return int(done.stdout)


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie counts as exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The state letter follows the parenthesised command name.
            return stat.read().rpartition(b")")[2].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def wait_until_answering(
    socket_path: StrPath,
    *,
    pid: int | None = None,
    deadline_s: float = START_DEADLINE_S,
    log_path: StrPath | None = None,
) -> None:
    """Poll ``daemon.ping`` until the daemon answers.

    Raises ``DaemonStartFailed`` when ``deadline_s`` passes or, if ``pid`` is given,
    as soon as that process has exited while nothing answers (another daemon that
    won a start race and answers counts as success).
    """
    path = os.fspath(socket_path)
    see_log = f"; see {os.fspath(log_path)}" if log_path is not None else ""
    deadline = time.monotonic() + deadline_s
    pause = POLL_FIRST_S
    while not answers(path):
        if pid is not None and process_gone(pid) and not answers(path):
            raise DaemonStartFailed(
                f"agentsd (pid {pid}) exited before answering at {path}{see_log}", path
            )
        if time.monotonic() >= deadline:
            raise DaemonStartFailed(
                f"agentsd did not answer at {path} within {deadline_s} s{see_log}", path
            )
        time.sleep(pause)
        pause = min(pause * 2, POLL_MAX_S)


def wait_until_gone(socket_path: StrPath, *, deadline_s: float = STOP_DEADLINE_S) -> bool:
    """Poll until nothing accepts connections at ``socket_path``; False on deadline."""
    deadline = time.monotonic() + deadline_s
    pause = POLL_FIRST_S
    while listening(socket_path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, POLL_MAX_S)
    return True


def wait_until_exited(holder: LockHolder, *, deadline_s: float = STOP_DEADLINE_S) -> bool:
    """Poll until ``holder``'s process has exited; False on deadline."""
    deadline = time.monotonic() + deadline_s
    pause = POLL_FIRST_S
    while holder.is_running():
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, POLL_MAX_S)
    return True
