"""Reap before release (DESIGN.md invariant 1) when the kernel will not let the agent
go: the unproven branch, driven for real through the daemon's supervisor.

A tracer (``tests.e2e.ptrace_hold``) seizes the running mock agent. From then on the
close ladder's stdin EOF, SIGTERM and SIGKILL all leave the agent stopped and
unreaped, so the ladder runs out of time without proof of exit. The test checks that
the lease stays held, the session reports ``exit-unproven``, a close retried while
the agent is still held settles nothing, and once the tracer lets go a later close
settles it; at no point before that is anything journaled as ended or released.

Tracing a process one did not start needs root (``CAP_SYS_PTRACE``); ``.ci/run``
runs as root, and under CI the skip below is a failure (tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.daemon_process import IO_TIMEOUT_S, running_daemon
from tests.e2e.test_sessions import (
    DATABASE_NAME,
    TEST_TIMEOUT_S,
    CallFailed,
    Rpc,
    assert_contiguous,
    create,
    db_rows,
    history,
    kinds,
    ladder_config,
    open_rpc,
)

REPO = Path(__file__).resolve().parents[2]
ENDED_KINDS = {"child.exited", "lease.released"}  # what only a proven exit may journal

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to ptrace an agent the test did not start"
)


@contextmanager
def held(pid: int) -> Iterator[subprocess.Popen[str]]:
    """``pid`` seized by a tracer until the block ends (or the tracer is closed)."""
    with subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.ptrace_hold", str(pid)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as tracer:
        try:
            assert tracer.stdout is not None
            assert tracer.stdout.readline() == "held\n", "the tracer could not seize the agent"
            yield tracer
        finally:
            release(tracer)


def release(tracer: subprocess.Popen[str]) -> None:
    """Let the traced process go: the tracer exits and the kernel detaches it."""
    if tracer.stdin is not None and not tracer.stdin.closed:
        tracer.stdin.close()
    assert tracer.wait(timeout=IO_TIMEOUT_S) == 0


def process_state(pid: int) -> str | None:
    """The one-letter state in ``/proc/PID/status``; None once the pid is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return None
    [line] = [line for line in status.splitlines() if line.startswith("State:")]
    return line.split()[1]


async def close_error(rpc: Rpc, session_id: str) -> str:
    """The error kind of a close that must fail."""
    with pytest.raises(CallFailed) as failed:
        await rpc.call("agentSession.close", {"sessionId": session_id})
    return failed.value.kind


async def phase(rpc: Rpc, session_id: str) -> Any:
    return (await rpc.call("agentSession.get", {"sessionId": session_id}))["session"]["phase"]


async def test_reap_before_release_an_agent_held_by_ptrace_keeps_its_lease_until_a_later_close(
    tmp_path: Path,
) -> None:
    """Without the holder (``holder = false``): the daemon starts the agent itself
    and is the one that must reap it before releasing its lease."""
    with (
        ladder_config(eof_grace_s=0.2, term_grace_s=0.2, kill_wait_s=0.5, holder=False) as config,
        running_daemon(extra_args=["--config", str(config)]) as daemon,
    ):
        db = daemon.state_dir / DATABASE_NAME

        def lease_states(session_id: str) -> list[str]:
            rows = db_rows(
                db, "SELECT state FROM leases WHERE session_id = ? ORDER BY fence", session_id
            )
            return [state for (state,) in rows]

        with trio.fail_after(TEST_TIMEOUT_S):
            async with open_rpc(daemon.socket) as rpc:
                info = await create(rpc, tmp_path, start=True)
                sid, pid = info["sessionId"], info["child"]["pid"]
                assert lease_states(sid) == ["live"]
                with held(pid) as tracer:
                    assert await close_error(rpc, sid) == "exit_unproven"
                    # The ladder ran to SIGKILL; the agent exists, stopped by its tracer.
                    assert process_state(pid) == "t"
                    assert await phase(rpc, sid) == "exit-unproven"
                    assert lease_states(sid) == ["live"]
                    unproven = await history(rpc, sid)
                    assert kinds(unproven)[-1] == "exit.unproven"
                    assert not ENDED_KINDS & set(kinds(unproven)), kinds(unproven)

                    # A retry while the agent is still held proves nothing and
                    # journals nothing.
                    assert await close_error(rpc, sid) == "exit_unproven"
                    assert await history(rpc, sid) == unproven
                    assert lease_states(sid) == ["live"]

                    release(tracer)
                closed = await rpc.call("agentSession.close", {"sessionId": sid})
                assert closed["session"]["phase"] == "stopped"
                assert process_state(pid) is None
                assert lease_states(sid) == ["released"]
                settled = await history(rpc, sid)
                assert_contiguous(settled)
                assert settled[: len(unproven)] == unproven
                assert kinds(settled)[len(unproven) :] == ["child.exited", "lease.released"]
