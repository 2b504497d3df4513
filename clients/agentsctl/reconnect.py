"""Long-lived commands (``watch``, ``notify``) outlive a daemon restart.

Rule 1: a dropped connection or an unreachable daemon is a pause, not an end: the
command says it is reconnecting and tries again after a delay that starts at
``FIRST_S`` and doubles up to ``MAX_S``, reset once a connection works again, so a
daemon gone for good costs one attempt every few seconds and one coming back is
found within a fraction of a second.

Rule 2: reconnecting never starts a daemon (``agentsctl.cli`` Rule 2): a restart is
in progress, or the user stopped it; under systemd the socket unit starts it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from agentsctl.client import Client
from agentsctl.daemon import DaemonUnreachable

if TYPE_CHECKING:
    from agentsctl.target import Target

FIRST_S = 0.1  # a daemon restarting under systemd answers again within about this
MAX_S = 5.0  # a daemon gone for good costs one connection attempt per this


class Backoff:
    """The delays between reconnection attempts (Rule 1)."""

    def __init__(self, first_s: float = FIRST_S, max_s: float = MAX_S) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self._next_s = first_s

    def reset(self) -> None:
        self._next_s = self.first_s

    def pause(self) -> None:
        time.sleep(self._next_s)
        self._next_s = min(self._next_s * 2, self.max_s)


def reconnect(target: Target, backoff: Backoff) -> Client:
    """A new connection to the daemon, trying until one works (Rules 1 and 2).
    Ctrl-C (``KeyboardInterrupt``) is the way out."""
    while True:
        backoff.pause()
        try:
            # The socket alone: a daemon that holds the lock but has no socket yet
            # is a restart in progress, not something to wait for loudly.
            client = Client(target.socket_path)
        except DaemonUnreachable:
            continue
        backoff.reset()
        return client
