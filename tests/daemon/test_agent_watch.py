"""The daemon's one watcher of its agents (``agentsd.agent_watch``): stderr pipes and
exits of many agents served by one thread, no trio task per agent, and no thread
once nothing is watched."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from agentsd.agent_watch import current_watch
from agentsd.stderr_log import StderrLog

AGENTS = 20


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "agentsd-agent-watch"]


def task_count() -> int:
    def count(task: trio.lowlevel.Task) -> int:
        return 1 + sum(count(t) for n in task.child_nurseries for t in n.child_tasks)

    root = trio.lowlevel.current_root_task()
    assert root is not None
    return count(root)


async def test_many_captures_share_one_thread_and_add_no_task(tmp_path: Path) -> None:
    logs = [StderrLog(tmp_path / f"{i}.stderr.log", 256 * 1024) for i in range(AGENTS)]
    tasks_before = task_count()
    with trio.fail_after(60):
        async with AsyncExitStack() as stack:
            fds = [await stack.enter_async_context(log.capture()) for log in logs]
            assert task_count() == tasks_before
            assert len(watch_threads()) == 1
            for i, fd in enumerate(fds):
                os.write(fd, f"agent {i} says why\n".encode())
        # Every capture read its pipe to the end before it returned.
        for i, log in enumerate(logs):
            assert log.tail() == f"agent {i} says why\n"
            assert (tmp_path / f"{i}.stderr.log").read_bytes() == f"agent {i} says why\n".encode()
        # The last release ends the thread (Rule 3).
        for thread in watch_threads():
            await trio.to_thread.run_sync(thread.join)
        assert watch_threads() == []
        # And a later capture starts one again.
        again = StderrLog(tmp_path / "again.stderr.log", 256 * 1024)
        async with again.capture() as fd:
            os.write(fd, b"once more\n")
        assert again.tail() == "once more\n"


async def test_an_exit_is_reported_once_and_a_released_watch_never(tmp_path: Path) -> None:
    watch = current_watch()
    waiting = await trio.lowlevel.open_process(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    released = await trio.lowlevel.open_process(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    assert waiting.stdin is not None and released.stdin is not None
    reports: list[str] = []
    exited = trio.Event()

    def on_exit() -> None:
        reports.append("waiting")
        exited.set()

    with trio.fail_after(60):
        waiting_fd = watch.add_exit(waiting.pid, on_exit)
        released_fd = watch.add_exit(released.pid, lambda: reports.append("released"))
        watch.release(released_fd)
        await released.stdin.aclose()
        await released.wait()
        assert reports == []  # the child has not exited yet
        await waiting.stdin.aclose()
        await exited.wait()
        assert await waiting.wait() == 0
        watch.release(waiting_fd)
        # The released child exited before the other was reported: had its report
        # been on its way, it would have come first.
        assert reports == ["waiting"]
