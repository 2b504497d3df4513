"""agentsd.systemd against real AF_UNIX sockets and real inherited descriptors."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from agentsd.systemd import (
    Notifier,
    SystemdEnvError,
    listen_fds,
    run_watchdog,
    watchdog_interval_s,
)

SYSTEMD_VARS = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
)


@pytest.fixture(autouse=True)
def systemd_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Start every test without the systemd variables; monkeypatch restores the
    original environment afterwards, whatever the code under test popped."""
    for name in SYSTEMD_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory directly under /tmp: pytest's tmp_path can outgrow the 108-byte
    AF_UNIX path limit."""
    path = Path(tempfile.mkdtemp(prefix="agentsd-sd-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def _bind_datagram(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.setblocking(False)
    return sock


def _drain(sock: socket.socket) -> list[bytes]:
    """Every datagram queued now. AF_UNIX datagrams are queued by sendto itself, so
    whatever was sent before this call is here."""
    datagrams = []
    while True:
        try:
            datagrams.append(sock.recv(4096))
        except BlockingIOError:
            return datagrams


@pytest.fixture(params=["path", "abstract"])
def listener(
    request: pytest.FixtureRequest, short_dir: Path, systemd_env: pytest.MonkeyPatch
) -> Iterator[socket.socket]:
    """A bound NOTIFY_SOCKET listener, named in the environment as systemd would."""
    if request.param == "path":
        path = str(short_dir / "notify")
        sock = _bind_datagram(path)
        systemd_env.setenv("NOTIFY_SOCKET", path)
    else:
        name = f"agentsd-test-{uuid.uuid4().hex}"
        sock = _bind_datagram(b"\0" + name.encode())
        systemd_env.setenv("NOTIFY_SOCKET", "@" + name)
    with sock:
        yield sock


@pytest.fixture
def notifier(listener: socket.socket) -> Iterator[Notifier]:
    """A Notifier built from the environment the listener fixture set up."""
    built = Notifier.from_env()
    yield built
    built.close()


# --- Notifier ----------------------------------------------------------------------


def test_datagrams_arrive_with_exact_contents(listener: socket.socket, notifier: Notifier) -> None:
    assert notifier.active
    notifier.ready()
    notifier.status("recovering 3 sessions")
    notifier.stopping()
    notifier.watchdog()
    notifier.notify(STATUS="serving", EXTEND_TIMEOUT_USEC=5_000_000)
    assert _drain(listener) == [
        b"READY=1",
        b"STATUS=recovering 3 sessions",
        b"STOPPING=1",
        b"WATCHDOG=1",
        b"STATUS=serving\nEXTEND_TIMEOUT_USEC=5000000",
    ]


def test_status_newlines_become_spaces(listener: socket.socket, notifier: Notifier) -> None:
    notifier.status("line one\nline two\r\nthree")
    assert _drain(listener) == [b"STATUS=line one line two three"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ready": 1}, "not an upper-case name"),
        ({"STATUS": "a\nWATCHDOG=1"}, "contains a newline"),
        ({}, "at least one field"),
    ],
)
def test_notify_rejects_malformed_fields(
    listener: socket.socket, notifier: Notifier, fields: dict[str, str | int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        notifier.notify(**fields)
    assert _drain(listener) == []


def test_notify_socket_is_removed_from_environ(notifier: Notifier) -> None:
    assert notifier.active
    assert "NOTIFY_SOCKET" not in os.environ
    # The point is the children: check what a spawned process really inherits.
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('NOTIFY_SOCKET'))"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert child.stdout.strip() == "None"


def test_without_notify_socket_everything_is_a_noop() -> None:
    notifier = Notifier.from_env()
    assert not notifier.active
    notifier.ready()
    notifier.status("x")
    notifier.stopping()
    notifier.watchdog()
    notifier.close()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("run/notify", "neither an absolute path nor an @abstract name"),
        ("vsock:2:1234", "neither an absolute path nor an @abstract name"),
        ("", "neither an absolute path nor an @abstract name"),
        ("@", "names no abstract socket"),
        ("/" + "x" * 107, "longer than the 107 bytes"),
        ("@" + "x" * 107, "longer than the 107 bytes"),
    ],
)
def test_malformed_notify_socket_is_a_clear_error(
    systemd_env: pytest.MonkeyPatch, value: str, message: str
) -> None:
    systemd_env.setenv("NOTIFY_SOCKET", value)
    with pytest.raises(SystemdEnvError, match=message) as excinfo:
        Notifier.from_env()
    assert "NOTIFY_SOCKET=" in str(excinfo.value)
    assert "NOTIFY_SOCKET" not in os.environ


def test_send_failure_is_logged_once_and_never_raised(
    systemd_env: pytest.MonkeyPatch, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    systemd_env.setenv("NOTIFY_SOCKET", str(short_dir / "nobody-listens"))
    notifier = Notifier.from_env()
    try:
        with caplog.at_level(logging.DEBUG, logger="agentsd.systemd"):
            notifier.ready()
            notifier.watchdog()
            notifier.stopping()
    finally:
        notifier.close()
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert "READY=1" in caplog.records[0].getMessage()


def test_close_makes_later_calls_noops(listener: socket.socket) -> None:
    notifier = Notifier.from_env()
    notifier.close()
    notifier.close()
    assert not notifier.active
    notifier.ready()
    assert _drain(listener) == []


# --- watchdog_interval_s -------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "1"}, 0.0000005),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "<ours>"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "<other>"}, None),
        ({"WATCHDOG_PID": "<ours>"}, None),
    ],
)
def test_watchdog_interval_is_half_the_period_for_this_pid(
    env: dict[str, str], expected: float | None
) -> None:
    pids = {"<ours>": str(os.getpid()), "<other>": str(os.getpid() + 1)}
    resolved = {k: pids.get(v, v) for k, v in env.items()}
    assert watchdog_interval_s(resolved) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WATCHDOG_USEC": "abc"}, "WATCHDOG_USEC='abc' is not a decimal integer"),
        ({"WATCHDOG_USEC": ""}, "WATCHDOG_USEC='' is not a decimal integer"),
        ({"WATCHDOG_USEC": "-5"}, "is not a decimal integer"),
        ({"WATCHDOG_USEC": " 5"}, "is not a decimal integer"),
        ({"WATCHDOG_USEC": "5_000"}, "is not a decimal integer"),
        ({"WATCHDOG_USEC": "1e6"}, "is not a decimal integer"),
        ({"WATCHDOG_USEC": "0"}, "WATCHDOG_USEC='0' must be at least 1"),
        ({"WATCHDOG_USEC": str(2**64 - 1)}, "must be at least 1 and at most"),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "me"}, "WATCHDOG_PID='me'"),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "0"}, "WATCHDOG_PID='0' must be"),
    ],
)
def test_watchdog_interval_garbage_is_a_clear_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(SystemdEnvError, match=message):
        watchdog_interval_s(env)


# --- run_watchdog --------------------------------------------------------------------


async def _record_pings(
    sock: socket.socket, pings: list[float], *, task_status: trio.TaskStatus[None]
) -> None:
    """Append the trio time of every datagram (all must be WATCHDOG=1)."""
    tsock = trio.socket.from_stdlib_socket(sock)
    task_status.started()
    while True:
        datagram = await tsock.recv(4096)
        assert datagram == b"WATCHDOG=1"
        pings.append(trio.current_time())


async def test_watchdog_pings_at_the_interval(
    listener: socket.socket, notifier: Notifier, autojump_clock: trio.testing.MockClock
) -> None:
    pings: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(_record_pings, listener, pings)
        start = trio.current_time()
        await nursery.start(run_watchdog, notifier, 10.0, lambda: True)
        await trio.sleep(35)
        nursery.cancel_scope.cancel()
    assert [round(t - start, 6) for t in pings] == [0, 10, 20, 30]


async def test_watchdog_pings_stop_while_unhealthy(
    listener: socket.socket, notifier: Notifier, autojump_clock: trio.testing.MockClock
) -> None:
    pings: list[float] = []
    healthy = True
    async with trio.open_nursery() as nursery:
        await nursery.start(_record_pings, listener, pings)
        start = trio.current_time()
        await nursery.start(run_watchdog, notifier, 10.0, lambda: healthy)
        await trio.sleep(15)
        healthy = False
        await trio.sleep(30)
        healthy = True
        await trio.sleep(20)
        nursery.cancel_scope.cancel()
    assert [round(t - start, 6) for t in pings] == [0, 10, 50, 60]


async def test_watchdog_skips_a_late_tick_then_rechecks_soon(
    listener: socket.socket, notifier: Notifier, autojump_clock: trio.testing.MockClock
) -> None:
    pings: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(_record_pings, listener, pings)
        start = trio.current_time()
        await nursery.start(run_watchdog, notifier, 10.0, lambda: True)
        await trio.sleep(5)
        # Time passes without any task running: exactly what a blocked loop looks
        # like to the tick due at 10, which wakes at 17, 7 s late (limit 5 s).
        autojump_clock.jump(12)
        await trio.sleep(15)
        nursery.cancel_scope.cancel()
    # Skipped at 17, re-checked a quarter interval later, then every interval.
    assert [round(t - start, 6) for t in pings] == [0, 19.5, 29.5]


async def test_watchdog_sends_nothing_for_a_blocked_loop(
    listener: socket.socket, notifier: Notifier
) -> None:
    """Real time: the one test here that must block the loop for real."""
    interval_s = 0.2
    recheck_s = interval_s / 4
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(run_watchdog, notifier, interval_s, lambda: True)
            assert _drain(listener) == [b"WATCHDOG=1"]
            time.sleep(0.5)  # noqa: ASYNC251 -- blocking the loop is the point
            unblocked = trio.current_time()
            # The late tick runs now; once every task sleeps again, it has decided.
            await trio.testing.wait_all_tasks_blocked()
            decided = trio.current_time()
            after_block = _drain(listener)
            # Nothing from the late tick. A ping here could only be the legitimate
            # re-check, and only if this machine stalled for a whole re-check delay.
            assert after_block == [] or decided - unblocked >= recheck_s
            # The loop is responsive again, so pings resume.
            await trio.sleep(interval_s)
            assert _drain(listener) != []
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("interval_s", [0.0, -1.0, float("nan"), float("inf")])
async def test_watchdog_rejects_a_bad_interval(interval_s: float) -> None:
    with pytest.raises(ValueError, match="positive number of seconds"):
        await run_watchdog(Notifier(None), interval_s, lambda: True)


# --- listen_fds ----------------------------------------------------------------------

# Runs in a child: puts the passed descriptors at fd 3, 4, ... as systemd would, sets
# LISTEN_PID to its own pid, calls listen_fds and reports what it got as JSON.
_LISTEN_CHILD = r"""
import fcntl, json, os, socket, sys
from agentsd.systemd import SystemdEnvError, listen_fds

setup = json.loads(sys.argv[1])
# Park the passed fds high first, so that placing them at 3.. cannot clobber one.
parked = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in setup["fds"]]
for target, fd in enumerate(parked, start=3):
    os.dup2(fd, target)
for fd in parked:
    os.close(fd)
if setup["close3"]:
    os.close(3)
os.environ.update(setup["env"])
if setup["our_pid"]:
    os.environ["LISTEN_PID"] = str(os.getpid())
report = {}
try:
    got = listen_fds()
except SystemdEnvError as exc:
    report["error"] = str(exc)
    got = []
report["env_left"] = sorted(k for k in os.environ if k.startswith("LISTEN_"))
report["sockets"] = [
    {
        "fd": s.fd,
        "name": s.name,
        "sockname": s.sock.getsockname(),
        "type": int(s.sock.type),
        "inheritable": s.sock.get_inheritable(),
    }
    for s in got
]
# The inherited listener must be usable as is: the parent queued a connection.
for s in got:
    conn, _ = s.sock.accept()
    conn.sendall(s.name.encode())
    conn.close()
print(json.dumps(report))
"""


def _run_listen_child(
    fds: list[int], env: dict[str, str], *, our_pid: bool = True, close3: bool = False
) -> dict[str, object]:
    setup = {"fds": fds, "env": env, "our_pid": our_pid, "close3": close3}
    child = subprocess.run(
        [sys.executable, "-c", _LISTEN_CHILD, json.dumps(setup)],
        pass_fds=fds,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    report: dict[str, object] = json.loads(child.stdout)
    return report


def _listening_unix(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen()
    return sock


def test_listen_fds_returns_inherited_sockets_with_names(short_dir: Path) -> None:
    with (
        _listening_unix(short_dir / "a.sock") as first,
        _listening_unix(short_dir / "b.sock") as second,
        socket.socket(socket.AF_UNIX) as client_a,
        socket.socket(socket.AF_UNIX) as client_b,
    ):
        client_a.connect(str(short_dir / "a.sock"))
        client_b.connect(str(short_dir / "b.sock"))
        report = _run_listen_child(
            [first.fileno(), second.fileno()],
            {"LISTEN_FDS": "2", "LISTEN_FDNAMES": "agentsd.socket:extra"},
        )
        assert report == {
            "env_left": [],
            "sockets": [
                {
                    "fd": 3,
                    "name": "agentsd.socket",
                    "sockname": str(short_dir / "a.sock"),
                    "type": socket.SOCK_STREAM,
                    "inheritable": False,
                },
                {
                    "fd": 4,
                    "name": "extra",
                    "sockname": str(short_dir / "b.sock"),
                    "type": socket.SOCK_STREAM,
                    "inheritable": False,
                },
            ],
        }
        assert client_a.recv(100) == b"agentsd.socket"
        assert client_b.recv(100) == b"extra"
    # Nothing unlinked the paths: they belong to whoever bound them.
    assert (short_dir / "a.sock").exists()
    assert (short_dir / "b.sock").exists()


def test_listen_fds_without_names_reports_unknown(short_dir: Path) -> None:
    with (
        _listening_unix(short_dir / "a.sock") as first,
        socket.socket(socket.AF_UNIX) as client,
    ):
        client.connect(str(short_dir / "a.sock"))
        report = _run_listen_child([first.fileno()], {"LISTEN_FDS": "1"})
    assert report["sockets"] == [
        {
            "fd": 3,
            "name": "unknown",
            "sockname": str(short_dir / "a.sock"),
            "type": socket.SOCK_STREAM,
            "inheritable": False,
        }
    ]


def test_listen_fds_for_another_pid_returns_nothing(short_dir: Path) -> None:
    with _listening_unix(short_dir / "a.sock") as first:
        report = _run_listen_child(
            [first.fileno()],
            {"LISTEN_FDS": "1", "LISTEN_PID": "1", "LISTEN_FDNAMES": "agentsd.socket"},
            our_pid=False,
        )
    assert report == {"env_left": [], "sockets": []}


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("file", "LISTEN_FDS='1' but fd 3 is not a socket"),
        ("closed", "LISTEN_FDS='1' but fd 3 is not open"),
    ],
)
def test_listen_fds_refuses_fds_that_are_not_open_sockets(
    short_dir: Path, kind: str, message: str
) -> None:
    with open(short_dir / "plain", "wb") as plain:
        report = _run_listen_child([plain.fileno()], {"LISTEN_FDS": "1"}, close3=(kind == "closed"))
    error = report["error"]
    assert isinstance(error, str)
    assert message in error
    assert report["env_left"] == []


def test_listen_fds_without_variables_returns_nothing() -> None:
    assert listen_fds() == []


def test_listen_fds_for_another_pid_in_process_unsets_variables(
    systemd_env: pytest.MonkeyPatch,
) -> None:
    systemd_env.setenv("LISTEN_PID", str(os.getpid() + 1))
    systemd_env.setenv("LISTEN_FDS", "1")
    systemd_env.setenv("LISTEN_FDNAMES", "agentsd.socket")
    assert listen_fds() == []
    assert not any(k.startswith("LISTEN_") for k in os.environ)


@pytest.mark.parametrize(
    ("pid", "fds", "names", "message"),
    [
        ("<ours>", "abc", None, "LISTEN_FDS='abc' is not a decimal integer"),
        ("<ours>", "", None, "LISTEN_FDS='' is not a decimal integer"),
        ("<ours>", "-1", None, "LISTEN_FDS='-1' is not a decimal integer"),
        ("<ours>", "1 ", None, "LISTEN_FDS='1 ' is not a decimal integer"),
        ("abc", "1", None, "LISTEN_PID='abc' is not a decimal integer"),
        ("0", "1", None, "LISTEN_PID='0' must be at least 1"),
        ("<ours>", "2", "agentsd.socket", "LISTEN_FDNAMES='agentsd.socket' has 1 names but"),
        ("<ours>", "1", "a:b", "LISTEN_FDNAMES='a:b' has 2 names but LISTEN_FDS='1'"),
    ],
)
def test_listen_fds_garbage_is_a_clear_error(
    systemd_env: pytest.MonkeyPatch, pid: str, fds: str, names: str | None, message: str
) -> None:
    # Every case fails before any descriptor is looked at, so it is safe in-process.
    systemd_env.setenv("LISTEN_PID", str(os.getpid()) if pid == "<ours>" else pid)
    systemd_env.setenv("LISTEN_FDS", fds)
    if names is not None:
        systemd_env.setenv("LISTEN_FDNAMES", names)
    with pytest.raises(SystemdEnvError, match=message):
        listen_fds()
    assert not any(k.startswith("LISTEN_") for k in os.environ)


def test_listen_fds_zero_returns_nothing(systemd_env: pytest.MonkeyPatch) -> None:
    systemd_env.setenv("LISTEN_PID", str(os.getpid()))
    systemd_env.setenv("LISTEN_FDS", "0")
    assert listen_fds() == []
