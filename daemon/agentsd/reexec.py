"""Restart in place: the daemon's process executes the daemon again (``daemon.restart``).

The same pid runs the new image, so whatever a service manager knows of the daemon
stays true: its main pid (``NotifyAccess=main``, ``WATCHDOG_PID``), its cgroup, and
the listening sockets it passed (``LISTEN_PID`` still names this process). Whatever
was installed since the daemon started is what runs: this is how an upgrade starts.

Rule 1 (what crosses the exec): the descriptors systemd passed (socket activation)
stay open at the numbers it gave them, and the variables that describe them and
the notify socket, which the daemon removed from its environment when it read them
(``agentsd.systemd`` Rule 3), are given to the new image again. Nothing else: every
other descriptor is close-on-exec (an agent's pipe, the holder link, the database,
a pidfd), checked one by one just before the exec, so a descriptor some library
left inheritable is closed by the exec and named in the log.

Rule 2 (the sequence systemd sees): ``RELOADING=1`` (with ``MONOTONIC_USEC=``) when
the old image begins to close, then ``READY=1`` from the new image once its
recovery is done and it serves (``agentsd.server``). No ``STOPPING=1``: the
service is not stopping.

Rule 3 (a new image that cannot start): it fails loudly, as any start does: its
error on stderr (the journal), a non-zero exit status, and the service manager's
``Restart=`` policy. An exec that fails outright (the interpreter is gone) exits
``EXIT_FAILURE`` after saying why. Either way agents the holder keeps stay held:
nothing here or in a failed start ends them.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Collection, Mapping
from contextlib import suppress
from typing import NoReturn

log = logging.getLogger(__name__)

STDIO_FDS = frozenset({0, 1, 2})  # the journal stream, or the terminal: always kept
EXIT_EXEC_FAILED = 1  # agentsd.main.EXIT_FAILURE


def image_argv(argv: list[str]) -> list[str]:
    """The command line of the new image: this interpreter, the package's entry."""
    return [sys.executable, "-m", "agentsd", *argv]


def seal_descriptors(keep: Collection[int]) -> list[int]:
    """Make ``keep`` (and stdio) inheritable and every other open descriptor
    close-on-exec (Rule 1); the descriptors that had been inheritable and are now
    sealed, for the log."""
    sealed = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in STDIO_FDS:
            continue
        try:
            if fd in keep:
                os.set_inheritable(fd, True)
            elif os.get_inheritable(fd):
                os.set_inheritable(fd, False)
                sealed.append(fd)
        except OSError:
            continue  # the directory's own descriptor, closed since the listing
    return sealed


def describe_fd(fd: int) -> str:
    with suppress(OSError):
        return f"{fd} ({os.readlink(f'/proc/self/fd/{fd}')})"
    return str(fd)


def exec_in_place(argv: list[str], env: Mapping[str, str], keep: Collection[int]) -> NoReturn:
    """Execute the daemon again in this process with ``env`` (Rules 1 and 3).
    Never returns: the new image runs, or this process exits ``EXIT_EXEC_FAILED``."""
    sealed = seal_descriptors(keep)
    if sealed:
        log.warning(
            "restart: closing inherited descriptors at the exec: %s",
            ", ".join(describe_fd(fd) for fd in sealed),
        )
    command = image_argv(argv)
    log.info("restart: executing %s", " ".join(command))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(command[0], command, dict(env))
    except OSError as exc:
        print(f"agentsd: restart failed: cannot execute {command[0]}: {exc}", file=sys.stderr)
        sys.exit(EXIT_EXEC_FAILED)
