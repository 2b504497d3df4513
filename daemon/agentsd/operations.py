"""The idempotency ledger: ``clientOperationId`` makes every mutation safe to retry.

Rule 1: the same operation id with the same params (the fingerprint leaves out the
id itself and ``retryUnknown``) replays the recorded result, byte for byte; with
different params it fails with ``operation_conflict``.

Rule 2: two requests with one id never run at once: the second waits for the first,
then replays.

Rule 3: a handler whose own write must be atomic with the ledger entry (``send``
journals its submission and a provisional entry in one commit) calls
``record_provisional`` inside that write; otherwise the entry is written after the
handler succeeded, before the reply. Failed mutations are not recorded: a retry runs
again. If that entry cannot be written (a full disk) the handler's answer still
stands, because its own rows are committed; only its replay is lost.

Rule 4: entries expire after ``TTL_S``; past ``CAPACITY`` live entries new ids are
refused with ``operation_ledger_full`` (the daemon keeps serving everything else).
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import msgspec
import trio

from agentsd.store.writer import Store
from agentsd_protocol.errors import OperationConflict, OperationLedgerFull, StorageUnavailable

log = logging.getLogger(__name__)

TTL_S = 24 * 3600.0  # a client retries within seconds; a day covers laptops that slept
CAPACITY = 100_000  # live entries; a runaway client cannot grow the database without bound
MAX_OPERATION_ID_CHARS = 200  # ids are uuids in practice
_EXCLUDED = {"clientOperationId", "retryUnknown"}

_encoder = msgspec.json.Encoder()


@attrs.frozen
class Operation:
    op_id: str
    method: str
    fingerprint: str


def fingerprint(method: str, params: msgspec.Struct) -> str:
    fields = msgspec.to_builtins(params)
    for name in _EXCLUDED:
        fields.pop(name, None)
    canonical = _encoder.encode([method, fields])
    return hashlib.sha256(canonical).hexdigest()


def _lookup(conn: sqlite3.Connection, op_id: str, now: float) -> tuple[str, str, bytes] | None:
    row = conn.execute(
        "SELECT method, fingerprint, result FROM operations WHERE op_id = ? AND expires_at > ?",
        (op_id, now),
    ).fetchone()
    return None if row is None else (row[0], row[1], bytes(row[2]))


def record(conn: sqlite3.Connection, op: Operation, result: bytes, now: float) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO operations (op_id, method, fingerprint, result, created_at, expires_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (op.op_id, op.method, op.fingerprint, result, now, now + TTL_S),
    )


def record_provisional(conn: sqlite3.Connection, op: Operation, result: Any) -> None:
    """Record ``result`` for ``op`` inside the caller's own write (Rule 3)."""
    record(conn, op, _encoder.encode(result), time.time())


def _count_live(conn: sqlite3.Connection, now: float) -> int:
    return int(
        conn.execute("SELECT COUNT(*) FROM operations WHERE expires_at > ?", (now,)).fetchone()[0]
    )


def _purge(conn: sqlite3.Connection, now: float) -> int:
    conn.execute("DELETE FROM operations WHERE expires_at <= ?", (now,))
    return _count_live(conn, now)


class Ledger:
    def __init__(self, store: Store, capacity: int = CAPACITY) -> None:
        self._store = store
        self._capacity = capacity
        self._in_flight: dict[str, trio.Event] = {}
        self._live: int | None = None

    async def run(
        self,
        op: Operation,
        execute: Callable[[], Awaitable[Any]],
        *,
        replay: bool = True,
    ) -> Any:
        """Replay ``op``'s recorded result, or run ``execute`` and record its result.

        ``replay=False`` (``send`` with ``retryUnknown``) still checks the
        fingerprint but always runs ``execute``.
        """
        while (running := self._in_flight.get(op.op_id)) is not None:
            await running.wait()
        done = trio.Event()
        self._in_flight[op.op_id] = done
        try:
            now = time.time()
            found = await self._store.read(lambda conn: _lookup(conn, op.op_id, now))
            if found is not None:
                method, recorded_fingerprint, result = found
                if method != op.method or recorded_fingerprint != op.fingerprint:
                    raise OperationConflict(
                        f"operation id {op.op_id!r} was already used for a different request",
                        operationId=op.op_id,
                        method=method,
                    )
                if replay:
                    return msgspec.Raw(result)
            else:
                await self._reserve(now)
            value = await execute()
            encoded = _encoder.encode(value)
            try:
                await self._store.write(lambda conn: record(conn, op, encoded, time.time()))
            except StorageUnavailable as exc:
                # Rule 3: an error now would make the client retry what is done.
                log.warning("operation %s done but not recorded: %s", op.op_id, exc.message)
            return value
        finally:
            del self._in_flight[op.op_id]
            done.set()

    async def recorded(self, op_id: str) -> bytes | None:
        """The recorded result of ``op_id``, if it has one that has not expired."""
        now = time.time()
        found = await self._store.read(lambda conn: _lookup(conn, op_id, now))
        return None if found is None else found[2]

    async def _reserve(self, now: float) -> None:
        """Count one more live entry, refusing past capacity.

        The counter is an upper bound, never an undercount: it grows on every new id,
        and entries that expire or mutations that fail (and record nothing) leave it
        high. That is safe: nothing is refused on the counter alone; at capacity it is
        replaced by an exact count after purging expired entries.
        """
        if self._live is None:
            self._live = await self._store.read(lambda conn: _count_live(conn, now))
        if self._live >= self._capacity:
            self._live = await self._store.write(lambda conn: _purge(conn, now))
            if self._live >= self._capacity:
                raise OperationLedgerFull(
                    f"the operation ledger holds {self._capacity} live entries; "
                    "retry later or send without clientOperationId",
                    capacity=self._capacity,
                )
        self._live += 1
