"""The ACP agent an editor talks to, backed by daemon sessions: the glue between the
editor's ``Peer`` and the daemon's ``AsyncClient``.

Rule 1: an ACP session id *is* the daemon session id, so an editor that restarts
and calls ``session/load`` gets the same conversation, from this bridge or another.
The bridge owns no session: it never closes one, and killing it mid-turn leaves the
turn running in the daemon.

Rule 2: each ACP session the editor opened has one ``Binding``: a subscription to
the daemon session whose events become ``session/update`` notifications
(``UpdateTranslator``) and answers to ``session/prompt`` (``TurnTracker``). Nothing
is missed between a prompt and its reply: a prompt is sent only once the binding's
subscription is open.

Rule 3: an approval becomes a ``session/request_permission`` about the tool call
it concerns (``updates`` Rule 4), once the editor has seen the history it belongs
to; its ``_meta.agentsd.approvalId`` names the daemon's approval. The editor's
choice goes to ``agentSession.respond``. If the approval is resolved another way first (another
client, the agent, the daemon), the editor's dialog is closed two ways: the tool
call's status update (``in_progress``, ``failed``, ...) ends its pending permission
in an ACP editor, which then answers the request ``cancelled`` as ACP defines for a
request that no longer applies (Zed does; a client that ignores ``$/cancel_request``
still closes it), and ``$/cancel_request`` for clients that implement it. Its late
answer is ignored (``agentSession.respond`` would say ``ALREADY_RESOLVED``); the
prompt goes on.

Rule 4: ``initialize`` comes first: a session method before it is refused
(``-32600``). The bridge speaks ACP version 1 and answers 1 whatever is asked, as
ACP's negotiation says (the editor decides whether to go on).

Rule 5: the MCP servers an editor gives ``session/new`` become the new session's
``mcpServers`` option (ACP's shape, passed on by the provider), so a resumed
session, from any client, keeps them. ``session/load`` and ``session/resume`` keep
the servers the session was created with; so does ``--session`` (its options are
the ones it has).

Rule 7: what the editor was shown, the user has seen: once a binding has sent the
editor a turn's end or an approval (or the history a ``session/load`` replayed),
it acknowledges the session up to there (``agentSession.acknowledge``), so status
bars stop flagging it unseen. One acknowledgement is in flight at a time; a
failed one is only logged (the next one covers it).

Rule 6: a prompt's text goes as the send's text and its images as image blocks
(``content``): an embedded text resource is inlined as ``<context uri="...">`` with
its contents (a ``file://`` one too: the editor's contents include unsaved edits), a
resource link becomes a Markdown link the agent can open, a binary resource is named
by its URI. A prompt that is ``/name args`` with ``name`` among the session's
commands runs ``agentSession.command`` instead (``controls`` Rule 3) and ends when
the turn it started does (at once for one that starts none, as ``clear``).

Rule 8: modes, config options and commands are the daemon's options and commands
(``controls``): ``session/new``, ``load`` and ``resume`` answer the session's modes
and config options (and the unstable ``models``); ``session/set_mode``,
``set_config_option`` and the unstable ``set_model`` become ``agentSession.setOptions``. Whoever changes the options (this
editor, another, the CLI), the ``session.updated`` that journals it makes the bridge
send ``current_mode_update`` and ``config_option_update``, and so does an agent
start (the running agent lists its own models and modes); the commands go out as
``available_commands_update`` once the editor has the session, and again when the
agent starts or says its commands changed.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import msgspec
import trio

from agentsctl.acp import controls
from agentsctl.acp import schema as acp
from agentsctl.acp.peer import (
    AcpError,
    Answer,
    OutgoingRequest,
    Peer,
    Received,
    method_not_found,
)
from agentsctl.acp.turns import (
    Approval,
    ApprovalClosed,
    ApprovalOpened,
    Finished,
    Interrupt,
    Prompt,
    TurnTracker,
)
from agentsctl.acp.updates import UpdateTranslator
from agentsctl.async_client import AsyncClient, Subscription
from agentsctl.daemon import DaemonUnreachable
from agentsd_protocol import methods
from agentsd_protocol.api import attention as at
from agentsd_protocol.api import controls as ctl
from agentsd_protocol.api import conversation as c
from agentsd_protocol.api import session as s
from agentsd_protocol.api.events import (
    ChildExited,
    ChildReady,
    CommandsUpdated,
    SessionUpdated,
    TurnCompleted,
)
from agentsd_protocol.api.stream import DeltaNotification, JournalEvent
from agentsd_protocol.errors import (
    AlreadyResolved,
    ApprovalNotFound,
    AttachmentRefused,
    ContentUnsupported,
    CwdNotDirectory,
    CwdNotFound,
    InvalidParams,
    RpcError,
    SessionNotFound,
    UnknownCommand,
    UnknownOption,
    UnknownProvider,
)

log = logging.getLogger(__name__)

P = TypeVar("P")

AGENT_NAME = "agentsd"
PERMISSION_CANCEL_GRACE_S = 5.0  # after $/cancel_request, how long the editor may take to answer
# What makes a session "unseen" in status bars; the editor was shown it (Rule 7).
_ATTENTION_KINDS = frozenset({"turn.completed", "approval.requested"})
_NOT_FOUND = (SessionNotFound, ApprovalNotFound)
_BAD_PARAMS = (
    InvalidParams,
    CwdNotFound,
    CwdNotDirectory,
    UnknownProvider,
    UnknownOption,
    UnknownCommand,
    ContentUnsupported,
    AttachmentRefused,
)
_TURN_ENDS_KEPT = 16  # recent turn ends a command's reply may have to look back at
_STOP_REASONS: dict[str, acp.StopReason] = {"completed": "end_turn", "interrupted": "cancelled"}


@attrs.frozen
class BridgeConfig:
    """What ``agentsctl acp`` was told on its command line."""

    socket_path: str
    session_id: str | None = None  # --session: session/new binds to it instead of creating
    provider: str = "mock"
    cwd: str | None = None  # --cwd: overrides the editor's cwd for new sessions
    title: str | None = None
    options: dict[str, Any] = attrs.field(factory=dict)  # provider options of new sessions
    version: str = "0"


def rpc_failure(exc: RpcError | DaemonUnreachable) -> AcpError:
    """A daemon failure as the JSON-RPC error the editor gets (the daemon's kind and
    details stay in ``data``)."""
    if isinstance(exc, DaemonUnreachable):
        return AcpError(acp.INTERNAL_ERROR, exc.message, {"kind": "daemon_unreachable"})
    data = {"kind": exc.kind, "retryable": exc.retryable, **exc.details}
    if isinstance(exc, _NOT_FOUND):
        return AcpError(acp.RESOURCE_NOT_FOUND, exc.message, data)
    if isinstance(exc, _BAD_PARAMS):
        return AcpError(acp.INVALID_PARAMS, exc.message, data)
    return AcpError(acp.INTERNAL_ERROR, exc.message, data)


def decode(params: msgspec.Raw, params_type: type[P]) -> P:
    try:
        return msgspec.json.decode(params, type=params_type)
    except msgspec.DecodeError as exc:
        raise AcpError(acp.INVALID_PARAMS, f"Invalid params: {exc}") from None


@attrs.define(eq=False)
class _Permission:
    """A ``session/request_permission`` in flight for one approval (Rule 3)."""

    approval: Approval
    request: OutgoingRequest | None = None
    superseded: bool = False  # resolved elsewhere: the editor's answer no longer counts
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


@attrs.define(eq=False)
class _CommandWait:
    """A command run from the editor, waiting for the end of the turn it started:
    the first turn end journaled after its ``command.run`` (a command runs only in
    an idle conversation)."""

    done: trio.Event = attrs.field(factory=trio.Event)
    seq: int | None = None  # its command.run's, once known
    outcome: str | None = None
    cancelled: bool = False
    _early: list[tuple[int, str]] = attrs.field(factory=list)  # ends seen before the seq

    def after(self, seq: int, recent: list[tuple[int, str]]) -> None:
        self.seq = seq
        for end_seq, outcome in [*recent, *self._early]:
            self.saw(end_seq, outcome)

    def saw(self, seq: int, outcome: str) -> None:
        if self.outcome is not None:
            return
        if self.seq is None:
            self._early.append((seq, outcome))
        elif seq > self.seq:
            self.outcome = outcome
            self.done.set()


class Binding:
    """One ACP session of this editor: see Rule 2. Its tasks run in the bridge's
    nursery; ``close`` ends them and fails its prompts."""

    def __init__(self, bridge: Bridge, session_id: str, cwd: str | None = None) -> None:
        self.session_id = session_id
        self._bridge = bridge
        self._client = bridge.client
        self._peer = bridge.peer
        self.translator = UpdateTranslator(cwd)
        self.tracker = TurnTracker()
        self.scope = trio.CancelScope()
        self.caught_up = trio.Event()  # the history up to the head when it began was sent
        self._catch_up_seq = 0
        self._editor_ready = False  # the editor has the reply that opened this binding
        self._waiters: dict[str, trio.Event] = {}
        self._permissions: dict[str, _Permission] = {}
        self.failure: AcpError | None = None
        self._shown_seq = 0  # the last attention event the editor was sent (Rule 7)
        self._acked_seq = 0
        self._acking = False
        # Commands run from the editor (Rule 6): each waits for a turn end after its seq.
        self._command_waits: list[_CommandWait] = []
        self._turn_ends: list[tuple[int, str]] = []  # (seq, outcome), the last few
        self._refreshing: set[str] = set()  # "options", "commands": a refresh in flight
        self._stale: set[str] = set()  # changed again while one was in flight

    # -- the subscription ---------------------------------------------------------------

    async def run(self, after_seq: int | None, *, task_status: trio.TaskStatus[None]) -> None:
        """Follow the daemon session; ``started`` once subscribed (errors before that
        are the caller's). Ends when closed, or when following failed for good."""
        started = False
        with self.scope:
            try:
                async with self._client.subscribe(self.session_id, after_seq=after_seq) as events:
                    self._catch_up_seq = events.head_seq if after_seq is not None else 0
                    self._check_caught_up(events)
                    started = True
                    task_status.started()
                    async for item in events:
                        await self._handle(item)
                        self._check_caught_up(events)
            except (RpcError, DaemonUnreachable) as exc:
                if not started:
                    raise
                log.error("following session %s failed: %s", self.session_id, exc)
                self.close(rpc_failure(exc))

    def _check_caught_up(self, events: Subscription) -> None:
        if not self.caught_up.is_set() and (events.last_seq or 0) >= self._catch_up_seq:
            self.caught_up.set()
            self._ask_pending()
            if self._catch_up_seq:  # a replay: the editor has been shown the history
                self._shown(self._catch_up_seq)

    def _shown(self, seq: int) -> None:
        """The editor was shown the session up to ``seq`` (Rule 7)."""
        self._shown_seq = max(self._shown_seq, seq)
        if not self._acking and self._shown_seq > self._acked_seq:
            self._acking = True
            self._bridge.nursery.start_soon(self._acknowledge)

    async def _acknowledge(self) -> None:
        try:
            while self._shown_seq > self._acked_seq:
                seq = self._shown_seq
                try:
                    params = at.AcknowledgeParams(session_id=self.session_id, seq=seq)
                    await self._client.call(methods.ACKNOWLEDGE, params)
                except (RpcError, DaemonUnreachable) as exc:
                    log.warning("acknowledging session %s failed: %s", self.session_id, exc)
                    return
                self._acked_seq = seq
        finally:
            self._acking = False

    async def _handle(self, item: JournalEvent | DeltaNotification) -> None:
        if isinstance(item, DeltaNotification):
            updates = self.translator.delta(item)
            actions = []
        else:
            updates = self.translator.event(item)
            actions = self.tracker.event(item)
        for update in updates:
            notification = acp.SessionNotification(session_id=self.session_id, update=update)
            await self._peer.notify("session/update", notification)
        if (
            isinstance(item, JournalEvent)
            and item.kind in _ATTENTION_KINDS
            and self.caught_up.is_set()
        ):
            self._shown(item.seq)
        for action in actions:
            self._act(action)
        if isinstance(item, JournalEvent):
            self._controls_event(item)

    # -- modes, config options, commands (Rules 6 and 8) ------------------------------

    def _controls_event(self, item: JournalEvent) -> None:
        match item.event():
            case TurnCompleted(outcome=outcome):
                self._turn_ended(item.seq, outcome)
            case ChildExited():
                self._turn_ended(item.seq, "exited")
            case SessionUpdated(options=dict()) if self._editor_ready:
                self._refresh("options")
            case CommandsUpdated() if self._editor_ready:
                self._refresh("commands")
            case ChildReady() if self._editor_ready:
                # The running agent lists its own choices (models, modes) and commands.
                self._refresh("options")
                self._refresh("commands")

    def _turn_ended(self, seq: int, outcome: str) -> None:
        self._turn_ends = [*self._turn_ends[-_TURN_ENDS_KEPT + 1 :], (seq, outcome)]
        for wait in self._command_waits:
            wait.saw(seq, outcome)

    def _refresh(self, what: str) -> None:
        """Send the editor the session's options or commands as they are now; one
        fetch of each at a time, another after it if they changed meanwhile."""
        if what in self._refreshing:
            self._stale.add(what)
            return
        self._refreshing.add(what)
        self._bridge.nursery.start_soon(self._refresh_loop, what)

    async def _refresh_loop(self, what: str) -> None:
        try:
            while True:
                self._stale.discard(what)
                try:
                    updates = await (
                        self._options_updates() if what == "options" else self._commands_updates()
                    )
                except (RpcError, DaemonUnreachable) as exc:
                    log.warning("reading the %s of %s failed: %s", what, self.session_id, exc)
                    return
                for update in updates:
                    notification = acp.SessionNotification(
                        session_id=self.session_id, update=update
                    )
                    await self._peer.notify("session/update", notification)
                if what not in self._stale:
                    return
        finally:
            self._refreshing.discard(what)

    async def _options_updates(self) -> list[acp.SessionUpdate]:
        state = await self._bridge.session_controls(self.session_id)
        updates: list[acp.SessionUpdate] = []
        modes = state.modes()
        if modes is not None:
            updates.append(acp.CurrentModeUpdate(current_mode_id=modes.current_mode_id))
        return [*updates, acp.ConfigOptionUpdate(config_options=state.config_options())]

    async def _commands_updates(self) -> list[acp.SessionUpdate]:
        result = await self.commands()
        return [acp.AvailableCommandsUpdate(available_commands=controls.available_commands(result))]

    async def commands(self) -> ctl.CommandsResult:
        return await self._client.call(
            methods.COMMANDS, ctl.CommandsParams(session_id=self.session_id)
        )

    async def command(self, name: str, args: str | None) -> acp.PromptResult:
        """Run a command typed as ``/name args`` (Rule 6): the prompt ends when the
        turn it started ends."""
        if self.failure is not None:
            raise self.failure
        wait = _CommandWait()
        self._command_waits.append(wait)
        try:
            params = ctl.CommandParams(
                session_id=self.session_id,
                name=name,
                args=args,
                client_operation_id=uuid.uuid4().hex,
            )
            try:
                result = await self._client.retrying(
                    lambda: self._client.call(methods.COMMAND, params)
                )
            except (RpcError, DaemonUnreachable) as exc:
                raise rpc_failure(exc) from None
            if result.dispatch == "rejected":
                meta = {"agentsd": {"reason": result.reason}} if result.reason else None
                return acp.PromptResult(stop_reason="refusal", meta=meta)
            if result.handle is not None or result.dispatch == "unknown":
                return acp.PromptResult(stop_reason="end_turn")  # it started no turn
            wait.after(result.seq, self._turn_ends)
            await wait.done.wait()
        finally:
            self._command_waits.remove(wait)
        if self.failure is not None and wait.outcome is None:
            raise self.failure
        if wait.cancelled:
            return acp.PromptResult(stop_reason="cancelled")
        stop = _STOP_REASONS.get(wait.outcome or "")
        if stop is None:
            raise AcpError(
                acp.INTERNAL_ERROR, f"/{name} ended {wait.outcome}", {"kind": "command_failed"}
            )
        return acp.PromptResult(stop_reason=stop)

    def _act(self, action: Finished | Interrupt | ApprovalOpened | ApprovalClosed) -> None:
        match action:
            case Finished(prompt=prompt):
                waiter = self._waiters.get(prompt.operation_id)
                if waiter is not None:
                    waiter.set()
            case Interrupt():
                self._bridge.nursery.start_soon(self._interrupt)
            case ApprovalOpened(approval=approval):
                if self.caught_up.is_set():
                    self._ask(approval)
            case ApprovalClosed(approval_id=approval_id):
                permission = self._permissions.get(approval_id)
                if permission is not None:
                    permission.superseded = True
                    self._bridge.nursery.start_soon(self._withdraw, permission)

    def editor_ready(self) -> None:
        """The editor has the reply that opened this binding: permission requests may
        go out now (Rule 3)."""
        self._editor_ready = True
        self._ask_pending()
        self._refresh("commands")

    def close(self, failure: AcpError) -> None:
        """End the subscription and withdraw its permission requests from the editor;
        prompts fail with ``failure``. Idempotent."""
        if self.failure is None:
            self.failure = failure
        self.scope.cancel()
        for permission in self._permissions.values():
            permission.scope.cancel()
            if permission.request is not None:
                self._bridge.nursery.start_soon(permission.request.cancel)
        for waiter in self._waiters.values():
            waiter.set()
        for wait in self._command_waits:
            wait.done.set()

    # -- prompts ----------------------------------------------------------------------

    async def prompt(self, prompt: acp.DaemonPrompt, arrival: int) -> acp.PromptResult:
        """Send ``text`` and wait for its turn to end (``turns`` Rule 2). The send is
        retried across a daemon restart with the same ``clientOperationId``, so it is
        journaled once."""
        if self.failure is not None:
            raise self.failure
        operation_id = uuid.uuid4().hex
        tracked = self.tracker.add(operation_id, arrival)
        self.translator.own_operations.add(operation_id)
        done = self._waiters[operation_id] = trio.Event()
        try:
            try:
                params = c.SendParams(
                    session_id=self.session_id,
                    text=prompt.text,
                    content=[
                        c.ImageBlock(data=data, media_type=media_type)
                        for data, media_type in prompt.images
                    ],
                    client_operation_id=operation_id,
                )
                await self._client.retrying(lambda: self._client.call(methods.SEND, params))
            except (RpcError, DaemonUnreachable) as exc:
                self.tracker.discard(operation_id)
                raise rpc_failure(exc) from None
            await done.wait()
        finally:
            del self._waiters[operation_id]
        return self._stop(tracked)

    def _stop(self, prompt: Prompt) -> acp.PromptResult:
        if prompt.stop_reason is not None:
            meta = None
            if prompt.reason is not None:
                meta = {"agentsd": {"reason": prompt.reason}}
            return acp.PromptResult(stop_reason=prompt.stop_reason, meta=meta)
        if prompt.failure is not None:
            failure = prompt.failure
            raise AcpError(acp.INTERNAL_ERROR, failure.message, {"kind": failure.kind})
        raise self.failure or AcpError(acp.INTERNAL_ERROR, "the session is no longer followed")

    def cancel(self, arrival: int) -> None:
        """``session/cancel`` (arriving ``arrival``-th): every prompt of this session sent
        before it stops ``cancelled``."""
        for action in self.tracker.cancel(before=arrival):
            self._act(action)
        if self._command_waits:
            for wait in self._command_waits:
                wait.cancelled = True
            self._bridge.nursery.start_soon(self._interrupt)

    async def _interrupt(self) -> None:
        try:
            await self._client.call(
                methods.INTERRUPT, c.InterruptParams(session_id=self.session_id)
            )
        except (RpcError, DaemonUnreachable) as exc:
            # The prompt still ends ``cancelled`` when its turn ends.
            log.warning("interrupting session %s failed: %s", self.session_id, exc)

    # -- permissions (Rule 3) -----------------------------------------------------------

    def _ask_pending(self) -> None:
        if self.caught_up.is_set() and self._editor_ready:
            for approval in list(self.tracker.approvals.values()):
                self._ask(approval)

    def _ask(self, approval: Approval) -> None:
        if not self._editor_ready or approval.approval_id in self._permissions:
            return
        permission = self._permissions[approval.approval_id] = _Permission(approval)
        self._bridge.nursery.start_soon(self._permission, permission)

    async def _permission(self, permission: _Permission) -> None:
        approval = permission.approval
        described = {o.option_id: o for o in approval.asked.option_details}
        params = acp.RequestPermissionParams(
            session_id=self.session_id,
            tool_call=self.translator.permission_tool_call(approval.asked),
            options=[
                acp.permission_option(
                    option,
                    approval.kind,
                    agent_name=described[option].name if option in described else None,
                    agent_kind=described[option].kind if option in described else None,
                )
                for option in approval.options
            ],
            # The daemon's id of the question (the tool call's id is its item's).
            meta={"agentsd": {"approvalId": approval.approval_id}},
        )
        decision: str | None = None
        try:
            with permission.scope:
                request = permission.request = await self._peer.request(
                    "session/request_permission", params
                )
                if permission.superseded:
                    await self._withdraw(permission)
                decision = await self._decision(request, approval)
            if permission.superseded or decision is None:
                return
            operation_id = uuid.uuid4().hex  # the ledger is daemon-wide: ids must be unique
            try:
                answer = c.RespondParams(
                    session_id=self.session_id,
                    approval_id=approval.approval_id,
                    decision=decision,
                    client_operation_id=operation_id,
                )
                await self._client.retrying(lambda: self._client.call(methods.RESPOND, answer))
            except (AlreadyResolved, ApprovalNotFound):
                pass  # another answer won; the journal says which
            except (RpcError, DaemonUnreachable) as exc:
                log.error("answering approval %s failed: %s", approval.approval_id, exc)
        finally:
            if self._permissions.get(approval.approval_id) is permission:
                del self._permissions[approval.approval_id]

    async def _decision(self, request: OutgoingRequest, approval: Approval) -> str:
        """The editor's choice as a daemon decision: the option it selected, ``cancel``
        when it cancelled, ``decline`` (if offered) when it failed to answer."""
        try:
            result = msgspec.json.decode(await request.wait(), type=acp.RequestPermissionResult)
        except AcpError as exc:
            if exc.code == acp.REQUEST_CANCELLED:
                return "cancel"
            log.error("the editor failed a permission request: %s", exc.message)
            return "decline" if "decline" in approval.options else "cancel"
        except msgspec.DecodeError as exc:
            log.error("the editor answered a permission request with garbage: %s", exc)
            return "decline" if "decline" in approval.options else "cancel"
        outcome = result.outcome
        if outcome.outcome == "selected" and outcome.option_id in approval.options:
            return outcome.option_id
        return "cancel"

    async def _withdraw(self, permission: _Permission) -> None:
        """Cancel the editor's request for an approval resolved elsewhere; its answer is
        awaited a little (ACP's graceful cancellation), then forgotten."""
        request = permission.request
        if request is None:
            return  # not sent yet: ``_permission`` withdraws it once it is
        permission.scope.deadline = trio.current_time() + PERMISSION_CANCEL_GRACE_S
        await request.cancel()


class Bridge:
    """Serves one editor: dispatches its requests and notifications."""

    def __init__(
        self, peer_factory: Callable[[Bridge], Peer], client: AsyncClient, config: BridgeConfig
    ) -> None:
        self.client = client
        self.config = config
        self.bindings: dict[str, Binding] = {}
        self._cancelled_at: dict[str, int] = {}  # session id -> arrival of its last cancel
        self.peer = peer_factory(self)
        self._nursery: trio.Nursery | None = None
        self._initialized = False  # ACP: initialize comes first, session methods after

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None, "Bridge.serve is not running"
        return self._nursery

    async def serve(self) -> None:
        """Serve until the editor closes its end. Bindings end with it; the daemon's
        sessions do not (Rule 1)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.peer.serve()
            nursery.cancel_scope.cancel()

    # -- dispatch -----------------------------------------------------------------------

    async def on_request(self, received: Received) -> Any:
        method, params = received.method, received.params
        if method != "initialize" and not self._initialized and method.startswith("session/"):
            raise AcpError(acp.INVALID_REQUEST, f"{method} before initialize: initialize first")
        try:
            match method:
                case "initialize":
                    result = self._initialize(decode(params, acp.InitializeParams))
                    self._initialized = True
                    return result
                case "session/new":
                    return await self._new(decode(params, acp.NewSessionParams))
                case "session/load":
                    return await self._load(decode(params, acp.LoadSessionParams))
                case "session/resume":
                    return await self._resume(decode(params, acp.ResumeSessionParams))
                case "session/list":
                    return await self._list(decode(params, acp.ListSessionsParams))
                case "session/prompt":
                    return await self._prompt(decode(params, acp.PromptParams), received.arrival)
                case "session/set_mode":
                    p = decode(params, acp.SetModeParams)
                    await self._set(p.session_id, lambda state: state.mode_changes(p.mode_id))
                    return acp.EmptyResult()
                case "session/set_config_option":
                    q = decode(params, acp.SetConfigOptionParams)
                    state = await self._set(
                        q.session_id, lambda state: state.config_changes(q.config_id, q.value)
                    )
                    return acp.SetConfigOptionResult(config_options=state.config_options())
                case "session/set_model":
                    m = decode(params, acp.SetModelParams)
                    await self._set(
                        m.session_id, lambda state: state.config_changes("model", m.model_id)
                    )
                    return acp.EmptyResult()
                case _:
                    raise method_not_found(method)
        except (RpcError, DaemonUnreachable) as exc:
            raise rpc_failure(exc) from None

    async def on_notification(self, received: Received) -> None:
        if received.method == "session/cancel":
            session_id = decode(received.params, acp.CancelParams).session_id
            # A prompt sent before this cancel whose task has not started yet sees it
            # here (tasks start in any order: ``peer`` Rule 1).
            self._cancelled_at[session_id] = received.arrival
            binding = self.bindings.get(session_id)
            if binding is not None:
                binding.cancel(received.arrival)
        # Other notifications (extensions) are ignored, as JSON-RPC allows.

    # -- methods ------------------------------------------------------------------------

    def _initialize(self, params: acp.InitializeParams) -> acp.InitializeResult:
        """ACP's version negotiation: the version asked for when the bridge speaks it,
        else the newest it speaks (the editor then decides whether to go on)."""
        return acp.InitializeResult(
            protocol_version=acp.PROTOCOL_VERSION,
            agent_capabilities=acp.AgentCapabilities(
                load_session=True,
                prompt_capabilities=acp.PromptCapabilities(image=True, embedded_context=True),
                # What the providers pass on (``agentsd.providers.mcp_servers``):
                # Codex speaks stdio and HTTP, Claude Code SSE too; ACP agents, stdio.
                mcp_capabilities=acp.McpCapabilities(
                    http=self.config.provider in ("codex", "claude"),
                    sse=self.config.provider == "claude",
                ),
                session_capabilities=acp.SessionCapabilities(list={}, resume={}),
            ),
            agent_info=acp.Implementation(
                name=AGENT_NAME,
                title=f"agentsd ({self.config.session_id or self.config.provider})",
                version=self.config.version,
            ),
        )

    async def _new(self, params: acp.NewSessionParams) -> Answer:
        config = self.config
        if config.session_id is not None:
            got = await self.client.call(methods.GET, s.GetParams(session_id=config.session_id))
            session_id, cwd = got.session.session_id, got.session.cwd
        else:
            operation_id = uuid.uuid4().hex
            cwd = config.cwd or params.cwd
            options = dict(config.options)
            if params.mcp_servers:
                # Kept with the session's options: every start and resume gets them.
                options["mcpServers"] = params.mcp_servers
            create = s.CreateParams(
                provider=config.provider,
                cwd=cwd,
                title=config.title,
                options=options,
                client_operation_id=operation_id,
            )
            created = await self.client.retrying(lambda: self.client.call(methods.CREATE, create))
            session_id = created.session_id
        binding = await self._bind(session_id, after_seq=None, cwd=cwd)
        state = await self.session_controls(session_id)
        result = acp.NewSessionResult(
            session_id=session_id,
            modes=state.modes(),
            config_options=state.config_options(),
            models=state.models(),
        )
        return Answer(result, binding.editor_ready)

    async def _load(self, params: acp.LoadSessionParams) -> Answer:
        binding = await self._bind(params.session_id, after_seq=0, cwd=params.cwd)
        await binding.caught_up.wait()  # ACP: reply once the whole history was sent
        return Answer(await self._state(params.session_id), binding.editor_ready)

    async def _resume(self, params: acp.ResumeSessionParams) -> Answer:
        binding = await self._bind(params.session_id, after_seq=None, cwd=params.cwd)
        return Answer(await self._state(params.session_id), binding.editor_ready)

    async def session_controls(self, session_id: str) -> controls.Controls:
        """The session's modes and config options as they are now (Rule 8)."""
        options = await self.client.call(methods.OPTIONS, ctl.OptionsParams(session_id=session_id))
        return controls.Controls.of(options)

    async def _state(self, session_id: str) -> acp.SessionStateResult:
        state = await self.session_controls(session_id)
        return acp.SessionStateResult(
            modes=state.modes(), config_options=state.config_options(), models=state.models()
        )

    async def _set(
        self, session_id: str, changes: Callable[[controls.Controls], dict[str, Any]]
    ) -> controls.Controls:
        """Apply a mode or config option the editor chose (Rule 8); the session's
        controls after it."""
        try:
            wanted = changes(await self.session_controls(session_id))
        except controls.UnknownControl as exc:
            raise AcpError(acp.INVALID_PARAMS, str(exc)) from None
        if wanted:
            params = c.SetOptionsParams(
                session_id=session_id, changes=wanted, client_operation_id=uuid.uuid4().hex
            )
            await self.client.retrying(lambda: self.client.call(methods.SET_OPTIONS, params))
        return await self.session_controls(session_id)

    async def _list(self, params: acp.ListSessionsParams) -> acp.ListSessionsResult:
        sessions: list[s.SessionInfo] = []
        cursor: str | None = None
        while True:  # a page at a time: the daemon bounds each by bytes
            page = await self.client.call(methods.LIST, s.ListParams(cursor=cursor, brief=True))
            sessions += page.sessions
            if (cursor := page.next_cursor) is None:
                break
        return acp.ListSessionsResult(
            sessions=[
                acp.SessionListing(
                    session_id=info.session_id,
                    cwd=info.cwd,
                    title=info.title,
                    updated_at=datetime.datetime.fromtimestamp(
                        info.updated_at, datetime.UTC
                    ).isoformat(),
                )
                for info in sessions
                if params.cwd is None or info.cwd == params.cwd
            ]
        )

    async def _prompt(self, params: acp.PromptParams, arrival: int) -> acp.PromptResult:
        try:
            prompt = acp.daemon_prompt(params.prompt)
        except acp.UnsupportedContent as exc:
            raise AcpError(acp.INVALID_PARAMS, str(exc)) from None
        if self._cancelled_at.get(params.session_id, -1) > arrival:
            return acp.PromptResult(stop_reason="cancelled")  # cancelled before it was sent
        binding = self.bindings.get(params.session_id)
        if binding is None or binding.failure is not None:
            # A client that skipped session/load (or whose binding failed): follow live.
            binding = await self._bind(params.session_id, after_seq=None)
            binding.editor_ready()
        if not prompt.images and prompt.text.startswith("/"):
            names = {command.name for command in (await binding.commands()).commands}
            slash = controls.slash_command(prompt.text, names)
            if slash is not None:
                return await binding.command(*slash)
        return await binding.prompt(prompt, arrival)

    async def _bind(
        self, session_id: str, *, after_seq: int | None, cwd: str | None = None
    ) -> Binding:
        """A fresh binding for ``session_id``, subscribed; one it replaces is closed.
        ``after_seq`` 0 replays the whole journal, None follows from the head."""
        old = self.bindings.pop(session_id, None)
        if old is not None:
            old.close(AcpError(acp.INTERNAL_ERROR, "the session was loaded again"))
        binding = Binding(self, session_id, cwd)
        await self.nursery.start(binding.run, after_seq)
        self.bindings[session_id] = binding
        return binding
