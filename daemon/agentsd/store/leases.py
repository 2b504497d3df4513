"""Lease rows (DESIGN.md section 3): the durable side of ``agentsd.leases``.

Every function here is synchronous and takes the connection it is given: writes run
inside ``Store.write``, reads inside ``Store.read``. A lease change and the journal
events that tell it commit together, in the op's savepoint.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import attrs
import msgspec

from agentsd import leases
from agentsd.leases import ClaimState, ExitEvidence, Identity, Lease
from agentsd.store.database import StoreConnection
from agentsd.store.journal import StoredEvent
from agentsd.store.sessions import Events, append, load_json, update_session
from agentsd_protocol.api.events import (
    ChildReattached,
    ChildSpawned,
    Event,
    LeaseAcquired,
    LeaseReleased,
    SubmissionDispatched,
)

_json = msgspec.json.Encoder()


_LEASE_COLUMNS = (
    "session_id, fence, generation, state, token, pid, start_time, pgid, "
    "acquired_at, live_at, released_at, death"
)


class NoReservation(Exception):
    """``withdraw_reservation`` found no reservation to withdraw."""


def _row_to_lease(row: tuple[Any, ...]) -> Lease:
    identity = None
    if row[5] is not None:
        identity = Identity(pid=row[5], pgid=row[7], start_time=row[6])
    death = None
    if row[11] is not None:
        death = msgspec.convert(load_json(row[11]), ExitEvidenceWire).to_evidence()
    return Lease(
        session_id=row[0],
        fence=row[1],
        generation=row[2],
        state=ClaimState(row[3]),
        token=row[4],
        identity=identity,
        acquired_at=row[8],
        live_at=row[9],
        released_at=row[10],
        death=death,
    )


class ExitEvidenceWire(msgspec.Struct, frozen=True):
    cause: str
    proven: bool
    returncode: int | None = None
    signal: int | None = None
    detail: str = ""

    def to_evidence(self) -> ExitEvidence:
        return ExitEvidence(
            cause=self.cause,
            proven=self.proven,
            returncode=self.returncode,
            signal=self.signal,
            detail=self.detail,
        )

    @classmethod
    def of(cls, evidence: ExitEvidence) -> ExitEvidenceWire:
        return cls(**attrs.asdict(evidence))


def _write_lease(conn: StoreConnection, lease: Lease) -> None:
    ident = lease.identity
    conn.execute(
        f"INSERT OR REPLACE INTO leases ({_LEASE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            lease.session_id,
            lease.fence,
            lease.generation,
            lease.state.value,
            lease.token,
            None if ident is None else ident.pid,
            None if ident is None else ident.start_time,
            None if ident is None else ident.pgid,
            lease.acquired_at,
            lease.live_at,
            lease.released_at,
            None
            if lease.death is None
            else _json.encode(ExitEvidenceWire.of(lease.death)).decode(),
        ),
    )


def latest_lease(conn: sqlite3.Connection, session_id: str) -> Lease | None:
    row = conn.execute(
        f"SELECT {_LEASE_COLUMNS} FROM leases WHERE session_id = ? ORDER BY fence DESC LIMIT 1",
        (session_id,),
    ).fetchone()
    return None if row is None else _row_to_lease(row)


def load_held_leases(conn: sqlite3.Connection) -> list[Lease]:
    rows = conn.execute(
        f"SELECT {_LEASE_COLUMNS} FROM leases WHERE state != 'released' ORDER BY session_id, fence"
    ).fetchall()
    return [_row_to_lease(r) for r in rows]


def acquire_lease(
    conn: StoreConnection, session_id: str, now: float
) -> tuple[Lease, list[StoredEvent]]:
    """Take the next fence durably (before any spawn) and reserve the lease."""
    row = conn.execute("SELECT fence FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise KeyError(session_id)
    lease = leases.acquire(session_id, row[0], latest_lease(conn, session_id), now)
    conn.execute("UPDATE sessions SET fence = ? WHERE id = ?", (lease.fence, session_id))
    _write_lease(conn, lease)
    events = append(
        conn,
        session_id,
        lease.fence,
        [LeaseAcquired(fence=lease.fence, generation=lease.generation)],
        now,
    )
    return lease, events


def lease_live(
    conn: StoreConnection, lease: Lease, identity: Identity, now: float
) -> tuple[Lease, list[StoredEvent]]:
    live = leases.go_live(lease, identity, now)
    _write_lease(conn, live)
    events = append(
        conn,
        lease.session_id,
        lease.fence,
        [
            ChildSpawned(
                pid=identity.pid,
                pgid=identity.pgid,
                generation=lease.generation,
                fence=lease.fence,
            )
        ],
        now,
    )
    return live, events


def lease_released(
    conn: StoreConnection,
    lease: Lease,
    evidence: ExitEvidence,
    now: float,
    events: Events,
    **session_fields: Any,
) -> tuple[Lease, list[StoredEvent]]:
    """Release after proof of exit, with the events that tell the story (child.exited
    and whatever the session settles) and session fields, in one savepoint."""
    released = leases.release(lease, evidence, now)
    _write_lease(conn, released)
    all_events = [*events, LeaseReleased(fence=lease.fence)]
    stored = update_session(conn, lease.session_id, lease.fence, now, all_events, **session_fields)
    return released, stored


def withdraw_reservation(
    conn: StoreConnection,
    *,
    session_id: str,
    known_fence: int,
    evidence: ExitEvidence,
    now: float,
    events: Events,
    **session_fields: Any,
) -> tuple[Lease, list[StoredEvent]]:
    """Release the session's latest lease if it is a reservation above
    ``known_fence`` (one taken by a start that gave up waiting for it), with
    ``events``. Raises ``NoReservation`` (nothing written) otherwise."""
    lease = latest_lease(conn, session_id)
    if lease is None or lease.state is not ClaimState.RESERVED or lease.fence <= known_fence:
        raise NoReservation(session_id)
    return lease_released(conn, lease, evidence, now, events, **session_fields)


def lease_unproven(
    conn: StoreConnection, lease: Lease, evidence: ExitEvidence, now: float, events: Events
) -> tuple[Lease, list[StoredEvent]]:
    held = leases.record_unproven(lease, evidence)
    _write_lease(conn, held)
    stored = append(conn, lease.session_id, lease.fence, events, now)
    return held, stored


def held_output(conn: sqlite3.Connection, session_id: str, fence: int) -> tuple[int, int]:
    """Where the held agent of lease ``fence`` is journaled up to (schema v5): the
    stdout offset to read from again, and how many events of the line there were
    journaled already. ``(0, 0)`` for a lease that recorded none."""
    row = conn.execute(
        "SELECT out_offset, out_skip FROM leases WHERE session_id = ? AND fence = ?",
        (session_id, fence),
    ).fetchone()
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


def record_output(
    conn: StoreConnection, session_id: str, fence: int, offset: int, skip: int
) -> None:
    """Record where the held agent of lease ``fence`` is journaled up to, in the
    transaction of the events that got it there (``agentsd.sink`` Rule 4)."""
    conn.execute(
        "UPDATE leases SET out_offset = ?, out_skip = ? WHERE session_id = ? AND fence = ?",
        (offset, skip, session_id, fence),
    )


def hand_over_lease(
    conn: StoreConnection, lease: Lease, from_seq: int, undispatched: list[str], now: float
) -> tuple[Lease, list[StoredEvent]]:
    """Take the live ``lease`` over for a daemon that reattaches its child: the same
    row (its child and its output position) under fence + 1 and a new generation,
    the session's fence with it, ``child.reattached`` journaled under the new fence,
    and each submission in ``undispatched`` settled ``unknown`` (the previous daemon
    may or may not have written it to the agent). Raises ``LeaseError`` if the lease
    is not the session's current live one."""
    taken = leases.hand_over(lease)
    row = conn.execute("SELECT fence FROM sessions WHERE id = ?", (lease.session_id,)).fetchone()
    current = latest_lease(conn, lease.session_id)
    if row is None or row[0] != lease.fence or current != lease:
        raise leases.LeaseError(f"session {lease.session_id}: lease fence {lease.fence} is stale")
    conn.execute(
        "UPDATE leases SET fence = ?, generation = ? WHERE session_id = ? AND fence = ?",
        (taken.fence, taken.generation, lease.session_id, lease.fence),
    )
    conn.execute("UPDATE sessions SET fence = ? WHERE id = ?", (taken.fence, lease.session_id))
    assert taken.identity is not None
    events: list[Event] = [
        ChildReattached(
            pid=taken.identity.pid,
            fence=taken.fence,
            generation=taken.generation,
            previous_fence=lease.fence,
            from_seq=from_seq,
        ),
        *(
            SubmissionDispatched(client_message_id=cmid, outcome="unknown", reason="daemon-restart")
            for cmid in undispatched
        ),
    ]
    return taken, append(conn, lease.session_id, taken.fence, events, now)
