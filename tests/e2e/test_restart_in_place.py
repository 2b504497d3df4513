"""``agentsctl daemon restart`` (and the unit's ``ExecReload=``) under a service
manager: the same pid executes the daemon again (``agentsd.reexec``).

As in ``tests/e2e/test_service.py`` each test plays systemd's part with the kernel
interfaces it uses: a ``NOTIFY_SOCKET`` datagram listener, and a listening socket
passed as fd 3 with ``LISTEN_PID``/``LISTEN_FDS``/``LISTEN_FDNAMES`` naming the
daemon's pid (a small wrapper sets them and executes the daemon, as systemd's
socket activation does). Every wait has a deadline; every process a test starts is
ended by that test (``scratch``), agents a holder keeps included.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest

import agentsd
from agentsctl.cli import EXIT_UNREACHABLE
from agentsd.holder_link import socket_path as holder_socket_path
from agentsd.procfs import is_same_process, read_proc_info
from agentsd.server import SOCKET_UNIT_NAME
from tests.daemon_process import (
    IO_TIMEOUT_S,
    START_TIMEOUT_S,
    DaemonProcess,
    WireClient,
    daemon_command,
    daemon_env,
    no_holder_config,
    running_daemon,
)
from tests.e2e.notify_listener import Notification, NotifyListener
from tests.e2e.test_service import (
    CLOSE_LADDER_S,
    create_sessions,
    db_rows,
    fd_socket_inode,
    file_identity,
    journal,
    lease_tokens,
    listening_socket_inodes,
    reaped,
    scratch,
    token_carriers,
    wait_until,
)
from tests.fake_shell import write_shell

RESTART_TIMEOUT_S = START_TIMEOUT_S + CLOSE_LADDER_S  # the old image's close, the new start
WATCHDOG_USEC = 2_000_000  # pings every second: some arrive while a test waits
START_SLACK_S = 0.05  # uptime is rounded to the ms (agentsctl.continuity.START_SLACK_S)

_ACTIVATE = (
    "import os, sys\n"
    "os.dup2(int(sys.argv[1]), 3)\n"
    "os.close(int(sys.argv[1]))\n"
    "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1', LISTEN_FDNAMES=sys.argv[2])\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[3:]])\n"
)
"""What systemd does for a socket-activated service: the listener at fd 3 and the
variables naming this pid, then the exec (which keeps the pid)."""


def listen(path: Path) -> socket.socket:
    """A listening socket at ``path`` as agentsd.socket makes it (0600 in 0700)."""
    path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


def start_activated(
    base: Path,
    state: Path,
    listener: socket.socket,
    *,
    env: Mapping[str, str],
    extra_args: Sequence[str] = (),
) -> DaemonProcess:
    """``python -m agentsd`` with ``listener`` passed as systemd passes it."""
    sock = Path(listener.getsockname())
    command = daemon_command(sock, state, extra_args)
    argv = [sys.executable, "-c", _ACTIVATE, str(listener.fileno()), SOCKET_UNIT_NAME]
    log_path = base / "agentsd.log"
    shell = write_shell(base / "login-shell", ": no start-up files")
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            [*argv, *command[1:]],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=daemon_env(base, {"SHELL": str(shell), **env}),
            pass_fds=[listener.fileno()],
        )
    return DaemonProcess(sock, state, process, log_path)


def anonymous_inodes(pid: int) -> set[int]:
    """The pipes and sockets ``pid`` holds open, by inode (never reused while open)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            match = re.fullmatch(r"(?:socket|pipe):\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
            if match is not None:
                inodes.add(int(match.group(1)))
    return inodes


def ended(pid: int) -> bool:
    """Gone, or a zombie nobody here may reap (a holder is never our child)."""
    info = read_proc_info(pid)
    return info is None or info.is_zombie


def listening_in(directory: Path) -> set[int]:
    """Inodes of the listening sockets bound in ``directory`` (``/proc/net/unix``
    names the path each was bound to: the daemon binds under a temporary name and
    renames it into place)."""
    so_acceptcon = 0x10000
    inodes = set()
    with open("/proc/net/unix", encoding="ascii", errors="replace") as table:
        next(table)
        for line in table:
            fields = line.split()
            listening = len(fields) >= 8 and int(fields[3], 16) & so_acceptcon
            if listening and Path(fields[7]).parent == directory:
                inodes.add(int(fields[6]))
    return inodes


def monotonic_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def rpc(sock: Path, method: str, params: Any = None) -> Any:
    with WireClient(sock, timeout_s=START_TIMEOUT_S) as client:
        reply = client.call(method, params)
    assert "result" in reply, reply
    return reply["result"]


def events(state: Path, session_id: str) -> list[tuple[str, dict[str, Any]]]:
    return journal(state, session_id)


def reattached(state: Path, session_id: str, times: int) -> bool:
    return [kind for kind, _ in events(state, session_id)].count("child.reattached") == times


def exit_causes(state: Path, session_id: str) -> list[str]:
    return [body["cause"] for kind, body in events(state, session_id) if kind == "child.exited"]


def said_between(
    notes: Sequence[Notification], first: Notification, last: Notification
) -> list[str]:
    """The keys of what was said after ``first`` and before ``last``."""
    start, end = notes.index(first), notes.index(last)
    return [key for note in notes[start + 1 : end] for key in note.fields]


def restart_cli(sock: Path) -> subprocess.CompletedProcess[str]:
    """``agentsctl daemon restart``, as the unit's ``ExecReload=`` runs it."""
    return subprocess.run(
        [sys.executable, "-m", "agentsctl.cli", "--socket", str(sock), "--no-start", "daemon",
         "restart"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


# --- without the holder: the pid and the socket stay, the agents end -----------------


def test_a_restart_in_place_keeps_the_pid_and_the_socket_and_nothing_else() -> None:
    """Without the holder (``holder = false``), so the restart closes the agent."""
    with (
        scratch() as base,
        NotifyListener.bound(base) as notify,
        no_holder_config() as config,
    ):
        state, sock = base / "state", base / "run" / "agentsd.sock"
        listener = listen(sock)
        inode = os.fstat(listener.fileno()).st_ino
        env = {**notify.env, "WATCHDOG_USEC": str(WATCHDOG_USEC)}
        daemon = start_activated(base, state, listener, env=env, extra_args=config)
        with reaped(daemon), listener:
            pid = daemon.process.pid
            first_ready = notify.wait_for(
                "READY", "1", process=daemon.process, timeout_s=START_TIMEOUT_S
            )
            assert fd_socket_inode(pid, 3) == inode
            with WireClient(sock) as client:
                [session_id] = create_sessions(client, [{}])
            agent = rpc(sock, "agentSession.get", {"sessionId": session_id})["session"]["child"]
            agent_info = read_proc_info(agent["pid"])
            assert agent_info is not None
            before = anonymous_inodes(pid)
            assert inode in before

            asked_usec = monotonic_usec()
            reply = rpc(sock, "daemon.restart")
            asked = time.time()
            assert reply["how"] == "service-manager" and reply["keepsAgents"] is False
            reloading = notify.wait_for(
                "RELOADING", "1", process=daemon.process, timeout_s=IO_TIMEOUT_S
            )
            # Accepting stopped before RELOADING=1 was said: this connection waits in
            # the socket's backlog, and the new image answers it.
            waiting = WireClient(sock, timeout_s=RESTART_TIMEOUT_S)
            with waiting:
                waiting.send({"jsonrpc": "2.0", "id": "backlog", "method": "daemon.status"})
                ready = notify.wait_for(
                    "READY", "1", process=daemon.process, timeout_s=RESTART_TIMEOUT_S
                )
                answer = waiting.recv()
            status = answer["result"]
            assert answer["id"] == "backlog"
            assert status["pid"] == pid
            assert time.time() - status["uptimeS"] > asked - START_SLACK_S, "the old image answered"

            # What systemd sees: the main pid says RELOADING=1 (stamped on the monotonic
            # clock, between the request and now), then READY=1, and nothing else that
            # changes the unit's state (never STOPPING=1).
            usec = int(reloading.fields["MONOTONIC_USEC"])
            assert asked_usec <= usec <= monotonic_usec()
            assert first_ready.sender_pid == reloading.sender_pid == ready.sender_pid == pid
            between = said_between(notify.received, reloading, ready)
            assert not {"READY", "STOPPING"} & set(between), between
            # The new image keeps the watchdog going (WATCHDOG_PID: the same pid).
            notify.wait_for("WATCHDOG", "1", process=daemon.process, timeout_s=IO_TIMEOUT_S)

            # The very socket systemd passed, still at fd 3, never bound again; and no
            # other pipe or socket of the old image crossed the exec.
            assert fd_socket_inode(pid, 3) == inode
            assert listening_socket_inodes(sock) == {inode}
            assert anonymous_inodes(pid) & before == {inode}

            # Without the holder the agent ended as at a stop, proven and recorded.
            assert exit_causes(state, session_id) == ["shutdown"]
            assert not is_same_process(agent["pid"], agent_info.start_time)
            assert rpc(sock, "daemon.ping") == {"pong": True}
            assert daemon.stop() == 0
        assert token_carriers(lease_tokens(state)) == []


def test_a_stop_during_a_restart_stops_instead() -> None:
    """``systemctl stop`` while a reload runs: SIGTERM to the main pid while the old
    image closes its agents (one that ignores stdin EOF keeps the ladder going for
    seconds) ends the daemon, with no new image started. Without the holder (``holder
    = false``), whose restart closes the agents."""
    with (
        scratch() as base,
        NotifyListener.bound(base) as notify,
        no_holder_config() as config,
    ):
        state, sock = base / "state", base / "run" / "agentsd.sock"
        listener = listen(sock)
        daemon = start_activated(base, state, listener, env=notify.env, extra_args=config)
        with reaped(daemon), listener:
            notify.wait_for("READY", "1", process=daemon.process, timeout_s=START_TIMEOUT_S)
            with WireClient(sock) as client:
                [session_id] = create_sessions(client, [{"ignoreEof": True}])
            rpc(sock, "daemon.restart")
            notify.wait_for("RELOADING", "1", process=daemon.process, timeout_s=IO_TIMEOUT_S)
            daemon.process.send_signal(signal.SIGTERM)
            notify.wait_for("STOPPING", "1", process=daemon.process, timeout_s=IO_TIMEOUT_S)
            assert daemon.wait(RESTART_TIMEOUT_S) == 0
            notify.drain()
            assert [n.fields for n in notify.received].count({"READY": "1"}) == 1
            assert "the restart under way is abandoned: stopping instead" in daemon.log()
            assert "restart: executing" not in daemon.log()
            assert exit_causes(state, session_id) == ["shutdown"]
        assert token_carriers(lease_tokens(state)) == []


def test_run_by_hand_a_restart_in_place_keeps_the_socket_it_bound() -> None:
    """Without a service manager the daemon binds its own socket: the restart hands
    the listener to the new image (``agentsd.socket_keeper`` Rule 5), never unlinked
    or bound again, so a client that connects while the old image closes its agents
    (one ignoring stdin EOF keeps that going for seconds) is answered by the new one;
    and the variable that hands it over never reaches an agent. Without the holder
    (``holder = false``), whose restart closes the agents."""
    with scratch() as base, no_holder_config() as config:
        state = base / "state"
        with running_daemon(state_dir=state, extra_args=config) as daemon:
            sock = daemon.socket
            [inode] = listening_in(sock.parent)
            bound = file_identity(sock)
            with WireClient(sock) as client:
                [session_id] = create_sessions(client, [{"ignoreEof": True}])
            rpc(sock, "daemon.restart")
            asked = time.time()
            with WireClient(sock, timeout_s=RESTART_TIMEOUT_S) as waiting:
                waiting.send({"jsonrpc": "2.0", "id": "backlog", "method": "daemon.status"})
                status = waiting.recv()["result"]
            assert status["pid"] == daemon.process.pid
            assert time.time() - status["uptimeS"] > asked - START_SLACK_S, "the old image answered"
            assert exit_causes(state, session_id) == ["shutdown"]  # the ladder ran meanwhile
            assert listening_in(sock.parent) == {inode}  # the same socket, never bound again
            assert file_identity(sock) == bound
            assert "restart: executing" in daemon.log()
            with WireClient(sock) as client:
                [fresh] = create_sessions(client, [{}])
            agent = rpc(sock, "agentSession.get", {"sessionId": fresh})["session"]["child"]["pid"]
            environ = Path(f"/proc/{agent}/environ").read_bytes().split(b"\0")
            assert not [v for v in environ if v.startswith(b"AGENTSD_KEPT_SOCKET=")], environ
        assert token_carriers(lease_tokens(state)) == []


# --- with the holder: the agents keep running -----------------------------------------


@attrs.frozen
class HeldTurn:
    """A mock session whose turn waits for an approval, held by the holder, through
    a restart in place."""

    daemon: DaemonProcess
    notify: NotifyListener
    state: Path
    sock: Path
    session_id: str
    approval_id: str
    pid: int
    start_time: int
    fence: int
    holder_pid: int


def holder_config(base: Path, extra: str = "") -> Path:
    path = base / "config.toml"
    path.write_text("holder = true\n" + extra)
    return path


def wait_event(sock: Path, session_id: str, kind: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def seen() -> bool:
        page = rpc(sock, "agentSession.history", {"sessionId": session_id, "afterSeq": 0})
        found[:] = [event for event in page["events"] if event["kind"] == kind]
        return bool(found)

    wait_until(seen, timeout_s=RESTART_TIMEOUT_S, what=f"{kind} in {session_id}")
    return found[0]


@contextlib.contextmanager
def held_turn(
    base: Path,
    notify: NotifyListener,
    *,
    extra_env: Mapping[str, str] | None = None,
    extra_config: str = "",
) -> Iterator[HeldTurn]:
    """A socket-activated daemon with ``holder = true`` (and ``extra_config``) and one
    held agent in a turn."""
    state, sock = base / "state", base / "run" / "agentsd.sock"
    listener = listen(sock)
    config = holder_config(base, extra_config)
    env = {**notify.env, **(extra_env or {})}
    daemon = start_activated(base, state, listener, env=env, extra_args=["--config", str(config)])
    with reaped(daemon), listener:
        notify.wait_for("READY", "1", process=daemon.process, timeout_s=START_TIMEOUT_S)
        session_id = rpc(sock, "agentSession.create", {"provider": "mock", "cwd": str(base)})[
            "sessionId"
        ]
        rpc(sock, "agentSession.send", {"sessionId": session_id, "text": "please approve"})
        approval_id = wait_event(sock, session_id, "approval.requested")["body"]["approvalId"]
        session = rpc(sock, "agentSession.get", {"sessionId": session_id})["session"]
        pid = session["child"]["pid"]
        info = read_proc_info(pid)
        assert info is not None and info.ppid != daemon.process.pid  # the holder's child
        yield HeldTurn(
            daemon=daemon,
            notify=notify,
            state=state,
            sock=sock,
            session_id=session_id,
            approval_id=approval_id,
            pid=pid,
            start_time=info.start_time,
            fence=session["fence"],
            holder_pid=info.ppid,
        )


def test_a_restart_in_place_hands_held_agents_over_instead_of_ending_them() -> None:
    with scratch() as base, NotifyListener.bound(base) as notify, held_turn(base, notify) as turn:
        done = restart_cli(turn.sock)
        assert done.returncode == 0, done.stderr
        assert "running agents kept running" in done.stdout, done.stdout
        reloading = notify.wait_for(
            "RELOADING", "1", process=turn.daemon.process, timeout_s=IO_TIMEOUT_S
        )
        ready = notify.wait_for("READY", "1", process=turn.daemon.process, timeout_s=IO_TIMEOUT_S)
        assert reloading.sender_pid == ready.sender_pid == turn.daemon.process.pid
        assert rpc(turn.sock, "daemon.status")["pid"] == turn.daemon.process.pid
        # The old image handed the agent over: it neither laddered it nor settled its
        # lease (a settle by the old image is the `shutdown` exit of a stop).
        assert "restart: 1 of 1 running agents handed over, kept by the holder" in turn.daemon.log()
        assert "shutdown" not in exit_causes(turn.state, turn.session_id)
        assert turn.daemon.stop() == 0
    assert token_carriers(lease_tokens(turn.state)) == []


def test_under_crash_policy_end_a_restart_ends_held_agents_as_a_stop_does() -> None:
    """``crash_policy = "end"``: the next image would end what it was handed, so the
    restart says so and ends the agents itself, through the close ladder."""
    with (
        scratch() as base,
        NotifyListener.bound(base) as notify,
        held_turn(base, notify, extra_config='crash_policy = "end"\n') as turn,
    ):
        reply = rpc(turn.sock, "daemon.restart")
        assert reply["keepsAgents"] is False
        notify.wait_for("RELOADING", "1", process=turn.daemon.process, timeout_s=IO_TIMEOUT_S)
        notify.wait_for("READY", "1", process=turn.daemon.process, timeout_s=RESTART_TIMEOUT_S)
        wait_until(
            lambda: exit_causes(turn.state, turn.session_id) == ["shutdown"],
            timeout_s=RESTART_TIMEOUT_S,
            what="the agent ended by the old image's ladder",
        )
        assert "handed over" not in turn.daemon.log()
        assert ended(turn.pid)
        assert turn.daemon.stop() == 0
    assert token_carriers(lease_tokens(turn.state)) == []


def _reattached_through(turn: HeldTurn, notify: NotifyListener, restarts: int) -> None:
    """``restarts`` restarts in place in a row, each one's new image reattaching the
    same agent under a higher fence; then the approval pending since before them is
    answered and the turn completes."""
    fence = turn.fence
    for restart in range(1, restarts + 1):
        assert restart_cli(turn.sock).returncode == 0
        notify.wait_for("READY", "1", process=turn.daemon.process, timeout_s=RESTART_TIMEOUT_S)
        wait_until(
            partial(reattached, turn.state, turn.session_id, restart),
            timeout_s=RESTART_TIMEOUT_S,
            what=f"reattached {restart} times",
        )
        assert is_same_process(turn.pid, turn.start_time)
        session = rpc(turn.sock, "agentSession.get", {"sessionId": turn.session_id})["session"]
        assert session["child"]["pid"] == turn.pid and session["fence"] > fence
        fence = session["fence"]
    assert exit_causes(turn.state, turn.session_id) == []
    rpc(
        turn.sock,
        "agentSession.respond",
        {"sessionId": turn.session_id, "approvalId": turn.approval_id, "decision": "accept"},
    )
    completed = wait_event(turn.sock, turn.session_id, "turn.completed")
    assert completed["body"]["outcome"] == "completed"
    assert turn.daemon.stop() == 0


def test_the_new_image_reattaches_the_held_agent_and_its_turn_completes() -> None:
    """The new image's recovery reattaches the held agent under a new fence: the
    same agent runs on, the approval pending before the restart is answered after it,
    and the turn completes."""
    with scratch() as base, NotifyListener.bound(base) as notify, held_turn(base, notify) as turn:
        _reattached_through(turn, notify, restarts=1)


def test_an_agent_taken_over_is_handed_over_again_at_the_next_restart() -> None:
    """Two restarts in a row: the agent the first new image took over is handed over
    again by it and taken over by the second (a takeover renews the lease's
    generation, which recovery compares with the last ``child.ready`` or
    ``child.reattached``)."""
    with scratch() as base, NotifyListener.bound(base) as notify, held_turn(base, notify) as turn:
        _reattached_through(turn, notify, restarts=2)


# --- a broken upgrade ----------------------------------------------------------------


def _break(how: str, base: Path, code: Path) -> str:
    """Break what the next image starts from, as a bad upgrade would; what it says."""
    if how == "config":
        (base / "config.toml").write_text("holder = true\n[ladder\n")
        return "agentsd: config file"
    if how == "import":  # a new version that needs a module the install did not bring
        server = code / "agentsd" / "server.py"
        server.write_text(server.read_text() + "\nimport agentsd_dependency_not_installed\n")
        return "ModuleNotFoundError: No module named 'agentsd_dependency_not_installed'"
    # A configuration that loads but names a cgroup root that is not there: only a
    # start finds out.
    (base / "config.toml").write_text('holder = true\ncgroup_root = "/nonexistent-agentsd"\n')
    return "agentsd: cgroup_root = '/nonexistent-agentsd'"


@contextlib.contextmanager
def installed_copy(base: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A copy of the daemon's package the daemon runs from, as from an install that
    an upgrade then overwrites; and the environment that makes it run it."""
    code = base / "code"
    shutil.copytree(Path(agentsd.__file__).parent, code / "agentsd")
    pythonpath = os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))
    yield code, {"PYTHONPATH": pythonpath}


@pytest.mark.parametrize("how", ["config", "import"])
def test_an_upgrade_that_would_not_start_is_refused_before_anything_stops(how: str) -> None:
    with (
        scratch() as base,
        NotifyListener.bound(base) as notify,
        installed_copy(base) as (code, env),
        held_turn(base, notify, extra_env=env) as turn,
    ):
        uptime = rpc(turn.sock, "daemon.status")["uptimeS"]
        said = _break(how, base, code)
        with WireClient(turn.sock, timeout_s=RESTART_TIMEOUT_S) as client:
            refused = client.call("daemon.restart")["error"]
        assert refused["data"]["kind"] == "restart_refused", refused
        assert said in refused["data"]["output"], refused
        cli = restart_cli(turn.sock)
        assert cli.returncode != 0 and "[restart_refused]" in cli.stderr, cli.stderr
        assert turn.daemon.log().count("restart refused: the new version would not start") == 2
        # Nothing stopped: the same daemon serves on (its uptime goes on), never
        # reloading, and the agent it serves finishes its turn.
        notify.drain()
        assert not [note for note in notify.received if "RELOADING" in note.fields]
        status = rpc(turn.sock, "daemon.status")
        assert status["uptimeS"] > uptime and not status["draining"]
        rpc(
            turn.sock,
            "agentSession.respond",
            {"sessionId": turn.session_id, "approvalId": turn.approval_id, "decision": "accept"},
        )
        completed = wait_event(turn.sock, turn.session_id, "turn.completed")
        assert completed["body"]["outcome"] == "completed"
        assert is_same_process(turn.pid, turn.start_time)
        assert turn.daemon.stop() == 0
    assert token_carriers(lease_tokens(turn.state)) == []


def test_a_new_image_that_fails_its_start_fails_loudly_and_the_holder_keeps_the_agent() -> None:
    with scratch() as base, NotifyListener.bound(base) as notify:
        with held_turn(base, notify) as turn:
            said = _break("start", base, base)
            rpc(turn.sock, "daemon.restart")
            reloading = notify.wait_for(
                "RELOADING", "1", process=turn.daemon.process, timeout_s=IO_TIMEOUT_S
            )
            # Loudly: a failure status and the reason in the log (the journal).
            assert turn.daemon.wait(RESTART_TIMEOUT_S) == 1, turn.daemon.log()
            assert said in turn.daemon.log()
            notify.drain()
            after = notify.received[notify.received.index(reloading) + 1 :]
            assert not [note for note in after if "READY" in note.fields], after
            # The agent was handed over before the exec and is still held: alive, the
            # holder's child, its lease live, nothing settled.
            assert is_same_process(turn.pid, turn.start_time)
            info = read_proc_info(turn.pid)
            assert info is not None and info.ppid == turn.holder_pid and not info.is_zombie
            assert holder_socket_path(turn.state).exists()
            assert db_rows(turn.state, "SELECT state FROM leases") == [("live",)]
            assert exit_causes(turn.state, turn.session_id) == []
        # The config fixed, the next daemon starts and deals with the held agent; its
        # stop leaves nothing, and the holder, holding nothing, leaves.
        config = holder_config(base)
        with running_daemon(state_dir=turn.state, extra_args=["--config", str(config)]) as fixed:
            assert rpc(fixed.socket, "daemon.status")["pid"] == fixed.process.pid
        assert token_carriers(lease_tokens(turn.state)) == []
        wait_until(
            partial(ended, turn.holder_pid),
            timeout_s=IO_TIMEOUT_S,
            what="the holder leaves once it holds nothing",
        )


def test_the_units_reload_never_starts_a_daemon_of_its_own() -> None:
    """``ExecReload=`` runs ``agentsctl --no-start daemon restart``: with nothing
    answering it fails (unreachable), rather than starting a daemon outside the
    unit, as it does without ``--no-start``."""
    with scratch() as base:
        sock = base / "run" / "agentsd.sock"
        done = restart_cli(sock)
        assert done.returncode == EXIT_UNREACHABLE, (done.stdout, done.stderr)
        assert not sock.exists()


def test_a_stop_during_the_handover_ends_what_was_handed_over() -> None:
    """``systemctl stop`` while a reload hands agents over: the restart becomes a
    stop, and what the holder was handed already, which no image is coming to take
    over, is ended and settled before the daemon exits (outside the service's cgroup
    under systemd, nothing else would end it). A second session, still starting (never
    handed over), keeps the old image's close ladder going for seconds: the SIGTERM
    lands after the handover, before the exec."""
    with scratch() as base, NotifyListener.bound(base) as notify, held_turn(base, notify) as turn:
        stubborn = {"hangHandshake": True, "ignoreEof": True, "ignoreSigterm": True}
        params = {"provider": "mock", "cwd": str(base), "options": stubborn}
        # Its create answers only once the daemon stops: from a thread of its own.
        creating = threading.Thread(
            target=_quietly, args=(rpc, turn.sock, "agentSession.create", params), daemon=True
        )
        creating.start()

        def starting_one() -> list[str]:
            sessions = rpc(turn.sock, "agentSession.list")["sessions"]
            return [s["sessionId"] for s in sessions if s["phase"] == "starting"]

        wait_until(lambda: bool(starting_one()), timeout_s=IO_TIMEOUT_S, what="a starting session")
        [starting] = starting_one()
        rpc(turn.sock, "daemon.restart")
        wait_until(
            lambda: "restart: 1 of" in turn.daemon.log(),
            timeout_s=RESTART_TIMEOUT_S,
            what="the held agent handed over",
        )
        turn.daemon.process.send_signal(signal.SIGTERM)
        assert turn.daemon.wait(RESTART_TIMEOUT_S) == 0
        log = turn.daemon.log()
        assert "the restart under way is abandoned: stopping instead" in log
        assert "restart: executing" not in log
        assert "the restart was abandoned: 1 session recovered" in log, log
        assert ended(turn.pid)
        assert exit_causes(turn.state, turn.session_id) == ["shutdown"]
        assert exit_causes(turn.state, starting) == ["shutdown"]
        # The holder was told to forget it: holding nothing, with no daemon, it leaves.
        wait_until(lambda: ended(turn.holder_pid), timeout_s=IO_TIMEOUT_S, what="the holder gone")
        creating.join(IO_TIMEOUT_S)
    assert token_carriers(lease_tokens(turn.state)) == []


def _quietly(call: Callable[..., Any], *args: Any) -> None:
    """``call(*args)``, whatever it raises (a request the daemon never answers)."""
    with contextlib.suppress(Exception):
        call(*args)
