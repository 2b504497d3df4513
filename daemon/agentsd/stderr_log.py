"""An agent's stderr: read from a pipe into a capped log file and a short tail.

Rule 1 (bounded): a session's log never holds more than ``max_bytes`` on disk. It is
two files, ``<session>.stderr.log`` and the older ``<session>.stderr.log.1``; when the
current one reaches half the bound it replaces the older one and a new one begins,
so the newest half of the bound at least is always kept. However fast an agent
writes, what it wrote last is what remains.

Rule 2 (the words that say why): the last ``TAIL_BYTES`` are kept in memory; the
session task puts them in ``child.exited`` when the agent failed or exited on its
own, and in the error of a start that failed.

Rule 3 (never in the way): the pipe is read for the child's whole life, the
handshake included, so an agent never blocks on a full stderr pipe; the pipe is read
and the file written by the daemon's agent watch (``agentsd.agent_watch``), a
thread, never the event loop, and no trio task per agent; a file that cannot be written (a
full disk) costs only the log, never the agent or its session.
"""

from __future__ import annotations

import fcntl
import logging
import os
from contextlib import suppress
from pathlib import Path
from typing import BinaryIO

import trio

from agentsd.agent_watch import PIPE_BYTES, current_watch
from agentsd.child import spawn_limiter

log = logging.getLogger(__name__)

TAIL_BYTES = 4096  # what child.exited quotes: the last few dozen lines
DRAIN_TIMEOUT_S = 2.0  # the pipe holds at most 1 MiB once the child is gone; a
# descendant still holding it open is not waited for past this


def rotated(path: Path) -> Path:
    """The older half of the log at ``path``."""
    return path.with_name(path.name + ".1")


def remove_log(path: Path) -> None:
    """Remove the log at ``path``, both halves (blocking: run it in a thread)."""
    for part in (path, rotated(path)):
        with suppress(FileNotFoundError):
            part.unlink()


class StderrLog:
    """One session task's reader of its agent's stderr (see the module's rules). Its
    pipe is read by the daemon's one ``AgentWatch``, not by a task of its own."""

    __slots__ = (
        "_broken",
        "_ended",
        "_file",
        "_half_bytes",
        "_path",
        "_read_fd",
        "_size",
        "_tail",
        "_waiter",
        "_write_fd",
    )

    def __init__(self, path: Path, max_bytes: int) -> None:
        """``max_bytes``: the bound of Rule 1 (``Config.stderr_log_max_bytes``, at
        least ``agentsd.config.MIN_LOG_BYTES``)."""
        self._path = path
        self._half_bytes = max_bytes // 2
        # Replaced whole by the watch's thread, read whole by ``tail``.
        self._tail = b""
        self._file: BinaryIO | None = None
        self._size = 0
        self._broken = False  # a write failed: the log stops, the reading goes on
        self._read_fd = self._write_fd = -1
        # The pipe reached its end (``AgentWatch`` Rule 2), and who waits for it: a
        # flag and a task rather than a ``trio.Event``, a few hundred bytes less for
        # every live agent.
        self._ended = False
        self._waiter: trio.lowlevel.Task | None = None

    def tail(self) -> str | None:
        """The end of what the agent wrote (at most ``TAIL_BYTES``, starting at a
        whole character), or None if it wrote nothing but blanks."""
        raw = self._tail
        text = raw.decode("utf-8", "replace")
        if len(raw) >= TAIL_BYTES:
            text = text.lstrip("\ufffd")  # the cut may fall inside a character
        return text if text.strip() else None

    def capture(self) -> StderrLog:
        """As an async context manager: yield the write end of a pipe to give the
        child as its stderr, and read it meanwhile. On exit our write end is closed
        and what the child wrote is read to its end, shielded, for at most
        ``DRAIN_TIMEOUT_S``; then the pipe is released and the log file closed (by
        the watch, Rule 1 there). Used once.

        A class rather than ``@asynccontextmanager``: a suspended generator and its
        frame would stay resident for the agent's whole life."""
        return self

    async def __aenter__(self) -> int:
        # Opened first, so that the log exists (0600) from the agent's start on; in
        # a spawn's thread, so that a burst of starts does not grow trio's pool.
        await trio.to_thread.run_sync(self._write, b"", limiter=spawn_limiter())
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        with suppress(OSError):  # lowered fs.pipe-max-size: the default 64 KiB serves
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        try:
            current_watch().add_pipe(read_fd, self._received, self._end, self._released)
        except BaseException:
            os.close(read_fd)
            os.close(write_fd)
            raise
        self._read_fd, self._write_fd = read_fd, write_fd  # the watch owns read_fd
        return write_fd

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            os.close(self._write_fd)
            self._write_fd = -1
            with trio.CancelScope(shield=True), trio.move_on_after(DRAIN_TIMEOUT_S):
                await self._wait_ended()
        finally:
            current_watch().release(self._read_fd)

    async def _wait_ended(self) -> None:
        if self._ended:
            await trio.lowlevel.checkpoint()
            return
        self._waiter = trio.lowlevel.current_task()

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            self._waiter = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _end(self) -> None:
        """The pipe ended (trio's thread)."""
        self._ended = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            trio.lowlevel.reschedule(waiter)

    def _received(self, chunk: memoryview) -> None:
        """A chunk read from the pipe (the watch's thread)."""
        if len(chunk) >= TAIL_BYTES:
            self._tail = bytes(chunk[-TAIL_BYTES:])
        else:
            self._tail = self._tail[len(chunk) - TAIL_BYTES :] + chunk
        if not self._broken:
            self._write(chunk)

    def _released(self) -> None:
        """The watch let go of the pipe (its thread): nothing is written any more."""
        if self._file is not None:
            self._file.close()  # unbuffered: nothing left to flush
            self._file = None

    def _write(self, chunk: bytes | memoryview) -> None:
        """Append ``chunk`` to the log, rotating it whenever the current file would
        pass half the bound (Rule 1). Runs in a worker thread, one call at a time."""
        half = self._half_bytes
        try:
            if self._file is None:
                self._file = self._open()
            # Of a chunk larger than the whole bound, only its end could remain.
            chunk = chunk[-2 * half :]
            for start in range(0, len(chunk), half):
                piece = chunk[start : start + half]
                if self._size > 0 and self._size + len(piece) > half:
                    self._file.close()
                    self._file = None
                    os.replace(self._path, rotated(self._path))
                    self._file = self._open()
                self._file.write(piece)
                self._size += len(piece)
        except OSError as exc:
            self._broken = True
            log.warning("stopped writing the agent's stderr log %s: %s", self._path, exc)

    def _open(self) -> BinaryIO:
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        file = os.fdopen(fd, "ab", buffering=0)
        self._size = os.fstat(fd).st_size  # a previous agent of the session wrote some
        return file
