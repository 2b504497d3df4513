"""A holder lost between its fork of an agent and that fork's exec (``agentsd.held_child``,
a spawn whose answer never came). Until it execs, the fork has the holder's
environment, so no spawn token: a scan for the token finds nothing, and a moment
later it would exec the agent, token and all, with no one left to end it. The
daemon waits until no fork of the lost holder remains (each exec'd, and then
carries the token, or exited), killing what outlasts the ladder's bound, and only
then ends what carries the token.

The fork is held at its exec by ``strace`` (``-e inject=execve:delay_enter=``,
attached to the holder with ``-f``: its forks are traced from their first
instruction), the holder SIGKILLed while it is held. Where strace is missing or may
not attach (no ptrace), the tests skip with the reason; CI installs it (.ci/run)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import attrs
import pytest
import trio

from agentsd import holder_link
from agentsd.cgroup import CgroupRoot
from agentsd.child import ChildSpec, new_spawn_token
from agentsd.config import Ladder
from agentsd.held_child import HeldExit, open_held_child
from agentsd.holder_link import HolderKeeper, HolderLink, HolderLost
from agentsd.leftovers import EndOutcome
from agentsd.procfs import (
    HOLDER_MARK_ENV,
    ProcInfo,
    ProcScanner,
    is_same_process,
    scan_processes,
)
from tests.daemon import test_held_child as held_tests
from tests.daemon.test_child import MOCK_AGENT, QUICK
from tests.polling import eventually
from tests.strace import delayed, release

keeper = held_tests.keeper
tokens = held_tests.tokens
cgroups = held_tests.cgroups

HOLD_S = 600  # how long strace holds a fork at its exec: for ever, as far as a test goes
# The fork never execs within this ladder's bound: it is killed after 0.2 s.
SHORT = Ladder(eof_grace_s=0.2, term_grace_s=0.2, kill_wait_s=5.0)
WAIT_S = 30.0  # for what another process does, on a loaded machine


def held_at_exec(pid: int) -> contextlib.AbstractContextManager[subprocess.Popen[str]]:
    """Every process ``pid`` forks from now on stops at its execve, for ``HOLD_S``;
    yields the tracer: ending it (`release`) lets the execve run at once."""
    return delayed(pid, "execve", HOLD_S, "it is what holds the holder's fork at its exec")


def _fork_of(holder_pid: int) -> ProcInfo | None:
    forks = [p for p in scan_processes().processes.values() if p.ppid == holder_pid]
    return forks[0] if len(forks) == 1 else None


def _carries(token: str, proc: ProcInfo) -> bool:
    return any(p.pid == proc.pid for p in scan_processes([token]).carrying(token))


def _killed(proc: ProcInfo) -> bool:
    """Whether ``proc`` is gone or has a SIGKILL pending (its own or its group's)."""
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            pending = [int(line.split()[1], 16) for line in f if line[:6] in ("SigPnd", "ShdPnd")]
    except OSError:
        return True
    return not is_same_process(proc.pid, proc.start_time) or any(
        mask & 1 << (signal.SIGKILL - 1) for mask in pending
    )


def _kill(proc: ProcInfo) -> None:
    with contextlib.suppress(ProcessLookupError):
        fd = os.pidfd_open(proc.pid)
        try:
            if is_same_process(proc.pid, proc.start_time):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        finally:
            os.close(fd)


async def _lose_the_holder_before_the_exec(
    link: HolderLink,
    agent: ChildSpec,
    ladder: Ladder,
    *,
    execs: bool,
) -> tuple[list[HeldExit], ProcInfo]:
    """Spawn ``agent`` on ``link`` and SIGKILL the holder while its fork waits at
    its exec; the outcome reported, and the fork.

    ``execs``: the fork is let go once the daemon scanned /proc after the loss, and
    execs the agent. Otherwise it is let go only once it was sent SIGKILL: a process
    strace holds dies only once strace lets it go (it stays stopped meanwhile, the
    SIGKILL pending), where a fork no one traces dies at once."""
    exits: list[HeldExit] = []
    scanner = ProcScanner()
    fork: ProcInfo | None = None

    with held_at_exec(link.holder_pid) as tracer:
        try:
            async with trio.open_nursery() as nursery:

                async def spawn() -> None:
                    with pytest.raises(HolderLost):
                        async with open_held_child(
                            agent,
                            ladder,
                            held_tests.ignore_identity,
                            exits.append,
                            link,
                            scanner=scanner,
                        ):
                            raise AssertionError("the body never runs: the holder is gone")

                nursery.start_soon(spawn)
                await eventually(lambda: _fork_of(link.holder_pid) is not None, timeout_s=WAIT_S)
                fork = _fork_of(link.holder_pid)
                assert fork is not None
                # The window: the holder's environment, no token.
                assert not _carries(agent.token, fork)
                scans = scanner.scans_completed
                os.kill(link.holder_pid, signal.SIGKILL)
                if execs:
                    await eventually(
                        lambda: (
                            bool(exits) or (link.lost.is_set() and scanner.scans_completed > scans)
                        ),
                        timeout_s=WAIT_S,
                    )
                else:
                    await eventually(lambda: bool(exits) or _killed(fork), timeout_s=WAIT_S)
                release(tracer)
        finally:
            if fork is not None:
                if exits:  # what the daemon left of the fork runs on now: the leak
                    await eventually(
                        lambda: (
                            not is_same_process(fork.pid, fork.start_time)
                            or _carries(agent.token, fork)
                        ),
                        timeout_s=WAIT_S,
                    )
                leaked = is_same_process(fork.pid, fork.start_time)
                _kill(fork)
    assert fork is not None
    assert not leaked, "the fork ran on after the outcome was reported"
    return exits, fork


@pytest.mark.parametrize("execs", [True, False], ids=["execs-meanwhile", "never-execs"])
async def test_a_holder_lost_before_its_fork_execd_the_agent_leaves_no_agent(
    keeper: HolderKeeper, tokens: list[str], execs: bool
) -> None:
    """The fork execs while the daemon waits (it is then the agent, carrying its
    token, and ended by it), or not within the ladder's bound (it is killed before
    it could): either way nothing of the spawn runs once the outcome is reported,
    and the outcome says something was ended. The agent ignores the EOF of the lost
    holder's pipes: one that exits on it can be gone before the daemon's scan finds
    it (a slow scan of a crowded /proc), and is then rightly reported gone."""
    link = await keeper.link()
    agent = held_tests.spec(tokens, {"ignoreEof": True})
    with trio.fail_after(60):
        exits, fork = await _lose_the_holder_before_the_exec(
            link, agent, QUICK if execs else SHORT, execs=execs
        )
    assert exits == [EndOutcome.ENDED]
    assert not is_same_process(fork.pid, fork.start_time)
    assert scan_processes([agent.token]).carrying(agent.token) == []


@pytest.mark.parametrize("clones", [True, False], ids=["cloned", "shim"])
async def test_a_holder_lost_before_its_fork_execd_an_agent_in_a_cgroup_leaves_no_agent(
    keeper: HolderKeeper,
    tokens: list[str],
    cgroups: CgroupRoot,
    clones: bool,
) -> None:
    """The same in cgroup mode: a clone is born in the agent's cgroup (its end ends
    the fork too); the shim's fork (a holder of an earlier release, or one that
    clone3 is refused to) joins it only after its exec. Neither is left running, and
    the cgroup is removed."""
    link = await keeper.link()
    assert link.clones_into_cgroups
    link.clones_into_cgroups = clones
    token = new_spawn_token()
    tokens.append(token)
    agent = ChildSpec(
        argv=MOCK_AGENT, cwd="/", env={}, token=token, cgroup_root=cgroups, base_env=os.environ
    )
    with trio.fail_after(60):
        exits, fork = await _lose_the_holder_before_the_exec(link, agent, SHORT, execs=False)
    assert exits == [EndOutcome.ENDED]
    assert not is_same_process(fork.pid, fork.start_time)
    assert scan_processes([token]).carrying(token) == []
    assert not cgroups.for_token(token).path.exists()


async def test_the_holder_carries_its_mark_and_no_agent_does(
    keeper: HolderKeeper, tokens: list[str]
) -> None:
    """The mark the link knows is in the holder's environment; an agent never
    carries it, not even one whose spawn names it (the holder drops it): what the
    daemon waits for after a loss is the holder's forks, never its agents."""
    link = await keeper.link()
    mark = link.mark
    assert mark is not None and holder_link.is_mark(mark)
    agent = held_tests.spec(tokens)
    agent = attrs.evolve(agent, env={**agent.env, HOLDER_MARK_ENV: mark})
    with trio.fail_after(20):
        async with open_held_child(
            agent, QUICK, held_tests.ignore_identity, lambda _: None, link
        ) as child:
            await held_tests.Lines(child).handshake()
            table = scan_processes([agent.token], [mark])
            assert [p.pid for p in table.marked(mark)] == [link.holder_pid]
            assert [p.pid for p in table.carrying(agent.token)] == [child.identity.pid]


@pytest.mark.parametrize("value", ["", "0" * 31, "0" * 33, "G" * 32, "A" * 32, 7, None])
def test_only_a_mark_as_the_daemon_makes_them_is_taken(value: object) -> None:
    assert holder_link.is_mark(holder_link.new_mark())
    assert holder_link.new_mark() != holder_link.new_mark()
    assert not holder_link.is_mark(value)


async def test_a_process_that_copied_the_mark_bounds_the_wait_and_is_ended(
    keeper: HolderKeeper, tokens: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant 9: an agent can read the holder's mark and run a process of its own
    with it. Once the holder is lost with a spawn unconfirmed, that process is
    waited for no longer than the ladder's bound, then killed like a fork that never
    exec'd; the outcome is reported and nothing of the spawn runs."""
    link = await keeper.link()
    assert link.mark is not None
    copier = await trio.lowlevel.open_process(
        [sys.executable, "-c", "import time; time.sleep(3600)"],
        env={HOLDER_MARK_ENV: link.mark},
        start_new_session=True,
    )
    held_tests.kill_holder_after_spawn(monkeypatch)
    agent = held_tests.spec(tokens)
    exits: list[HeldExit] = []
    try:
        with trio.fail_after(60), pytest.raises(HolderLost):
            async with open_held_child(
                agent, SHORT, held_tests.ignore_identity, exits.append, link
            ):
                raise AssertionError("the body never runs: the holder is gone")
        assert exits == [EndOutcome.ENDED]
        with trio.fail_after(WAIT_S):
            assert await copier.wait() == -signal.SIGKILL
        assert scan_processes([agent.token]).carrying(agent.token) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            copier.kill()
        await copier.wait()
