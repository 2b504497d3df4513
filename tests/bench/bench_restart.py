"""The restart in place (``agentsctl daemon restart``): how long from the request to
the new image serving, with ``SESSIONS`` live mock sessions, each in the middle of
a slowly streamed turn (``bench_holder.MID_STREAM``).

Figures (``python -m tests.bench restart``), each next to a baseline from the same
run:

- with the holder (``crash_policy = "reattach"``): every agent is handed over (no
  close ladder), the process executes itself again, and the new image takes every
  agent over before it serves (the figure includes that; how many it took over is
  printed, from its recovery report);
- without the holder (the baseline): every agent is ended by the close ladder
  before the exec (the mock agent ends at stdin EOF), its turn cut off.

Nothing here asserts: the machine is shared.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from tests.bench.bench_holder import MID_STREAM, SESSIONS, config
from tests.bench.bench_stream import call
from tests.daemon_process import running_daemon

ROUNDS = 2
POLL_S = 0.005


def restart_to_serving(holder: bool) -> tuple[float, int, int]:
    """(seconds from asking for the restart to the new image answering, its
    preflight of the new code included; agents handed over; agents the new image
    reattached)."""
    with config(holder) as path, tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        state = Path(tmp) / "state"
        with running_daemon(state_dir=state, extra_args=["--config", str(path)]) as daemon:
            params = {"provider": "mock", "cwd": "/tmp", "options": MID_STREAM}
            for _ in range(SESSIONS):
                sid = call(daemon.socket, "agentSession.create", params)["sessionId"]
                call(daemon.socket, "agentSession.send", {"sessionId": sid, "text": "go on"})
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
            return elapsed, handed, int(status["recovery"]["reattached"])


def main() -> None:
    load_before = os.getloadavg()
    held = [restart_to_serving(True) for _ in range(ROUNDS)]
    ended = [restart_to_serving(False) for _ in range(ROUNDS)]
    load_after = os.getloadavg()
    best_held = min(seconds for seconds, _, _ in held)
    best_ended = min(seconds for seconds, _, _ in ended)
    every_held = ", ".join(f"{s:.2f} s ({h} handed over, {r} reattached)" for s, h, r in held)
    every_ended = ", ".join(f"{s:.2f} s" for s, _, _ in ended)
    print(
        f"   load averages {load_before[0]:.1f} {load_before[1]:.1f} before, "
        f"{load_after[0]:.1f} {load_after[1]:.1f} after"
    )
    print(
        f"   restart to serving with {SESSIONS} sessions mid-stream   best {best_held:.2f} s "
        f"with the holder, reattaching them ({every_held})   best {best_ended:.2f} s without "
        f"(each ended by the close ladder: {every_ended})   ratio {best_held / best_ended:.2f}x"
    )
