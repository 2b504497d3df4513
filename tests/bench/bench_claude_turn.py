"""One Claude Code turn through the daemon vs the same ``claude`` driven directly.

Both sides run the real CLI (bundled in ``claude-agent-sdk``) against the same fake
Messages API (``tests.peers.fake_anthropic``), in the same run:

- daemon: ``agentSession.send`` on a running session, until the client holds the
  ``turn.completed`` event (journaled, durable, fanned out);
- direct: a ``user`` frame written to a ``claude`` this process started with the
  provider's flags, until its ``result`` line.

Turns alternate between the two sides (pairs), so that load from elsewhere on the
shared machine hits both alike. The figures are medians of the turn times and of the
paired ratios and differences; the target, ``daemon <= 1.1 x direct + 20 ms``, is
checked on the median of ``daemon - 1.1 x direct`` over the pairs. Starting an agent
(spawn, initialize) is shown too, for information. Run with ``python -m tests.bench claude_turn``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
import uuid
from pathlib import Path
from typing import IO, Any

import msgspec

from agentsctl.client import Client
from agentsd.providers.claude import PROTOCOL_FLAGS
from agentsd.providers.programs import CLAUDE, find_program
from tests.daemon_process import make_temp_dir, running_daemon
from tests.peers.fake_anthropic import TextReply, running_fake_anthropic

TURNS = 15  # paired turns measured, after WARMUP_TURNS each
WARMUP_TURNS = 2  # the first turns warm the CLI's caches and the connection
STARTS = 3  # agent starts measured on each side (about a second each)
TIMEOUT_S = 60.0  # one turn or one start; the machine is shared
RATIO_TARGET = 1.1
SLACK_MS = 20.0
REPLY = TextReply("Pong: a short answer, streamed in a few pieces.", chunk_chars=12)


class DirectClaude:
    """``claude`` with the provider's flags, driven over its pipes by this process."""

    def __init__(self, program: str, env: dict[str, str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            [program, *PROTOCOL_FLAGS, "--session-id", str(uuid.uuid4())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, **env},
            cwd=cwd,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin: IO[bytes] = self.process.stdin
        self._stdout: IO[bytes] = self.process.stdout

    def _write(self, frame: dict[str, Any]) -> None:
        self._stdin.write(json.dumps(frame).encode() + b"\n")
        self._stdin.flush()

    def _read_until(self, kind: str, deadline: float) -> dict[str, Any]:
        while time.monotonic() < deadline:
            line = self._stdout.readline()
            if not line:
                raise RuntimeError("claude exited")
            frame = json.loads(line)
            if frame.get("type") == kind:
                result: dict[str, Any] = frame
                return result
        raise TimeoutError(f"no {kind} from claude within {TIMEOUT_S} s")

    def initialize(self) -> None:
        self._write(
            {"type": "control_request", "request_id": "init", "request": {"subtype": "initialize"}}
        )
        self._read_until("control_response", time.monotonic() + TIMEOUT_S)

    def turn(self, text: str) -> None:
        self._write(
            {
                "type": "user",
                "message": {"role": "user", "content": text},
                "parent_tool_use_id": None,
                "session_id": "",
                "uuid": str(uuid.uuid4()),
            }
        )
        result = self._read_until("result", time.monotonic() + TIMEOUT_S)
        if result.get("is_error"):
            raise RuntimeError(f"the direct turn failed: {result}")

    def close(self) -> None:
        self._stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class DaemonTurns:
    """One claude session in the daemon, followed over one connection."""

    def __init__(self, client: Client, env: dict[str, str], cwd: Path) -> None:
        self.client = client
        created = client.call(
            "agentSession.create", {"provider": "claude", "cwd": str(cwd), "env": env}
        )
        self.session_id: str = created["sessionId"]
        client.call("agentSession.subscribe", {"sessionId": self.session_id})

    def turn(self, text: str) -> None:
        sent = self.client.call("agentSession.send", {"sessionId": self.session_id, "text": text})
        if sent["dispatch"] != "accepted":
            raise RuntimeError(f"the daemon did not deliver the prompt: {sent}")
        deadline = time.monotonic() + TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            note = self.client.next_notification(left)
            if note is None or note.method != "agentSession.event":
                continue
            event = msgspec.json.decode(note.params)["event"]
            if event["kind"] == "turn.completed" and event["body"]["turnId"] == sent["turnId"]:
                if event["body"]["outcome"] != "completed":
                    raise RuntimeError(f"the daemon's turn failed: {event}")
                return
        raise TimeoutError(f"no turn.completed from the daemon within {TIMEOUT_S} s")


def _ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1000


def _timed(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def measure_starts(
    client: Client, program: str, env: dict[str, str], cwd: Path
) -> tuple[float, float]:
    """Median ms to a ready agent: ``agentSession.create`` (spawn, handshake, journal)
    vs spawning ``claude`` and waiting for its initialize response."""
    daemon_s, direct_s = [], []
    for _ in range(STARTS):
        started = time.perf_counter()
        created = client.call(
            "agentSession.create", {"provider": "claude", "cwd": str(cwd), "env": env}
        )
        daemon_s.append(time.perf_counter() - started)
        client.call("agentSession.delete", {"sessionId": created["sessionId"]})
        started = time.perf_counter()
        direct = DirectClaude(program, env, cwd)
        direct.initialize()
        direct_s.append(time.perf_counter() - started)
        direct.close()
    return _ms(daemon_s), _ms(direct_s)


def main() -> None:
    program = find_program(CLAUDE)
    if program is None:
        print(f"   skipped: claude is not installed ({CLAUDE.install_hint()})")
        return
    home = make_temp_dir()
    (home / "work").mkdir()
    try:
        with running_fake_anthropic(default=REPLY) as fake, running_daemon() as daemon:
            env = fake.claude_env(home)
            with Client(daemon.socket, timeout_s=TIMEOUT_S) as client:
                ours = DaemonTurns(client, env, home / "work")
                direct = DirectClaude(program, env, home / "work")
                try:
                    direct.initialize()
                    for i in range(WARMUP_TURNS):
                        ours.turn(f"warm-up {i}")
                        direct.turn(f"warm-up {i}")
                    pairs: list[tuple[float, float]] = []
                    for i in range(TURNS):
                        text = f"ping {i}"
                        if i % 2:
                            b = _timed(lambda t=text: direct.turn(t))
                            d = _timed(lambda t=text: ours.turn(t))
                        else:
                            d = _timed(lambda t=text: ours.turn(t))
                            b = _timed(lambda t=text: direct.turn(t))
                        pairs.append((d, b))
                finally:
                    direct.close()
                start_daemon_ms, start_direct_ms = measure_starts(
                    client, program, env, home / "work"
                )
    finally:
        shutil.rmtree(home, ignore_errors=True)

    d_ms = _ms([d for d, _ in pairs])
    b_ms = _ms([b for _, b in pairs])
    # Paired figures: each daemon turn against the direct turn next to it, so that a
    # burst of load elsewhere moves both sides of a difference alike.
    ratio = statistics.median(d / b for d, b in pairs)
    extra_ms = _ms([d - b for d, b in pairs])
    excess_ms = _ms([d - RATIO_TARGET * b for d, b in pairs])
    print(
        f"   turn          daemon {d_ms:7.1f} ms   direct {b_ms:7.1f} ms   "
        f"ratio {ratio:.2f}x, {extra_ms:+.1f} ms "
        f"(target <= {RATIO_TARGET}x + {SLACK_MS:.0f} ms: "
        f"{'ok' if excess_ms <= SLACK_MS else 'MISSED'}, {excess_ms:+.1f} ms past {RATIO_TARGET}x)"
    )
    print(
        f"   agent start   daemon {start_daemon_ms:7.1f} ms   direct {start_direct_ms:7.1f} ms   "
        f"ratio {start_daemon_ms / start_direct_ms:.2f}x (for information)"
    )
    print(
        f"   (medians of {TURNS} paired turns after {WARMUP_TURNS} warm-up, {STARTS} starts; "
        f"{os.cpu_count()} cpus, shared)"
    )
