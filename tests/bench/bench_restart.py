"""The restart in place (``agentsctl daemon restart``): how long from the request to
the new image serving, with ``SESSIONS`` live sessions.

Figures (``python -m tests.bench restart``), each next to a baseline from the same
run:

- with the holder: every agent is handed over (no close ladder), the process
  executes itself again, and the new image's recovery deals with the held agents
  (until reattach is built, it ends them: the figure includes that);
- without the holder (the baseline): every agent is ended by the close ladder
  before the exec (tiny agents that ignore stdin EOF and SIGTERM, as a stubborn
  agent would: the ladder's full length, a short one here).

Nothing here asserts: the machine is shared.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from tests.bench.bench_holder import SESSIONS, config
from tests.bench.bench_sessions import STUBBORN_TINY
from tests.bench.bench_stream import call
from tests.daemon_process import running_daemon

ROUNDS = 2
POLL_S = 0.005


def restart_to_serving(holder: bool) -> tuple[float, int]:
    """(seconds from asking for the restart to the new image answering, its
    preflight of the new code included; agents handed over)."""
    with config(holder) as path, tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        state = Path(tmp) / "state"
        with running_daemon(state_dir=state, extra_args=["--config", str(path)]) as daemon:
            params = {"provider": "mock", "cwd": "/tmp", "command": STUBBORN_TINY}
            for _ in range(SESSIONS):
                call(daemon.socket, "agentSession.create", params)
            asked = time.time()
            call(daemon.socket, "daemon.restart", {})
            replied = time.time()
            while True:
                try:
                    status = call(daemon.socket, "daemon.status", {})
                except (OSError, RuntimeError):  # not listening yet, or shutting down
                    status = None
                if status is not None and time.time() - status["uptimeS"] > replied - 0.05:
                    elapsed = time.time() - asked
                    break
                time.sleep(POLL_S)
            handed = daemon.log().count("handed over: it runs on in holder")
            return elapsed, handed


def main() -> None:
    held = [restart_to_serving(True) for _ in range(ROUNDS)]
    ended = [restart_to_serving(False) for _ in range(ROUNDS)]
    best_held = min(seconds for seconds, _ in held)
    best_ended = min(seconds for seconds, _ in ended)
    print(
        f"   restart to serving with {SESSIONS} live sessions   {best_held:.2f} s with the "
        f"holder ({held[0][1]} handed over; the new image's recovery ends them: no reattach "
        f"yet)   {best_ended:.2f} s without (each ended by the close ladder)   "
        f"ratio {best_held / best_ended:.2f}x"
    )
