"""Waiting for a cgroup file to change (``cgroup.events``), through inotify, without
polling: the kernel signals a modification of that file when a value in it changes.

Rule: one inotify instance per trio run, shared by all waits, and closed with the
last of them (see `_EventsWatch`).
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Callable
from pathlib import Path

import trio

__all__ = ["wait_until_changed"]

_IN_MODIFY = 0x00000002
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC


async def wait_until_changed(file: Path, done: Callable[[], bool]) -> None:
    """Return once ``done()`` holds, checking it first and again each time ``file``
    is modified. The caller bounds the wait. Raises OSError if ``file`` cannot be
    watched."""
    await _EventsWatch.current().wait_until(file, done)


_libc = ctypes.CDLL(None, use_errno=True)
_INOTIFY_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
_READ_BYTES = 64 * 1024  # inotify events without names are 16 bytes: thousands a read


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


class _EventsWatch:
    """One inotify instance shared by every `wait_until_changed` of a trio run:
    the per-user limit on instances is 128 by default, and a close-all of hundreds
    of sessions waits on that many cgroups at once; watches are plentiful.

    Rule: whoever waits reads. One waiter at a time holds the reader role: it waits
    for the descriptor, reads every pending event and wakes the waiters of the
    watches that changed, and keeps the role while it waits on. A reader that
    leaves (its wait is over, or cancelled) hands the role to one other waiter. An
    event thus costs a look at the cgroups it concerns, never at all of them: a
    close-all of N sessions costs N looks, not N squared. The instance is closed
    when its last waiter leaves, so it lives no longer than the waits it serves."""

    _CURRENT: trio.lowlevel.RunVar[_EventsWatch | None] = trio.lowlevel.RunVar(
        "agentsd_cgroup_events_watch", default=None
    )

    def __init__(self) -> None:
        self.fd = _check(_libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC), "inotify_init1")
        self.wakers: dict[int, trio.Event] = {}  # watch descriptor -> its waiter's wake-up
        self.users: dict[int, int] = {}  # watch descriptor -> how many wait on it
        self.reading = False

    @classmethod
    def current(cls) -> _EventsWatch:
        watch = cls._CURRENT.get()
        if watch is None:
            watch = cls()
            cls._CURRENT.set(watch)
        return watch

    async def wait_until(self, file: Path, done: Callable[[], bool]) -> None:
        path = os.fsencode(file)
        try:
            wd = _check(_libc.inotify_add_watch(self.fd, path, _IN_MODIFY), f"watch {path!r}")
        except OSError:
            self._leave(None)
            raise
        self.users[wd] = self.users.get(wd, 0) + 1
        try:
            # The watch is in place before the first look: no change can slip between.
            while not done():
                waker = self.wakers.setdefault(wd, trio.Event())
                if self.reading:
                    await waker.wait()
                    continue
                self.reading = True
                try:
                    await trio.lowlevel.wait_readable(self.fd)
                    self._dispatch()
                finally:
                    self.reading = False
        finally:
            self._leave(wd)

    def _dispatch(self) -> None:
        """Read every pending event; wake the waiters of the watches concerned."""
        changed: set[int] = set()
        while True:
            try:
                data = os.read(self.fd, _READ_BYTES)
            except BlockingIOError:
                break
            offset = 0
            while offset < len(data):
                wd, _mask, _cookie, name_len = _INOTIFY_EVENT.unpack_from(data, offset)
                changed.add(wd)
                offset += _INOTIFY_EVENT.size + name_len
        self._wake(changed)

    def _wake(self, wds: set[int]) -> None:
        for wd in wds:
            waker = self.wakers.pop(wd, None)
            if waker is not None:
                waker.set()

    def _leave(self, wd: int | None) -> None:
        if wd is not None:
            self.users[wd] -= 1
            if not self.users[wd]:
                del self.users[wd]
                self._wake({wd})
                # Removed with its cgroup already (EINVAL then): nothing to undo.
                _libc.inotify_rm_watch(self.fd, wd)
        if not self.reading and self.wakers:
            # Someone still waits and nobody reads: one of them takes the role over.
            self._wake({next(iter(self.wakers))})
        if not self.users:
            self._CURRENT.set(None)
            trio.lowlevel.notify_closing(self.fd)
            os.close(self.fd)
