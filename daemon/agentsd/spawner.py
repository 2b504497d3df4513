"""Spawning an agent straight into its cgroup (``CLONE_INTO_CGROUP``): no shim, no wait.

Moving a process into a cgroup (a write to ``cgroup.procs``) takes the kernel's
``cgroup_threadgroup_rwsem`` for writing, which waits for an RCU grace period (about
14 ms here) unless another move went just before: the cost of `agentsd.child`'s
shell shim. A process *created* in its cgroup (clone3 with ``CLONE_INTO_CGROUP``,
Linux 5.7) takes that lock only for reading and waits for nothing. Python has no
clone3, and a raw clone from the daemon, a threaded process, would run interpreter
code in a child whose other threads' locks may be held for ever. So
single-threaded helper processes do the clones: the fork servers.

Rule 1: the fork server is a ``python -I -S`` of the daemon's own interpreter, a
child of the daemon in its own session, that runs `SERVER` and nothing else: it
never execs. `SERVERS` of them per trio run (a spawn goes to an idle one, so
spawns at once overlap; Rule 5), started at the first spawn into a cgroup, ended when the
run ends (a system task owns each). A server holds nothing between requests and
sits in the daemon's cgroup, not in any session's: there is nothing of it for
recovery to end (it exits with the daemon, Rule 3).

Rule 2: per request (argv, environment, cwd, executable candidates as NUL-separated
bytes; the session cgroup's directory and the child's stdin, stdout and stderr as
``SCM_RIGHTS`` fds) it clones with ``CLONE_INTO_CGROUP | CLONE_PARENT |
CLONE_VFORK``: the child is born in the session's cgroup, so nothing of it ever
runs outside, and is the daemon's own child (its parent is the server's parent),
which the daemon reaps as any `subprocess.Popen` child; its pid and start time are
the agent's. It gets what `subprocess.Popen` would give it (its own session, the
three fds, no other fd, SIGPIPE and SIGXFSZ at default, the cwd, exec along
``PATH``), mostly prepared in the server before the clone: a clone is a copy of
the server (it runs Python until it exec's), and each page it touches is a fault,
so it makes two C calls, ``setsid`` and ``execve``. A failure (of the server's
``chdir``: nothing cloned, pid 0; of the exec: the child wrote it to a
close-on-exec report pipe before it exited) is in the reply. The server resumes
once the child is past its exec's point of no return or exited (``CLONE_VFORK``)
and replies at once: one wake-up of the daemon's spawning thread, as for a vfork
of its own, which does not wait for the exec to tear down the copied memory.

Rule 3: its request socket is one end of a socketpair: nothing but the daemon can
send it a request (an agent cannot open a socket through ``/proc/PID/fd``), and it
exits at end of file, so a dead daemon leaves no fork server behind. The clone in
the server is a raw syscall in a single-threaded process, done holding the GIL, the
child execs at once: no lock of another thread can be held in it.

Rule 4: if no server can be started, or every one died, failed to clone (a seccomp
policy refusing clone3: ENOSYS) or failed to answer within
`REPLY_TIMEOUT_S` (an agent of the same uid can signal them), `spawn_into` says so
(None before anything was cloned) and `agentsd.child` falls back to its shim; a
server that failed is not restarted in that run. A server stopped mid-request
(SIGSTOP) or killed makes that one spawn fail (`SpawnerFailed`, after
`REPLY_TIMEOUT_S` at most); the server is killed and reaped first, so nothing
more can be cloned, and `agentsd.child` then empties the cgroup and reaps what
the server may have cloned (the daemon's own child, whose pid it never learned).

Rule 5: a spawn never waits for a busy server: when every working server is
serving another spawn, `spawn_into` returns None and the shim serves that one. In
a burst the shim is the cheaper of the two: its joins follow each other closely,
so only the first waits for the kernel's grace period, while each clone copies an
interpreter's page tables. A lone spawn always finds a server free.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from agentsd.cgroup import SessionCgroup

__all__ = [
    "SERVER",
    "ForkServer",
    "ServerGone",
    "SpawnerFailed",
    "fork_server",
    "fork_servers",
    "spawn_into",
    "use_fork_server",
]

log = logging.getLogger(__name__)

READY = b"R"
REPLY = struct.Struct("=iii")  # the clone's pid (or -1), errno and failed step
HEADER = struct.Struct("=I")  # payload length
REPLY_TIMEOUT_S = 10.0  # a clone and an exec; far longer only if the server is stopped
START_TIMEOUT_S = 30.0  # an interpreter's start on a loaded machine
STEP_CHDIR, STEP_EXEC = 1, 2

# The fork server (Rule 1-3): argv[1] is its socket's fd. Kept small and without
# imports beyond what clone3 needs; the child path runs only os calls, then execs.
SERVER = r"""
import _ctypes, _signal, _socket, gc, posix, sys
from _struct import Struct

# Its clones share nothing with it (no CLONE_VM: they run Python until they exec):
# each copies its page tables and faults in every page it touches. So it stays
# small, and a clone runs two C calls: setsid and execve. Everything else is done
# in the server before the clone: the child's stdin, stdout and stderr are put on
# 0, 1 and 2 and its cwd entered (both inherited), every other fd is close-on-exec,
# SIGPIPE and SIGXFSZ are back to default (what Popen's child resets), argv and
# environment are C arrays. No collection ever runs (in a clone it would touch,
# and so copy, every object).
gc.disable()
fd = int(sys.argv[1])
for name in posix.listdir("/proc/self/fd"):
    if int(name) > 2:
        try:
            posix.set_inheritable(int(name), False)
        except OSError:
            pass  # the listing's own
sock = _socket.socket(fileno=fd)
# A reply to a daemon that died then ends the server: it would exit at EOF anyway.
_signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
_signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
DEVNULL = posix.open("/dev/null", posix.O_RDWR | posix.O_CLOEXEC)


class c_int(_ctypes._SimpleCData):
    _type_ = "i"


class c_long(_ctypes._SimpleCData):
    _type_ = "l"


class c_char_p(_ctypes._SimpleCData):
    _type_ = "z"


def function(name, result):  # ctypes.PyDLL(None).<name>, without ctypes
    class Function(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_PYTHONAPI | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = result

    return Function(_ctypes.dlsym(_ctypes.dlopen(None, _ctypes.RTLD_LOCAL), name))


syscall = function("syscall", c_long)
SYS_clone3 = c_long(435)  # the same number on every architecture (the generic table)
FLAGS = 0x200000000 | 0x8000 | 0x4000  # CLONE_INTO_CGROUP | CLONE_PARENT | CLONE_VFORK
ARGS = Struct("=11Q")
ARGS_SIZE = c_long(ARGS.size)
HEAD = Struct("=I")
REPLY = Struct("=iii")
REPORT = Struct("=ii")
RIGHTS = _socket.CMSG_SPACE(4 * 4)
SOL_SOCKET, SCM_RIGHTS = _socket.SOL_SOCKET, _socket.SCM_RIGHTS
STEP_CHDIR, STEP_EXEC = 1, 2
sock.sendall(b"R")


def recv_exact(n, first=b""):
    data = bytearray(first)
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            posix._exit(0)
        data += part
    return bytes(data)


def strings(items):  # a NULL-terminated char *[]
    return (c_char_p * (len(items) + 1))(*items)


def child(
    execs, argv, envp, report,
    setsid=function("setsid", c_int), execve=function("execve", c_int),
    errno=_ctypes.get_errno, write=posix.write, exit=posix._exit, pack=REPORT.pack,
):  # between clone and exec: as little as can be; never returns
    try:
        if setsid() < 0:
            write(report, pack(STEP_EXEC, errno()))
            return
        first, last = 0, 2
        for exe in execs:
            execve(exe, argv, envp)
            last = errno()
            if not first and last not in (2, 20):  # ENOENT, ENOTDIR: the next one
                first = last
        write(report, pack(STEP_EXEC, first or last))
    finally:
        exit(127)


while True:
    head, ancillary, _flags, _addr = sock.recvmsg(4, RIGHTS, 0x40000000)  # MSG_CMSG_CLOEXEC
    if not head:
        posix._exit(0)
    fds = []
    for level, kind, data in ancillary:
        if level == SOL_SOCKET and kind == SCM_RIGHTS:
            fds.extend(Struct(f"={len(data) // 4}i").unpack(data[: len(data) - len(data) % 4]))
    (length,) = HEAD.unpack(recv_exact(4, head))
    fields = recv_exact(length).split(b"\0")[:-1]
    if len(fds) != 4:  # the daemon always sends four: cgroup, stdin, stdout, stderr
        posix._exit(1)
    n_exec = int(fields[1])
    execs = fields[2 : 2 + n_exec]
    n_argv = int(fields[2 + n_exec])
    argv = strings(fields[3 + n_exec : 3 + n_exec + n_argv])
    envp = strings(fields[3 + n_exec + n_argv :])
    pid, err, step = 0, 0, 0
    try:
        posix.chdir(fields[0])
    except OSError as exc:
        err, step = exc.errno or 5, STEP_CHDIR  # nothing cloned: pid 0
    if not err:
        for target in (0, 1, 2):
            posix.dup2(fds[1 + target], target)  # inheritable: the clone's stdio
        report, report_write = posix.pipe()  # both close-on-exec
        posix.set_blocking(report, False)
        pid = syscall(SYS_clone3, ARGS.pack(FLAGS, 0, 0, 0, 0, 0, 0, 0, 0, 0, fds[0]), ARGS_SIZE)
        if pid == 0:
            child(execs, argv, envp, report_write)
        # CLONE_VFORK: the clone has exec'd (past the point of no return) or exited,
        # a failure written before its exit: no need to wait for the exec to end.
        if pid < 0:
            err = _ctypes.get_errno()
        else:
            try:
                got = posix.read(report, REPORT.size)
            except BlockingIOError:
                got = b""
            if len(got) == REPORT.size:
                step, err = REPORT.unpack(got)
    if step != STEP_CHDIR:  # before the reply: nothing of the spawn is kept
        for target in (0, 1, 2):
            posix.dup2(DEVNULL, target)
        posix.close(report)
        posix.close(report_write)
    for fd_ in fds:
        posix.close(fd_)
    posix.chdir("/")
    sock.sendall(REPLY.pack(pid, err, step))
"""


class SpawnerFailed(OSError):
    """The fork server failed; whether a child was cloned is unknown. ``server_ended``:
    the server was killed and reaped, so no clone can still come (else one may)."""

    def __init__(self, message: str, *, server_ended: bool) -> None:
        super().__init__(message)
        self.server_ended = server_ended


class ServerGone(OSError):
    """The fork server failed before it could read the request: nothing was cloned."""


class ForkServer:
    """The running fork server of a trio run (Rule 1). Its requests are made from
    the trio thread, one at a time (`busy`); only its start and end are blocking."""

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.process = process
        self.sock = sock
        self.trio_sock: trio.socket.SocketType | None = None  # for requests, made at the first
        self.broken = False
        self.busy = False  # a spawn holds it (Rule 5)
        self.served = 0  # children it cloned and that exec'd

    @classmethod
    def start(cls) -> ForkServer:
        """Start one and wait until it is ready. Raises OSError."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", SERVER, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,  # no terminal's signals
                close_fds=True,
                env={},
                cwd="/",
            )
        finally:
            theirs.close()
        server = cls(process, ours)
        ours.settimeout(START_TIMEOUT_S)
        try:
            if ours.recv(1) != READY:
                raise OSError("the fork server did not start")
        except OSError:
            server.close()
            raise
        return server

    async def clone(
        self, cgroup_fd: int, stdio: tuple[int, int, int], payload: bytes
    ) -> tuple[int, int, int]:
        """One request, from the trio thread: (pid, errno, step), errno 0 once the
        child exec'd; else the step that failed and pid 0 if nothing was cloned
        (a bad cwd), or the pid of the child, which exited (the caller reaps it).
        Raises `ServerGone` if the server could not have read the request or
        clone3 failed (nothing cloned; the server is broken from then on),
        `SpawnerFailed` if it broke after it may have cloned.

        Once sent, a request is seen through whatever cancels the caller (its
        clone would be the daemon's child, pid unknown), bounded by
        `REPLY_TIMEOUT_S`. The server replies once the child is past its exec's
        point of no return or exited, having read the child's report pipe
        (Rule 2)."""
        if self.broken:
            raise ServerGone("the fork server failed before")
        if self.trio_sock is None:
            self.trio_sock = trio.socket.from_stdlib_socket(self.sock)
        sock = self.trio_sock
        rights = struct.pack("=4i", cgroup_fd, *stdio)
        # One message where it fits (it mostly does): a server woken by a first
        # part would only sleep again until the rest came.
        message = HEADER.pack(len(payload)) + payload
        with trio.CancelScope(shield=True):
            try:
                sent = await sock.sendmsg(
                    [message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)]
                )
            except OSError as exc:
                self._break()
                raise ServerGone(f"the fork server is gone: {exc}") from exc
            try:
                with trio.fail_after(REPLY_TIMEOUT_S):
                    reply = await _exchange(sock, message[sent:])
            except (OSError, trio.TooSlowError) as exc:
                self._break()
                ended = await trio.to_thread.run_sync(self._reap)
                why = exc if isinstance(exc, OSError) else "timed out"
                raise SpawnerFailed(f"the fork server failed: {why}", server_ended=ended) from exc
        pid, err, step = REPLY.unpack(reply)
        if pid < 0:
            # Nothing was cloned. A container's seccomp policy may refuse clone3
            # (ENOSYS), which no retry mends: this server is done, the shim serves
            # (Rule 4).
            self._break()
            raise ServerGone(err, f"clone3: {os.strerror(err)}")
        if not err:
            self.served += 1
        return pid, err, step

    def _break(self) -> None:
        self.broken = True
        if self.process.returncode is None:
            # Unreaped: the pid is still ours to signal.
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)

    def _reap(self) -> bool:
        """After `_break`: wait (bounded) until the server is dead and reaped, so
        that it can clone nothing more; whether it is."""
        try:
            self.process.wait(timeout=REPLY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return False
        return True

    def close(self) -> None:
        """End it (end of file, then SIGKILL if it lingers) and reap it."""
        self.sock.close()
        try:
            self.process.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def _exchange(sock: trio.socket.SocketType, rest: bytes) -> bytes:
    """Send the rest of the request, receive the reply. Raises OSError."""
    view = memoryview(rest)
    while view:
        view = view[await sock.send(view) :]
    reply = b""
    while len(reply) < REPLY.size:
        part = await sock.recv(REPLY.size - len(reply))
        if not part:
            raise OSError("the fork server exited")
        reply += part
    return reply


SERVERS = 2  # fork servers per run: the spawns of a burst overlap (one per core here)

_SERVERS: trio.lowlevel.RunVar[list[ForkServer]] = trio.lowlevel.RunVar("agentsd_fork_servers")
_ENABLED: trio.lowlevel.RunVar[bool] = trio.lowlevel.RunVar("agentsd_fork_server_on", default=True)
_STARTING: trio.lowlevel.RunVar[trio.Lock] = trio.lowlevel.RunVar("agentsd_fork_server_lock")


def use_fork_server(enabled: bool) -> None:
    """Whether this run's spawns into a cgroup go through the fork servers (the
    default) or the shell shim of `agentsd.child`: ``bench_spawn`` compares them."""
    _ENABLED.set(enabled)


async def fork_servers() -> list[ForkServer]:
    """This run's `SERVERS` fork servers, started on first use; those that could
    start (none: the shim, Rule 4)."""
    try:
        return _SERVERS.get()
    except LookupError:
        pass
    try:
        lock = _STARTING.get()
    except LookupError:
        lock = trio.Lock()
        _STARTING.set(lock)
    async with lock:
        try:
            return _SERVERS.get()
        except LookupError:
            pass
        servers: list[ForkServer] = []
        for _ in range(SERVERS):
            try:
                server = await trio.to_thread.run_sync(ForkServer.start)
            except OSError as exc:
                log.warning("a fork server could not start: %s", exc)
                continue
            servers.append(server)
            trio.lowlevel.spawn_system_task(_own, server, name="agentsd fork server")
        if not servers:
            log.warning("no fork server: spawns into cgroups use the shell shim")
        _SERVERS.set(servers)
        return servers


async def fork_server() -> ForkServer | None:
    """The first of this run's fork servers (see `fork_servers`), or None."""
    servers = await fork_servers()
    return servers[0] if servers else None


def _pick(servers: list[ForkServer]) -> ForkServer | None:
    """A working server no spawn holds, or None: a spawn never queues behind
    another (Rule 5)."""
    for server in servers:
        if not server.broken and not server.busy:
            return server
    return None


async def _own(server: ForkServer) -> None:
    """Hold the fork server until the run ends, then end and reap it."""
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(server.close)
            except OSError as exc:
                log.warning("could not end the fork server: %s", exc)


class _ClonedPopen(subprocess.Popen[bytes]):
    """A `subprocess.Popen` of a child the fork server cloned already: ``pid``."""

    def __init__(self, pid: int, *args: Any, **kw: Any) -> None:
        self._cloned = pid
        super().__init__(*args, **kw)

    def _execute_child(  # CPython's private hook
        self,
        args: Sequence[str],
        executable: str | None,
        preexec_fn: object,
        close_fds: bool,
        pass_fds: Sequence[int],
        cwd: str,
        env: Mapping[str, str],
        startupinfo: object,
        creationflags: int,
        shell: bool,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        *rest: object,
    ) -> None:
        self.pid = self._cloned
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]


def _payload(program: str, argv: list[str], cwd: str, env: Mapping[str, str]) -> bytes:
    """The request's fields, NUL-terminated: what `subprocess.Popen` would pass to
    exec, byte for byte (its checks included)."""
    encoded_env = []
    for key, value in env.items():
        k = os.fsencode(key)
        if b"=" in k:
            raise ValueError("illegal environment variable name")
        encoded_env.append(k + b"=" + os.fsencode(value))
    exe = os.fsencode(program)
    if os.path.dirname(exe):
        execs = [exe]
    else:
        execs = [os.path.join(os.fsencode(d), exe) for d in os.get_exec_path(dict(env))]
    fields = [
        os.fsencode(cwd if os.path.isabs(cwd) else os.path.join(os.getcwd(), cwd)),  # not /
        str(len(execs)).encode(),
        *execs,
        str(len(argv)).encode(),
        *(os.fsencode(a) for a in argv),
        *encoded_env,
    ]
    if any(b"\0" in f for f in fields):
        raise ValueError("embedded null byte")
    return b"".join(f + b"\0" for f in fields)


async def spawn_into(
    cgroup: SessionCgroup,
    argv: list[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    stderr: int | None,
    prepare: Callable[[], None],
) -> trio.Process | None:
    """Start ``argv`` born in ``cgroup``, in a session of its own, with piped stdin
    and stdout and ``stderr`` (None: /dev/null). None if no fork server is free
    (nothing was started: use the shim, Rules 4 and 5). Raises OSError as
    `subprocess.Popen` would (nothing left running), `SpawnerFailed` if the
    server broke mid-request (``cgroup`` may then hold a child: the caller kills
    it), ValueError for what Popen refuses. ``prepare`` (making ``cgroup``) runs
    first, in the trio thread (cgroupfs is in memory: ``agentsd.cgroup`` Rule 3);
    the request too: no worker thread stands between the daemon and the server."""
    if not _ENABLED.get():
        return None
    server = _pick(await fork_servers())
    if server is None:
        return None
    payload = _payload(argv[0], argv, cwd, env)  # Popen's refusals before anything
    server.busy = True  # no checkpoint since the pick: no other spawn took it
    try:
        prepare()
        cgroup_fd = os.open(cgroup.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        stdin_read = stdin_write = stdout_read = stdout_write = -1
        try:
            stdin_read, stdin_write = os.pipe()
            stdout_read, stdout_write = os.pipe()
            stderr_fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC) if stderr is None else stderr
            try:
                stdio = (stdin_read, stdout_write, stderr_fd)
                pid, err, step = await server.clone(cgroup_fd, stdio, payload)
            finally:
                if stderr is None:
                    os.close(stderr_fd)
        except BaseException:
            for fd in (stdin_write, stdout_read):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            os.close(cgroup_fd)
            for fd in (stdin_read, stdout_write):
                if fd >= 0:
                    os.close(fd)
    except ServerGone:
        return None  # nothing was cloned: the shim instead (Rule 4)
    finally:
        server.busy = False
    if err:
        if pid:  # cloned (our child: CLONE_PARENT) and exited 127; else a bad cwd
            with trio.CancelScope(shield=True):  # it exits at once: never left a zombie
                await trio.to_thread.run_sync(os.waitpid, pid, 0)
        os.close(stdin_write)
        os.close(stdout_read)
        raise OSError(err, os.strerror(err), cwd if step == STEP_CHDIR else argv[0])
    popen = _ClonedPopen(pid, argv)
    # trio's constructor is private (trio.lowlevel.open_process makes its own Popen);
    # its signature is (popen, stdin, stdout, stderr).
    create: Any = trio.Process._create
    process: trio.Process = create(
        popen, trio.lowlevel.FdStream(stdin_write), trio.lowlevel.FdStream(stdout_read), None
    )
    return process
