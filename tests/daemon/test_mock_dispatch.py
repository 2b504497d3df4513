"""A send to the mock agent ends when the adapter stops reading the agent.

The runner stops reading an agent when its session cannot go on (its journal
refuses a write on a full disk, the agent broke its framing): a send whose ack can
no longer be read must then answer at once, ``unknown`` (the agent may have read
the prompt), not wait out ``ACK_TIMEOUT_S`` while the client's call times out.
The agent is scripted over memory streams; ``ACK_TIMEOUT_S`` is made endless, so a
send that waits for it fails this test's bound instead of answering.
"""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from agentsd.providers import mock
from agentsd.providers.base import Dispatch, LineLink, Submission
from agentsd.providers.mock import MockAdapter
from tests.recording_sink import RecordingSink

TEST_TIMEOUT_S = 10.0  # in memory, each test takes milliseconds


class Agent:
    """The adapter on memory streams, and the agent's end of them."""

    def __init__(self) -> None:
        self.to_agent = trio.testing.memory_stream_one_way_pair()
        self.from_agent = trio.testing.memory_stream_one_way_pair()
        link = LineLink(self.to_agent[0], self.from_agent[1])
        self.adapter = MockAdapter(link, RecordingSink())
        self._buffer = b""

    async def read_frame(self) -> dict[str, object]:
        """The next frame the adapter wrote to the agent."""
        while b"\n" not in self._buffer:
            self._buffer += await self.to_agent[1].receive_some()
        line, self._buffer = self._buffer.split(b"\n", 1)
        frame: dict[str, object] = json.loads(line)
        return frame

    async def say(self, frame: dict[str, object]) -> None:
        await self.from_agent[0].send_all(json.dumps(frame).encode() + b"\n")


@pytest.fixture(autouse=True)
def endless_ack_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mock, "ACK_TIMEOUT_S", float("inf"))


async def test_a_send_waiting_for_its_ack_answers_unknown_once_reading_stops() -> None:
    agent = Agent()
    outcome: list[Dispatch] = []

    async def send() -> None:
        outcome.append(await agent.adapter.send(Submission("p-1", "hello")))

    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            reading = trio.CancelScope()

            async def run() -> None:
                with reading:
                    await agent.adapter.run()

            nursery.start_soon(run)
            nursery.start_soon(send)
            frame = await agent.read_frame()
            assert frame["type"] == "prompt" and frame["id"] == "p-1"
            await trio.testing.wait_all_tasks_blocked()
            assert outcome == []  # no ack yet: the send waits for one
            reading.cancel()  # as the runner does when the session cannot go on
    assert [d.outcome for d in outcome] == ["unknown"], outcome
    assert "stopped before it confirmed" in (outcome[0].reason or "")


async def test_a_send_after_reading_stopped_answers_unknown_at_once() -> None:
    agent = Agent()
    with trio.fail_after(TEST_TIMEOUT_S):
        await agent.from_agent[0].aclose()  # the agent's output ends
        await agent.adapter.run()
        dispatch = await agent.adapter.send(Submission("p-2", "late"))
    assert dispatch.outcome == "unknown", dispatch


async def test_an_acked_send_is_still_accepted() -> None:
    agent = Agent()
    outcome: list[Dispatch] = []

    async def send() -> None:
        outcome.append(await agent.adapter.send(Submission("p-3", "steer")))

    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.adapter.run)
            nursery.start_soon(send)
            frame = await agent.read_frame()
            # No turn id: the ack steers the running turn, which confirms it at once.
            await agent.say({"type": "ack", "id": frame["id"]})
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert [d.outcome for d in outcome] == ["accepted"], outcome
