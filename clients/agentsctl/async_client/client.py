"""The trio client's typed calls, one per registered method, and ``open_client``."""

from __future__ import annotations

import builtins
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from agentsctl.async_client.connection import RECONNECT_DEADLINE_S, Connector
from agentsctl.async_client.follow import Subscription, Watch
from agentsd_protocol.api import conversation as c
from agentsd_protocol.api import daemon as d
from agentsd_protocol.api import session as s
from agentsd_protocol.api import stream as st
from agentsd_protocol.paths import default_socket_path

# Every registered method and the AsyncClient method that calls it (a test keeps this
# equal to ``agentsd_protocol.methods.METHODS``).
TYPED_METHODS = {
    "daemon.ping": "ping",
    "daemon.status": "status",
    "daemon.shutdown": "shutdown",
    "rpc.discover": "discover",
    "agentSession.create": "create",
    "agentSession.get": "get",
    "agentSession.list": "list",
    "agentSession.start": "start",
    "agentSession.close": "close_session",
    "agentSession.delete": "delete",
    "agentSession.send": "send",
    "agentSession.interrupt": "interrupt",
    "agentSession.respond": "respond",
    "agentSession.setOptions": "set_options",
    "agentSession.history": "history",
    "agentSession.subscribe": "subscribe",
    "agentSession.unsubscribe": "unsubscribe",
    "agentSession.watch": "watch",
}


class AsyncClient(Connector):
    """A trio JSON-RPC 2.0 client of agentsd; build one with ``open_client``.

    Calls may run concurrently from any number of tasks. Each raises the daemon's
    ``RpcError`` subclass for an error reply, ``DaemonUnreachable`` (or a subclass)
    when no connection can be made or it fails before the reply (Rules 1 and 2), and
    ``ParseError`` for a result that does not fit its type. Cancelling a call abandons
    it; its late reply is dropped.
    """

    # -- typed methods --------------------------------------------------------------

    async def ping(self) -> d.PingResult:
        return await self.call("daemon.ping", result_type=d.PingResult)

    async def status(self) -> d.StatusResult:
        return await self.call("daemon.status", result_type=d.StatusResult)

    async def shutdown(self) -> d.ShutdownResult:
        """Ask the daemon to close every session and exit; it replies first."""
        return await self.call("daemon.shutdown", result_type=d.ShutdownResult)

    async def discover(self) -> dict[str, Any]:
        """This API as an OpenRPC document."""
        return await self.call("rpc.discover", result_type=dict[str, Any])

    async def create(
        self,
        provider: str,
        cwd: str | os.PathLike[str],
        *,
        title: str | None = None,
        options: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        command: Sequence[str] | None = None,
        start: bool = True,
        client_operation_id: str | None = None,
    ) -> s.CreateResult:
        params = s.CreateParams(
            provider=provider,
            cwd=os.fspath(cwd),
            title=title,
            options=options or {},
            env=env or {},
            command=None if command is None else builtins.list(command),
            start=start,
            client_operation_id=client_operation_id,
        )
        return await self.call("agentSession.create", params, result_type=s.CreateResult)

    async def get(self, session_id: str) -> s.GetResult:
        params = s.GetParams(session_id=session_id)
        return await self.call("agentSession.get", params, result_type=s.GetResult)

    async def start(
        self,
        session_id: str,
        *,
        client_operation_id: str | None = None,
        expected_fence: int | None = None,
    ) -> s.StartResult:
        params = s.StartParams(
            session_id=session_id,
            client_operation_id=client_operation_id,
            expected_fence=expected_fence,
        )
        return await self.call("agentSession.start", params, result_type=s.StartResult)

    async def close_session(
        self,
        session_id: str,
        *,
        client_operation_id: str | None = None,
        expected_fence: int | None = None,
    ) -> s.CloseResult:
        """``agentSession.close``: end the agent child, keep the record and journal."""
        params = s.CloseParams(
            session_id=session_id,
            client_operation_id=client_operation_id,
            expected_fence=expected_fence,
        )
        return await self.call("agentSession.close", params, result_type=s.CloseResult)

    async def delete(
        self,
        session_id: str,
        *,
        client_operation_id: str | None = None,
        expected_fence: int | None = None,
    ) -> s.DeleteResult:
        params = s.DeleteParams(
            session_id=session_id,
            client_operation_id=client_operation_id,
            expected_fence=expected_fence,
        )
        return await self.call("agentSession.delete", params, result_type=s.DeleteResult)

    async def send(
        self,
        session_id: str,
        text: str,
        *,
        client_operation_id: str | None = None,
        expected_fence: int | None = None,
        retry_unknown: bool = False,
    ) -> c.SendResult:
        """Journal a prompt, then deliver it; the reply says what became of it."""
        params = c.SendParams(
            session_id=session_id,
            text=text,
            client_operation_id=client_operation_id,
            expected_fence=expected_fence,
            retry_unknown=retry_unknown,
        )
        return await self.call("agentSession.send", params, result_type=c.SendResult)

    async def interrupt(
        self,
        session_id: str,
        *,
        turn_id: str | None = None,
        client_operation_id: str | None = None,
        expected_fence: int | None = None,
    ) -> c.InterruptResult:
        params = c.InterruptParams(
            session_id=session_id,
            turn_id=turn_id,
            client_operation_id=client_operation_id,
            expected_fence=expected_fence,
        )
        return await self.call("agentSession.interrupt", params, result_type=c.InterruptResult)

    async def respond(
        self,
        session_id: str,
        approval_id: str,
        decision: str,
        *,
        client_operation_id: str | None = None,
        expected_fence: int | None = None,
    ) -> c.RespondResult:
        """Answer a pending approval; ``AlreadyResolved`` names the winner if another
        answer came first."""
        params = c.RespondParams(
            session_id=session_id,
            approval_id=approval_id,
            decision=decision,
            client_operation_id=client_operation_id,
            expected_fence=expected_fence,
        )
        return await self.call("agentSession.respond", params, result_type=c.RespondResult)

    async def set_options(
        self,
        session_id: str,
        *,
        title: str | None = None,
        options: dict[str, Any] | None = None,
        client_operation_id: str | None = None,
        expected_fence: int | None = None,
    ) -> c.SetOptionsResult:
        params = c.SetOptionsParams(
            session_id=session_id,
            title=title,
            options=options,
            client_operation_id=client_operation_id,
            expected_fence=expected_fence,
        )
        return await self.call("agentSession.setOptions", params, result_type=c.SetOptionsResult)

    async def history(
        self,
        session_id: str,
        *,
        after_seq: int | None = None,
        before_seq: int | None = None,
        limit: int = 200,
    ) -> st.HistoryResult:
        params = st.HistoryParams(
            session_id=session_id, after_seq=after_seq, before_seq=before_seq, limit=limit
        )
        return await self.call("agentSession.history", params, result_type=st.HistoryResult)

    async def unsubscribe(self, subscription_id: str) -> st.UnsubscribeResult:
        """End a subscription by id (``subscribe``'s context manager does this itself)."""
        params = st.UnsubscribeParams(subscription_id=subscription_id)
        return await self.call("agentSession.unsubscribe", params, result_type=st.UnsubscribeResult)

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

    async def list(
        self, *, state: s.Phase | None = None, provider: str | None = None
    ) -> s.ListResult:
        # Defined last: later annotations in the class body would see this method
        # instead of the builtin ``list``.
        params = s.ListParams(state=state, provider=provider)
        return await self.call("agentSession.list", params, result_type=s.ListResult)


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
