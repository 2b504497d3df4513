"""Restart in place: the daemon's process executes the daemon again (``daemon.restart``).

The same pid runs the new image, so whatever a service manager knows of the daemon
stays true: its main pid (``NotifyAccess=main``, ``WATCHDOG_PID``), its cgroup, and
the listening sockets it passed (``LISTEN_PID`` still names this process). Whatever
was installed since the daemon started is what runs: this is how an upgrade starts.

Rule 1 (what crosses the exec): the descriptors systemd passed (socket activation)
stay open at the numbers it gave them, and the variables that describe them and
the notify socket, which the daemon removed from its environment when it read them
(``agentsd.systemd`` Rule 3), are given to the new image again; without them, the
listener the daemon bound itself, still listening (``agentsd.socket_keeper`` Rule
5, described by ``AGENTSD_KEPT_SOCKET``, which the new image removes). Nothing
else: every
other descriptor is close-on-exec (an agent's pipe, the holder link, the database,
a pidfd), checked one by one just before the exec, so a descriptor some library
left inheritable is closed by the exec and named in the log.

Rule 2 (the sequence systemd sees): ``RELOADING=1`` (with ``MONOTONIC_USEC=``) when
the old image begins to close, then ``READY=1`` from the new image once its
recovery is done and it serves (``agentsd.server``). No ``STOPPING=1``: the
service is not stopping.

Rule 3 (a new image that cannot start): before anything stops, `preflight` runs
the new code with ``--preflight`` in a child process: it loads the configuration
and imports every module of the daemon, as a start would, and exits. If that fails
(a config it refuses, a module missing from the install, a syntax error) the restart
is refused and the daemon serves on, agents untouched. What only a start can find
(a cgroup root that is gone, a store it cannot open) fails loudly, as any start
does: its error on stderr (the journal), a non-zero exit status, and the service
manager's ``Restart=`` policy. An exec that fails outright (the interpreter is
gone) exits ``EXIT_EXEC_FAILED`` after saying why. Either way agents the holder
keeps stay held: nothing here or in a failed start ends them.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import subprocess
import sys
from collections.abc import Collection, Mapping
from contextlib import suppress
from typing import NoReturn

import trio

import agentsd
import agentsd_protocol

log = logging.getLogger(__name__)

STDIO_FDS = frozenset({0, 1, 2})  # the journal stream, or the terminal: always kept
EXIT_EXEC_FAILED = 1  # agentsd.main.EXIT_FAILURE
PREFLIGHT_FLAG = "--preflight"
# Importing the whole daemon takes about a second, several on a loaded machine.
PREFLIGHT_TIMEOUT_S = 60.0
MAX_PREFLIGHT_OUTPUT_CHARS = 2000  # the end of what a failed preflight said


def import_everything() -> int:
    """Import every module of the daemon and its protocol package, as the running
    daemon may at any time (``--preflight``); how many. Raises what an import
    raises."""
    count = 0
    for package in (agentsd, agentsd_protocol):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not module.name.endswith(".__main__"):  # running it starts a daemon
                importlib.import_module(module.name)
                count += 1
    return count


async def preflight(argv: list[str]) -> str | None:
    """Whether the code installed now starts with ``argv``'s configuration (Rule 3):
    None when it does, else what it said. Never raises but cancellation."""
    command = [*image_argv(argv), PREFLIGHT_FLAG]
    try:
        with trio.move_on_after(PREFLIGHT_TIMEOUT_S) as late:
            done = await trio.run_process(
                command,
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    except OSError as exc:
        return f"cannot execute {command[0]}: {exc}"
    if late.cancelled_caught:
        return f"it did not load within {PREFLIGHT_TIMEOUT_S:g} s"
    if done.returncode == 0:
        return None
    said = (done.stderr + done.stdout).decode(errors="replace").strip()
    if len(said) > MAX_PREFLIGHT_OUTPUT_CHARS:
        said = "..." + said[-MAX_PREFLIGHT_OUTPUT_CHARS:]
    return f"it exited with status {done.returncode}: {said}"


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
