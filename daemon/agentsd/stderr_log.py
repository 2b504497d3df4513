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
handshake included, so an agent never blocks on a full stderr pipe; files are
written by worker threads, never the event loop; a file that cannot be written
(a full disk) costs only the log, never the agent or its session.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import BinaryIO

import trio

log = logging.getLogger(__name__)

TAIL_BYTES = 4096  # what child.exited quotes: the last few dozen lines
# The pipe is widened to this (Linux's default cap for a user, fs.pipe-max-size): a
# flooding agent then costs one worker-thread write per MiB, not per 64 KiB.
PIPE_BYTES = 1 << 20
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
    """One session task's reader of its agent's stderr (see the module's rules)."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        """``max_bytes``: the bound of Rule 1 (``Config.stderr_log_max_bytes``, at
        least ``agentsd.config.MIN_LOG_BYTES``)."""
        self._path = path
        self._half_bytes = max_bytes // 2
        self._tail = bytearray()
        self._file: BinaryIO | None = None
        self._size = 0
        self._broken = False  # a write failed: the log stops, the reading goes on

    def tail(self) -> str | None:
        """The end of what the agent wrote (at most ``TAIL_BYTES``, starting at a
        whole character), or None if it wrote nothing but blanks."""
        text = bytes(self._tail).decode("utf-8", "replace")
        if len(self._tail) >= TAIL_BYTES:
            text = text.lstrip("\ufffd")  # the cut may fall inside a character
        return text if text.strip() else None

    @asynccontextmanager
    async def capture(self) -> AsyncIterator[int]:
        """Yield the write end of a pipe to give the child as its stderr, and read
        it meanwhile. On exit our write end is closed and what the child wrote is
        read to its end, shielded, for at most ``DRAIN_TIMEOUT_S``; then the reader
        stops and the log file is closed.

        The body must raise nothing but cancellation: the reader's nursery would
        wrap anything else in an exception group.
        """
        # Opened first, so that the log exists (0600) from the agent's start on.
        await trio.to_thread.run_sync(self._write, b"")
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        with suppress(OSError):  # lowered fs.pipe-max-size: the default 64 KiB serves
            fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        stream = trio.lowlevel.FdStream(read_fd)  # owns read_fd from here on
        drained = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read, stream, drained)
                try:
                    yield write_fd
                finally:
                    os.close(write_fd)
                    write_fd = -1
                    with trio.CancelScope(shield=True), trio.move_on_after(DRAIN_TIMEOUT_S):
                        await drained.wait()
                    nursery.cancel_scope.cancel()
        finally:
            if write_fd >= 0:
                os.close(write_fd)
            stream.close()
            if self._file is not None:
                self._file.close()  # unbuffered: nothing left to flush
                self._file = None

    async def _read(self, stream: trio.lowlevel.FdStream, drained: trio.Event) -> None:
        try:
            while chunk := await stream.receive_some(PIPE_BYTES):
                self._tail += chunk
                del self._tail[:-TAIL_BYTES]
                if not self._broken:
                    await trio.to_thread.run_sync(self._write, chunk)
        finally:
            drained.set()

    def _write(self, chunk: bytes) -> None:
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
