"""An interrupt reaches a taken-over agent exactly once (issue 19).

``agentSession.interrupt`` commits ``interrupt.requested``, then writes the
interrupt to the agent keyed with that seq, under the lock answers are written
under (``handlers.conversation`` Rule 3): the holder's last key says whether it was
written. A daemon SIGKILLed between the commit and the write leaves the journal
saying the user stopped the turn while the agent runs on: the daemon that takes the
agent over writes the interrupt then, as long as that turn is still the open one
(``agentsd.reattach`` Rule 2), and writes nothing that already reached the agent.

The window is made real as in ``tests.e2e.test_reattach_answers``: the daemon's
fsyncs are held by ``strace`` fault injection and the daemon is SIGKILLed once the
interrupt's commit is in the WAL, its fsync still held. The turn interrupted is one
that waits on an approval: open and quiet, so no streamed text commits in between.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import trio

from tests.daemon_process import running_daemon
from tests.e2e.test_reattach import TIMEOUT_S, ask_approval, held_state
from tests.e2e.test_reattach_answers import after_takeover, kill_between_commit_and_write
from tests.e2e.test_sessions import (
    Rpc,
    assert_contiguous,
    history,
    open_rpc,
)

INTERRUPT_BYTES = b"interrupt.requested"
RESENT = "committed by the earlier daemon and never written"  # the takeover's log line
NO_TURN = "the mock agent had no turn to interrupt"  # an interrupt the mock heard twice


async def _waiting_turn(rpc: Rpc, base: Path, **options: Any) -> tuple[str, int, str]:
    """A session whose turn waits on an approval: (session id, agent pid, turn id)."""
    sid, pid, _ = await ask_approval(rpc, base, **options)
    [started] = [e for e in await history(rpc, sid) if e["kind"] == "turn.started"]
    return sid, pid, str(started["body"]["turnId"])


def _interrupted_once(journal: list[dict[str, Any]], turn_id: str) -> None:
    """The turn asked to stop ended interrupted, once, its tool never ran, and the
    next turn completed."""
    assert_contiguous(journal)
    kinds = [e["kind"] for e in journal]
    assert "agent.error" not in kinds, [e["body"] for e in journal if e["kind"] == "agent.error"]
    [asked] = [e for e in journal if e["kind"] == "interrupt.requested"]
    assert asked["body"]["turnId"] == turn_id
    ends = [
        (e["body"]["turnId"], e["body"]["outcome"])
        for e in journal
        if e["kind"] == "turn.completed"
    ]
    assert len(ends) == 2, ends
    assert ends[0] == (turn_id, "interrupted")
    assert ends[1][0] != turn_id and ends[1][1] == "completed"
    tools = [
        e for e in journal if e["kind"] == "item.completed" and e["body"].get("type") == "toolCall"
    ]
    assert tools == []


async def test_an_interrupt_committed_but_not_written_at_a_crash_is_written_by_the_next_daemon() -> (
    None
):
    with trio.fail_after(TIMEOUT_S), held_state() as (base, state, args):
        with running_daemon(state_dir=state, extra_args=args) as first:
            async with open_rpc(first.socket) as rpc, open_rpc(first.socket) as stopper:
                sid, pid, turn_id = await _waiting_turn(rpc, base)
                await kill_between_commit_and_write(
                    first,
                    stopper,
                    "agentSession.interrupt",
                    {"sessionId": sid, "turnId": turn_id},
                    INTERRUPT_BYTES,
                )

        with running_daemon(state_dir=state, extra_args=args) as second:
            async with open_rpc(second.socket) as rpc:
                journal = await after_takeover(rpc, sid, pid)
                await rpc.call("agentSession.close", {"sessionId": sid})
            log = second.log()
            # It was the second daemon that wrote it, not the first before its death.
            assert f"interrupting turn {turn_id}" in log and RESENT in log
            assert NO_TURN not in log
        _interrupted_once(journal, turn_id)


async def test_an_interrupt_that_reached_the_agent_is_not_written_again_after_a_crash() -> None:
    """The agent took the interrupt but holds its turn open (``interruptGate``)
    until after the takeover, so the journal still shows the turn running: only the
    holder's key says the interrupt was written."""
    with trio.fail_after(TIMEOUT_S), held_state() as (base, state, args):
        gate = base / "interrupt-gate"
        with running_daemon(state_dir=state, extra_args=args) as first:
            async with open_rpc(first.socket) as rpc:
                sid, pid, turn_id = await _waiting_turn(rpc, base, interruptGate=str(gate))
                result = await rpc.call(
                    "agentSession.interrupt", {"sessionId": sid, "turnId": turn_id}
                )
                assert result["interrupted"] is True
            first.process.send_signal(signal.SIGKILL)
            assert first.wait() == -signal.SIGKILL

        with running_daemon(state_dir=state, extra_args=args) as second:
            async with open_rpc(second.socket) as rpc:
                # The turn is open as the takeover saw it: the agent holds it at the gate.
                assert "turn.completed" not in [e["kind"] for e in await history(rpc, sid)]
                gate.touch()
                journal = await after_takeover(rpc, sid, pid)
                await rpc.call("agentSession.close", {"sessionId": sid})
            log = second.log()
            assert "interrupting turn" not in log and RESENT not in log
            assert NO_TURN not in log
        _interrupted_once(journal, turn_id)
