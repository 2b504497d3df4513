"""The mock provider: the agent program in ``mock_agent.py`` behind the same adapter
path as the real providers. Tests and demos use it; its create-time options make it
misbehave on purpose (see ``mock_agent``)."""

from __future__ import annotations

import base64
import logging
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import trio

from agentsd.providers.base import (
    MAX_BAD_LINES,
    Adapter,
    Dispatch,
    FileInput,
    ImageInput,
    LaunchSpec,
    LineLink,
    OptionSpec,
    Provider,
    Resume,
    SessionSink,
    Submission,
    Takeover,
)
from agentsd.providers.mock_agent import COMMANDS, MODELS, OPTION_NAMES
from agentsd.store.sessions import SessionRow
from agentsd_protocol.api.controls import OptionChoice
from agentsd_protocol.api.events import (
    AgentCommand,
    AgentError,
    ItemCompleted,
    ItemStarted,
    TurnCompleted,
    TurnOutcome,
    TurnStarted,
)
from agentsd_protocol.errors import (
    AgentExited,
    AgentNotRunning,
    AgentProtocolError,
    InvalidParams,
)

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 10.0  # the mock acks at once; past this the dispatch is unknown
_OUTCOMES: dict[str | None, TurnOutcome] = {
    "completed": "completed",
    "interrupted": "interrupted",
    "failed": "failed",
}


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


# The model changes live (``set_model``), among the mock's own models only; every
# misbehaviour option applies when the mock agent starts.
OPTION_SPECS: dict[str, OptionSpec] = {
    "model": OptionSpec(
        applies_at="now", choices=tuple(MODELS), open=False, description="the mock's model"
    ),
    **{name: OptionSpec(applies_at="nextStart") for name in OPTION_NAMES},
}


class MockProvider(Provider):
    name = "mock"
    content_types = frozenset({"image", "file"})

    def launch(self, session: SessionRow, state_dir: Any, env: Mapping[str, str]) -> LaunchSpec:
        argv = list(session.command or [sys.executable, "-m", "agentsd.providers.mock_agent"])
        options = dict(session.options)
        options.setdefault("stateDir", str(Path(state_dir) / "mock"))
        return LaunchSpec(
            argv=argv, env={"AGENTSD_MOCK_OPTIONS": msgspec.json.encode(options).decode()}
        )

    def adapter(self, link: LineLink, sink: SessionSink, session: SessionRow) -> Adapter:
        return MockAdapter(link, sink)

    def option_specs(self) -> Mapping[str, OptionSpec]:
        return OPTION_SPECS


class MockAdapter(Adapter):
    supports_compact = True

    __slots__ = (
        "_acked_turns",
        "_acks",
        "_bad_lines",
        "_commands",
        "_exited",
        "_link",
        "_model_set",
        "_open_items",
        "_sink",
        "_starting",
        "_turn_id",
    )

    def __init__(self, link: LineLink, sink: SessionSink) -> None:
        self._link = link
        self._sink = sink
        self._acks: dict[str, trio.Event] = {}
        self._acked_turns: dict[str, str] = {}  # prompt id -> the turn its ack named
        self._starting: dict[str, list[trio.Event]] = {}  # acks waiting for turn.started
        self._turn_id: str | None = None
        # Items that streamed text, as a dict: an empty set costs four empty dicts.
        self._open_items: dict[str, None] = {}
        self._bad_lines = 0  # in a row (base Rule 3)
        self._commands: list[AgentCommand] = []  # from the handshake
        self._model_set: dict[str, trio.Event] = {}  # set_model requests, by model
        self._exited = False  # its output ended: nothing it said after counts

    async def handshake(self, resume: Resume | None) -> str:
        # The mock resumes any handle: one it never saved starts empty.
        resume_handle = None if resume is None else resume.handle
        await self._link.send({"type": "initialize", "handle": resume_handle})
        reply = await self._link.receive()
        if reply is None:
            raise AgentExited("the mock agent exited during its handshake")
        if reply.get("type") != "initialized" or not isinstance(reply.get("handle"), str):
            raise AgentProtocolError(f"unexpected handshake reply from the mock agent: {reply!r}")
        handle: str = reply["handle"]
        commands = reply.get("commands")
        self._commands = [
            AgentCommand(name=str(c["name"]), description=c.get("description"), hint=c.get("hint"))
            for c in (commands if isinstance(commands, list) else [])
            if isinstance(c, dict) and isinstance(c.get("name"), str)
        ]
        if resume_handle is not None and handle != resume_handle:
            raise AgentProtocolError(
                f"the mock agent resumed {handle!r} instead of {resume_handle!r}"
            )
        return handle

    async def take_over(self, state: Takeover) -> None:
        """The mock agent keeps its conversation itself; the adapter needs the open
        turn (an interrupt names it), the items whose ``item.started`` is journaled
        (not started again) and the commands its handshake listed (always the
        mock's own). Acks of prompts the earlier daemon sent are read again and
        passed over: nobody here waits for them."""
        self._turn_id = state.turn_id if state.turn_open else None
        self._open_items = dict.fromkeys(state.open_items)
        self._commands = [
            AgentCommand(name=c["name"], description=c.get("description"), hint=c.get("hint"))
            for c in COMMANDS
        ]
        await trio.lowlevel.checkpoint()

    async def run(self) -> None:
        try:
            while True:
                try:
                    frame = await self._link.receive()
                except AgentProtocolError as exc:
                    if self._link.broken:
                        raise  # base Rule 3: nothing more can be read
                    self._bad_lines += 1
                    if self._bad_lines > MAX_BAD_LINES:
                        raise AgentProtocolError(
                            f"{exc.message}: {self._bad_lines} such lines in a row, so its "
                            "output is not the mock protocol"
                        ) from None
                    # One bad line is reported and skipped; the agent may still be healthy.
                    await self._sink.emit(AgentError(message=exc.message))
                    continue
                if frame is None:
                    return
                self._bad_lines = 0
                await self._translate(frame)
        finally:
            # Acked, but their turn.started will never come: the agent did take them.
            for waiters in self._starting.values():
                for waiter in waiters:
                    waiter.set()
            self._starting.clear()
            self._exited = True
            # Not acked, and no ack can come now: their senders learn it at once
            # (the agent may or may not have read them: ``_dispatch``).
            for event in self._acks.values():
                event.set()
            for event in self._model_set.values():
                event.set()

    async def _translate(self, frame: dict[str, Any]) -> None:
        sink = self._sink
        match frame.get("type"):
            case "ack":
                prompt_id = str(frame.get("id"))
                event = self._acks.pop(prompt_id, None)
                if event is None:
                    return
                turn_id = frame.get("turnId")
                if not isinstance(turn_id, str) or turn_id == self._turn_id:
                    event.set()  # steered the running turn
                    return
                # A new turn: the send is confirmed once its turn.started is journaled,
                # so that an interrupt right after the send finds the turn running.
                self._acked_turns[prompt_id] = turn_id
                self._starting.setdefault(turn_id, []).append(event)
            case "turn_started":
                self._turn_id = str(frame.get("turnId"))
                await sink.emit(TurnStarted(turn_id=self._turn_id))
                for waiter in self._starting.pop(self._turn_id, []):
                    waiter.set()
            case "delta":
                item_id = str(frame.get("itemId"))
                if item_id not in self._open_items:
                    self._open_items[item_id] = None
                    await sink.emit(
                        ItemStarted(
                            item_id=item_id, turn_id=_str(frame.get("turnId")), type="agentMessage"
                        )
                    )
                sink.delta(item_id, str(frame.get("text", "")))
            case "message":
                item_id = str(frame.get("itemId"))
                self._open_items.pop(item_id, None)
                await sink.emit(
                    ItemCompleted(
                        item_id=item_id,
                        turn_id=_str(frame.get("turnId")),
                        type="agentMessage",
                        text=str(frame.get("text", "")),
                    )
                )
            case "tool_call":
                await sink.emit(
                    ItemCompleted(
                        item_id=str(frame.get("itemId")),
                        turn_id=_str(frame.get("turnId")),
                        type="toolCall",
                        name=_str(frame.get("name")),
                        input=frame.get("input"),
                        status=_str(frame.get("status")),
                    )
                )
            case "turn_completed":
                outcome = _str(frame.get("outcome"))
                await sink.emit(
                    TurnCompleted(
                        turn_id=_str(frame.get("turnId")),
                        outcome=_OUTCOMES.get(outcome, "unknown"),
                    )
                )
                self._turn_id = None
            case "approval_request":
                options = frame.get("options")
                tool_id = frame.get("itemId")  # the tool call it asks to run
                await sink.approval_requested(
                    native_id=str(frame.get("requestId")),
                    kind=str(frame.get("kind", "command")),
                    title=str(frame.get("title", "")),
                    detail=str(frame.get("detail", "")),
                    options=[str(o) for o in options]
                    if isinstance(options, list)
                    else ["accept", "decline"],
                    item_id=tool_id if isinstance(tool_id, str) else None,
                )
            case "model_set":
                event = self._model_set.pop(str(frame.get("model")), None)
                if event is not None:
                    event.set()
            case "interrupt_result":
                # The mock's answer to an interrupt with no turn running (or another
                # turn): nothing to do, but an interrupt written twice shows here.
                log.info("the mock agent had no turn to interrupt")
            case "error":
                await sink.emit(AgentError(message=str(frame.get("message", ""))))
            case other:
                await sink.emit(
                    AgentError(message=f"unknown frame type {other!r} from the mock agent")
                )

    async def send(self, submission: Submission) -> Dispatch:
        return await self._dispatch(submission.client_message_id, prompt_frame(submission))

    async def _dispatch(self, frame_id: str, frame: dict[str, Any]) -> Dispatch:
        """Write a frame the mock acks (a prompt, a command) and wait for its ack."""
        acked = trio.Event()
        self._acks[frame_id] = acked
        try:
            await self._link.send(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._acks.pop(frame_id, None)
            return Dispatch(outcome="rejected", reason="the agent is not running")
        with trio.move_on_after(ACK_TIMEOUT_S):
            if not self._exited:
                await acked.wait()
            # Its ack takes it out of ``_acks``; still there, the reading stopped first.
            if frame_id not in self._acks:
                turn_id = self._acked_turns.pop(frame_id, self._turn_id)
                return Dispatch(outcome="accepted", turn_id=turn_id)
        self._acks.pop(frame_id, None)
        self._acked_turns.pop(frame_id, None)
        if self._exited:
            return Dispatch(
                outcome="unknown", reason="the agent stopped before it confirmed delivery"
            )
        return Dispatch(outcome="unknown", reason="the agent did not confirm delivery")

    async def option_choices(self) -> Mapping[str, list[OptionChoice]]:
        return {"model": [OptionChoice(value=m, default=m == MODELS[0]) for m in MODELS]}

    async def apply_options(self, changes: Mapping[str, Any]) -> None:
        for key, value in changes.items():
            if key != "model":
                raise InvalidParams(f"Invalid params: the mock cannot change {key!r} live")
            answered = self._model_set[str(value)] = trio.Event()
            try:
                await self._link.send({"type": "set_model", "model": value})
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise AgentNotRunning("the mock agent is not running") from None
            with trio.move_on_after(ACK_TIMEOUT_S):
                await answered.wait()
            if self._exited:
                raise AgentNotRunning("the mock agent exited before it confirmed its model")
            if not answered.is_set():
                raise AgentProtocolError("the mock agent did not confirm its model")

    async def agent_commands(self) -> list[AgentCommand]:
        return list(self._commands)

    async def compact(self) -> Dispatch:
        return await self.run_command("compact", None)

    async def run_command(self, name: str, args: str | None) -> Dispatch:
        frame_id = uuid.uuid4().hex
        frame = {"type": "command", "id": frame_id, "name": name, "args": args}
        return await self._dispatch(frame_id, frame)

    async def interrupt(self, turn_id: str | None, *, confirm: bool = True) -> bool:
        if self._turn_id is None:
            return False
        await self._link.send({"type": "interrupt", "turnId": turn_id or self._turn_id})
        return True

    async def answer_approval(self, native_id: str, decision: str) -> None:
        await self._link.send(
            {"type": "approval_response", "requestId": native_id, "decision": decision}
        )


def prompt_frame(submission: Submission) -> dict[str, Any]:
    """The mock agent's ``prompt`` frame, with images (base64) and files when any."""
    frame: dict[str, Any] = {
        "type": "prompt",
        "id": submission.client_message_id,
        "text": submission.text,
    }
    images = [
        {"mediaType": i.media_type, "data": base64.b64encode(i.data).decode()}
        for i in submission.inputs
        if isinstance(i, ImageInput)
    ]
    files = [i.path for i in submission.inputs if isinstance(i, FileInput)]
    if images:
        frame["images"] = images
    if files:
        frame["files"] = files
    return frame
