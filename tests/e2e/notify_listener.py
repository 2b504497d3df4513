"""A stand-in for systemd's notification socket, for tests that run the real daemon.

systemd binds an AF_UNIX datagram socket, names it in ``$NOTIFY_SOCKET``, reads
``KEY=value`` lines from each datagram and, for ``NotifyAccess=main``, drops any
datagram whose sender (``SCM_CREDENTIALS``) is not the service's main pid. This
listener does the same reading and records the sender, so a test can check both what
the daemon said and that the daemon itself said it.

Blocking stdlib code with a deadline on every wait, like ``tests/daemon_process.py``.
The kernel queues a datagram at ``sendto`` time, so everything a process sent before
it exited or was stopped is waiting here: nothing is lost by reading late.
"""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_TIMESPEC = struct.Struct("2q")  # struct timespec on 64-bit Linux: seconds, nanoseconds
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
"""Python does not export it; 35 is the asm-generic value (x86, arm, riscv, power;
sparc and parisc differ). The kernel then stamps each datagram when it is queued,
that is when the sender's ``sendto`` ran, however late this test reads it."""
MAX_DATAGRAM_BYTES = 4096  # systemd takes at most PIPE_BUF bytes per notification
READ_SLICE_S = 0.05  # how often a wait checks whether the daemon died meanwhile


@attrs.frozen
class Notification:
    """One datagram: its fields in order, who sent it and when."""

    fields: dict[str, str]
    sender_pid: int | None
    sent_at: float | None  # time.time() when the sender sent it, from the kernel

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.fields.items())


def _parse(datagram: bytes) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in datagram.decode().split("\n"):
        key, sep, value = line.partition("=")
        assert sep and key, f"not a KEY=value line in a notification: {datagram!r}"
        fields[key] = value
    return fields


class NotifyListener:
    """A bound ``NOTIFY_SOCKET`` that records every notification in arrival order.

    ``received`` holds everything read so far. ``wait_for`` reads on until a
    notification matches, searching from a cursor that each match moves past itself,
    so consecutive waits check order (``READY=1`` then ``STOPPING=1``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.received: list[Notification] = []
        self._cursor = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            # Ask the kernel for the sender's pid on every datagram, as systemd does.
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self._sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            self._sock.bind(str(path))
        except BaseException:
            self._sock.close()
            raise

    @classmethod
    @contextmanager
    def bound(cls, directory: Path) -> Iterator[NotifyListener]:
        """A listener on ``directory/notify.sock``, closed and unlinked afterwards."""
        listener = cls(directory / "notify.sock")
        try:
            yield listener
        finally:
            listener.close()

    @property
    def env(self) -> dict[str, str]:
        """What systemd puts in a ``Type=notify`` service's environment, and a login
        shell with no rc file of the user's. Under a service manager the daemon takes
        its agents' environment from ``$SHELL -l -i`` (``agent_env = "auto"``), so the
        test machine's dotfiles would decide a test's outcome and speed: a root
        ``.bashrc`` that hangs (a stale pyenv lock) made each such daemon wait out the
        10 s bound before its first agent. ``/bin/sh`` still runs the capture; a
        test of the capture itself names its own ``SHELL`` after this."""
        return {"NOTIFY_SOCKET": str(self.path), "SHELL": "/bin/sh"}

    def close(self) -> None:
        self._sock.close()
        self.path.unlink(missing_ok=True)

    def _read(self, timeout_s: float | None) -> Notification | None:
        """One datagram within ``timeout_s`` (``None``: only one already queued)."""
        if timeout_s is None:
            self._sock.setblocking(False)
        else:
            self._sock.settimeout(max(timeout_s, 0.001))
        try:
            data, ancillary, flags, _addr = self._sock.recvmsg(
                MAX_DATAGRAM_BYTES,
                socket.CMSG_SPACE(_CREDENTIALS.size) + socket.CMSG_SPACE(_TIMESPEC.size),
            )
        except (BlockingIOError, TimeoutError):
            return None
        assert not flags & socket.MSG_TRUNC, f"a notification over {MAX_DATAGRAM_BYTES} bytes"
        sender = sent_at = None
        for level, kind, payload in ancillary:
            if level != socket.SOL_SOCKET:
                continue
            if kind == socket.SCM_CREDENTIALS:
                sender, _uid, _gid = _CREDENTIALS.unpack(payload[: _CREDENTIALS.size])
            elif kind == SO_TIMESTAMPNS:  # SCM_TIMESTAMPNS has the option's value
                seconds, nanoseconds = _TIMESPEC.unpack(payload[: _TIMESPEC.size])
                sent_at = seconds + nanoseconds / 1e9
        note = Notification(_parse(data), sender, sent_at)
        self.received.append(note)
        return note

    def drain(self) -> list[Notification]:
        """Every notification queued right now, without waiting."""
        out = []
        while (note := self._read(None)) is not None:
            out.append(note)
        return out

    def skip_queued(self) -> list[Notification]:
        """Read everything queued now and move the cursor past it: later waits see
        only what is sent from now on."""
        queued = self.drain()
        self._cursor = len(self.received)
        return queued

    def wait_for(
        self,
        key: str,
        value: str | re.Pattern[str] | None = None,
        *,
        process: subprocess.Popen[bytes],
        timeout_s: float,
    ) -> Notification:
        """The next notification (from the cursor on) carrying ``key``, with a value
        equal to ``value`` or fully matching it when it is a pattern; the cursor then
        moves past it. AssertionError, listing everything received, when the deadline
        passes or ``process`` exits and nothing it sent matches."""
        deadline = time.monotonic() + timeout_s
        while True:
            for index in range(self._cursor, len(self.received)):
                note = self.received[index]
                if key in note.fields and _matches(note.fields[key], value):
                    self._cursor = index + 1
                    return note
            exited = process.poll() is not None
            remaining = deadline - time.monotonic()
            if exited:
                # Whatever it sent is queued already: read it all, then give up.
                if self.drain():
                    continue
            elif remaining > 0:
                self._read(min(remaining, READ_SLICE_S))
                continue
            why = f"exited with {process.returncode}" if exited else f"timed out ({timeout_s} s)"
            wanted = value.pattern if isinstance(value, re.Pattern) else value or "*"
            said = "\n".join(f"  {note}" for note in self.received) or "  (nothing)"
            raise AssertionError(
                f"waiting for {key}={wanted}: pid {process.pid} {why}; received:\n{said}"
            )


def _matches(actual: str, wanted: str | re.Pattern[str] | None) -> bool:
    if wanted is None:
        return True
    if isinstance(wanted, str):
        return actual == wanted
    return wanted.fullmatch(actual) is not None
