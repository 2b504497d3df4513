"""Rows of the idempotency ledger (``agentsd.operations`` holds its rules).

Writes run inside ``Store.write`` and keep the writer's count of the ledger's rows
(``memory``) exact, so the ledger never counts its table to decide whether it is
full; reads run inside ``Store.read``.
"""

from __future__ import annotations

import sqlite3

from agentsd.store.database import StoreConnection

__all__ = ["lookup_operation", "purge_operations", "record_operation"]


def lookup_operation(
    conn: sqlite3.Connection, op_id: str, now: float
) -> tuple[str, str, bytes] | None:
    """(method, fingerprint, result) of ``op_id`` unless it expired by ``now``."""
    row = conn.execute(
        "SELECT method, fingerprint, result FROM operations WHERE op_id = ? AND expires_at > ?",
        (op_id, now),
    ).fetchone()
    return None if row is None else (row[0], row[1], bytes(row[2]))


def record_operation(
    conn: StoreConnection,
    op_id: str,
    method: str,
    fingerprint: str,
    result: bytes,
    now: float,
    expires_at: float,
) -> None:
    """Record (or replace) the entry of ``op_id``."""
    known = conn.execute("SELECT 1 FROM operations WHERE op_id = ?", (op_id,)).fetchone()
    conn.execute(
        "INSERT OR REPLACE INTO operations"
        " (op_id, method, fingerprint, result, created_at, expires_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (op_id, method, fingerprint, result, now, expires_at),
    )
    if known is None:
        conn.memory.operation_rows_changed(1)


def purge_operations(conn: StoreConnection, now: float) -> None:
    """Delete the entries expired by ``now``."""
    cursor = conn.execute("DELETE FROM operations WHERE expires_at <= ?", (now,))
    conn.memory.operation_rows_changed(-cursor.rowcount)
