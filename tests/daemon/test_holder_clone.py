"""The holder starts an agent born in its cgroup (``agentsd.holder`` Rule 1):
``clone3`` with ``CLONE_INTO_CGROUP`` from the holder itself, so a held agent pays
no move into its cgroup (a move waits for the kernel's RCU grace period) and never
runs outside it. The child gets its pipes on 0, 1 and 2 and nothing else of the
holder's; the holder's own stdio and cwd are untouched after; a failed exec or a
cgroup that cannot be entered is that spawn's error; where clone3 is refused the
holder joins agents by the shell shim instead, for the rest of its life."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsd import holder
from tests.cgroup_root import cgroup_root, unavailable
from tests.daemon.test_holder import TIMEOUT_S, Client, _alive, _wait, make_holder

__all__ = ["make_holder"]  # the fixture, for pytest

# Its cgroup, its fds, its session and parent as it sees them at its first instruction,
# then an echo of stdin.
REPORTER = [
    sys.executable,
    "-I",
    "-c",
    "import os, sys\n"
    "print([x for x in open('/proc/self/cgroup').read().split() if x[:3] == '0::'][0])\n"
    "print(sorted(int(f) for f in os.listdir('/proc/self/fd')))\n"
    "print(os.getsid(0) == os.getpid(), os.getppid())\n"
    "print([x for x in open('/proc/self/status') if x.startswith('SigIgn')][0].split()[1])\n"
    "sys.stdout.flush()\n"
    "for line in sys.stdin:\n"
    "    sys.stdout.write('echo: ' + line); sys.stdout.flush()\n",
]


@pytest.fixture
def agent_cgroup() -> Iterator[Path]:
    if unavailable() is not None:
        pytest.skip(str(unavailable()))
    with cgroup_root() as root:
        path = root / "agent-clone-test"
        path.mkdir()
        yield path


def _cgroup_line(path: Path) -> str:
    return f"0::/{path.relative_to(path.parents[1])}"


def _spawn(client: Client, agent: str, argv: list[str], cgroup: Path | str) -> dict[str, Any]:
    return client.request(
        {
            "op": "spawn",
            "id": agent,
            "argv": argv,
            "cwd": "/",
            "env": dict(os.environ),
            "cgroup": str(cgroup),
        }
    )


def _fd_targets(pid: int) -> dict[int, str]:
    return {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1, 2)}


def test_a_held_agent_is_born_in_its_cgroup_with_its_stdio_only(
    make_holder: Any, agent_cgroup: Path
) -> None:
    h = make_holder()
    daemon = h.connect()
    assert daemon.hello(1)["cgroups"] is True
    before = _fd_targets(h.process.pid)
    cwd = os.readlink(f"/proc/{h.process.pid}/cwd")
    reply = _spawn(daemon, "a", REPORTER, agent_cgroup)
    assert reply["op"] == "spawned" and reply["cloned"] is True, reply
    assert daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})["op"] == "ok"
    _, first = daemon.read_stream("a", "out", b"True")
    first += daemon.read_stream("a", "out", b"\n")[1] if first.count(b"\n") < 4 else b""
    where, fds, session, ignored = first.decode().splitlines()[:4]
    assert where == _cgroup_line(agent_cgroup)  # at its first instruction
    assert fds in ("[0, 1, 2]", "[0, 1, 2, 3]")  # 3: the listing's own
    assert session == f"True {h.process.pid}"
    # SIGHUP and SIGINT at their defaults, not ignored as the holder's own are.
    assert int(ignored, 16) & (1 << (signal.SIGHUP - 1) | 1 << (signal.SIGINT - 1)) == 0
    assert (agent_cgroup / "cgroup.procs").read_text().split() == [str(reply["pid"])]
    daemon.send({"op": "write", "id": "a"}, b"hello\n")
    assert daemon.read_stream("a", "out", b"hello\n")[1].endswith(b"echo: hello\n")
    # The holder lent its stdio and cwd for the clone only.
    assert _fd_targets(h.process.pid) == before
    assert os.readlink(f"/proc/{h.process.pid}/cwd") == cwd
    assert daemon.request({"op": "signal", "id": "a", "signal": int(signal.SIGKILL)})["sent"]
    exited = daemon.wait_for("exited", "a")
    assert exited["returncode"] == -signal.SIGKILL


def test_a_spawn_that_cannot_exec_or_enter_its_cgroup_is_that_spawns_error(
    make_holder: Any, agent_cgroup: Path, tmp_path: Path
) -> None:
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    missing = _spawn(daemon, "a", ["no-such-agent-program"], agent_cgroup)
    assert (missing["kind"], missing["errno"]) == ("spawn_failed", errno.ENOENT), missing
    gone = _spawn(daemon, "b", REPORTER, agent_cgroup.parent / "no-such-cgroup")
    assert (gone["kind"], gone["errno"]) == ("spawn_failed", errno.ENOENT), gone
    relative = _spawn(daemon, "c", REPORTER, "agent-clone-test")
    assert relative["kind"] == "bad_request"
    # Not a cgroup: the clone itself fails, an error of this spawn only.
    plain = _spawn(daemon, "e", REPORTER, tmp_path)
    assert (plain["kind"], plain["errno"]) == ("spawn_failed", errno.EBADF), plain
    # Nothing was left of them: the failed exec's child was reaped, nothing runs in
    # the cgroup, and the holder still clones.
    assert (agent_cgroup / "cgroup.procs").read_text() == ""
    assert not [p for p in holder._children(h.process.pid) if not _alive(p)]
    assert _spawn(daemon, "d", REPORTER, agent_cgroup)["cloned"] is True


def test_a_spawn_into_a_frozen_cgroup_does_not_stop_the_holder(
    make_holder: Any, agent_cgroup: Path, tmp_path: Path
) -> None:
    """A clone into a frozen cgroup would stop there, and the holder with it (it
    waits for the child's exec): such a spawn goes through the shim, whose shell
    freezes alone, and the holder serves on; the agent runs once thawed."""
    h = make_holder()
    daemon = h.connect()
    daemon.hello(1)
    _spawn(daemon, "other", REPORTER, tmp_path)  # EBADF: nothing runs
    (agent_cgroup / "cgroup.freeze").write_text("1")
    _wait(lambda: "frozen 1" in (agent_cgroup / "cgroup.events").read_text())
    reply = _spawn(daemon, "a", REPORTER, agent_cgroup)
    assert reply["op"] == "spawned" and reply["cloned"] is False, reply
    assert daemon.request({"op": "resume", "id": "a", "stream": "out", "offset": 0})["op"] == "ok"
    (agent_cgroup / "cgroup.freeze").write_text("0")
    _, first = daemon.read_stream("a", "out", b"\n")
    assert first.decode().splitlines()[0] == _cgroup_line(agent_cgroup)


@contextlib.contextmanager
def _in_process_holder(tmp_path: Path) -> Iterator[holder.Holder]:
    """A holder run in this process (its spawns, not its loop); its agents killed,
    reaped and forgotten after."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "holder.sock"))
    listener.listen(1)
    h = holder.Holder(listener, 1 << 20, TIMEOUT_S)
    try:
        yield h
    finally:
        for agent in list(h.agents.values()):
            assert agent.process is not None
            agent.process.kill()
            agent.process.wait()
            h._forget(agent)
        listener.close()


def _first_line(agent: holder.Agent) -> str:
    fd = agent.streams["out"].fd
    assert fd is not None
    data = b""
    while b"\n" not in data:
        ready, _, _ = select.select([fd], [], [], TIMEOUT_S)
        assert ready, "the agent said nothing"
        data += os.read(fd, 4096)
    return data.decode().splitlines()[0]


@pytest.mark.parametrize("refusal", [errno.ENOSYS, errno.EPERM])
def test_where_clone3_is_refused_agents_join_their_cgroup_by_the_shim(
    tmp_path: Path, agent_cgroup: Path, monkeypatch: pytest.MonkeyPatch, refusal: int
) -> None:
    """A kernel without clone3 or CLONE_INTO_CGROUP, or a seccomp policy refusing it:
    this spawn and every later one go through the shim, still in their cgroup."""

    def refused(*_: object) -> int:
        ctypes.set_errno(refusal)
        return -1

    ours = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)}
    cwd = os.getcwd()
    with _in_process_holder(tmp_path) as h:
        assert h.cloner is not None
        monkeypatch.setattr(h.cloner, "_syscall", refused)
        monkeypatch.setattr(holder, "CLONE_MAX_RSS", 1 << 62)  # this test's process is large
        for name in ("a", "b"):
            request = {"id": name, "argv": REPORTER, "cwd": "/", "env": dict(os.environ)}
            reply = h._spawn({**request, "cgroup": str(agent_cgroup)})
            assert reply["op"] == "spawned" and reply["cloned"] is False, reply
            assert h.cloner is None
            assert _first_line(h.agents[name]) == _cgroup_line(agent_cgroup)
            # What it lent the refused clone is its own again.
            assert {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)} == ours
            assert os.getcwd() == cwd
    _wait(lambda: (agent_cgroup / "cgroup.procs").read_text() == "")


def test_a_holder_past_its_size_bound_joins_agents_by_the_shim_for_now(
    tmp_path: Path, agent_cgroup: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clone copies the holder's page tables: past ``CLONE_MAX_RSS`` (a holder
    retaining much output) the shim is cheaper, until the holder is small again."""
    monkeypatch.setattr(holder, "CLONE_MAX_RSS", 0)
    with _in_process_holder(tmp_path) as h:
        request = {"id": "a", "argv": REPORTER, "cwd": "/", "env": dict(os.environ)}
        reply = h._spawn({**request, "cgroup": str(agent_cgroup)})
        assert reply["op"] == "spawned" and reply["cloned"] is False, reply
        assert h.cloner is not None
        assert _first_line(h.agents["a"]) == _cgroup_line(agent_cgroup)
    _wait(lambda: (agent_cgroup / "cgroup.procs").read_text() == "")
