"""A real ACP agent's turn through the daemon vs driving the agent directly over ACP.

The agent is ``codex-acp`` (pinned in tests/agents), both sides against the same
fake Responses API (``tests/peers/fake_openai``) on 127.0.0.1, each with its own
``CODEX_HOME`` holding the same config, in the same run. A turn is timed from the
prompt leaving the client to the turn's end:

- daemon: ``agentSession.send`` on one connection, until ``turn.completed`` arrives
  as an ``agentSession.event`` on a second (subscribed) connection; the daemon
  journals every update durably on the way;
- direct: ``session/prompt`` written to the agent's stdin, until its response (the
  stop reason) is read.

Rounds alternate which side goes first so load from elsewhere on the shared machine
hits both alike. Target: the daemon's median at most 1.1x the direct one plus 20 ms.
Run with ``python -m tests.bench acp_turn``. Nothing here asserts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import IO, Any

from agentsctl.client import Client
from tests.daemon_process import make_temp_dir
from tests.peers.acp_peer import acp_daemon
from tests.peers.fake_openai import API_KEY_ENV, TextReply, running_fake_openai

BINARY = Path(__file__).parents[1] / "agents" / "node_modules" / "codex-acp-0.16.0" / "bin"
COMMAND = [str(BINARY / "codex-acp.js")]
WARMUP_TURNS = 2  # per side: first-turn costs (model metadata, shell snapshot) are not a turn's
TURNS = 15  # per side, measured; the machine is shared, so more pairs than looks needed
TURN_TIMEOUT_S = 60.0  # one turn against a local fake takes ~0.1 s
RATIO_TARGET = 1.1
OVERHEAD_TARGET_S = 0.020
REPLY = TextReply("pong " * 20, chunks=5)


class DirectAgent:
    """The ACP agent driven over its pipes, the way an editor would."""

    def __init__(self, home: Path, cwd: Path) -> None:
        env = {**os.environ, "CODEX_HOME": str(home), API_KEY_ENV: "dummy"}
        self.process = subprocess.Popen(
            COMMAND,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            # codex-acp is a node wrapper around a native binary, which outlives the
            # wrapper's exit: the group is ended at close.
            start_new_session=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin: IO[bytes] = self.process.stdin
        self._stdout: IO[bytes] = self.process.stdout
        self._next_id = 0
        self.request(
            "initialize",
            {
                "protocolVersion": 1,
                "clientCapabilities": {
                    "fs": {"readTextFile": False, "writeTextFile": False},
                    "terminal": False,
                },
            },
        )
        self.session_id: str = self.request("session/new", {"cwd": str(cwd), "mcpServers": []})[
            "sessionId"
        ]

    def request(self, method: str, params: dict[str, Any]) -> Any:
        request_id = self._next_id
        self._next_id += 1
        line = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        self._stdin.write(json.dumps(line).encode() + b"\n")
        self._stdin.flush()
        while True:
            raw = self._stdout.readline()
            if not raw:
                raise RuntimeError("the ACP agent exited")
            message: dict[str, Any] = json.loads(raw)
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message["result"]

    def turn(self, text: str) -> float:
        """Seconds from session/prompt to its response."""
        started = time.perf_counter()
        result = self.request(
            "session/prompt",
            {"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]},
        )
        if result.get("stopReason") != "end_turn":
            raise RuntimeError(f"the direct turn ended {result}")
        return time.perf_counter() - started

    def close(self) -> None:
        self._stdin.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


class DaemonAgent:
    """A session of the same agent held by a daemon, driven with the client library."""

    def __init__(self, socket: Path, home: Path, cwd: Path) -> None:
        self.client = Client(socket, timeout_s=TURN_TIMEOUT_S)
        self.follower = Client(socket, timeout_s=TURN_TIMEOUT_S)
        created = self.client.call(
            "agentSession.create",
            {
                "provider": "codex-acp",
                "cwd": str(cwd),
                "env": {"CODEX_HOME": str(home), API_KEY_ENV: "dummy"},
            },
        )
        self.session_id: str = created["sessionId"]
        self.follower.call("agentSession.subscribe", {"sessionId": self.session_id})

    def turn(self, text: str) -> float:
        """Seconds from agentSession.send to the turn.completed event."""
        started = time.perf_counter()
        sent = self.client.call("agentSession.send", {"sessionId": self.session_id, "text": text})
        if sent["dispatch"] != "accepted":
            raise RuntimeError(f"the daemon did not deliver the prompt: {sent}")
        deadline = time.monotonic() + TURN_TIMEOUT_S
        while True:
            notification = self.follower.next_notification(max(0.0, deadline - time.monotonic()))
            if notification is None:
                raise RuntimeError("no turn.completed from the daemon in time")
            if notification.method != "agentSession.event":
                continue
            event = notification.decode(dict[str, Any])["event"]
            if event["kind"] == "turn.completed" and event["body"]["turnId"] == sent["turnId"]:
                if event["body"]["outcome"] != "completed":
                    raise RuntimeError(f"the daemon's turn ended {event['body']}")
                return time.perf_counter() - started

    def close(self) -> None:
        self.client.call("agentSession.close", {"sessionId": self.session_id})
        self.client.close()
        self.follower.close()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f} ms"


def main() -> None:
    if not Path(COMMAND[0]).exists():
        print("   skipped: codex-acp is not installed (make test installs it)")
        return
    base = make_temp_dir()
    direct: DirectAgent | None = None
    held: DaemonAgent | None = None
    try:
        with running_fake_openai() as fake, acp_daemon(base, "codex-acp", COMMAND, {}) as daemon:
            fake.default = REPLY
            homes = [fake.write_codex_home(base / name) for name in ("direct-home", "daemon-home")]
            cwd = base / "work"
            cwd.mkdir()
            direct = DirectAgent(homes[0], cwd)
            held = DaemonAgent(daemon.socket, homes[1], cwd)
            for i in range(WARMUP_TURNS):
                direct.turn(f"warm up {i}")
                held.turn(f"warm up {i}")
            ours: list[float] = []
            theirs: list[float] = []
            for i in range(TURNS):
                if i % 2:
                    theirs.append(direct.turn(f"turn {i}"))
                    ours.append(held.turn(f"turn {i}"))
                else:
                    ours.append(held.turn(f"turn {i}"))
                    theirs.append(direct.turn(f"turn {i}"))
            held.close()
            held = None
    finally:
        if direct is not None:
            direct.close()
        if held is not None:
            held.client.close()
            held.follower.close()
        shutil.rmtree(base, ignore_errors=True)

    d50, b50 = statistics.median(ours), statistics.median(theirs)
    paired_overhead = statistics.median(d - b for d, b in zip(ours, theirs, strict=True))
    budget = RATIO_TARGET * b50 + OVERHEAD_TARGET_S
    print(f"   daemon turn  median {_ms(d50)}   min {_ms(min(ours))}   max {_ms(max(ours))}")
    print(f"   direct turn  median {_ms(b50)}   min {_ms(min(theirs))}   max {_ms(max(theirs))}")
    print(
        f"   ratio {d50 / b50:.2f}x, overhead {_ms(d50 - b50)} (paired median {_ms(paired_overhead)}) "
        f"target <= {RATIO_TARGET}x + {OVERHEAD_TARGET_S * 1000:.0f} ms = {_ms(budget)}: "
        f"{'ok' if d50 <= budget else 'MISSED'}"
    )
    print(
        f"   ({TURNS} turns per side after {WARMUP_TURNS} warm-up; {os.cpu_count()} cpus, shared)"
    )


if __name__ == "__main__":
    main()
