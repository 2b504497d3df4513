"""The idempotency ledger: ``clientOperationId`` makes every mutation safe to retry.

Rule 1: the same operation id with the same params (the fingerprint leaves out the
id itself and ``retryUnknown``) replays the recorded result, byte for byte; with
different params it fails with ``operation_conflict``.

Rule 2: two requests with one id never run at once: the second waits for the first,
then replays.

Rule 3: a handler whose own write must be atomic with the ledger entry (``send``
journals its submission and a provisional entry in one commit) hands a
``Provisional`` to its journal write, which calls ``record_provisional`` inside it;
otherwise the entry is written after the handler succeeded, before the reply.
Failed mutations are not recorded: a retry runs again. If that entry cannot be
written (a full disk) the handler's answer still stands, because its own rows are
committed; only its replay is lost.

Rule 4: entries expire after ``TTL_S``; past ``CAPACITY`` live entries new ids are
refused with ``operation_ledger_full`` (the daemon keeps serving everything else).
The count is the store's (``Store.operation_rows``, kept by its writer) plus the new
ids still running; expired rows are purged only when that reaches the capacity.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import msgspec
import trio

from agentsd.store.database import StoreConnection
from agentsd.store.journal import StoredEvent
from agentsd.store.operations import lookup_operation, purge_operations, record_operation
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


@attrs.frozen
class Provisional:
    """A ledger entry to commit with the journal write it answers (Rule 3):
    ``result`` makes the answer a retry replays from the events as stored."""

    operation: Operation
    result: Callable[[Sequence[StoredEvent]], Any]


def fingerprint(method: str, params: msgspec.Struct) -> str:
    fields = msgspec.to_builtins(params)
    for name in _EXCLUDED:
        fields.pop(name, None)
    canonical = _encoder.encode([method, fields])
    return hashlib.sha256(canonical).hexdigest()


def record(conn: StoreConnection, op: Operation, result: bytes, now: float) -> None:
    record_operation(conn, op.op_id, op.method, op.fingerprint, result, now, now + TTL_S)


def record_provisional(conn: StoreConnection, op: Operation, result: Any) -> None:
    """Record ``result`` for ``op`` inside the caller's own write (Rule 3)."""
    record(conn, op, _encoder.encode(result), time.time())


class Ledger:
    def __init__(self, store: Store, capacity: int = CAPACITY) -> None:
        self._store = store
        self._capacity = capacity
        self._in_flight: dict[str, trio.Event] = {}
        self._new_running = 0  # new ids whose mutation runs: not in the store's count yet

    async def run(
        self,
        op: Operation,
        mutation: Callable[[], Awaitable[Any]],
        *,
        replay: bool = True,
    ) -> Any:
        """Replay ``op``'s recorded result, or run ``mutation`` and record its result.

        ``replay=False`` (``send`` with ``retryUnknown``) still checks the
        fingerprint but always runs ``mutation``.
        """
        while (running := self._in_flight.get(op.op_id)) is not None:
            await running.wait()
        done = trio.Event()
        self._in_flight[op.op_id] = done
        reserved = False
        try:
            now = time.time()
            found = await self._store.read(lambda conn: lookup_operation(conn, op.op_id, now))
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
                reserved = True
            value = await mutation()
            encoded = _encoder.encode(value)
            try:
                await self._store.write(lambda conn: record(conn, op, encoded, time.time()))
            except StorageUnavailable as exc:
                # Rule 3: an error now would make the client retry what is done.
                log.warning("operation %s done but not recorded: %s", op.op_id, exc.message)
            return value
        finally:
            if reserved:
                self._new_running -= 1
            del self._in_flight[op.op_id]
            done.set()

    async def recorded(self, op_id: str) -> bytes | None:
        """The recorded result of ``op_id``, if it has one that has not expired."""
        now = time.time()
        found = await self._store.read(lambda conn: lookup_operation(conn, op_id, now))
        return None if found is None else found[2]

    async def _reserve(self, now: float) -> None:
        """Count one more new id, refusing past capacity (Rule 4).

        The count is never an undercount: rows that expired still count until a
        purge. At capacity the expired rows are purged first, and only a ledger full
        of live entries refuses.
        """
        if self._store.operation_rows + self._new_running >= self._capacity:
            await self._store.write(lambda conn: purge_operations(conn, now))
            if self._store.operation_rows + self._new_running >= self._capacity:
                raise OperationLedgerFull(
                    f"the operation ledger holds {self._capacity} live entries; "
                    "retry later or send without clientOperationId",
                    capacity=self._capacity,
                )
        self._new_running += 1
