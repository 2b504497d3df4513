"""A real daemon with the config's ``holder = true``: agents are the holder's
children and outlive a SIGKILLed daemon with their pipes open. Under
``crash_policy = "end"`` the next daemon's recovery ends them as it ends any
previous daemon's (``test_reattach`` has the default, ``reattach``); the holder
leaves once nothing is held and no daemon is attached."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from agentsd.holder_link import socket_path
from agentsd.procfs import read_proc_info
from tests.cgroup_root import cgroup_root, daemons_in_cgroup_mode, unavailable
from tests.daemon_process import no_holder_config, running_daemon
from tests.e2e.test_recovery import KINDS
from tests.e2e.test_sessions import (
    DATABASE_NAME,
    SHORT_LADDER,
    assert_contiguous,
    create,
    db_rows,
    history,
    kill_carriers,
    open_rpc,
    temp_dir,
    token_carriers,
)
from tests.polling import eventually

SESSIONS = 8


@contextmanager
def holder_config(crash_policy: str = "end") -> Iterator[Path]:
    with temp_dir() as base:
        path = base / "config.toml"
        eof, term, kill = SHORT_LADDER
        path.write_text(
            f'holder = true\ncrash_policy = "{crash_policy}"\n'
            f"[ladder]\neof_grace_s = {eof}\nterm_grace_s = {term}\nkill_wait_s = {kill}\n"
        )
        yield path


def _cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def _ended(pid: int) -> bool:
    info = read_proc_info(pid)
    return info is None or info.is_zombie


@contextmanager
def containment(mode: str) -> Iterator[list[str]]:
    """The daemons' extra arguments for ``mode``: one cgroup root shared by both
    daemons of a test (each ``running_daemon`` would otherwise make its own, and
    kill what is in it when it ends). The cgroup pass (``AGENTSD_TEST_CGROUP=1``)
    runs every daemon in cgroup mode: there both modes share one root."""
    if mode == "process-group" and not daemons_in_cgroup_mode():
        yield []
        return
    if unavailable() is not None:
        pytest.skip(str(unavailable()))
    with cgroup_root() as root:
        yield ["--cgroup-root", str(root)]


@pytest.mark.parametrize("mode", ["process-group", "cgroup"])
async def test_held_agents_outlive_a_sigkilled_daemon_and_crash_policy_end_ends_them(
    mode: str,
) -> None:
    tokens: list[str] = []
    with (
        trio.fail_after(120),
        temp_dir() as base,
        holder_config() as config,
        containment(mode) as extra,
    ):
        state = base / "state"
        args = ["--config", str(config), *extra]
        db = state / DATABASE_NAME
        try:
            with running_daemon(state_dir=state, extra_args=args) as first:
                async with open_rpc(first.socket) as rpc:
                    sids = [
                        (await create(rpc, base, options=KINDS[i % len(KINDS)]))["sessionId"]
                        for i in range(SESSIONS)
                    ]
                    pids = []
                    for sid in sids:
                        info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
                        pids.append(info["child"]["pid"])
                tokens = [r[0] for r in db_rows(db, "SELECT token FROM leases")]
                grandchildren = SESSIONS // len(KINDS)
                await eventually(lambda: len(token_carriers(tokens)) == SESSIONS + grandchildren)
                parents = set()
                for pid in pids:
                    info = read_proc_info(pid)
                    assert info is not None
                    parents.add(info.ppid)
                [holder_pid] = parents
                if mode == "cgroup":  # each joined its own cgroup before it ran
                    for pid in pids:
                        assert "/agent-" in _cgroup_of(pid)
                assert holder_pid != first.process.pid
                first.process.send_signal(signal.SIGKILL)
                assert first.wait() == -signal.SIGKILL
            # Every agent still runs, the one that ends on stdin EOF included: the
            # holder keeps their pipes.
            assert len(token_carriers(tokens)) == SESSIONS + grandchildren
            assert socket_path(state).exists()

            with running_daemon(state_dir=state, extra_args=args) as second:
                assert token_carriers(tokens) == []  # before the daemon answered anything
                async with open_rpc(second.socket) as rpc:
                    recovery = (await rpc.call("daemon.status"))["recovery"]
                    assert recovery["sessionsRecovered"] == SESSIONS
                    assert recovery["unproven"] == 0
                    assert recovery["reattached"] == 0  # crash_policy "end"
                    for sid in sids:
                        events = await history(rpc, sid)
                        assert_contiguous(events)
                        [exited] = [e for e in events if e["kind"] == "child.exited"]
                        assert exited["body"]["cause"] == "daemon-restart"
                    # A new start runs through the holder again.
                    started = await rpc.call("agentSession.start", {"sessionId": sids[0]})
                    child = started["session"]["child"]
                    info = read_proc_info(child["pid"])
                    assert info is not None and info.ppid == holder_pid
                    await rpc.call("agentSession.close", {"sessionId": sids[0]})
            # Nothing held and no daemon attached: the holder left.
            await eventually(lambda: _ended(holder_pid))
        finally:
            kill_carriers(tokens)


async def test_a_holder_left_by_an_earlier_config_is_dismissed_once_its_agents_are_ended() -> None:
    """``holder = true``, a SIGKILLed daemon, then a daemon with ``holder = false``:
    recovery ends the agent the holder kept, and the holder, attached meanwhile,
    forgets it and leaves rather than keep its exit status (and itself) for ever."""
    with trio.fail_after(120), temp_dir() as base, holder_config() as config:
        state = base / "state"
        tokens: list[str] = []
        try:
            with running_daemon(state_dir=state, extra_args=["--config", str(config)]) as first:
                async with open_rpc(first.socket) as rpc:
                    sid = (await create(rpc, base))["sessionId"]
                    pid = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"][
                        "child"
                    ]["pid"]
                info = read_proc_info(pid)
                assert info is not None
                holder_pid = info.ppid
                tokens = [r[0] for r in db_rows(state / DATABASE_NAME, "SELECT token FROM leases")]
                first.process.send_signal(signal.SIGKILL)
                first.wait()
            assert not _ended(pid) and not _ended(holder_pid)
            with (
                no_holder_config() as no_holder,
                running_daemon(state_dir=state, extra_args=no_holder) as second,
            ):
                async with open_rpc(second.socket) as rpc:
                    recovery = (await rpc.call("daemon.status"))["recovery"]
                    assert recovery["sessionsRecovered"] == 1, recovery
                assert _ended(pid)
                await eventually(lambda: _ended(holder_pid))
        finally:
            kill_carriers(tokens)
