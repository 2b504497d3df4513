"""What a daemon taking over a running agent learns from the journal (issue 19).

With the holder and ``crash_policy = "reattach"``, recovery hands the supervisor
the held leases whose agents the holder kept through the previous daemon's death
(``agentsd.recovery.Reattachable``). Each session task (``agentsd.takeover``) then
takes its lease over (``agentsd.held_lease.open_lease`` with ``handover``), claims
the agent from the holder (``agentsd.held_child.adopt_held_child``) and, instead of
a handshake, gives its adapter the `Takeover` built here (``Adapter.take_over``).

Rule 1: everything here is read from the journal as committed: the open turn,
pending approvals and submissions as the session's conversation derives them, the
items that were streaming (their text as last journaled: the sink goes on from it,
``agentsd.sink`` Rule 4) and the agent's version, all since the child's
``child.ready`` (nothing before it belongs to this child).

Rule 2 (answers and interrupts that did not reach the agent): a client's answer,
and a client's interrupt (``interrupt.requested``), is committed, then written to
the agent keyed with its seq, one keyed write at a time per session
(``handlers.conversation`` Rules 2 and 3, ``agentsd.delivery`` Rule 3), so the
journal's order of answers and interrupts is the order the holder took them. The
holder reports the last key it took for the agent (``agentsd.holder_link`` Rule 5):
the answers and interrupts journaled after that one were committed and never
written (the daemon died between the two), and are written now, in journal order:
an answer (`Answer`) after the adapter restored its question, an interrupt
(`Interrupt`) only when the turn it named is still the open one (one that ended
needs none), once. None is written again when the holder cannot say
(``keys_known`` False), nor when its key is not one of this child's answers or
interrupts: at most once before exactly once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import attrs

from agentsd.providers.base import PendingTakeover, Takeover
from agentsd.session import Session
from agentsd.sink import OpenItem
from agentsd.store.journal import last_seq_of_kind, read_events
from agentsd.store.writer import Store
from agentsd_protocol.api.events import (
    ApprovalRequested,
    ApprovalResolved,
    ChildReady,
    InterruptRequested,
    ItemCompleted,
    ItemStarted,
    ItemUpdated,
    decode_event,
    kind_of,
)

__all__ = [
    "Answer",
    "Interrupt",
    "JournaledChild",
    "KeyedWrite",
    "journaled_child",
    "owed",
    "takeover_state",
    "undelivered",
]

PAGE_EVENTS = 1000
PAGE_BYTES = 4 << 20


@attrs.frozen
class Answer:
    """A client's answer to one of the child's approvals, as journaled (Rule 2)."""

    asked: ApprovalRequested
    decision: str
    seq: int  # of the answer in the journal: its key (``agentsd.delivery`` Rule 3)

    @property
    def approval_id(self) -> str:
        return self.asked.approval_id

    def pending(self) -> PendingTakeover:
        """The question, for the adapter to restore before the answer is written."""
        asked = self.asked
        return PendingTakeover(
            native_id=asked.native_id,
            approval_id=asked.approval_id,
            kind=asked.approval_kind,
            options=tuple(asked.options),
            request=asked.request,
        )


@attrs.frozen
class Interrupt:
    """A client's interrupt of the child's turn ``turn_id``, as journaled (Rule 2)."""

    turn_id: str | None
    seq: int  # of its ``interrupt.requested``: its key (``agentsd.delivery`` Rule 3)


KeyedWrite = Answer | Interrupt


@attrs.define
class JournaledChild:
    """What the journal holds of the current child since its ``child.ready``."""

    version: str | None = None
    items: dict[str, OpenItem] = attrs.field(factory=dict)
    # The clients' answers and interrupts, in journal order: the keyed writes.
    writes: list[KeyedWrite] = attrs.field(factory=list)


def journaled_child(conn: sqlite3.Connection, session_id: str) -> JournaledChild:
    """The agent version of the session's last ``child.ready``, the items opened
    since then and not completed, with their text as last journaled, and the
    clients' answers and interrupts since then (Rules 1 and 2)."""
    after = last_seq_of_kind(conn, session_id, kind_of(ChildReady))
    child = JournaledChild()
    items = child.items
    asked: dict[str, ApprovalRequested] = {}
    first = True
    while True:
        page, more = read_events(
            conn,
            session_id,
            after_seq=after - 1 if first else after,
            limit=PAGE_EVENTS,
            max_bytes=PAGE_BYTES,
        )
        first = False
        for stored in page:
            event = decode_event(stored.kind, stored.body)
            match event:
                case ChildReady(agent_version=agent_version):
                    child.version = agent_version
                case ItemStarted(item_id=item_id):
                    items.setdefault(item_id, OpenItem(text="", length=0))
                case ItemUpdated(item_id=item_id, text=text, length=length):
                    items[item_id] = OpenItem(
                        text=text, length=len(text) if length is None else length
                    )
                case ItemCompleted(item_id=item_id):
                    items.pop(item_id, None)
                case ApprovalRequested(approval_id=approval_id):
                    asked[approval_id] = event
                case ApprovalResolved(approval_id=approval_id, by="client", decision=decision):
                    question = asked.pop(approval_id, None)
                    if question is not None:
                        child.writes.append(Answer(question, decision, stored.seq))
                case InterruptRequested(turn_id=turn_id):
                    child.writes.append(Interrupt(turn_id, stored.seq))
                case _:
                    pass
            after = stored.seq
        if not more or not page:
            return child


def undelivered(
    writes: Sequence[KeyedWrite], stdin_key: str | None, keys_known: bool
) -> list[KeyedWrite]:
    """The answers and interrupts committed after the last one the holder took (Rule
    2), in journal order."""
    if not keys_known:
        return []
    if stdin_key is None:
        return list(writes)
    taken = [i for i, write in enumerate(writes) if str(write.seq) == stdin_key]
    return list(writes[taken[0] + 1 :]) if taken else []


def owed(writes: Sequence[KeyedWrite], turn_open: bool, turn_id: str | None) -> list[KeyedWrite]:
    """Of the ``undelivered`` writes, those to write now, in journal order (Rule 2):
    every answer, and an interrupt only when it names the open turn ``turn_id``, the
    first such one only (the agent stops a turn once)."""
    out: list[KeyedWrite] = []
    interrupting = False
    for write in writes:
        if isinstance(write, Interrupt):
            if interrupting or not turn_open or write.turn_id is None or write.turn_id != turn_id:
                continue
            interrupting = True
        out.append(write)
    return out


async def takeover_state(
    store: Store,
    session: Session,
    fence: int,
    undispatched: tuple[str, ...],
    stdin_key: str | None,
    keys_known: bool,
) -> tuple[Takeover, dict[str, OpenItem], list[KeyedWrite]]:
    """The adapter's `Takeover` for the session's agent under the lease ``fence``
    (just taken over; ``undispatched``: the submissions that takeover settled
    ``unknown``), the sink's open items, and the answers and interrupts to write
    once the adapter took over, in journal order (Rule 2: the holder's
    ``stdin_key`` and ``keys_known``; the interrupts are not yet matched with the
    open turn)."""
    session_id = session.id
    child = await store.read(lambda conn: journaled_child(conn, session_id))
    version, items = child.version, child.items
    writes = undelivered(child.writes, stdin_key, keys_known)
    convo = session.conversation
    handle = session.row.provider_handle
    assert handle is not None, "a ready child recorded its handle"
    state = Takeover(
        handle=handle,
        generation=fence,
        turn_id=convo.turn_id,
        turn_open=convo.turn_open,
        approvals=tuple(
            PendingTakeover(
                native_id=a.native_id,
                approval_id=a.approval_id,
                kind=a.kind,
                options=tuple(a.options),
                request=a.request,
            )
            for a in convo.approvals.values()
        )
        + tuple(write.pending() for write in writes if isinstance(write, Answer)),
        undispatched=undispatched,
        options=dict(session.row.options),
        agent_version=version,
        open_items={item_id: item.text for item_id, item in items.items()},
    )
    return state, items, writes
