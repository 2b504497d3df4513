"""The method registry: every method's name, params and result types, summary, and
how it is served.

Rule 1: a method exists on the wire exactly when it is registered here; the daemon's
dispatch table, the clients and the OpenRPC document are all derived from this
registry.

Rule 2: a method is one ``Method[P, R]`` constant (``SEND``, ``SUBSCRIBE``, ...), so
``client.call(methods.SEND, SendParams(...))`` is a ``SendResult`` to the type
checker, in every client.

Rule 3: how a method is served is said here and nowhere else: ``inline`` (the daemon
answers it in the connection's reading task: it reads memory only), ``mutation``
(it changes state: ``clientOperationId`` makes it idempotent) and ``stream_key``
(streaming: its result names the route, a subscription or a watch, of the
notifications that follow it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from agentsd_protocol.api import attention as a
from agentsd_protocol.api import controls as ctl
from agentsd_protocol.api import conversation as c
from agentsd_protocol.api import daemon as d
from agentsd_protocol.api import session as s
from agentsd_protocol.api import stream as st

P = TypeVar("P")
R = TypeVar("R")

# One decoder per result type, built on first use: a Decoder does its type's lookup
# work once, and most processes call a few methods only.
_result_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


@dataclass(frozen=True, slots=True)
class Method(Generic[P, R]):
    """One method: its wire name, params and result types, and how it is served."""

    name: str
    params: type[P]
    result: type[R]  # a Struct type, or a typing alias such as dict[str, Any]
    summary: str = ""
    mutation: bool = False
    inline: bool = False
    stream_key: Callable[[R], str] | None = None

    def decode_result(self, raw: bytes | msgspec.Raw) -> R:
        """The result as ``R``; raises ``msgspec.DecodeError`` if it does not fit."""
        decoder = _result_decoders.get(self.result)
        if decoder is None:
            decoder = _result_decoders[self.result] = msgspec.json.Decoder(self.result)
        result: R = decoder.decode(raw)
        return result


def untyped(name: str) -> Method[Any, Any]:
    """A method by name alone, for calls outside the registry (tests, probes, a newer
    daemon): any params, a result in plain JSON values."""
    return Method(name, object, object)


def _subscription_key(result: st.SubscribeResult) -> str:
    return result.subscription_id


def _watch_key(result: st.WatchResult) -> str:
    return result.watch_id


def _feed_key(result: a.CompletionsResult) -> str:
    return result.feed_id


PING = Method(
    "daemon.ping", d.PingParams, d.PingResult, "Check that the daemon answers.", inline=True
)
STATUS = Method(
    "daemon.status",
    d.StatusParams,
    d.StatusResult,
    "Version, uptime, paths, counts, what recovery did and the agents' environment.",
    inline=True,
)
SHUTDOWN = Method(
    "daemon.shutdown",
    d.ShutdownParams,
    d.ShutdownResult,
    "Reply, then close every session and exit.",
    mutation=True,
)
RELOAD_ENV = Method(
    "daemon.reloadEnv",
    d.ReloadEnvParams,
    d.ReloadEnvResult,
    "Capture the agents' environment again; agents started after it get the new one.",
    mutation=True,
)
DISCOVER = Method(
    "rpc.discover",
    d.DiscoverParams,
    d.DiscoverResult,
    "This API as an OpenRPC 1.3 document.",
    inline=True,
)
RESTART = Method(
    "daemon.restart",
    d.RestartParams,
    d.RestartResult,
    "Restart the daemon; with drain, take no new turn and wait for running ones first.",
    mutation=True,
)
CREATE = Method(
    "agentSession.create",
    s.CreateParams,
    s.CreateResult,
    "Create a session and (by default) start its agent.",
    mutation=True,
)
GET = Method(
    "agentSession.get",
    s.GetParams,
    s.GetResult,
    "One session's record, status, fence and live child.",
    inline=True,
)
LIST = Method(
    "agentSession.list",
    s.ListParams,
    s.ListResult,
    "Every session, optionally filtered by phase or provider.",
    inline=True,
)
START = Method(
    "agentSession.start",
    s.StartParams,
    s.StartResult,
    "Start the session's agent if it is not running.",
    mutation=True,
)
CLOSE = Method(
    "agentSession.close",
    s.CloseParams,
    s.CloseResult,
    "End the agent child; keep the record and journal.",
    mutation=True,
)
DELETE = Method(
    "agentSession.delete",
    s.DeleteParams,
    s.DeleteResult,
    "Close, then remove the record and journal.",
    mutation=True,
)
SEND = Method(
    "agentSession.send",
    c.SendParams,
    c.SendResult,
    "Journal a prompt (write-ahead), start the agent if needed, and deliver it.",
    mutation=True,
)
INTERRUPT = Method(
    "agentSession.interrupt",
    c.InterruptParams,
    c.InterruptResult,
    "Interrupt the running turn.",
    mutation=True,
)
RESPOND = Method(
    "agentSession.respond",
    c.RespondParams,
    c.RespondResult,
    "Answer a pending approval; the first answer wins.",
    mutation=True,
)
CONTINUE = Method(
    "agentSession.continue",
    c.ContinueParams,
    c.ContinueResult,
    "Resume a turn a daemon restart cut off, asking the agent to carry on.",
    mutation=True,
)
SET_OPTIONS = Method(
    "agentSession.setOptions",
    c.SetOptionsParams,
    c.SetOptionsResult,
    "Change the title or options; each change applies as live as the agent allows (``appliesAt``).",
    mutation=True,
)
OPTIONS = Method(
    "agentSession.options",
    ctl.OptionsParams,
    ctl.OptionsResult,
    "The session's options now, what each may be set to (models, efforts, modes) and "
    "where a change applies.",
)
COMMANDS = Method(
    "agentSession.commands",
    ctl.CommandsParams,
    ctl.CommandsResult,
    "The commands a client may run: the agent's slash commands and skills, and "
    "agentsd's own (compact, clear).",
)
COMMAND = Method(
    "agentSession.command",
    ctl.CommandParams,
    ctl.CommandResult,
    "Run one command: compact the conversation, clear it (a fresh one, history kept), "
    "or one of the agent's.",
    mutation=True,
)
QUEUE = Method(
    "agentSession.queue",
    c.QueueParams,
    c.QueueResult,
    "The prompts held behind the running turn: list, withdraw, edit, send one now, resume.",
    mutation=True,
)
SET_TITLE = Method(
    "agentSession.setTitle",
    c.SetTitleParams,
    c.SetOptionsResult,
    "Change the session's title.",
    mutation=True,
)
HISTORY = Method(
    "agentSession.history",
    st.HistoryParams,
    st.HistoryResult,
    "A byte-bounded page of the journal, by seq.",
)
SUBSCRIBE = Method(
    "agentSession.subscribe",
    st.SubscribeParams,
    st.SubscribeResult,
    "Catch up after a seq, then follow live.",
    stream_key=_subscription_key,
)
UNSUBSCRIBE = Method(
    "agentSession.unsubscribe",
    st.UnsubscribeParams,
    st.UnsubscribeResult,
    "End a subscription.",
)
WATCH = Method(
    "agentSession.watch",
    st.WatchParams,
    st.WatchResult,
    "Every session's status now, then a notification on each change.",
    stream_key=_watch_key,
)
ACKNOWLEDGE = Method(
    "agentSession.acknowledge",
    a.AcknowledgeParams,
    a.AcknowledgeResult,
    "Record that the user has seen the session up to a seq (durable).",
)
COMPLETIONS = Method(
    "agentSession.completions",
    a.CompletionsParams,
    a.CompletionsResult,
    "What is unseen now, then each turn completion and approval request, live. One "
    "feed per connection: asking again replaces it (same feedId).",
    stream_key=_feed_key,
)

METHODS: dict[str, Method[Any, Any]] = {
    m.name: m
    for m in (
        PING,
        STATUS,
        SHUTDOWN,
        RELOAD_ENV,
        RESTART,
        DISCOVER,
        CREATE,
        GET,
        LIST,
        START,
        CLOSE,
        DELETE,
        SEND,
        INTERRUPT,
        RESPOND,
        CONTINUE,
        SET_OPTIONS,
        OPTIONS,
        COMMANDS,
        COMMAND,
        QUEUE,
        SET_TITLE,
        HISTORY,
        SUBSCRIBE,
        UNSUBSCRIBE,
        WATCH,
        ACKNOWLEDGE,
        COMPLETIONS,
    )
}

INLINE_METHODS = frozenset(name for name, m in METHODS.items() if m.inline)


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
            "agentSession.notice",
            a.NoticeNotification,
            "A turn completed or an approval was requested (``completions`` feeds).",
        ),
        NotificationType(
            "agentSession.ended", st.EndedNotification, "The subscribed session was deleted."
        ),
    ]
}
