"""An answer reaches a taken-over agent exactly once (issue 19, "no lost approval").

A client's answer is committed, then written to the agent keyed with its seq; the
holder reports the last key it took (``agentsd.holder_link`` Rule 5). A
daemon SIGKILLed between the commit and the write leaves the answer journaled and
the agent waiting: the daemon that takes the agent over writes it then
(``agentsd.reattach`` Rule 2), and writes nothing that already reached the agent.

The window is made real, not simulated: the daemon's fsyncs are held in the kernel's
syscall path by ``strace`` fault injection (``tests.e2e.test_slow_storage``), and
the daemon is SIGKILLed once the answer's commit is in the database's WAL file and
its fsync is still held, so the answer is durable and its write never happened.
"""

from __future__ import annotations

import signal
from typing import Any

import trio

from tests.daemon_process import DaemonProcess, running_daemon
from tests.e2e.test_reattach import TIMEOUT_S, ask_approval, held_state
from tests.e2e.test_sessions import DATABASE_NAME, Rpc, assert_contiguous, history, open_rpc
from tests.e2e.test_slow_storage import slow_fsync
from tests.polling import eventually

FSYNC_DELAY_S = 30  # far longer than the test takes to kill the daemon in the middle
# The answer's event as the journal stores it (``ApprovalResolved``, camel-cased).
ANSWER_BYTES = b'"decision":"accept","by":"client"'


def _once(journal: list[dict[str, Any]]) -> None:
    """The agent heard one answer: its tool ran once, its turn completed, and it never
    complained of an answer to a question it no longer asks."""
    assert_contiguous(journal)
    kinds = [e["kind"] for e in journal]
    assert "agent.error" not in kinds, [e["body"] for e in journal if e["kind"] == "agent.error"]
    tools = [
        e for e in journal if e["kind"] == "item.completed" and e["body"].get("type") == "toolCall"
    ]
    assert [t["body"]["status"] for t in tools] == ["completed"]
    [resolved] = [e for e in journal if e["kind"] == "approval.resolved"]
    assert resolved["body"]["decision"] == "accept"
    outcomes = [e["body"]["outcome"] for e in journal if e["kind"] == "turn.completed"]
    assert outcomes and set(outcomes) == {"completed"}


async def after_takeover(rpc: Rpc, sid: str, pid: int) -> list[dict[str, Any]]:
    """Taken over (same pid), its turn ends, and the next turn is served after it (a
    second answer or interrupt the agent was sent would be read before that
    prompt); the journal then."""
    info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
    assert info["child"]["pid"] == pid

    async def turns(n: int) -> bool:
        journal = await history(rpc, sid)
        return [e["kind"] for e in journal].count("turn.completed") >= n

    await eventually(lambda: turns(1), timeout_s=TIMEOUT_S)
    await rpc.call("agentSession.send", {"sessionId": sid, "text": "echo after"})
    await eventually(lambda: turns(2))
    return await history(rpc, sid)


async def kill_between_commit_and_write(
    daemon: DaemonProcess, client: Rpc, method: str, params: dict[str, Any], committed: bytes
) -> None:
    """Send ``method`` on ``client`` and SIGKILL ``daemon`` once ``committed`` is in
    its database's WAL while the commit's fsync is held: what the request committed
    is durable, and what comes after its commit never happened."""
    wal = daemon.state_dir / f"{DATABASE_NAME}-wal"
    assert committed not in wal.read_bytes()
    with slow_fsync(daemon.process.pid, FSYNC_DELAY_S) as tracer:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.request, method, params)

            async def in_the_wal() -> bool:
                return committed in wal.read_bytes()

            await eventually(in_the_wal)
            # Killed while its fsync is held, it never returns from it; its tracer is
            # killed too, which reports its death at once.
            daemon.process.send_signal(signal.SIGKILL)
            tracer.kill()
            nursery.cancel_scope.cancel()
    assert daemon.wait() == -signal.SIGKILL


async def test_an_answer_committed_but_not_written_at_a_crash_is_written_by_the_next_daemon() -> (
    None
):
    with trio.fail_after(TIMEOUT_S), held_state() as (base, state, args):
        with running_daemon(state_dir=state, extra_args=args) as first:
            async with open_rpc(first.socket) as rpc, open_rpc(first.socket) as answerer:
                sid, pid, approval_id = await ask_approval(rpc, base)
                await kill_between_commit_and_write(
                    first,
                    answerer,
                    "agentSession.respond",
                    {"sessionId": sid, "approvalId": approval_id, "decision": "accept"},
                    ANSWER_BYTES,
                )

        with running_daemon(state_dir=state, extra_args=args) as second:
            async with open_rpc(second.socket) as rpc:
                # The answer is the journal's: asked again, it is already resolved.
                again = await rpc.request(
                    "agentSession.respond",
                    {"sessionId": sid, "approvalId": approval_id, "decision": "decline"},
                )
                assert again["error"]["data"]["kind"] == "already_resolved"
                journal = await after_takeover(rpc, sid, pid)
                await rpc.call("agentSession.close", {"sessionId": sid})
            # It was the second daemon that wrote it, not the first before its death.
            assert "committed by the earlier daemon and never written" in second.log()
        _once(journal)


async def test_an_answer_that_reached_the_agent_is_not_written_again_after_a_crash() -> None:
    with trio.fail_after(TIMEOUT_S), held_state() as (base, state, args):
        with running_daemon(state_dir=state, extra_args=args) as first:
            async with open_rpc(first.socket) as rpc:
                sid, pid, approval_id = await ask_approval(rpc, base)
                await rpc.call(
                    "agentSession.respond",
                    {"sessionId": sid, "approvalId": approval_id, "decision": "accept"},
                )
            first.process.send_signal(signal.SIGKILL)
            assert first.wait() == -signal.SIGKILL

        with running_daemon(state_dir=state, extra_args=args) as second:
            async with open_rpc(second.socket) as rpc:
                journal = await after_takeover(rpc, sid, pid)
                await rpc.call("agentSession.close", {"sessionId": sid})
            assert "never written" not in second.log()
        _once(journal)
