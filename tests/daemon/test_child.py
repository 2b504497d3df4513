"""child: spawn, identity, the close ladder and its proof of exit. Every test runs
real child processes and leaves none behind."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import msgspec
import pytest
import trio
import trio.testing

from agentsd.child import (
    Child,
    ChildExit,
    ChildSpec,
    ExitProof,
    ExitUnproven,
    new_spawn_token,
    open_child,
)
from agentsd.config import Ladder
from agentsd.leftovers import ChildIdentity
from agentsd.procfs import (
    ProcessTable,
    ProcInfo,
    ProcScanFailed,
    ProcScanner,
    is_same_process,
    read_start_time,
    scan_processes,
)

MOCK_AGENT = [sys.executable, "-m", "agentsd.providers.mock_agent"]
# Long graces: a test that closes fast proves no grace was waited.
PATIENT = Ladder(eof_grace_s=30.0, term_grace_s=30.0, kill_wait_s=30.0)
QUICK = Ladder(eof_grace_s=5.0, term_grace_s=5.0, kill_wait_s=5.0)
STUBBORN = {"ignoreSigterm": True, "ignoreEof": True}

MakeToken = Callable[[], str]


# -- helpers shared with test_mock_agent ------------------------------------------


class JsonLines:
    """The test's side of a JSON-lines conversation with a child."""

    def __init__(self, child: Child) -> None:
        self.child = child
        self._buf = bytearray()

    async def send(self, frame: dict[str, Any]) -> None:
        await self.child.stdin.send_all(json.dumps(frame).encode() + b"\n")

    async def receive_line(self) -> bytes:
        while (newline := self._buf.find(b"\n")) < 0:
            data = await self.child.stdout.receive_some(65536)
            if not data:
                raise EOFError(f"the child closed stdout; unterminated: {bytes(self._buf)!r}")
            self._buf += data
        line = bytes(self._buf[:newline])
        del self._buf[: newline + 1]
        return line

    async def receive(self) -> dict[str, Any]:
        frame = json.loads(await self.receive_line())
        assert isinstance(frame, dict)
        return frame

    async def receive_until(self, kind: str) -> list[dict[str, Any]]:
        """Frames up to and including the first one of type ``kind``."""
        frames = []
        while True:
            frame = await self.receive()
            frames.append(frame)
            if frame["type"] == kind:
                return frames

    async def handshake(self, handle: str | None = None) -> dict[str, Any]:
        await self.send({"type": "initialize", "handle": handle})
        frame = await self.receive()
        assert frame["type"] == "initialized", frame
        return frame


def mock_spec(token: str, options: dict[str, Any] | None = None) -> ChildSpec:
    env = {"AGENTSD_MOCK_OPTIONS": json.dumps(options or {})}
    return ChildSpec(argv=MOCK_AGENT, cwd="/", env=env, token=token)


async def ignore_identity(identity: ChildIdentity) -> None:
    await trio.lowlevel.checkpoint()


def leftovers(tokens: list[str]) -> list[ProcInfo]:
    """Our own children (alive or not yet reaped) and live carriers of ``tokens``."""
    table = scan_processes(tokens)
    found = {p.pid: p for p in table.processes.values() if p.ppid == os.getpid()}
    for token in tokens:
        found.update((p.pid, p) for p in table.carrying(token))
    return list(found.values())


@pytest.fixture
def tokens() -> list[str]:
    return []


@pytest.fixture
def make_token(tokens: list[str]) -> MakeToken:
    def make() -> str:
        token = new_spawn_token()
        tokens.append(token)
        return token

    return make


@pytest.fixture(autouse=True)
def no_leftovers(tokens: list[str]) -> Iterator[None]:
    """Fail a test that leaves a process behind (and kill what it left)."""
    assert leftovers(tokens) == []
    yield
    left = leftovers(tokens)
    for proc in left:
        if is_same_process(proc.pid, proc.start_time):
            fd = os.pidfd_open(proc.pid)
            signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
    assert left == [], "the test left processes behind"


def group_and_carriers(identity: ChildIdentity) -> list[ProcInfo]:
    table = scan_processes([identity.token])
    return table.group_members(identity.pgid) + table.carrying(identity.token)


# -- spawn and identity ------------------------------------------------------------


async def test_identity_is_recorded_before_the_body_runs(make_token: MakeToken) -> None:
    token = make_token()
    events: list[str] = []
    recorded: list[ChildIdentity] = []
    exits: list[ChildExit] = []

    async def on_spawned(identity: ChildIdentity) -> None:
        events.append("spawned")
        recorded.append(identity)
        assert await trio.to_thread.run_sync(is_same_process, identity.pid, identity.start_time)

    with trio.fail_after(15):
        async with open_child(mock_spec(token), QUICK, on_spawned, exits.append) as child:
            events.append("body")
            identity = child.identity
            assert recorded == [identity]
            assert identity.pid == identity.pgid == child.process.pid
            assert os.getpgid(identity.pid) == identity.pid  # its own group ...
            assert os.getsid(identity.pid) == identity.pid  # ... and its own session
            assert read_start_time(identity.pid) == identity.start_time
            assert identity.token == token
            # Scanned once the agent answered: the spawn returns as soon as the exec
            # has replaced the process image, a moment before the kernel has set up
            # the new environment, and /proc/PID/environ reads empty until it has.
            await JsonLines(child).handshake()
            carriers = scan_processes([token]).carrying(token)
            assert [p.pid for p in carriers] == [identity.pid]
    assert events == ["spawned", "body"]
    assert exits == [ExitProof(returncode=0, signal=None, stragglers_killed=0)]


async def test_spawn_failure_raises_and_leaves_nothing(make_token: MakeToken) -> None:
    spec = attrs.evolve(mock_spec(make_token()), argv=["/nonexistent/agent"])
    called = False
    exits: list[ChildExit] = []

    async def on_spawned(identity: ChildIdentity) -> None:
        nonlocal called
        called = True

    with trio.fail_after(15), pytest.raises(FileNotFoundError):
        async with open_child(spec, QUICK, on_spawned, exits.append):
            pytest.fail("the body must not run")
    assert not called
    assert exits == []  # nothing was spawned, so there is no exit to report


async def test_on_spawned_failure_still_runs_the_ladder_and_reports_its_proof(
    make_token: MakeToken,
) -> None:
    recorded: list[ChildIdentity] = []
    exits: list[ChildExit] = []

    async def on_spawned(identity: ChildIdentity) -> None:
        recorded.append(identity)
        raise RuntimeError("the database is gone")

    with trio.fail_after(15), pytest.raises(RuntimeError, match="database"):
        async with open_child(mock_spec(make_token()), QUICK, on_spawned, exits.append):
            pytest.fail("the body must not run")
    [identity] = recorded
    assert not is_same_process(identity.pid, identity.start_time)
    assert group_and_carriers(identity) == []
    # The caller never held the Child, yet learns how it was reaped.
    assert exits == [ExitProof(returncode=0, signal=None, stragglers_killed=0)]


async def test_children_do_not_inherit_descriptors(make_token: MakeToken, tmp_path: Path) -> None:
    exits: list[ChildExit] = []
    private = os.open(tmp_path / "private", os.O_CREAT | os.O_RDWR)  # non-inheritable
    shared = os.open(tmp_path / "inheritable", os.O_CREAT | os.O_RDWR)
    os.set_inheritable(shared, True)  # close_fds must stop even this one
    try:
        with trio.fail_after(15):
            async with open_child(
                mock_spec(make_token()), QUICK, ignore_identity, exits.append
            ) as child:
                await JsonLines(child).handshake()
                fd_dir = f"/proc/{child.identity.pid}/fd"
                fds = os.listdir(fd_dir)
                targets = {os.readlink(f"{fd_dir}/{n}") for n in fds}
    finally:
        os.close(private)
        os.close(shared)
    assert {"0", "1", "2"} <= set(fds)
    assert str(tmp_path / "private") not in targets
    assert str(tmp_path / "inheritable") not in targets


async def test_stderr_goes_to_the_given_descriptor_which_stays_the_callers(
    make_token: MakeToken, tmp_path: Path
) -> None:
    exits: list[ChildExit] = []
    read_fd, write_fd = os.pipe()
    spec = ChildSpec(
        argv=[sys.executable, "-c", "import sys; sys.stderr.write('this run\\n')"],
        cwd=str(tmp_path),
        env={},
        token=make_token(),
        stderr_fd=write_fd,
    )
    try:
        with trio.fail_after(15):
            async with open_child(spec, QUICK, ignore_identity, exits.append) as child:
                assert await child.wait() == 0
        os.fstat(write_fd)  # still open: the caller closes it
        os.close(write_fd)
        assert os.read(read_fd, 100) == b"this run\n"
    finally:
        os.close(read_fd)
    assert exits == [ExitProof(returncode=0, signal=None, stragglers_killed=0)]


# -- the close ladder --------------------------------------------------------------


async def test_child_that_exits_on_eof_closes_without_waiting_any_grace(
    make_token: MakeToken,
) -> None:
    exits: list[ChildExit] = []
    with trio.fail_after(15):
        async with open_child(
            mock_spec(make_token()), PATIENT, ignore_identity, exits.append
        ) as child:
            await JsonLines(child).handshake()
    # No grace was waited: the hang guard (15 s) is shorter than any of PATIENT's.
    assert exits == [ExitProof(returncode=0, signal=None, stragglers_killed=0)]


async def test_child_ignoring_eof_gets_sigterm(make_token: MakeToken) -> None:
    exits: list[ChildExit] = []
    ladder = msgspec.structs.replace(PATIENT, eof_grace_s=0.2)
    with trio.fail_after(15):
        async with open_child(
            mock_spec(make_token(), {"ignoreEof": True}), ladder, ignore_identity, exits.append
        ) as child:
            await JsonLines(child).handshake()
            closing_at = trio.current_time()
        closed_in = trio.current_time() - closing_at
    assert exits == [ExitProof(returncode=None, signal=signal.SIGTERM, stragglers_killed=0)]
    assert closed_in >= 0.2  # the eof grace was waited; the term grace (30 s) was not


async def test_child_ignoring_sigterm_is_killed_after_term_grace(make_token: MakeToken) -> None:
    exits: list[ChildExit] = []
    ladder = Ladder(eof_grace_s=0.2, term_grace_s=0.5, kill_wait_s=30.0)
    with trio.fail_after(15):
        async with open_child(
            mock_spec(make_token(), STUBBORN), ladder, ignore_identity, exits.append
        ) as child:
            await JsonLines(child).handshake()  # SIGTERM is ignored from here on
            closing_at = trio.current_time()
        closed_in = trio.current_time() - closing_at
    assert exits == [ExitProof(returncode=None, signal=signal.SIGKILL, stragglers_killed=0)]
    assert closed_in >= 0.7  # both graces were waited; the kill wait is past the hang guard
    assert group_and_carriers(child.identity) == []


async def test_hanging_handshake_cancelled_child_is_reaped(make_token: MakeToken) -> None:
    exits: list[ChildExit] = []
    handshaking = trio.Event()

    async def handshake() -> None:
        async with open_child(
            mock_spec(make_token(), {"hangHandshake": True}),
            QUICK,
            ignore_identity,
            exits.append,
        ) as spawned:
            children.append(spawned)
            handshaking.set()
            await JsonLines(spawned).handshake()

    children: list[Child] = []
    with trio.fail_after(15):
        # Cancelled while the handshake waits for its answer (every task blocked),
        # not after a delay that a slow spawn could outlast.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(handshake)
            await handshaking.wait()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    [child] = children
    assert child.process.returncode is not None
    assert [type(e) for e in exits] == [ExitProof]
    assert group_and_carriers(child.identity) == []


async def test_grandchild_that_left_the_group_is_found_by_token_and_ended(
    make_token: MakeToken,
) -> None:
    exits: list[ChildExit] = []
    token = make_token()
    with trio.fail_after(15):
        async with open_child(
            mock_spec(token, {"spawnGrandchild": True}), QUICK, ignore_identity, exits.append
        ) as child:
            await JsonLines(child).handshake()  # the fork happens before input is read
            carriers = scan_processes([token]).carrying(token)
            [grandchild] = [p for p in carriers if p.pid != child.identity.pid]
            # It calls setsid() once it runs, which the handshake does not wait for.
            while grandchild.pgid == child.identity.pgid:
                await trio.sleep(0.01)
                grandchild = scan_processes([token]).processes[grandchild.pid]
    assert not is_same_process(grandchild.pid, grandchild.start_time)
    assert scan_processes([token]).carrying(token) == []
    assert exits == [ExitProof(returncode=0, signal=None, stragglers_killed=1)]


async def test_crashed_child_exit_is_observed_and_proven(make_token: MakeToken) -> None:
    exits: list[ChildExit] = []
    with trio.fail_after(15):
        async with open_child(
            mock_spec(make_token(), {"crashAfterS": 0.05, "spawnGrandchild": True}),
            PATIENT,
            ignore_identity,
            exits.append,
        ) as child:
            assert await child.wait() == 3
    # Straight to the stragglers: every PATIENT grace is past the hang guard (15 s).
    assert exits == [ExitProof(returncode=3, signal=None, stragglers_killed=1)]
    assert group_and_carriers(child.identity) == []


async def test_carrier_deaf_to_sigterm_is_killed_with_its_stubborn_child(
    make_token: MakeToken,
) -> None:
    """Child and setsid() grandchild both ignore SIGTERM: the SIGKILL rung ends the
    group and the carrier its SIGTERM rung found, and the proof shows both gone,
    the carrier counted once."""
    token = make_token()
    script = (
        "trap '' TERM; setsid sleep 3600 </dev/null >/dev/null 2>&1 & read -r line; exec sleep 3600"
    )
    spec = ChildSpec(argv=["/bin/sh", "-c", script], cwd="/", env={}, token=token)
    ladder = Ladder(eof_grace_s=0.2, term_grace_s=0.2, kill_wait_s=5.0)
    exits: list[ChildExit] = []
    with trio.fail_after(15):
        async with open_child(spec, ladder, ignore_identity, exits.append) as child:
            outside: list[ProcInfo] = []
            while not outside:  # until the grandchild has left the group
                await trio.sleep(0.01)
                table = scan_processes([token])
                outside = [p for p in table.carrying(token) if p.pgid != child.identity.pgid]
    assert exits == [ExitProof(returncode=None, signal=signal.SIGKILL, stragglers_killed=1)]
    assert not is_same_process(outside[0].pid, outside[0].start_time)
    assert group_and_carriers(child.identity) == []


class _CancelAtStep(trio.abc.Instrument):
    """Cancels ``scope`` after ``task`` has run ``step`` steps: the cancellation then
    lands on whatever await that task reaches next."""

    def __init__(self, task: trio.lowlevel.Task, step: int, scope: trio.CancelScope) -> None:
        self.task = task
        self.step = step
        self.scope = scope
        self.steps = 0

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1
            if self.steps == self.step:
                self.scope.cancel()


@attrs.define
class _Round:
    identities: list[ChildIdentity] = attrs.Factory(list)
    children: list[Child] = attrs.Factory(list)
    exits: list[ChildExit] = attrs.Factory(list)
    cancelled: bool = False
    steps: int = 0


async def _session_cancelled_at(step: int, token: str) -> _Round:
    """One whole session (spawn, on_spawned, handshake, a turn, close) with a
    cancellation injected after ``step`` steps of this task."""
    result = _Round()

    async def on_spawned(identity: ChildIdentity) -> None:
        result.identities.append(identity)
        await trio.lowlevel.checkpoint()  # the durable write would await here

    spec = mock_spec(token, {"chunks": 2, "chunkDelayS": 0.0})
    scope = trio.CancelScope()
    instrument = _CancelAtStep(trio.lowlevel.current_task(), step, scope)
    trio.lowlevel.add_instrument(instrument)
    try:
        with scope:
            async with open_child(spec, QUICK, on_spawned, result.exits.append) as child:
                result.children.append(child)
                lines = JsonLines(child)
                await lines.handshake()
                await lines.send({"type": "prompt", "id": "m1", "text": "hi"})
                await lines.receive_until("turn_completed")
    finally:
        trio.lowlevel.remove_instrument(instrument)
    result.cancelled = scope.cancelled_caught
    result.steps = instrument.steps
    return result


async def test_cancellation_at_every_await_point_still_reaps(make_token: MakeToken) -> None:
    phases_hit: set[str] = set()
    with trio.fail_after(120):
        for step in range(1, 500):
            token = make_token()
            result = await _session_cancelled_at(step, token)
            for child in result.children:
                assert child.process.returncode is not None
            # Every spawn is reported proven, even one cancelled before its body.
            assert all(isinstance(e, ExitProof) for e in result.exits)
            if result.identities:
                assert len(result.exits) == 1
            for identity in result.identities:
                assert group_and_carriers(identity) == []
            assert await trio.to_thread.run_sync(leftovers, [token]) == []
            if result.cancelled:
                phases_hit.add(
                    "body" if result.children else "on_spawned" if result.identities else "spawn"
                )
            if result.steps < step:
                break  # the whole session ran before the cancellation was due
        else:
            pytest.fail("the session never finished before its cancellation")
    assert phases_hit == {"spawn", "on_spawned", "body"}


async def test_closing_fifty_children_takes_about_one_ladder(make_token: MakeToken) -> None:
    exits: list[ChildExit] = []
    ladder = Ladder(eof_grace_s=0.5, term_grace_s=1.0, kill_wait_s=10.0)
    scanner = ProcScanner()
    all_ready = trio.Event()
    ready = 0
    children: list[Child] = []

    async def session() -> None:
        nonlocal ready
        spec = mock_spec(make_token(), STUBBORN)
        async with open_child(
            spec, ladder, ignore_identity, exits.append, scanner=scanner
        ) as child:
            children.append(child)
            await JsonLines(child).handshake()
            ready += 1
            if ready == 50:
                all_ready.set()
            await all_ready.wait()

    with trio.fail_after(60):  # spawning 50 interpreters on a shared machine
        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(session)
            await all_ready.wait()
            scans_before = scanner.scans_completed
    # Counts, not clocks: concurrent closes share their /proc scans (one batch serves
    # every ladder waiting on it), so the count proves the ladders overlapped however
    # loaded the machine is. A wall-clock bound would flake under load.
    assert len(children) == 50
    assert len(exits) == 50
    for outcome in exits:
        assert isinstance(outcome, ExitProof) and outcome.signal == signal.SIGKILL
    # Each close scans three times; serial closes would need 150 scans.
    scans = scanner.scans_completed - scans_before
    assert scans < 50, f"{scans} scans for 50 closes: the ladders ran one after another"


# -- exit that cannot be proven ----------------------------------------------------


class _BrokenScanner(ProcScanner):
    async def scan(self, tokens: Iterable[str] = (), marks: Iterable[str] = ()) -> ProcessTable:
        await trio.lowlevel.checkpoint()
        raise ProcScanFailed("no /proc here")


class _PhantomScanner(ProcScanner):
    """Reports a process in ``pgid`` that can never be signalled (no such pid)."""

    pgid = -1

    async def scan(self, tokens: Iterable[str] = (), marks: Iterable[str] = ()) -> ProcessTable:
        table = await super().scan(tokens, marks)
        phantom = ProcInfo(pid=99_999_999, ppid=1, pgid=self.pgid, state="S", start_time=1)
        return ProcessTable(
            processes={**table.processes, phantom.pid: phantom},
            tokens=table.tokens,
            marks=table.marks,
        )


async def test_unproven_exit_is_reported_and_the_body_error_propagates(
    make_token: MakeToken,
) -> None:
    exits: list[ChildExit] = []
    with trio.fail_after(15), pytest.raises(ValueError, match="body"):
        async with open_child(
            mock_spec(make_token()), QUICK, ignore_identity, exits.append, scanner=_BrokenScanner()
        ) as child:
            raise ValueError("the body failed")
    [unproven] = exits
    assert isinstance(unproven, ExitUnproven) and "scan" in unproven.reason
    assert child.process.returncode == 0  # reaped all the same


async def test_a_straggler_that_survives_every_round_leaves_exit_unproven(
    make_token: MakeToken,
) -> None:
    exits: list[ChildExit] = []
    scanner = _PhantomScanner()
    ladder = Ladder(eof_grace_s=5.0, term_grace_s=5.0, kill_wait_s=0.05, proof_rounds=2)

    async def on_spawned(identity: ChildIdentity) -> None:
        scanner.pgid = identity.pgid
        await trio.lowlevel.checkpoint()

    with trio.fail_after(15):
        async with open_child(
            mock_spec(make_token()), ladder, on_spawned, exits.append, scanner=scanner
        ):
            pass
    assert exits == [ExitUnproven("processes [99999999] survived 2 rounds of SIGKILL")]
