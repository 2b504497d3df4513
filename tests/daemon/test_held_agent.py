"""A held agent's stdin keys and stderr acknowledgements, on a recording link: what
the daemon tells the holder (``agentsd.holder_link`` Rules 3 and 5)."""

from __future__ import annotations

import os
from typing import Any

import attrs
import trio

from agentsd.holder_link import AgentStdin, HeldAgent, keyed


@attrs.define
class RecordingLink:
    """What a `HeldAgent` uses of its link, recording the frames it is given."""

    writes: list[dict[str, Any]] = attrs.Factory(list)
    acks: list[int] = attrs.Factory(list)
    lost: trio.Event = attrs.Factory(trio.Event)

    async def send(self, header: dict[str, Any], data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.writes.append(header)

    def send_nowait(self, message: dict[str, Any]) -> None:
        if message.get("op") == "ack" and message.get("stream") == "err":
            self.acks.append(message["offset"])

    def start_soon(self, fn: Any) -> None:
        raise AssertionError("no copy is started once the copy was closed")


def _agent(link: RecordingLink) -> HeldAgent:
    return HeldAgent(link=link, id="a1", pid=1, start_time=None)  # type: ignore[arg-type]


def _holders_last_key(writes: list[dict[str, Any]]) -> str | None:
    keys = [w["key"] for w in writes if "key" in w]
    return keys[-1] if keys else None


async def test_only_the_first_write_of_a_keyed_block_carries_its_key() -> None:
    """Rule 5: the holder records the key of the last keyed frame it took. An
    interrupt gives the keyed-writes lock back once its first frame went out, and
    may write more (Claude's drops after the confirmation, ACP's cancelled
    answers); an answer keyed later may go out in between. Were the interrupt's
    later frames keyed too, the holder's last key would go back to the
    interrupt's, and a daemon taking over would write the answer again."""
    link = RecordingLink()
    stdin = AgentStdin(_agent(link))
    with keyed("5"):
        await stdin.send_all(b"interrupt\n")
        with keyed("7"):  # an answer journaled after it, written meanwhile
            await stdin.send_all(b"answer\n")
        await stdin.send_all(b"drop\n")
        await stdin.send_all(b"")  # nothing to carry: nothing is sent
    assert [w.get("key") for w in link.writes] == ["5", "7", None]
    assert _holders_last_key(link.writes) == "7"


async def test_stderr_unwritten_at_a_handover_stays_unacknowledged() -> None:
    """Rule 3: a handover closes the copy of an agent's stderr; what was received
    and not written, and what arrives after, is left for the next daemon (the
    holder keeps what is unacknowledged), never acknowledged as if logged."""
    link = RecordingLink()
    agent = _agent(link)
    read_end, write_end = os.pipe()
    try:
        agent._open_err(write_end)
        agent._err_copying = True  # a copy is under way: the bytes wait in its buffer
        agent._on_err(0, b"unwritten\n")
        agent._err_copying = False
        agent.close_err()  # the handover
        agent._on_err(10, b"after\n")
        assert link.acks == []
    finally:
        os.close(read_end)
        os.close(write_end)


async def test_stderr_with_no_log_is_acknowledged_as_read() -> None:
    """Without a log (or once it is lost), stderr is acknowledged as it comes, so
    the holder's buffer never fills and stalls the agent."""
    link = RecordingLink()
    agent = _agent(link)
    agent._on_err(0, b"nobody logs this\n")
    assert link.acks == [17]
