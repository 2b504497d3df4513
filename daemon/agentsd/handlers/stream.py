"""``agentSession.history/subscribe/unsubscribe/watch``: following sessions."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from agentsd.feed import Subscription, journal_event
from agentsd_protocol.api import stream as api
from agentsd_protocol.errors import InvalidParams, SubscriptionNotFound

if TYPE_CHECKING:
    from agentsd.connection import Call

MAX_HISTORY_EVENTS = 1000  # per page
MAX_HISTORY_BYTES = 1024 * 1024  # per page, so a page of large tool outputs stays small
MAX_SEQ = 2**63 - 1  # SQLite's largest INTEGER; a larger bound means the same as this one
_watch_ids = itertools.count(1)


async def handle_history(call: Call, params: api.HistoryParams) -> api.HistoryResult:
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id)
    if params.after_seq is not None and params.before_seq is not None:
        raise InvalidParams("Invalid params: give afterSeq or beforeSeq, not both")
    if not 1 <= params.limit <= MAX_HISTORY_EVENTS:
        raise InvalidParams(f"Invalid params: limit must be between 1 and {MAX_HISTORY_EVENTS}")
    for name, value in (("afterSeq", params.after_seq), ("beforeSeq", params.before_seq)):
        if value is not None and value < 0:
            raise InvalidParams(f"Invalid params: {name} must not be negative")
    after = params.after_seq if params.before_seq is None and params.after_seq is not None else None
    if params.after_seq is None and params.before_seq is None:
        after = 0
    before = None if params.before_seq is None else min(params.before_seq, MAX_SEQ)
    after = None if after is None else min(after, MAX_SEQ)
    events, more = await session.journal.history(
        after_seq=after, before_seq=before, limit=params.limit, max_bytes=MAX_HISTORY_BYTES
    )
    return api.HistoryResult(
        events=[journal_event(e) for e in events], has_more=more, head_seq=session.head_seq
    )


async def handle_subscribe(call: Call, params: api.SubscribeParams) -> api.SubscribeResult:
    supervisor = call.app.supervisor
    session = supervisor.get(params.session_id)
    head = session.head_seq
    after = head if params.after_seq is None else params.after_seq
    if after < 0:
        raise InvalidParams("Invalid params: afterSeq must not be negative")
    after = min(after, head)
    connection = call.connection
    subscription = Subscription(supervisor.feed, session.id, connection, after)
    # Registered now, so nothing committed from here on is missed; the pump starts
    # after the reply is flushed, so the client knows the id before any event.
    supervisor.feed.add(subscription)
    subscription.start_from(session.journal.tails())
    connection.on_close.append(subscription.end)

    def start_pump() -> None:
        if subscription.ended:
            return
        current = supervisor.sessions.get(session.id)
        connection.spawn(
            subscription.run, supervisor.store, lambda: current.head_seq if current else 0
        )

    call.after_reply.append(start_pump)
    return api.SubscribeResult(subscription_id=subscription.id, head_seq=head)


async def handle_unsubscribe(call: Call, params: api.UnsubscribeParams) -> api.UnsubscribeResult:
    feed = call.app.supervisor.feed
    subscription = feed.by_id.get(params.subscription_id)
    if subscription is None or subscription.connection is not call.connection:
        raise SubscriptionNotFound(
            f"no subscription {params.subscription_id!r} on this connection",
            subscriptionId=params.subscription_id,
        )
    subscription.end()
    return api.UnsubscribeResult(subscription_id=params.subscription_id, was_active=True)


async def handle_watch(call: Call, params: api.WatchParams) -> api.WatchResult:
    supervisor = call.app.supervisor
    connection = call.connection
    watch_id = f"watch-{next(_watch_ids)}"
    board = supervisor.board
    watcher, snapshot = board.watch(
        watch_id,
        lambda note: connection.notify("agentSession.status", note),
        supervisor.sessions.values(),
    )
    connection.on_close.append(lambda: board.unwatch(watch_id))
    call.after_reply.append(lambda: connection.spawn(watcher.run_pump))
    return api.WatchResult(watch_id=watch_id, sessions=snapshot)


HANDLERS: dict[str, Any] = {
    "agentSession.history": handle_history,
    "agentSession.subscribe": handle_subscribe,
    "agentSession.unsubscribe": handle_unsubscribe,
    "agentSession.watch": handle_watch,
}
