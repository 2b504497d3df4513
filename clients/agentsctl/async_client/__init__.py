"""The trio client library: one multiplexed connection to the daemon, calls typed by
the method they name (``call(methods.SEND, params)``), and subscriptions that outlive
the connection they started on. Requests, replies and the follow cursor are
``agentsd_protocol.client``'s; this package is their trio glue.

Rule 1: any number of requests may be in flight on one connection; each carries a
fresh integer id and the reader task matches its reply by id. A call whose connection
fails before the reply raises ``DaemonDisconnected``: whether a mutation took effect
is then unknown, and repeating it with the same ``client_operation_id`` is safe (the
daemon's idempotency ledger replays the recorded answer).

Rule 2: the connection is replaced lazily. Once it has failed, the next call opens a
new one; a call is never retried behind its caller's back.

Rule 3: a subscription delivers every journal event of its session exactly once and
in seq order, across ``agentSession.lagged``, dropped connections and daemon restarts:
it remembers the last seq it received and re-subscribes with ``afterSeq``, backing off
until ``reconnect_deadline_s`` passes without success. Deltas are ephemeral: those
sent while it was away are lost, and the journal's ``item.updated`` snapshots cover
them. A watch re-reads the snapshot instead (there is no seq to resume from). A
subscription ends when its session is deleted (``agentSession.ended``, or
``session_not_found`` when re-subscribing): iterating then raises ``SessionNotFound``
and nothing is re-subscribed.

Rule 4: the reader never waits for a consumer. A subscription buffers at most
``MAX_BUFFERED`` items; past that it drops them and resumes from the journal, as a
lagged one does.

Use::

    async with open_client() as client:
        created = await client.call(methods.CREATE, CreateParams(provider="mock", cwd="/tmp"))
        async with client.subscribe(created.session_id, after_seq=0) as events:
            await client.call(methods.SEND, SendParams(session_id=..., text="hello"))
            async for item in events:  # JournalEvent or DeltaNotification
                ...

Modules: ``connection`` (the socket, its reader, calls), ``follow`` (subscriptions
and watches), ``client`` (``AsyncClient`` and ``open_client``). Importing this package
imports trio; ``agentsctl.cli`` imports it only inside the commands that need it (the
CLI's start-up stays off trio).
"""

from __future__ import annotations

from agentsctl.async_client.client import AsyncClient, open_client, sole_exception
from agentsctl.async_client.follow import Subscription, SubscriptionItem, Watch
from agentsctl.daemon import DaemonDisconnected, DaemonUnreachable

__all__ = [
    "AsyncClient",
    "DaemonDisconnected",
    "DaemonUnreachable",
    "Subscription",
    "SubscriptionItem",
    "Watch",
    "open_client",
    "sole_exception",
]
