"""Session rows (DESIGN.md section 3).

Every function here is synchronous and takes the connection it is given: writes run
inside ``Store.write`` (one savepoint of a group-committed transaction), reads inside
``Store.read``. Each write that changes a session also appends its journal events in
the same savepoint, so a record and the events that explain it commit together.

A session's ``head_seq`` is its journal's (``journal`` Rule 1), and its
``updated_at`` is the later of the record's own last change and its last event.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import attrs
import msgspec

from agentsd.store.database import StoreConnection
from agentsd.store.journal import StoredEvent, append_events
from agentsd_protocol.api.events import Event, encode_body, kind_of

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
    limits: dict[str, Any] | None = None  # its own limits, in the wire's names
    created_by: str | None = None  # the session whose agent created it; None: the user


_STORED_COLUMNS = (
    "id, host_id, provider, cwd, title, options, env, command, provider_handle, "
    "created_at, updated_at, fence, last_exit, error, limits, created_by"
)

# The stored columns in SessionRow's order, head_seq and updated_at derived from the
# journal through its (session_id, seq) index (two index probes per session).
_SELECT_SESSIONS = (
    "SELECT id, host_id, provider, cwd, title, options, env, command, provider_handle,"
    " created_at,"
    " MAX(updated_at, COALESCE((SELECT ts FROM events WHERE session_id = sessions.id"
    " ORDER BY seq DESC LIMIT 1), 0)),"
    " fence,"
    " (SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = sessions.id),"
    " last_exit, error, limits, created_by FROM sessions"
)


def _json_or_none(value: Any) -> str | None:
    return None if value is None else _json.encode(value).decode()


def load_json(text: str | bytes | None) -> Any:
    return None if text is None else msgspec.json.decode(text)


def _row_to_session(row: tuple[Any, ...]) -> SessionRow:
    return SessionRow(
        id=row[0],
        host_id=row[1],
        provider=row[2],
        cwd=row[3],
        title=row[4],
        options=load_json(row[5]) or {},
        env=load_json(row[6]) or {},
        command=load_json(row[7]),
        provider_handle=row[8],
        created_at=row[9],
        updated_at=row[10],
        fence=row[11],
        head_seq=row[12],
        last_exit=load_json(row[13]),
        error=load_json(row[14]),
        limits=load_json(row[15]),
        created_by=row[16],
    )


Events = Sequence[Event]


def encode_events(events: Events) -> list[tuple[str, bytes]]:
    """``events`` as ``Store.append`` and ``append_events`` take them."""
    return [(kind_of(event), encode_body(event)) for event in events]


def append(
    conn: StoreConnection, session_id: str, fence: int, events: Events, now: float
) -> list[StoredEvent]:
    if not events:
        return []
    return append_events(conn, session_id, fence, encode_events(events), now)


def holder_of(conn: StoreConnection, provider_handle: str) -> str | None:
    """The id of a stored session holding the provider conversation, if any (a
    scan: adoptions are rare, sessions a few thousand at most)."""
    row = conn.execute(
        "SELECT id FROM sessions WHERE provider_handle = ? LIMIT 1", (provider_handle,)
    ).fetchone()
    return None if row is None else str(row[0])


def insert_session(conn: StoreConnection, row: SessionRow, events: Events) -> list[StoredEvent]:
    conn.execute(
        f"INSERT INTO sessions ({_STORED_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
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
            _json_or_none(row.last_exit),
            _json_or_none(row.error),
            _json_or_none(row.limits),
            row.created_by,
        ),
    )
    conn.memory.session_created(row.id)
    return append(conn, row.id, row.fence, events, row.created_at)


def load_sessions(conn: sqlite3.Connection) -> list[SessionRow]:
    cursor = conn.execute(f"{_SELECT_SESSIONS} ORDER BY created_at, id")
    return [_row_to_session(r) for r in cursor.fetchall()]


def load_session(conn: sqlite3.Connection, session_id: str) -> SessionRow | None:
    cursor = conn.execute(f"{_SELECT_SESSIONS} WHERE id = ?", (session_id,))
    row = cursor.fetchone()
    return None if row is None else _row_to_session(row)


def update_session(
    conn: StoreConnection,
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
    return append(conn, session_id, fence, events, now)


def delete_session(conn: StoreConnection, session_id: str) -> None:
    """Remove the record, its journal and its leases. Only for a session whose every
    lease is released; the caller checks."""
    conn.execute("DELETE FROM events WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM leases WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
    conn.memory.session_deleted(session_id)
