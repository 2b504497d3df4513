"""The ``codex`` provider: ``codex app-server`` spoken to over stdio.

The wire is JSON-RPC 2.0 without the ``"jsonrpc"`` member, one JSON object per
line. Facts this module relies on, checked against ``codex-cli`` 0.163.0 and 0.171.0:

- ``initialize {clientInfo, capabilities}`` answers ``{userAgent: "<name>/<version>
  (...)", codexHome, ...}``; the ``initialized`` notification follows. Notifications
  may arrive before any response (``configWarning``).
- ``thread/start`` and ``thread/resume {threadId}`` answer ``{thread: {id, ...}}``.
  Codex writes a thread's rollout only at its first turn: resuming a thread that
  never had one (or an unknown id) is the error -32600 ``no rollout found for thread
  id <id>``. The code is the generic invalid-request one (also "invalid session id"),
  so only the message tells it (``never_saved``); checked on 0.163.0 and 0.171.0.
- ``turn/start`` answers at once with ``{turn: {id, status: "inProgress"}}``, before
  ``turn/started``; ``turn/steer`` needs ``expectedTurnId`` and answers ``{turnId}``.
- ``turn/interrupt`` answers only once the turn has stopped (just before
  ``turn/completed {status: "interrupted"}``), and for a turn that already ended it
  may never answer: every wait here has a deadline.
- Codex numbers its own requests from 0. An error response to one of them is a
  safe refusal: a refused command approval fails the command, the turn goes on.
- The app-server exits on stdin EOF; the session task keeps stdin open.

Rule 1 (one reader): ``handshake`` and then ``run`` are the only readers of the
child's output (``codex_rpc`` routes responses to the tasks waiting for them, each
with a deadline). The adapter's state (thread, running turn, open server requests)
changes only in the reader, except that ``answer_approval`` takes a request out.

Rule 2: every server request is answered: an approval once a client decided (or at
once with an error if it cannot be recorded), anything else at once with its
protocol's refusal or an error (``codex_approvals``).
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Mapping
from typing import Any

import trio

import agentsd
from agentsd.providers.base import (
    MAX_BAD_LINES,
    Adapter,
    Dispatch,
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
from agentsd.providers.codex_approvals import (
    APPROVAL_METHODS,
    ServerRequest,
    answer_at_once,
    describe,
    response,
    restored,
)
from agentsd.providers.codex_events import (
    agent_error,
    agent_warning,
    bounded,
    item_completed,
    item_started,
    thread_status,
    turn_completed,
    turn_id_of,
    turn_plan,
    usage_updated,
    user_text,
)
from agentsd.providers.codex_options import (
    MIN_VERSION,
    OPTION_SPECS,
    parse_options,
    parse_version,
)
from agentsd.providers.codex_rpc import Call, Garbage, RpcPeer, clip, error_message
from agentsd.providers.imported import imported, latest
from agentsd.providers.programs import CODEX, find_program
from agentsd.providers.versions import refuse_if_too_old
from agentsd.store.sessions import SessionRow
from agentsd_protocol.api.controls import OptionChoice
from agentsd_protocol.api.events import (
    AgentCommand,
    AgentError,
    AgentWarning,
    Event,
    MessageImported,
    ThreadStatus,
    ThreadSuperseded,
    TurnDiff,
    TurnStarted,
)
from agentsd_protocol.errors import (
    AgentExited,
    AgentNotFound,
    AgentNotRunning,
    AgentProtocolError,
    AgentStartFailed,
    ResumeFailed,
    RpcError,
    UnknownCommand,
)

log = logging.getLogger(__name__)

NO_ROLLOUT = "no rollout found for thread id "  # codex-rs thread-store read_thread.rs
ACK_TIMEOUT_S = 20.0  # turn/start answers in milliseconds; past this delivery is unknown
INTERRUPT_TIMEOUT_S = 10.0  # codex answers once the turn stopped; it may never answer
LIST_TIMEOUT_S = 10.0  # model/list and skills/list read local catalogs: milliseconds
MAX_MODEL_PAGES = 10  # model/list pages: a catalog is a few dozen models
REVIEW = AgentCommand(
    name="review",
    description="review the working tree's changes (or what the instructions say)",
    hint="[instructions]",
)
DELTA_METHODS = frozenset(
    {"item/agentMessage/delta", "item/reasoning/summaryTextDelta", "item/plan/delta"}
)
WARNING_METHODS = frozenset({"warning", "configWarning", "deprecationNotice"})
# Notifications this adapter ignores; opting out spares both sides the JSON.
OPT_OUT = [
    "account/rateLimits/updated",
    "remoteControl/status/changed",
    "thread/started",
    "item/commandExecution/outputDelta",
    "item/fileChange/outputDelta",
    "item/reasoning/textDelta",
    "rawResponseItem/completed",
]


def never_saved(error: Any) -> bool:
    """Whether a ``thread/resume`` error says Codex never saved the thread."""
    if not isinstance(error, dict):
        return False
    message = error.get("message")
    return (
        error.get("code") == -32600 and isinstance(message, str) and message.startswith(NO_ROLLOUT)
    )


# -- the provider ----------------------------------------------------------------------


class CodexProvider(Provider):
    name = "codex"
    program = CODEX
    content_types = frozenset({"image", "file"})
    adopts = True
    minimum_version = MIN_VERSION

    def launch(self, session: SessionRow, state_dir: Any, env: Mapping[str, str]) -> LaunchSpec:
        """``session.command``, else the ``codex`` found on the agent's PATH or in its
        PyPI package, with ``app-server``. Raises ``InvalidParams`` for bad options and
        ``AgentNotFound`` when no ``codex`` is installed."""
        parse_options(session.options)
        if session.command:
            return LaunchSpec(argv=list(session.command))
        program = find_program(CODEX, {**env, **session.env}.get("PATH", ""))
        if program is None:
            raise AgentNotFound(f"cannot start codex: it is not installed; {CODEX.install_hint()}")
        return LaunchSpec(argv=[program, "app-server"])

    def adapter(self, link: LineLink, sink: SessionSink, session: SessionRow) -> Adapter:
        return CodexAdapter(link, sink, session)

    def option_specs(self) -> Mapping[str, OptionSpec]:
        return OPTION_SPECS

    def check_options(self, options: Mapping[str, Any]) -> None:
        parse_options(options)


class CodexAdapter(Adapter):
    """Speaks to one ``codex app-server`` (see the module's rules)."""

    supports_compact = True

    def __init__(self, link: LineLink, sink: SessionSink, session: SessionRow) -> None:
        self._rpc = RpcPeer(link)
        self._sink = sink
        self._session = session
        self._raw_options = dict(session.options)
        self._options = parse_options(self._raw_options)
        self._live: set[str] = set()  # options changed live: turn/start overrides them
        self._skills: dict[str, str] = {}  # name -> path, from the last skills/list
        self._imported: list[MessageImported] = []  # an adopted thread's history
        self._thread_id: str | None = None
        self._turn_id: str | None = None
        self._requests: dict[str, ServerRequest] = {}  # approvals not yet answered
        self._file_changes: dict[str, dict[str, Any]] = {}  # announced, by itemId
        self._errors_reported: set[str | None] = set()  # turns whose failure was journaled
        self._thread_status: ThreadStatus | None = None
        self._version: str | None = None  # from initialize's userAgent

    @property
    def agent_version(self) -> str | None:
        return self._version

    async def _handshake_call(self, method: str, params: dict[str, Any]) -> Call:
        """A request during the handshake: read (and translate what comes first)
        until its response; an error response is left in ``Call.error``."""
        call = await self._rpc.request(method, params)
        while not call.done.is_set():
            frame = await self._rpc.receive()
            if frame is None:
                raise AgentExited(f"codex exited during its handshake (waiting for {method})")
            if isinstance(frame, Garbage):
                raise AgentProtocolError(frame.describe())
            await self._handle(frame)
        return call

    # -- the handshake ----------------------------------------------------------------

    async def handshake(self, resume: Resume | None) -> str:
        """``initialize``, ``initialized``, then ``thread/start`` or ``thread/resume``;
        returns the thread id. Raises ``AgentExited`` (EOF), ``AgentProtocolError``
        (garbage, a refused initialize, a resume landing on another thread),
        ``AgentUnsupported`` (a Codex known to be too old), ``AgentStartFailed`` (Codex
        refused a new thread) or ``ResumeFailed`` (Codex refused to resume a thread it
        saved, or lost one that had turns). The runner bounds it in time."""
        init = await self._handshake_call(
            "initialize",
            {
                "clientInfo": {
                    "name": "agentsd",
                    "title": "agentsd",
                    "version": agentsd.__version__,
                },
                "capabilities": {
                    "experimentalApi": False,
                    "requestAttestation": False,
                    "optOutNotificationMethods": OPT_OUT,
                },
            },
        )
        if init.error is not None:
            raise AgentProtocolError(f"codex refused initialize: {error_message(init.error)}")
        if not isinstance(init.result, dict):
            raise AgentProtocolError(f"codex answered initialize with {clip(init.result)}")
        # An answered initialize is what matters; the version in its userAgent, when
        # there, is checked against the minimum (else the daemon asks the binary).
        user_agent = init.result.get("userAgent")
        self._version = parse_version(user_agent) if isinstance(user_agent, str) else None
        if self._version is not None:
            refuse_if_too_old(CODEX, self._version, MIN_VERSION)
        await self._rpc.notify("initialized")

        params = {"cwd": self._session.cwd, **self._options.thread_params()}
        superseded_because = None
        if resume is not None and resume.adopt:
            await self._read_adopted(resume.handle)
        if resume is None:
            call = await self._start_thread(params)
        else:
            call, superseded_because = await self._resume_thread(resume, params)
        thread = call.result.get("thread") if isinstance(call.result, dict) else None
        thread_id = thread.get("id") if isinstance(thread, dict) else None
        if not isinstance(thread_id, str) or not thread_id:
            raise AgentProtocolError(f"codex answered {call.method} without a thread id")
        if call.method == "thread/resume" and resume is not None and thread_id != resume.handle:
            raise AgentProtocolError(f"codex resumed thread {thread_id} instead of {resume.handle}")
        if resume is not None and superseded_because is not None:
            self.superseded = ThreadSuperseded(
                previous_handle=resume.handle, handle=thread_id, reason=superseded_because
            )
        self._thread_id = thread_id
        return thread_id

    async def take_over(self, state: Takeover) -> None:
        """Carry on with a ``codex app-server`` an earlier adapter initialized: its
        thread, its running turn and the approvals it asked, answered later with
        Codex's own request ids. Nothing is written (base Rule 5)."""
        self._rpc.take_over(state.generation)
        self._thread_id = state.handle
        self._turn_id = state.turn_id if state.turn_open else None
        self._version = state.agent_version
        self._raw_options = dict(state.options)
        self._options = parse_options(self._raw_options)
        for pending in state.approvals:
            request = restored(pending.native_id, pending.kind, pending.request)
            if request is None:
                # Not a question this adapter asks: answering it is a no-op, and the
                # turn's end settles it.
                log.warning(
                    "cannot answer codex's request %s after a takeover: its record is not "
                    "a codex approval",
                    pending.native_id,
                )
                continue
            self._requests[pending.native_id] = request

    async def _read_adopted(self, thread_id: str) -> None:
        """``thread/read`` of a thread the session adopts: it must exist in this
        ``CODEX_HOME`` and belong to the session's cwd; its turns become the history
        to import. Raises ``ResumeFailed`` otherwise."""
        call = await self._handshake_call(
            "thread/read", {"threadId": thread_id, "includeTurns": True}
        )
        if call.error is not None:
            raise ResumeFailed(
                f"codex has no thread {thread_id} to adopt (in this CODEX_HOME): "
                f"{error_message(call.error)}"
            )
        thread = call.result.get("thread") if isinstance(call.result, dict) else None
        if not isinstance(thread, dict):
            raise AgentProtocolError(f"codex answered thread/read with {clip(call.result)}")
        cwd = thread.get("cwd")
        if not isinstance(cwd, str) or not same_dir(cwd, self._session.cwd):
            raise ResumeFailed(
                f"codex thread {thread_id} belongs to {cwd}, not to {self._session.cwd}; "
                "adopt it from a session in that directory"
            )
        self._imported = thread_history(thread.get("turns"))

    async def imported_history(self) -> list[Event]:
        return list(self._imported)

    async def _start_thread(self, params: dict[str, Any]) -> Call:
        call = await self._handshake_call("thread/start", params)
        if call.error is not None:
            raise AgentStartFailed(f"codex could not start a thread: {error_message(call.error)}")
        return call

    async def _resume_thread(
        self, resume: Resume, params: dict[str, Any]
    ) -> tuple[Call, str | None]:
        """``thread/resume``, and None; or, for a thread Codex never saved and that had
        no turn, ``thread/start`` and why it replaces the old one (base Rule 4).
        Raises ``ResumeFailed`` when the thread cannot be resumed otherwise."""
        # excludeTurns: the daemon has the history; a long thread is megabytes.
        call = await self._handshake_call(
            "thread/resume", {**params, "threadId": resume.handle, "excludeTurns": True}
        )
        if call.error is None:
            return call, None
        words = error_message(call.error)
        if not never_saved(call.error):
            raise ResumeFailed(f"codex could not resume thread {resume.handle}: {words}")
        if resume.had_turns:
            raise ResumeFailed(
                f"codex lost thread {resume.handle}, which had turns; agentsd will not start "
                f"a new thread in its place: {words}"
            )
        log.info("codex never saved thread %s (it had no turn); starting a new one", resume.handle)
        reason = f"codex never saved thread {resume.handle}, which had no turn: {words}"
        return await self._start_thread(params), reason

    # -- the reader -------------------------------------------------------------------

    async def run(self) -> None:
        bad_lines = 0  # in a row (base Rule 3)
        try:
            while (frame := await self._rpc.receive()) is not None:
                if isinstance(frame, Garbage):
                    bad_lines += 1
                    if bad_lines > MAX_BAD_LINES:
                        raise AgentProtocolError(
                            f"{frame.describe()}: {bad_lines} such lines in a row, so its "
                            "output is not JSON-RPC"
                        )
                    # Journaled and skipped: one bad line need not end a healthy agent.
                    await self._protocol_error(frame.describe())
                else:
                    bad_lines = 0
                    await self._handle(frame)
        finally:
            self._rpc.close()

    async def _protocol_error(self, message: str) -> None:
        await self._sink.emit(AgentError(error_kind=AgentProtocolError.kind, message=message))

    async def _handle(self, frame: dict[str, Any]) -> None:
        method = frame.get("method")
        params = frame.get("params")
        params = params if isinstance(params, dict) else {}
        if isinstance(method, str):
            if "id" in frame:
                await self._on_server_request(frame.get("id"), method, params)
            else:
                await self._on_notification(method, params)
        elif "id" in frame and ("result" in frame or "error" in frame):
            call = self._rpc.resolve(frame)
            if (
                call is not None
                and call.method in ("turn/start", "review/start")
                and call.error is None
            ):
                # Here, in frame order, so a turn that completes at once is never
                # marked running by a late waiter.
                result = call.result if isinstance(call.result, dict) else {}
                turn = result.get("turn")
                if isinstance(turn, dict) and turn.get("status") == "inProgress":
                    self._turn_id = turn_id_of(result)
        else:
            await self._protocol_error(
                f"codex wrote a message that is neither request, response nor notification: "
                f"{clip(frame)}"
            )

    async def _on_server_request(
        self, request_id: Any, method: str, params: dict[str, Any]
    ) -> None:
        if not isinstance(request_id, int | str) or isinstance(request_id, bool):
            await self._rpc.refuse(request_id, -32600, "request id must be a number or a string")
            return
        at_once = answer_at_once(method, params)
        if at_once is not None:
            await self._rpc.respond(request_id, at_once)
            await self._sink.emit(
                AgentWarning(
                    source=method,
                    message=f"answered codex's {method} request with a refusal "
                    f"(nobody can answer it here): {clip(params)}",
                )
            )
            return
        if method not in APPROVAL_METHODS:
            await self._rpc.refuse(request_id, -32601, f"agentsd does not handle {method}")
            await self._sink.emit(
                AgentWarning(
                    source=method, message=f"refused codex's {method} request: not supported"
                )
            )
            return
        request = ServerRequest(request_id=request_id, method=method, params=params)
        item_id = params.get("itemId")
        ask = describe(
            request, self._file_changes.get(item_id) if isinstance(item_id, str) else None
        )
        # Registered before the await: a client may answer before the commit returns.
        self._requests[request.native_id] = request
        try:
            await self._sink.approval_requested(
                native_id=request.native_id,
                kind=ask.kind,
                title=ask.title,
                detail=ask.detail,
                options=ask.options,
                item_id=item_id if isinstance(item_id, str) else None,
                request=request.record(),
            )
        except RpcError as exc:
            # Rule 2: a question nobody can durably answer is refused, not left hanging.
            self._requests.pop(request.native_id, None)
            log.warning("refused codex's %s: could not record it: %s", method, exc.message)
            await self._rpc.refuse(
                request_id, -32603, f"agentsd could not record the request: {exc.message}"
            )

    async def _on_notification(self, method: str, params: dict[str, Any]) -> None:
        thread_id = params.get("threadId")
        if (
            self._thread_id is not None
            and isinstance(thread_id, str)
            and thread_id != self._thread_id
        ):
            return  # a sub-agent's thread: its turns are not this session's
        sink = self._sink
        if method in DELTA_METHODS:
            item_id, delta = params.get("itemId"), params.get("delta")
            if isinstance(item_id, str) and isinstance(delta, str):
                sink.delta(item_id, delta)
            return
        match method:
            case "turn/started":
                self._turn_id = turn_id_of(params)
                await sink.emit(TurnStarted(turn_id=self._turn_id))
            case "turn/completed":
                done = turn_completed(params)
                turn_id = done.turn_id
                if done.error is not None and turn_id not in self._errors_reported:
                    # A failure Codex did not announce with `error`: journal it once.
                    await sink.emit(
                        AgentError(
                            error_kind=done.error.kind,
                            message=done.error.message,
                            turn_id=turn_id,
                            will_retry=False,
                        )
                    )
                self._errors_reported.discard(turn_id)
                if self._turn_id == turn_id:
                    self._turn_id = None
                self._file_changes.clear()
                await sink.emit(done)
            case "item/started":
                item = params.get("item")
                if isinstance(item, dict) and item.get("type") == "fileChange":
                    self._file_changes[str(item.get("id"))] = item
                await sink.emit(item_started(params))
            case "item/completed":
                completed = item_completed(params)
                self._file_changes.pop(completed.item_id, None)
                await sink.emit(completed)
            case "error":
                will_retry = params.get("willRetry") is True
                turn_id = params.get("turnId") if isinstance(params.get("turnId"), str) else None
                if not will_retry:
                    self._errors_reported.add(turn_id)
                await sink.emit(agent_error(params.get("error"), turn_id, will_retry))
            case "serverRequest/resolved":
                request_id = params.get("requestId")
                if self._requests.pop(str(request_id), None) is not None:
                    # Codex withdrew a question nobody answered (its turn ended).
                    await sink.approval_cancelled(str(request_id))
            case "thread/status/changed":
                status = thread_status(params)
                if status != self._thread_status:
                    self._thread_status = status
                    await sink.emit(status)
            case "thread/tokenUsage/updated":
                await sink.emit(usage_updated(params))
            case "turn/diff/updated":
                turn_id = params.get("turnId")
                await sink.emit(
                    TurnDiff(
                        turn_id=turn_id if isinstance(turn_id, str) else None,
                        diff=bounded(params.get("diff")),
                    )
                )
            case "turn/plan/updated":
                await sink.emit(turn_plan(params))
            case _ if method in WARNING_METHODS:
                await sink.emit(agent_warning(method, params))
            case _:
                pass  # informational (rate limits, MCP status, ...): not the conversation's

    # -- from RPC handlers ------------------------------------------------------------

    def _user_input(self, submission: Submission) -> dict[str, Any]:
        """The prompt as Codex's ``UserInput`` items: its text (file references as
        ``@path`` lines, as Codex's own UI writes them), then each image as a data
        URL (the bytes the daemon kept, not a path that may have changed since)."""
        text = submission.text + submission.file_note()
        items: list[dict[str, Any]] = []
        if text or not submission.inputs:
            items.append({"type": "text", "text": text, "text_elements": []})
        for item in submission.inputs:
            if isinstance(item, ImageInput):
                url = f"data:{item.media_type};base64,{base64.b64encode(item.data).decode()}"
                items.append({"type": "image", "url": url})
        return {
            "threadId": self._thread_id,
            "clientUserMessageId": submission.client_message_id,
            "input": items,
        }

    async def send(self, submission: Submission) -> Dispatch:
        """``turn/steer`` into the running turn, else (or when the steer is refused,
        e.g. because that turn just ended) ``turn/start``. The response is the
        delivery acknowledgement; none within ``ACK_TIMEOUT_S`` is ``unknown``."""
        try:
            running = self._turn_id
            if running is not None:
                steer = await self._rpc.request(
                    "turn/steer", {**self._user_input(submission), "expectedTurnId": running}
                )
                dispatch = await self._acknowledged(steer)
                if dispatch.outcome != "rejected" or self._rpc.closed:
                    return dispatch
                log.info("codex refused a steer (%s); starting a turn instead", dispatch.reason)
            return await self._start_turn(self._user_input(submission))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return Dispatch(outcome="rejected", reason="codex is not running")

    async def _start_turn(self, params: dict[str, Any]) -> Dispatch:
        """``turn/start`` with the options changed live as its overrides."""
        if self._options.effort is not None:
            params["effort"] = self._options.effort
        params.update(self._options.turn_overrides(self._live))
        return await self._acknowledged(await self._rpc.request("turn/start", params))

    async def _acknowledged(self, call: Call) -> Dispatch:
        if not await call.wait(ACK_TIMEOUT_S):
            return Dispatch(
                outcome="unknown",
                reason=f"codex did not confirm {call.method} within {ACK_TIMEOUT_S:g} s",
            )
        if call.error is not None:
            return Dispatch(outcome="rejected", reason=error_message(call.error))
        result = call.result if isinstance(call.result, dict) else {}
        turn_id = (
            turn_id_of(result)
            if call.method in ("turn/start", "review/start")
            else result.get("turnId")
        )
        return Dispatch(outcome="accepted", turn_id=turn_id if isinstance(turn_id, str) else None)

    async def interrupt(self, turn_id: str | None, *, confirm: bool = True) -> bool:
        """``turn/interrupt`` of the running turn. True when Codex confirmed it or did
        not answer in time (the request is out; ``turn/completed`` tells the end), or
        once it is written when not ``confirm``; False when no turn runs or Codex
        refused."""
        current = self._turn_id
        if current is None or self._rpc.closed:
            return False
        try:
            call = await self._rpc.request(
                "turn/interrupt", {"threadId": self._thread_id, "turnId": turn_id or current}
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        if not confirm:
            return True
        answered = await call.wait(INTERRUPT_TIMEOUT_S)
        return not answered or call.error is None

    # -- conversation controls --------------------------------------------------------

    async def _list_call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A read-only request answered from Codex's catalogs; ``AgentNotRunning``
        when Codex is gone, ``AgentProtocolError`` when it refused or was silent."""
        try:
            call = await self._rpc.request(method, params)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise AgentNotRunning("codex is not running") from None
        if not await call.wait(LIST_TIMEOUT_S):
            raise AgentProtocolError(f"codex did not answer {method} within {LIST_TIMEOUT_S:g} s")
        if call.error is not None:
            raise AgentProtocolError(f"codex refused {method}: {error_message(call.error)}")
        return call.result if isinstance(call.result, dict) else {}

    async def option_choices(self) -> Mapping[str, list[OptionChoice]]:
        """``model/list`` (every page): the models, and the efforts of the current
        model (else of the default one)."""
        models: list[dict[str, Any]] = []
        cursor = None
        for _ in range(MAX_MODEL_PAGES):
            page = await self._list_call("model/list", {"cursor": cursor})
            models += [m for m in page.get("data") or [] if isinstance(m, dict)]
            cursor = page.get("nextCursor")
            if not isinstance(cursor, str):
                break
        choices = [
            OptionChoice(
                value=str(m.get("model") or m.get("id")),
                label=m.get("displayName") if isinstance(m.get("displayName"), str) else None,
                description=m.get("description") if isinstance(m.get("description"), str) else None,
                default=m.get("isDefault") is True,
            )
            for m in models
            if m.get("hidden") is not True
        ]
        current = next(
            (m for m in models if m.get("model") == self._options.model),
            next((m for m in models if m.get("isDefault") is True), None),
        )
        efforts = [] if current is None else current.get("supportedReasoningEfforts") or []
        default_effort = None if current is None else current.get("defaultReasoningEffort")
        effort_choices = [
            OptionChoice(
                value=str(e.get("reasoningEffort")),
                description=e.get("description") if isinstance(e.get("description"), str) else None,
                default=e.get("reasoningEffort") == default_effort,
            )
            for e in efforts
            if isinstance(e, dict)
        ]
        found: dict[str, list[OptionChoice]] = {"model": choices}
        if effort_choices:
            found["effort"] = effort_choices
        return found

    async def apply_options(self, changes: Mapping[str, Any]) -> None:
        """Per-turn overrides: kept here and sent with every later ``turn/start``
        (Codex keeps them for the turns after it too)."""
        raw = {**self._raw_options, **changes}
        self._options = parse_options(raw)
        self._raw_options = raw
        self._live |= set(changes)

    async def agent_commands(self) -> list[AgentCommand]:
        """``review``, and the skills ``skills/list`` finds for the session's cwd."""
        result = await self._list_call("skills/list", {"cwds": [self._session.cwd]})
        skills: dict[str, str] = {}
        commands = [REVIEW]
        for entry in result.get("data") or []:
            for skill in (entry.get("skills") or []) if isinstance(entry, dict) else []:
                if not isinstance(skill, dict) or skill.get("enabled") is False:
                    continue
                name, path = skill.get("name"), skill.get("path")
                if isinstance(name, str) and isinstance(path, str) and name not in skills:
                    skills[name] = path
                    description = skill.get("description")
                    commands.append(
                        AgentCommand(
                            name=name,
                            description=description if isinstance(description, str) else None,
                        )
                    )
        self._skills = skills
        return commands

    async def compact(self) -> Dispatch:
        """``thread/compact/start``: Codex compacts the thread in a turn of its own
        (its ``turn/started`` and ``contextCompaction`` item follow)."""
        try:
            call = await self._rpc.request("thread/compact/start", {"threadId": self._thread_id})
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return Dispatch(outcome="rejected", reason="codex is not running")
        return await self._acknowledged(call)

    async def run_command(self, name: str, args: str | None) -> Dispatch:
        """``review`` by ``review/start`` (inline, on this thread: the working tree's
        changes, or ``args`` as instructions); a skill as a turn whose input names it."""
        try:
            if name == REVIEW.name:
                target: dict[str, Any] = (
                    {"type": "custom", "instructions": args}
                    if args
                    else {"type": "uncommittedChanges"}
                )
                call = await self._rpc.request(
                    "review/start", {"threadId": self._thread_id, "target": target}
                )
                return await self._acknowledged(call)
            path = self._skills.get(name)
            if path is None:
                raise UnknownCommand(f"codex has no skill {name!r}", name=name)
            params: dict[str, Any] = {
                "threadId": self._thread_id,
                "input": [
                    {"type": "skill", "name": name, "path": path},
                    {"type": "text", "text": args or "", "text_elements": []},
                ],
            }
            return await self._start_turn(params)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return Dispatch(outcome="rejected", reason="codex is not running")

    async def answer_approval(self, native_id: str, decision: str) -> None:
        """Answer Codex's request ``native_id``. A request Codex already withdrew,
        or a child that has exited, makes this a no-op: the child's end (or the
        withdrawal) settles the approval."""
        request = self._requests.pop(native_id, None)
        if request is None:
            log.info("no open codex request %s to answer (withdrawn or answered)", native_id)
            return
        await self._rpc.respond(request.request_id, response(request, decision))


def same_dir(a: str, b: str) -> bool:
    """Whether two paths name the same directory (symlinks resolved)."""
    return os.path.realpath(a) == os.path.realpath(b)


def thread_history(turns: Any) -> list[MessageImported]:
    """The user and agent messages of a thread's turns, oldest first."""
    messages: list[MessageImported] = []
    for turn in turns if isinstance(turns, list) else []:
        if not isinstance(turn, dict):
            continue
        turn_id = turn.get("id") if isinstance(turn.get("id"), str) else None
        for item in turn.get("items") or []:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "userMessage":
                text = user_text(item.get("content"))
                role = "user"
            elif item.get("type") == "agentMessage":
                text = str(item.get("text") or "")
                role = "assistant"
            else:
                continue
            if text:
                messages.append(imported(role, text, turn_id))
    return latest(messages)
