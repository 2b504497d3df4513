"""The shipped units under a real systemd user manager (``tests.systemd_user``).

``systemd/agentsd.socket`` and ``agentsd.service`` are installed as they are, with
``%h/.local/bin/agentsd`` leading to this checkout's daemon, and the service is
started by its socket. With ``holder = true`` the agents must outlive what systemd
does to the service: a crash of its main process (``KillMode=mixed`` then SIGKILLs
everything left in the service's cgroup, and ``Restart=on-failure`` starts it
again) and a reload (``ExecReload=``: a restart in place). They can only because
the holder and their cgroups live in a scope of their own (``agentsd.holder_scope``);
a stop of the service still ends them all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from agentsd.cgroup import own_cgroup
from tests.cgroup_root import PARENT
from tests.e2e.test_reattach import REPLY, SLOW, ItemFollower, _agent_alive
from tests.e2e.test_sessions import assert_contiguous, create, history, open_rpc, temp_dir
from tests.systemd_user import UserManager, unavailable, user_manager

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=f"{unavailable()}")

TIMEOUT_S = 180.0
UNITS = Path(__file__).resolve().parents[2] / "systemd"
CONFIG = (
    "holder = true\n"
    'agent_env = "inherit"\n'
    "[ladder]\neof_grace_s = 0.5\nterm_grace_s = 0.5\nkill_wait_s = 2.0\n"
)
CRASH_AFTER_DELTAS = 5


@contextlib.contextmanager
def installed(
    manager: UserManager, config_text: str = CONFIG, drop_in: str | None = None
) -> Iterator[Path]:
    """The socket and service units, the daemon and the config installed as
    ``make install-user-service`` would (and ``drop_in`` as a user's
    ``systemctl --user edit``), the socket started; its path."""
    manager.unit_dir.mkdir(parents=True)
    for name in ("agentsd.socket", "agentsd.service"):
        shutil.copy(UNITS / name, manager.unit_dir / name)
    if drop_in is not None:
        (manager.unit_dir / "agentsd.service.d").mkdir()
        (manager.unit_dir / "agentsd.service.d" / "override.conf").write_text(drop_in)
    bin_dir = manager.home / ".local" / "bin"
    bin_dir.mkdir(parents=True)
    for program in ("agentsd", "agentsctl"):
        (bin_dir / program).symlink_to(Path(sys.executable).parent / program)
    config = manager.home / ".config" / "agentsd" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(config_text)
    manager.systemctl("daemon-reload")
    manager.systemctl("start", "agentsd.socket")
    try:
        yield manager.runtime_dir / "agentsd" / "agentsd.sock"
    finally:
        manager.systemctl("stop", "agentsd.service", "agentsd.socket", check=False)


def _cgroup(pid: int) -> Path:
    where = own_cgroup(Path(f"/proc/{pid}/cgroup"))
    assert where is not None
    return where


def _main_pid(manager: UserManager) -> int:
    return int(manager.show("agentsd.service", "MainPID"))


def _notes_of(notes: list[tuple[str, dict[str, Any]]], method: str) -> list[dict[str, Any]]:
    return [p for m, p in notes if m == method]


async def _escaped_call(
    manager: UserManager, scope: Path, *args: str
) -> subprocess.CompletedProcess[bytes]:
    """``agentsctl ARGS`` from a process that moved itself into the holder's scope,
    out of any agent's cgroup, before it connects (as an agent's process could)."""
    escaped = scope / "escaped-caller"
    escaped.mkdir()
    command = 'read go && exec "$0" --no-start "$@"'
    agentsctl = str(Path(sys.executable).parent / "agentsctl")
    process = await trio.lowlevel.open_process(
        ["sh", "-c", command, agentsctl, *args],
        env=dict(manager.env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    (escaped / "cgroup.procs").write_text(str(process.pid))
    assert process.stdin is not None and process.stdout is not None
    assert process.stderr is not None
    await process.stdin.send_all(b"go\n")
    await process.stdin.aclose()
    out = err = b""
    async with trio.open_nursery() as nursery:

        async def drain(stream: trio.abc.ReceiveStream, into: list[bytes]) -> None:
            async for chunk in stream:
                into.append(bytes(chunk))

        outs: list[bytes] = []
        errs: list[bytes] = []
        nursery.start_soon(drain, process.stdout, outs)
        nursery.start_soon(drain, process.stderr, errs)
    out, err = b"".join(outs), b"".join(errs)
    return subprocess.CompletedProcess(args, await process.wait(), out, err)


async def _run(manager: UserManager, *args: str) -> None:
    await trio.to_thread.run_sync(lambda: manager.systemctl(*args))


async def test_under_systemd_agents_outlive_a_crash_and_a_reload_of_the_service() -> None:
    with (
        trio.fail_after(TIMEOUT_S),
        temp_dir() as home,
        user_manager(home) as manager,
        installed(manager) as socket,
    ):
        async with open_rpc(socket) as rpc, open_rpc(socket) as watcher:
            sid = (await create(rpc, home, options=SLOW))["sessionId"]
            await watcher.call("agentSession.subscribe", {"sessionId": sid, "afterSeq": 0})
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "tell me"})
            info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
            pid, fence = info["child"]["pid"], info["fence"]
            status = await rpc.call("daemon.status")

            # Where each lives: the daemon in its service, the agent in the holder's
            # scope, beside the service in its slice, not under it.
            daemon_pid = _main_pid(manager)
            service = PARENT / manager.show("agentsd.service", "ControlGroup").lstrip("/")
            assert _cgroup(daemon_pid) == service / "daemon"
            agent = _cgroup(pid)
            scope = agent.parent
            assert agent.name.startswith("agent-"), agent
            assert scope.name.startswith("agentsd-holder-") and scope.name.endswith(".scope")
            assert scope.parent == service.parent
            assert manager.show(scope.name, "ActiveState") == "active"
            assert manager.show(scope.name, "Delegate") == "yes"
            [holder_pid] = map(int, (scope / "holder" / "cgroup.procs").read_text().split())
            containment = status["containment"]
            assert containment["mode"] == "systemd-delegated", containment
            assert containment["root"] == str(scope), containment
            await watcher.wait_note(
                lambda m, p: (
                    len(_notes_of(watcher.notes, "agentSession.delta")) >= CRASH_AFTER_DELTAS
                )
            )
            before = list(watcher.notes)

        # The daemon dies: systemd SIGKILLs what is left of the service's cgroup and
        # starts it again (Restart=on-failure); the agent is not in that cgroup.
        await _run(manager, "kill", "--signal=SIGKILL", "--kill-whom=main", "agentsd.service")
        await trio.to_thread.run_sync(
            lambda: manager.wait_for(
                "the service started again",
                lambda: (
                    manager.show("agentsd.service", "ActiveState") == "active"
                    and _main_pid(manager) not in (0, daemon_pid)
                ),
            )
        )
        assert _agent_alive(pid)
        assert _cgroup(holder_pid) == scope / "holder"  # the same holder
        seen = [p["seq"] for p in _notes_of(before, "agentSession.event")]
        last_seq = seen[-1]
        [item_id] = {p["itemId"] for p in _notes_of(before, "agentSession.delta")}

        async with open_rpc(socket) as rpc, open_rpc(socket) as watcher:
            recovery = (await rpc.call("daemon.status"))["recovery"]
            assert recovery["reattached"] == 1 and recovery["lost"] == 0, recovery
            info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
            assert info["child"]["pid"] == pid and info["fence"] == fence + 1
            await watcher.call("agentSession.subscribe", {"sessionId": sid, "afterSeq": last_seq})
            await watcher.wait_note(
                lambda m, p: m == "agentSession.event" and p["event"]["kind"] == "turn.completed"
            )
            after = list(watcher.notes)
            follower = ItemFollower(item_id)
            follower.feed(before)
            follower.feed(after)
            assert follower.text == REPLY and follower.gaps == []

            # A reload restarts the daemon in place (same main pid) mid-turn: the
            # agent is handed over and goes on.
            restarted_pid = _main_pid(manager)
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "tell me again"})
            await watcher.wait_note(
                lambda m, p: (
                    len(_notes_of(watcher.notes, "agentSession.delta"))
                    >= len(_notes_of(after, "agentSession.delta")) + CRASH_AFTER_DELTAS
                )
            )
        await _run(manager, "reload", "agentsd.service")
        assert _main_pid(manager) == restarted_pid
        async with open_rpc(socket) as rpc, open_rpc(socket) as watcher:
            info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
            assert info["child"]["pid"] == pid and info["fence"] == fence + 2
            await watcher.call("agentSession.subscribe", {"sessionId": sid, "afterSeq": 0})
            await watcher.wait_note(
                lambda m, p: (
                    sum(
                        e["event"]["kind"] == "turn.completed"
                        for e in _notes_of(watcher.notes, "agentSession.event")
                    )
                    == 2
                )
            )
            journal = await history(rpc, sid)
        assert_contiguous(journal)
        kinds = [e["kind"] for e in journal]
        assert kinds.count("child.spawned") == 1 and kinds.count("child.reattached") == 2
        assert [e["body"]["outcome"] for e in journal if e["kind"] == "turn.completed"] == [
            "completed",
            "completed",
        ]

        # A stop ends every agent, the holder and its scope with them.
        await _run(manager, "stop", "agentsd.service", "agentsd.socket")
        assert not _agent_alive(pid)
        await trio.to_thread.run_sync(
            lambda: manager.wait_for(
                "the holder's scope gone",
                lambda: manager.show(scope.name, "ActiveState") in ("inactive", "failed", ""),
            )
        )
        assert not _agent_alive(holder_pid)


async def test_under_systemd_a_holder_killed_takes_its_agents_and_the_next_starts_in_its_scope() -> (
    None
):
    """The holder dies alone (SIGKILL): its agent is ended and proven gone and the
    session settles. A process that had moved itself out of its agent's cgroup into
    the scope (any process of the user may) is refused what agents are refused, and
    keeps the dead holder's scope loaded: the next holder's start kills it first,
    and starts in a scope of the same name."""
    with (
        trio.fail_after(TIMEOUT_S),
        temp_dir() as home,
        user_manager(home) as manager,
        installed(manager) as socket,
    ):
        async with open_rpc(socket) as rpc:
            sid = (await create(rpc, home, options=SLOW))["sessionId"]
            await rpc.call("agentSession.subscribe", {"sessionId": sid, "afterSeq": 0})
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "tell me"})
            pid = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]["child"][
                "pid"
            ]
            scope = _cgroup(pid).parent
            [holder_pid] = map(int, (scope / "holder" / "cgroup.procs").read_text().split())
            escaped = await trio.lowlevel.open_process(["sleep", "600"])
            try:
                (scope / "escaped").mkdir()
                (scope / "escaped" / "cgroup.procs").write_text(str(escaped.pid))
                os.kill(holder_pid, signal.SIGKILL)
                await rpc.wait_note(
                    lambda m, p: m == "agentSession.event" and p["event"]["kind"] == "child.exited"
                )
                assert not _agent_alive(pid)
                info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
                assert info["child"] is None, info
                assert escaped.poll() is None  # nothing ended it yet: the scope is loaded
                refused = await _escaped_call(manager, scope, "daemon", "restart")
                assert refused.returncode == 1, refused
                assert b"[forbidden_for_agents]" in refused.stderr, refused

                # The next agent gets a new holder, in a scope of the same name: where
                # the daemon's containment makes the agents' cgroups.
                again = (await create(rpc, home))["sessionId"]
                await rpc.call("agentSession.send", {"sessionId": again, "text": "hello"})
                new_pid = (await rpc.call("agentSession.get", {"sessionId": again}))["session"][
                    "child"
                ]["pid"]
                assert _cgroup(new_pid).parent == scope
                [new_holder] = map(int, (scope / "holder" / "cgroup.procs").read_text().split())
                assert new_holder != holder_pid
                assert manager.show(scope.name, "ActiveState") == "active"
                assert await escaped.wait() == -signal.SIGKILL
            finally:
                with contextlib.suppress(ProcessLookupError):
                    escaped.kill()
                await escaped.wait()


async def test_under_systemd_a_stop_that_outlasts_its_timeout_still_ends_every_agent() -> None:
    """The ladder outlasts ``TimeoutStopSec=`` (an agent that ignores end of input,
    a 20 s grace): systemd SIGKILLs the service's cgroup, which the agents are not
    in; ``ExecStopPost=`` ends what is left in the holder's scope."""
    slow_ladder = CONFIG.replace("eof_grace_s = 0.5", "eof_grace_s = 20")
    with (
        trio.fail_after(TIMEOUT_S),
        temp_dir() as home,
        user_manager(home) as manager,
        installed(manager, slow_ladder, "[Service]\nTimeoutStopSec=3s\n") as socket,
    ):
        async with open_rpc(socket) as rpc:
            sid = (await create(rpc, home, options={"ignoreEof": True}))["sessionId"]
            pid = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]["child"][
                "pid"
            ]
            scope = _cgroup(pid).parent
            [holder_pid] = map(int, (scope / "holder" / "cgroup.procs").read_text().split())
        await _run(manager, "stop", "agentsd.service")
        assert manager.show("agentsd.service", "Result") == "timeout"
        assert not _agent_alive(pid) and not _agent_alive(holder_pid)
        await trio.to_thread.run_sync(
            lambda: manager.wait_for(
                "the holder's scope gone",
                lambda: manager.show(scope.name, "ActiveState") in ("inactive", "failed", ""),
            )
        )
