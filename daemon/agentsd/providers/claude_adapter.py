"""The adapter that speaks to one Claude Code child in stream-json mode.

Facts this module relies on, checked against Claude Code 2.1.332 (the one bundled in
``claude-agent-sdk`` 0.2.189) and 2.1.197 (npm, June 2026) talking to a fake
Messages API:

- ``control_request {subtype: initialize}`` is answered by a ``control_response``
  carrying ``pid``; 2.1.332 adds ``claude_code_version`` and ``capabilities``,
  2.1.197 has neither. ``system/init`` (with the session id and, in both,
  ``claude_code_version``) comes only with each user message, never at start.
- ``--resume`` of an unknown id answers with a ``result`` (``errors: ["No
  conversation found with session ID: <id>"]``) instead of the initialize response,
  and exits 1 (2.1.197 and 2.1.332).
- 2.1.332 reports a ``user`` frame carrying a ``uuid`` at once by
  ``command_lifecycle {command_uuid, state: queued}`` and later ``started`` /
  ``completed`` / ``cancelled``; 2.1.197 has no ``command_lifecycle``. The
  ``--replay-user-messages`` echo (``isReplay: true``, same ``uuid``) comes only
  when the CLI takes the message up: after a running turn, after every retry of a
  failing model call, and in 2.1.197 only once the first block of the reply has
  streamed. Either counts as delivery.
- Both read stdin in order and answer a control request at once, even mid-turn:
  the answer to one written after a prompt proves the prompt was read (Rule 4).
- A message sent while a turn runs is folded into that turn at its next model call
  (one ``result`` for both), or, when the turn makes no further call, runs after it
  with a ``result`` of its own. An interrupt leaves queued messages queued.
- One ``assistant`` frame per content block, before that block's
  ``content_block_stop``; ``stream_event`` frames carry ``api_message_id``.
- An interrupt leaves a message sent mid-turn and not yet taken up in the CLI's
  queue (its answer lists it: ``still_queued``), and the CLI runs it as a turn of
  its own once the interrupted one ended. ``cancel_async_message {message_uuid}``
  drops such a message (``cancelled: true``), in both releases.
- An interrupt ends the turn with ``result {subtype: error_during_execution}``; a
  pending ``can_use_tool`` is withdrawn with ``control_cancel_request``. A failed
  model call ends it with ``subtype: success, is_error: true`` and
  ``api_error_status`` (or ``api_error: connection_failed``), after
  ``system/api_retry`` frames (10 retries by default, over minutes; even for 401).
- The CLI echoes our ``control_response`` frames back; unknown ids are ignored.

Rule 1 (one reader): ``handshake`` and then ``run`` are the only readers of the
child's output. ``send`` and ``interrupt`` wait, with a deadline, on events the
reader sets; when the output ends every waiter is released.

Rule 2 (turns): a turn starts when a prompt is sent while none runs, and ends with
the ``result`` that leaves none of our prompts waiting to be taken up; a prompt
still waiting then starts the next turn. ``turn.started`` is journaled just after
the prompt is written (the CLI starts one commit earlier) and the reader handles no
frame until it is, so every event of the turn follows it in the journal.

Rule 3: every control request of the CLI is answered (``claude_permissions``).

Rule 4 (delivery on every release): until the CLI has shown a ``command_lifecycle``
frame, each prompt is followed by a read barrier, an ``mcp_status`` control request
(read-only, answered in milliseconds by both releases); its answer, success or error,
acknowledges the prompt. Without it a prompt to 2.1.197 during a turn would wait for
that turn's end, past ``ACK_TIMEOUT_S``.

Rule 5 (versions): the version the handshake reports is judged here (a known one
below ``MIN_VERSION`` is refused); a handshake without one is accepted, and the
daemon asks the binary (``agentsd.providers.versions``).

Rule 6 (an interrupt starts nothing): before interrupting, every prompt of ours
the CLI has not taken up is dropped from its queue, and again any its answer
reports ``still_queued``; each one dropped is journaled ``submission.dispatched``
``rejected`` (the user's text is theirs again, never run unasked).

Rule 7 (takeover, base Rule 5): an adapter that takes over a running CLI
restores the session id, the open turn, the open items and the pending
``can_use_tool`` questions, writes nothing, and names its control requests
``agentsd-g<generation>-<n>``, which no earlier adapter used; it learns again
whether the CLI shows ``command_lifecycle`` (until then prompts get a barrier). A
prompt the earlier adapter wrote that the CLI takes up only after the turn ended
(its replay echo, no turn running) runs as a turn of its own.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import logging
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import msgspec
import trio

from agentsd.holder_link import unkeyed
from agentsd.providers.base import (
    Adapter,
    Dispatch,
    ImageInput,
    LineLink,
    Resume,
    SessionSink,
    Submission,
    Takeover,
)
from agentsd.providers.claude_events import (
    call_context_tokens,
    is_auth_retry,
    result_error_text,
    retry_error,
    turn_completed,
    usage_updated,
)
from agentsd.providers.claude_items import Items
from agentsd.providers.claude_permissions import Permissions
from agentsd.providers.claude_transcript import transcript_history
from agentsd.providers.programs import CLAUDE
from agentsd.providers.versions import refuse_if_too_old
from agentsd_protocol.api.controls import OptionChoice
from agentsd_protocol.api.events import (
    AgentCommand,
    AgentError,
    ErrorInfo,
    Event,
    SubmissionDispatched,
    ThreadSuperseded,
    TurnCompleted,
    TurnStarted,
)
from agentsd_protocol.errors import (
    AgentExited,
    AgentNotRunning,
    AgentProtocolError,
    AgentStartFailed,
    InvalidParams,
    ResumeFailed,
    RpcError,
)

log = logging.getLogger(__name__)

# Rule 3 of ``claude``: the permission mode as every release spells it.
PERMISSION_MODE_FLAGS = {"manual": "default"}
MIN_VERSION = (2, 0, 0)  # the control protocol, --replay-user-messages, --session-id
BARRIER = {"subtype": "mcp_status"}  # Rule 4: read-only, answered at once mid-turn
ACK_TIMEOUT_S = 15.0  # an initialized CLI reports a prompt queued within milliseconds
CONTROL_TIMEOUT_S = 10.0  # an interrupt is answered within milliseconds
AUTH_ATTEMPTS = 2  # one retry may follow a token refresh; a second 401 means bad credentials
MAX_BAD_LINES = 32  # consecutive non-JSON lines: past this the stream is not stream-json
_clip_encoder = msgspec.json.Encoder()


def _clip(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else _clip_encoder.encode(value).decode()
    return text if len(text) <= limit else text[:limit] + "..."


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@attrs.define(eq=False)
class _Control:
    """A control request of ours waiting for its response."""

    subtype: str
    done: trio.Event = attrs.field(factory=trio.Event)
    response: dict[str, Any] | None = None
    error: str | None = None
    barrier_for: str | None = None  # Rule 4: the prompt its answer acknowledges

    def settle(self, response: dict[str, Any] | None = None, error: str | None = None) -> None:
        if not self.done.is_set():
            self.response = response
            self.error = error
            self.done.set()


class ClaudeAdapter(Adapter):
    """Speaks to one Claude Code child. Its state belongs to the reader (Rule 1),
    except what ``send`` and ``interrupt`` register before they write (an ack to
    wait for, a turn, a control request), and the question ``answer_approval``
    takes out of ``Permissions``."""

    supports_compact = True

    def __init__(
        self,
        link: LineLink,
        sink: SessionSink,
        *,
        session_id: str,
        replaces: str | None = None,
        transcript: Path | None = None,
        launched: bool = True,
    ) -> None:
        """``launched``: the provider launched the child for ``session_id``; one it
        did not (an agent an earlier daemon started) can only be taken over."""
        self._link = link
        self._launched = launched
        self._taken_over = False  # Rule 7
        self._sink = sink
        self.session_id = session_id  # chosen at launch; system/init must agree
        self._replaces = replaces  # the id without a transcript it was launched over
        self._transcript = transcript  # the resumed session's, for this cwd
        self._ids = itertools.count(1)
        self._id_prefix = "agentsd-"  # Rule 7: per generation once taken over
        self._controls: dict[str, _Control] = {}
        self._closed = False
        self._bad_lines = 0
        # Prompts: an event per prompt awaiting its delivery ack, and the prompts the
        # CLI has not taken up yet (Rule 2).
        self._acks: dict[str, trio.Event] = {}
        self._delivered: set[str] = set()
        self._cmids: dict[str, str] = {}  # our message uuid -> the submission it carries
        self._waiting: set[str] = set()
        # The running turn.
        self._turn_id: str | None = None
        self._interrupt_requested = False
        self._failure: ErrorInfo | None = None  # diagnosed before the result
        self._turn_journaled = trio.Event()  # Rule 2: the reader's gate
        self._turn_journaled.set()
        self._items = Items(sink)
        self._permissions = Permissions(link, sink)
        # What the CLI showed of itself: its version (handshake) and whether it
        # reports prompts with command_lifecycle (Rule 4).
        self._version: str | None = None
        self._lifecycle = False
        # From initialize's answer: the models and slash commands it offers.
        self._models: list[OptionChoice] = []
        self._commands: list[AgentCommand] = []
        # Usage: the tokens of every turn since it started, and the size of the
        # conversation as of the last model call.
        self._usage_total: dict[str, int] = {}
        self._context_tokens: int | None = None

    @property
    def agent_version(self) -> str | None:
        return self._version

    # -- control requests of ours -----------------------------------------------------

    async def _control(
        self, request: dict[str, Any], *, barrier_for: str | None = None
    ) -> _Control:
        """Send a control request; its response arrives through the reader. Raises
        ``trio.BrokenResourceError`` (or Closed) when the child is gone."""
        if self._closed:
            raise trio.ClosedResourceError("claude has exited")
        request_id = f"{self._id_prefix}{next(self._ids)}"
        control = _Control(str(request.get("subtype")), barrier_for=barrier_for)
        self._controls[request_id] = control
        try:
            await self._link.send(
                {"type": "control_request", "request_id": request_id, "request": request}
            )
        except BaseException:
            self._controls.pop(request_id, None)
            raise
        return control

    # -- the handshake ----------------------------------------------------------------

    async def handshake(self, resume: Resume | None) -> str:
        if not self._launched:
            raise AgentStartFailed(
                f"claude for session {self.session_id} was not launched by agentsd"
            )
        resuming = resume is not None and self._replaces is None
        if resume is not None:
            self._replace(resume)
        control = await self._control({"subtype": "initialize", "hooks": None})
        while not control.done.is_set():
            frame = await self._receive(strict=True)
            if frame is None:
                raise AgentExited(
                    "claude exited during its handshake (its stderr log in the state "
                    "directory says why)"
                )
            if frame.get("type") == "result":
                words = result_error_text(frame)
                if resuming:
                    raise ResumeFailed(
                        f"claude could not resume session {self.session_id}: {words}"
                    )
                raise AgentStartFailed(f"claude could not open session {self.session_id}: {words}")
            await self._handle(frame)
        if control.error is not None:
            raise AgentStartFailed(f"claude refused initialize: {control.error}")
        # Rule 5: an answered initialize is the feature that matters; the version,
        # when the release reports it, is checked against the minimum.
        self._models, self._commands = _offered(_dict(control.response))
        reported = _dict(control.response).get("claude_code_version")
        if isinstance(reported, str) and reported:
            refuse_if_too_old(CLAUDE, reported, MIN_VERSION)
            self._version = reported
        return self.session_id

    async def take_over(self, state: Takeover) -> None:
        """Carry on with a Claude Code an earlier adapter initialized (Rule 7):
        nothing is written."""
        if self._launched and state.handle != self.session_id:
            raise ResumeFailed(
                f"claude was launched for session {self.session_id}, not {state.handle}"
            )
        self.session_id = state.handle
        self._taken_over = True
        self._id_prefix = f"agentsd-g{state.generation}-"
        self._version = state.agent_version
        if state.turn_open:
            self._open_turn()
            if state.turn_id is not None:
                self._turn_id = state.turn_id
        self._items.restore(state.open_items)
        for approval in state.approvals:
            self._permissions.restore(approval)

    def _replace(self, resume: Resume) -> None:
        """Check ``resume`` against the launch: it resumes ``session_id``, or it has no
        transcript and was replaced (``claude`` Rule 2), which supersedes it when it
        never had a turn. Raises ``ResumeFailed`` when it had turns, and when an
        adopted session has no transcript for this cwd."""
        if resume.adopt and (
            resume.handle != self.session_id
            or self._replaces is not None
            or self._transcript is None
            or not self._transcript.is_file()
        ):
            raise ResumeFailed(
                f"claude has no session {resume.handle} to adopt for this directory "
                "(no transcript of it under projects/ of its config directory for this cwd "
                "and account)"
            )
        if resume.handle == self.session_id and self._replaces is None:
            return
        if resume.handle != self._replaces:
            raise AgentStartFailed(
                f"claude was launched for session {self.session_id}, not {resume.handle}"
            )
        if resume.had_turns:
            raise ResumeFailed(
                f"claude has no transcript of session {resume.handle}, which had turns "
                f"(no {resume.handle}.jsonl under its config directory's projects/); agentsd "
                "will not start a new conversation in its place"
            )
        self.superseded = ThreadSuperseded(
            previous_handle=resume.handle,
            handle=self.session_id,
            reason=f"claude never saved session {resume.handle}, which had no turn: "
            "it has no transcript",
        )

    async def imported_history(self) -> list[Event]:
        """The adopted session's messages, from its transcript."""
        path = self._transcript
        if path is None:
            return []
        try:
            return list(await trio.to_thread.run_sync(transcript_history, path))
        except OSError as exc:
            raise ResumeFailed(
                f"claude's transcript of session {self.session_id} cannot be read: {exc.strerror}"
            ) from None

    # -- the reader -------------------------------------------------------------------

    async def _receive(self, *, strict: bool) -> dict[str, Any] | None:
        """The next frame, or None at EOF. A line that is not a JSON object raises
        ``AgentProtocolError`` when ``strict`` or after ``MAX_BAD_LINES`` in a row;
        otherwise it is journaled and skipped (the agent may still be healthy)."""
        while True:
            line = await self._link.receive_line()
            if line is None:
                return None
            try:
                frame = msgspec.json.decode(line)
            except msgspec.DecodeError:
                frame = None
            if isinstance(frame, dict):
                self._bad_lines = 0
                return frame
            problem = f"claude wrote a line that is not a JSON object: {line[:200]!r}"
            self._bad_lines += 1
            if strict or self._bad_lines > MAX_BAD_LINES:
                raise AgentProtocolError(problem)
            await self._sink.emit(AgentError(error_kind=AgentProtocolError.kind, message=problem))

    async def run(self) -> None:
        try:
            while (frame := await self._receive(strict=False)) is not None:
                if not self._turn_journaled.is_set():
                    await self._turn_journaled.wait()
                await self._handle(frame)
        finally:
            # Rule 1: nobody waits for an answer that can no longer come.
            self._closed = True
            for control in self._controls.values():
                control.settle(error="claude exited before answering")
            self._controls.clear()
            for event in self._acks.values():
                event.set()

    async def _handle(self, frame: dict[str, Any]) -> None:
        match frame.get("type"):
            case "stream_event":
                await self._items.on_stream_event(frame, self._turn_id)
            case "assistant":
                # A failed model call's prose comes as a synthetic assistant message;
                # the turn's result carries it, with its kind.
                if not frame.get("is_api_error_message"):
                    context = call_context_tokens(frame.get("message"))
                    if context is not None:
                        self._context_tokens = context
                    await self._items.on_assistant(frame, self._turn_id)
            case "user":
                if frame.get("isReplay"):
                    await self._foreign_prompt(frame.get("uuid"))
                    self._taken_up(frame.get("uuid"), picked=True)
                else:
                    await self._items.on_tool_results(frame, self._turn_id)
            case "result":
                await self._on_result(frame)
            case "system":
                await self._on_system(frame)
            case "command_lifecycle":
                self._on_lifecycle(frame)
            case "control_request":
                await self._permissions.on_request(frame)
            case "control_response":
                self._on_control_response(frame)
            case "control_cancel_request":
                await self._permissions.on_cancel(frame)
            case _:
                # Progress, rate-limit and keep-alive frames: nothing to journal.
                pass

    # -- prompts and turns (Rule 2) ---------------------------------------------------

    def _taken_up(self, message_uuid: Any, *, picked: bool, dropped: bool = False) -> None:
        """``message_uuid`` reached the CLI; ``picked``: it no longer waits in its
        queue, ``dropped``: because it was cancelled (Rule 6 journals that)."""
        if not isinstance(message_uuid, str):
            return
        event = self._acks.get(message_uuid)
        if event is not None:
            self._delivered.add(message_uuid)
            event.set()
        if picked:
            self._waiting.discard(message_uuid)
            if not dropped:
                self._cmids.pop(message_uuid, None)

    async def _foreign_prompt(self, message_uuid: Any) -> None:
        """Rule 7: a prompt the earlier adapter wrote, taken up by the CLI once the
        turn it was sent into had ended, runs as a turn of its own."""
        ours = message_uuid in self._acks or message_uuid in self._waiting
        if self._taken_over and self._turn_id is None and not ours:
            await self._sink.emit(TurnStarted(turn_id=self._open_turn()))

    def _on_lifecycle(self, frame: dict[str, Any]) -> None:
        self._lifecycle = True
        state = frame.get("state")
        self._taken_up(
            frame.get("command_uuid"), picked=state != "queued", dropped=state == "cancelled"
        )

    def _open_turn(self) -> str:
        """Mint the next turn and make it the running one. Synchronous, so that a
        concurrent ``send`` joins this turn instead of opening another."""
        self._turn_id = f"turn-{uuid.uuid4().hex[:16]}"
        self._interrupt_requested = False
        self._failure = None
        return self._turn_id

    async def _end_turn(self, done: TurnCompleted) -> None:
        # A prompt the CLI cancelled with the turn waits no more: forget its id.
        self._cmids = {u: c for u, c in self._cmids.items() if u in self._waiting}
        self._turn_id = None
        self._interrupt_requested = False
        self._failure = None
        await self._sink.emit(done)

    async def send(self, submission: Submission) -> Dispatch:
        return await self._send(submission, command=False)

    async def _send(self, submission: Submission, *, command: bool) -> Dispatch:
        """Write a user message. A ``command`` (``/NAME``) is run by the CLI itself:
        2.1.197 never echoes it as taken up, so it does not wait to be (Rule 2): the
        turn it runs ends with its result."""
        if self._closed:
            return Dispatch(outcome="rejected", reason="the agent is not running")
        message_uuid = str(uuid.uuid4())
        acked = trio.Event()
        self._acks[message_uuid] = acked
        if not command:
            self._waiting.add(message_uuid)
            self._cmids[message_uuid] = submission.client_message_id
        turn_id = self._turn_id
        gate: trio.Event | None = None
        if turn_id is None:
            turn_id = self._open_turn()
            # Rule 2: the reader waits for turn.started to be journaled.
            gate = self._turn_journaled = trio.Event()
        try:
            try:
                await self._link.send(
                    {
                        "type": "user",
                        "message": {"role": "user", "content": user_content(submission)},
                        "parent_tool_use_id": None,
                        "session_id": self.session_id,
                        "uuid": message_uuid,
                    }
                )
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._acks.pop(message_uuid, None)
                self._waiting.discard(message_uuid)
                self._cmids.pop(message_uuid, None)
                if gate is not None and self._turn_id == turn_id:
                    self._turn_id = None  # it never started
                return Dispatch(outcome="rejected", reason="the agent is not running")
            if gate is not None:
                try:
                    await self._sink.emit(TurnStarted(turn_id=turn_id))
                except RpcError as exc:
                    # The prompt is written: its dispatch outcome must say so, whatever
                    # became of the journal.
                    log.warning("could not journal the start of %s: %s", turn_id, exc.message)
        finally:
            if gate is not None:
                gate.set()
        try:
            if not self._lifecycle:
                # Rule 4; a child that is gone releases the wait below by itself.
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._control(BARRIER, barrier_for=message_uuid)
            with trio.move_on_after(ACK_TIMEOUT_S):
                await acked.wait()
        finally:
            self._acks.pop(message_uuid, None)
        if message_uuid in self._delivered:
            self._delivered.discard(message_uuid)
            return Dispatch(outcome="accepted", turn_id=turn_id)
        return Dispatch(outcome="unknown", reason="claude did not confirm delivery")

    async def interrupt(self, turn_id: str | None, *, confirm: bool = True) -> bool:
        """Drop our prompts the CLI has not taken up (Rule 6), then interrupt. The
        drops are written unkeyed: a caller's key (``agentsd.delivery`` Rule 3) goes
        with the interrupt itself, so a daemon dying between the two leaves it
        unwritten for the next one to write. Not ``confirm``: True once written."""
        if self._turn_id is None or self._closed:
            return False
        self._interrupt_requested = True
        try:
            with unkeyed():
                await self._drop_waiting(set(self._waiting))
            control = await self._control({"subtype": "interrupt"})
            if not confirm:
                return True
            with trio.move_on_after(CONTROL_TIMEOUT_S):
                await control.done.wait()
            still = _dict(control.response).get("still_queued")
            if isinstance(still, list):
                await self._drop_waiting({u for u in still if u in self._waiting})
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return control.done.is_set() and control.error is None

    async def _drop_waiting(self, uuids: set[str]) -> None:
        """``cancel_async_message`` each of ``uuids``; journal each one dropped."""
        for message_uuid in sorted(uuids):
            control = await self._control(
                {"subtype": "cancel_async_message", "message_uuid": message_uuid}
            )
            with trio.move_on_after(CONTROL_TIMEOUT_S):
                await control.done.wait()
            cmid = self._cmids.pop(message_uuid, None)
            if _dict(control.response).get("cancelled") is not True:
                continue  # already taken up: the interrupt ends it with the turn
            self._waiting.discard(message_uuid)
            if cmid is not None:
                await self._sink.emit(
                    SubmissionDispatched(
                        client_message_id=cmid,
                        outcome="rejected",
                        reason="withdrawn unsent: the turn it was steered into was interrupted "
                        "before claude took it up",
                    )
                )

    async def _on_result(self, frame: dict[str, Any]) -> None:
        turn_id = self._turn_id
        await self._items.close_open(turn_id, interrupted=self._interrupt_requested)
        if turn_id is None:
            # Not a turn of ours (the CLI ran something on its own): report failures.
            if frame.get("is_error") is not False:
                await self._sink.emit(
                    AgentError(error_kind="agent_error", message=result_error_text(frame))
                )
            return
        if isinstance(frame.get("usage"), dict):
            await self._sink.emit(
                usage_updated(frame, turn_id, self._usage_total, self._context_tokens)
            )
        done = turn_completed(
            frame,
            turn_id,
            interrupt_requested=self._interrupt_requested,
            failure=self._failure,
        )
        await self._end_turn(done)
        if self._waiting:
            await self._sink.emit(TurnStarted(turn_id=self._open_turn()))

    async def _on_system(self, frame: dict[str, Any]) -> None:
        match frame.get("subtype"):
            case "init":
                reported = frame.get("session_id")
                if reported != self.session_id:
                    raise AgentProtocolError(
                        f"claude reports session {reported!r} but was started for {self.session_id}"
                    )
            case "api_retry":
                await self._sink.emit(retry_error(frame, self._turn_id))
                attempt = frame.get("attempt")
                if (
                    is_auth_retry(frame)
                    and isinstance(attempt, int)
                    and attempt >= AUTH_ATTEMPTS
                    and self._turn_id is not None
                    and self._failure is None
                ):
                    await self._give_up_auth(frame)
            case _:
                pass

    async def _give_up_auth(self, frame: dict[str, Any]) -> None:
        """Refused credentials do not heal with time: end the turn now instead of
        after the CLI's remaining retries (minutes of backoff)."""
        self._failure = failure = ErrorInfo(
            kind="auth_refused",
            message=f"the model server refused the credentials (HTTP "
            f"{frame.get('error_status')}); check the API key or log in again",
        )
        await self._sink.emit(
            AgentError(
                error_kind=failure.kind,
                message=failure.message,
                turn_id=self._turn_id,
                will_retry=False,
            )
        )
        # A child that is gone cannot be interrupted; its exit settles the turn.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self._control({"subtype": "interrupt"})

    # -- responses to ours, and the CLI's own requests (Rule 3) -------------------------

    def _on_control_response(self, frame: dict[str, Any]) -> None:
        response = _dict(frame.get("response"))
        request_id = response.get("request_id")
        control = self._controls.pop(request_id, None) if isinstance(request_id, str) else None
        if control is None:
            # An echo of our own answer to the CLI's request, or (Rule 7) the answer
            # to an earlier adapter's request.
            if isinstance(request_id, str) and request_id.startswith("agentsd-"):
                log.info("claude answered %s, which this adapter never sent: ignored", request_id)
            return
        if control.barrier_for is not None:
            self._taken_up(control.barrier_for, picked=False)  # Rule 4
        if response.get("subtype") == "success":
            control.settle(response=_dict(response.get("response")))
        else:
            control.settle(error=_clip(response.get("error") or "an error without a message"))

    async def answer_approval(self, native_id: str, decision: str) -> None:
        await self._permissions.answer(native_id, decision)

    # -- conversation controls --------------------------------------------------------

    async def option_choices(self) -> dict[str, list[OptionChoice]]:
        return {"model": list(self._models)} if self._models else {}

    async def apply_options(self, changes: Mapping[str, Any]) -> None:
        """``set_model`` and ``set_permission_mode`` control requests, one per change,
        each answered before the next. Raises ``InvalidParams`` with the CLI's words
        when it refused one, ``AgentNotRunning`` when it is gone."""
        for key, value in sorted(changes.items()):
            match key:
                case "model":
                    request = {"subtype": "set_model", "model": value}
                case "permissionMode":
                    mode = PERMISSION_MODE_FLAGS.get(value, value)
                    request = {"subtype": "set_permission_mode", "mode": mode}
                case _:
                    raise InvalidParams(f"Invalid params: claude cannot change {key!r} live")
            try:
                control = await self._control(request)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise AgentNotRunning("claude is not running") from None
            with trio.move_on_after(CONTROL_TIMEOUT_S):
                await control.done.wait()
            if not control.done.is_set():
                raise AgentProtocolError(
                    f"claude did not answer {request['subtype']} within {CONTROL_TIMEOUT_S:g} s"
                )
            if control.error is not None:
                raise InvalidParams(
                    f"Invalid params: claude refused {key} {value!r}: {control.error}", option=key
                )

    async def agent_commands(self) -> list[AgentCommand]:
        return list(self._commands)

    async def compact(self) -> Dispatch:
        """``/compact`` as a prompt: Claude Code runs its slash commands from its input."""
        return await self.run_command("compact", None)

    async def run_command(self, name: str, args: str | None) -> Dispatch:
        text = f"/{name} {args}" if args else f"/{name}"
        submission = Submission(client_message_id=uuid.uuid4().hex, text=text)
        return await self._send(submission, command=True)


def _offered(answer: dict[str, Any]) -> tuple[list[OptionChoice], list[AgentCommand]]:
    """The models (``value``, ``displayName``, ``description``) and slash commands
    (``name``, ``description``, ``argumentHint``) of initialize's answer."""
    models = [
        OptionChoice(
            value=m["value"],
            label=m.get("displayName") if isinstance(m.get("displayName"), str) else None,
            description=m.get("description") if isinstance(m.get("description"), str) else None,
            default=m["value"] == "default",
        )
        for m in answer.get("models") or []
        if isinstance(m, dict) and isinstance(m.get("value"), str)
    ]
    commands = [
        AgentCommand(
            name=c["name"].lstrip("/"),
            description=c.get("description") if isinstance(c.get("description"), str) else None,
            hint=c.get("argumentHint") if isinstance(c.get("argumentHint"), str) else None,
        )
        for c in answer.get("commands") or []
        if isinstance(c, dict) and isinstance(c.get("name"), str) and c["name"].strip("/")
    ]
    return models, commands


def user_content(submission: Submission) -> str | list[dict[str, Any]]:
    """A prompt as the content of Claude Code's ``user`` message: its text alone
    (file references as ``@path`` lines, as Claude Code's UI writes them), or, with
    images, the Messages API's blocks: each image as base64 (the bytes the daemon
    kept), then the text (the order the Messages API advises)."""
    text = submission.text + submission.file_note()
    images = [i for i in submission.inputs if isinstance(i, ImageInput)]
    if not images:
        return text
    blocks: list[dict[str, Any]] = [
        {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": image.media_type,
                "data": base64.b64encode(image.data).decode(),
            },
        }
        for image in images
    ]
    if text:
        blocks.append({"type": "text", "text": text})
    return blocks
