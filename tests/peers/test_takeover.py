"""Adapter takeover (``providers.base`` Rule 5) on every pinned release of the real
agents, without a daemon: a real ``codex app-server`` or Claude Code against its
fake model server, a first adapter that made the handshake and started a turn, then
a second adapter over the same pipes that takes the agent over mid-turn and carries
on, as a new daemon does after a restart.

The first adapter stops at a frame boundary (``FrameGate``): what it had not read
stays in the agent's pipe, as the holder keeps what no daemon acknowledged. The
takeover state is built from what the first adapter's sink recorded, as the new
daemon builds it from the journal.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from agentsd.providers.acp import AcpProvider
from agentsd.providers.acp_agents import AcpAgent
from agentsd.providers.base import (
    Adapter,
    LineLink,
    PendingTakeover,
    Provider,
    Submission,
    Takeover,
)
from agentsd.providers.claude import ClaudeProvider
from agentsd.providers.codex import CodexProvider
from agentsd.store.sessions import SessionRow
from agentsd_protocol.api.events import Event
from tests.peers import fake_anthropic, fake_openai
from tests.peers.agents import CLAUDE_RELEASES
from tests.peers.test_releases import Agent
from tests.peers.test_releases import agent as agent
from tests.peers.test_releases import release as release
from tests.recording_sink import RecordingSink

TEST_TIMEOUT_S = 150.0  # two adapters, two turns of a real agent, a shared 2-core machine
STREAM_S = 3.0  # how long the first reply streams: the takeover lands inside it
DELTAS_BEFORE_STOP = 3  # the first adapter journals this many deltas before it stops
GENERATION = 2  # the taking-over adapter's lease generation
COMMAND = "echo hi >> hi.txt"  # appends: the file shows how many times it ran


class FrameGate(trio.abc.ReceiveStream):
    """The agent's stdout as the first adapter reads it, until ``stop``: then it
    gives the reader the rest of the line it is in, one byte at a time, and parks
    at that line's end (``parked``), leaving every later byte in the pipe."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._stopping = False
        self._reading: trio.CancelScope | None = None
        self._at_line_end = True  # nothing read yet
        self.parked = trio.Event()

    def stop(self) -> None:
        self._stopping = True
        if self._reading is not None:
            self._reading.cancel()  # a pipe read cancelled has consumed nothing

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if not self._stopping:
            with trio.CancelScope() as self._reading:
                data = bytes(await self._stream.receive_some(max_bytes))
                self._at_line_end = data.endswith(b"\n")
                return data
        if self._at_line_end:
            self.parked.set()
            await trio.sleep_forever()
        data = bytes(await self._stream.receive_some(1))
        self._at_line_end = data == b"\n"
        return data

    async def aclose(self) -> None:
        pass  # the pipe is the agent's, and outlives this reader


@contextlib.asynccontextmanager
async def launched(
    provider: Provider, row: SessionRow, env: dict[str, str], logs: Path
) -> AsyncIterator[trio.Process]:
    """``row``'s agent, launched as ``provider`` launches it; killed at the end."""
    spec = provider.launch(row, None, env)
    with (logs / "stderr.log").open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            spec.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=row.cwd,
            env={**env, **spec.env},
        )
    try:
        yield process
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            process.kill()
            await process.wait()


def session_row(
    provider: str,
    cwd: Path,
    *,
    options: dict[str, Any] | None = None,
    command: list[str] | None = None,
) -> SessionRow:
    return SessionRow(
        id="s-takeover",
        host_id="h",
        provider=provider,
        cwd=str(cwd),
        title=None,
        options=options or {},
        env={},
        command=command,
        provider_handle=None,
        created_at=0.0,
        updated_at=0.0,
    )


@contextlib.asynccontextmanager
async def spawned(agent: Agent) -> AsyncIterator[tuple[Provider, SessionRow, trio.Process]]:
    """The release's agent, launched as its provider launches it (the provider
    returned did)."""
    row = session_row(
        agent.release.provider,
        agent.work,
        options=dict(agent.options),
        command=agent.release.command(),
    )
    provider: Provider = ClaudeProvider() if agent.claude is not None else CodexProvider()
    async with launched(provider, row, {**os.environ, **agent.env}, agent.work.parent) as process:
        yield provider, row, process


class WatchedSink(RecordingSink):
    """A ``RecordingSink`` a test can wait on: ``until`` returns once what it
    recorded satisfies a check (the test's ``fail_after`` bounds the wait)."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = trio.Event()

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def emit(self, event: Event) -> int:
        seq = await super().emit(event)
        self._touch()
        return seq

    def delta(self, item_id: str, text: str) -> None:
        super().delta(item_id, text)
        self._touch()

    async def approval_requested(self, *args: Any, **kwargs: Any) -> str:
        approval_id = await super().approval_requested(*args, **kwargs)
        self._touch()
        return approval_id

    async def until(self, check: Callable[[WatchedSink], Any]) -> None:
        while not check(self):
            await self._changed.wait()


@attrs.frozen
class Before:
    """What the first adapter left: its sink, the handle and version it learned."""

    sink: WatchedSink
    handle: str
    version: str | None


async def first_adapter(
    provider: Provider,
    row: SessionRow,
    process: trio.Process,
    prompt: str,
    stop_when: Callable[[WatchedSink], bool],
) -> Before:
    """Handshake, send ``prompt``, then stop at the first frame boundary once
    ``stop_when`` holds; the agent keeps running, its pipes open."""
    assert process.stdin is not None and process.stdout is not None
    sink = WatchedSink()
    gate = FrameGate(process.stdout)
    adapter = provider.adapter(LineLink(process.stdin, gate), sink, row)
    handle = await adapter.handshake(None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(adapter.run)
        dispatch = await adapter.send(Submission("m-1", prompt))
        assert dispatch.outcome == "accepted", dispatch
        await sink.until(stop_when)
        gate.stop()
        await gate.parked.wait()
        nursery.cancel_scope.cancel()
    return Before(sink, handle, adapter.agent_version)


def takeover_state(before: Before, row: SessionRow) -> Takeover:
    """The takeover state a new daemon builds from the journal, here from the sink."""
    events = before.sink.events
    started = [b["turnId"] for k, b in events if k == "turn.started"]
    completed = [b["turnId"] for k, b in events if k == "turn.completed"]
    turn_open = len(started) > len(completed)
    done_items = {b["itemId"] for k, b in events if k == "item.completed"}
    open_items = {
        b["itemId"]: "".join(t for i, t in before.sink.deltas if i == b["itemId"])
        for k, b in events
        if k == "item.started" and b["itemId"] not in done_items
    }
    return Takeover(
        handle=before.handle,
        generation=GENERATION,
        turn_id=started[-1] if turn_open else None,
        turn_open=turn_open,
        approvals=tuple(
            PendingTakeover(
                native_id=a["nativeId"],
                approval_id=f"ap-{a['nativeId']}",
                kind=a["kind"],
                options=tuple(a["options"]),
                request=a["request"],
            )
            for a in before.sink.approvals
            if a["nativeId"] not in before.sink.cancelled
        ),
        undispatched=(),
        options=row.options,
        agent_version=before.version,
        open_items=open_items,
    )


async def second_adapter(
    provider: Provider, row: SessionRow, process: trio.Process, state: Takeover
) -> tuple[Adapter, WatchedSink]:
    assert process.stdin is not None and process.stdout is not None
    sink = WatchedSink()
    taken = attrs.evolve(row, provider_handle=state.handle, fence=row.fence + 1)
    adapter = provider.adapter(LineLink(process.stdin, process.stdout), sink, taken)
    await adapter.take_over(state)
    return adapter, sink


def turn_ends(sink: RecordingSink) -> list[dict[str, Any]]:
    return [b for k, b in sink.events if k == "turn.completed"]


def agent_messages(sink: RecordingSink, kind: str) -> list[dict[str, Any]]:
    return [b for k, b in sink.events if k == kind and b.get("type") == "agentMessage"]


def streamed(sink: RecordingSink, item_id: str) -> str:
    return "".join(text for i, text in sink.deltas if i == item_id)


async def test_a_turn_taken_over_mid_stream_completes_with_exactly_the_text_sent(
    agent: Agent,
) -> None:
    story = agent.say("Once upon a time", seconds=STREAM_S)
    agent.script(story, agent.say("And again."))
    with trio.fail_after(TEST_TIMEOUT_S):
        async with spawned(agent) as (provider, row, process):
            pid = process.pid

            def mid_stream(sink: WatchedSink) -> bool:
                return len(sink.deltas) >= DELTAS_BEFORE_STOP

            before = await first_adapter(provider, row, process, "Tell a story", mid_stream)
            state = takeover_state(before, row)
            assert state.turn_open and state.turn_id is not None
            (item,) = agent_messages(before.sink, "item.started")
            item_id = item["itemId"]
            assert item_id in state.open_items

            adapter, sink = await second_adapter(provider, row, process, state)
            await end_then_once_more(adapter, sink)

            assert process.pid == pid and process.poll() is None  # never restarted
            first_end = turn_ends(sink)[0]
            assert first_end["turnId"] == state.turn_id
            assert first_end["outcome"] == "completed"
            # Every delta once, in order, across the two adapters; the whole text
            # completes the item the first adapter started.
            before_text, after_text = streamed(before.sink, item_id), streamed(sink, item_id)
            assert before_text and after_text, "the takeover was not mid-stream"
            assert before_text + after_text == story.text
            assert state.open_items[item_id] == before_text
            completed = [
                b for b in agent_messages(sink, "item.completed") if b["itemId"] == item_id
            ]
            assert [b["text"] for b in completed] == [story.text]
            assert not [b for b in agent_messages(sink, "item.started") if b["itemId"] == item_id]
            # The agent got the second prompt in the same conversation.
            assert "Once more" in agent.user_texts()
            assert "Tell a story" in agent.user_texts()


async def end_then_once_more(adapter: Adapter, sink: WatchedSink) -> None:
    """Run the adapter that took over until the turn taken over ends; then the
    conversation goes on through it: a second turn, "Once more"."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(adapter.run)
        await sink.until(turn_ends)
        dispatch = await adapter.send(Submission("m-2", "Once more"))
        assert dispatch.outcome == "accepted", dispatch
        await sink.until(lambda s: len(turn_ends(s)) == 2)
        nursery.cancel_scope.cancel()


async def test_an_interrupt_written_before_the_new_adapter_reads_ends_the_turn_taken_over(
    agent: Agent,
) -> None:
    """As a daemon writes an interrupt its predecessor committed and never wrote
    (``agentsd.reattach`` Rule 2): right after ``take_over``, before the reader runs
    and without waiting for the agent's answer (``confirm=False``). The reply is
    held after its first piece, so only the interrupt can end the turn, and it ends
    interrupted; the next prompt is served."""
    held = threading.Event()
    agent.script(agent.say("Once upon a time", seconds=STREAM_S, hold=held), agent.say("Again."))
    try:
        with trio.fail_after(TEST_TIMEOUT_S):
            async with spawned(agent) as (provider, row, process):
                before = await first_adapter(
                    provider, row, process, "Tell a story", lambda sink: bool(sink.deltas)
                )
                state = takeover_state(before, row)
                assert state.turn_open and state.turn_id is not None
                adapter, sink = await second_adapter(provider, row, process, state)
                assert await adapter.interrupt(state.turn_id, confirm=False)
                await end_then_once_more(adapter, sink)
                assert process.poll() is None
    finally:
        held.set()
    first_end, second_end = turn_ends(sink)
    assert (first_end["turnId"], first_end["outcome"]) == (state.turn_id, "interrupted")
    assert second_end["outcome"] == "completed"
    assert "Once more" in agent.user_texts()


def tool_call(agent: Agent) -> Any:
    if agent.claude is not None:
        return fake_anthropic.ToolUseReply({"command": COMMAND, "description": "Append hi"})
    return fake_openai.ShellCall(COMMAND)


def tool_outputs(agent: Agent) -> list[str]:
    """The tool results every model call carried back (each call carries the whole
    conversation, so the last one has every result once)."""
    last = agent.requests()[-1]
    if agent.claude is not None:
        return [
            str(block.get("content"))
            for message in last.get("messages") or []
            for block in (message["content"] if isinstance(message["content"], list) else [])
            if block.get("type") == "tool_result"
        ]
    return list(fake_openai.shell_call_outputs(last))


async def test_an_approval_asked_before_a_takeover_and_answered_after_it_reaches_the_agent_once(
    agent: Agent,
) -> None:
    agent.script(tool_call(agent), agent.say("Done."))
    with trio.fail_after(TEST_TIMEOUT_S):
        async with spawned(agent) as (provider, row, process):
            before = await first_adapter(
                provider, row, process, "Append hi to hi.txt", lambda sink: bool(sink.approvals)
            )
            state = takeover_state(before, row)
            (pending,) = state.approvals
            assert pending.request is not None
            adapter, sink = await second_adapter(provider, row, process, state)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(adapter.run)
                decision = agent.allow(list(pending.options))
                await adapter.answer_approval(pending.native_id, decision)
                # A second answer (another client's) finds nothing left to answer.
                await adapter.answer_approval(pending.native_id, decision)
                await sink.until(turn_ends)
                nursery.cancel_scope.cancel()

            assert turn_ends(sink)[0]["turnId"] == state.turn_id
            assert turn_ends(sink)[0]["outcome"] == "completed"
            assert (agent.work / "hi.txt").read_text() == "hi\n"  # it ran once
            outputs = tool_outputs(agent)
            assert len(outputs) == 1, outputs
            assert not sink.approvals  # nothing asked twice


@pytest.mark.parametrize("release", CLAUDE_RELEASES, indirect=True, ids=lambda r: r.id)
async def test_a_prompt_claude_queued_before_a_takeover_runs_as_a_turn_after_it(
    agent: Agent,
) -> None:
    """A prompt sent during the turn the takeover lands in, which Claude Code runs
    once that turn ended: the new adapter journals it as a turn of its own."""
    agent.script(agent.say("Once upon a time", seconds=STREAM_S), agent.say("And again."))
    with trio.fail_after(TEST_TIMEOUT_S):
        async with spawned(agent) as (provider, row, process):
            assert process.stdin is not None and process.stdout is not None
            sink_a = WatchedSink()
            gate = FrameGate(process.stdout)
            first = provider.adapter(LineLink(process.stdin, gate), sink_a, row)
            handle = await first.handshake(None)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(first.run)
                for n, text in enumerate(("Tell a story", "And then?")):
                    dispatch = await first.send(Submission(f"m-{n}", text))
                    assert dispatch.outcome == "accepted", dispatch
                seen = len(sink_a.deltas)
                await sink_a.until(lambda s: len(s.deltas) >= seen + DELTAS_BEFORE_STOP)
                gate.stop()
                await gate.parked.wait()
                nursery.cancel_scope.cancel()
            before = Before(sink_a, handle, first.agent_version)
            state = takeover_state(before, row)
            assert state.turn_open
            adapter, sink = await second_adapter(provider, row, process, state)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(adapter.run)
                await sink.until(lambda s: len(turn_ends(s)) == 2)
                nursery.cancel_scope.cancel()
    turns = [(k, b["turnId"]) for k, b in sink.events if k in ("turn.started", "turn.completed")]
    assert turns[0] == ("turn.completed", state.turn_id)
    assert [k for k, _ in turns] == ["turn.completed", "turn.started", "turn.completed"]
    assert turns[1][1] == turns[2][1] != state.turn_id
    texts = [
        b["text"] for b in agent_messages(sink, "item.completed") if b["turnId"] == turns[1][1]
    ]
    assert texts == ["And again."]
    assert agent.user_texts().count("And then?") == 1


# -- an ACP agent (the tests' own, stdlib only) ---------------------------------------

ACP_AGENT = AcpAgent(
    "acp-test", (sys.executable, str(Path(__file__).with_name("acp_test_agent.py"))), "Test"
)


@contextlib.asynccontextmanager
async def acp_spawned(
    workdir: Path,
) -> AsyncIterator[tuple[Provider, SessionRow, trio.Process]]:
    provider = AcpProvider(ACP_AGENT)
    row = session_row(ACP_AGENT.name, workdir)
    async with launched(provider, row, dict(os.environ), workdir.parent) as process:
        yield provider, row, process


async def test_an_acp_turn_taken_over_mid_stream_streams_on_and_is_interrupted(
    workdir: Path,
) -> None:
    """The test agent streams words until cancelled: the new adapter streams the
    rest to the same item, its interrupt reaches the agent, and the answer to the
    earlier adapter's prompt ends the turn it took over."""
    with trio.fail_after(TEST_TIMEOUT_S):
        async with acp_spawned(workdir) as (provider, row, process):

            def mid_stream(sink: WatchedSink) -> bool:
                return len(sink.deltas) >= DELTAS_BEFORE_STOP

            before = await first_adapter(provider, row, process, "slow", mid_stream)
            state = takeover_state(before, row)
            (item,) = agent_messages(before.sink, "item.started")
            item_id = item["itemId"]
            adapter, sink = await second_adapter(provider, row, process, state)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(adapter.run)
                await sink.until(lambda s: any(i == item_id for i, _ in s.deltas))
                assert await adapter.interrupt(state.turn_id)
                await sink.until(turn_ends)
                # The same conversation serves the new adapter's next prompt.
                dispatch = await adapter.send(Submission("m-2", "hello again"))
                assert dispatch.outcome == "accepted", dispatch
                await sink.until(lambda s: len(turn_ends(s)) == 2)
                nursery.cancel_scope.cancel()
            assert process.poll() is None
    (end, _) = turn_ends(sink)
    assert end["turnId"] == state.turn_id and end["outcome"] == "interrupted"
    text = streamed(before.sink, item_id) + streamed(sink, item_id)
    completed = [b for b in agent_messages(sink, "item.completed") if b["itemId"] == item_id]
    assert [b["text"] for b in completed] == [text]
    assert text == "word " * (len(text) // 5) and streamed(sink, item_id)


async def test_an_acp_permission_asked_before_a_takeover_is_answered_once_after_it(
    workdir: Path,
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with acp_spawned(workdir) as (provider, row, process):
            before = await first_adapter(
                provider, row, process, "permission", lambda sink: bool(sink.approvals)
            )
            state = takeover_state(before, row)
            (pending,) = state.approvals
            adapter, sink = await second_adapter(provider, row, process, state)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(adapter.run)
                await adapter.answer_approval(pending.native_id, "yes")
                await adapter.answer_approval(pending.native_id, "yes")  # nothing more
                await sink.until(turn_ends)
                nursery.cancel_scope.cancel()
    (end,) = turn_ends(sink)
    assert end["turnId"] == state.turn_id and end["outcome"] == "completed"
    texts = [b["text"] for b in agent_messages(sink, "item.completed")]
    assert texts == ['outcome: {"outcome": "selected", "optionId": "yes"}']
    assert not [k for k, _ in sink.events if k == "agent.error"]
