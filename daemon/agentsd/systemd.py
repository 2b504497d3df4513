"""The three systemd protocols agentsd speaks, without libsystemd.

- **Readiness and status** (``sd_notify``): one ``KEY=value`` datagram per call to the
  AF_UNIX socket named by ``$NOTIFY_SOCKET``.
- **Watchdog** (``sd_watchdog_enabled``): ``WATCHDOG=1`` at half of
  ``$WATCHDOG_USEC``, sent from the trio loop itself so that a wedged loop stops the
  pings and systemd restarts the daemon.
- **Socket activation** (``sd_listen_fds_with_names``): listening sockets inherited
  from fd 3 onwards, described by ``$LISTEN_PID``, ``$LISTEN_FDS`` and
  ``$LISTEN_FDNAMES``.

Rules:

1. Parsing is strict. A variable that is present but malformed raises
   :class:`SystemdEnvError` naming the variable and the value; it is never silently
   read as "absent", because that would turn a misconfigured unit into a daemon that
   quietly runs without readiness, watchdog or its socket.
2. Sending never raises. systemd going away must not take the daemon with it, so a
   failed notification is logged (once per :class:`Notifier`) and dropped.
3. What is meant for this process stays with this process. ``NOTIFY_SOCKET`` and the
   ``LISTEN_*`` variables are removed from the environment once read, so agent
   children never inherit them (``sd_notify``'s and ``sd_listen_fds``'s
   ``unset_environment``).
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import stat
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Final, NoReturn

import attrs
import trio

__all__ = [
    "InheritedSocket",
    "Notifier",
    "SystemdEnvError",
    "listen_fds",
    "run_watchdog",
    "watchdog_interval_s",
]

log = logging.getLogger(__name__)

SD_LISTEN_FDS_START: Final = 3
"""The first inherited fd: 0-2 are stdio (sd-daemon.h)."""

MAX_SUN_PATH_BYTES: Final = 107
"""``sun_path`` is 108 bytes on Linux; a filesystem path needs its NUL terminator and
an abstract name its leading NUL, so either leaves 107 bytes of name."""

USEC_INFINITY: Final = 2**64 - 1
"""systemd's "no timeout"; ``sd_watchdog_enabled`` refuses it as a watchdog period."""

_DECIMAL = re.compile(r"[0-9]+")
"""ASCII digits only: ``int()`` would also take " 5", "+5", "5_0" and non-ASCII
digits, none of which systemd ever writes."""

_FIELD_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
"""The shape of every ``sd_notify`` variable (READY, STATUS, WATCHDOG, ...)."""


class SystemdEnvError(ValueError):
    """A systemd environment variable is present but malformed."""


def _parse_decimal(name: str, value: str, *, minimum: int, maximum: int | None = None) -> int:
    if _DECIMAL.fullmatch(value) is None:
        raise SystemdEnvError(f"{name}={value!r} is not a decimal integer")
    number = int(value)
    if number < minimum or (maximum is not None and number > maximum):
        upper = "" if maximum is None else f" and at most {maximum}"
        raise SystemdEnvError(f"{name}={value!r} must be at least {minimum}{upper}")
    return number


def _notify_address(value: str) -> bytes:
    """Turn ``$NOTIFY_SOCKET`` into an AF_UNIX address (``@name`` is abstract)."""
    if value.startswith("@"):
        name = os.fsencode(value[1:])
        if not name:
            raise SystemdEnvError("NOTIFY_SOCKET='@' names no abstract socket")
        address = b"\0" + name
    elif value.startswith("/"):
        address = os.fsencode(value)
    else:
        raise SystemdEnvError(
            f"NOTIFY_SOCKET={value!r} is neither an absolute path nor an @abstract name"
            " (vsock: addresses are not supported)"
        )
    if len(address) > MAX_SUN_PATH_BYTES:
        raise SystemdEnvError(
            f"NOTIFY_SOCKET={value!r} is longer than the {MAX_SUN_PATH_BYTES} bytes"
            " an AF_UNIX address holds"
        )
    return address


@attrs.define(eq=False)
class Notifier:
    """Sends ``sd_notify`` datagrams to the service manager, or nothing at all.

    Build it with :meth:`from_env`. Without ``$NOTIFY_SOCKET`` (a terminal, a test,
    a unit that is not ``Type=notify``) every method is a no-op. Each call sends one
    datagram on a non-blocking socket, so a call never waits: if systemd's queue is
    full or its socket is gone, the datagram is dropped and the first such failure
    is logged as a warning (later ones at debug level, so a dead manager cannot
    flood the log). No method raises on a send failure; :meth:`notify` raises
    ``ValueError`` only for malformed fields, which is a bug in the caller.

    Owned by the daemon's main task; call it from the trio thread.
    """

    address: bytes | None
    """The AF_UNIX address datagrams go to, or ``None`` when inactive."""
    _sock: socket.socket | None = attrs.field(default=None, init=False)
    _failure_logged: bool = attrs.field(default=False, init=False)

    @classmethod
    def from_env(cls, env: MutableMapping[str, str] = os.environ) -> Notifier:
        """Read ``$NOTIFY_SOCKET`` and remove it from ``env``.

        Raises :class:`SystemdEnvError` (after the removal) when the value is neither
        an absolute path nor an ``@abstract`` name, or too long for AF_UNIX.
        """
        value = env.pop("NOTIFY_SOCKET", None)
        if value is None:
            return cls(None)
        return cls(_notify_address(value))

    @property
    def active(self) -> bool:
        """True while datagrams are sent (``$NOTIFY_SOCKET`` was set, not closed)."""
        return self.address is not None

    def notify(self, **fields: str | int) -> None:
        """Send ``fields`` as one datagram of ``KEY=value`` lines, in call order.

        Raises ``ValueError`` when a name is not an upper-case sd_notify variable or
        a value contains a newline (it would split into a second, forged field).
        """
        lines = []
        for name, value in fields.items():
            if _FIELD_NAME.fullmatch(name) is None:
                raise ValueError(f"sd_notify field name {name!r} is not an upper-case name")
            text = str(value)
            if "\n" in text:
                raise ValueError(f"sd_notify field {name} contains a newline: {text!r}")
            lines.append(f"{name}={text}")
        if not lines:
            raise ValueError("notify() needs at least one field")
        self._send("\n".join(lines).encode())

    def ready(self) -> None:
        """``READY=1``: startup is complete and the socket is being served."""
        self.notify(READY=1)

    def status(self, text: str) -> None:
        """``STATUS=text``, shown by ``systemctl status``. Newlines become spaces."""
        self.notify(STATUS=" ".join(text.splitlines()))

    def stopping(self) -> None:
        """``STOPPING=1``: shutdown has begun (sessions are being closed)."""
        self.notify(STOPPING=1)

    def reloading(self) -> None:
        """``RELOADING=1`` with ``MONOTONIC_USEC=``: a restart in place has begun
        (the same pid executes itself again); ``READY=1`` follows from the new
        image once it serves. systemd (253 and later) matches the stamp against
        the reload it is waiting for; older ones ignore it."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.notify(RELOADING=1, MONOTONIC_USEC=usec)

    def watchdog(self) -> None:
        """``WATCHDOG=1``: the daemon is alive. Prefer :func:`run_watchdog`."""
        self.notify(WATCHDOG=1)

    def close(self) -> None:
        """Close the socket; every later call is a no-op. Idempotent."""
        self.address = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _send(self, datagram: bytes) -> None:
        if self.address is None:
            return
        try:
            if self._sock is None:
                # Python sockets are created close-on-exec (PEP 446), so agent
                # children never hold the notify socket either.
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            self._sock.sendto(datagram, self.address)
        except OSError as exc:
            level = logging.DEBUG if self._failure_logged else logging.WARNING
            self._failure_logged = True
            log.log(level, "sd_notify %r to %r failed: %s", datagram, self.address, exc)


def watchdog_interval_s(env: Mapping[str, str] = os.environ) -> float | None:
    """How often to send ``WATCHDOG=1``: half of ``$WATCHDOG_USEC``, in seconds.

    ``None`` when the watchdog is off: ``$WATCHDOG_USEC`` is absent, or
    ``$WATCHDOG_PID`` is set to another process (the variables were inherited, not
    meant for us). Raises :class:`SystemdEnvError` for a malformed or zero value.
    ``env`` is not modified: without ``$NOTIFY_SOCKET`` a child cannot ping anyway,
    and ``$WATCHDOG_PID`` tells it the period is not its own.
    """
    usec_text = env.get("WATCHDOG_USEC")
    if usec_text is None:
        return None
    usec = _parse_decimal("WATCHDOG_USEC", usec_text, minimum=1, maximum=USEC_INFINITY - 1)
    pid_text = env.get("WATCHDOG_PID")
    if pid_text is not None and _parse_decimal("WATCHDOG_PID", pid_text, minimum=1) != os.getpid():
        return None
    # Half the period, as sd_watchdog_enabled(3) recommends: one late or skipped ping
    # still leaves a whole interval before systemd gives up on us.
    return usec / 2 / 1_000_000


async def run_watchdog(
    notifier: Notifier,
    interval_s: float,
    healthy: Callable[[], bool],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Send ``WATCHDOG=1`` every ``interval_s`` while the daemon is demonstrably alive.

    A task body for ``nursery.start``; never returns, ends only by cancellation.
    ``started()`` is called after the first tick, which pings at once if healthy.

    A tick pings only when both hold:

    - ``healthy()`` returns true. It runs on the trio thread, must be cheap and
      non-blocking, and an exception from it propagates (it is a bug, not ill
      health).
    - The loop is responsive: the tick woke no more than half an interval after it
      was due. The ping is sent from this task, so a blocked loop sends nothing while
      it is blocked; the lag check also refuses the tick that runs right after the
      block, because that tick proves only that the loop woke up once.

    A late tick is followed by a re-check a quarter interval later rather than a
    whole one, so a single stall shorter than about three quarters of an interval
    costs no restart, while a loop that keeps stalling never pings and systemd
    restarts it after ``WatchdogSec``. Each skipped tick is logged as a warning.
    """
    if not (math.isfinite(interval_s) and interval_s > 0):
        raise ValueError(
            f"watchdog interval must be a positive number of seconds, not {interval_s}"
        )
    max_lag_s = interval_s / 2
    recheck_s = interval_s / 4
    due = trio.current_time()
    started = False
    while True:
        woke = trio.current_time()
        lag_s = woke - due
        if lag_s > max_lag_s:
            log.warning(
                "watchdog: event loop woke %.3f s late (limit %.3f s); not pinging",
                lag_s,
                max_lag_s,
            )
            due = woke + recheck_s
        else:
            if healthy():
                notifier.watchdog()
            else:
                log.warning("watchdog: daemon reports itself unhealthy; not pinging")
            # Scheduled from the due time, not the wake time, so small lags do not
            # accumulate into a slower ping rate.
            due += interval_s
        if not started:
            started = True
            task_status.started()
        await trio.sleep_until(due)


@attrs.frozen
class InheritedSocket:
    """One socket passed by the service manager (``sd_listen_fds_with_names``)."""

    fd: int
    """The descriptor number it arrived on (3, 4, ...)."""
    name: str
    """Its ``FileDescriptorName=`` (for agentsd.socket: ``agentsd.socket``), or
    ``unknown`` when the manager passed no names, as libsystemd reports it."""
    sock: socket.socket
    """Owned by the caller from now on: serve it, and close it (never unlink its path:
    the socket unit owns the path and keeps it across daemon restarts)."""


def listen_fds(env: MutableMapping[str, str] = os.environ) -> list[InheritedSocket]:
    """Take the sockets systemd passed to this process, in fd order.

    Returns ``[]`` when nothing was passed, or when ``$LISTEN_PID`` names another
    process (the variables were inherited from a parent). The sockets are returned
    as they are, already bound and listening; each is made close-on-exec so agent
    children do not hold the daemon's listener. ``$LISTEN_PID``, ``$LISTEN_FDS`` and
    ``$LISTEN_FDNAMES`` are removed from ``env`` in every case, errors included.

    Raises :class:`SystemdEnvError` when a variable is malformed, when the number of
    names differs from the number of fds, or when a passed fd is not an open socket.
    Nothing is closed or wrapped before all fds are validated, so an error leaves
    the descriptors untouched.
    """
    pid_text = env.pop("LISTEN_PID", None)
    count_text = env.pop("LISTEN_FDS", None)
    names_text = env.pop("LISTEN_FDNAMES", None)
    if pid_text is None or count_text is None:
        return []
    if _parse_decimal("LISTEN_PID", pid_text, minimum=1) != os.getpid():
        return []
    count = _parse_decimal("LISTEN_FDS", count_text, minimum=0)
    if names_text is None:
        names = ["unknown"] * count
    else:
        # An empty value is one empty name, exactly as libsystemd splits it.
        names = names_text.split(":")
        if len(names) != count:
            raise SystemdEnvError(
                f"LISTEN_FDNAMES={names_text!r} has {len(names)} names"
                f" but LISTEN_FDS={count_text!r}"
            )
    fds = range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count)
    for fd in fds:
        try:
            mode = os.fstat(fd).st_mode
        except OSError as exc:
            raise SystemdEnvError(
                f"LISTEN_FDS={count_text!r} but fd {fd} is not open: {exc.strerror}"
            ) from exc
        if not stat.S_ISSOCK(mode):
            raise SystemdEnvError(f"LISTEN_FDS={count_text!r} but fd {fd} is not a socket")
    inherited = []
    for fd, name in zip(fds, names, strict=True):
        os.set_inheritable(fd, False)
        # fileno= makes Python ask the kernel for family, type and protocol.
        inherited.append(InheritedSocket(fd=fd, name=name, sock=socket.socket(fileno=fd)))
    return inherited
