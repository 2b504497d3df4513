"""The holder: keeps agents and their pipes alive while no daemon runs (issue 19).

Standard library only, run by path (``python -I .../holder.py --listen-fd N``) so
that a daemon upgraded in place never changes the code of a holder already running.
One holder serves every session of a state directory; the daemon that starts it
binds the listening socket (0600, in the state directory) and hands it over as
``--listen-fd``, so it accepts from its first instruction. With ``--detach`` it
forks once more and reports its pid: it is never the daemon's child, so no daemon
(or test) is left with its zombie, and it outlives any daemon.

Rule 1 (the agents are its children): it spawns each agent on the daemon's request
(own session and process group, environment and argv exactly as given: the daemon
adds the spawn token) and holds the agent's three pipes. A spawn that names a
``cgroup`` (a directory of the cgroup v2 hierarchy, made by the daemon) is born in
it: ``clone3`` with ``CLONE_INTO_CGROUP | CLONE_VFORK`` (`Cloner`), so nothing of the
agent runs outside it and no process is moved (a move waits for the kernel's RCU
grace period, milliseconds). Where the kernel or a seccomp policy refuses clone3,
the holder says so once in its log and joins the cgroup as the daemon's shim does
(``agentsd.child`` Rule 8) for the rest of its life. Its ``welcome`` says
``cgroups: true``, which a holder of an earlier release does not: the daemon then
sends the shim's argv instead. It is a
child subreaper (PR_SET_CHILD_SUBREAPER), so whatever an agent leaves behind is
reparented to it, not to init, and reaped by it. An agent's stdin is never closed
while the holder lives, unless the daemon asks (``close_stdin``) or the agent exits.
Its mark: the daemon starts it with ``AGENTSD_HOLDER_MARK`` in its environment (a
value of its own per holder), which its ``welcome`` reports (``mark``; none when it
was started without one, as by an earlier release). Each fork it makes for an agent
(the clone, or ``subprocess``'s) carries the holder's environment, so the mark, until
it execs the agent, whose environment is the spawn's and never has it (the holder
drops the variable from a spawn's environment): so a daemon that lost the holder
knows, from /proc alone, which processes may still exec an agent, and ends what
carries the spawn token only once none does (``agentsd.held_child``).

Rule 2 (exact output): stdout and stderr bytes are numbered from 0 per agent and
stream. They are relayed to the attached daemon as ``out`` messages with their
offset and retained until the daemon acknowledges an offset (``ack``); a daemon that
reattaches resumes a stream at the offset it made durable (``resume``): nothing is
skipped, nothing sent twice after that offset. At most ``--retain-bytes`` are
retained per agent and stream; at the bound the holder stops reading that pipe and
the agent blocks on its write (the pipe's own 64 KiB to 1 MiB come on top).

The relay batches what comes fast and delays nothing else: output goes out at once
unless the stream was relayed less than ``RELAY_QUIET_S`` ago; then its pipe is left
alone until that quiet period ends, and what the agent wrote meanwhile goes out in
one message (a flooding agent costs the holder and the daemon a wakeup and a message
per period, not per line it writes; a reply that comes after a pause is not
delayed). Only a message smaller than ``BULK_BYTES`` (a default pipe's capacity)
starts a quiet period: after a full pipe's worth the agent writes in bulk, each
wakeup already carries that much, and waiting would cap its output at a pipe per
period (about 25 MB/s) where the daemon takes ten times that. The quiet period
bounds messages, not bytes: an agent writing in bulk is relayed as fast as the
daemon reads, as a pipe straight to the daemon would be. While a daemon reads a
stream, its pipe is read again only once what was read of it went out, so a daemon
that falls behind leaves the output in the pipe. Output is framed only once the
daemon's socket took everything before it, at most ``FRAME_BYTES`` a message, each
time starting with another of the streams due (no stream's bulk keeps the others
waiting). A daemon may also bound what it is sent ahead of what it consumed: a
``resume`` with ``upto`` relays nothing at or past that offset until an ``ack``
carries a higher ``upto`` (an ``ack`` may carry ``upto`` alone, its ``offset``
unchanged). Both fields are
optional: a daemon that sends no ``upto`` is relayed everything as it comes, and an
older holder ignores them, so daemons and holders of either kind attach each other
(the protocol is unchanged).

Rule 3 (whole frames in): a ``write`` message is read whole before any byte of it
is written to the agent's stdin, and once read it is written whole, whatever
happens to the daemon meanwhile: the agent never sees half a frame. A ``write`` may
carry a ``key`` (a string of at most ``MAX_KEY`` characters; its payload may be
empty): the holder remembers the last key it took per agent and reports it
(``stdin_key``, None before the first) with the agent at ``welcome``, so that a
daemon taking over knows which of the answers its predecessor committed reached the
agent (``agentsd.reattach`` Rule 2). Only a daemon that says ``keys`` in its
``hello`` keys what it writes; once a daemon that does not was attached, or a key
that is not such a string was written, an agent's key proves nothing and is no
longer reported.

Rule 4 (one daemon at a time, fenced): a connection becomes the attached daemon by
``hello`` with an ``epoch`` higher than every epoch accepted before; the previous
daemon's connection is closed at once, and a hello with a lower or equal epoch is
refused (``fenced``). Only the attached daemon's requests act. ``detach`` ends the
attachment cleanly (a planned restart); end of file from the daemon (a crash) does
the same. Output meanwhile stays retained within Rule 2's bound.

Rule 5 (who may connect): the peer must have the holder's uid (SO_PEERCRED) and must
not be one of its agents: not a descendant of the holder (the subreaper makes that
inescapable by reparenting), not carrying a spawn token in its environment, not in
an agent's cgroup. The peer is the process that connect()ed, pinned by a pidfd
(SO_PEERPIDFD, Linux 6.5) so that a pid reused meanwhile is not mistaken for it, and
every check fails closed: a peer already gone (an agent's child that connected and
exited, leaving the socket to the agent), or a process of the chain whose /proc
entries cannot be read, is refused. Without SO_PEERPIDFD the pid of connect() time
is checked: a peer gone is refused, but its pid reused at once by an unrelated
process of the user between the connect() and the accept would pass. Residual risk: an agent that gets an unrelated process of the
user to connect for it (a terminal multiplexer's server it can talk to, ``systemd-run
--user``) passes these checks, as it could already talk to the daemon's socket then.

Rule 6 (exit): the holder exits when it holds no agent and no daemon is attached,
after a daemon attached once (or ``--idle-exit-s`` after it started when none ever
did). While no daemon is attached it checks every ``ORPHAN_CHECK_S`` that its
socket's path still leads to its socket (the same inode): a state directory deleted
or moved, or the path taken by another socket, means no daemon can ever reach it
again, so it ends its agents (SIGKILL to each unreaped agent's group, then reaps
them and what they left, as a subreaper) and exits, rather than hold them unseen
for ever. It ignores SIGHUP and SIGINT (caught, so that its agents do not inherit
them ignored); SIGTERM's default is kept: a SIGTERM or SIGKILL to the holder is its
death, which the daemon detects (pidfd) and answers by ending its agents
(``agentsd.holder_link``, ``agentsd.held_child``).

Wire: each message is ``>II`` (header length, payload length), a JSON object header
(``op`` names it; a request may carry ``ref``, echoed by its reply), then the
payload bytes (``write`` and ``out`` only).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import gc
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from typing import Any, TypeGuard

PROTOCOL = 1
HEADER = struct.Struct(">II")  # header length, payload length
MAX_HEADER = 1 << 20  # a spawn's argv and environment fit many times over
MAX_PAYLOAD = 16 << 20  # one stdin frame; the daemon's own frame bound is lower
DEFAULT_RETAIN_BYTES = 1 << 20  # per agent and stream (Rule 2)
READ_BYTES = 64 << 10  # one read from an agent's pipe
SEND_HIGH_WATER = 256 << 10  # frame no more output at once than this (Rule 2's relay)
FRAME_BYTES = 256 << 10  # the most output one ``out`` message carries
RELAY_QUIET_S = 0.002  # Rule 2's relay: after a message under BULK_BYTES, none sooner
BULK_BYTES = 64 << 10  # Rule 2's relay: a message this big starts no quiet period
MAX_STDIN_QUEUE = 64 << 20  # unwritten stdin per agent before the daemon is refused
MAX_KEY = 64  # Rule 3: a key's characters (the daemon's are a journal seq)
DEFAULT_IDLE_EXIT_S = 30.0
ORPHAN_CHECK_S = 5.0  # Rule 6: how often a holder no daemon is attached to checks its path
ORPHAN_END_S = 5.0  # Rule 6: how long ending its agents may take before it exits
MAX_ANCESTORS = 64
SPAWN_TOKEN_ENV = "AGENTSD_SPAWN_TOKEN"  # agentsd.procfs.SPAWN_TOKEN_ENV
HOLDER_MARK_ENV = "AGENTSD_HOLDER_MARK"  # agentsd.procfs.HOLDER_MARK_ENV (Rule 1)
CGROUP_PREFIX = "agent-"  # agentsd.cgroup.CGROUP_PREFIX
PR_SET_CHILD_SUBREAPER = 36
SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5; Python 3.11 has no name
AGENT_OPS = frozenset({"write", "close_stdin", "resume", "ack", "signal", "forget"})
# Rule 1's clone (<linux/sched.h>; clone3 has the same number on every architecture).
SYS_CLONE3 = 435
CLONE_VFORK = 0x4000
CLONE_INTO_CGROUP = 0x200000000
CLONE_ARGS = struct.Struct("=11Q")  # struct clone_args up to its cgroup field
CLONE_REFUSED = frozenset({errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG})
CLONE_MAX_RSS = 64 << 20  # past this, a clone copies more page tables than the shim costs
JOIN_SCRIPT = 'echo 0 >"$0" && exec "$@"'  # agentsd.child.JOIN_SCRIPT


def encode(header: dict[str, Any], payload: bytes | bytearray = b"") -> bytes:
    """One message on the wire."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return HEADER.pack(len(head), len(payload)) + head + payload


class ProtocolError(Exception):
    """The peer sent something that is not a message."""


class Decoder:
    """Messages out of a byte stream, in order."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes]]:
        self._buf += data
        messages = []
        while len(self._buf) >= HEADER.size:
            head_len, payload_len = HEADER.unpack_from(self._buf)
            if head_len > MAX_HEADER or payload_len > MAX_PAYLOAD:
                raise ProtocolError(f"message too large ({head_len} + {payload_len} bytes)")
            end = HEADER.size + head_len + payload_len
            if len(self._buf) < end:
                break
            try:
                header = json.loads(bytes(self._buf[HEADER.size : HEADER.size + head_len]))
            except ValueError as exc:
                raise ProtocolError(f"bad header: {exc}") from None
            if not isinstance(header, dict) or not isinstance(header.get("op"), str):
                raise ProtocolError("a header is an object with an op")
            messages.append((header, bytes(self._buf[HEADER.size + head_len : end])))
            del self._buf[:end]
        return messages


class Stream:
    """An agent's stdout or stderr: what was read, from ``base`` on (Rule 2)."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd
        self.buf = bytearray()
        self.base = 0  # offset of buf[0]
        self.sent: int | None = None  # relayed up to here; None: not resumed
        self.upto: int | None = None  # relay nothing at or past this; None: no window
        self.quiet_until = 0.0  # relayed lately: relay again no sooner (monotonic)
        self.eof_sent = False

    def waiting(self) -> bool:
        """Whether output read from the pipe waits to be relayed: then the pipe is
        not read further (Rule 2's relay)."""
        return self.sent is not None and self.sent < self.end

    @property
    def end(self) -> int:
        return self.base + len(self.buf)

    def ack(self, offset: int) -> None:
        if offset > self.base:
            drop = min(offset, self.end) - self.base
            del self.buf[:drop]
            self.base += drop


class Agent:
    """A spawned agent and our ends of its pipes (owned here, not by ``process``)."""

    def __init__(
        self,
        agent_id: str,
        pid: int,
        process: subprocess.Popen[bytes] | None,
        stdin: int,
        out: int,
        err: int,
    ) -> None:
        self.id = agent_id
        self.process = process  # kept until forgotten: a dropped Popen polls its pid
        self.pid = pid
        self.start_time: int | None = None  # /proc/PID/stat field 22, read at the spawn
        self.stdin_fd: int | None = stdin
        self.stdin = bytearray()
        self.stdin_close = False  # close once the queue is written
        self.stdin_key: str | None = None  # Rule 3: the last key written
        self.keys_known = True  # Rule 3: no daemon that does not key wrote to it
        self.streams = {"out": Stream(out), "err": Stream(err)}
        self.returncode: int | None = None
        self.exit_sent = False
        for fd in (self.stdin_fd, *(s.fd for s in self.streams.values())):
            assert fd is not None
            os.set_blocking(fd, False)

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pid": self.pid,
            "start_time": self.start_time,
            "returncode": self.returncode,
            **({"stdin_key": self.stdin_key} if self.keys_known else {}),
            **{
                f"{name}_{key}": value
                for name, s in self.streams.items()
                for key, value in (("base", s.base), ("end", s.end), ("eof", s.fd is None))
            },
        }


class Cloner:
    """Rule 1's spawn into a cgroup: ``clone3`` with ``CLONE_INTO_CGROUP |
    CLONE_VFORK`` from the holder itself, a single-threaded process (a raw clone of a
    threaded one could leave the child a lock another thread held). The holder is
    suspended until the child exec'd or exited (``CLONE_VFORK``), so it may lend the
    child its own stdio and cwd meanwhile: the child's pipes are put on 0, 1 and 2
    and its cwd entered before the clone and the holder's own put back after, and
    every other fd of the holder is close-on-exec (`main`). Between clone and exec
    the child makes C calls only (``setsid``, ``signal`` for SIGPIPE and SIGXFSZ as
    ``subprocess`` resets them, ``execve`` along ``PATH``), holding the GIL
    (``ctypes.PyDLL``), and reports a failure through a close-on-exec pipe."""

    def __init__(self) -> None:
        libc = ctypes.PyDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._syscall.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_size_t]
        self._setsid = libc.setsid
        self._setsid.restype = ctypes.c_int
        self._signal = libc.signal
        self._signal.restype = ctypes.c_void_p
        self._signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        self._execve = libc.execve
        self._execve.restype = ctypes.c_int
        strings = ctypes.POINTER(ctypes.c_char_p)
        self._execve.argtypes = [ctypes.c_char_p, strings, strings]

    def spawn(
        self, argv: list[str], cwd: str, env: dict[str, str], cgroup: str, stdio: tuple[int, ...]
    ) -> int:
        """The pid of ``argv`` born in ``cgroup`` with ``stdio`` as its 0, 1 and 2.
        Raises OSError as ``subprocess.Popen`` would (the errno of the clone, or of
        the exec, which is then reaped here)."""
        execs = [os.fsencode(p) for p in _exec_candidates(argv[0], cwd, env)]
        args = _c_strings([os.fsencode(a) for a in argv])
        envp = _c_strings([os.fsencode(f"{k}={v}") for k, v in env.items()])
        target = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            report, report_w = os.pipe()
            try:
                try:
                    pid, err = self._clone(execs, args, envp, cwd, stdio, target, report_w)
                finally:
                    os.close(report_w)
                # The child exec'd (end of file) or wrote why not before its exit.
                failed = os.read(report, 4) if pid > 0 else b""
            finally:
                os.close(report)
        finally:
            os.close(target)
        if pid < 0:
            raise OSError(err, os.strerror(err))
        if failed:
            os.waitpid(pid, 0)
            (err,) = struct.unpack("=i", failed)
            raise OSError(err, os.strerror(err), argv[0])
        return pid

    def _clone(
        self,
        execs: list[bytes],
        args: Any,
        envp: Any,
        cwd: str,
        stdio: tuple[int, ...],
        target: int,
        report: int,
    ) -> tuple[int, int]:
        """The clone (its pid, or -1, and errno), the holder's stdio and cwd lent to
        the child for it and given back after, whatever failed."""
        here = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        saved: list[int] = []
        collecting = gc.isenabled()
        try:
            for fd in (0, 1, 2):
                saved.append(os.dup(fd))
            os.chdir(cwd)
            for fd, theirs in enumerate(stdio):
                os.dup2(theirs, fd)  # inheritable: the child's stdio
            flags = CLONE_INTO_CGROUP | CLONE_VFORK
            clone_args = CLONE_ARGS.pack(flags, 0, 0, 0, signal.SIGCHLD, 0, 0, 0, 0, 0, target)
            gc.disable()  # nothing may run between the clone and the exec but C calls
            pid = int(self._syscall(SYS_CLONE3, clone_args, CLONE_ARGS.size))
            if pid == 0:
                try:
                    self._exec(execs, args, envp, report)
                finally:
                    os._exit(127)
            return pid, ctypes.get_errno()
        finally:
            if collecting:
                gc.enable()
            for fd, ours in enumerate(saved):
                os.dup2(ours, fd)
                os.close(ours)
            os.fchdir(here)
            os.close(here)

    def _exec(self, execs: list[bytes], args: Any, envp: Any, report: int) -> None:
        """The child, between clone and exec: reports why it could not exec."""
        try:
            if self._setsid() < 0:
                os.write(report, struct.pack("=i", ctypes.get_errno()))
                return
            self._signal(signal.SIGPIPE, 0)  # SIG_DFL
            self._signal(signal.SIGXFSZ, 0)
            first, last = 0, errno.ENOENT
            for exe in execs:
                self._execve(exe, args, envp)
                last = ctypes.get_errno()
                if not first and last not in (errno.ENOENT, errno.ENOTDIR):
                    first = last
            os.write(report, struct.pack("=i", first or last))
        except BaseException:
            os.write(report, struct.pack("=i", errno.EIO))


def _frozen(cgroup: str) -> bool:
    """Whether ``cgroup`` (or an ancestor) is frozen now (``cgroup.events``)."""
    try:
        with open(os.path.join(cgroup, "cgroup.events")) as f:
            return "frozen 1" in f.read().splitlines()
    except OSError:
        return False  # the spawn then says what is wrong with it


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _exec_candidates(program: str, cwd: str, env: dict[str, str]) -> list[str]:
    """Where ``execve`` looks for ``program``, as ``subprocess.Popen`` does: itself
    when it has a slash (relative to ``cwd``, entered first), else along the
    environment's ``PATH``."""
    if os.sep in program:
        return [program]
    return [os.path.join(d, program) for d in os.get_exec_path(env)]


def _c_strings(items: list[bytes]) -> Any:
    """A NULL-terminated ``char *[]``."""
    return (ctypes.c_char_p * (len(items) + 1))(*items)


class Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = Decoder()
        self.outbuf = bytearray()
        self.closing = False  # close once outbuf is sent


class Holder:
    def __init__(self, listener: socket.socket, retain_bytes: int, idle_exit_s: float) -> None:
        self.listener = listener
        # Rule 6: where a daemon reaches this holder (an unnamed socket: not checked).
        name = listener.getsockname()
        self.path = name if isinstance(name, str) else ""
        self.inode = _inode(self.path) if self.path else None
        self.retain = retain_bytes
        self.idle_exit_s = idle_exit_s
        self.selector = selectors.DefaultSelector()
        self.agents: dict[str, Agent] = {}
        self.by_pid: dict[int, Agent] = {}
        self.daemon: Connection | None = None
        self.epoch = 0
        self.ever_attached = False
        self.keyed = False  # Rule 3: the attached daemon keys what it writes
        self.relay_turn = 0  # Rule 2's relay: which due stream a pump frames first
        self.cloner: Cloner | None = Cloner()  # Rule 1; None once clone3 was refused
        # Rule 1: the mark this holder was started with, which its forks carry until
        # they exec (None: started without one).
        self.mark = os.environ.get(HOLDER_MARK_ENV)
        self.started = time.monotonic()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        listener.setblocking(False)
        self.selector.register(listener, selectors.EVENT_READ, ("accept", None))
        self.selector.register(self.wake_r, selectors.EVENT_READ, ("sigchld", None))
        self.interest: dict[int, int] = {}
        self.wake_at: float | None = None  # when a stream's quiet period ends

    # -- selector bookkeeping ------------------------------------------------------

    def _want(self, fd: int, events: int, data: tuple[str, Any]) -> None:
        old = self.interest.get(fd, 0)
        if events == old:
            return
        if events == 0:
            self.selector.unregister(fd)
            del self.interest[fd]
        elif old == 0:
            self.selector.register(fd, events, data)
            self.interest[fd] = events
        else:
            self.selector.modify(fd, events, data)
            self.interest[fd] = events

    def _refresh(self) -> None:
        """Interest in every fd, from the state: send while the daemon has bytes due;
        read a pipe while under the bound, and while a daemon reads it only once
        what was read of it is relayed and its quiet period is over (Rule 2's
        relay); write stdin while something is queued. Sets ``wake_at``: when the
        next quiet period ends."""
        conn = self.daemon
        now = time.monotonic()
        self.wake_at = None
        if conn is not None:
            self._pump(conn, now)
        for agent in self.agents.values():
            for name, stream in agent.streams.items():
                quiet = stream.sent is not None and now < stream.quiet_until
                if quiet and (stream.fd is not None or stream.waiting()):
                    until = stream.quiet_until
                    self.wake_at = until if self.wake_at is None else min(self.wake_at, until)
                if stream.fd is not None:
                    read = len(stream.buf) < self.retain and not quiet and not stream.waiting()
                    self._want(
                        stream.fd, selectors.EVENT_READ if read else 0, ("pipe", (agent, name))
                    )
            if agent.stdin_fd is not None:
                want = selectors.EVENT_WRITE if agent.stdin else 0
                self._want(agent.stdin_fd, want, ("stdin", agent))

    # -- the loop --------------------------------------------------------------------

    def run(self) -> None:
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        # Caught, not ignored: an agent starts with them at their defaults (an exec
        # resets a caught signal, never an ignored one).
        signal.signal(signal.SIGHUP, lambda *_: None)
        signal.signal(signal.SIGINT, lambda *_: None)
        self._reap()
        while not self._done():
            try:
                self._refresh()
            except Exception:
                traceback.print_exc()  # as below: never the holder's end
            if self.daemon is None and self._orphaned():
                self._end_all()
                return
            timeout = ORPHAN_CHECK_S if self.daemon is None else None
            if self.wake_at is not None:
                timeout = max(0.0, self.wake_at - time.monotonic())
            if not self.ever_attached:
                timeout = min(ORPHAN_CHECK_S if timeout is None else timeout, 1.0)
            for key, events in self.selector.select(timeout):
                try:
                    self._dispatch(key.data, events)
                except Exception:
                    # Rule 1 first: the holder's death would take every agent's pipes.
                    # A bug met serving one event costs that event (and a connection
                    # it concerned), never the holder.
                    traceback.print_exc()
                    kind, data = key.data
                    if kind == "conn":
                        with _suppress_oserror():
                            self._drop(data)

    def _dispatch(self, key_data: tuple[str, Any], events: int) -> None:
        kind, data = key_data
        if kind == "accept":
            self._accept()
        elif kind == "sigchld":
            with _suppress_eagain():
                while os.read(self.wake_r, 4096):
                    pass
            self._reap()
        elif kind == "conn":
            self._on_conn(data, events)
        elif kind == "pipe":
            self._read_pipe(*data)
        elif kind == "stdin":
            self._write_stdin(data)

    def _orphaned(self) -> bool:
        """Rule 6: whether no daemon can reach this holder any more."""
        return self.inode is not None and _inode(self.path) != self.inode

    def _end_all(self) -> None:
        """Rule 6: end every agent (its group, while unreaped), then reap them and
        what they left behind; bounded by ``ORPHAN_END_S``."""
        sys.stderr.write(f"holder: {self.path!r} no longer leads here; ending its agents\n")
        for agent in self.agents.values():
            if agent.returncode is None:
                with _suppress_oserror():
                    os.killpg(agent.pid, signal.SIGKILL)
        deadline = time.monotonic() + ORPHAN_END_S
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return  # every child reaped
            if pid == 0:
                # What left an agent's group and was reparented here (a subreaper).
                for child in _children(os.getpid()):
                    with _suppress_oserror():
                        os.kill(child, signal.SIGKILL)
                time.sleep(0.05)

    def _done(self) -> bool:
        if self.agents or self.daemon is not None:
            return False
        if self.ever_attached:
            return True
        return time.monotonic() - self.started > self.idle_exit_s

    # -- connections -------------------------------------------------------------------

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        refused = self._refusal(sock)
        if refused is not None:
            with _suppress_oserror():
                sock.setblocking(True)
                sock.settimeout(1.0)
                sock.sendall(encode({"op": "refused", "message": refused}))
            sock.close()
            return
        sock.setblocking(False)
        conn = Connection(sock)
        self._want(sock.fileno(), selectors.EVENT_READ, ("conn", conn))

    def _refusal(self, sock: socket.socket) -> str | None:
        """Rule 5: why this peer may not connect, or None. Fails closed: a peer (or
        an ancestor) that is gone or whose /proc entries cannot be read is refused."""
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _ = struct.unpack("3i", creds)
        if uid != os.getuid():
            return "another user"
        try:
            pidfd = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                return "a peer already gone"
            pidfd = None  # a kernel older than 6.5: the pid as of connect() it is
        if pidfd is None:
            return lineage_refusal(pid, os.getpid()) if pid > 0 else "a peer already gone"
        try:
            # The process that connect()ed, pinned: alive before and after its /proc
            # is read, so its pid was not reused meanwhile.
            pinned = pidfd_pid(pidfd)
            if pinned <= 0:
                return "a peer already gone"
            why = lineage_refusal(pinned, os.getpid())
            if why is None and pidfd_pid(pidfd) != pinned:
                return "a peer already gone"
            return why
        finally:
            os.close(pidfd)

    def _on_conn(self, conn: Connection, events: int) -> None:
        if events & selectors.EVENT_WRITE:
            self._flush(conn)
        if events & selectors.EVENT_READ and not conn.closing:
            try:
                data = conn.sock.recv(READ_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._drop(conn)
                return
            try:
                messages = conn.decoder.feed(data)
            except ProtocolError as exc:
                self._send(conn, {"op": "error", "kind": "protocol", "message": str(exc)})
                self._close_after_send(conn)
                return
            for header, payload in messages:
                if conn.closing:
                    break
                try:
                    self._handle(conn, header, payload)
                except Exception as exc:
                    # A request that meets a bug is that request's error, never the
                    # connection's end (the daemon's is every agent's).
                    traceback.print_exc()
                    body = {"op": "error", "kind": "internal", "message": repr(exc)[:200]}
                    self._send(conn, {**body, "ref": header.get("ref")})

    def _drop(self, conn: Connection) -> None:
        """Close ``conn`` now; a daemon's end is a detach (Rule 4)."""
        fd = conn.sock.fileno()
        if fd in self.interest:
            self._want(fd, 0, ("conn", conn))
        conn.sock.close()
        if self.daemon is conn:
            self._detach()

    def _detach(self) -> None:
        self.daemon = None
        for agent in self.agents.values():
            for stream in agent.streams.values():
                stream.sent = None
                stream.upto = None
                stream.eof_sent = False
            agent.exit_sent = False

    def _close_after_send(self, conn: Connection) -> None:
        conn.closing = True
        if self.daemon is conn:
            self._detach()
        if conn.sock.fileno() < 0:
            return  # a failed send closed it already
        if not conn.outbuf:
            self._drop(conn)
        else:
            self._want(conn.sock.fileno(), selectors.EVENT_WRITE, ("conn", conn))

    def _send(self, conn: Connection, header: dict[str, Any], payload: bytes = b"") -> None:
        conn.outbuf += encode(header, payload)
        self._flush(conn)

    def _flush(self, conn: Connection) -> None:
        if conn.sock.fileno() < 0:
            return
        while conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(conn)
                return
            del conn.outbuf[:sent]
        if conn.closing and not conn.outbuf:
            self._drop(conn)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        if conn.closing:
            events = selectors.EVENT_WRITE
        self._want(conn.sock.fileno(), events, ("conn", conn))

    def _pump(self, conn: Connection, now: float) -> None:
        """Relay due output, exits and ends of output to the attached daemon, as far
        as its socket takes them (Rule 2). Output is framed only once the socket took
        everything before it: what arrives meanwhile goes out in one bigger frame, so
        a daemon that falls behind gets fewer, larger messages, not more of them."""
        if not conn.outbuf:
            due = [
                (agent, name, stream)
                for agent in self.agents.values()
                for name, stream in agent.streams.items()
                if stream.waiting() and now >= stream.quiet_until
            ]
            # Each pump starts at another stream: one whose frames fill the socket's
            # high water every time cannot keep the others waiting.
            first = self.relay_turn % len(due) if due else 0
            self.relay_turn += 1
            for agent, name, stream in due[first:] + due[:first]:
                if len(conn.outbuf) >= SEND_HIGH_WATER:
                    break
                assert stream.sent is not None
                size = FRAME_BYTES
                if stream.upto is not None:
                    size = min(size, stream.upto - stream.sent)
                    if size <= 0:
                        continue
                start = stream.sent - stream.base
                chunk = stream.buf[start : start + size]
                conn.outbuf += encode(
                    {"op": "out", "id": agent.id, "stream": name, "offset": stream.sent},
                    chunk,
                )
                stream.sent += len(chunk)
                if len(chunk) < BULK_BYTES:
                    stream.quiet_until = now + RELAY_QUIET_S
        for agent in self.agents.values():
            for name, stream in agent.streams.items():
                if stream.sent is None:
                    continue
                if stream.fd is None and stream.sent == stream.end and not stream.eof_sent:
                    stream.eof_sent = True
                    conn.outbuf += encode(
                        {"op": "eof", "id": agent.id, "stream": name, "offset": stream.end}
                    )
            if agent.returncode is not None and not agent.exit_sent:
                agent.exit_sent = True
                conn.outbuf += encode(
                    {"op": "exited", "id": agent.id, "returncode": agent.returncode}
                )
        if conn.outbuf:
            self._flush(conn)

    # -- requests --------------------------------------------------------------------------

    def _handle(self, conn: Connection, header: dict[str, Any], payload: bytes) -> None:
        op = header["op"]
        ref = header.get("ref")

        def reply(body: dict[str, Any]) -> None:
            self._send(conn, {**body, "ref": ref})

        if op == "hello":
            epoch = header.get("epoch")
            if header.get("protocol") != PROTOCOL:
                reply({"op": "error", "kind": "protocol", "message": f"protocol {PROTOCOL}"})
                self._close_after_send(conn)
                return
            if not isinstance(epoch, int) or epoch <= self.epoch:
                reply({"op": "error", "kind": "fenced", "message": f"epoch {self.epoch} is newer"})
                self._close_after_send(conn)
                return
            if self.daemon is not None and self.daemon is not conn:
                self._drop(self.daemon)  # Rule 4: the previous daemon is fenced off
            self.epoch = epoch
            self.daemon = conn
            self.keyed = header.get("keys") is True
            if not self.keyed:  # Rule 3: what it writes is not keyed
                for held in self.agents.values():
                    held.keys_known = False
            self.ever_attached = True
            reply(
                {
                    "op": "welcome",
                    "holder_pid": os.getpid(),
                    "cgroups": True,  # Rule 1: a spawn may name its cgroup
                    **({"mark": self.mark} if self.mark is not None else {}),  # Rule 1
                    "agents": [a.describe() for a in self.agents.values()],
                }
            )
            return
        if self.daemon is not conn:
            reply({"op": "error", "kind": "not_attached", "message": "say hello first"})
            self._close_after_send(conn)
            return
        if op == "detach":
            reply({"op": "detached"})
            self._close_after_send(conn)
            return
        if op == "spawn":
            reply(self._spawn(header))
            return
        if op not in AGENT_OPS:
            reply({"op": "error", "kind": "bad_request", "message": f"unknown op {op!r}"})
            return
        agent_id = header.get("id")
        agent = self.agents.get(agent_id) if isinstance(agent_id, str) else None
        if agent is None:
            reply(
                {
                    "op": "error",
                    "kind": "unknown_agent",
                    "message": f"no agent {header.get('id')!r}",
                }
            )
            return
        if op == "write":
            if agent.stdin_fd is None or agent.stdin_close:
                reply({"op": "error", "kind": "stdin_closed", "message": "its stdin is closed"})
            elif len(agent.stdin) + len(payload) > MAX_STDIN_QUEUE:
                reply({"op": "error", "kind": "stdin_full", "message": "too much unwritten input"})
            else:
                agent.stdin += payload  # whole, before any of it is written (Rule 3)
                key = header.get("key")
                if isinstance(key, str) and len(key) <= MAX_KEY:
                    agent.stdin_key = key
                elif key is not None:  # Rule 3: then nothing is known of its answers
                    agent.keys_known = False
                self._write_stdin(agent)
                if ref is not None:
                    reply({"op": "queued"})
        elif op == "close_stdin":
            agent.stdin_close = True
            self._write_stdin(agent)
            reply({"op": "ok"})
        elif op == "resume" or op == "ack":
            stream = agent.streams.get(header.get("stream", ""))
            offset, upto = header.get("offset"), header.get("upto")
            if stream is None or not _is_int(offset) or not (upto is None or _is_int(upto)):
                reply({"op": "error", "kind": "bad_request", "message": "stream and offset"})
                return
            if op == "ack":
                stream.ack(offset)
                if upto is not None and stream.upto is not None:
                    stream.upto = max(stream.upto, upto)
                return
            if not stream.base <= offset <= stream.end:
                reply(
                    {
                        "op": "error",
                        "kind": "offset_gone",
                        "message": f"offset {offset} outside {stream.base}..{stream.end}",
                    }
                )
                return
            stream.ack(offset)
            stream.sent = offset
            stream.upto = upto
            stream.eof_sent = False
            agent.exit_sent = False
            reply({"op": "ok"})
        elif op == "signal":
            # Only while unreaped is the pid, and so the group id, ours (child.py Rule 5).
            sig = header.get("signal", signal.SIGTERM)
            if not isinstance(sig, int) or isinstance(sig, bool) or not 0 < sig < signal.NSIG:
                reply({"op": "error", "kind": "bad_request", "message": "a signal number"})
                return
            sent = False
            if agent.returncode is None:
                try:
                    os.killpg(agent.pid, sig)
                    sent = True
                except (ProcessLookupError, PermissionError):
                    pass
            reply({"op": "signalled", "sent": sent})
        elif op == "forget":
            if agent.returncode is None:
                reply({"op": "error", "kind": "running", "message": "it has not exited"})
                return
            self._forget(agent)
            reply({"op": "ok"})

    def _spawn(self, header: dict[str, Any]) -> dict[str, Any]:
        agent_id, argv, cwd, env = (header.get(k) for k in ("id", "argv", "cwd", "env"))
        cgroup = header.get("cgroup")
        if not isinstance(agent_id, str) or agent_id in self.agents:
            return {"op": "error", "kind": "bad_request", "message": "a new id"}
        if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
            return {"op": "error", "kind": "bad_request", "message": "argv: strings"}
        if not isinstance(cwd, str) or not isinstance(env, dict):
            return {"op": "error", "kind": "bad_request", "message": "cwd and env"}
        if cgroup is not None and not (isinstance(cgroup, str) and os.path.isabs(cgroup)):
            return {"op": "error", "kind": "bad_request", "message": "cgroup: an absolute path"}
        environ = {str(k): str(v) for k, v in env.items()}
        environ.pop(HOLDER_MARK_ENV, None)  # Rule 1: the mark of a fork that did not exec
        # Our ends stay ours: the agent gets its ends only (all close-on-exec).
        pipes = [os.pipe() for _ in range(3)]
        theirs = (pipes[0][0], pipes[1][1], pipes[2][1])
        ours = (pipes[0][1], pipes[1][0], pipes[2][0])
        process: subprocess.Popen[bytes] | None = None
        try:
            pid = None if cgroup is None else self._clone_into(argv, cwd, environ, cgroup, theirs)
            if pid is None:
                if cgroup is not None:  # Rule 1: not cloned here; join as the shim does
                    argv = ["/bin/sh", "-c", JOIN_SCRIPT, f"{cgroup}/cgroup.procs", *argv]
                process = subprocess.Popen(
                    argv,
                    stdin=theirs[0],
                    stdout=theirs[1],
                    stderr=theirs[2],
                    cwd=cwd,
                    env=environ,
                    start_new_session=True,
                    close_fds=True,
                )
                pid = process.pid
        except Exception as exc:  # OSError; ValueError for a NUL byte; any: this spawn's
            for fd in ours:
                os.close(fd)
            if isinstance(exc, OSError):
                return {
                    "op": "error",
                    "kind": "spawn_failed",
                    "errno": exc.errno,
                    "message": exc.strerror or str(exc),
                }
            return {"op": "error", "kind": "bad_request", "message": f"spawn: {exc}"}
        finally:
            for fd in theirs:
                os.close(fd)
        agent = Agent(agent_id, pid, process, *ours)
        agent.keys_known = self.keyed
        # Read before any reap: an unreaped child, even a zombie, keeps its pid.
        agent.start_time = start_time(agent.pid)
        self.agents[agent_id] = agent
        self.by_pid[agent.pid] = agent
        self._reap()  # a SIGCHLD may have come before the agent was known
        return {
            "op": "spawned",
            "id": agent_id,
            "pid": agent.pid,
            "start_time": agent.start_time,
            "cloned": process is None,  # Rule 1: born in its cgroup by clone3
        }

    def _clone_into(
        self, argv: list[str], cwd: str, env: dict[str, str], cgroup: str, stdio: tuple[int, ...]
    ) -> int | None:
        """Rule 1's spawn into ``cgroup``: its pid, or None for the shim: when clone3
        is refused here (then never tried again), when the cgroup is frozen (the
        clone would stop in it, and the holder with it, until it thaws), and while
        the holder is past ``CLONE_MAX_RSS`` (a clone copies its page tables)."""
        if self.cloner is None or _frozen(cgroup) or _rss_bytes() > CLONE_MAX_RSS:
            return None
        try:
            return self.cloner.spawn(argv, cwd, env, cgroup, stdio)
        except OSError as exc:
            if exc.filename is not None or exc.errno not in CLONE_REFUSED:
                raise  # the exec's, the cwd's or the cgroup's: this spawn's error
            print(f"clone3 refused ({exc}): agents join their cgroups by a shell", file=sys.stderr)
            self.cloner = None
            return None

    def _forget(self, agent: Agent) -> None:
        del self.agents[agent.id]
        self.by_pid.pop(agent.pid, None)
        for stream in agent.streams.values():
            self._close_pipe(stream)
        self._close_stdin(agent)

    # -- agents' pipes -------------------------------------------------------------------

    def _read_pipe(self, agent: Agent, name: str) -> None:
        """Read what the pipe holds, up to ``FRAME_BYTES`` (a full read may be
        followed by more the agent wrote meanwhile) and the retention bound."""
        stream = agent.streams[name]
        total = 0
        while stream.fd is not None and total < FRAME_BYTES:
            want = min(READ_BYTES, self.retain - len(stream.buf))
            if want <= 0:
                return
            try:
                data = os.read(stream.fd, want)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._close_pipe(stream)
                return
            stream.buf += data
            total += len(data)
            if len(data) < want:
                return

    def _close_pipe(self, stream: Stream) -> None:
        if stream.fd is not None:
            if stream.fd in self.interest:
                self._want(stream.fd, 0, ("pipe", None))
            os.close(stream.fd)
            stream.fd = None

    def _write_stdin(self, agent: Agent) -> None:
        while agent.stdin and agent.stdin_fd is not None:
            try:
                written = os.write(agent.stdin_fd, agent.stdin)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EPIPE: it closed its stdin or exited
                agent.stdin.clear()
                self._close_stdin(agent)
                return
            del agent.stdin[:written]
        if agent.stdin_close and not agent.stdin:
            self._close_stdin(agent)

    def _close_stdin(self, agent: Agent) -> None:
        if agent.stdin_fd is not None:
            if agent.stdin_fd in self.interest:
                self._want(agent.stdin_fd, 0, ("stdin", None))
            os.close(agent.stdin_fd)
            agent.stdin_fd = None

    def _reap(self) -> None:
        """Reap every exited child: agents (their status is kept for the daemon) and
        what agents left behind, reparented here (Rule 1)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            agent = self.by_pid.get(pid)
            if agent is not None:
                agent.returncode = os.waitstatus_to_exitcode(status)
                if agent.process is not None:
                    agent.process.returncode = agent.returncode  # Popen must not wait again
                # Unwritten input can no longer reach it.
                agent.stdin.clear()
                self._close_stdin(agent)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class _suppress_eagain:
    def __enter__(self) -> None:
        return None

    def __exit__(self, et: object, exc: object, tb: object) -> bool:
        return isinstance(exc, BlockingIOError | InterruptedError)


class _suppress_oserror:
    def __enter__(self) -> None:
        return None

    def __exit__(self, et: object, exc: object, tb: object) -> bool:
        return isinstance(exc, OSError)


def _children(pid: int) -> list[int]:
    """The live children of ``pid``, from /proc (Rule 6)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and parent_pid(int(name)) == pid:
            out.append(int(name))
    return out


def _inode(path: str) -> tuple[int, int] | None:
    """The (device, inode) at ``path``, None when nothing is there (Rule 6)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def lineage_refusal(pid: int, holder_pid: int) -> str | None:
    """Rule 5 on a process and its ancestors: why it may be an agent, or None.
    Whatever cannot be read refuses (a process gone meanwhile included)."""
    current = pid
    for _ in range(MAX_ANCESTORS):
        if current == holder_pid:
            return "a process the holder started"
        why = in_agent_cgroup(current) or carries_token(current)
        if why is not None:
            return why
        parent = parent_pid(current)
        if parent is None:
            return "a process whose ancestry cannot be read"
        if parent <= 1:
            return None
        current = parent
    return "too deep a process tree"


def pidfd_pid(pidfd: int) -> int:
    """The pid a pidfd refers to, -1 once that process has exited (``Pid:`` in
    ``/proc/self/fdinfo``; agentsd.caller.pidfd_pid)."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as f:
            for line in f:
                if line.startswith("Pid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return -1


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields follow the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot): with the pid, an identity."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


def carries_token(pid: int) -> str | None:
    """Why ``pid`` may carry a spawn token: it does, or its environment cannot be
    read although it is the user's (an agent can make itself undumpable to hide
    it); None when it carries none or belongs to another user (say a root sshd
    among the daemon's ancestors: no agent of ours)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return None if owner_uid(pid) not in (None, os.getuid()) else "an unreadable environment"
    prefix = f"{SPAWN_TOKEN_ENV}=".encode()
    if any(entry.startswith(prefix) for entry in environ.split(b"\0")):
        return "a process carrying a spawn token"
    return None


def owner_uid(pid: int) -> int | None:
    """The real uid of ``pid`` (``Uid:`` in its status), None if unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def in_agent_cgroup(pid: int) -> str | None:
    """Why ``pid`` may be in an agent's cgroup: it is, or its cgroup is unreadable."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return "an unreadable cgroup"
    if any(
        is_agent_cgroup(part)
        for line in lines
        if line.startswith("0::")
        for part in line[3:].split("/")
    ):
        return "an agent's cgroup"
    return None


def is_agent_cgroup(name: str) -> bool:
    """Whether a cgroup directory name is a session's: ``agent-`` and a spawn token
    (32 hex digits), so that a unit of the user's named ``agent-...`` is not one."""
    token = name.removeprefix(CGROUP_PREFIX)
    return token != name and len(token) == 32 and all(c in "0123456789abcdef" for c in token)


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err or errno.EPERM), "PR_SET_CHILD_SUBREAPER")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--retain-bytes", type=int, default=DEFAULT_RETAIN_BYTES)
    parser.add_argument("--idle-exit-s", type=float, default=DEFAULT_IDLE_EXIT_S)
    parser.add_argument(
        "--detach",
        action="store_true",
        help="fork once more, so as never to be the starter's child (nor its zombie), "
        "and write the holder's pid and a newline on stdout, then close it",
    )
    args = parser.parse_args(argv)
    if args.detach:
        if os.fork() > 0:
            os._exit(0)
        os.write(1, f"{os.getpid()}\n".encode())
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    for fd in (0, 1, 2):  # Rule 1: an agent's pipe never lands on one of them
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free: this one
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    os.chdir("/")  # pinning no directory of the daemon's (an agent's cwd is its own)
    listener = socket.socket(fileno=args.listen_fd)
    for name in os.listdir("/proc/self/fd"):  # Rule 1: an agent inherits only its stdio
        with contextlib.suppress(OSError):  # the listing's own
            if int(name) > 2:
                os.set_inheritable(int(name), False)
    _become_subreaper()
    Holder(listener, max(1, args.retain_bytes), args.idle_exit_s).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
