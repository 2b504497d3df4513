"""The daemon as a systemd user service, with the real daemon in a real subprocess.

No systemd runs here, so each test plays the service manager's part with the same
kernel interfaces: a ``NOTIFY_SOCKET`` datagram listener (readiness, status,
stopping, watchdog), the real ``systemd-socket-activate`` (socket activation),
SIGTERM to the main process alone (``KillMode=mixed``) under the unit's own
``TimeoutStopSec=``, and a ``JOURNAL_STREAM`` naming the daemon's stderr (journald
logging).

Every wait has a deadline; the only deliberate sleep is the window during which the
daemon is kept stopped (SIGSTOP) to show that its watchdog goes quiet. Every process
a test starts is ended by that test, including agent children a SIGKILLed daemon
left behind. Only the socket-activation test needs a tool (Debian/Ubuntu package
``systemd``); it skips when the tool is missing, except under CI, where it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from agentsd.procfs import ProcInfo, is_same_process, read_proc_info, scan_processes
from agentsd.server import DATABASE_NAME, SOCKET_UNIT_NAME, STATUS_INTERVAL_S
from tests.daemon_process import (
    IO_TIMEOUT_S,
    POLL_S,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    DaemonProcess,
    WireClient,
    daemon_command,
    daemon_env,
    make_temp_dir,
    no_holder_config,
    running_daemon,
    wait_until_serving,
)
from tests.e2e.notify_listener import Notification, NotifyListener
from tests.e2e.test_units import SERVICE_UNIT, _require_tool, _seconds, _unit_settings
from tests.fake_shell import write_shell

CLOSE_LADDER_S = 2 + 3 + 2
"""The daemon's default close ladder (stdin EOF, SIGTERM, SIGKILL), in seconds."""

STATUS_LINE = re.compile(
    r"(?P<total>\d+) sessions, (?P<running>\d+) running, (?P<working>\d+) working, "
    r"(?P<attention>\d+) need attention; (?P<clients>\d+) clients"
)
"""The periodic ``STATUS=`` text, as ``systemctl status`` shows it."""

WATCHDOG_USEC = 400_000
"""A 0.4 s ``WatchdogSec=``: the daemon pings every 0.2 s, so a test sees many."""

SIGSTOP_WINDOW_S = 1.0
"""How long the daemon is kept stopped: 2.5 watchdog periods, so systemd would have
killed it, and 5 ping intervals during which none may arrive."""

_EXEC_WITH_WATCHDOG_PID = (
    "import os, sys; os.environ['WATCHDOG_PID'] = str(os.getpid()); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)
"""systemd sets ``WATCHDOG_PID`` to the main pid; exec keeps the pid, so this wrapper
makes it name the daemon that runs after it."""

_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


# --- helpers -------------------------------------------------------------------------


def wait_until(check: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    """Poll ``check`` until true; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(POLL_S)


def start_daemon(
    base: Path,
    state: Path,
    sock: Path,
    *,
    env: Mapping[str, str],
    argv: Sequence[str] | None = None,
    log: Path | None = None,
) -> DaemonProcess:
    """Start ``argv`` (default ``python -m agentsd``) with its stdout and stderr in a
    log file, without waiting for anything. Its ``$SHELL`` is a login shell without
    start-up files: given a notify socket the daemon captures its agents' environment
    from it (``agent_env = "auto"``), and no test here may depend on this host's."""
    log_path = log or base / "agentsd.log"
    shell = write_shell(base / "login-shell", ": no start-up files")
    env = {"SHELL": str(shell), **env}
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            list(argv) if argv is not None else daemon_command(sock, state),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=daemon_env(base, env),
        )
    return DaemonProcess(sock, state, process, log_path)


@contextlib.contextmanager
def reaped(daemon: DaemonProcess) -> Iterator[DaemonProcess]:
    """On the way out, a daemon still running (even a stopped one) is killed and
    reaped; on a failure its log is attached to the error."""
    try:
        yield daemon
    except BaseException as exc:
        exc.add_note(f"agentsd log ({daemon.log_path}):\n{daemon.log()}")
        raise
    finally:
        if daemon.process.poll() is None:
            daemon.process.send_signal(signal.SIGCONT)
            daemon.process.kill()
            daemon.process.wait(timeout=STOP_TIMEOUT_S)


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """A short private directory under /tmp, whose agents are all ended afterwards:
    a test that fails half-way must not leave a SIGKILLed daemon's children behind."""
    base = make_temp_dir()
    try:
        yield base
    finally:
        with contextlib.suppress(sqlite3.Error):
            for carrier in token_carriers(lease_tokens(base / "state")):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(carrier.pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


def db_rows(state: Path, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Rows from the daemon's database through a read-only connection."""
    database = state / DATABASE_NAME
    if not database.exists():
        return []
    uri = f"{database.as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=IO_TIMEOUT_S)) as conn:
        return conn.execute(sql, params).fetchall()


def lease_tokens(state: Path) -> list[str]:
    return [token for (token,) in db_rows(state, "SELECT token FROM leases")]


def token_carriers(tokens: Sequence[str]) -> list[ProcInfo]:
    """Live processes carrying any of the spawn ``tokens`` in their environment."""
    if not tokens:
        return []
    table = scan_processes(tokens)
    return [proc for token in tokens for proc in table.carrying(token)]


def journal(state: Path, session_id: str) -> list[tuple[str, dict[str, Any]]]:
    rows = db_rows(
        state, "SELECT kind, body FROM events WHERE session_id = ? ORDER BY seq", [session_id]
    )
    return [(kind, json.loads(body)) for kind, body in rows]


def create_sessions(client: WireClient, options: Sequence[dict[str, Any]]) -> list[str]:
    """Create one mock session per options object, all requests in flight at once (the
    daemon serves them concurrently); returns their ids once every child is live."""
    for index, opts in enumerate(options):
        client.send(
            {
                "jsonrpc": "2.0",
                "id": index,
                "method": "agentSession.create",
                "params": {"provider": "mock", "cwd": "/tmp", "options": opts},
            }
        )
    replies = {}
    for _ in options:
        reply = client.recv()
        assert "result" in reply, reply
        assert reply["result"]["phase"] == "running", reply
        replies[reply["id"]] = reply["result"]["sessionId"]
    return [replies[index] for index in range(len(options))]


def log_says(daemon: DaemonProcess, text: str) -> bool:
    return text in daemon.log()


def wait_stopped(pid: int) -> None:
    """Until ``pid`` is in the stopped state (SIGSTOP takes effect asynchronously)."""

    def stopped() -> bool:
        info = read_proc_info(pid)
        return info is not None and info.state in ("T", "t")

    wait_until(stopped, timeout_s=IO_TIMEOUT_S, what=f"pid {pid} stopped")


def status_counts(note: Notification) -> dict[str, int]:
    match = STATUS_LINE.fullmatch(note.fields["STATUS"])
    assert match is not None, note
    return {name: int(value) for name, value in match.groupdict().items()}


def service_timeout_stop_s() -> float:
    [value] = _unit_settings(SERVICE_UNIT)["Service"]["TimeoutStopSec"]
    return _seconds(value)


# --- sd_notify: READY=1, STATUS=, STOPPING=1 -------------------------------------------


@pytest.mark.slow
def test_ready_only_after_recovery_and_serving_then_status_and_stopping() -> None:
    """Without the holder (``holder = false``): the orphan left by a SIGKILL is ended
    by the next daemon's recovery, before READY=1."""
    with scratch() as base, no_holder_config() as config:
        state, sock = base / "state", base / "run" / "agentsd.sock"

        # A previous daemon dies by SIGKILL and leaves a held lease whose child lives
        # on (ignoreEof: it does not notice its stdin closing).
        with (
            running_daemon(state_dir=state, socket_path=sock, extra_args=config) as previous,
            previous.connect() as c,
        ):
            [orphaned] = create_sessions(c, [{"ignoreEof": True}])
            previous.process.kill()
            previous.wait()
        [(token, pid, start_time, lease_state)] = db_rows(
            state, "SELECT token, pid, start_time, state FROM leases"
        )
        assert lease_state == "live"
        assert is_same_process(pid, start_time), "the orphan must outlive its daemon"

        with NotifyListener.bound(base) as notify:
            argv = daemon_command(sock, state, config)
            daemon = start_daemon(base, state, sock, env=notify.env, argv=argv)
            with reaped(daemon):
                ready = notify.wait_for(
                    "READY", "1", process=daemon.process, timeout_s=START_TIMEOUT_S
                )
                # Freeze the daemon the moment READY arrives: what is true now was
                # done before READY was sent (or at most a few instructions after).
                daemon.process.send_signal(signal.SIGSTOP)
                wait_stopped(daemon.process.pid)
                try:
                    # Recovery ran: the orphan is gone and its session was settled,
                    # committed (a reader sees it) and stamped before READY was sent.
                    assert not is_same_process(pid, start_time)
                    assert token_carriers([token]) == []
                    exited = [
                        (ts, json.loads(body))
                        for ts, body in db_rows(
                            state,
                            "SELECT ts, body FROM events WHERE session_id = ? AND kind = ?",
                            [orphaned, "child.exited"],
                        )
                    ]
                    assert [body["cause"] for _, body in exited] == ["daemon-restart"], exited
                    [(lease_state, released_at)] = db_rows(
                        state, "SELECT state, released_at FROM leases"
                    )
                    assert lease_state == "released"
                    assert ready.sent_at is not None
                    assert exited[0][0] <= ready.sent_at and released_at <= ready.sent_at
                    # The socket listens: the kernel queues this connection and its
                    # request, answered as soon as the daemon runs again.
                    client = WireClient(sock)
                    client.send({"jsonrpc": "2.0", "id": "at-ready", "method": "daemon.ping"})
                finally:
                    daemon.process.send_signal(signal.SIGCONT)
                with client:
                    pong = client.recv()
                assert pong == {"jsonrpc": "2.0", "id": "at-ready", "result": {"pong": True}}
                assert ready.sender_pid == daemon.process.pid  # NotifyAccess=main

                # STATUS= carries the session counts: the recovered session is known
                # and stopped; a new one shows up running at the next report.
                first = notify.wait_for(
                    "STATUS", STATUS_LINE, process=daemon.process, timeout_s=IO_TIMEOUT_S
                )
                counts = status_counts(first)
                assert (counts["total"], counts["running"]) == (1, 0), first
                with daemon.connect() as c:
                    # ignoreEof: the shutdown below then takes the ladder's first
                    # step (2 s), long enough to see STOPPING=1 while it runs.
                    create_sessions(c, [{"ignoreEof": True}])
                    deadline = time.monotonic() + STATUS_INTERVAL_S + IO_TIMEOUT_S
                    while counts["running"] != 1:
                        remaining_s = deadline - time.monotonic()
                        note = notify.wait_for(
                            "STATUS", STATUS_LINE, process=daemon.process, timeout_s=remaining_s
                        )
                        counts = status_counts(note)
                    assert counts["total"] == 2, counts

                daemon.process.send_signal(signal.SIGTERM)
                stopping = notify.wait_for(
                    "STOPPING", "1", process=daemon.process, timeout_s=IO_TIMEOUT_S
                )
                assert daemon.process.poll() is None, "STOPPING=1 must come while stopping"
                notify.wait_for(
                    "STATUS",
                    "closing 1 running sessions",
                    process=daemon.process,
                    timeout_s=IO_TIMEOUT_S,
                )
                assert daemon.wait(CLOSE_LADDER_S + STOP_TIMEOUT_S) == 0
                assert stopping.sender_pid == daemon.process.pid

            notify.drain()
            said = [note.fields for note in notify.received]
            assert said.count({"READY": "1"}) == 1, said
            assert said.index({"READY": "1"}) < said.index({"STOPPING": "1"}), said
            assert {note.sender_pid for note in notify.received} == {daemon.process.pid}
            assert token_carriers(lease_tokens(state)) == []


# --- the watchdog --------------------------------------------------------------------


def _pings(notes: Sequence[Notification]) -> list[Notification]:
    return [note for note in notes if note.fields.get("WATCHDOG") == "1"]


def _sent_times(notes: Sequence[Notification]) -> list[float]:
    """When each was sent, by the kernel's stamp (every datagram must carry one)."""
    times = [note.sent_at for note in notes if note.sent_at is not None]
    assert len(times) == len(notes), notes
    return times


def _late_wakeups(daemon: DaemonProcess) -> list[str]:
    """The daemon's log lines saying the watchdog skipped a late tick."""
    return [line for line in daemon.log().splitlines() if "watchdog: event loop woke" in line]


def test_watchdog_pings_stop_while_the_event_loop_is_blocked_and_resume_after() -> None:
    """Everything a ``Type=notify`` unit with ``WatchdogSec=`` gives the daemon,
    including ``JOURNAL_STREAM``: the skipped-ping warning reaches journald at
    priority 4 (warning)."""
    with scratch() as base, NotifyListener.bound(base) as notify:
        state, sock, log = base / "state", base / "run" / "agentsd.sock", base / "agentsd.log"
        log.touch()
        stream = log.stat()
        env = notify.env | {
            "WATCHDOG_USEC": str(WATCHDOG_USEC),
            "JOURNAL_STREAM": f"{stream.st_dev}:{stream.st_ino}",
        }
        argv = [sys.executable, "-c", _EXEC_WITH_WATCHDOG_PID, *daemon_command(sock, state)[1:]]
        daemon = start_daemon(base, state, sock, env=env, argv=argv, log=log)
        with reaped(daemon):
            # The watchdog runs before READY=1: its first tick pings at once.
            first = notify.wait_for(
                "WATCHDOG", "1", process=daemon.process, timeout_s=START_TIMEOUT_S
            )
            notify.wait_for("READY", "1", process=daemon.process, timeout_s=IO_TIMEOUT_S)
            for _ in range(3):
                notify.wait_for("WATCHDOG", "1", process=daemon.process, timeout_s=IO_TIMEOUT_S)
            before = _pings(notify.received)
            gaps = sorted(b - a for a, b in pairwise(_sent_times(before)))
            # Every half WATCHDOG_USEC, as sd_watchdog_enabled(3) recommends.
            assert 0.1 <= gaps[len(gaps) // 2] <= WATCHDOG_USEC / 1e6, gaps
            assert first.sender_pid == daemon.process.pid
            warned = _late_wakeups(daemon)

            # Block the daemon's event loop: a stopped process runs nothing.
            daemon.process.send_signal(signal.SIGSTOP)
            try:
                wait_stopped(daemon.process.pid)
                blocked_from = time.time()
                time.sleep(SIGSTOP_WINDOW_S)  # the deliberate block
                blocked_until = time.time()
                notify.skip_queued()  # the waits below count only pings sent after
            finally:
                daemon.process.send_signal(signal.SIGCONT)

            # Back: the first tick sees how late it is and refuses to ping (one wake-up
            # proves little); pings resume a quarter interval later.
            for _ in range(3):
                notify.wait_for("WATCHDOG", "1", process=daemon.process, timeout_s=IO_TIMEOUT_S)
            sent = _sent_times(_pings(notify.received))
            assert not [t for t in sent if blocked_from <= t <= blocked_until], sent
            assert len([t for t in sent if t > blocked_until]) >= 3, sent
            late = _late_wakeups(daemon)[len(warned) :]
            assert late, daemon.log()
            # Under journald (JOURNAL_STREAM matches), a warning has priority 4.
            assert late[0].startswith("<4>agentsd.systemd: watchdog: event loop woke "), late
            daemon.ping()
            assert daemon.stop() == 0
        assert {note.sender_pid for note in notify.received} == {daemon.process.pid}


@pytest.mark.parametrize(
    ("watchdog_pid", "pings"),
    [("absent", True), ("another process", False)],
)
def test_watchdog_follows_watchdog_pid(watchdog_pid: str, pings: bool) -> None:
    """Without ``WATCHDOG_PID`` the period is ours; naming another process (the
    variables were inherited from a watched parent) turns the watchdog off."""
    with scratch() as base, NotifyListener.bound(base) as notify:
        state, sock = base / "state", base / "run" / "agentsd.sock"
        env = notify.env | {"WATCHDOG_USEC": str(WATCHDOG_USEC)}
        if watchdog_pid == "another process":
            env["WATCHDOG_PID"] = str(os.getpid())
        daemon = start_daemon(base, state, sock, env=env)
        with reaped(daemon):
            notify.wait_for("READY", "1", process=daemon.process, timeout_s=START_TIMEOUT_S)
            # An enabled watchdog pings before READY=1 (and then every 0.2 s): these
            # checks need no waiting for a ping that must not come.
            assert bool(_pings(notify.received)) is pings, notify.received
            daemon.ping()
            assert daemon.stop() == 0
        notify.drain()
        assert bool(_pings(notify.received)) is pings, notify.received


# --- socket activation ---------------------------------------------------------------


def listening_socket_inodes(path: Path) -> set[int]:
    """Inodes of the listening sockets bound to ``path`` (``/proc/net/unix``). One
    entry is one socket: a daemon that unlinked and re-bound the path would add a
    second, even if the file's inode number were reused."""
    so_acceptcon = 0x10000  # the "Flags" bit of a listening socket
    inodes = set()
    with open("/proc/net/unix", encoding="ascii", errors="replace") as table:
        next(table)  # the header
        for line in table:
            fields = line.split()
            if len(fields) >= 8 and fields[7] == str(path) and int(fields[3], 16) & so_acceptcon:
                inodes.add(int(fields[6]))
    return inodes


def fd_socket_inode(pid: int, fd: int) -> int:
    target = os.readlink(f"/proc/{pid}/fd/{fd}")
    match = re.fullmatch(r"socket:\[(\d+)\]", target)
    assert match is not None, target
    return int(match.group(1))


def file_identity(path: Path) -> tuple[int, ...]:
    """Everything that changes if the file is replaced, re-created or chmod-ed."""
    st = path.lstat()
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_nlink, st.st_ctime_ns)


_PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "PYTHONUNBUFFERED")
"""Variables ``systemd-socket-activate`` passes on (it starts the program with only
the ``-E`` ones), besides ``XDG_*``: what a user manager gives its services."""


@pytest.fixture
def socket_activate() -> str:
    return _require_tool("systemd-socket-activate")


@pytest.mark.parametrize("stop_by", ["daemon.shutdown", "SIGTERM"])
def test_socket_activation_starts_on_demand_and_never_rebinds(
    socket_activate: str, stop_by: str
) -> None:
    """Two activations in a row on one path, as a socket unit gives them: the first
    request starts the daemon and is answered on the inherited listener, which the
    daemon neither re-binds nor unlinks when it stops."""
    with scratch() as base:
        state = base / "state"
        runtime = base / "xdg-run"
        # Where agentsd.socket listens (ListenStream=%t/agentsd/agentsd.sock), so the
        # daemon, started without --socket like ExecStart=, computes the same path.
        sock = runtime / "agentsd" / "agentsd.sock"
        sock.parent.mkdir(parents=True, mode=0o700)
        passed = [*_PASSED_ENV, "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR", "SHELL"]
        argv = [
            socket_activate,
            f"--listen={sock}",
            f"--fdname={SOCKET_UNIT_NAME}",
            *(f"--setenv={name}" for name in passed),
            sys.executable,
            "-m",
            "agentsd",
            "--state-dir",
            str(state),
        ]
        for activation in (1, 2):
            log = base / f"activation-{activation}.log"
            daemon = start_daemon(base, state, sock, env={}, argv=argv, log=log)
            pid = daemon.process.pid
            with reaped(daemon):
                wait_until(
                    partial(log_says, daemon, f"Listening on {sock}"),
                    timeout_s=START_TIMEOUT_S,
                    what="systemd-socket-activate listens",
                )
                bound = file_identity(sock)
                [listener] = listening_socket_inodes(sock)
                assert fd_socket_inode(pid, 3) == listener
                # Nothing has started yet: the tool waits for a first connection.
                assert os.readlink(f"/proc/{pid}/exe") == os.path.realpath(socket_activate)

                with WireClient(sock, timeout_s=START_TIMEOUT_S) as client:
                    status = client.call("daemon.status")["result"]
                    # The same pid: the tool exec()ed the daemon, as systemd would.
                    assert status["pid"] == pid
                    assert status["socket"] == str(sock)
                    assert os.readlink(f"/proc/{pid}/exe") == os.path.realpath(sys.executable)
                    # Served on the inherited socket itself, never a new one.
                    assert listening_socket_inodes(sock) == {listener}
                    assert fd_socket_inode(pid, 3) == listener
                    assert file_identity(sock) == bound
                    if activation == 1 and stop_by == "daemon.shutdown":
                        assert "result" in client.call("daemon.shutdown")
                if activation == 2 or stop_by == "SIGTERM":
                    daemon.process.send_signal(signal.SIGTERM)
                assert daemon.wait() == 0
            # The socket unit's path outlives the daemon, untouched; nobody listens
            # until the next activation.
            assert file_identity(sock) == bound
            assert listening_socket_inodes(sock) == set()
            with pytest.raises(ConnectionRefusedError):
                WireClient(sock).close()


# --- stopping with live sessions -----------------------------------------------------


@pytest.mark.slow
def test_sigterm_with_50_live_sessions_ends_every_child_within_the_stop_timeout() -> None:
    """``systemctl stop`` with KillMode=mixed: SIGTERM to the daemon alone, SIGKILL to
    the whole cgroup after ``TimeoutStopSec=``. The daemon must have ended and reaped
    every agent, and recorded it, before that, including stubborn ones (ignoring
    stdin EOF and SIGTERM) and the setsid() grandchildren they leave behind."""
    timeout_stop_s = service_timeout_stop_s()
    with scratch() as base:
        state, sock = base / "state", base / "run" / "agentsd.sock"
        stubborn = {"ignoreEof": True, "ignoreSigterm": True, "spawnGrandchild": True}
        options = [
            stubborn if i % 10 == 0 else {"ignoreEof": True} if i % 10 == 5 else {}
            for i in range(50)
        ]
        with running_daemon(state_dir=state, socket_path=sock) as daemon:
            with daemon.connect() as client:
                sessions = create_sessions(client, options)
            leases = db_rows(state, "SELECT token, state FROM leases")
            assert len(leases) == 50 and {s for _, s in leases} == {"live"}, leases
            tokens = [token for token, _ in leases]
            wait_until(
                lambda: len(token_carriers(tokens)) == 50 + 5,
                timeout_s=IO_TIMEOUT_S,
                what="50 agents and 5 grandchildren run",
            )

            # The unit's TimeoutStopSec= is a real deadline (systemd SIGKILLs the cgroup
            # past it), so it is the one wait here that is a claim: stop() SIGKILLs and
            # fails past it, as systemd would; within it the daemon exits 0 by itself.
            code = daemon.stop(signal.SIGTERM, timeout_s=timeout_stop_s)
        assert code == 0, daemon.log()
        assert token_carriers(tokens) == []
        assert db_rows(state, "SELECT DISTINCT state FROM leases") == [("released",)]
        for session_id in sessions:
            assert any(kind == "child.exited" for kind, _ in journal(state, session_id))


# --- logging under journald ----------------------------------------------------------


@pytest.mark.parametrize("journal_stream", ["stderr", "absent", "another stream"])
def test_log_format_follows_journal_stream(journal_stream: str) -> None:
    """journald reads ``<N>`` as a line's priority and stamps its own time, so under
    it lines carry a priority and no timestamp; everywhere else (including a stale
    ``JOURNAL_STREAM`` inherited from a service) a person reads them: timestamps."""
    with scratch() as base:
        state, sock, log = base / "state", base / "run" / "agentsd.sock", base / "agentsd.log"
        log.touch()
        env = {}
        if journal_stream != "absent":
            target = log if journal_stream == "stderr" else base
            st = target.stat()
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        daemon = start_daemon(base, state, sock, env=env, log=log)
        with reaped(daemon):
            wait_until_serving(daemon)
            assert daemon.stop() == 0
        lines = daemon.log().splitlines()
        assert any("serving on" in line for line in lines), lines
        assert any("agentsd stopped" in line for line in lines), lines
        for line in lines:
            if journal_stream == "stderr":
                assert re.match(r"<[0-7]>agentsd[.\w]*: ", line), line
                assert _TIMESTAMP.search(line) is None, line
            else:
                assert re.match(_TIMESTAMP.pattern + r"\.\d{3} [A-Z]+ +agentsd", line), line
        if journal_stream == "stderr":
            assert any(line.startswith("<6>agentsd.server: agentsd ") for line in lines), lines
