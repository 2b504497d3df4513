"""A handover (``agentsd.session_task`` Rule 2): a planned restart whose agents the holder
keeps stops each session's reader between two frames, journals the streamed text,
and leaves the agent running with its lease held: no close ladder, no settle, the
holder link detached rather than closed."""

from __future__ import annotations

import os
import signal
from contextlib import suppress
from pathlib import Path

import pytest
import trio
import trio.testing

from agentsd.procfs import is_same_process, read_proc_info
from agentsd.providers.base import LineLink, Submission
from agentsd.providers.mock import MockAdapter
from agentsd.sink import Sink
from agentsd.store import leases as lease_rows
from agentsd.store.writer import Store
from agentsd_protocol.errors import AgentExited
from tests.daemon.test_session_task import (
    _supervisor,
    assert_contiguous,
    create,
    journal,
    make_config,
    store,
)
from tests.polling import eventually

__all__ = ["store"]  # the fixture

TEST_TIMEOUT_S = 60.0  # real agents and a real holder on a loaded machine: not a claim


def _link() -> tuple[LineLink, trio.testing.MemorySendStream, trio.abc.SendStream]:
    to_agent = trio.testing.memory_stream_one_way_pair()
    from_agent = trio.testing.memory_stream_one_way_pair()
    return LineLink(to_agent[0], from_agent[1]), to_agent[0], from_agent[0]


async def test_a_reader_handling_a_frame_stops_only_after_it_and_takes_no_further_line() -> None:
    with trio.fail_after(10):
        link, _, agent = _link()
        handled: list[bytes] = []
        in_frame = trio.Event()
        release = trio.Event()
        stopped = trio.Event()
        # Two whole frames and half of a third arrive in one read.
        await agent.send_all(b'{"n":1}\n{"n":2}\n{"n":')

        async def reader(reading: trio.CancelScope) -> None:
            with reading:
                while (line := await link.receive_line()) is not None:
                    handled.append(line)
                    in_frame.set()
                    await release.wait()  # handling the frame: a commit, say
            stopped.set()

        reading = trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader, reading)
            await in_frame.wait()
            calls: list[str] = []

            def stop() -> None:
                calls.append("stop")
                reading.cancel()

            link.stop_at_boundary(stop)
            await trio.testing.wait_all_tasks_blocked()
            assert calls == [] and not stopped.is_set()  # never in the middle of a frame
            release.set()
            await stopped.wait()
        assert calls == ["stop"]
        assert handled == [b'{"n":1}']  # the frame already in memory was not taken
        assert reading.cancelled_caught


async def test_a_reader_waiting_for_bytes_stops_at_once() -> None:
    with trio.fail_after(10):
        link, _, agent = _link()
        await agent.send_all(b'{"n":1}\n{"partial":')
        assert await link.receive_line() == b'{"n":1}'
        reading = trio.CancelScope()
        taken: list[bytes | None] = []

        async def reader() -> None:
            with reading:
                taken.append(await link.receive_line())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()  # parked in a read
            link.stop_at_boundary(reading.cancel)
        assert taken == [] and reading.cancelled_caught


async def test_a_handover_leaves_a_streaming_agent_running_with_its_lease_held(
    store: Store, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with await _supervisor(store, tmp_path, make_config(holder=True)) as sup:
            assert sup.holder is not None
            session = await create(sup, tmp_path, chunks=2000, chunkDelayS=0.005)
            await sup.start(session)
            link = await sup.holder.link()
            lease = session.lease
            assert lease is not None and lease.identity is not None
            pid, start_time = lease.identity.pid, lease.identity.start_time
            task = session.task
            assert task is not None and task.adapter is not None
            await task.adapter.send(Submission(client_message_id="m1", text="stream on"))

            assert isinstance(task.adapter, MockAdapter)
            sink = task.adapter._sink
            assert isinstance(sink, Sink)
            before = len(await journal(store, session.id))
            # Streamed text the sink holds unjournaled, so only the handover's own
            # flush (or a snapshot taken after ``before``) can journal it.
            await eventually(lambda: bool(sink._dirty))
            assert await sup.hand_over_all() == 1
            assert task.done.is_set() and task.handed_over and session.task is None
            events = await journal(store, session.id)
            assert_contiguous(events)
            kinds = [k for _, k, _ in events]
            # Nothing ended: no exit, no settled turn; the streamed text was journaled.
            assert not {"child.exited", "exit.unproven", "turn.completed"} & set(kinds), kinds
            assert "item.updated" in kinds[before:], kinds[before:]
            assert not sink._dirty  # nothing the reader took is left unjournaled
            held = await store.read(lambda conn: lease_rows.latest_lease(conn, session.id))
            assert held is not None and held.held and held.fence == lease.fence
            assert is_same_process(pid, start_time)
            info = read_proc_info(pid)
            assert info is not None and info.ppid == link.holder_pid
            holder_pid = link.holder_pid
        try:
            # The link detached on the way out: the holder keeps the agent running.
            assert is_same_process(pid, start_time)
            info = read_proc_info(pid)
            assert info is not None and info.ppid == holder_pid and not info.is_zombie
        finally:
            for leftover in (pid, holder_pid):
                with suppress(ProcessLookupError):
                    os.kill(leftover, signal.SIGKILL)


async def test_without_the_holder_nothing_is_handed_over(store: Store, tmp_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with await _supervisor(store, tmp_path, make_config(holder=False)) as sup:
            session = await create(sup, tmp_path)
            await sup.start(session)
            assert await sup.hand_over_all() == 0
            task = session.task
            assert task is not None and task.stop_cause is None
        causes = [b["cause"] for _, k, b in await journal(store, session.id) if k == "child.exited"]
        assert causes == ["shutdown"]


@pytest.mark.parametrize("when", ["before its handshake", "after a stop"])
async def test_a_task_that_cannot_hand_over_refuses(
    store: Store, tmp_path: Path, when: str
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with (
            await _supervisor(store, tmp_path, make_config(holder=True)) as sup,
            trio.open_nursery() as nursery,
        ):
            if when == "before its handshake":
                session = await create(sup, tmp_path, hangHandshake=True)

                async def start() -> None:
                    with suppress(AgentExited):  # stopped below, before it was ready
                        await sup.start(session)

                nursery.start_soon(start)
                await eventually(lambda: session.task is not None)
                task = session.task
                assert task is not None
                assert not task.hand_over()
                assert task.stop_cause is None
                task.stop("shutdown")
            else:
                session = await create(sup, tmp_path)
                await sup.start(session)
                task = session.task
                assert task is not None
                task.stop("requested")
                assert not task.hand_over()
                assert task.stop_cause == "requested"
            await task.done.wait()
            assert not task.handed_over
        exits = [b["cause"] for _, k, b in await journal(store, session.id) if k == "child.exited"]
        assert exits == ["shutdown" if when == "before its handshake" else "requested"]
