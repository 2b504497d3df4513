"""leftovers: ending a previous daemon's children and everything they started. Every
test runs real processes and leaves none behind."""

from __future__ import annotations

import sys

import attrs
import msgspec
import trio

from agentsd.leftovers import ChildIdentity, EndOutcome, EndReport, end_processes
from agentsd.procfs import SPAWN_TOKEN_ENV, ProcScanner, is_same_process, read_start_time
from tests.daemon import test_child as child_tests
from tests.daemon.test_child import PATIENT, QUICK, MakeToken

# The same process-leak guard as test_child: no test may leave a process behind.
tokens = child_tests.tokens
make_token = child_tests.make_token
no_leftovers = child_tests.no_leftovers


_DETACH = r"""
import os, signal, sys, time
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    if sys.argv[1] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.write(w, b"x")
    while True:
        time.sleep(3600)
os.close(w)
os.read(r, 1)  # the grandchild is set up: setsid, signals, no pipes of ours
print(pid)
"""


async def spawn_detached(token: str, *, stubborn: bool = False) -> ChildIdentity:
    """A process that is not our child: like one a crashed daemon left behind."""
    done = await trio.run_process(
        [sys.executable, "-c", _DETACH, "stubborn" if stubborn else "meek"],
        env={SPAWN_TOKEN_ENV: token},
        capture_stdout=True,
    )
    pid = int(done.stdout)
    start_time = await trio.to_thread.run_sync(read_start_time, pid)
    assert start_time is not None
    return ChildIdentity(pid=pid, pgid=pid, start_time=start_time, token=token)


async def dead_identity(token: str) -> ChildIdentity:
    process = await trio.lowlevel.open_process([sys.executable, "-c", "pass"])
    start_time = await trio.to_thread.run_sync(read_start_time, process.pid)
    assert start_time is not None
    await process.wait()
    return ChildIdentity(pid=process.pid, pgid=process.pid, start_time=start_time, token=token)


async def test_end_processes_ends_a_recorded_detached_process(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        identity = await spawn_detached(make_token())
        report = await end_processes([identity], PATIENT, ProcScanner())
    assert report == EndReport({identity: EndOutcome.ENDED})
    assert (report.ended, report.already_gone, report.unproven) == (1, 0, 0)
    assert not is_same_process(identity.pid, identity.start_time)


async def test_end_processes_escalates_to_sigkill(make_token: MakeToken) -> None:
    ladder = msgspec.structs.replace(PATIENT, term_grace_s=0.3)
    with trio.fail_after(15):
        identity = await spawn_detached(make_token(), stubborn=True)
        started = trio.current_time()
        report = await end_processes([identity], ladder, ProcScanner())
        took = trio.current_time() - started
    assert report.ended == 1
    assert took >= 0.3  # the term grace was waited; the kill wait lies past the hang guard
    assert not is_same_process(identity.pid, identity.start_time)


async def test_end_processes_never_signals_a_pid_whose_start_time_differs(
    make_token: MakeToken,
) -> None:
    with trio.fail_after(15):
        real = await spawn_detached(make_token())
        # Same pid and group, but not the process that was recorded (a recycled
        # pid), and a token nobody carries.
        recycled = attrs.evolve(real, start_time=real.start_time + 1, token=make_token())
        report = await end_processes([recycled], QUICK, ProcScanner())
        assert report.already_gone == 1
        assert is_same_process(real.pid, real.start_time)  # untouched
        assert (await end_processes([real], QUICK, ProcScanner())).ended == 1


async def test_end_processes_finds_token_carriers_after_the_leader_died(
    make_token: MakeToken,
) -> None:
    token = make_token()
    with trio.fail_after(15):
        carrier = await spawn_detached(token)
        gone_leader = await dead_identity(token)
        report = await end_processes([gone_leader], QUICK, ProcScanner())
    assert report.ended == 1
    assert not is_same_process(carrier.pid, carrier.start_time)


async def test_end_processes_reports_what_is_already_gone(make_token: MakeToken) -> None:
    with trio.fail_after(15):
        identity = await dead_identity(make_token())
        assert await end_processes([], QUICK, ProcScanner()) == EndReport({})
        report = await end_processes([identity], QUICK, ProcScanner())
    assert report.outcomes == {identity: EndOutcome.ALREADY_GONE}


async def test_end_processes_finds_an_unconfirmed_spawn_by_its_token_alone(
    make_token: MakeToken,
) -> None:
    token = make_token()
    with trio.fail_after(15):
        carrier = await spawn_detached(token)
        # A lease reserved before the spawn was confirmed has no pid: only a token.
        unconfirmed = ChildIdentity(pid=0, pgid=0, start_time=-1, token=token)
        nothing = ChildIdentity(pid=0, pgid=0, start_time=-1, token=make_token())
        report = await end_processes([unconfirmed, nothing], QUICK, ProcScanner())
    assert report.outcomes == {
        unconfirmed: EndOutcome.ENDED,
        nothing: EndOutcome.ALREADY_GONE,  # group 0 (init, kernel threads) is never "ours"
    }
    assert not is_same_process(carrier.pid, carrier.start_time)
