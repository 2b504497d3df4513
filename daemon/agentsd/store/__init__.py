"""The durable store: SQLite schema and migrations (``database``), the
group-committing writer (``writer``, with its thread in ``handoff`` and its error
translation in ``failures``) and the event journal (``journal``)."""

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
