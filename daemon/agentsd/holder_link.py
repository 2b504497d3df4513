"""The daemon's end of the holder (``agentsd.holder``): start it, attach, and give
each agent it holds trio streams like a pipe's.

Rule 1 (one link, one holder): `open_holder_link` connects to the state
directory's holder, starting one (detached: its own session, outliving this daemon)
when none listens, and attaches with an epoch above any earlier daemon's: a
durable counter (`next_epoch`, ``holder.epoch`` in the state directory, 0600), at
least ``time.time_ns()`` so that it stays above the clock-based epochs of earlier
releases, and always above the last one stored, so that a clock stepped back never
fences the next daemon out. Daemons of one state directory never overlap (the
daemon lock sees to that), so reading, incrementing and storing it needs no lock of
its own between processes. Under systemd the holder is started in a scope of its
own, outside the service's cgroup (``agentsd.holder_scope``), so that neither a stop
nor a crash of the service takes it and its agents along. A link is never
re-established: once the holder is lost (its socket ended: it died), every agent on
it is lost, and the next spawn starts a new holder.

Rule 2 (what a lost holder means): the agents it held lost their pipes. Their
output ends (`HeldAgent.stdout` reads end of file) and their exit can no longer be
reported (`HeldAgent.wait` never returns); whoever owns an agent ends it by its
recorded identity and proves it gone (``agentsd.held_child``). A holder is started
with a mark of its own in its environment (``AGENTSD_HOLDER_MARK``, `new_mark`),
which its forks carry until they exec an agent (``agentsd.holder`` Rule 1); the
link knows it from the ``welcome`` (`HolderLink.mark`, None for a holder of an
earlier release), so that a spawn the lost holder never confirmed is ended only
once no fork of it can still exec the agent.

Rule 3 (output): an agent's stdout is read in order, offsets checked against the
holder's numbering. Each byte handed to the reader is acknowledged at once, so the
holder retains only what is still in flight; or, for an agent a later daemon may
reattach (``durable_acks``), only once its effects are journaled
(`HeldAgent.acknowledge_out`, ``agentsd.sink`` Rule 4), so the holder retains
everything a later daemon must read again. The holder relays stdout at most
``OUT_WINDOW`` bytes ahead of what the reader took (the ``upto`` of its ``resume``
and ``ack``, moved on as the reader takes it), as a pipe's capacity would: what an
agent writes faster than the reader takes it waits in the holder and its pipe, and
comes in bigger messages, not as one message per line written. Stderr is copied to
the caller's stderr pipe (``agentsd.stderr_log``) by a task of that agent's, which
runs while there is stderr to write, never by the link's one reader (a log reader
that stalls must not stall every agent's output and every reply), and acknowledged
as it is written: what waits is bounded by the holder's bound, and a stalled log
stalls that agent's stderr writes only.

Rule 4 (agents nobody claims): what the holder held at attach (``found``) may be
adopted (`HolderLink.adopt`: its output resumed from a given offset) until
`HolderLink.forget_unclaimed`; from then on an agent that no one here spawned or
adopted is forgotten once it exited (recovery at start-up ends the previous
daemon's; the holder then reaps them), so the holder does not keep their status for
ever and leaves once it holds nothing.

Rule 5 (keyed writes): the first write to an agent's stdin inside `keyed` carries
that key (``agentsd.holder`` Rule 3), and later ones of the block go unkeyed (a
write keyed meanwhile by another task stays the last key). The holder reports the
last key it took for each agent it held at attach (`HeldAgent.stdin_key`; `HeldAgent.keys_known`
False when the holder cannot say, an earlier release's or one a daemon that does
not key wrote to). An answer's delivery, and an interrupt's, is keyed with its seq
in the journal (``agentsd.delivery`` Rule 3), so a daemon taking over knows which
answers and interrupts reached the agent (``agentsd.reattach`` Rule 2). A key is
taken with the frame that carries it, atomically (Rule 3 of the holder);
`StdinKey.written` says whether a write of the block went out (to a holder, the
one that carried the key).
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import select
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, suppress
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeGuard

import attrs
import trio

from agentsd import holder as wire
from agentsd.holder_scope import START_RETRY_S, HolderScope
from agentsd.procfs import HOLDER_MARK_ENV

log = logging.getLogger(__name__)

SOCKET_NAME = "holder.sock"
EPOCH_NAME = "holder.epoch"
LOG_NAME = "holder.log"
HOLDER_SCRIPT = Path(wire.__file__)
CONNECT_TIMEOUT_S = 10.0  # a holder accepts from its first instruction
START_RETRY_PAUSE_S = 0.1  # between attempts to start a holder in its scope
REQUEST_TIMEOUT_S = 30.0  # a request is a few syscalls in the holder; a spawn a fork
# Once an agent's exit is proven, how long the rest of its stderr may take to arrive
# (what it wrote is in the holder or its pipe; ``agentsd.stderr_log`` waits as long).
ERR_DRAIN_S = 2.0
ERR_CHUNK = 64 << 10  # one write of stderr to the caller's pipe
# Rule 3: how far the holder may relay an agent's stdout ahead of what its reader
# took (what waits here, like a pipe's capacity), and by how much the reader's
# progress moves that bound before the holder is told.
OUT_WINDOW = 256 << 10
OUT_WINDOW_STEP = 64 << 10
LINK_READ_BYTES = 256 << 10  # one read of the holder's socket


@attrs.define
class StdinKey:
    """Rule 5: the key of what the current task writes to a held agent's stdin."""

    value: str
    written: bool = False  # a write went out: to a holder, it carried the key
    # Called once, in the writing task, when the first write went out: the order
    # its key was taken in (or, on a direct pipe, its bytes) is settled from then on.
    on_written: Callable[[], None] | None = None


def note_written() -> None:
    """A write of the current task went out, to a holder or a direct pipe: its key
    (if it writes inside `keyed`) is `StdinKey.written`, and its ``on_written`` is
    called, once."""
    key = _STDIN_KEY.get()
    if key is None:
        return
    key.written = True
    written, key.on_written = key.on_written, None
    if written is not None:
        written()


_STDIN_KEY: ContextVar[StdinKey | None] = ContextVar("agentsd_stdin_key", default=None)


@contextmanager
def keyed(value: str, on_written: Callable[[], None] | None = None) -> Iterator[StdinKey]:
    """Key what this task writes to a held agent's stdin with ``value`` (Rule 5);
    ``on_written``: `StdinKey.on_written`."""
    key = StdinKey(value, on_written=on_written)
    token = _STDIN_KEY.set(key)
    try:
        yield key
    finally:
        _STDIN_KEY.reset(token)


@contextmanager
def unkeyed() -> Iterator[None]:
    """Write unkeyed inside a `keyed` block: frames that must not carry its key
    (Rule 5: the key says its frame was taken)."""
    token = _STDIN_KEY.set(None)
    try:
        yield
    finally:
        _STDIN_KEY.reset(token)


class HolderLost(Exception):
    """The holder is gone (or never answered): its agents' pipes are gone with it."""


class HolderRefused(Exception):
    """The holder answered a request with an error."""

    def __init__(self, kind: str, message: str, errno_: int | None = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.errno = errno_


@attrs.define(eq=False)
class HeldAgent:
    """One agent held by the holder, as this daemon sees it."""

    link: HolderLink
    id: str
    pid: int
    start_time: int | None
    returncode: int | None = None
    exited: trio.Event = attrs.field(factory=trio.Event)
    _out: bytearray = attrs.field(factory=bytearray)
    _out_offset: int = 0  # offset of _out[0]
    _out_eof: bool = False
    _out_ready: trio.Event = attrs.field(factory=trio.Event)
    # Rule 3: acknowledge stdout only as ``acknowledge_out`` says (durable), not as read.
    durable_acks: bool = False
    _out_acked: int = 0
    _out_upto: int = OUT_WINDOW  # the holder relays stdout up to here (Rule 3's window)
    # Rule 3: stderr is copied by a task of its own (`_copy_err`), never the reader;
    # it runs only while there is something to write (most agents write little or
    # nothing to stderr, and an idle task per agent costs the daemon about 2 KiB).
    _err_fd: int | None = None  # ours of the caller's stderr (`_open_err`)
    _err_nonblocking: bool = False  # a pipe of our own opening; else written in a thread
    _err_offset: int = 0  # received up to here
    _err_acked: int = 0  # written (and acknowledged) up to here
    _err_buf: bytearray = attrs.field(factory=bytearray)  # received, not yet written
    _err_eof: bool = False
    _err_copying: bool = False  # `_copy_err` runs
    _err_writing: bool = False  # a thread is writing ``_err_fd``: it closes it after
    _err_closing: bool = False
    _err_kept: bool = False  # closed for a later daemon (`close_err`): nothing acknowledged
    err_done: trio.Event = attrs.field(factory=trio.Event)  # its stderr ended or was lost
    # Called (trio's thread) once the holder reported its exit: the session task's
    # exit watch, as ``agentsd.agent_watch`` watches our own children's pidfds.
    on_exit: Callable[[], object] | None = None
    # Rule 5, for an adopted agent: the last key the holder took for it at attach,
    # and whether the holder could say.
    stdin_key: str | None = None
    keys_known: bool = False

    @property
    def stdout(self) -> AgentStdout:
        return AgentStdout(self)

    @property
    def stdin(self) -> AgentStdin:
        return AgentStdin(self)

    async def wait(self) -> int:
        """The agent's exit status as the holder reaped it (a negative signal
        number for a signal, as ``subprocess``); never returns once the holder is
        lost before that (Rule 2)."""
        await self.exited.wait()
        assert self.returncode is not None
        return self.returncode

    async def signal_group(self, sig: int) -> bool:
        """Signal its process group through the holder, which does so only while
        the agent is unreaped (its group id cannot be reused then). Whether sent."""
        reply = await self.link.request({"op": "signal", "id": self.id, "signal": int(sig)})
        return bool(reply.get("sent"))

    async def close_stdin(self) -> None:
        """End its stdin (the first rung of the close ladder), once what was
        written is written."""
        await self.link.request({"op": "close_stdin", "id": self.id})

    async def forget(self) -> None:
        """Let the holder drop the exited agent (after its exit was proven)."""
        with suppress(HolderLost, HolderRefused):
            await self.link.request({"op": "forget", "id": self.id})

    def acknowledge_out(self, offset: int) -> None:
        """Let the holder drop its stdout before ``offset`` (Rule 3: journaled)."""
        if offset > self._out_acked:
            self._out_acked = offset
            self._ack_out()

    def _took_out(self) -> None:
        """The reader took stdout up to ``_out_offset``: acknowledged as read unless
        acknowledgements wait for the journal, and the window moved on (Rule 3) when
        it moved far enough to be worth a message."""
        if not self.durable_acks and self._out_offset > self._out_acked:
            self._out_acked = self._out_offset
            self._ack_out()
        elif self._out_offset + OUT_WINDOW - self._out_upto >= OUT_WINDOW_STEP:
            self._ack_out()

    def _ack_out(self) -> None:
        """One ``ack`` of stdout: the acknowledged offset and the window's end."""
        self._out_upto = max(self._out_upto, self._out_offset + OUT_WINDOW)
        self.link.send_nowait(
            {
                "op": "ack",
                "id": self.id,
                "stream": "out",
                "offset": self._out_acked,
                "upto": self._out_upto,
            }
        )

    def give_up_exactness(self, offset: int) -> None:
        """One line outgrew what the holder retains (``providers.base.OutputCursor``):
        acknowledge what was read, or the holder and the reader wait for each other.
        A later daemon then cannot read that line again, and cannot take over."""
        if offset > self._out_acked:
            log.warning(
                "agent %s: a line past %d bytes; its output is acknowledged as read until "
                "it ends (a crash meanwhile ends the agent instead of reattaching it)",
                self.id,
                offset - self._out_acked,
            )
            self.acknowledge_out(offset)

    def _lost(self) -> None:
        self._out_eof = True
        self._out_ready.set()
        self.err_done.set()

    def _on_out(self, offset: int, data: bytes) -> None:
        end = self._out_offset + len(self._out)
        if offset != end:
            log.error("holder: agent %s output at %d, expected %d", self.id, offset, end)
            self.link.fail(f"a gap or a duplicate in agent {self.id}'s output")
            return
        self._out += data
        self._out_ready.set()

    def _on_err(self, offset: int, data: bytes) -> None:
        if offset != self._err_offset:
            return
        self._err_offset += len(data)
        if self._err_fd is None:
            if not self._err_kept:  # no log (or lost): acknowledged as read
                self._ack_err(self._err_offset)
        else:
            self._err_buf += data
            if not self._err_copying:
                self._err_copying = True
                self.link.start_soon(self._copy_err)

    def _on_err_eof(self) -> None:
        self._err_eof = True
        if self._err_fd is None or not self._err_buf:
            self.err_done.set()

    def _ack_err(self, offset: int) -> None:
        if offset > self._err_acked:
            self._err_acked = offset
            self.link.send_nowait({"op": "ack", "id": self.id, "stream": "err", "offset": offset})

    def _open_err(self, stderr_fd: int) -> None:
        """Ours of the caller's stderr: a pipe is opened anew (its own open file
        description) non-blocking, so that a stalled log reader stalls nothing but
        this copy; anything else (a file) is a dup, written in a thread."""
        if stat.S_ISFIFO(os.fstat(stderr_fd).st_mode):
            with suppress(OSError):
                self._err_fd = os.open(
                    f"/proc/self/fd/{stderr_fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC
                )
                self._err_nonblocking = True
                return
        self._err_fd = os.dup(stderr_fd)

    async def _copy_err(self) -> None:
        """Rule 3: write what came of its stderr to the caller's pipe, acknowledging
        each byte once written. What waits here is bounded by what the holder
        retains (it relays no byte past its bound unacknowledged); a log reader
        that stalls stalls this copy only, then the agent's stderr writes, never
        the link. Runs from the first byte to write until all is written (or the
        copy is closed or lost)."""
        try:
            await self._write_err()
        finally:
            self._err_copying = False

    async def _write_err(self) -> None:
        while self._err_fd is not None:
            if not self._err_buf:
                if self._err_eof:
                    self.err_done.set()
                return
            fd, chunk = self._err_fd, bytes(self._err_buf[:ERR_CHUNK])
            try:
                if self._err_nonblocking:
                    try:
                        written = os.write(fd, chunk)
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(fd)
                        continue
                else:
                    self._err_writing = True
                    try:
                        written = await trio.to_thread.run_sync(os.write, fd, chunk)
                    finally:
                        self._err_writing = False
                        if self._err_closing:
                            self.close_err()
            except trio.ClosedResourceError:
                return  # closed meanwhile (`close_err`)
            except OSError:  # the log reader is gone: the log is lost, not the agent
                self._err_lost()
                return
            del self._err_buf[:written]
            self._ack_err(self._err_acked + written)

    def _err_lost(self) -> None:
        self.close_err()
        self._err_kept = False
        self._err_buf.clear()
        self._ack_err(self._err_offset)
        if self._err_eof:
            self.err_done.set()

    def close_err(self) -> None:
        """Stop copying its stderr (what is unwritten stays unacknowledged: the
        holder keeps it for a later daemon, as it keeps what arrives from now on).
        A write in a thread closes it after."""
        if self._err_fd is None:
            return
        self._err_kept = True
        if self._err_writing:
            self._err_closing = True
            return
        self._err_closing = False
        if self._err_nonblocking:
            trio.lowlevel.notify_closing(self._err_fd)
        os.close(self._err_fd)
        self._err_fd = None


class AgentStdout(trio.abc.ReceiveStream):
    def __init__(self, agent: HeldAgent) -> None:
        self._agent = agent

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        # One checkpoint a call, always before anything is taken: waiting for bytes
        # is one; with bytes already here, one is made.
        agent = self._agent
        if agent._out or agent._out_eof:
            await trio.lowlevel.checkpoint()
        while not agent._out and not agent._out_eof:
            agent._out_ready = trio.Event()
            await agent._out_ready.wait()
        if not agent._out:
            return b""
        size = len(agent._out) if max_bytes is None else min(max_bytes, len(agent._out))
        data = bytes(agent._out[:size])
        del agent._out[:size]
        agent._out_offset += size
        agent._took_out()
        return data

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


class AgentStdin(trio.abc.SendStream):
    """Each ``send_all`` is one ``write`` message: the holder writes it whole."""

    def __init__(self, agent: HeldAgent) -> None:
        self._agent = agent

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """One ``write``; keyed inside `keyed` (Rule 5), even an empty one."""
        agent = self._agent
        if agent.returncode is not None or agent.link.lost.is_set():
            raise trio.BrokenResourceError("the agent is gone")
        key = _STDIN_KEY.get()
        if key is not None and key.written:
            # Rule 5: its first frame carried it. A later one of the same block (an
            # interrupt's after its confirmation) goes unkeyed: a write keyed since
            # by another task must stay the holder's last key.
            key = None
        header = {"op": "write", "id": agent.id}
        if key is not None:
            header["key"] = key.value
        elif not data:
            return
        try:
            await agent.link.send(header, bytes(data))
        except HolderLost as exc:
            raise trio.BrokenResourceError(f"the agent's holder is gone: {exc}") from None
        note_written()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


@attrs.define(eq=False)
class HolderLink:
    """An attached connection to the holder. `request` and `send` raise `HolderLost`
    once it is gone; ``lost`` is set then."""

    stream: trio.SocketStream
    holder_pid: int
    # The holder clones an agent into the cgroup its spawn names (``agentsd.holder``
    # Rule 1); one of an earlier release does not, and is sent the shim's argv.
    clones_into_cgroups: bool = False
    # The mark its forks carry until they exec (``agentsd.holder`` Rule 1, Rule 2
    # here); None for a holder of an earlier release, which has none.
    mark: str | None = None
    agents: dict[str, HeldAgent] = attrs.field(factory=dict)
    # What the holder held at attach, by id: not ours until adopted (Rule 4).
    found: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    _found_exited: trio.Event = attrs.field(factory=trio.Event)
    lost: trio.Event = attrs.field(factory=trio.Event)
    lost_reason: str = ""
    _replies: dict[int, trio.MemorySendChannel[dict[str, Any]]] = attrs.field(factory=dict)
    _refs: int = 0
    # Every message goes through the one writer task (`_write`), whole: the socket
    # is every agent's, and half a message would garble all that follows.
    _outbox: list[bytes] = attrs.field(factory=list)
    _outbox_wake: trio.Event = attrs.field(factory=trio.Event)
    _queued: int = 0  # messages queued so far
    _written: int = 0  # of which the socket took this many
    _written_wake: trio.Event = attrs.field(factory=trio.Event)
    torn: bool = False  # the writer was cancelled mid-message: nothing more may follow
    closed: bool = False  # `open_holder_link` closed the socket
    _nursery: trio.Nursery | None = None  # the link's tasks (`open_holder_link`)

    async def request(self, header: dict[str, Any], payload: bytes = b"") -> dict[str, Any]:
        """Send a request and return its reply; `HolderRefused` for an error reply."""
        self._refs += 1
        ref = self._refs
        sender, receiver = trio.open_memory_channel[dict[str, Any]](1)
        self._replies[ref] = sender
        try:
            await self.send({**header, "ref": ref}, payload)
            with trio.move_on_after(REQUEST_TIMEOUT_S) as late:
                try:
                    reply = await receiver.receive()
                except trio.EndOfChannel:
                    raise HolderLost(self.lost_reason) from None
            if late.cancelled_caught:
                self.fail(f"no answer to {header['op']} in {REQUEST_TIMEOUT_S:g} s")
                raise HolderLost(self.lost_reason)
        finally:
            self._replies.pop(ref, None)
        if reply["op"] == "error":
            raise HolderRefused(
                reply.get("kind", "error"), reply.get("message", ""), reply.get("errno")
            )
        return reply

    async def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        """Queue one message and wait until the socket took it. Cancelled meanwhile,
        the message still goes out whole (or the holder is lost): the holder gets
        a stdin frame whole or not at all (``agentsd.holder`` Rule 3)."""
        self._check_open()
        seq = self._enqueue(wire.encode(header, payload))
        while self._written < seq:
            self._check_open()
            await self._written_wake.wait()

    async def found_ended(self) -> None:
        """Return once every agent found at attach has exited (its exit reported)."""
        while any(found["returncode"] is None for found in self.found.values()):
            self._found_exited = trio.Event()
            await self._found_exited.wait()

    async def flush(self) -> None:
        """Wait until the socket took every message queued so far (the acks and
        forgets of `send_nowait` included)."""
        seq = self._queued
        while self._written < seq:
            self._check_open()
            await self._written_wake.wait()

    def _check_open(self) -> None:
        if self.lost.is_set() or self.closed:
            raise HolderLost(self.lost_reason or "the link is closed")

    def send_nowait(self, header: dict[str, Any]) -> None:
        """Queue a small message (an ack) for the writer task."""
        if not self.lost.is_set():
            self._enqueue(wire.encode(header))

    def _enqueue(self, data: bytes) -> int:
        self._outbox.append(data)
        self._queued += 1
        self._outbox_wake.set()
        return self._queued

    def fail(self, reason: str) -> None:
        """The holder is lost (Rule 2)."""
        if self.lost.is_set():
            return
        log.error("holder %d lost: %s", self.holder_pid, reason)
        self.lost_reason = reason
        self.lost.set()
        for sender in self._replies.values():
            sender.close()
        for agent in self.agents.values():
            agent._lost()
        self._outbox_wake.set()  # the writer task sees ``lost`` and returns
        self._written_wake.set()  # senders waiting see ``lost``

    async def spawn(
        self,
        agent_id: str,
        argv: list[str],
        cwd: str,
        env: Mapping[str, str],
        stderr_fd: int | None,
        *,
        durable_acks: bool = False,
        cgroup: Path | None = None,
    ) -> HeldAgent:
        """Have the holder start an agent (born in ``cgroup``: only when
        ``clones_into_cgroups``). Raises OSError as Popen would (with the holder's
        errno; EINVAL for what exec cannot be given, a NUL byte in ``argv``, ``env``
        or ``cwd``), `HolderLost`. ``durable_acks``: Rule 3."""
        unfit = _unspawnable(argv, cwd, env)
        if unfit is not None:
            raise OSError(errno.EINVAL, unfit)
        header: dict[str, Any] = {
            "op": "spawn",
            "id": agent_id,
            "argv": argv,
            "cwd": cwd,
            "env": dict(env),
        }
        if cgroup is not None:
            assert self.clones_into_cgroups, "a holder of an earlier release ignores it"
            header["cgroup"] = str(cgroup)
        # Known before the answer: the holder may report its exit right behind it.
        agent = HeldAgent(self, agent_id, 0, None, durable_acks=durable_acks)
        self.agents[agent_id] = agent
        try:
            reply = await self.request(header)
        except HolderRefused as exc:
            del self.agents[agent_id]
            if exc.errno is not None:
                raise OSError(exc.errno, exc.message) from None
            raise OSError(errno.EINVAL, str(exc)) from None
        except BaseException:
            del self.agents[agent_id]
            raise
        agent.pid = reply["pid"]
        agent.start_time = reply.get("start_time")
        if stderr_fd is not None:
            agent._open_err(stderr_fd)
        # Everything it writes, from its first byte.
        await self.request(
            {"op": "resume", "id": agent_id, "stream": "out", "offset": 0, "upto": OUT_WINDOW}
        )
        await self.request({"op": "resume", "id": agent_id, "stream": "err", "offset": 0})
        return agent

    async def adopt(
        self,
        agent_id: str,
        out_offset: int,
        err_offset: int,
        stderr_fd: int | None,
        *,
        durable_acks: bool = False,
    ) -> HeldAgent:
        """Claim an agent the holder held at attach (Rule 4) and resume its output
        at these offsets: the first byte read is the one at ``out_offset``. Raises
        `HolderRefused` (``unknown_agent``; ``offset_gone`` when the holder no
        longer retains that offset, or never had it), `HolderLost`.
        ``durable_acks``: Rule 3."""
        found = self.found.pop(agent_id, None)
        if found is None:
            raise HolderRefused("unknown_agent", f"the holder held no agent {agent_id!r} at attach")
        agent = HeldAgent(
            self, agent_id, found["pid"], found.get("start_time"), durable_acks=durable_acks
        )
        agent._out_offset = out_offset
        agent._out_acked = out_offset
        agent._out_upto = out_offset + OUT_WINDOW
        agent._err_offset = err_offset
        agent._err_acked = err_offset
        if found["returncode"] is not None:
            agent.returncode = found["returncode"]
            agent.exited.set()
        key = found.get("stdin_key", False)
        agent.keys_known = key is None or isinstance(key, str)
        agent.stdin_key = key if isinstance(key, str) else None
        self.agents[agent_id] = agent
        try:
            await self.request(
                {
                    "op": "resume",
                    "id": agent_id,
                    "stream": "out",
                    "offset": out_offset,
                    "upto": agent._out_upto,
                }
            )
            await self.request(
                {"op": "resume", "id": agent_id, "stream": "err", "offset": err_offset}
            )
        except BaseException:
            del self.agents[agent_id]
            self.found[agent_id] = found
            raise
        if stderr_fd is not None:
            agent._open_err(stderr_fd)
        return agent

    def start_soon(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` as a task of the link (an agent's stderr copy)."""
        assert self._nursery is not None, "a link's tasks run in open_holder_link"
        self._nursery.start_soon(fn)

    def forget_unclaimed(self) -> None:
        """Give up what the holder held at attach and was not adopted (Rule 4):
        forgotten now if it exited, else once its exit is reported."""
        for agent_id, found in self.found.items():
            if found["returncode"] is not None:
                self.send_nowait({"op": "forget", "id": agent_id})
        self.found.clear()

    async def release(self, agent: HeldAgent) -> None:
        """Forget ``agent`` here and in the holder (it exited and was proven gone)."""
        with trio.move_on_after(ERR_DRAIN_S):
            await agent.err_done.wait()
        agent.close_err()
        self.agents.pop(agent.id, None)
        if agent.returncode is not None:
            await agent.forget()

    async def _read(self, decoder: wire.Decoder, early: list[tuple[dict[str, Any], bytes]]) -> None:
        for header, payload in early:
            self._dispatch(header, payload)
        while True:
            try:
                data = await self.stream.receive_some(LINK_READ_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self.fail(f"reading from the holder failed: {exc}")
                return
            if not data:
                self.fail("the holder closed its end (it died, or another daemon attached)")
                return
            try:
                messages = decoder.feed(data)
            except wire.ProtocolError as exc:
                self.fail(f"the holder sent something unreadable: {exc}")
                return
            for header, payload in messages:
                self._dispatch(header, payload)

    def _dispatch(self, header: dict[str, Any], payload: bytes) -> None:
        ref = header.get("ref")
        if ref is not None:
            sender = self._replies.get(ref)
            if sender is not None:
                sender.send_nowait(header)
            return
        op = header["op"]
        agent = self.agents.get(header.get("id", ""))
        if op == "error":
            log.warning("holder: %s: %s", header.get("kind"), header.get("message"))
        elif agent is None:
            agent_id = header.get("id")
            if op == "exited" and agent_id in self.found:
                self.found[agent_id] = {**self.found[agent_id], "returncode": header["returncode"]}
                self._found_exited.set()
            elif op == "exited":  # Rule 4
                self.send_nowait({"op": "forget", "id": agent_id})
        elif op == "out" and header.get("stream") == "out":
            agent._on_out(header["offset"], payload)
        elif op == "out":
            agent._on_err(header["offset"], payload)
        elif op == "eof" and header.get("stream") == "out":
            agent._out_eof = True
            agent._out_ready.set()
        elif op == "eof":
            agent._on_err_eof()
        elif op == "exited":
            agent.returncode = header["returncode"]
            agent.exited.set()
            if agent.on_exit is not None:
                agent.on_exit()

    async def _write(self) -> None:
        """The one writer of the socket: whole messages, in the order queued."""
        while True:
            await self._outbox_wake.wait()
            self._outbox_wake = trio.Event()
            if self.lost.is_set():
                return
            batch, self._outbox = b"".join(self._outbox), []
            upto = self._queued
            try:
                await self.stream.send_all(batch)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self.fail(f"sending to the holder failed: {exc}")
                return
            except trio.Cancelled:
                self.torn = True  # the link is closing; a detach may not follow
                raise
            self._written = upto
            self._written_wake.set()
            self._written_wake = trio.Event()


def _unspawnable(argv: list[str], cwd: str, env: Mapping[str, str]) -> str | None:
    """Why exec cannot be given these (a NUL byte; a name with ``=``), or None."""
    if any("\0" in arg for arg in argv):
        return "a NUL byte in the agent's argv"
    if "\0" in cwd:
        return "a NUL byte in the agent's cwd"
    if any("\0" in key or "\0" in value for key, value in env.items()):
        return "a NUL byte in the agent's environment"
    if any("=" in key or not key for key in env):
        return "an environment variable name that is empty or holds '='"
    return None


def socket_path(state_dir: Path) -> Path:
    return state_dir / SOCKET_NAME


_epoch_lock = threading.Lock()  # the links of one daemon, in threads


def next_epoch(state_dir: Path) -> int:
    """The next hello epoch (Rule 1): above the last one stored and at least the
    clock's, stored durably (written, fsynced, renamed into place) before it is
    used. Blocking: run it in a thread."""
    path = state_dir / EPOCH_NAME
    with _epoch_lock:
        try:
            last = int(path.read_text().strip() or 0)
        except FileNotFoundError:
            last = 0
        except (OSError, ValueError) as exc:
            log.warning("holder epoch file %s unreadable (%s): the clock's is used", path, exc)
            last = 0
        epoch = max(time.time_ns(), last + 1)
        temporary = path.with_name(f".{EPOCH_NAME}.{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, f"{epoch}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        directory = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    return epoch


async def _connect(path: Path) -> trio.SocketStream | None:
    """A connection to a listening holder, or None when none listens there."""
    try:
        return await trio.open_unix_socket(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        return None


def _start_holder(state_dir: Path, scope: HolderScope | None) -> int:
    """Bind a fresh listening socket (0600) and start a holder on it, detached (it
    forks once more: never our child), in ``scope`` when given (`agentsd.holder_scope`);
    its pid. Blocking: run it in a thread. Raises `HolderLost` when it does not
    report its pid in time (it is killed), or cannot be placed in its scope."""
    if scope is None:
        return _start_holder_once(state_dir, None)
    try:
        scope.clear()
    except OSError as exc:
        raise HolderLost(f"the holder's scope {scope.unit} cannot be made: {exc}") from None
    deadline = time.monotonic() + START_RETRY_S
    while True:
        try:
            return _start_holder_once(state_dir, scope)
        except _NotStarted:
            # The scope of a holder that died may still be winding down (Rule 1 of
            # agentsd.holder_scope): systemd refuses the name until it is gone.
            if time.monotonic() >= deadline:
                raise
            time.sleep(START_RETRY_PAUSE_S)


class _NotStarted(HolderLost):
    """The holder's start ran but gave no pid (under systemd: worth another try)."""


def _start_holder_once(state_dir: Path, scope: HolderScope | None) -> int:
    path = socket_path(state_dir)
    with suppress(FileNotFoundError):
        path.unlink()  # a dead holder's: nothing listened there
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    argv = [sys.executable, "-I", str(HOLDER_SCRIPT), "--detach"]
    if scope is not None:
        argv = [*scope.command(), *argv]
    try:
        old = os.umask(0o077)
        try:
            listener.bind(str(path))
        finally:
            os.umask(old)
        listener.listen(64)
        fd = listener.fileno()
        logs = state_dir / "logs"
        logs.mkdir(mode=0o700, exist_ok=True)
        with open(logs / LOG_NAME, "ab") as log_file:
            try:
                process = subprocess.Popen(
                    [*argv, "--listen-fd", str(fd)],
                    env={**os.environ, HOLDER_MARK_ENV: new_mark()},
                    pass_fds=[fd],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log_file,
                    start_new_session=True,  # outlives this daemon and its terminal
                    close_fds=True,
                )
            except OSError as exc:  # no systemd-run
                raise HolderLost(f"the holder did not start: {argv[0]}: {exc}") from None
    finally:
        listener.close()
    assert process.stdout is not None
    try:
        line = _read_line(process.stdout.fileno(), CONNECT_TIMEOUT_S)
        process.wait(CONNECT_TIMEOUT_S)  # the first fork's parent, gone at once
    except (subprocess.TimeoutExpired, ValueError) as exc:
        with suppress(ProcessLookupError):
            process.kill()
        process.wait()
        where = "" if scope is None else f" in its scope {scope.unit} (see {LOG_NAME})"
        raise _NotStarted(f"the holder did not start{where}: {exc}") from None
    finally:
        process.stdout.close()
    pid = int(line)
    if scope is not None:
        try:
            scope.place(pid)
        except OSError as exc:
            _end_started(pid)
            raise HolderLost(f"the holder could not be placed in {scope.path}: {exc}") from None
    return pid


def new_mark() -> str:
    """A holder's mark (Rule 2): 32 hex digits, its own."""
    return secrets.token_hex(16)


def is_mark(value: object) -> TypeGuard[str]:
    """Whether a holder's ``welcome`` reports a mark as `new_mark` makes them."""
    return (
        isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)
    )


def _read_line(fd: int, timeout_s: float) -> bytes:
    """One line from ``fd`` within ``timeout_s``; ValueError if none came."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise ValueError(f"no pid within {timeout_s:g} s")
        chunk = os.read(fd, 64)
        if not chunk:
            raise ValueError("it exited without its pid")
        data += chunk
    if not data.strip().isdigit():
        raise ValueError(f"not a pid: {data[:64]!r}")
    return data


@asynccontextmanager
async def open_holder_link(
    state_dir: Path, scope: HolderScope | None = None
) -> AsyncIterator[HolderLink]:
    """Attach to the state directory's holder, starting one (in ``scope`` when
    given) if none listens (Rule 1); yield the link. Raises `HolderLost` when no holder can be attached.
    On exit the link detaches: the holder keeps running what it holds."""
    path = socket_path(state_dir)
    started: int | None = None  # the pid of the holder we started
    stream = await _connect(path)
    if stream is None:
        started = await trio.to_thread.run_sync(_start_holder, state_dir, scope)
        with trio.move_on_after(CONNECT_TIMEOUT_S):
            stream = await _connect(path)
        if stream is None:
            raise HolderLost(f"the holder started at {path} does not accept")
    untrusted = _untrusted_holder(path, stream)
    if untrusted is not None:
        await stream.aclose()
        raise HolderLost(f"the holder at {path} is not to be trusted: {untrusted}")
    decoder = wire.Decoder()
    epoch = await trio.to_thread.run_sync(next_epoch, state_dir)
    hello = {"op": "hello", "protocol": wire.PROTOCOL, "epoch": epoch, "keys": True, "ref": 0}
    welcome: dict[str, Any] | None = None
    early: list[tuple[dict[str, Any], bytes]] = []  # what came with it, in order
    with trio.move_on_after(CONNECT_TIMEOUT_S):
        try:
            await stream.send_all(wire.encode(hello))
            while welcome is None:
                data = await stream.receive_some(wire.READ_BYTES)
                if not data:
                    break
                for message in decoder.feed(data):
                    if welcome is None and message[0].get("ref") == 0:
                        welcome = message[0]
                    elif welcome is not None:
                        early.append(message)
        except (trio.BrokenResourceError, OSError, wire.ProtocolError) as exc:
            log.warning("attaching the holder at %s failed: %s", path, exc)  # refused
    if welcome is None or welcome["op"] != "welcome":
        await stream.aclose()
        if started is not None:
            # Ours, and it holds nothing yet: a holder that cannot serve is ended, not
            # left listening for the next daemon to meet.
            _end_started(started)
        raise HolderLost(f"the holder at {path} did not attach us: {welcome}")
    link = HolderLink(
        stream=stream,
        holder_pid=welcome["holder_pid"],
        clones_into_cgroups=welcome.get("cgroups") is True,
        mark=welcome.get("mark") if is_mark(welcome.get("mark")) else None,
    )
    link.found = {a["id"]: a for a in welcome["agents"]}
    try:
        async with trio.open_nursery() as nursery:
            link._nursery = nursery
            nursery.start_soon(link._read, decoder, early)
            nursery.start_soon(link._write)
            nursery.start_soon(_watch_holder, link)
            try:
                yield link
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if not link.lost.is_set() and not link.torn:
                with trio.move_on_after(CONNECT_TIMEOUT_S), suppress(HolderLost, HolderRefused):
                    await _detach(link)
            for agent in link.agents.values():
                agent.close_err()
            await stream.aclose()
            link.closed = True
            link._written_wake.set()  # a send still waiting raises HolderLost


def _untrusted_holder(path: Path, stream: trio.SocketStream) -> str | None:
    """Why what listens at ``path`` may not be our holder (Rule 5), or None: the
    peer must have our uid, and the socket be ours, 0600, in a directory that only
    we can write (so no one else can have put it there or replaced it). A process
    of the same uid (an agent included) could still listen there in place of the
    holder: same-uid isolation is the agents' cgroup and the holder's own Rule 5,
    not this check."""
    uid = os.getuid()
    raw = stream.socket.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    _pid, peer_uid, _gid = _UCRED.unpack(raw)
    if peer_uid != uid:
        return f"its peer has uid {peer_uid}"
    try:
        sock_stat, dir_stat = os.lstat(path), os.stat(path.parent)
    except OSError as exc:
        return f"cannot stat it: {exc}"
    if not stat.S_ISSOCK(sock_stat.st_mode) or sock_stat.st_uid != uid:
        return "the socket file is not ours"
    if stat.S_IMODE(sock_stat.st_mode) & 0o077:
        return f"the socket file has mode {stat.S_IMODE(sock_stat.st_mode):o}"
    if dir_stat.st_uid != uid or stat.S_IMODE(dir_stat.st_mode) & 0o022:
        return f"others can write {path.parent}"
    return None


_UCRED = struct.Struct("3i")


def _end_started(pid: int) -> None:
    """Kill a holder we started that never attached us. Not our child (it forked
    once more): its new parent reaps it. Only while it still runs our holder's
    program, so a reused pid is never signalled."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return
        if str(HOLDER_SCRIPT).encode() in cmdline.split(b"\0"):
            with suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    finally:
        os.close(pidfd)


async def _watch_holder(link: HolderLink) -> None:
    """The holder's death, through a pidfd (it is not our child), ends the link
    even should its socket somehow stay open."""
    try:
        pidfd = os.pidfd_open(link.holder_pid)
    except ProcessLookupError:
        link.fail("the holder is gone")
        return
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)
    link.fail("the holder exited")


async def _detach(link: HolderLink) -> None:
    await link.stream.send_all(wire.encode({"op": "detach", "ref": -1}))


@attrs.define(eq=False)
class HolderKeeper:
    """The supervisor's current link, opened on first need and again after a holder
    was lost (Rule 1); `open_holder_keeper` owns the links' tasks."""

    state_dir: Path
    _nursery: trio.Nursery
    scope: HolderScope | None = None  # where holders are started (agentsd.holder_scope)
    _link: HolderLink | None = None
    _lock: trio.Lock = attrs.field(factory=trio.Lock)
    # While recovery may still adopt what the first link found (Rule 4).
    claiming: bool = False

    async def link(self) -> HolderLink:
        """A live link; raises `HolderLost` when no holder can be attached."""
        async with self._lock:
            if self._link is None or self._link.lost.is_set():
                try:
                    self._link = await self._nursery.start(self._hold)
                except OSError as exc:
                    raise HolderLost(f"cannot start or reach the holder: {exc}") from None
                if not self.claiming:
                    self._link.forget_unclaimed()
            return self._link

    def current(self) -> HolderLink | None:
        """The live link, if one is attached (no holder is started for it)."""
        if self._link is None or self._link.lost.is_set():
            return None
        return self._link

    def claimed(self) -> None:
        """Recovery adopted what it takes over: the rest found at attach is given
        up (Rule 4), and every later link gives up what it finds at once."""
        self.claiming = False
        if self._link is not None and not self._link.lost.is_set():
            self._link.forget_unclaimed()

    async def _hold(self, task_status: trio.TaskStatus[HolderLink]) -> None:
        async with open_holder_link(self.state_dir, self.scope) as link:
            task_status.started(link)
            await link.lost.wait()


@asynccontextmanager
async def open_holder_keeper(
    state_dir: Path, *, claim: bool = False, scope: HolderScope | None = None
) -> AsyncIterator[HolderKeeper]:
    """Yield a `HolderKeeper`; on exit its link detaches (the holder keeps what it
    holds). A holder already listening is attached at once, so that it forgets what
    a previous daemon left exited there (Rule 4) even if nothing is spawned; with
    ``claim``, only once `HolderKeeper.claimed` says recovery adopted what it takes
    over. Holders it starts are started in ``scope`` when given."""
    async with trio.open_nursery() as nursery:
        keeper = HolderKeeper(state_dir, nursery, scope=scope, claiming=claim)
        if socket_path(state_dir).exists():
            try:
                await keeper.link()
            except HolderLost as exc:
                log.warning("could not attach the holder left running: %s", exc)
        try:
            yield keeper
        finally:
            nursery.cancel_scope.cancel()
