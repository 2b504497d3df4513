"""The durable store, and all of the daemon's SQL: schema and migrations
(``database``), the group-committing writer (``writer``, with its thread in
``handoff``, its error translation in ``failures`` and what it keeps in memory in
``memory``), the event journal (``journal``), and the rows of sessions
(``sessions``), leases (``leases``) and the idempotency ledger (``operations``)."""

from agentsd.store.database import SCHEMA_VERSION, SchemaTooNew, open_database
from agentsd.store.journal import (
    StoredEvent,
    UnknownSession,
    append_events,
    bounded_payload,
    read_events,
)
from agentsd.store.writer import Store, open_store

__all__ = [
    "SCHEMA_VERSION",
    "SchemaTooNew",
    "Store",
    "StoredEvent",
    "UnknownSession",
    "append_events",
    "bounded_payload",
    "open_database",
    "open_store",
    "read_events",
]
