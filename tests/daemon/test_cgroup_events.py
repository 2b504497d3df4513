"""agentsd.cgroup_events: waits on a file's modification through one shared inotify
instance. Regular files raise IN_MODIFY on a write just as ``cgroup.events`` does
when a value in it changes, so these tests use files in a temporary directory."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from agentsd.cgroup_events import wait_until_changed

WAITERS = 60


async def test_each_change_wakes_only_its_own_waiters(tmp_path: Path) -> None:
    """A close-all waits on hundreds of cgroups at once: one change must cost a look
    at its own cgroup, not at every one (N looks in all, not N squared)."""
    files = [tmp_path / f"events{i}" for i in range(WAITERS)]
    for file in files:
        file.write_text("populated 1\n")
    looks = [0] * WAITERS
    done: list[int] = []
    finished = [trio.Event() for _ in range(WAITERS)]

    def check(i: int) -> bool:
        looks[i] += 1
        return files[i].read_text() == "populated 0\n"

    async def wait(i: int) -> None:
        await wait_until_changed(files[i], lambda: check(i))
        done.append(i)
        finished[i].set()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for i in range(WAITERS):
                nursery.start_soon(wait, i)
            await trio.testing.wait_all_tasks_blocked()
            for i, file in enumerate(files):
                file.write_text("populated 0\n")
                await finished[i].wait()  # one at a time: the worst case for wake-all
    assert sorted(done) == list(range(WAITERS))
    # Each waiter looks once before waiting, once per change of its own file, and a
    # few more times when the reader role passes to it; never once per other change.
    assert sum(looks) <= 4 * WAITERS, looks


async def test_a_cancelled_reader_hands_the_role_over(tmp_path: Path) -> None:
    """The first waiter reads for everyone; cancelled, it must pass the role on, or
    the second would never hear of its change."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.write_text("1")
    second.write_text("1")
    woke = trio.Event()

    async def first_waits(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await wait_until_changed(first, lambda: False)

    async def second_waits() -> None:
        await wait_until_changed(second, lambda: second.read_text() == "0")
        woke.set()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            reader = await nursery.start(first_waits)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(second_waits)
            await trio.testing.wait_all_tasks_blocked()
            reader.cancel()
            await trio.testing.wait_all_tasks_blocked()
            second.write_text("0")
            await woke.wait()
