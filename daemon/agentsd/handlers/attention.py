"""``agentSession.acknowledge/completions``: what the user has seen, and the feed of
what needs them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentsd.summary import unseen_notice
from agentsd_protocol.api import attention as api
from agentsd_protocol.api.events import SessionAcknowledged

if TYPE_CHECKING:
    from agentsd.connection import Call


async def handle_acknowledge(call: Call, params: api.AcknowledgeParams) -> api.AcknowledgeResult:
    """Journal ``session.acknowledged`` only when it makes something seen: an
    acknowledgement that changes nothing writes nothing, so a client that
    acknowledges what it shows (and is shown its own acknowledgement) never loops."""
    session = call.app.supervisor.get(params.session_id)
    summary = session.summary
    seq = min(max(params.seq, 0), session.head_seq)
    if seq > summary.acknowledged_seq and summary.notable_seq > summary.acknowledged_seq:
        await session.journal.append([SessionAcknowledged(seq=seq)])
    return api.AcknowledgeResult(
        session_id=session.id, acknowledged_seq=summary.acknowledged_seq, unseen=summary.unseen
    )


async def handle_completions(call: Call, params: api.CompletionsParams) -> api.CompletionsResult:
    """One feed per connection: asking again replaces it (same id, the fresh
    ``unseen``), so a client that re-asks on every redraw does not multiply what the
    daemon sends it."""
    supervisor = call.app.supervisor
    connection = call.connection
    feed_id = f"feed-{connection.id}"
    board = supervisor.board
    if board.follow(feed_id, lambda note: connection.notify("agentSession.notice", note)):
        connection.on_close.append(lambda: board.unfollow(feed_id))
    unseen = [n for s in supervisor.sessions.values() if (n := unseen_notice(s)) is not None]
    return api.CompletionsResult(feed_id=feed_id, unseen=unseen)


HANDLERS: dict[str, Any] = {
    "agentSession.acknowledge": handle_acknowledge,
    "agentSession.completions": handle_completions,
}
