"""The event journal: append-only, contiguous seq per session.

Rule 1: seqs come from the writer's memory of each session's head
(``memory.WriterMemory``), reserved inside the writing transaction and undone with
it, so seqs never have gaps and never repeat: the events of a session are exactly
``1..head``, and the head is ``MAX(seq)``.

Rule 2: ordering is by seq, never by time; ``ts`` is informational.

Rule 3: the functions here are synchronous and take a connection: they run inside
``Store.write`` (appends) or ``Store.read`` (pages and queries), which own the
transaction. ``Append`` is the one op the writer recognises: it reserves its seqs
when its turn comes and leaves its rows for the writer to insert together with the
rows of the appends around it (``writer`` Rule 1).
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import msgspec

from agentsd.store.database import StoreConnection
from agentsd.store.memory import UnknownSession

__all__ = [
    "Append",
    "EventRow",
    "StoredEvent",
    "UnknownSession",
    "append_events",
    "bodies_of_kind",
    "bounded_payload",
    "insert_rows",
    "last_seq_of_kind",
    "read_event_rows",
    "read_events",
]


class StoredEvent(msgspec.Struct, frozen=True, gc=False):
    """One journaled event; ``body`` is its JSON encoding.

    A frozen value like the attrs classes elsewhere, but a msgspec Struct: one is
    built for every event appended or read, and a Struct is built in C (about a
    tenth of a frozen attrs instance's cost, which set each field through
    ``object.__setattr__``). Its fields are immutable scalars, so it holds no
    reference cycle and the garbage collector need not track it (``gc=False``).
    """

    session_id: str
    seq: int
    ts: float
    fence: int
    kind: str
    body: bytes


EventRow = tuple[int, float, int, str, bytes]
"""A stored event's (seq, ts, fence, kind, body) as SQLite returns it."""


# Rows per INSERT statement, at most. Rows are inserted with one multi-row INSERT
# per chunk (64s, then the powers of two that make up the rest: 8 + 2 for ten
# events), which costs SQLite and the sqlite3 module far less than a statement step
# per row, and needs at most 7 distinct statements in the connection's statement
# cache. 64 rows bind 384 parameters, below SQLite's smallest limit (999 before 3.32).
MAX_INSERT_ROWS = 64

_EVENT_COLUMNS = 6  # session_id, seq, ts, fence, kind, body


@functools.cache
def _insert_events_sql(rows: int) -> str:
    return "INSERT INTO events (session_id, seq, ts, fence, kind, body) VALUES " + ", ".join(
        ["(?, ?, ?, ?, ?, ?)"] * rows
    )


def _chunk_sizes(count: int) -> Iterator[int]:
    """``count`` split into ``MAX_INSERT_ROWS`` and then powers of two."""
    while count >= MAX_INSERT_ROWS:
        yield MAX_INSERT_ROWS
        count -= MAX_INSERT_ROWS
    size = MAX_INSERT_ROWS // 2
    while count:
        if count >= size:
            yield size
            count -= size
        size //= 2


def insert_rows(conn: sqlite3.Connection, params: list[object]) -> None:
    """Insert event rows given as one flat list of column values, six per row, whose
    seqs were reserved (``Append.reserve``)."""
    start = 0
    for rows_in_chunk in _chunk_sizes(len(params) // _EVENT_COLUMNS):
        end = start + rows_in_chunk * _EVENT_COLUMNS
        conn.execute(_insert_events_sql(rows_in_chunk), params[start:end])
        start = end


class Append(msgspec.Struct, frozen=True):
    """Append ``items`` (kind, encoded body) to a session's journal, as one op.

    Called as an op (``op(conn)``) it inserts its rows at once; the writer instead
    calls ``reserve`` and inserts the rows of consecutive appends in one go.

    A msgspec Struct, like ``StoredEvent``: one is built in trio's thread for every
    ``Store.append``, and a frozen attrs instance cost four times as much there
    (about 2 us against 0.5 on this machine), time the writer's thread waits for
    when every appender is in the batch it committed.
    """

    session_id: str
    fence: int
    items: Sequence[tuple[str, bytes]]
    ts: float
    # A held agent's output position (offset, events of that line journaled) to
    # store on the lease of ``fence`` in the same transaction (``agentsd.sink``
    # Rule 4): an append that is still one of the writer's batched appends.
    output: tuple[int, int] | None = None

    def reserve(self, conn: StoreConnection, params: list[object]) -> list[StoredEvent]:
        """Take the next seqs and add the rows to ``params`` (flat, as ``insert_rows``
        takes them). Raises ``UnknownSession``, having reserved nothing; the output
        position is written first, so an error there leaves nothing either."""
        session_id, fence, ts = self.session_id, self.fence, self.ts
        if self.output is not None:
            conn.execute(
                "UPDATE leases SET out_offset = ?, out_skip = ? WHERE session_id = ? AND fence = ?",
                (*self.output, session_id, fence),
            )
        if not self.items:
            conn.memory.head(conn, session_id)
            return []
        first_seq = conn.memory.advance(conn, session_id, len(self.items))
        events: list[StoredEvent] = []
        for seq, (kind, body) in enumerate(self.items, first_seq):
            events.append(StoredEvent(session_id, seq, ts, fence, kind, body))
            # Bound as a bytearray (stored the same: a BLOB). The sqlite3 module
            # binds int, float, str and bytearray directly, but looks for an
            # adapter for bytes, which raises and clears an AttributeError per
            # parameter (3.11): 0.5-0.8 us per event, the copy 0.1.
            params += (session_id, seq, ts, fence, kind, bytearray(body))
        return events

    def __call__(self, conn: StoreConnection) -> list[StoredEvent]:
        params: list[object] = []
        events = self.reserve(conn, params)
        insert_rows(conn, params)
        return events


def append_events(
    conn: StoreConnection,
    session_id: str,
    fence: int,
    items: Sequence[tuple[str, bytes]],
    ts: float,
) -> list[StoredEvent]:
    """Append events to a session's journal; returns them with their seqs.

    Must run inside a transaction (``Store.write``) so the seq reservation and the
    rows commit or roll back together. Raises ``UnknownSession`` if the session row
    does not exist. An empty ``items`` writes nothing.
    """
    return Append(session_id, fence, items, ts)(conn)


def read_events(
    conn: sqlite3.Connection,
    session_id: str,
    *,
    after_seq: int | None = None,
    before_seq: int | None = None,
    limit: int,
    max_bytes: int,
) -> tuple[list[StoredEvent], bool]:
    """One page of the session's events, in ascending seq order, and whether more
    exist beyond the page in the direction of paging.

    ``after_seq`` (default 0, so from the start) pages forward: the first events with
    seq > after_seq. ``before_seq`` pages backward: the events just before it, the
    nearest ones kept. Give at most one of them.

    A page holds at most ``limit`` events and at most ``max_bytes`` of bodies, but
    always at least one event when any exists (a single large event is never stuck
    behind the byte bound). An unknown session reads as empty.
    Raises ``ValueError`` for a limit below 1, a negative max_bytes, or both bounds.
    """
    rows, more = read_event_rows(
        conn,
        session_id,
        after_seq=after_seq,
        before_seq=before_seq,
        limit=limit,
        max_bytes=max_bytes,
    )
    return [StoredEvent(session_id, *row) for row in rows], more


def read_event_rows(
    conn: sqlite3.Connection,
    session_id: str,
    *,
    after_seq: int | None = None,
    before_seq: int | None = None,
    limit: int,
    max_bytes: int,
) -> tuple[list[EventRow], bool]:
    """As ``read_events``, the rows as SQLite returns them: for a reader that turns
    each into something else at once (a catch-up page into notifications) and need
    not build a ``StoredEvent`` per row first."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    if max_bytes < 0:
        raise ValueError(f"max_bytes must not be negative, got {max_bytes}")
    if after_seq is not None and before_seq is not None:
        raise ValueError("give after_seq or before_seq, not both")
    columns = "seq, ts, fence, kind, body"
    if before_seq is None:
        query = (
            f"SELECT {columns} FROM events WHERE session_id = ? AND seq > ?"
            " ORDER BY seq ASC LIMIT ?"
        )
        bound = 0 if after_seq is None else after_seq
    else:
        query = (
            f"SELECT {columns} FROM events WHERE session_id = ? AND seq < ?"
            " ORDER BY seq DESC LIMIT ?"
        )
        bound = before_seq
    # One row beyond the limit tells whether more exist; rows are fetched lazily so
    # bodies past the byte bound are never loaded.
    cursor = conn.execute(query, (session_id, bound, limit + 1))
    page: list[EventRow] = []
    append = page.append
    budget = max_bytes
    more = False
    try:
        for row in cursor:
            budget -= len(row[4])
            if budget < 0 and page:
                more = True
                break
            if len(page) == limit:
                more = True
                break
            append(row)
    finally:
        # Reset the statement now rather than when the cursor is collected: an
        # unfinished statement would hold the read transaction's snapshot busy.
        cursor.close()
    if before_seq is not None:
        page.reverse()
    return page, more


def last_seq_of_kind(conn: sqlite3.Connection, session_id: str, kind: str) -> int:
    """The seq of the session's last event of ``kind``; 0 when it has none."""
    row = conn.execute(
        "SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = ? AND kind = ?",
        (session_id, kind),
    ).fetchone()
    return int(row[0])


def has_kind_after(conn: sqlite3.Connection, session_id: str, kind: str, after_seq: int) -> bool:
    """Whether the session has an event of ``kind`` past ``after_seq``."""
    row = conn.execute(
        "SELECT 1 FROM events WHERE session_id = ? AND seq > ? AND kind = ? LIMIT 1",
        (session_id, after_seq, kind),
    ).fetchone()
    return row is not None


def events_of_kinds(
    conn: sqlite3.Connection, session_id: str, kinds: Collection[str]
) -> Iterator[tuple[int, str, bytes]]:
    """The session's events of any of ``kinds`` as ``(seq, kind, body)``, oldest
    first. Runs inside the caller's ``Store.read``: consume it there."""
    marks = ",".join("?" * len(kinds))
    cursor = conn.execute(
        f"SELECT seq, kind, body FROM events WHERE session_id = ? AND kind IN ({marks}) "
        "ORDER BY seq",
        (session_id, *kinds),
    )
    try:
        for seq, kind, body in cursor:
            yield int(seq), str(kind), bytes(body)
    finally:
        cursor.close()


def bodies_of_kind(conn: sqlite3.Connection, session_id: str, kind: str) -> Iterator[bytes]:
    """The bodies of the session's events of ``kind``, newest first. Runs inside the
    caller's ``Store.read``: consume it there."""
    cursor = conn.execute(
        "SELECT body FROM events WHERE session_id = ? AND kind = ? ORDER BY seq DESC",
        (session_id, kind),
    )
    try:
        for (body,) in cursor:
            yield bytes(body)
    finally:
        cursor.close()


def _utf8_head(data: bytes, max_bytes: int) -> bytes:
    """The longest prefix of ``data`` of at most ``max_bytes`` that does not end
    inside a UTF-8 sequence."""
    if len(data) <= max_bytes:
        return data
    cut = max_bytes
    # A character is at most 4 bytes, so at most 3 continuation bytes (0b10xxxxxx)
    # sit between the cut and the lead byte of the character it would split.
    while cut > max(0, max_bytes - 3) and data[cut] & 0xC0 == 0x80:
        cut -= 1
    return data[:cut]


def bounded_payload(data: str | bytes, max_bytes: int) -> dict[str, Any]:
    """Bound a large payload (tool output, a diff) for the journal.

    Returns ``{"text", "byteLength", "truncated"}``: ``text`` is the payload, or
    when its UTF-8 encoding exceeds ``max_bytes`` its longest head that fits and
    ends on a character boundary; ``byteLength`` is the full payload's length in
    bytes; ``truncated`` says whether it was cut. A cut payload also records
    ``sha256`` (hex) of the full payload, so a client holding the original can
    tell whether it is the same.

    ``bytes`` that are not valid UTF-8 are decoded with U+FFFD for each invalid
    sequence (``byteLength`` and ``sha256`` still describe the original bytes);
    ``text`` never exceeds ``max_bytes`` once encoded. Raises ``ValueError`` for a
    negative ``max_bytes``.
    """
    if max_bytes < 0:
        raise ValueError(f"max_bytes must not be negative, got {max_bytes}")
    # surrogatepass: a str with lone surrogates still has a definite byte form.
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    head = _utf8_head(raw, max_bytes)
    truncated = len(head) < len(raw)
    text = head.decode("utf-8", "replace")
    encoded = text.encode("utf-8")
    if len(encoded) > max_bytes:
        # U+FFFD (3 bytes) replaced shorter invalid sequences and grew the text past
        # the bound: cut again, on the now valid UTF-8.
        text = _utf8_head(encoded, max_bytes).decode("utf-8")
        truncated = True
    payload: dict[str, Any] = {"text": text, "byteLength": len(raw), "truncated": truncated}
    if truncated:
        payload["sha256"] = hashlib.sha256(raw).hexdigest()
    return payload
