"""The daemon's one watcher of its agents: a thread that reads every agent's stderr
pipe and waits for every agent's exit, instead of a trio task or two per agent.

A trio task parked on a descriptor costs about 2 KiB for every live agent (its
coroutine chain down to the epoll wait, its cancel state), which at hundreds of
sessions is a good part of what a session costs the daemon. One thread instead
waits on all of them with one epoll: what a pipe's reader does with a chunk (keep
a tail, write a file) runs in this thread, where blocking is allowed, never on the
event loop; an exit (the child's pidfd becoming readable) is reported to trio.

Rule 1: a descriptor is added with ``add`` and released with ``release``, both
from trio's thread; from ``add`` on, the watch owns it: the thread alone reads it,
unregisters it and closes it, so it is never closed while read and its number is
not reused before the watch let go of it. ``release`` does not wait for the
thread, which then calls ``on_release`` (in its thread) if given: nothing is
called for that descriptor afterwards, and no end that happens after ``release``
is reported (one reported just before may still arrive).

Rule 2: the end of a pipe (end of file or a read error), or a pidfd becoming
readable (the process exited), is reported once, by calling ``on_end`` in trio's
thread; the descriptor is then no longer polled but stays open until released.

Rule 3: the thread runs only while a descriptor is added: it starts with the first
and exits once the last is released, so an idle daemon, or a test's trio run that
ended, keeps no thread. One watch per trio run (``current_watch``).

Rule 4: one reader's slow disk delays the other pipes and the exit reports, never
an agent: each pipe holds ``PIPE_BYTES`` before its writer blocks, and an exit
waits for nothing but its report. The logs share a directory with the database,
so a disk that hangs stops the store for everyone anyway.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import threading
from collections.abc import Callable

import trio

__all__ = ["PIPE_BYTES", "AgentWatch", "current_watch"]

log = logging.getLogger(__name__)

# The most one read takes: the pipes are widened to this (``stderr_log``), so one
# read empties a full pipe.
PIPE_BYTES = 1 << 20

OnData = Callable[[memoryview], None]
"""Called in the watch's thread with a view valid only during the call."""


class AgentWatch:
    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._lock = threading.Lock()  # held for bookkeeping only, never across I/O
        # fd -> (on_data, or None for a pidfd; on_end; on_release), until released.
        self._entries: dict[
            int, tuple[OnData | None, Callable[[], object], Callable[[], object] | None]
        ] = {}
        self._released: list[int] = []  # fds to close, taken by the thread
        self._thread: threading.Thread | None = None
        self._epoll: select.epoll | None = None
        self._wake_read = self._wake_write = -1

    def add_pipe(
        self,
        fd: int,
        on_data: OnData,
        on_end: Callable[[], object],
        on_release: Callable[[], object] | None = None,
    ) -> None:
        """Read ``fd`` (the read end of a pipe, now owned by the watch) into
        ``on_data`` until it ends (``on_end``, Rule 2) or is released."""
        os.set_blocking(fd, False)
        self._add(fd, (on_data, on_end, on_release))

    def add_exit(self, pid: int, on_end: Callable[[], object]) -> int:
        """Call ``on_end`` (trio's thread) once the unreaped child ``pid`` exited;
        the pidfd to release. Raises OSError if the pidfd cannot be opened."""
        fd = os.pidfd_open(pid)
        os.set_inheritable(fd, False)
        try:
            self._add(fd, (None, on_end, None))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def release(self, fd: int) -> None:
        """Stop watching ``fd`` and close it, in the watch's thread, soon (Rule 1).

        The thread is woken once for all the releases of one pass of trio's loop
        (a close-all releases hundreds in a few passes): a wake-up per descriptor
        would hand the thread the GIL, and the loop wait for it back, each time."""
        with self._lock:
            self._released.append(fd)
            first = len(self._released) == 1
        if first:
            # Any other release before the thread takes the list joins this wake-up.
            try:
                self._token.run_sync_soon(self._wake)
            except trio.RunFinishedError:  # no pass of the loop is left: wake it now
                self._wake()

    def _wake(self) -> None:
        """Wake the thread to take the released descriptors (trio's thread)."""
        with self._lock:
            # Under the lock, as the thread marks the pipe gone before closing it.
            if self._wake_write < 0:
                return  # it took the list and ended: nothing left to wake
            # A full wake pipe already holds a wake-up the thread has yet to read.
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_write, b"\0")

    def _add(
        self,
        fd: int,
        entry: tuple[OnData | None, Callable[[], object], Callable[[], object] | None],
    ) -> None:
        with self._lock:
            if self._thread is None:
                self._start()
            assert self._epoll is not None
            self._entries[fd] = entry
            self._epoll.register(fd, select.EPOLLIN)

    def _start(self) -> None:
        self._epoll = select.epoll()
        self._wake_read, self._wake_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._epoll.register(self._wake_read, select.EPOLLIN)
        self._thread = threading.Thread(
            target=self._serve,
            args=(self._epoll, self._wake_read, self._wake_write),
            name="agentsd-agent-watch",
            daemon=True,
        )
        self._thread.start()

    def _serve(self, epoll: select.epoll, wake_read: int, wake_write: int) -> None:
        buffer = bytearray(PIPE_BYTES)
        view = memoryview(buffer)
        try:
            while True:
                for fd, _ in epoll.poll():
                    if fd == wake_read:
                        if self._close_released(epoll, wake_read):
                            return
                    else:
                        self._ready(epoll, fd, buffer, view)
        finally:
            epoll.close()
            os.close(wake_read)
            os.close(wake_write)

    def _close_released(self, epoll: select.epoll, wake_read: int) -> bool:
        """Close the released descriptors; True when none is left and the thread
        ends (Rule 3)."""
        with contextlib.suppress(BlockingIOError):
            while os.read(wake_read, 4096):
                pass
        with self._lock:
            released, self._released = self._released, []
            entries = [self._entries.pop(fd) for fd in released]
            done = not self._entries
            if done:
                self._thread = self._epoll = None
                self._wake_read = self._wake_write = -1
        for fd in released:
            try:
                epoll.unregister(fd)
            except OSError as exc:  # unregistered already at its end (Rule 2)
                if exc.errno != errno.ENOENT:
                    raise
            os.close(fd)
        for _, _, on_release in entries:
            if on_release is not None:
                on_release()
        return done

    def _ready(self, epoll: select.epoll, fd: int, buffer: bytearray, view: memoryview) -> None:
        with self._lock:
            # Released: closed earlier in this round of events, or about to be.
            entry = None if fd in self._released else self._entries.get(fd)
        if entry is None:
            return
        on_data, on_end, _ = entry
        if on_data is not None:
            try:
                size = os.readv(fd, [buffer])
            except BlockingIOError:
                return
            except OSError:
                size = 0
            if size:
                try:
                    on_data(view[:size])
                except Exception:
                    # A bug in one reader must not stop the others' pipes.
                    log.exception("the reader of fd %d failed", fd)
                return
        epoll.unregister(fd)
        with contextlib.suppress(trio.RunFinishedError):  # nobody waits any more
            self._token.run_sync_soon(on_end)


_WATCH: trio.lowlevel.RunVar[AgentWatch] = trio.lowlevel.RunVar("agentsd_agent_watch")


def current_watch() -> AgentWatch:
    """This trio run's watch (Rule 3)."""
    try:
        return _WATCH.get()
    except LookupError:
        watch = AgentWatch(trio.lowlevel.current_trio_token())
        _WATCH.set(watch)
        return watch
