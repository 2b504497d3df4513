"""Draining: the daemon takes no new turn and waits for the running ones to end,
before a planned restart (``daemon.restart`` with ``drain``).

Rule 1 (refuse before journaling): once the gate is closed, every path that would
start or steer a turn refuses before it writes anything: a send or a continuation
gets ``draining`` (retryable: the restarted daemon takes it), a queued prompt stays
queued (the restarted daemon pauses the queue). Answering approvals, interrupting
and reading go on, so the running turns can end.

Rule 2 (what is waited for): a session is busy while a turn is open or a prompt
waits for its dispatch outcome; the drain is over when no session is busy and no
admitted send is still on its way to the journal, or at the timeout.

Rule 3 (a step, not a restart): `drain_turns` only drains and reports; the caller
decides what follows (exit for the service manager, re-exec, or a restart that
keeps agents running). A drain that is abandoned (its caller was cancelled)
reopens the gate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import attrs
import trio

from agentsd.session import Session
from agentsd_protocol.errors import Draining

DRAIN_POLL_S = 0.1  # how often a drain looks again; only while one runs


@attrs.define
class TurnGate:
    """Whether new turns are taken (Rule 1), and the sends admitted and not yet
    journaled (Rule 2). Owned by the supervisor."""

    draining: bool = False
    in_flight: int = 0

    @contextmanager
    def admit(self) -> Iterator[None]:
        """Around a send or a continuation, from before it journals to after its
        delivery; raises ``Draining`` when the gate is closed."""
        if self.draining:
            raise Draining("the daemon is draining before a restart and takes no new turn")
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1


def busy(session: Session) -> bool:
    convo = session.conversation
    return convo.turn_open or bool(convo.undispatched)


@attrs.frozen
class DrainReport:
    turns_running: int  # busy sessions when the drain began
    turns_finished: int  # of those, ended while it waited
    turns_cut_off: int  # busy still at the timeout
    waited_s: float
    timed_out: bool


@contextmanager
def closed_gate(gate: TurnGate) -> Iterator[None]:
    """Close the gate for the block; reopen it if the block raises or is cancelled
    (Rule 3): only a restart that goes through keeps it closed."""
    gate.draining = True
    try:
        yield
    except BaseException:
        gate.draining = False
        raise


async def drain_turns(
    gate: TurnGate, sessions: Iterable[Session], timeout_s: float | None
) -> DrainReport:
    """Wait until nothing is busy (Rule 2) or ``timeout_s`` (None: no bound). The
    caller holds the gate closed (`closed_gate`)."""
    assert gate.draining, "drain_turns runs with the gate closed"
    everyone = list(sessions)
    started = trio.current_time()
    running = [s for s in everyone if busy(s)]
    timed_out = True
    with trio.move_on_after(math.inf if timeout_s is None else timeout_s):
        # Turn ends, dispatch outcomes and admitted sends each have their own signal;
        # a drain is rare, so it looks again every DRAIN_POLL_S instead of wiring a
        # wakeup into each of them.
        while gate.in_flight or any(busy(s) for s in everyone):  # noqa: ASYNC110
            await trio.sleep(DRAIN_POLL_S)
        timed_out = False
    still = sum(1 for s in everyone if busy(s))
    return DrainReport(
        turns_running=len(running),
        turns_finished=sum(1 for s in running if not busy(s)),
        turns_cut_off=still,
        waited_s=round(trio.current_time() - started, 3),
        timed_out=timed_out,
    )
