"""One client connection: framing, decoding, concurrent dispatch, bounded replies.

Rule 1: the first bytes choose the framing; every reply and notification uses it.

Rule 2: requests on one connection run concurrently (at most ``MAX_IN_FLIGHT``; past
that the connection simply stops reading, which pushes back on the client). Replies
carry their request ids, so order does not matter.

Rule 3: outbound data is bounded. A client that does not read its replies is
disconnected when ``MAX_OUTBOUND_BYTES`` are queued for it; the daemon's memory does
not grow with a slow or dead client, and nothing else waits for it.

Rule 4: a framing error (garbage, an oversized frame) gets one error reply with id
null and then the connection is closed; other connections never notice.

Rule 5: a frame, once begun, must arrive whole within ``frame_timeout_s`` of waiting
on its client (time the daemon spends not reading does not count); a half-frame that
stalls longer is a framing error (Rule 4). Without this a client that stops mid-frame
(crashed, or stopped with SIGSTOP) would hold its connection slot forever.

Rule 6: the connection knows nothing of sockets. It reads and writes one
``trio.abc.Stream`` through a ``Transport`` chosen where the stream is made: the
listener's ``SocketTransport`` adds a direct write to the socket (the fast path of
``_send_reply``); ``StreamTransport`` serves any other stream (memory streams in
tests) with every reply going through the writer task.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

import trio
from msgspec import UnsetType

from agentsd_protocol.errors import FrameTooLarge, InternalError, ParseError, RpcError
from agentsd_protocol.framing import FrameDecoder, Framing, encode_frame
from agentsd_protocol.jsonrpc import (
    DecodedFrame,
    Incoming,
    InvalidEntry,
    decode_entry,
    decode_frame,
    encode_batch,
    encode_error,
    encode_notification,
    encode_success,
    is_batch,
)
from agentsd_protocol.methods import INLINE_METHODS

if TYPE_CHECKING:
    from agentsd.app import App
    from agentsd.caller import Caller
    from agentsd.operations import Operation

log = logging.getLogger(__name__)

RECEIVE_BYTES = 64 * 1024  # one read; large frames arrive over several
MAX_IN_FLIGHT = 64  # concurrent requests per connection before we stop reading
MAX_OUTBOUND_BYTES = 16 * 1024 * 1024  # queued for one client before it is cut off
MAX_OUTBOUND_MESSAGES = 4096  # the same bound counted in messages
# wait_outbound_below also waits past this many queued messages: a flood of small
# notifications must make a pump wait, not reach MAX_OUTBOUND_MESSAGES and cut off
# a client that reads.
OUTBOUND_HIGH_WATER_MESSAGES = MAX_OUTBOUND_MESSAGES // 2
FLUSH_TIMEOUT_S = 2.0  # how long a reply that must precede an action may take
WRITE_BATCH_BYTES = 256 * 1024  # one send_all; large enough to amortize, small enough to interleave


_ids = itertools.count(1)


class Transport(Protocol):
    """A connection's byte stream, and whether a reply can skip the writer task."""

    @property
    def stream(self) -> trio.abc.Stream: ...

    def write_now(self, data: bytes) -> int:
        """Write what the peer takes without waiting and return how many bytes that
        was (0 when it takes none, or when the stream cannot write without waiting).
        Raises ``trio.BrokenResourceError`` when the peer is gone."""
        ...


class StreamTransport:
    """Any trio stream. It has no write that cannot block, so every reply is queued
    for the writer task, which bounds how long the client may take (Rule 3)."""

    __slots__ = ("stream",)

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream

    def write_now(self, data: bytes) -> int:
        return 0


class Call:
    """What a handler may use besides its params: the daemon and the connection."""

    __slots__ = ("after_reply", "app", "connection", "operation")  # one per request

    def __init__(self, app: App, connection: Connection) -> None:
        self.app = app
        self.connection = connection
        self.after_reply: list[Callable[[], None]] = []
        self.operation: Operation | None = None  # set by dispatch for an idempotent mutation


class Connection:
    """Owned by the task running ``serve``; other tasks only call ``send_*``."""

    def __init__(self, app: App, transport: Transport) -> None:
        self.id = next(_ids)
        self.app = app
        self._stream = transport.stream
        self._write_now = transport.write_now
        self._decoder = FrameDecoder(max_frame_bytes=app.config.max_frame_bytes)
        self._send, self._receive = trio.open_memory_channel[tuple[bytes, trio.Event | None]](
            MAX_OUTBOUND_MESSAGES
        )
        self._queued_bytes = 0
        # Entries in the outbound channel or being written: the channel's own
        # statistics() builds an object per call, and a pump asks once per event.
        self._queued_entries = 0
        self._in_flight = trio.Semaphore(MAX_IN_FLIGHT)
        self._scope = trio.CancelScope()
        self._progress = trio.lowlevel.ParkingLot()
        self._nursery: trio.Nursery | None = None
        self.closed_reason: str | None = None
        self.on_close: list[Callable[[], None]] = []
        # The session whose agent connected (agentsd.caller), None: the user,
        # UNIDENTIFIED: maybe an agent, but whose is unknown.
        self.caller: Caller = None

    @property
    def caller_session(self) -> str | None:
        """The session whose agent connected, if it is known."""
        return self.caller if isinstance(self.caller, str) else None

    @property
    def framing(self) -> Framing:
        return self._decoder.framing or Framing.NDJSON

    # ---- outbound -------------------------------------------------------------

    def send_message(self, body: bytes, flushed: trio.Event | None = None) -> bool:
        """Queue one encoded message; never blocks. Returns False (and closes the
        connection) when the client is too far behind."""
        if self.closed_reason is not None:
            return False
        return self._enqueue_frame(encode_frame(self.framing, body), flushed)

    def send_messages(self, bodies: Sequence[bytes]) -> bool:
        """Queue encoded messages to go out together, in chunks of about
        ``WRITE_BATCH_BYTES`` (a catch-up page: one queue entry and one write per
        chunk instead of one per message); as ``send_message`` otherwise."""
        if self.closed_reason is not None:
            return False
        if self.framing is Framing.NDJSON:
            # body + b"\n" for each, without a bytes object per frame.
            chunk: list[bytes] = []
            size = 0
            for body in bodies:
                chunk.append(body)
                size += len(body) + 1
                if size >= WRITE_BATCH_BYTES:
                    chunk.append(b"")
                    if not self._enqueue_frame(b"\n".join(chunk), None):
                        return False
                    chunk, size = [], 0
            if not chunk:
                return True
            chunk.append(b"")
            return self._enqueue_frame(b"\n".join(chunk), None)
        frames: list[bytes] = []
        size = 0
        for body in bodies:
            frame = encode_frame(Framing.CONTENT_LENGTH, body)
            frames.append(frame)
            size += len(frame)
            if size >= WRITE_BATCH_BYTES:
                if not self._enqueue_frame(b"".join(frames), None):
                    return False
                frames, size = [], 0
        return not frames or self._enqueue_frame(b"".join(frames), None)

    def _enqueue_frame(self, frame: bytes, flushed: trio.Event | None) -> bool:
        if self._queued_bytes + len(frame) > MAX_OUTBOUND_BYTES:
            self.close("client is not reading its replies (outbound bound reached)")
            return False
        try:
            self._send.send_nowait((frame, flushed))
        except trio.WouldBlock:
            self.close("client is not reading its replies (outbound queue full)")
            return False
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        self._queued_bytes += len(frame)
        self._queued_entries += 1
        return True

    def notify(self, method: str, params: object) -> bool:
        return self.send_message(encode_notification(method, params))

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    async def wait_outbound_below(self, limit: int) -> None:
        """Wait until less than ``limit`` bytes (and fewer than
        ``OUTBOUND_HIGH_WATER_MESSAGES`` messages) are queued for this client (how a
        subscription pump yields to a slow reader instead of flooding it)."""
        while self._queued_bytes >= limit or self._queued_entries >= OUTBOUND_HIGH_WATER_MESSAGES:
            await self._progress.park()

    def spawn(self, fn: Callable[..., Awaitable[None]], *args: object) -> None:
        """Run a task that lives as long as this connection (a subscription pump)."""
        if self._nursery is None or self.closed_reason is not None:
            return
        self._nursery.start_soon(fn, *args)

    def close(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
            log.info("closing connection %d: %s", self.id, reason)
        self._scope.cancel()

    async def _run_writer(self) -> None:
        async for frame, flushed in self._receive:
            # Everything already queued goes out in one write: under load, replies
            # and notifications share syscalls.
            frames = [frame]
            events = [flushed]
            size = len(frame)
            while size < WRITE_BATCH_BYTES:
                try:
                    more, more_flushed = self._receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                frames.append(more)
                events.append(more_flushed)
                size += len(more)
            # _queued_bytes still counts these frames until they are sent, which is
            # what keeps _send_reply from writing around them (Rule 3's bookkeeping
            # doubles as "the writer is busy").
            with trio.move_on_after(self.app.config.send_timeout_s) as timeout:
                await self._stream.send_all(frames[0] if len(frames) == 1 else b"".join(frames))
            if timeout.cancelled_caught:
                self.close("client accepted no bytes for too long")
                return
            self._queued_bytes -= size
            self._queued_entries -= len(frames)
            self._progress.unpark_all()
            for event in events:
                if event is not None:
                    event.set()

    # ---- inbound --------------------------------------------------------------

    async def serve(self) -> None:
        """Run until the client disconnects, misbehaves, or the daemon stops.

        On return every handler task of this connection has finished and the
        ``on_close`` callbacks (subscriptions and the like) have run.
        """
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._run_writer)
                    async with trio.open_nursery() as tasks:
                        self._nursery = tasks
                        async with trio.open_nursery() as handlers:
                            await self._read_loop(handlers)
                        # The client half-closed and every request was answered; what it
                        # subscribed to ends with it.
                        self._nursery = None
                        tasks.cancel_scope.cancel()
                    await self._send.aclose()  # the writer flushes what is queued, then stops
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            # The client went away (EPIPE, ECONNRESET). Nurseries wrap this in an
            # ExceptionGroup, hence except*: a plain except would let it escape and
            # take the whole daemon down.
            pass
        finally:
            for callback in self.on_close:
                callback()
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await self._stream.aclose()

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        frame_timeout_s = self.app.config.frame_timeout_s
        decoder = self._decoder
        stalled_s = 0.0  # how long the unfinished frame at the buffer's tail waited (Rule 5)
        while True:
            if not decoder.in_frame:
                stalled_s = 0.0
                data = await self._stream.receive_some(RECEIVE_BYTES)
            else:
                waited_from = trio.current_time()
                with trio.move_on_after(frame_timeout_s - stalled_s):
                    data = await self._stream.receive_some(RECEIVE_BYTES)
                stalled_s += trio.current_time() - waited_from
                if stalled_s >= frame_timeout_s:
                    await self._refuse(
                        ParseError(
                            f"Parse error: a frame was left unfinished for {frame_timeout_s:g} s"
                        )
                    )
                    return
            if not data:
                return
            # A memory stream returns a bytearray, a socket bytes. The check costs about
            # 15 ns a read; bytes() of bytes, though it copies nothing, about 250 ns.
            if type(data) is not bytes:
                data = bytes(data)
            try:
                for frame in decoder.feed_frames(data):
                    stalled_s = 0.0  # what follows this frame is a new one
                    if is_batch(frame):
                        await self._in_flight.acquire()
                        nursery.start_soon(self._respond_batch, decode_frame(frame))
                        continue
                    entry = decode_entry(frame)
                    if isinstance(entry, InvalidEntry) or entry.method in INLINE_METHODS:
                        # No task of its own: a task switch costs more than the work.
                        await self._respond(entry)
                        continue
                    await self._in_flight.acquire()
                    nursery.start_soon(self._respond_in_task, entry)
                # Let the other connections run before reading again. Under load the
                # client's next request has usually arrived by the time this task is
                # back, so the read succeeds at once instead of failing and re-arming
                # epoll (with 64 busy clients: about a third less daemon CPU per
                # request). It is also where a flooding client yields to the others.
                await trio.lowlevel.cancel_shielded_checkpoint()
            except (ParseError, FrameTooLarge) as exc:
                await self._refuse(exc)
                return

    async def _refuse(self, exc: ParseError | FrameTooLarge) -> None:
        """Rule 4: one error reply with id null, then close."""
        flushed = trio.Event()
        self.send_message(encode_error(None, exc), flushed)
        with trio.move_on_after(FLUSH_TIMEOUT_S):
            await flushed.wait()
        self.close(f"framing error: {exc.message}")

    async def _respond_in_task(self, entry: Incoming) -> None:
        try:
            await self._respond(entry)
        finally:
            self._in_flight.release()

    async def _respond(self, entry: Incoming) -> None:
        after: list[Callable[[], None]] = []
        reply = await self._handle_entry(entry, after)
        if reply is None:
            return
        if after:
            await self._send_then(reply, after)
        else:
            self._send_reply(reply)

    async def _respond_batch(self, decoded: DecodedFrame) -> None:
        try:
            replies: list[bytes] = []
            after: list[Callable[[], None]] = []
            for entry in decoded.entries:
                reply = await self._handle_entry(entry, after)
                if reply is not None:
                    replies.append(reply)
            if not replies:
                return
            body = encode_batch(replies) if decoded.is_batch else replies[0]
            if after:
                await self._send_then(body, after)
            else:
                self._send_reply(body)
        finally:
            self._in_flight.release()

    async def _send_then(self, body: bytes, after: list[Callable[[], None]]) -> None:
        """Send a reply that must reach the client before ``after`` runs (a shutdown,
        a restart). ``after`` runs even when the connection breaks meanwhile: what was
        asked and answered happens whether or not the client is still there (a drained
        restart must not leave the daemon refusing turns)."""
        flushed = trio.Event()
        self.send_message(body, flushed)
        try:
            with trio.move_on_after(FLUSH_TIMEOUT_S):
                await flushed.wait()
        finally:
            for action in after:
                action()

    def _send_reply(self, body: bytes) -> None:
        """Write a reply straight to the transport when nothing is queued or being
        written (saves waking the writer task: the common case of one client waiting
        for one answer). The write never blocks: what the transport does not take now
        is queued for the writer, so a client that does not read still meets the
        outbound bound (Rule 3) instead of stalling this task."""
        if self._queued_bytes:  # queued or being written: a direct write would interleave
            self.send_message(body)
            return
        frame = encode_frame(self.framing, body)
        try:
            written = self._write_now(frame)
        except trio.BrokenResourceError as exc:
            self.close(f"client went away ({exc})")
            return
        if written < len(frame):
            self._enqueue_frame(frame[written:] if written else frame, None)

    async def _handle_entry(self, entry: Incoming, after: list[Callable[[], None]]) -> bytes | None:
        if isinstance(entry, InvalidEntry):
            return encode_error(entry.id, entry.error)
        request_id = entry.id  # UNSET for a notification, which gets no reply at all
        call = Call(self.app, self)
        try:
            result = await self.app.dispatch(call, entry)
        except RpcError as exc:
            return None if isinstance(request_id, UnsetType) else encode_error(request_id, exc)
        except Exception:
            # The one place an unexpected failure is mapped: logged here, generic on the wire.
            log.exception("internal error in %s", entry.method)
            error = InternalError("internal error; see the daemon log")
            return None if isinstance(request_id, UnsetType) else encode_error(request_id, error)
        if call.after_reply:
            after.extend(call.after_reply)
        if isinstance(request_id, UnsetType):
            return None
        return encode_success(request_id, result)
