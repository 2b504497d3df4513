"""The daemon a command talks to: its socket and state directory (from the global
options and the environment), and whether a command may start it.

``link()`` gives the stdlib connection ``agentsctl status`` uses; ``client()`` the
typed ``Client`` (which imports msgspec). Both start a detached daemon when none
answers, unless ``--no-start`` or the command passes ``start=False``; never while a
daemon holds the state directory's lock (``agentsctl.daemon`` Rule 4): then they wait
for it to bind its socket again, and say so.
"""

from __future__ import annotations

import os
import sys

from agentsctl.daemon import (
    DaemonNotRunning,
    DaemonSocketLost,
    DaemonStartFailed,
    Link,
    LockHolder,
    daemon_argv,
    default_socket_path,
    default_state_dir,
    lock_holder,
    spawn_detached,
    wait_until_answering,
)

# The daemon checks its socket every second (agentsd.socket_keeper) and binds it
# again at once; this leaves room for a loaded machine.
REBIND_WAIT_S = 5.0

# typing costs a few ms of cold start and is needed by the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import TypeVar

    from agentsctl.client import Client

    C = TypeVar("C")


class Target:
    """The daemon a command talks to: its socket, its state dir, whether to start it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.explicit_socket: str | None = args.socket
        self.explicit_state_dir: str | None = args.state_dir
        self.state_dir: str = args.state_dir or default_state_dir()
        self.socket_path: str = args.socket or default_socket_path(state_dir=args.state_dir)
        self.may_start: bool = not args.no_start
        self.log_path = os.path.join(self.state_dir, "agentsd.log")

    def global_args(self) -> list[str]:
        """The global options given on this command line that locate the daemon, for
        commands printed as hints (``agentsctl approve ...``)."""
        words: list[str] = []
        if self.explicit_socket is not None:
            words += ["--socket", self.explicit_socket]
        if self.explicit_state_dir is not None:
            words += ["--state-dir", self.explicit_state_dir]
        return words

    def link(self, *, start: bool = True) -> Link:
        """A stdlib-JSON connection; with ``start``, a daemon is started if none runs
        (unless ``--no-start``). Raises ``DaemonUnreachable`` and its subclasses."""
        return self._connect(Link, start=start)

    def client(self, *, start: bool = True) -> Client:
        """A typed ``Client`` (this imports msgspec); started as ``link`` does."""
        from agentsctl.client import Client

        return self._connect(Client, start=start)

    def _connect(self, open_connection: Callable[[str], C], *, start: bool) -> C:
        try:
            return open_connection(self.socket_path)
        except DaemonNotRunning:
            holder = lock_holder(self.state_dir)
            if holder is None and not (start and self.may_start):
                raise
        if holder is None:
            self.autostart()
        else:
            self.await_rebind(holder)
        return open_connection(self.socket_path)

    def await_rebind(self, holder: LockHolder) -> None:
        """``holder`` runs but does not answer here: wait for it to bind its socket
        again; ``DaemonSocketLost`` (saying what to do) if it does not."""
        state = self.state_dir
        if holder.socket_path != self.socket_path:
            raise DaemonSocketLost(
                f"agentsd (pid {holder.pid}) holds {state} but listens at "
                f"{holder.socket_path}, not at {self.socket_path}; use --socket "
                f"{holder.socket_path}, or `agentsctl daemon stop` to stop it",
                self.socket_path,
                holder,
            )
        print(
            f"agentsctl: agentsd (pid {holder.pid}) holds {state} but its socket "
            f"{self.socket_path} is gone; waiting for it to bind it again",
            file=sys.stderr,
        )
        try:
            wait_until_answering(self.socket_path, deadline_s=REBIND_WAIT_S)
        except DaemonStartFailed:
            raise DaemonSocketLost(
                f"agentsd (pid {holder.pid}) holds {state} but has not bound its socket "
                f"{self.socket_path} again within {REBIND_WAIT_S:g} s (see its log); "
                "`agentsctl daemon stop` stops it",
                self.socket_path,
                holder,
            ) from None

    def autostart(self) -> None:
        """Start a detached daemon for a command that needs one; says so on stderr."""
        pid = self.start_detached()
        print(f"agentsctl: started agentsd (pid {pid}) at {self.socket_path}", file=sys.stderr)

    def start_detached(self, *, log_level: str | None = None, config: str | None = None) -> int:
        """Spawn a detached daemon and wait until it answers; its pid.

        Raises ``DaemonStartFailed`` if it exits or stays silent past the deadline.
        """
        argv = daemon_argv(
            self.socket_path,
            state_dir=self.explicit_state_dir,
            log_level=log_level,
            config=config,
        )
        try:
            pid = spawn_detached(argv, self.log_path)
        except OSError as exc:
            raise DaemonStartFailed(f"cannot start agentsd: {exc}", self.socket_path) from None
        wait_until_answering(self.socket_path, pid=pid, log_path=self.log_path)
        return pid
