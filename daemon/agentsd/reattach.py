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
"""

from __future__ import annotations

import sqlite3

from agentsd.providers.base import PendingTakeover, Takeover
from agentsd.session import Session
from agentsd.sink import OpenItem
from agentsd.store.journal import last_seq_of_kind, read_events
from agentsd.store.writer import Store
from agentsd_protocol.api.events import (
    ChildReady,
    ItemCompleted,
    ItemStarted,
    ItemUpdated,
    decode_event,
    kind_of,
)

__all__ = ["journaled_child", "takeover_state"]

PAGE_EVENTS = 1000
PAGE_BYTES = 4 << 20


def journaled_child(
    conn: sqlite3.Connection, session_id: str
) -> tuple[str | None, dict[str, OpenItem]]:
    """The agent version of the session's last ``child.ready`` and the items opened
    since then and not completed, with their text as last journaled (Rule 1)."""
    after = last_seq_of_kind(conn, session_id, kind_of(ChildReady))
    version = None
    items: dict[str, OpenItem] = {}
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
                    version = agent_version
                case ItemStarted(item_id=item_id):
                    items.setdefault(item_id, OpenItem(text="", length=0))
                case ItemUpdated(item_id=item_id, text=text, length=length):
                    items[item_id] = OpenItem(
                        text=text, length=len(text) if length is None else length
                    )
                case ItemCompleted(item_id=item_id):
                    items.pop(item_id, None)
                case _:
                    pass
            after = stored.seq
        if not more or not page:
            return version, items


async def takeover_state(
    store: Store, session: Session, fence: int, undispatched: tuple[str, ...]
) -> tuple[Takeover, dict[str, OpenItem]]:
    """The adapter's `Takeover` for the session's agent under the lease ``fence``
    (just taken over; ``undispatched``: the submissions that takeover settled
    ``unknown``), and the sink's open items."""
    session_id = session.id
    version, items = await store.read(lambda conn: journaled_child(conn, session_id))
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
        ),
        undispatched=undispatched,
        options=dict(session.row.options),
        agent_version=version,
        open_items={item_id: item.text for item_id, item in items.items()},
    )
    return state, items
