"""The keyed writes of one session (``handlers.conversation`` Rules 2 and 3): answers
and interrupts are committed and written one at a time, so that the journal's order
of them is the order the holder took their keys; but the lock that orders them is
held until a write went out, not while the agent's confirmation is waited for (Codex
and Claude confirm an interrupt once the turn stopped, up to 10 s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from agentsd.providers.mock import MockAdapter
from agentsd.store.journal import read_events
from tests.daemon.test_connection import connect
from tests.daemon.test_delete_race import HANG_GUARD_S, Harness, call, harness
from tests.polling import eventually

__all__ = ["harness"]  # the fixture


# With the holder the lock is given back once the holder link wrote the interrupt's
# key; an agent on direct pipes has no keys, and its write settles the order as well.
@pytest.mark.parametrize("harness", [True, False], ids=["holder", "direct"], indirect=True)
async def test_an_answer_is_not_held_up_by_an_interrupt_waiting_for_its_confirmation(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"  # the mock agent ends the interrupted turn once it exists
    session = await harness.supervisor.create(
        provider="mock",
        cwd=str(tmp_path),
        title=None,
        options={"interruptGate": str(gate)},
        env={},
        command=None,
    )
    written = trio.Event()
    confirmed = trio.Event()
    original = MockAdapter.interrupt

    async def interrupt(self: MockAdapter, turn_id: str | None, *, confirm: bool = True) -> bool:
        # The mock writes its interrupt and returns; an agent that confirms it late
        # (Codex, Claude) keeps the caller here after the write.
        took = await original(self, turn_id, confirm=confirm)
        written.set()
        await confirmed.wait()
        return took

    monkeypatch.setattr(MockAdapter, "interrupt", interrupt)
    stopper, answerer = connect(harness.daemon), connect(harness.daemon)
    try:
        with trio.fail_after(HANG_GUARD_S):
            await call(
                answerer, 1, "agentSession.send", {"sessionId": session.id, "text": "approve"}
            )
            assert "result" in await answerer.peer.recv()
            await eventually(lambda: bool(session.conversation.approvals), timeout_s=HANG_GUARD_S)
            [approval_id] = session.conversation.approvals
            await call(stopper, 2, "agentSession.interrupt", {"sessionId": session.id})
            await written.wait()
            params: dict[str, Any] = {
                "sessionId": session.id,
                "approvalId": approval_id,
                "decision": "accept",
            }
            await call(answerer, 3, "agentSession.respond", params)
            reply = await answerer.peer.recv()
            # Answered while the interrupt still waits: not after it, not refused as
            # "storage too slow" once its own bound ran out behind the interrupt.
            assert not confirmed.is_set()
            assert reply.get("result", {}).get("decision") == "accept", reply
            confirmed.set()
            gate.touch()
            reply = await stopper.peer.recv()
            assert reply["result"]["interrupted"] is True, reply

        def read(conn: Any) -> list[Any]:
            events, _ = read_events(conn, session.id, after_seq=0, limit=1000, max_bytes=1 << 22)
            return events

        kinds = [stored.kind for stored in await harness.store.read(read)]
        # The journal's order of the keyed writes is the order they went out in.
        assert kinds.index("interrupt.requested") < kinds.index("approval.resolved"), kinds
    finally:
        confirmed.set()
        gate.touch()
