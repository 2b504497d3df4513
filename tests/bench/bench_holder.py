"""The holder (config ``holder = true``): what holding agents outside the daemon costs.

Figures (``python -m tests.bench holder``), each next to a baseline from the same run:

- streaming throughput: the flooding mock agent (``bench_stream``'s flood, one
  subscriber) with its output relayed by the holder, against the same daemon
  spawning the agent itself (goal: >= 0.9x); and what reattach's bookkeeping costs
  (each commit storing the output position, only durable offsets acknowledged)
  against ``crash_policy = "end"`` (acknowledged as read); ``ROUNDS`` alternating
  rounds of each, the best and the median printed with every round's figure, the
  daemon's CPU seconds per 100,000 deltas and the holder's (its relay: on a 2-core
  machine it competes with the daemon and the agent for the CPU), and the load
  averages before and after (on a shared machine the spread is the figure's
  honesty); a round whose subscriber lagged (it missed deltas: the machine stalled
  it) is printed but not counted;
- bulk output: an agent writing ``BULK_OUTPUT_BYTES`` to stdout in 1 MiB writes, read
  through the holder against the same agent's pipe read by this process
  (``BULK_ROUNDS`` alternating rounds, medians; the relay's quiet period, which
  batches a flood of lines, must not throttle a flood of bulk writes);
- the holder's RSS per held agent with ``SESSIONS`` live sessions (tiny shell agents,
  separate processes, not counted), against the holder holding one (goal: a few
  KiB);
- restart to serving after a SIGKILL with ``SESSIONS`` live mock sessions, each in
  the middle of a slowly streamed turn: with the holder under ``crash_policy =
  "reattach"`` (the next daemon takes every agent over before it serves), against
  ``crash_policy = "end"`` and against no holder (recovery ends every agent).

Nothing here asserts: the machine is shared.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from agentsd.holder_link import open_holder_keeper
from tests.bench.bench_sessions import STUBBORN_TINY, vm_rss_kib
from tests.bench.bench_stream import FLOOD_DELTAS, call, cpu_s, flood
from tests.daemon_process import running_daemon, wait_until_serving

ROUNDS = 5
BULK_OUTPUT_BYTES = 256 << 20
BULK_ROUNDS = 3
BULK_AGENT = [
    sys.executable,
    "-c",
    "import os\n"
    "block = b'x' * (1 << 20)\n"
    f"for _ in range({BULK_OUTPUT_BYTES} >> 20):\n"
    "    os.write(1, block)\n",
]
SESSIONS = 100
THROUGHPUT_GOAL = 0.9


# Each session's turn streams for about 60 s: still running at the kill and after.
MID_STREAM = {"chunks": 600, "chunkDelayS": 0.1, "replyText": "word " * 600}


@contextmanager
def config(holder: bool, crash_policy: str = "reattach") -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        path = Path(tmp) / "config.toml"
        path.write_text(
            f"holder = {'true' if holder else 'false'}\n"
            f'crash_policy = "{crash_policy}"\n'
            "[ladder]\neof_grace_s = 0.2\nterm_grace_s = 0.2\nkill_wait_s = 1.0\n"
        )
        yield path


def throughput(holder: bool, crash_policy: str = "reattach") -> tuple[float, float, float] | None:
    """(deltas/s of one flood to one subscriber, the daemon's CPU seconds for it,
    the holder's), or None when the subscriber lagged."""
    with (
        config(holder, crash_policy) as path,
        running_daemon(extra_args=["--config", str(path)]) as daemon,
    ):
        session = call(
            daemon.socket,
            "agentSession.create",
            {"provider": "mock", "cwd": "/", "options": {"floodStdout": FLOOD_DELTAS}},
        )
        relay = holder_pid(daemon.socket, session["sessionId"]) if holder else None
        relay_cpu = cpu_s(relay) if relay is not None else 0.0
        result = flood(daemon, session["sessionId"], 1, turn=1)
        if relay is not None:
            relay_cpu = cpu_s(relay) - relay_cpu
        if result["complete"] != 1:
            return None
        return FLOOD_DELTAS / float(result["elapsed"]), float(result["cpu"]), relay_cpu


def holder_pid(daemon_socket: Path, session_id: str) -> int:
    child = call(daemon_socket, "agentSession.get", {"sessionId": session_id})["session"]["child"]
    stat = Path(f"/proc/{child['pid']}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


async def _drain(stream: trio.abc.ReceiveStream) -> int:
    total = 0
    while chunk := await stream.receive_some(1 << 20):
        total += len(chunk)
    return total


async def bulk_rates() -> tuple[list[float], list[float]]:
    """MB/s of ``BULK_AGENT``'s stdout read directly and through a holder, in
    ``BULK_ROUNDS`` alternating rounds."""
    direct: list[float] = []
    held: list[float] = []
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        async with open_holder_keeper(Path(tmp)) as keeper:
            link = await keeper.link()
            for n in range(BULK_ROUNDS):
                began = time.monotonic()
                process = await trio.lowlevel.open_process(BULK_AGENT, stdout=subprocess.PIPE)
                assert process.stdout is not None
                assert await _drain(process.stdout) == BULK_OUTPUT_BYTES
                assert await process.wait() == 0
                direct.append(BULK_OUTPUT_BYTES / 1e6 / (time.monotonic() - began))
                began = time.monotonic()
                agent = await link.spawn(f"bulk-{n}", BULK_AGENT, "/", dict(os.environ), None)
                assert await _drain(agent.stdout) == BULK_OUTPUT_BYTES
                assert await agent.wait() == 0
                await link.release(agent)
                held.append(BULK_OUTPUT_BYTES / 1e6 / (time.monotonic() - began))
    return direct, held


def held_memory() -> tuple[int, int]:
    """(holder RSS KiB holding one agent, holding ``SESSIONS + 1``)."""
    with config(True) as path, running_daemon(extra_args=["--config", str(path)]) as daemon:
        params = {"provider": "mock", "cwd": "/tmp", "command": STUBBORN_TINY}
        first = call(daemon.socket, "agentSession.create", params)["sessionId"]
        pid = holder_pid(daemon.socket, first)
        one = vm_rss_kib(pid)
        for _ in range(SESSIONS):
            call(daemon.socket, "agentSession.create", params)
        return one, vm_rss_kib(pid)


def restart_to_serving(holder: bool, crash_policy: str = "reattach") -> tuple[float, int]:
    """Seconds from the SIGKILL of a daemon with ``SESSIONS`` live sessions, each
    streaming a turn, to the next one serving on the same state directory; and how
    many agents it reattached."""
    with (
        config(holder, crash_policy) as path,
        tempfile.TemporaryDirectory(dir="/tmp") as tmp,
    ):
        state = Path(tmp) / "state"
        args = ["--config", str(path)]
        params = {"provider": "mock", "cwd": "/tmp", "options": MID_STREAM}
        with running_daemon(state_dir=state, extra_args=args) as first:
            for _ in range(SESSIONS):
                sid = call(first.socket, "agentSession.create", params)["sessionId"]
                call(first.socket, "agentSession.send", {"sessionId": sid, "text": "go on"})
            first.process.send_signal(signal.SIGKILL)
            first.wait()
            killed = time.monotonic()
        with running_daemon(state_dir=state, extra_args=args) as second:
            wait_until_serving(second)
            elapsed = time.monotonic() - killed
            recovery = call(second.socket, "daemon.status", {})["recovery"]
            return elapsed, int(recovery["reattached"])


def _figures(
    runs: list[tuple[float, float, float] | None],
) -> tuple[float, float, float, float, str]:
    """(best deltas/s, median deltas/s, median daemon CPU s, median holder CPU s,
    every round's deltas/s) of the rounds whose subscriber did not lag."""
    counted = [run for run in runs if run is not None] or [(math.nan, math.nan, math.nan)]
    rates = [rate for rate, _, _ in counted]
    every = ", ".join("lagged" if run is None else f"{run[0]:.0f}" for run in runs)
    return (
        max(rates),
        statistics.median(rates),
        statistics.median(cpu for _, cpu, _ in counted),
        statistics.median(relay for _, _, relay in counted),
        every,
    )


def main() -> None:
    load_before = os.getloadavg()
    direct, held, ended = [], [], []
    for _ in range(ROUNDS):
        direct.append(throughput(False))
        held.append(throughput(True))
        ended.append(throughput(True, "end"))
    load_after = os.getloadavg()
    d_best, d_median, d_cpu, _, d_every = _figures(direct)
    h_best, h_median, h_cpu, h_relay, h_every = _figures(held)
    e_best, e_median, e_cpu, e_relay, e_every = _figures(ended)
    print(
        f"   load averages {load_before[0]:.1f} {load_before[1]:.1f} before, "
        f"{load_after[0]:.1f} {load_after[1]:.1f} after ({ROUNDS} alternating rounds)"
    )
    per_100k = 100_000 / FLOOD_DELTAS
    for name, best, median, cpu, relay, every in (
        ("direct", d_best, d_median, d_cpu, None, d_every),
        ("through the holder (reattach)", h_best, h_median, h_cpu, h_relay, h_every),
        ("through the holder (end)", e_best, e_median, e_cpu, e_relay, e_every),
    ):
        holder_cpu = "" if relay is None else f", holder {relay * per_100k:.2f} s"
        print(
            f"   streaming {name:30} best {best:7.0f}  median {median:7.0f} deltas/s  "
            f"CPU per 100k deltas: daemon {cpu * per_100k:.2f} s{holder_cpu}  ({every})"
        )
    print(
        f"   ratio through the holder / direct   best {h_best / d_best:.2f}x  median "
        f"{h_median / d_median:.2f}x (goal >= {THROUGHPUT_GOAL}x)"
    )
    print(
        f"   reattach's bookkeeping (reattach / end)   best {h_best / e_best:.2f}x  "
        f"median {h_median / e_median:.2f}x"
    )
    bulk_direct, bulk_held = trio.run(bulk_rates)
    print(
        f"   bulk stdout ({BULK_OUTPUT_BYTES >> 20} MiB)  direct median "
        f"{statistics.median(bulk_direct):.0f} MB/s, through the holder "
        f"{statistics.median(bulk_held):.0f} MB/s: "
        f"{statistics.median(bulk_held) / statistics.median(bulk_direct):.2f}x  "
        f"(direct {', '.join(f'{r:.0f}' for r in bulk_direct)}; "
        f"held {', '.join(f'{r:.0f}' for r in bulk_held)})"
    )
    one, many = held_memory()
    print(
        f"   holder RSS      {one} KiB holding 1 agent, {many} KiB holding {SESSIONS + 1}: "
        f"{(many - one) / SESSIONS:.1f} KiB per agent"
    )
    reattach, taken = restart_to_serving(True, "reattach")
    end, _ = restart_to_serving(True, "end")
    without, _ = restart_to_serving(False)
    print(
        f"   SIGKILL to serving with {SESSIONS} sessions mid-stream   {reattach:.2f} s "
        f"reattaching ({taken} taken over)   {end:.2f} s ending them (crash_policy end)   "
        f"{without:.2f} s without the holder"
    )
