"""Cold start of ``agentsctl status`` against ``python -c pass``.

Both run with the same interpreter and environment against a real daemon started
here; the figure is the median wall time over many interleaved runs. The budget is
3x the baseline (DESIGN.md: the CLI stays off trio and msgspec on this path).

Byte-code caching is switched on for the children (into a private prefix, so the tree
stays clean) whatever ``PYTHONDONTWRITEBYTECODE`` says: an installed agentsctl has
its .pyc files, and the first, caching runs are not counted.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.daemon_process import make_temp_dir, running_daemon

RUNS = 40  # per command, interleaved so drift hits both alike
WARMUP_RUNS = 3  # fill the byte-code cache
BUDGET_RATIO = 3.0


def _agentsctl() -> list[str]:
    script = Path(sys.executable).parent / "agentsctl"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "agentsctl.cli"]


def _time_once(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main() -> None:
    scratch = make_temp_dir()
    # The daemon listens where the CLI looks by default, so the measured run resolves
    # the socket path as a user's does (from $XDG_RUNTIME_DIR).
    runtime_dir = scratch / "run"
    try:
        with running_daemon(socket_path=runtime_dir / "agentsd" / "agentsd.sock"):
            env = {
                k: v
                for k, v in os.environ.items()
                if k != "PYTHONDONTWRITEBYTECODE" and not k.startswith("AGENTSD_")
            }
            env["PYTHONPYCACHEPREFIX"] = str(scratch / "pycache")
            env["XDG_RUNTIME_DIR"] = str(runtime_dir)
            commands = {
                "python -c pass": [sys.executable, "-c", "pass"],
                "import agentsctl.cli": [sys.executable, "-c", "import agentsctl.cli"],
                "agentsctl status": [*_agentsctl(), "--no-start", "status"],
                "status --format": [*_agentsctl(), "status", "--format", "{unseen} {needs}"],
            }
            for argv in commands.values():
                for _ in range(WARMUP_RUNS):
                    _time_once(argv, env)
            times: dict[str, list[float]] = {name: [] for name in commands}
            for _ in range(RUNS):
                for name, argv in commands.items():
                    times[name].append(_time_once(argv, env))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = statistics.median(times["python -c pass"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"   {name:<22} median {median * 1000:6.1f} ms  {median / base:4.2f}x  ({RUNS} runs)")
    for name in ("agentsctl status", "status --format"):  # a prompt runs the second
        ratio = statistics.median(times[name]) / base
        verdict = "within" if ratio <= BUDGET_RATIO else "OVER"
        print(
            f"   {name} / python -c pass = {ratio:.2f}x ({verdict} the {BUDGET_RATIO:.0f}x budget)"
        )
