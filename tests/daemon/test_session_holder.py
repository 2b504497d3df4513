"""Session tasks with the config's ``holder``: the agent is the holder's child, a turn
runs as before, the ladder proves its end, and a killed holder settles its sessions
with nothing left running."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import attrs
import pytest
import trio

from agentsd.procfs import is_same_process, read_proc_info
from agentsd.providers.base import Submission
from agentsd.store.writer import Store
from agentsd_protocol.errors import AgentExited
from tests.daemon.test_session_task import (
    _supervisor,
    assert_contiguous,
    create,
    journal,
    make_config,
    store,
    token_carriers,
)
from tests.polling import eventually

__all__ = ["store"]  # the fixture


async def test_a_turn_runs_through_the_holder_and_the_close_is_proven(
    store: Store, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config(holder=True)) as sup:
            assert sup.holder is not None
            session = await create(sup, tmp_path)
            await sup.start(session)
            link = await sup.holder.link()
            assert session.lease is not None and session.lease.identity is not None
            identity = session.lease.identity
            info = read_proc_info(identity.pid)
            assert info is not None and info.ppid == link.holder_pid != os.getpid()
            task = session.task
            assert task is not None and task.adapter is not None
            await task.adapter.send(Submission(client_message_id="m1", text="echo hello there"))

            async def completed() -> bool:
                return any(k == "turn.completed" for _, k, _ in await journal(store, session.id))

            await eventually(completed)
            assert await sup.close(session)
            assert session.last_exit is not None and session.last_exit.returncode == 0
            assert session.lease is not None and not session.lease.held
            assert not is_same_process(identity.pid, identity.start_time)
            events = await journal(store, session.id)
            assert_contiguous(events)
            texts = [b["text"] for _, k, b in events if k == "item.completed" and b["text"]]
            assert texts == ["hello there"]


async def test_a_stubborn_agent_is_killed_through_the_holder(store: Store, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config(holder=True)) as sup:
            session = await create(sup, tmp_path, ignoreSigterm=True, ignoreEof=True)
            await sup.start(session)
            assert session.lease is not None
            token = session.lease.token
            assert await sup.close(session)
            assert session.last_exit is not None and session.last_exit.signal == 9
            assert token_carriers(token) == []


async def test_an_agent_crash_is_reported_with_its_status(store: Store, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config(holder=True)) as sup:
            session = await create(sup, tmp_path, crashAfterS=0.3)
            await sup.start(session)
            task = session.task
            assert task is not None
            await task.done.wait()
            assert session.last_exit is not None
            assert (session.last_exit.cause, session.last_exit.returncode) == ("unexpected", 3)
            assert session.lease is not None and not session.lease.held


async def test_a_killed_holder_ends_its_agents_and_their_sessions_settle(
    store: Store, tmp_path: Path
) -> None:
    with trio.fail_after(90):
        async with await _supervisor(store, tmp_path, make_config(holder=True)) as sup:
            assert sup.holder is not None
            sessions = [
                await create(sup, tmp_path, spawnGrandchild=True),
                await create(sup, tmp_path, ignoreSigterm=True, ignoreEof=True),
            ]
            for session in sessions:
                await sup.start(session)
            tokens = [s.lease.token for s in sessions if s.lease is not None]
            for token in tokens:
                await eventually(lambda token=token: bool(token_carriers(token)))
            link = await sup.holder.link()
            os.kill(link.holder_pid, signal.SIGKILL)
            for session in sessions:
                task = session.task
                if task is not None:
                    await task.done.wait()
                assert session.phase == "stopped"
                assert session.last_exit is not None
                assert session.last_exit.cause == "unexpected"
                assert session.lease is not None and not session.lease.held
            for token in tokens:
                assert token_carriers(token) == []
            exited = [b for _, k, b in await journal(store, sessions[0].id) if k == "child.exited"]
            assert exited[-1]["detail"] == "found running and ended"
            # A new start gets a new holder.
            sessions[0].row = attrs.evolve(sessions[0].row, options={})
            await sup.start(sessions[0])
            fresh = await sup.holder.link()
            assert fresh.holder_pid != link.holder_pid
            assert sessions[0].info().phase == "running"


async def test_a_held_agents_exit_is_heard_while_a_background_child_holds_its_stdout(
    store: Store, tmp_path: Path
) -> None:
    """A held agent is not in the daemon's agent watch: its exit comes from the
    holder's report. The agent crashes, a process it started keeps its stdout (the
    holder's pipe) open; the session task still learns the exit, ends what it left
    and records the crash as it was."""
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config(holder=True)) as sup:
            session = await create(sup, tmp_path, crashAfterS=0.5, holdPipes=True)
            await sup.start(session)
            task = session.task
            assert task is not None and session.lease is not None
            token = session.lease.token
            await eventually(lambda: len(token_carriers(token)) >= 2)  # agent + its child
            await task.done.wait()
            assert session.last_exit is not None
            assert (session.last_exit.cause, session.last_exit.returncode) == ("unexpected", 3)
            assert session.lease is not None and not session.lease.held
            assert token_carriers(token) == []
            exited = [b for _, k, b in await journal(store, session.id) if k == "child.exited"]
            assert exited == [
                {"cause": "unexpected", "returncode": 3, "detail": "1 stragglers killed"}
            ]


async def test_a_held_agent_exiting_in_its_handshake_fails_the_start_at_once(
    store: Store, tmp_path: Path
) -> None:
    """The same crash during the handshake fails the start with ``agent_exited``
    from the holder's report, not ``handshake_timeout`` (its deadline lies past
    the test's)."""
    with trio.fail_after(60):
        config = make_config(holder=True, handshake_timeout_s=600)
        async with await _supervisor(store, tmp_path, config) as sup:
            session = await create(
                sup, tmp_path, crashAfterS=0.2, holdPipes=True, hangHandshake=True
            )
            with pytest.raises(AgentExited):
                await sup.start(session)
            assert session.last_exit is not None and session.last_exit.returncode == 3
            assert session.lease is not None and token_carriers(session.lease.token) == []
