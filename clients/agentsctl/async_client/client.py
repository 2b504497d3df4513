"""The trio client: ``call(methods.X, params)`` (typed by the method), following
sessions and watching statuses, and ``open_client``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from agentsctl.async_client.connection import RECONNECT_DEADLINE_S, Connector
from agentsctl.async_client.follow import Subscription, Watch
from agentsd_protocol.paths import default_socket_path


class AsyncClient(Connector):
    """A trio JSON-RPC 2.0 client of agentsd; build one with ``open_client``.

    ``await client.call(methods.SEND, SendParams(...))`` is a ``SendResult``. Calls
    may run concurrently from any number of tasks. Each raises the daemon's
    ``RpcError`` subclass for an error reply, ``DaemonUnreachable`` (or a subclass)
    when no connection can be made or it fails before the reply (Rules 1 and 2), and
    ``ParseError`` for a result that does not fit its type. Cancelling a call abandons
    it; its late reply is dropped.
    """

    @asynccontextmanager
    async def subscribe(
        self, session_id: str, *, after_seq: int | None = 0
    ) -> AsyncIterator[Subscription]:
        """Follow a session: ``async for item in subscription`` yields its journal
        events after ``after_seq`` (None: from the current head), then live events and
        deltas, until the session is deleted (Rule 3).

        Entering raises what the first ``agentSession.subscribe`` raises (for example
        ``SessionNotFound``). Iterating raises ``SessionNotFound`` once the session is
        deleted (see ``Subscription``), and otherwise only when re-subscribing failed
        for good. Leaving unsubscribes (bounded, even when cancelled).
        """
        subscription = Subscription(self, session_id, after_seq)
        await subscription.open()
        try:
            yield subscription
        finally:
            await subscription.aclose()

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[Watch]:
        """Follow every session's status: ``async for note in watch`` yields a
        ``StatusNotification`` per session now, then one per change. After a reconnect
        it yields the fresh snapshot, with ``deleted`` for sessions that vanished."""
        watch = Watch(self)
        await watch.open()
        try:
            yield watch
        finally:
            await watch.aclose()


@asynccontextmanager
async def open_client(
    path: str | os.PathLike[str] | None = None,
    *,
    reconnect_deadline_s: float = RECONNECT_DEADLINE_S,
) -> AsyncIterator[AsyncClient]:
    """Connect to the daemon at ``path`` (default: ``default_socket_path()``).

    Raises ``DaemonNotRunning`` or ``DaemonUnreachable`` if it cannot connect now.
    The client's reader tasks live in a nursery of this context; leaving it closes the
    connection, and calls still waiting raise ``DaemonDisconnected``.
    """
    socket_path = os.fspath(path) if path is not None else str(default_socket_path())
    try:
        async with trio.open_nursery() as nursery:
            client = AsyncClient(nursery, socket_path, reconnect_deadline_s=reconnect_deadline_s)
            try:
                await client.connection()
                yield client
            finally:
                client.abort("the client was closed")
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The body runs inside the nursery, which wraps what it raises; callers should
        # catch ``SessionNotFound``, not a group of one.
        sole = sole_exception(group)
        if sole is group:
            raise
        raise sole from sole.__cause__


def sole_exception(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception nested in ``group``, or ``group`` itself if it holds several."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
        inner = inner.exceptions[0]
    return group if isinstance(inner, BaseExceptionGroup) else inner
