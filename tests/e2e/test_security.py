"""Security checks against a real daemon: what agents inherit, where they may run,
and the directories the daemon trusts.

Already covered in ``test_socket_safety.py`` and not repeated here:
``test_a_client_of_another_uid_is_refused`` (SO_PEERCRED), and
``test_an_unsafe_directory_refuses_the_start`` (a runtime or state directory that is
a symlink, has group or world access, or belongs to another uid; each with an
``--socket`` given). This file adds the gaps: the same refusals for the socket
directory the daemon derives itself (``$XDG_RUNTIME_DIR/agentsd``, or ``run/`` under
the state directory), a symlink at the socket path, and the modes of the files that
hold secrets.

Agents: a child holds no descriptor of the daemon's (no listener or client socket, no
database, WAL, shared-memory or lock file): only its stdin, stdout and stderr pipes,
and neither does a grandchild.

Paths: a session's ``cwd`` is the one path a method hands to the OS. It must be
absolute, free of NUL, and must not resolve (``..`` and symlinks followed) to the
state directory or inside it, at create and again at every start.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsd.procfs import SPAWN_TOKEN_ENV, scan_processes
from tests.daemon_process import (
    IO_TIMEOUT_S,
    DaemonProcess,
    WireClient,
    make_temp_dir,
    run_daemon,
    running_daemon,
)
from tests.e2e.reliability import wait_until
from tests.e2e.test_socket_safety import UNSAFE, assert_refused, unsafe_owner

DATABASE_FILES = ("agentsd.db", "agentsd.db-wal", "agentsd.db-shm", "agentsd.lock")


@pytest.fixture
def base() -> Iterator[Path]:
    path = make_temp_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    with running_daemon() as d:
        yield d


@pytest.fixture
def client(daemon: DaemonProcess) -> Iterator[WireClient]:
    with daemon.connect() as c:
        yield c
    daemon.ping()


def result(reply: dict[str, Any]) -> Any:
    assert "result" in reply, reply
    return reply["result"]


def error_kind(reply: dict[str, Any]) -> str:
    assert "error" in reply, reply
    assert "Traceback" not in reply["error"]["message"], reply
    return str(reply["error"]["data"]["kind"])


# ---- the directories the daemon derives itself -----------------------------------------


@pytest.mark.parametrize("make_unsafe", list(UNSAFE.values()), ids=list(UNSAFE))
@pytest.mark.parametrize("where", ["xdg-runtime", "state-run"])
def test_a_derived_socket_directory_that_is_unsafe_refuses_the_start(
    base: Path, where: str, make_unsafe: Callable[[Path], str]
) -> None:
    """Without ``--socket`` the socket goes in ``$XDG_RUNTIME_DIR/agentsd`` or, with no
    runtime directory, in ``<state>/run``; either gets the same checks."""
    if make_unsafe is unsafe_owner and os.geteuid() != 0:
        pytest.skip("needs root to chown")
    state = base / "state"
    env: dict[str, str] = {}
    if where == "xdg-runtime":
        runtime = base / "xdg"
        runtime.mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(runtime)
        unsafe = runtime / "agentsd"
    else:
        state.mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = ""  # unset: the socket falls back to the state dir
        unsafe = state / "run"
    needle = make_unsafe(unsafe)
    proc = run_daemon(["--state-dir", str(state)], env=env)
    assert_refused(proc, str(unsafe), needle)
    assert not (unsafe / "agentsd.sock").exists()


def test_a_symlink_at_the_socket_path_is_kept_and_refused(base: Path) -> None:
    """Even one pointing at a socket: the daemon never binds through, or removes, a
    link it did not make."""
    run = base / "run"
    run.mkdir(mode=0o700)
    target = base / "elsewhere.sock"
    sock = run / "agentsd.sock"
    sock.symlink_to(target)
    proc = run_daemon(["--socket", str(sock), "--state-dir", str(base / "state")])
    assert_refused(proc, str(sock), "not a socket")
    assert sock.is_symlink() and os.readlink(sock) == str(target)


def test_the_files_that_hold_secrets_are_private(daemon: DaemonProcess, client: WireClient) -> None:
    """Sessions carry their environment (API keys): the database and its side files,
    the lock, the logs directory and each agent's stderr log are for the owner only,
    whatever the umask."""
    cwd = make_temp_dir()
    try:
        created = result(
            client.call(
                "agentSession.create",
                {"provider": "mock", "cwd": str(cwd), "env": {"API_KEY": "secret"}},
            )
        )
        session_id = created["sessionId"]
        result(client.call("agentSession.send", {"sessionId": session_id, "text": "echo hi"}))
        state = daemon.state_dir
        private = [state / name for name in DATABASE_FILES]
        private += [state / "logs", state / "logs" / f"{session_id}.stderr.log"]
        for path in private:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & 0o077 == 0, f"{path} has mode {mode:04o}"
        result(client.call("agentSession.delete", {"sessionId": session_id}))
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


# ---- what agent children inherit ---------------------------------------------------------


def fd_targets(pid: int) -> dict[int, str]:
    """Each open descriptor of ``pid`` and what it refers to."""
    out: dict[int, str] = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except FileNotFoundError:
            continue  # closed while we looked
    return out


def daemon_sockets(pid: int) -> set[str]:
    """The daemon's sockets: its listener and every client connection."""
    return {target for target in fd_targets(pid).values() if target.startswith("socket:")}


def spawn_token(pid: int) -> str:
    with open(f"/proc/{pid}/environ", "rb") as environ:
        for entry in environ.read().split(b"\0"):
            name, _, value = entry.partition(b"=")
            if name.decode() == SPAWN_TOKEN_ENV:
                return value.decode()
    raise AssertionError(f"pid {pid} carries no spawn token")


def test_agent_children_inherit_no_daemon_descriptor(
    daemon: DaemonProcess, client: WireClient
) -> None:
    cwd = make_temp_dir()
    try:
        # Other clients are connected while the agent starts, so the daemon has
        # client sockets it could leak besides its listener.
        with daemon.connect() as other, daemon.connect() as third:
            other.ping()
            third.ping()
            created = result(
                client.call(
                    "agentSession.create",
                    {"provider": "mock", "cwd": str(cwd), "options": {"spawnGrandchild": True}},
                )
            )
            session_id = created["sessionId"]
            child = created["session"]["child"]["pid"]
            token = spawn_token(child)
            wait_until(
                lambda: len(scan_processes([token]).carrying(token)) == 2,
                IO_TIMEOUT_S,
                "the mock agent's grandchild starts",
            )
            grandchild = next(
                p.pid for p in scan_processes([token]).carrying(token) if p.pid != child
            )
            sockets = daemon_sockets(daemon.process.pid)
            assert len(sockets) >= 4, sockets  # the listener and three clients at least
            child_fds = fd_targets(child)
            grandchild_fds = fd_targets(grandchild)
        for pid, fds in ((child, child_fds), (grandchild, grandchild_fds)):
            leaked = {fd: t for fd, t in fds.items() if t in sockets}
            assert not leaked, f"pid {pid} holds daemon sockets {leaked}"
            database = {fd: t for fd, t in fds.items() if Path(t).name in DATABASE_FILES}
            assert not database, f"pid {pid} holds the daemon's files {database}"
        # The child: exactly its three pipes (the mock opens nothing it keeps). The
        # grandchild: /dev/null, which it opened itself (and kept open
        # besides 0, 1 and 2).
        assert sorted(child_fds) == [0, 1, 2], child_fds
        assert all(child_fds[fd].startswith("pipe:") for fd in (0, 1, 2)), child_fds
        assert set(grandchild_fds.values()) == {"/dev/null"}, grandchild_fds
        result(client.call("agentSession.delete", {"sessionId": session_id}))
        wait_until(
            lambda: not scan_processes([token]).carrying(token),
            IO_TIMEOUT_S,
            "the agent and its grandchild are gone",
        )
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


# ---- cwd: the one path a method hands to the OS -------------------------------------------


@pytest.fixture
def places(daemon: DaemonProcess) -> Iterator[dict[str, Path]]:
    """A work directory beside the state directory's parent, and links into both."""
    base = make_temp_dir()
    work = base / "work"
    work.mkdir()
    (base / "to-state").symlink_to(daemon.state_dir)
    (base / "to-logs").symlink_to(daemon.state_dir / "logs")
    (base / "to-work").symlink_to(work)
    yield {"base": base, "work": work, "state": daemon.state_dir}
    shutil.rmtree(base, ignore_errors=True)


REFUSED_CWDS: dict[str, Callable[[dict[str, Path]], str]] = {
    "relative": lambda p: "work",
    "dot-relative": lambda p: "./work",
    "nul": lambda p: f"{p['work']}\0",
    "state-dir": lambda p: str(p["state"]),
    "state-dir-slash-dot": lambda p: f"{p['state']}/.",
    "inside-state-dir": lambda p: str(p["state"] / "logs"),
    "dotdot-into-state-dir": lambda p: f"{p['work']}/../../{p['state'].parent.name}/state",
    "symlink-to-state-dir": lambda p: str(p["base"] / "to-state"),
    "symlink-inside-state-dir": lambda p: str(p["base"] / "to-logs"),
    "through-symlink-into-state-dir": lambda p: str(p["base"] / "to-state" / "logs"),
}


@pytest.mark.parametrize("make_cwd", list(REFUSED_CWDS.values()), ids=list(REFUSED_CWDS))
def test_a_cwd_into_the_state_dir_or_relative_is_refused(
    client: WireClient, places: dict[str, Path], make_cwd: Callable[[dict[str, Path]], str]
) -> None:
    before = len(result(client.call("agentSession.list", {}))["sessions"])
    reply = client.call(
        "agentSession.create", {"provider": "mock", "cwd": make_cwd(places), "start": False}
    )
    assert error_kind(reply) == "invalid_params", reply
    assert len(result(client.call("agentSession.list", {}))["sessions"]) == before


ALLOWED_CWDS: dict[str, Callable[[dict[str, Path]], str]] = {
    "work": lambda p: str(p["work"]),
    # The state directory's parent is where a user's home usually is: allowed.
    "state-parent": lambda p: str(p["state"].parent),
    # ``..`` out of the state directory lands beside it, not in it.
    "dotdot-out-of-state-dir": lambda p: f"{p['state']}/../{p['state'].name}-sibling/..",
    "symlink-to-work": lambda p: str(p["base"] / "to-work"),
}


@pytest.mark.parametrize("make_cwd", list(ALLOWED_CWDS.values()), ids=list(ALLOWED_CWDS))
def test_a_cwd_outside_the_state_dir_is_accepted(
    client: WireClient, places: dict[str, Path], make_cwd: Callable[[dict[str, Path]], str]
) -> None:
    sibling = places["state"].parent / f"{places['state'].name}-sibling"
    sibling.mkdir(exist_ok=True)
    try:
        cwd = make_cwd(places)
        created = result(
            client.call("agentSession.create", {"provider": "mock", "cwd": cwd, "start": False})
        )
        assert created["session"]["cwd"] == cwd
        result(client.call("agentSession.delete", {"sessionId": created["sessionId"]}))
    finally:
        sibling.rmdir()


def test_a_cwd_swapped_for_a_symlink_into_the_state_dir_is_refused_at_start(
    daemon: DaemonProcess, client: WireClient, places: dict[str, Path]
) -> None:
    """Checked at create is not enough: the directory can be replaced by a link
    before the agent starts (by start, or by a send that starts it)."""
    work = places["work"]
    created = result(
        client.call("agentSession.create", {"provider": "mock", "cwd": str(work), "start": False})
    )
    session_id = created["sessionId"]
    work.rmdir()
    work.symlink_to(daemon.state_dir)
    assert error_kind(client.call("agentSession.start", {"sessionId": session_id})) == (
        "invalid_params"
    )
    sent = result(client.call("agentSession.send", {"sessionId": session_id, "text": "hi"}))
    assert sent["dispatch"] == "rejected" and "state directory" in sent["reason"], sent
    session = result(client.call("agentSession.get", {"sessionId": session_id}))["session"]
    assert session["phase"] == "stopped" and session["child"] is None, session
    # Put back a real directory: the same session starts.
    work.unlink()
    work.mkdir()
    started = result(client.call("agentSession.start", {"sessionId": session_id}))
    assert started["session"]["phase"] == "running"
    assert os.readlink(f"/proc/{started['session']['child']['pid']}/cwd") == str(work)
    result(client.call("agentSession.delete", {"sessionId": session_id}))


def test_no_traceback_reached_the_log(daemon: DaemonProcess) -> None:
    """Runs last: nothing above made the daemon fail where it should have refused."""
    assert "Traceback" not in daemon.log(), daemon.log()
