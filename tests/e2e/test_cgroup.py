"""Nothing escapes the session's container (DESIGN.md invariant 10), against a real
daemon in cgroup mode: an agent's great-grandchild that double-forked, called
setsid() and cleared its environment is ended by close, by delete, and by the
recovery of a daemon started after a SIGKILL. Checked by pid and start time."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from agentsd.cgroup import CgroupRoot
from agentsd.procfs import is_same_process, read_start_time
from tests.cgroup_root import cgroup_root, daemons_in_cgroup_mode, unavailable
from tests.daemon_process import running_daemon
from tests.e2e.test_agent_callers import cli
from tests.e2e.test_sessions import (
    SHORT_LADDER,
    CallFailed,
    create,
    history,
    ladder_config,
    open_rpc,
    temp_dir,
)
from tests.polling import eventually

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))

ESCAPEE = {"spawnEscapee": True}
MEMBERS = 2  # the mock agent and its escapee (the intermediate has exited)


@contextlib.contextmanager
def root_and_config(*, holder: bool = True) -> Iterator[tuple[Path, list[str]]]:
    with cgroup_root() as root, ladder_config(*SHORT_LADDER, holder=holder) as config:
        yield root, ["--config", str(config), "--cgroup-root", str(root)]


def members(root: Path) -> list[tuple[int, int]]:
    """(pid, start time) of every process in every session cgroup under ``root``."""
    found = []
    for cgroup in CgroupRoot(root).existing():
        for pid in cgroup.members():
            start = read_start_time(pid)
            if start is not None:
                found.append((pid, start))
    return found


def alive(procs: list[tuple[int, int]]) -> list[int]:
    return [pid for pid, start in procs if is_same_process(pid, start)]


async def test_daemon_status_names_the_cgroup_mode() -> None:
    with (
        trio.fail_after(60),
        root_and_config() as (root, args),
        running_daemon(extra_args=args) as daemon,
    ):
        async with open_rpc(daemon.socket) as rpc:
            status = await rpc.call("daemon.status")
    assert status["containment"]["mode"] == "cgroup-root"
    assert status["containment"]["root"] == str(root)


@pytest.mark.parametrize("verb", ["close", "delete"])
async def test_nothing_escapes_the_session_cgroup_on(verb: str) -> None:
    with (
        trio.fail_after(60),
        temp_dir() as cwd,
        root_and_config() as (root, args),
        running_daemon(extra_args=args) as daemon,
    ):
        async with open_rpc(daemon.socket) as rpc:
            info = await create(rpc, cwd, options=ESCAPEE)
            await eventually(lambda: len(members(root)) == MEMBERS)
            procs = members(root)
            got = await rpc.call("agentSession.get", {"sessionId": info["sessionId"]})
            resources = got["session"]["resources"]
            assert resources["processes"] == MEMBERS
            assert resources["cpuUs"] > 0
            assert resources["cgroup"].startswith(str(root))
            assert resources["memoryBytes"] is None  # no memory controller enabled here
            listed = await rpc.call("agentSession.list", {})
            assert listed["sessions"][0]["resources"]["cgroup"] == resources["cgroup"]
            assert listed["sessions"][0]["resources"]["processes"] == MEMBERS
            shown = await trio.to_thread.run_sync(cli, daemon, "show", info["sessionId"])
            assert f"contained: cgroup {resources['cgroup']} (2 processes, cpu " in shown.stdout
            reply = await rpc.call(f"agentSession.{verb}", {"sessionId": info["sessionId"]})
            assert reply is not None
            assert alive(procs) == []
            assert CgroupRoot(root).existing() == []
            if verb == "close":
                events = await history(rpc, info["sessionId"])
                exited = [e["body"] for e in events if e["kind"] == "child.exited"]
                assert len(exited) == 1
                assert "its cgroup was empty" in exited[0]["detail"]


async def test_nothing_escapes_the_session_cgroup_after_a_sigkilled_daemon() -> None:
    """Without the holder (``holder = false``): the SIGKILL leaves the agents as
    orphans, which the next daemon's recovery ends."""
    with trio.fail_after(90), temp_dir() as base, root_and_config(holder=False) as (root, args):
        state = base / "state"
        with running_daemon(state_dir=state, extra_args=args) as first:
            async with open_rpc(first.socket) as rpc:
                for _ in range(3):
                    await create(rpc, base, options=ESCAPEE)
            await eventually(lambda: len(members(root)) == 3 * MEMBERS)
            procs = members(root)
            first.process.send_signal(signal.SIGKILL)
            assert first.wait() == -signal.SIGKILL
        assert len(alive(procs)) >= 3  # every escapee outlived the daemon
        with running_daemon(state_dir=state, extra_args=args) as second:
            assert alive(procs) == []  # before the daemon answered anything
            assert CgroupRoot(root).existing() == []
            async with open_rpc(second.socket) as rpc:
                recovery = (await rpc.call("daemon.status"))["recovery"]
            assert recovery["sessionsRecovered"] == 3
            assert recovery["orphansEnded"] == 3
            assert recovery["unproven"] == 0


@pytest.mark.parametrize("with_cgroup", [False, True], ids=["no-cgroup", "no-controller"])
async def test_a_limit_that_cannot_be_applied_fails_the_create(with_cgroup: bool) -> None:
    """Here no controller is enabled in the cgroup v2 hierarchy: a pids limit can
    be applied neither without a cgroup nor with one, whether the config's default
    or the session's own, and create says why and stores nothing."""
    with (
        trio.fail_after(60),
        temp_dir() as base,
        cgroup_root() as root,
    ):
        config = base / "config.toml"
        config.write_text("[limits]\npids_max = 64\n")
        args = ["--config", str(config)]
        if with_cgroup:
            args += ["--cgroup-root", str(root)]
        with running_daemon(extra_args=args) as daemon:
            async with open_rpc(daemon.socket) as rpc:
                with pytest.raises(CallFailed) as failed:
                    await create(rpc, base)
                assert (await rpc.call("agentSession.list"))["sessions"] == []
        own = ["--cgroup-root", str(root)] if with_cgroup else []
        with running_daemon(extra_args=own) as daemon:
            async with open_rpc(daemon.socket) as rpc:
                with pytest.raises(CallFailed) as own_failed:
                    await create(rpc, base, memoryMax=256 << 20, cpuMax=0.5)
                assert (await rpc.call("agentSession.list"))["sessions"] == []
                await create(rpc, base)  # without limits, the same daemon creates
    assert failed.value.kind == own_failed.value.kind == "limit_unavailable"
    assert failed.value.data["controllers"] == ["pids"]
    assert own_failed.value.data["controllers"] == ["memory", "cpu"]
    # The second CI pass gives every test daemon a cgroup root.
    in_cgroup = with_cgroup or daemons_in_cgroup_mode()
    for error in (failed.value, own_failed.value):
        assert ("not enabled in" if in_cgroup else "need a cgroup per agent") in str(error)


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("pidsMax", 0, "must be at least 1"),
        ("memoryMax", 1024, "must be at least 16777216"),
        ("cpuMax", 0.001, "must be at least 0.01"),
    ],
)
async def test_a_limit_out_of_range_at_create_is_invalid_params(
    name: str, value: float, problem: str
) -> None:
    with trio.fail_after(60), temp_dir() as base, running_daemon() as daemon:
        async with open_rpc(daemon.socket) as rpc:
            with pytest.raises(CallFailed) as failed:
                await create(rpc, base, **{name: value})
            assert (await rpc.call("agentSession.list"))["sessions"] == []
    assert failed.value.kind == "invalid_params"
    assert failed.value.data["limit"] == name
    assert f"{name} = {value!r}: {problem}" in str(failed.value)


def test_the_cli_gives_limits_at_create_and_says_why_one_cannot_apply() -> None:
    with temp_dir() as base, running_daemon() as daemon:  # each CLI run is bounded
        bad_size = cli(daemon, "new", "mock", "--cwd", str(base), "--memory-max", "12X")
        refused = cli(daemon, "new", "mock", "--cwd", str(base), "--pids-max", "64")
        out_of_range = cli(daemon, "new", "mock", "--cwd", str(base), "--pids-max", "0")
        listed = cli(daemon, "ls", "--json")
    assert bad_size.returncode == 2
    assert "'12X' is not a size" in bad_size.stderr
    assert refused.returncode != 0 and refused.stdout == ""  # no session id: none stored
    assert "limits on pids" in refused.stderr
    assert out_of_range.returncode != 0 and out_of_range.stdout == ""
    assert "pidsMax = 0: must be at least 1" in out_of_range.stderr
    assert json.loads(listed.stdout)["sessions"] == []
