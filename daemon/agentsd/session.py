"""A session's in-memory state and the status derived from its journal.

Rule 1: ``Session`` is owned by the supervisor; only the session's own task changes
``phase``, ``lease`` and ``child`` (and the settle of an unproven exit, under
``lock``, while no task runs); handlers change the record under ``lock``. ``phase``
changes only through ``Session.transition``, by the table in ``agentsd.phase``, which
tells the status board.

Rule 2: ``status`` is never set directly. It is derived by ``Conversation.apply``
from journal events, in seq order: ``attention`` while an approval is pending,
``working`` while a turn runs or a submission has no dispatch outcome, else ``idle``.
Replaying the journal tail after a restart gives the same answer.

Rule 3: ``head_seq``, ``conversation``, ``queue`` and ``summary`` change only through the
session's journal
port (``agentsd.session_journal``), after a commit: every writer of the session's
events goes through that port.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import attrs
import msgspec
import trio

from agentsd.config import Limits
from agentsd.leases import Lease
from agentsd.phase import advance, initial_phase
from agentsd.prompt_queue import PromptQueue
from agentsd.store.journal import has_kind_after, last_seq_of_kind, read_events
from agentsd.store.sessions import SessionRow
from agentsd.summary import Summary
from agentsd_protocol.api.events import (
    ApprovalRequested,
    ApprovalResolved,
    ChildExited,
    ChildReady,
    ChildReattached,
    ConversationCleared,
    Event,
    Submission,
    SubmissionDispatched,
    ThreadSuperseded,
    TurnCompleted,
    TurnStarted,
    UnknownEvent,
    decode_event,
    kind_of,
)
from agentsd_protocol.api.session import (
    ChildInfo,
    ExitInfo,
    Phase,
    Resources,
    SessionError,
    SessionInfo,
    SessionLimits,
    Status,
)

if TYPE_CHECKING:
    from agentsd.session_journal import SessionJournal
    from agentsd.session_task import SessionTask
    from agentsd.status_board import StatusBoard


MAX_RECENT_RESOLUTIONS = 256  # per session; enough for every client racing on recent ones
_NO_IDS: frozenset[str] = frozenset()  # shared by every conversation with nothing pending


@attrs.define
class PendingApproval:
    approval_id: str
    native_id: str
    seq: int
    kind: str
    options: list[str]
    turn_id: str | None = None  # the turn that raised it; it cannot outlive that turn
    title: str = ""
    # What the adapter needs to answer it (``ApprovalRequested.request``), for an
    # adapter that takes the agent over (``PendingTakeover.request``).
    request: dict[str, Any] | None = None


@attrs.define
class Conversation:
    """The part of the journal that decides status: a pure reducer over events."""

    turn_id: str | None = None
    turn_open: bool = False
    # clientMessageIds. Immutable and replaced on change: most sessions have none,
    # and every session would otherwise hold an empty set (216 bytes).
    undispatched: frozenset[str] = _NO_IDS
    approvals: dict[str, PendingApproval] = attrs.field(factory=dict)
    # Recent resolutions by approval id, for ``already_resolved`` answers; older ones
    # are looked up in the journal.
    resolved: dict[str, ApprovalResolved] = attrs.field(factory=dict)

    @property
    def status(self) -> Status:
        if self.approvals:
            return "attention"
        if self.turn_open or self.undispatched:
            return "working"
        return "idle"

    def apply(self, seq: int, event: Event | UnknownEvent) -> None:
        match event:
            case Submission(client_message_id=cmid):
                self.undispatched |= {cmid}
            case SubmissionDispatched(client_message_id=cmid):
                self.undispatched = self.undispatched - {cmid} or _NO_IDS
            case TurnStarted(turn_id=turn_id):
                self.turn_open = True
                self.turn_id = turn_id
            case TurnCompleted():
                self.turn_open = False
                self.turn_id = None
            case ApprovalRequested():
                self.approvals[event.approval_id] = PendingApproval(
                    approval_id=event.approval_id,
                    native_id=event.native_id,
                    seq=seq,
                    kind=event.approval_kind,
                    options=event.options,
                    turn_id=self.turn_id,
                    title=event.title,
                    request=event.request,
                )
            case ApprovalResolved(approval_id=approval_id):
                self.approvals.pop(approval_id, None)
                self.resolved[approval_id] = event
                if len(self.resolved) > MAX_RECENT_RESOLUTIONS:
                    del self.resolved[next(iter(self.resolved))]
            case ChildExited():
                # A child's end settles its turn and approvals (journaled just before).
                self.turn_open = False
                self.turn_id = None
                self.approvals.clear()
            case _:
                pass


@attrs.define(eq=False)
class Session:
    row: SessionRow
    head_seq: int
    # Told of every change of phase or status; shared by the daemon's sessions.
    board: StatusBoard
    lease: Lease | None = None
    _phase: Phase = attrs.field(
        init=False, default=attrs.Factory(lambda self: initial_phase(self.lease), takes_self=True)
    )
    child: ChildInfo | None = None
    # The latest sample of its running agent's figures (``agentsd.resources``), for
    # the status feed; shown only while ``child`` is set.
    resources: Resources | None = None
    last_exit: ExitInfo | None = None
    error: SessionError | None = None
    conversation: Conversation = attrs.field(factory=Conversation)
    queue: PromptQueue = attrs.field(factory=PromptQueue)
    # What status bars and notifiers show (``agentsd.summary``); fed like
    # ``conversation``, by the journal port (Rule 3).
    summary: Summary = attrs.field(factory=Summary)
    task: SessionTask | None = None
    # Approvals answered but not yet committed: the first answer's claim (Rule 2 of
    # ``handlers.conversation``).
    claims: dict[str, ApprovalResolved] = attrs.field(factory=dict)
    deleting: bool = False
    lock: trio.Lock = attrs.field(factory=trio.Lock)
    # setOptions and commands run one at a time under it (``handlers.controls``).
    controls_lock: trio.Lock = attrs.field(factory=trio.Lock)
    # The keyed writes to the agent (answers to approvals, interrupts) are committed
    # and written one at a time under it, so the journal's order of them is the order
    # the holder took their keys (``handlers.conversation`` Rules 2 and 3).
    keyed_writes: trio.Lock = attrs.field(factory=trio.Lock)
    # Set when the running turn is over, for whoever waits for that (``wait_turn_over``).
    _turn_over: trio.Event | None = None
    # Bound by the supervisor when it registers the session (Rule 3). Recovery
    # settles sessions of its own, before anything is served, with the store's write.
    journal: SessionJournal = attrs.field(init=False, repr=False)

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def fence(self) -> int:
        return self.row.fence

    @property
    def status(self) -> Status:
        return self.conversation.status

    @property
    def phase(self) -> Phase:
        return self._phase

    async def wait_turn_over(self) -> None:
        """Return once no turn runs."""
        while self.conversation.turn_open:
            if self._turn_over is None:
                self._turn_over = trio.Event()
            await self._turn_over.wait()

    def conversation_changed(self) -> None:
        """Called by the journal port after it applied committed events: wakes
        whoever waits for the turn's end, and the session task when the queue's
        head is due."""
        if self._turn_over is not None and not self.conversation.turn_open:
            self._turn_over.set()
            self._turn_over = None
        if self.task is not None and self.queue_due():
            self.task.wake_queue()

    def queue_due(self) -> bool:
        """Whether the queue's head should be sent now: it is neither paused nor
        claimed, no turn runs and no prompt waits for its dispatch outcome."""
        convo = self.conversation
        return (
            bool(self.queue.prompts)
            and not convo.turn_open
            and not convo.undispatched
            and self.queue.head() is not None
        )

    def transition(self, new: Phase) -> None:
        """Move to phase ``new``; raises ``PhaseError`` if the table has no such move."""
        self._phase = advance(self._phase, new)
        self.board.changed(self)

    def info(self, resources: Resources | None = None) -> SessionInfo:
        """What the wire shows of it; ``resources``: its running agent's figures."""
        row = self.row
        return SessionInfo(
            session_id=row.id,
            provider=row.provider,
            cwd=row.cwd,
            title=row.title,
            options=row.options,
            env=row.env,
            command=row.command,
            provider_handle=row.provider_handle,
            created_at=row.created_at,
            updated_at=row.updated_at,
            fence=row.fence,
            phase=self.phase,
            status=self.status,
            head_seq=self.head_seq,
            queued=len(self.queue.prompts),
            queue_paused=self.queue.paused,
            child=self.child,
            last_exit=self.last_exit,
            error=self.error,
            limits=self.own_limits_info(),
            created_by=row.created_by,
            tokens=self.summary.tokens,
            resources=resources,
        )

    def own_limits_info(self) -> SessionLimits | None:
        """The limits it was created with, as the wire shows them."""
        if self.row.limits is None:
            return None
        return msgspec.convert(self.row.limits, SessionLimits)

    def own_limits(self) -> Limits:
        """The limits it was created with (unset ones: the daemon's defaults)."""
        info = self.own_limits_info()
        if info is None:
            return Limits()
        return Limits(
            memory_max_bytes=info.memory_max, pids_max=info.pids_max, cpu_max=info.cpu_max
        )


def derive_conversation(conn: sqlite3.Connection, session_id: str) -> Conversation:
    """The conversation state since the session's last child exit, replayed from the
    journal (everything before that exit was settled by it)."""
    convo = Conversation()
    after = last_seq_of_kind(conn, session_id, kind_of(ChildExited))
    while True:
        page, more = read_events(conn, session_id, after_seq=after, limit=1000, max_bytes=4 << 20)
        for event in page:
            convo.apply(event.seq, decode_event(event.kind, event.body))
            after = event.seq
        if not more or not page:
            return convo


def had_turns(conn: sqlite3.Connection, session_id: str) -> bool:
    """Whether the session's current provider conversation had a turn: a
    ``turn.started`` since the last ``thread.superseded`` or ``conversation.cleared``
    (either began it), so the provider must have saved it."""
    began = max(
        last_seq_of_kind(conn, session_id, kind_of(ThreadSuperseded)),
        last_seq_of_kind(conn, session_id, kind_of(ConversationCleared)),
    )
    return has_kind_after(conn, session_id, kind_of(TurnStarted), began)


def was_ready(conn: sqlite3.Connection, session_id: str) -> bool:
    """Whether a child of the session ever completed its handshake."""
    return last_seq_of_kind(conn, session_id, kind_of(ChildReady)) > 0


def ready_generation(conn: sqlite3.Connection, session_id: str) -> str | None:
    """The generation of the child whose ``child.ready`` is the session's last
    (None: none ever was): whether the child of a lease completed its handshake."""
    seq = max(
        last_seq_of_kind(conn, session_id, kind_of(ChildReady)) or 0,
        last_seq_of_kind(conn, session_id, kind_of(ChildReattached)) or 0,
    )
    if not seq:
        return None
    [event], _ = read_events(conn, session_id, after_seq=seq - 1, limit=1, max_bytes=1 << 20)
    ready = decode_event(event.kind, event.body)
    return ready.generation if isinstance(ready, ChildReady | ChildReattached) else None
