"""Each running agent's figures (issue 17 item 5) in ``get``, ``list``, ``agentsctl
show`` and ``ls --json``, and in the status feed, in both containment modes: from
the session cgroup's own files, or from ``/proc`` for the agent's process group."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from tests.cgroup_root import cgroup_root, unavailable
from tests.daemon_process import DaemonProcess, running_daemon
from tests.e2e.test_agent_callers import cli
from tests.e2e.test_sessions import create, open_rpc, temp_dir

FEED_TIMEOUT_S = 60.0  # the sampler's first sample comes within seconds


@contextlib.contextmanager
def daemon_in(mode: str) -> Iterator[DaemonProcess]:
    if mode == "process-group":
        with running_daemon() as daemon:
            yield daemon
        return
    if unavailable() is not None:
        pytest.skip(str(unavailable()))
    with cgroup_root() as root, running_daemon(extra_args=["--cgroup-root", str(root)]) as daemon:
        yield daemon


def _check(resources: dict[str, Any], mode: str, pid: int) -> None:
    assert resources["processes"] >= 1
    assert isinstance(resources["cpuUs"], int) and resources["cpuUs"] >= 0
    assert resources["memoryBytes"] is None  # no memory controller here; none in the fallback
    if mode == "process-group":
        assert (resources["processGroup"], resources["cgroup"]) == (pid, None)
    else:
        assert resources["processGroup"] is None
        assert resources["cgroup"].rpartition("/")[2].startswith("agent-")


@pytest.mark.parametrize("mode", ["process-group", "cgroup"])
async def test_a_running_agent_reports_its_figures(mode: str) -> None:
    with trio.fail_after(90), temp_dir() as cwd, daemon_in(mode) as daemon:
        async with open_rpc(daemon.socket) as rpc, open_rpc(daemon.socket) as watcher:
            # Under the CI's cgroup pass every daemon has a cgroup root: check what runs.
            mode = (await rpc.call("daemon.status"))["containment"]["mode"]
            mode = "process-group" if mode == "process-group" else "cgroup"
            await watcher.call("agentSession.watch", {})
            info = await create(rpc, cwd)
            sid, pid = info["sessionId"], info["child"]["pid"]
            got = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
            _check(got["resources"], mode, pid)
            listed = json.loads((await trio.to_thread.run_sync(cli, daemon, "ls", "--json")).stdout)
            [row] = listed["sessions"]
            _check(row["resources"], mode, pid)
            shown = (await trio.to_thread.run_sync(cli, daemon, "show", sid)).stdout
            where = "process group and spawn token" if mode == "process-group" else "cgroup /"
            assert f"contained: {where}" in shown and " processes, cpu " in shown
            # The status feed: a sample reaches the watcher without anyone asking.
            with trio.fail_after(FEED_TIMEOUT_S):
                index = await watcher.wait_note(
                    lambda m, p: (
                        m == "agentSession.status"
                        and p["session"]["sessionId"] == sid
                        and p["session"].get("resources") is not None
                    )
                )
            _check(watcher.notes[index][1]["session"]["resources"], mode, pid)
            await rpc.call("agentSession.close", {"sessionId": sid})
            got = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
            assert got["resources"] is None  # nothing runs: no figures
