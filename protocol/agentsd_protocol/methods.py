"""The method registry: every method's name, params and result types, and summary.

Rule 1: a method exists on the wire exactly when it is registered here; the daemon's
dispatch table and the OpenRPC document are both derived from this registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentsd_protocol.api import conversation as c
from agentsd_protocol.api import daemon as d
from agentsd_protocol.api import session as s
from agentsd_protocol.api import stream as st


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    params: type[Any]
    result: Any  # a Struct type, or a typing alias such as dict[str, Any]
    summary: str
    mutation: bool = False


_METHODS = [
    Method("daemon.ping", d.PingParams, d.PingResult, "Check that the daemon answers."),
    Method(
        "daemon.status",
        d.StatusParams,
        d.StatusResult,
        "Version, uptime, paths, counts and what recovery did.",
    ),
    Method(
        "daemon.shutdown",
        d.ShutdownParams,
        d.ShutdownResult,
        "Reply, then close every session and exit.",
        mutation=True,
    ),
    Method(
        "rpc.discover", d.DiscoverParams, d.DiscoverResult, "This API as an OpenRPC 1.3 document."
    ),
    Method(
        "agentSession.create",
        s.CreateParams,
        s.CreateResult,
        "Create a session and (by default) start its agent.",
        mutation=True,
    ),
    Method(
        "agentSession.get",
        s.GetParams,
        s.GetResult,
        "One session's record, status, fence and live child.",
    ),
    Method(
        "agentSession.list",
        s.ListParams,
        s.ListResult,
        "Every session, optionally filtered by phase or provider.",
    ),
    Method(
        "agentSession.start",
        s.StartParams,
        s.StartResult,
        "Start the session's agent if it is not running.",
        mutation=True,
    ),
    Method(
        "agentSession.close",
        s.CloseParams,
        s.CloseResult,
        "End the agent child; keep the record and journal.",
        mutation=True,
    ),
    Method(
        "agentSession.delete",
        s.DeleteParams,
        s.DeleteResult,
        "Close, then remove the record and journal.",
        mutation=True,
    ),
    Method(
        "agentSession.send",
        c.SendParams,
        c.SendResult,
        "Journal a prompt (write-ahead), start the agent if needed, and deliver it.",
        mutation=True,
    ),
    Method(
        "agentSession.interrupt",
        c.InterruptParams,
        c.InterruptResult,
        "Interrupt the running turn.",
        mutation=True,
    ),
    Method(
        "agentSession.respond",
        c.RespondParams,
        c.RespondResult,
        "Answer a pending approval; the first answer wins.",
        mutation=True,
    ),
    Method(
        "agentSession.setOptions",
        c.SetOptionsParams,
        c.SetOptionsResult,
        "Change the title or the options used at the next start.",
        mutation=True,
    ),
    Method(
        "agentSession.history",
        st.HistoryParams,
        st.HistoryResult,
        "A byte-bounded page of the journal, by seq.",
    ),
    Method(
        "agentSession.subscribe",
        st.SubscribeParams,
        st.SubscribeResult,
        "Catch up after a seq, then follow live.",
    ),
    Method(
        "agentSession.unsubscribe",
        st.UnsubscribeParams,
        st.UnsubscribeResult,
        "End a subscription.",
    ),
    Method(
        "agentSession.watch",
        st.WatchParams,
        st.WatchResult,
        "Every session's status now, then a notification on each change.",
    ),
]

METHODS: dict[str, Method] = {m.name: m for m in _METHODS}


@dataclass(frozen=True, slots=True)
class NotificationType:
    name: str
    params: type[Any]
    summary: str


NOTIFICATIONS: dict[str, NotificationType] = {
    n.name: n
    for n in [
        NotificationType(
            "agentSession.event", st.EventNotification, "A journaled event, with its seq."
        ),
        NotificationType(
            "agentSession.delta", st.DeltaNotification, "Ephemeral streaming text of an item."
        ),
        NotificationType(
            "agentSession.lagged", st.LaggedNotification, "The subscription fell behind and ended."
        ),
        NotificationType(
            "agentSession.status", st.StatusNotification, "A watched session's status changed."
        ),
        NotificationType(
            "agentSession.ended", st.EndedNotification, "The subscribed session was deleted."
        ),
    ]
}
