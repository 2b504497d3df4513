"""Our end of Codex's JSON-RPC: requests awaiting responses, over one ``LineLink``.

Codex speaks JSON-RPC 2.0 without the ``"jsonrpc"`` member, one object per line,
and sends requests of its own, numbered from 0 independently of ours.

Rule 1 (one reader): only the adapter's reader calls ``receive`` and ``resolve``.
Other tasks call ``request`` and wait on the returned ``Call`` with a deadline; the
reader settles it when the response arrives, and ``close`` settles every call still
open, so nobody waits for a response that can no longer come.

Rule 2: a message with ``method`` is the server's (a request when it also has an
``id``); one without ``method`` but with ``id`` and ``result``/``error`` is a
response to us; anything else is garbage.

Rule 3 (takeover): a peer that takes over from an earlier one (``take_over``)
numbers its requests from ``generation << GENERATION_SHIFT``, a range no earlier
generation used, so a late response to the earlier peer's request is never taken
for one of ours; a response nobody waits for is logged and dropped.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import attrs
import msgspec
import trio

from agentsd.providers.base import LineLink

log = logging.getLogger(__name__)

_encoder = msgspec.json.Encoder()
# Request ids of generation g start at g << 32: 2**32 requests per generation, and
# ids stay below 2**53 (exact in JavaScript agents) up to generation 2**21.
GENERATION_SHIFT = 32


def clip(value: Any, limit: int = 300) -> str:
    """A short printable form of a JSON value, for messages."""
    text = value if isinstance(value, str) else _encoder.encode(value).decode()
    return text if len(text) <= limit else text[:limit] + "..."


def error_message(error: Any) -> str:
    """The ``message`` of a JSON-RPC error member (or the member itself, clipped)."""
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return clip(error)


@attrs.define(eq=False)
class Call:
    """One request of ours; ``done`` is set once ``result`` or ``error`` is known."""

    method: str
    done: trio.Event = attrs.field(factory=trio.Event)
    result: Any = None
    error: Any = None  # the error member, or a stand-in when the agent went away

    def settle(self, result: Any = None, error: Any = None) -> None:
        if not self.done.is_set():
            self.result = result
            self.error = error
            self.done.set()

    async def wait(self, timeout_s: float) -> bool:
        """Whether the response arrived within ``timeout_s``."""
        with trio.move_on_after(timeout_s):
            await self.done.wait()
        return self.done.is_set()


@attrs.frozen
class Garbage:
    """A line that is not a JSON object (already consumed from the stream)."""

    line: bytes

    def describe(self) -> str:
        return f"codex wrote a line that is not a JSON object: {self.line[:200]!r}"


class RpcPeer:
    """Requests to Codex and their responses; see the module's rules."""

    def __init__(self, link: LineLink, *, agent: str = "codex", jsonrpc: bool = False) -> None:
        """``agent`` names the peer in messages; ``jsonrpc`` adds the ``"jsonrpc":
        "2.0"`` member to every message (ACP agents require it, Codex omits it)."""
        self._link = link
        self._agent = agent
        self._envelope: dict[str, Any] = {"jsonrpc": "2.0"} if jsonrpc else {}
        self._ids = itertools.count(1)
        self._calls: dict[int, Call] = {}
        self.closed = False

    def take_over(self, generation: int) -> None:
        """Number the next requests in ``generation``'s range (Rule 3)."""
        self._ids = itertools.count((generation << GENERATION_SHIFT) + 1)

    async def request(self, method: str, params: dict[str, Any]) -> Call:
        """Send a request. Raises ``trio.ClosedResourceError`` once the output ended
        (``close``) and ``trio.BrokenResourceError`` when the child's stdin is gone."""
        if self.closed:
            raise trio.ClosedResourceError(f"{self._agent} has exited")
        request_id = next(self._ids)
        call = Call(method)
        self._calls[request_id] = call
        try:
            await self._link.send(
                {**self._envelope, "id": request_id, "method": method, "params": params}
            )
        except BaseException:
            self._calls.pop(request_id, None)
            raise
        return call

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message = {**self._envelope, "method": method}
        if params is not None:
            message["params"] = params
        await self._link.send(message)

    async def respond(self, request_id: int | str, result: Any) -> bool:
        """Answer a server request; False when the child is gone (nothing to answer)."""
        return await self._reply({"id": request_id, "result": result})

    async def refuse(self, request_id: Any, code: int, message: str) -> bool:
        """Answer a server request with an error; False when the child is gone."""
        return await self._reply({"id": request_id, "error": {"code": code, "message": message}})

    async def _reply(self, message: dict[str, Any]) -> bool:
        try:
            await self._link.send({**self._envelope, **message})
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.info(
                "%s exited before our answer to its request %r", self._agent, message.get("id")
            )
            return False
        return True

    async def receive(self) -> dict[str, Any] | Garbage | None:
        """The next message; ``Garbage`` for a line that is not a JSON object; None at
        end of output. An overlong line raises ``AgentProtocolError`` (the stream
        cannot be resynchronized)."""
        line = await self._link.receive_line()
        if line is None:
            return None
        try:
            message = msgspec.json.decode(line)
        except msgspec.DecodeError:
            return Garbage(line)
        return message if isinstance(message, dict) else Garbage(line)

    def resolve(self, frame: dict[str, Any]) -> Call | None:
        """Settle the call a response answers and return it; None when its waiter
        already gave up (past its deadline) or nobody asked."""
        request_id = frame.get("id")
        call = self._calls.pop(request_id, None) if isinstance(request_id, int) else None
        if call is None:
            log.info(
                "%s answered request %s, which this adapter never sent (an earlier "
                "daemon's, before a takeover): ignored",
                self._agent,
                clip(request_id, 40),
            )
            return None
        if "error" in frame:
            call.settle(error=frame["error"] if frame["error"] is not None else {})
        else:
            call.settle(result=frame.get("result"))
        return call

    def close(self) -> None:
        """The output ended: settle every open call with an error; later requests
        raise ``trio.ClosedResourceError``."""
        self.closed = True
        for call in self._calls.values():
            call.settle(error={"message": f"{self._agent} exited before answering"})
        self._calls.clear()
