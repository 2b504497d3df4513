"""Every provider adapter, the mock included, ends a session whose agent breaks its
framing beyond a bound with one error (``providers.base`` Rule 3), never a loop of
``agent.error`` events: a line past ``MAX_LINE_BYTES``, or ``MAX_BAD_LINES`` lines in a
row that are not frames. Each adapter reads from memory streams, its agent scripted."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing

from agentsd.providers import base
from agentsd.providers.base import MAX_BAD_LINES, Adapter, LineLink
from agentsd.providers.claude_adapter import ClaudeAdapter
from agentsd.providers.codex import CodexAdapter
from agentsd.providers.mock import MockAdapter
from agentsd.store.sessions import SessionRow
from agentsd_protocol.errors import AgentProtocolError
from tests.recording_sink import RecordingSink

TEST_TIMEOUT_S = 10.0  # in memory, each test takes milliseconds
ENDLESS_LINES = 10 * MAX_BAD_LINES  # "without end", as far as any bound can tell


def _row(provider: str) -> SessionRow:
    return SessionRow(
        id="s-1",
        host_id="h",
        provider=provider,
        cwd="/tmp",
        title=None,
        options={},
        env={},
        command=None,
        provider_handle=None,
        created_at=0.0,
        updated_at=0.0,
    )


ADAPTERS: dict[str, Callable[[LineLink, RecordingSink], Adapter]] = {
    "mock": MockAdapter,
    "codex": lambda link, sink: CodexAdapter(link, sink, _row("codex")),
    "claude": lambda link, sink: ClaudeAdapter(link, sink, session_id="s-1"),
}


async def _run_against(provider: str, output: bytes, repeat: int) -> tuple[RecordingSink, str]:
    """Run ``provider``'s adapter against an agent that writes ``output`` ``repeat``
    times and then stays silent; the error ``run`` ended with, and what it journaled."""
    sink = RecordingSink()
    to_agent = trio.testing.memory_stream_one_way_pair()
    from_agent = trio.testing.memory_stream_one_way_pair()
    adapter = ADAPTERS[provider](LineLink(to_agent[0], from_agent[1]), sink)

    async def agent() -> None:
        for _ in range(repeat):
            await from_agent[0].send_all(output)
        await trio.sleep_forever()

    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent)
            with pytest.raises(AgentProtocolError) as ended:
                await adapter.run()
            nursery.cancel_scope.cancel()
    return sink, ended.value.message


@pytest.mark.parametrize("provider", sorted(ADAPTERS))
async def test_lines_that_are_not_frames_without_end_end_the_session_with_one_error(
    provider: str,
) -> None:
    sink, message = await _run_against(provider, b"Segmentation fault\n", ENDLESS_LINES)
    errors = [body for kind, body in sink.events if kind == "agent.error"]
    # Each bad line up to the bound is journaled and skipped; the next one ends it.
    assert len(errors) == MAX_BAD_LINES, errors[-3:]
    assert "Segmentation fault" in message


@pytest.mark.parametrize("provider", sorted(ADAPTERS))
async def test_a_line_past_the_frame_bound_ends_the_session_with_one_error(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "MAX_LINE_BYTES", 4096)
    sink, message = await _run_against(provider, b"x" * 1024, ENDLESS_LINES)
    assert [kind for kind, _ in sink.events if kind == "agent.error"] == []
    assert "longer than 4096 bytes" in message


async def test_a_broken_link_stays_broken() -> None:
    """Where the line after an overlong one starts cannot be known: every later read
    raises the same error, whatever arrives."""
    send, receive = trio.testing.memory_stream_one_way_pair()
    link = LineLink(trio.testing.MemorySendStream(), receive)
    await send.send_all(b"y" * (base.MAX_LINE_BYTES + 1))
    with pytest.raises(AgentProtocolError) as first:
        await link.receive_line()
    await send.send_all(b'\n{"type": "ok"}\n')
    with pytest.raises(AgentProtocolError) as again:
        await link.receive()
    assert link.broken and again.value is first.value
