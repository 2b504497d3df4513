"""agentsd.spawner: agents born in their cgroup through the fork server.

Real processes in a real cgroup root: the child is in its cgroup and is the
daemon's own child from its first instruction, its argv, environment, cwd, fds and
signal dispositions are what `subprocess.Popen` would give it, byte for byte;
failures are Popen's; a dead server means the shim, a dead daemon no server."""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from agentsd import spawner
from agentsd.cgroup import CgroupRoot, SessionCgroup, end_cgroups
from agentsd.child import (
    ChildExit,
    ChildSpec,
    ExitProof,
    ExitUnproven,
    new_spawn_token,
    open_child,
)
from agentsd.config import Ladder
from agentsd.leftovers import ChildIdentity
from agentsd.spawner import SERVERS, SpawnerFailed, fork_server, fork_servers, spawn_into
from tests.cgroup_root import cgroup_root, unavailable

QUICK = Ladder(eof_grace_s=2.0, term_grace_s=0.2, kill_wait_s=5.0)
# Reports, as its first act, what it was given: cgroup, parent, session and group,
# argv and environment as bytes (hex), cwd, open fds, ignored signals.
REPORT = (
    "import os, sys, json\n"
    "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines())\n"
    "print(json.dumps({\n"
    "  'cgroup': open('/proc/self/cgroup').read().splitlines()[-1],\n"
    "  'ppid': os.getppid(), 'pid': os.getpid(), 'sid': os.getsid(0), 'pgid': os.getpgid(0),\n"
    "  'argv': [os.fsencode(a).hex() for a in sys.argv[1:]],\n"
    "  'env': sorted(k.hex() + '=' + v.hex() for k, v in os.environb.items()),\n"
    "  'cwd': os.getcwd(),\n"
    "  'fds': sorted(int(f) for f in os.listdir('/proc/self/fd')),\n"
    "  'ignored': status['SigIgn'].strip(),\n"
    "}), flush=True)\n"
    "sys.stdin.read()\n"
)
# Bytes an agent's argv and environment may hold: not UTF-8, '=' in a value,
# newlines, empty values, spaces and quotes a shell would care about.
ODD = "caf\udce9 = 'x' \"y\"\n$(z)"
ENV = {"ODD": ODD, "EMPTY": "", "EQ": "a=b=c", "PATH": os.defpath, "LANG": "C"}


@pytest.fixture
def root() -> Iterator[Path]:
    if unavailable() is not None:
        pytest.skip(str(unavailable()))
    with cgroup_root() as path:
        yield path


async def _spawned(identity: ChildIdentity) -> None:
    return None


async def _report(spec: ChildSpec) -> tuple[dict[str, Any], ChildIdentity, ChildExit]:
    outcomes: list[ChildExit] = []
    with trio.fail_after(60):
        async with open_child(spec, QUICK, _spawned, outcomes.append) as child:
            line = b""
            while not line.endswith(b"\n"):
                line += await child.stdout.receive_some(65536)
            identity = child.identity
    [outcome] = outcomes
    return json.loads(line), identity, outcome


def _spec(root: Path | None, tmp_path: Path) -> ChildSpec:
    return ChildSpec(
        argv=[sys.executable, "-c", REPORT, ODD, "", "a b"],
        cwd=str(tmp_path),
        env=ENV,
        token=new_spawn_token(),
        cgroup_root=None if root is None else CgroupRoot(root),
    )


async def test_a_cloned_child_gets_exactly_what_popen_gives(root: Path, tmp_path: Path) -> None:
    """Born in its cgroup (its first act sees it), in a session and group of its
    own, the daemon's own child; argv, environment, cwd, fds and ignored signals
    identical to the spawn without a cgroup."""
    spec = _spec(root, tmp_path)
    cloned, identity, outcome = await _report(spec)
    servers = await fork_servers()
    assert sum(s.served for s in servers) == 1  # it went through a fork server
    plain, _, _ = await _report(_spec(None, tmp_path))
    assert cloned["cgroup"] == f"0::/{root.name}/agent-{spec.token}"
    assert cloned["pid"] == cloned["sid"] == cloned["pgid"] == identity.pid == identity.pgid
    assert cloned["ppid"] == os.getpid()
    token_var = b"AGENTSD_SPAWN_TOKEN".hex() + "=" + spec.token.encode().hex()
    assert token_var in cloned["env"]
    for key in ("argv", "cwd", "fds", "ignored"):
        assert cloned[key] == plain[key], key
    token_prefix = b"AGENTSD_SPAWN_TOKEN".hex() + "="
    assert [e for e in cloned["env"] if e != token_var] == [
        e for e in plain["env"] if not e.startswith(token_prefix)
    ]
    for key, value in ENV.items():  # (plus LC_CTYPE: the child Python's coercion)
        assert os.fsencode(key).hex() + "=" + os.fsencode(value).hex() in cloned["env"]
    assert cloned["argv"] == [os.fsencode(a).hex() for a in (ODD, "", "a b")]
    assert cloned["fds"] == [0, 1, 2, 3]  # 3: the listing's own
    assert isinstance(outcome, ExitProof) and outcome.cgroup_empty
    assert CgroupRoot(root).existing() == []


@pytest.mark.parametrize(
    ("argv", "cwd", "error", "filename"),
    [
        (["/nonexistent/agent"], "/", FileNotFoundError, None),
        ([sys.executable], "/nonexistent-dir", FileNotFoundError, "/nonexistent-dir"),
        (["/etc/passwd"], "/", PermissionError, None),
    ],
)
async def test_a_failed_exec_fails_the_spawn_and_leaves_nothing(
    root: Path, argv: list[str], cwd: str, error: type[OSError], filename: str | None
) -> None:
    servers = await fork_servers()
    spec = ChildSpec(
        argv=argv,
        cwd=cwd,
        env={"PATH": os.defpath},
        token=new_spawn_token(),
        cgroup_root=CgroupRoot(root),
    )
    outcomes: list[ChildExit] = []
    with pytest.raises(error) as caught:
        async with open_child(spec, QUICK, _spawned, outcomes.append):
            pytest.fail("the body ran")
    if filename is not None:
        assert caught.value.filename == filename
    assert outcomes == []
    assert CgroupRoot(root).existing() == []
    assert [(s.broken, s.served) for s in servers] == [(False, 0)] * SERVERS
    assert _zombies() == []  # the failed child was reaped


def _zombies() -> list[int]:
    """Our children that exited and were not reaped."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state, ppid = stat.rpartition(")")[2].split()[:2]
            if int(ppid) == os.getpid() and state == "Z":
                found.append(int(entry.name))
    return found


async def test_a_bad_request_is_refused_before_the_server(root: Path, tmp_path: Path) -> None:
    spec = attrs.evolve(_spec(root, tmp_path), env={"BAD=NAME": "x"})
    with pytest.raises(ValueError, match="illegal environment variable name"):
        async with open_child(spec, QUICK, _spawned, lambda outcome: None):
            pytest.fail("the body ran")
    server = await fork_server()
    assert server is not None and not server.broken
    assert CgroupRoot(root).existing() == []


async def test_a_dead_fork_server_means_the_shim_still_joined_first(
    root: Path, tmp_path: Path
) -> None:
    """An agent may kill the servers (same uid): spawns go through the shell shim,
    which still joins the cgroup before the agent's first instruction; a dead
    server is not restarted in that run, and the pool stays `SERVERS` strong."""
    servers = await fork_servers()
    assert len(servers) == SERVERS
    for server in servers:
        server.process.kill()
        server.process.wait()
    reports = [(await _report(_spec(root, tmp_path)))[0] for _ in range(SERVERS + 1)]
    assert all(server.broken for server in servers)
    assert (await fork_servers()) == servers
    for report in reports:
        assert str(report["cgroup"]).startswith(f"0::/{root.name}/agent-")
        assert report["ppid"] == os.getpid()
    assert CgroupRoot(root).existing() == []


async def test_spawns_at_once_never_wait_for_a_busy_server(root: Path, tmp_path: Path) -> None:
    """Spawns at once overlap on the servers; one that finds every server busy
    goes through the shim instead of waiting, and is in its cgroup all the same."""
    servers = await fork_servers()
    reports: list[dict[str, Any]] = []

    async def one() -> None:
        reports.append((await _report(_spec(root, tmp_path)))[0])

    async with trio.open_nursery() as nursery:
        for _ in range(4 * SERVERS):
            nursery.start_soon(one)
    assert 1 <= sum(server.served for server in servers) <= 4 * SERVERS
    assert not any(server.broken or server.busy for server in servers)
    assert len(reports) == 4 * SERVERS
    for report in reports:
        assert str(report["cgroup"]).startswith(f"0::/{root.name}/agent-")
        assert report["ppid"] == os.getpid()
    assert CgroupRoot(root).existing() == []


async def test_a_busy_server_sends_the_spawn_to_the_shim(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While every server serves another spawn, a spawn is the shim's: it still
    joins its cgroup before the agent runs (its parent is the daemon, its first
    act sees the cgroup), and the servers serve again once free."""
    servers = await fork_servers()
    for server in servers:
        server.busy = True
    report, _, outcome = await _report(_spec(root, tmp_path))
    assert sum(server.served for server in servers) == 0
    assert report["cgroup"].startswith(f"0::/{root.name}/agent-")
    assert report["ppid"] == os.getpid()
    assert isinstance(outcome, ExitProof) and outcome.cgroup_empty
    for server in servers:
        server.busy = False
    await _report(_spec(root, tmp_path))
    assert sum(server.served for server in servers) == 1
    assert not any(server.busy for server in servers)


async def test_the_server_keeps_nothing_of_a_spawn(root: Path, tmp_path: Path) -> None:
    """The server puts the child's stdio on its own 0-2 and enters its cwd before
    the clone: after the reply it holds none of the agent's pipes (the agent's
    stdout would never end) and is back in /."""
    servers = await fork_servers()
    outcomes: list[ChildExit] = []
    with trio.fail_after(60):
        async with open_child(_spec(root, tmp_path), QUICK, _spawned, outcomes.append) as child:
            [server] = [s for s in servers if s.served]
            pid = child.process.pid
            agent_pipes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1)}
            server_fds = {
                os.readlink(f"/proc/{server.process.pid}/fd/{fd}")
                for fd in os.listdir(f"/proc/{server.process.pid}/fd")
            }
            assert agent_pipes.isdisjoint(server_fds)
            assert os.readlink(f"/proc/{server.process.pid}/cwd") == "/"
            assert os.readlink(f"/proc/{pid}/cwd") == str(tmp_path)
    assert isinstance(outcomes[0], ExitProof)


async def test_a_refused_clone_breaks_the_server_and_leaves_the_spawn_to_the_shim(
    tmp_path: Path,
) -> None:
    """clone3 refused (here: the fd is a plain directory, not a cgroup; in a
    container, a seccomp policy's ENOSYS): nothing is cloned, `spawn_into` says
    to use the shim, and that server is not asked again."""
    if unavailable() is not None:
        pytest.skip(str(unavailable()))
    servers = await fork_servers()
    not_a_cgroup = SessionCgroup(tmp_path)
    for _ in range(SERVERS):
        process = await spawn_into(
            not_a_cgroup, ["/bin/true"], cwd="/", env={}, stderr=None, prepare=lambda: None
        )
        assert process is None
    assert all(server.broken for server in servers)
    assert sum(server.served for server in servers) == 0


def test_the_server_ends_with_the_run_and_its_socket_cannot_be_opened(root: Path) -> None:
    """The server's request socket is private: /proc/PID/fd of it cannot be opened
    (an agent cannot send it a request). When the run ends, it is ended and reaped."""

    async def main() -> list[int]:
        servers = await fork_servers()
        for server in servers:
            pid = server.process.pid
            fds = os.listdir(f"/proc/{pid}/fd")
            sockets = [
                fd for fd in fds if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
            ]
            assert len(sockets) == 1
            with pytest.raises(OSError) as caught:
                os.open(f"/proc/{pid}/fd/{sockets[0]}", os.O_WRONLY)
            assert caught.value.errno == errno.ENXIO
        return [server.process.pid for server in servers]

    pids = trio.run(main)
    assert len(pids) == SERVERS
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped already
        assert not Path(f"/proc/{pid}").exists()


DAEMON = """
import os, sys, trio
from pathlib import Path
from agentsd.cgroup import CgroupRoot
from agentsd.child import ChildSpec, new_spawn_token, open_child
from agentsd.config import Ladder
from agentsd.spawner import fork_servers

async def main():
    spec = ChildSpec(argv=['/bin/cat'], cwd='/', env={}, token=new_spawn_token(),
                     cgroup_root=CgroupRoot(Path(sys.argv[1])))
    async def spawned(identity):
        return None
    async with open_child(spec, Ladder(), spawned, lambda outcome: None) as child:
        servers = await fork_servers()
        print(*(server.process.pid for server in servers), flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


def test_a_killed_daemon_leaves_no_fork_server(root: Path) -> None:
    """The server exits at its socket's end of file: a SIGKILLed daemon leaves no
    fork server behind (its agent, in its cgroup, is recovery's: cgroup.kill)."""
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON, str(root)], stdout=subprocess.PIPE)
    assert daemon.stdout is not None
    with daemon.stdout:
        server_pids = [int(word) for word in daemon.stdout.readline().split()]
    assert len(server_pids) == SERVERS
    server_fds = [os.pidfd_open(pid) for pid in server_pids]
    try:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        # The servers were the dead daemon's children, reaped by init: a pidfd
        # turns readable when its process exits. Bounded, not a timing assertion.
        for server_fd in server_fds:
            ready, _, _ = select.select([server_fd], [], [], 30.0)
            assert ready, "a fork server outlived its daemon"
    finally:
        for server_fd in server_fds:
            os.close(server_fd)


# A fork server that clones the child and then dies without answering: what an
# agent killing it at the wrong moment (same uid) does.
REPLY_LINE = "    sock.sendall(REPLY.pack(pid, err, step))\n"
assert REPLY_LINE in spawner.SERVER
DIES_AFTER_CLONE = spawner.SERVER.replace(REPLY_LINE, "    posix._exit(0)\n")


@pytest.mark.parametrize(
    "agent",
    [
        ["/bin/sleep", "600"],  # still runs: killed with its cgroup
        ["/bin/true"],  # may have exited already: a zombie, out of cgroup.procs
    ],
)
async def test_a_server_dying_after_the_clone_leaves_no_child_and_no_zombie(
    root: Path, tmp_path: Path, agent: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spawn fails with the server's error, and only after the cgroup is empty
    and the clone reaped does it report that exit (proven): the lease may go."""
    monkeypatch.setattr(spawner, "SERVER", DIES_AFTER_CLONE)
    spec = attrs.evolve(_spec(root, tmp_path), argv=agent)
    outcomes: list[ChildExit] = []
    with pytest.raises(SpawnerFailed, match="the fork server exited"):
        async with open_child(spec, QUICK, _spawned, outcomes.append):
            pytest.fail("the body ran")
    [outcome] = outcomes
    assert isinstance(outcome, ExitProof) and outcome.cgroup_empty
    assert outcome.signal == signal.SIGKILL or outcome.returncode == 0
    assert CgroupRoot(root).existing() == []
    assert _zombies() == []


async def test_a_cgroup_that_does_not_empty_after_a_failed_spawn_keeps_the_lease(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cgroup.kill`` does not take (here: it does nothing): the outcome is
    unproven, so the lease stays held, the cgroup is not removed from under its
    processes, and the spawn's own error is what the caller sees (not EBUSY)."""
    monkeypatch.setattr(spawner, "SERVER", DIES_AFTER_CLONE)
    monkeypatch.setattr(SessionCgroup, "kill", lambda self: None)
    spec = attrs.evolve(_spec(root, tmp_path), argv=["/bin/sleep", "600"])
    outcomes: list[ChildExit] = []
    ladder = Ladder(eof_grace_s=2.0, term_grace_s=0.2, kill_wait_s=0.5)
    with pytest.raises(SpawnerFailed):
        async with open_child(spec, ladder, _spawned, outcomes.append):
            pytest.fail("the body ran")
    [outcome] = outcomes
    assert isinstance(outcome, ExitUnproven) and "still held processes" in outcome.reason
    [cgroup] = CgroupRoot(root).existing()
    assert len(cgroup.members()) == 1  # the clone, left for the retry
    # The retry (``Supervisor._retry_unproven``, recovery) ends the token's cgroup:
    # it reaps the clone, the daemon's child, before the cgroup goes.
    monkeypatch.undo()
    assert await end_cgroups([cgroup], 10.0, reap_children=True) == {cgroup.path: True}
    assert CgroupRoot(root).existing() == []
    assert _zombies() == []


async def test_a_stopped_server_fails_the_spawn_and_is_reaped_before_the_cgroup_goes(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent SIGSTOPs the server (same uid): the spawn fails at the reply timeout,
    the server is killed and reaped (it can clone nothing more), and as it cloned
    nothing the agent never started: no outcome, no cgroup, no zombie."""
    monkeypatch.setattr(spawner, "REPLY_TIMEOUT_S", 0.5)
    servers = await fork_servers()
    for server in servers:
        os.kill(server.process.pid, signal.SIGSTOP)
    outcomes: list[ChildExit] = []
    try:
        with pytest.raises(SpawnerFailed, match="timed out"):
            async with open_child(_spec(root, tmp_path), QUICK, _spawned, outcomes.append):
                pytest.fail("the body ran")
        assert outcomes == []
        assert CgroupRoot(root).existing() == []
        assert sum(server.broken for server in servers) == 1
        assert [s.process.returncode for s in servers if s.broken] == [-signal.SIGKILL]
        assert _zombies() == []
    finally:
        for server in servers:
            if server.process.returncode is None:
                os.kill(server.process.pid, signal.SIGCONT)


async def _output_of(spec: ChildSpec) -> bytes:
    outcomes: list[ChildExit] = []
    with trio.fail_after(60):
        async with open_child(spec, QUICK, _spawned, outcomes.append) as child:
            out = b""
            while not out.endswith(b"\n"):
                out += await child.stdout.receive_some(65536)
    [outcome] = outcomes
    assert isinstance(outcome, ExitProof) and outcome.cgroup_empty
    return out


async def test_a_request_larger_than_the_socket_buffer_arrives_whole(
    root: Path, tmp_path: Path
) -> None:
    """An environment of 800 KB (more than a Unix socket's buffer; each variable
    under exec's 128 KiB limit) reaches the agent byte for byte."""
    big = {f"BIG{i}": chr(ord("a") + i) * 100_000 for i in range(8)}
    spec = attrs.evolve(
        _spec(root, tmp_path),
        env={**ENV, **big},
        argv=[
            sys.executable,
            "-c",
            "import os; print(sorted((k, len(v), v[:1]) for k, v in os.environ.items() "
            "if k.startswith('BIG')))",
        ],
    )
    out = await _output_of(spec)
    servers = await fork_servers()
    assert sum(s.served for s in servers) == 1
    assert out.decode().strip() == str(sorted((k, len(v), v[:1]) for k, v in big.items()))


async def test_a_relative_cwd_is_the_daemons_as_for_popen(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server sits in /: a relative cwd is taken from the daemon's own, as
    Popen would, not from the server's."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path)
    spec = attrs.evolve(
        _spec(root, tmp_path),
        cwd="work",
        argv=[sys.executable, "-c", "import os; print(os.getcwd())"],
    )
    out = await _output_of(spec)
    assert sum(s.served for s in await fork_servers()) == 1
    assert out.decode().strip() == str(tmp_path / "work")
