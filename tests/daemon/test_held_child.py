"""held_child and holder_link: agents spawned through a real holder process, their
close ladder and proof of exit, and what the loss of the holder does. Every test
leaves no agent and no holder behind."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import stat
import sys
import termios
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from agentsd import holder, holder_link
from agentsd.cgroup import CgroupRoot
from agentsd.child import ChildSpec, ExitProof, new_spawn_token
from agentsd.config import Ladder
from agentsd.held_child import HeldChild, HeldExit, open_held_child
from agentsd.holder_link import (
    HeldAgent,
    HolderKeeper,
    HolderLink,
    HolderLost,
    HolderRefused,
    open_holder_keeper,
    open_holder_link,
    socket_path,
)
from agentsd.leftovers import ChildIdentity, EndOutcome
from agentsd.procfs import is_same_process, read_proc_info, scan_processes
from tests.cgroup_root import cgroup_root, unavailable
from tests.daemon.test_cgroup import ESCAPING
from tests.daemon.test_child import MOCK_AGENT, QUICK
from tests.polling import eventually

STUBBORN = {"ignoreSigterm": True, "ignoreEof": True}
# For agents that ignore EOF and SIGTERM: every rung is walked all the same, in
# 0.4 s rather than the 10 s of QUICK's graces.
SHORT = Ladder(eof_grace_s=0.2, term_grace_s=0.2, kill_wait_s=5.0)


class Lines:
    """The test's side of the mock agent's JSON lines."""

    def __init__(self, child: HeldChild) -> None:
        self.child = child
        self._buf = bytearray()

    async def send(self, frame: dict[str, Any]) -> None:
        await self.child.stdin.send_all(json.dumps(frame).encode() + b"\n")

    async def receive(self) -> dict[str, Any] | None:
        while (newline := self._buf.find(b"\n")) < 0:
            data = await self.child.stdout.receive_some(65536)
            if not data:
                return None
            self._buf += data
        frame = json.loads(bytes(self._buf[:newline]))
        del self._buf[: newline + 1]
        assert isinstance(frame, dict)
        return frame

    async def handshake(self) -> None:
        await self.send({"type": "initialize", "handle": None})
        frame = await self.receive()
        assert frame is not None and frame["type"] == "initialized", frame


@pytest.fixture
def tokens() -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    left = [p for t in made for p in scan_processes(made).carrying(t)]
    for proc in left:
        if is_same_process(proc.pid, proc.start_time):
            fd = os.pidfd_open(proc.pid)
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
    assert left == [], "the test left agents behind"


def spec(tokens: list[str], options: dict[str, Any] | None = None, **kw: Any) -> ChildSpec:
    token = new_spawn_token()
    tokens.append(token)
    env = {"AGENTSD_MOCK_OPTIONS": json.dumps(options or {})}
    return ChildSpec(argv=MOCK_AGENT, cwd="/", env=env, token=token, base_env=os.environ, **kw)


@pytest.fixture
async def keeper(tmp_path: Path) -> AsyncIterator[HolderKeeper]:
    holder_pid: list[int] = []
    async with open_holder_keeper(tmp_path) as kept:
        yield kept
        if kept._link is not None:
            holder_pid.append(kept._link.holder_pid)
    # Detached and holding nothing, the holder leaves by itself.
    for pid in holder_pid:
        await eventually(lambda pid=pid: _ended(pid))


def _ended(pid: int) -> bool:
    info = read_proc_info(pid)
    return info is None or info.is_zombie


async def ignore_identity(identity: ChildIdentity) -> None:
    await trio.lowlevel.checkpoint()


async def test_an_agent_runs_as_the_holders_child_and_its_exit_is_proven(
    keeper: HolderKeeper, tokens: list[str]
) -> None:
    link = await keeper.link()
    exits: list[HeldExit] = []
    identities: list[ChildIdentity] = []

    async def spawned(identity: ChildIdentity) -> None:
        identities.append(identity)
        await trio.lowlevel.checkpoint()

    with trio.fail_after(20):
        async with open_held_child(spec(tokens), QUICK, spawned, exits.append, link) as child:
            await Lines(child).handshake()
            info = read_proc_info(child.identity.pid)
            assert info is not None and info.ppid == link.holder_pid
            assert info.pgid == child.identity.pid
            assert identities == [child.identity]
    assert exits == [ExitProof(returncode=0, signal=None, stragglers_killed=0)]
    assert not is_same_process(child.identity.pid, child.identity.start_time)
    # Forgotten by the holder once proven gone.
    assert child.identity.token not in link.agents


async def test_a_stubborn_agent_is_killed_by_the_ladder(
    keeper: HolderKeeper, tokens: list[str]
) -> None:
    link = await keeper.link()
    exits: list[HeldExit] = []
    ladder = Ladder(eof_grace_s=0.2, term_grace_s=0.2, kill_wait_s=5.0)
    with trio.fail_after(20):
        async with open_held_child(
            spec(tokens, STUBBORN), ladder, ignore_identity, exits.append, link
        ) as child:
            await Lines(child).handshake()
    assert exits == [ExitProof(returncode=None, signal=signal.SIGKILL, stragglers_killed=0)]


async def test_a_grandchild_that_left_the_group_is_ended_by_token(
    keeper: HolderKeeper, tokens: list[str]
) -> None:
    link = await keeper.link()
    exits: list[HeldExit] = []
    with trio.fail_after(20):
        async with open_held_child(
            spec(tokens, {"spawnGrandchild": True}), QUICK, ignore_identity, exits.append, link
        ) as child:
            await Lines(child).handshake()
            token = child.identity.token
            [grandchild] = [
                p for p in scan_processes([token]).carrying(token) if p.pid != child.identity.pid
            ]
    assert not is_same_process(grandchild.pid, grandchild.start_time)
    assert exits == [ExitProof(returncode=0, signal=None, stragglers_killed=1)]


async def test_the_agents_stderr_reaches_the_given_descriptor(
    keeper: HolderKeeper, tokens: list[str]
) -> None:
    link = await keeper.link()
    read_end, write_end = os.pipe()
    token = new_spawn_token()
    tokens.append(token)
    stderr_spec = ChildSpec(
        argv=[sys.executable, "-c", "import sys; sys.stderr.write('this run\\n')"],
        cwd="/",
        env={},
        token=token,
        stderr_fd=write_end,
    )
    exits: list[HeldExit] = []
    try:
        with trio.fail_after(20):
            async with open_held_child(
                stderr_spec, QUICK, ignore_identity, exits.append, link
            ) as child:
                assert await child.wait() == 0
        os.fstat(write_end)  # still open: the caller closes it
        os.close(write_end)
        write_end = -1
        assert os.read(read_end, 100) == b"this run\n"
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    assert exits == [ExitProof(returncode=0, signal=None, stragglers_killed=0)]


async def test_a_killed_holder_ends_its_agents_and_they_are_proven_gone(
    keeper: HolderKeeper, tokens: list[str]
) -> None:
    link = await keeper.link()
    exits: list[HeldExit] = []
    with trio.fail_after(30):
        async with open_held_child(
            spec(tokens, {**STUBBORN, "spawnGrandchild": True}),
            SHORT,
            ignore_identity,
            exits.append,
            link,
        ) as child:
            lines = Lines(child)
            await lines.handshake()
            token = child.identity.token
            carriers = scan_processes([token]).carrying(token)
            assert len(carriers) == 2
            os.kill(link.holder_pid, signal.SIGKILL)
            # Its output ends: that is how the session task learns of it.
            assert await lines.receive() is None
            await link.lost.wait()
    assert exits == [EndOutcome.ENDED]
    for proc in carriers:
        assert not is_same_process(proc.pid, proc.start_time)
    # The next spawn gets a new holder.
    fresh = await keeper.link()
    assert fresh is not link and fresh.holder_pid != link.holder_pid
    assert socket_path(keeper.state_dir).exists()


async def test_a_spawn_that_fails_leaves_nothing(keeper: HolderKeeper, tokens: list[str]) -> None:
    link: HolderLink = await keeper.link()
    bad = ChildSpec(argv=["/nonexistent/agent"], cwd="/", env={}, token=new_spawn_token())
    exits: list[HeldExit] = []
    with pytest.raises(FileNotFoundError):
        async with open_held_child(bad, QUICK, ignore_identity, exits.append, link):
            pass
    assert exits == []
    assert link.agents == {}


async def test_a_spawn_exec_cannot_take_is_refused_before_the_holder_sees_it(
    keeper: HolderKeeper, tokens: list[str]
) -> None:
    """A NUL byte in argv, environment or cwd is the spawn's EINVAL, and the link
    (every other agent's) stays up."""
    link: HolderLink = await keeper.link()
    with trio.fail_after(30):
        async with open_held_child(
            spec(tokens), QUICK, ignore_identity, lambda _: None, link
        ) as child:
            lines = Lines(child)
            for bad, why in (
                (
                    ChildSpec(argv=["sleep", "6\x000"], cwd="/", env={}, token=new_spawn_token()),
                    "argv",
                ),
                (
                    ChildSpec(argv=["true"], cwd="/", env={"X": "a\x00b"}, token=new_spawn_token()),
                    "environment",
                ),
                (ChildSpec(argv=["true"], cwd="/\x00tmp", env={}, token=new_spawn_token()), "cwd"),
                (
                    ChildSpec(argv=["true"], cwd="/", env={"A=B": "c"}, token=new_spawn_token()),
                    "name",
                ),
            ):
                exits: list[HeldExit] = []
                with pytest.raises(OSError) as raised:
                    async with open_held_child(bad, QUICK, ignore_identity, exits.append, link):
                        pass
                # Refused here, saying what: the holder is never asked.
                assert why in str(raised.value)
                assert raised.value.errno == errno.EINVAL
                assert exits == []
            assert not link.lost.is_set()
            assert set(link.agents) == {child.identity.token}
            await lines.handshake()  # the agent spawned before is served still


async def test_a_spawn_cancelled_while_the_holder_starts_it_is_still_laddered(
    keeper: HolderKeeper, tokens: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close that lands while the spawn request is in flight: the holder starts
    the agent all the same, so its answer is heard and the agent laddered (found by
    the crash harness: the lease was released as never started while it ran)."""
    link = await keeper.link()
    exits: list[HeldExit] = []
    original = HolderLink.send
    with trio.fail_after(20), trio.CancelScope() as scope:

        async def send(self: HolderLink, header: dict[str, Any], payload: bytes = b"") -> None:
            await original(self, header, payload)
            if header["op"] == "spawn":
                scope.cancel()

        monkeypatch.setattr(HolderLink, "send", send)
        async with open_held_child(spec(tokens), QUICK, ignore_identity, exits.append, link):
            raise AssertionError("the body never runs: the task was cancelled")
    assert scope.cancelled_caught
    assert exits == [ExitProof(returncode=0, signal=None, stragglers_killed=0)]


def kill_holder_after_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder is SIGKILLed as soon as a ``spawn`` was sent to it: it may or may
    not have started the agent."""
    original = HolderLink.send

    async def send(self: HolderLink, header: dict[str, Any], payload: bytes = b"") -> None:
        await original(self, header, payload)
        if header["op"] == "spawn":
            os.kill(self.holder_pid, signal.SIGKILL)

    monkeypatch.setattr(HolderLink, "send", send)


async def test_a_spawn_whose_holder_is_lost_ends_what_carries_its_token(
    keeper: HolderKeeper, tokens: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder dies right after it was asked to spawn: whatever it may have
    started is found by the token and ended, and the outcome is reported."""
    link = await keeper.link()
    exits: list[HeldExit] = []
    kill_holder_after_spawn(monkeypatch)
    with trio.fail_after(20), pytest.raises(HolderLost):
        async with open_held_child(spec(tokens), QUICK, ignore_identity, exits.append, link):
            raise AssertionError("the body never runs: the holder is gone")
    assert len(exits) == 1 and exits[0] in (EndOutcome.ENDED, EndOutcome.ALREADY_GONE)


@pytest.mark.parametrize("marked", [True, False], ids=["marked", "earlier-release"])
async def test_a_holder_lost_before_the_spawn_reached_it_started_nothing(
    keeper: HolderKeeper, tokens: list[str], monkeypatch: pytest.MonkeyPatch, marked: bool
) -> None:
    """Nothing of the spawn ran: the outcome says so at once, whether the holder had
    a mark to wait for its forks by or, as one of an earlier release, none."""
    link = await keeper.link()
    assert link.mark is not None
    if not marked:
        link.mark = None
    exits: list[HeldExit] = []
    original = HolderLink.send

    async def send(self: HolderLink, header: dict[str, Any], payload: bytes = b"") -> None:
        if header["op"] == "spawn":  # the holder is dead before it could read it
            pidfd = os.pidfd_open(self.holder_pid)
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                await trio.lowlevel.wait_readable(pidfd)  # readable once it exited
            finally:
                os.close(pidfd)
        await original(self, header, payload)

    monkeypatch.setattr(HolderLink, "send", send)
    with trio.fail_after(20), pytest.raises(HolderLost):
        async with open_held_child(spec(tokens), QUICK, ignore_identity, exits.append, link):
            raise AssertionError("the body never runs: the holder is gone")
    assert exits == [EndOutcome.ALREADY_GONE]


async def test_an_agent_that_exits_at_once_reports_its_status(
    keeper: HolderKeeper, tokens: list[str]
) -> None:
    """Its exit may come right behind the spawn's answer: it is never taken for an
    unknown agent's (which the link would have the holder forget)."""
    link = await keeper.link()
    for _ in range(10):
        token = new_spawn_token()
        tokens.append(token)
        quick = ChildSpec(argv=["/bin/sh", "-c", "exit 7"], cwd="/", env={}, token=token)
        exits: list[HeldExit] = []
        with trio.fail_after(20):
            async with open_held_child(quick, QUICK, ignore_identity, exits.append, link) as child:
                assert await child.wait() == 7
        assert exits == [ExitProof(returncode=7, signal=None, stragglers_killed=0)]


# After a "go" line: numbered lines, "done", then exit once a line comes.
COUNTER = [
    sys.executable,
    "-I",
    "-c",
    "import sys\n"
    "sys.stdin.readline()\n"
    "for i in range(3000):\n"
    "    sys.stdout.write(f'line {i}\\n')\n"
    "sys.stdout.write('done\\n'); sys.stdout.flush()\n"
    "sys.stdin.readline()\n",
]


async def _read_until(agent: HeldAgent, end: bytes, data: bytes = b"") -> bytes:
    while end not in data:
        chunk = await agent.stdout.receive_some(4096)
        assert chunk, "its output ended early"
        data += chunk
    return data


async def test_a_later_link_adopts_an_agent_and_resumes_its_output_exactly(
    tmp_path: Path, tokens: list[str]
) -> None:
    """The transport half of reattach: the first link (a daemon) reads part of the
    agent's output and goes away; the next adopts the agent at the offset the first
    had consumed and reads exactly the rest; the agent's stdin stayed open."""
    token = new_spawn_token()
    tokens.append(token)
    env = {**os.environ, "AGENTSD_SPAWN_TOKEN": token}
    with trio.fail_after(30):
        async with open_holder_link(tmp_path) as first:
            agent = await first.spawn(token, COUNTER, "/", env, None)
            await agent.stdin.send_all(b"go\n")
            head = await _read_until(agent, b"line 99\n")
            consumed = len(head)
            pid, holder_pid = agent.pid, first.holder_pid
        async with open_holder_link(tmp_path) as second:
            assert second.holder_pid == holder_pid
            assert second.found[token]["pid"] == pid
            with pytest.raises(HolderRefused) as gone:
                await second.adopt(token, consumed + 10**9, 0, None)
            assert gone.value.kind == "offset_gone"
            adopted = await second.adopt(token, consumed, 0, None)
            rest = await _read_until(adopted, b"done\n")
            expected = "".join(f"line {i}\n" for i in range(3000)) + "done\n"
            assert head + rest == expected.encode()
            await adopted.stdin.send_all(b"bye\n")
            assert await adopted.wait() == 0
            await second.release(adopted)
            second.forget_unclaimed()
    await eventually(lambda: _ended(holder_pid))


# After a "go" line: 2.3 MB of numbered lines as fast as it can, then "done".
FLOODER = [
    sys.executable,
    "-I",
    "-c",
    "import sys\n"
    "sys.stdin.readline()\n"
    "out = sys.stdout.buffer\n"
    "for i in range(250_000):\n"
    "    out.write(b'line %d\\n' % i)\n"
    "out.write(b'done\\n'); out.flush()\n"
    "sys.stdin.readline()\n",
]


async def test_an_agent_faster_than_its_reader_waits_within_the_window_and_nothing_is_lost(
    tmp_path: Path, tokens: list[str]
) -> None:
    """An agent that writes far more than the reader takes (2.3 MB against a slow
    reader, acknowledging only what it made durable, as under reattach): the daemon
    is never sent more than its window ahead of what the reader took (the rest waits
    in the holder and the agent's pipe), and the reader gets every byte in order."""
    assert await _flood_slowly(tmp_path, tokens) <= holder_link.OUT_WINDOW


@pytest.fixture
def windowless_holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Links start a holder that ignores ``upto``, as one of an earlier release."""
    source = Path(holder.__file__).read_text()
    assert source.count("stream.upto = upto\n") == 1
    earlier = tmp_path / "holder_without_window.py"
    earlier.write_text(source.replace("stream.upto = upto\n", "stream.upto = None\n"))
    monkeypatch.setattr(holder_link, "HOLDER_SCRIPT", earlier)


@pytest.mark.usefixtures("windowless_holder")
async def test_a_holder_that_knows_no_window_is_read_exactly(
    tmp_path: Path, tokens: list[str]
) -> None:
    """A holder of an earlier release (a restart in place keeps the one running)
    ignores ``upto`` and relays everything as it comes: the link reads it exactly."""
    # It relayed past the window: the holder that ran was the one without it.
    assert await _flood_slowly(tmp_path, tokens) > holder_link.OUT_WINDOW


async def _flood_slowly(tmp_path: Path, tokens: list[str]) -> int:
    """``FLOODER`` read 4 KiB at a time through a link of its own, acknowledging
    only what is "journaled" (every 100 KB); checks every byte came in order. The
    most that waited in the daemon, unread."""
    token = new_spawn_token()
    tokens.append(token)
    env = {**os.environ, "AGENTSD_SPAWN_TOKEN": token}
    expected = b"".join(b"line %d\n" % i for i in range(250_000)) + b"done\n"
    with trio.fail_after(60):
        async with open_holder_link(tmp_path) as link:
            agent = await link.spawn(token, FLOODER, "/", env, None, durable_acks=True)
            await agent.stdin.send_all(b"go\n")
            # The holder fills the window (at least) before the reader takes a byte.
            await eventually(lambda: len(agent._out) >= holder_link.OUT_WINDOW)
            await agent.signal_group(signal.SIGCONT)  # a round trip: what was relayed came
            data = bytearray()
            ahead = len(agent._out)
            while not data.endswith(b"done\n"):
                chunk = await agent.stdout.receive_some(4096)
                assert chunk, "its output ended early"
                data += chunk
                ahead = max(ahead, len(agent._out))
                if len(data) - agent._out_acked >= 100_000:
                    agent.acknowledge_out(len(data))  # "journaled"
            assert data == expected
            await agent.stdin.send_all(b"bye\n")
            assert await agent.wait() == 0
            holder_pid = link.holder_pid
            await link.release(agent)
    await eventually(lambda: _ended(holder_pid))
    return ahead


def _running(script: Path) -> list[int]:
    """Pids of live processes running ``script``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        info = read_proc_info(int(entry))
        if str(script).encode() in cmdline.split(b"\0") and info is not None and not info.is_zombie:
            found.append(int(entry))
    return found


@pytest.mark.parametrize(
    "program",
    [
        # Never reports its pid.
        "import time\ntime.sleep(600)\n",
        # Reports it, detached as the holder does, then never reads its socket.
        "import os, time\n"
        "if os.fork() > 0:\n    os._exit(0)\n"
        "os.write(1, f'{os.getpid()}\\n'.encode()); os.close(1)\n"
        "time.sleep(600)\n",
    ],
    ids=["silent", "mute"],
)
async def test_a_holder_that_never_attaches_is_ended_and_the_link_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, program: str
) -> None:
    """A broken holder fails the attach with HolderLost within the connect bound,
    and is killed, not left running for the next daemon to meet; none is ever this
    process's child, so none is left a zombie of it either."""
    broken = tmp_path / "broken_holder.py"
    broken.write_text(program)
    monkeypatch.setattr(holder_link, "HOLDER_SCRIPT", broken)
    monkeypatch.setattr(holder_link, "CONNECT_TIMEOUT_S", 0.5)
    with trio.fail_after(20), pytest.raises(HolderLost):
        async with open_holder_link(tmp_path):
            raise AssertionError("never attached")
    await eventually(lambda: _running(broken) == [])
    assert [p for p in scan_processes().processes.values() if p.ppid == os.getpid()] == []


async def test_a_holder_that_refuses_the_daemon_fails_the_attach(tmp_path: Path) -> None:
    """A holder that closes the connection on the daemon (as it does for a peer it
    refuses) is HolderLost, never another exception out of the attach."""
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    old = os.umask(0o077)  # 0600, as the holder's own: trusted (Rule 5)
    try:
        await listener.bind(str(socket_path(tmp_path)))
    finally:
        os.umask(old)
    listener.listen(4)

    async def refuse() -> None:
        while True:
            conn, _ = await listener.accept()
            conn.close()  # unread: the daemon's hello is answered by a reset

    with trio.fail_after(20), listener:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(refuse)
            with pytest.raises(HolderLost, match="did not attach us"):
                async with open_holder_link(tmp_path):
                    raise AssertionError("never attached")
            nursery.cancel_scope.cancel()


async def test_the_exit_watch_hears_the_holders_report_and_stops_when_released(
    keeper: HolderKeeper, tokens: list[str]
) -> None:
    """`HeldChild.watch_exit` is the session task's exit watch for a held agent:
    called once the holder reported the exit (at once when it already had), and
    no more once released."""
    link = await keeper.link()
    token = new_spawn_token()
    tokens.append(token)
    quick = ChildSpec(argv=["/bin/sh", "-c", "read line; exit 3"], cwd="/", env={}, token=token)
    with trio.fail_after(20):
        async with open_held_child(quick, QUICK, ignore_identity, lambda _: None, link) as child:
            heard: list[str] = []
            release = child.watch_exit(lambda: heard.append("first"))
            assert heard == []
            await child.stdin.send_all(b"go\n")
            assert await child.wait() == 3
            assert heard == ["first"]
            release()
            late = child.watch_exit(lambda: heard.append("late"))  # already exited
            assert heard == ["first", "late"]
            late()
            assert child.agent.on_exit is None


@pytest.fixture
def cgroups() -> Iterator[CgroupRoot]:
    if unavailable() is not None:
        pytest.skip(str(unavailable()))
    with cgroup_root() as path:
        yield CgroupRoot(path)


@pytest.mark.parametrize("clones", [True, False], ids=["cloned", "shim"])
async def test_a_held_agent_is_born_in_its_cgroup_and_nothing_escapes_its_ladder(
    keeper: HolderKeeper, tokens: list[str], cgroups: CgroupRoot, clones: bool
) -> None:
    """The holder, not a fork server of the daemon, starts it: cloned into its
    cgroup, or (a holder of an earlier release, which says nothing of ``cgroups``)
    through the joining shim, so it is in its cgroup at its first instruction and
    its parent is the holder. A setsid() grandchild with an empty environment does
    not escape: ``cgroup.kill`` is the last rung, the proof the holder's reap plus
    ``populated 0``, and the cgroup is removed after."""
    link = await keeper.link()
    assert link.clones_into_cgroups
    link.clones_into_cgroups = clones
    token = new_spawn_token()
    tokens.append(token)
    escaping = ChildSpec(
        argv=[sys.executable, "-c", ESCAPING],
        cwd="/",
        env={},
        token=token,
        cgroup_root=cgroups,
        base_env=dict(os.environ),
    )
    cgroup = cgroups.for_token(token)
    exits: list[HeldExit] = []
    with trio.fail_after(30):
        async with open_held_child(escaping, SHORT, ignore_identity, exits.append, link) as child:
            first = b""
            while first.count(b"\n") < 2:
                first += await child.stdout.receive_some(4096)
            assert first.decode().splitlines()[0] == f"0::/{cgroups.path.name}/agent-{token}"
            info = read_proc_info(child.identity.pid)
            assert info is not None and info.ppid == link.holder_pid
            procs = [(pid, read_proc_info(pid)) for pid in cgroup.members()]
            assert len(procs) == 2  # the agent and its escaped great-grandchild
    [outcome] = exits
    assert isinstance(outcome, ExitProof)
    assert outcome.cgroup_empty and outcome.signal == signal.SIGKILL
    assert outcome.stragglers_killed == 1
    assert not any(p is not None and is_same_process(pid, p.start_time) for pid, p in procs)
    assert not cgroup.path.exists()


async def test_a_missing_agent_in_cgroup_mode_fails_and_leaves_no_cgroup(
    keeper: HolderKeeper, tokens: list[str], cgroups: CgroupRoot
) -> None:
    link = await keeper.link()
    token = new_spawn_token()
    tokens.append(token)
    missing = ChildSpec(
        argv=["no-such-agent-program"],
        cwd="/",
        env={"PATH": "/nonexistent"},
        token=token,
        cgroup_root=cgroups,
    )
    exits: list[HeldExit] = []
    with pytest.raises(FileNotFoundError):
        async with open_held_child(missing, QUICK, ignore_identity, exits.append, link):
            pytest.fail("the body ran")
    assert exits == []
    assert cgroups.existing() == []


async def test_a_stdin_frame_cancelled_mid_send_goes_whole_and_the_link_serves_on(
    keeper: HolderKeeper,
) -> None:
    """A big stdin frame whose send is cancelled while the holder is stalled (its
    socket full) is still written whole (or not at all): the holder's next request
    on the shared socket is answered, and the agent reads the whole frame."""
    link = await keeper.link()
    counter = "import sys; print(len(sys.stdin.buffer.read()), flush=True)"
    env = dict(os.environ)
    a = await link.spawn(new_spawn_token(), [sys.executable, "-c", counter], "/", env, None)
    b = await link.spawn(new_spawn_token(), ["sleep", "600"], "/", env, None)
    frame = b"x" * (8 << 20)
    try:
        os.kill(link.holder_pid, signal.SIGSTOP)
        try:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(a.stdin.send_all, frame)
                    # Every task blocked: the send waits on a socket the holder
                    # does not read, some of the frame sent.
                    await trio.testing.wait_all_tasks_blocked()
                    scope.cancel()
        finally:
            os.kill(link.holder_pid, signal.SIGCONT)
        with trio.fail_after(60):
            assert await b.signal_group(signal.SIGCONT)  # another agent's request
            await a.close_stdin()
            out = b""
            while not out.endswith(b"\n"):
                data = await a.stdout.receive_some()
                assert data, "its stdout ended early"
                out += data
        assert int(out) in (0, len(frame))
        assert not link.lost.is_set()
    finally:
        for agent in (a, b):
            await agent.signal_group(signal.SIGKILL)
            with trio.fail_after(30):
                await agent.wait()
            await link.release(agent)


async def test_a_clock_stepped_back_never_fences_the_next_daemon_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hello epoch is durable and strictly increasing: a daemon that attached
    while the clock ran ahead, then one after the clock was stepped back, both
    attach the same holder (and the stored epoch is only the user's to read)."""
    ahead = time.time_ns() + 10**18  # some 30 years
    monkeypatch.setattr(time, "time_ns", lambda: ahead)
    token = new_spawn_token()
    async with open_holder_link(tmp_path) as first:
        holder_pid = first.holder_pid
        # Something held, so that the holder stays for the next daemon.
        await first.spawn(token, ["sleep", "600"], "/", dict(os.environ), None)
    monkeypatch.undo()  # the clock is stepped back
    async with open_holder_link(tmp_path) as second:
        assert second.holder_pid == holder_pid
        agent = await second.adopt(token, 0, 0, None)
        await agent.signal_group(signal.SIGKILL)
        assert await agent.wait() == -signal.SIGKILL
        await second.release(agent)
    epoch_file = tmp_path / holder_link.EPOCH_NAME
    assert int(epoch_file.read_text()) == ahead + 1
    assert stat.S_IMODE(epoch_file.stat().st_mode) == 0o600
    # A stored epoch is honoured however far ahead of the clock, and never reused.
    epoch_file.write_text(f"{ahead * 2}\n")
    assert holder_link.next_epoch(tmp_path) == ahead * 2 + 1
    assert holder_link.next_epoch(tmp_path) == ahead * 2 + 2
    await eventually(lambda: _ended(holder_pid))


async def test_a_stderr_pipe_nobody_reads_stalls_no_other_agent(keeper: HolderKeeper) -> None:
    """An agent floods its stderr into a log pipe nobody reads: another agent's
    requests and output are served all the same, and the copy resumes, in order,
    once the pipe is read."""
    link = await keeper.link()
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    flood = "import sys\nwhile True:\n    sys.stderr.buffer.write(b'e' * 65536)\n"
    echo = "import sys\nfor line in sys.stdin:\n    print('echo: ' + line, end='', flush=True)\n"
    env = dict(os.environ)
    a = b = None
    try:
        a = await link.spawn(new_spawn_token(), [sys.executable, "-c", flood], "/", env, write_end)
        b = await link.spawn(new_spawn_token(), [sys.executable, "-c", echo], "/", env, None)
        # The log pipe is full: its copy (the link's reader, before) waits on it.
        await eventually(
            lambda: (
                int.from_bytes(fcntl.ioctl(read_end, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)
                >= 4096
            )
        )
        with trio.fail_after(60):
            for i in range(3):
                assert await b.signal_group(signal.SIGCONT)
                await b.stdin.send_all(f"{i}\n".encode())
                assert await _read_until(b, f"echo: {i}\n".encode()) == f"echo: {i}\n".encode()
            # Read, the pipe takes the rest: a's stderr flows on, only its bytes.
            got = b""
            while len(got) < 1 << 20:
                got += await trio.to_thread.run_sync(os.read, read_end, 1 << 16)
        assert set(got) == {ord("e")}
        assert not link.lost.is_set()
    finally:
        for agent in (a, b):
            if agent is not None:
                await agent.signal_group(signal.SIGKILL)
                with trio.fail_after(30):
                    await agent.wait()
                await link.release(agent)
        os.close(read_end)
        os.close(write_end)


async def test_a_holder_socket_others_could_have_made_is_not_trusted(tmp_path: Path) -> None:
    """What listens at holder.sock is trusted only if the socket is ours, 0600, in
    a directory only we can write: no holder is attached (nor started) otherwise."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        impostor.bind(str(socket_path(state)))
        impostor.listen(4)
        os.chmod(socket_path(state), 0o666)
        with pytest.raises(HolderLost, match="mode 666"):
            async with open_holder_link(state):
                pass
        os.chmod(socket_path(state), 0o600)
        os.chmod(state, 0o770)
        with pytest.raises(HolderLost, match="others can write"):
            async with open_holder_link(state):
                pass
    finally:
        impostor.close()
    assert not (state / holder_link.EPOCH_NAME).exists()  # it never said hello
