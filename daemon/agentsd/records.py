"""Session and lease rows: the SQL behind the durable state of DESIGN.md section 3.

Every function here is synchronous and takes the connection it is given: writes run
inside ``Store.write`` (one savepoint of a group-committed transaction), reads inside
``Store.read``. Each write that changes a session also appends its journal events in
the same savepoint, so a record and the events that explain it commit together.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import attrs
import msgspec

from agentsd import leases
from agentsd.leases import ClaimState, ExitEvidence, Identity, Lease
from agentsd.store.journal import StoredEvent, append_events
from agentsd_protocol.api.events import (
    ChildSpawned,
    Event,
    LeaseAcquired,
    LeaseReleased,
    encode_body,
    kind_of,
)

_json = msgspec.json.Encoder()


@attrs.frozen
class SessionRow:
    id: str
    host_id: str
    provider: str
    cwd: str
    title: str | None
    options: dict[str, Any]
    env: dict[str, str]
    command: list[str] | None
    provider_handle: str | None
    created_at: float
    updated_at: float
    fence: int = 0
    head_seq: int = 0
    last_exit: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


_SESSION_COLUMNS = (
    "id, host_id, provider, cwd, title, options, env, command, provider_handle, "
    "created_at, updated_at, fence, head_seq, last_exit, error"
)


def _json_or_none(value: Any) -> str | None:
    return None if value is None else _json.encode(value).decode()


def _load_json(text: str | bytes | None) -> Any:
    return None if text is None else msgspec.json.decode(text)


def _row_to_session(row: tuple[Any, ...]) -> SessionRow:
    return SessionRow(
        id=row[0],
        host_id=row[1],
        provider=row[2],
        cwd=row[3],
        title=row[4],
        options=_load_json(row[5]) or {},
        env=_load_json(row[6]) or {},
        command=_load_json(row[7]),
        provider_handle=row[8],
        created_at=row[9],
        updated_at=row[10],
        fence=row[11],
        head_seq=row[12],
        last_exit=_load_json(row[13]),
        error=_load_json(row[14]),
    )


Events = Sequence[Event]


def _append(
    conn: sqlite3.Connection, session_id: str, fence: int, events: Events, now: float
) -> list[StoredEvent]:
    if not events:
        return []
    items = [(kind_of(event), encode_body(event)) for event in events]
    return append_events(conn, session_id, fence, items, now)


def insert_session(conn: sqlite3.Connection, row: SessionRow, events: Events) -> list[StoredEvent]:
    conn.execute(
        f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            row.id,
            row.host_id,
            row.provider,
            row.cwd,
            row.title,
            _json_or_none(row.options),
            _json_or_none(row.env),
            _json_or_none(row.command),
            row.provider_handle,
            row.created_at,
            row.updated_at,
            row.fence,
            row.head_seq,
            _json_or_none(row.last_exit),
            _json_or_none(row.error),
        ),
    )
    return _append(conn, row.id, row.fence, events, row.created_at)


def load_sessions(conn: sqlite3.Connection) -> list[SessionRow]:
    cursor = conn.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY created_at, id")
    return [_row_to_session(r) for r in cursor.fetchall()]


def load_session(conn: sqlite3.Connection, session_id: str) -> SessionRow | None:
    cursor = conn.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,))
    row = cursor.fetchone()
    return None if row is None else _row_to_session(row)


def update_session(
    conn: sqlite3.Connection,
    session_id: str,
    fence: int,
    now: float,
    events: Events = (),
    **fields: Any,
) -> list[StoredEvent]:
    """Set some columns (provider_handle, title, options, last_exit, error) and append
    events, atomically."""
    allowed = {"provider_handle", "title", "options", "last_exit", "error"}
    unknown = set(fields) - allowed
    if unknown:
        raise ValueError(f"not updatable: {sorted(unknown)}")
    if fields:
        assignments = ", ".join(f"{name} = ?" for name in fields)
        values = [
            v if name in {"provider_handle", "title"} else _json_or_none(v)
            for name, v in fields.items()
        ]
        conn.execute(
            f"UPDATE sessions SET {assignments}, updated_at = ? WHERE id = ?",
            (*values, now, session_id),
        )
    return _append(conn, session_id, fence, events, now)


def delete_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Remove the record, its journal and its leases. Only for a session whose every
    lease is released; the caller checks."""
    conn.execute("DELETE FROM events WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM leases WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))


# ---- leases -------------------------------------------------------------------

_LEASE_COLUMNS = (
    "session_id, fence, generation, state, token, pid, start_time, pgid, "
    "acquired_at, live_at, released_at, death"
)


def _row_to_lease(row: tuple[Any, ...]) -> Lease:
    identity = None
    if row[5] is not None:
        identity = Identity(pid=row[5], pgid=row[7], start_time=row[6])
    death = None
    if row[11] is not None:
        death = msgspec.convert(_load_json(row[11]), ExitEvidenceWire).to_evidence()
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


def _write_lease(conn: sqlite3.Connection, lease: Lease) -> None:
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
    conn: sqlite3.Connection, session_id: str, now: float
) -> tuple[Lease, list[StoredEvent]]:
    """Take the next fence durably (before any spawn) and reserve the lease."""
    row = conn.execute("SELECT fence FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        raise KeyError(session_id)
    lease = leases.acquire(session_id, row[0], latest_lease(conn, session_id), now)
    conn.execute("UPDATE sessions SET fence = ? WHERE id = ?", (lease.fence, session_id))
    _write_lease(conn, lease)
    events = _append(
        conn,
        session_id,
        lease.fence,
        [LeaseAcquired(fence=lease.fence, generation=lease.generation)],
        now,
    )
    return lease, events


def lease_live(
    conn: sqlite3.Connection, lease: Lease, identity: Identity, now: float
) -> tuple[Lease, list[StoredEvent]]:
    live = leases.go_live(lease, identity, now)
    _write_lease(conn, live)
    events = _append(
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
    conn: sqlite3.Connection,
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


def lease_unproven(
    conn: sqlite3.Connection, lease: Lease, evidence: ExitEvidence, now: float, events: Events
) -> tuple[Lease, list[StoredEvent]]:
    held = leases.record_unproven(lease, evidence)
    _write_lease(conn, held)
    stored = _append(conn, lease.session_id, lease.fence, events, now)
    return held, stored
