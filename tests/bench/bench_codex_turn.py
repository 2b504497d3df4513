"""A real Codex turn through the daemon vs driving ``codex app-server`` directly.

Both sides talk to the same fake Responses API (``tests/peers/fake_openai``) on
127.0.0.1, with their own ``CODEX_HOME`` holding the same config, in the same run.
A turn is timed from the prompt leaving the client to ``turn/completed``:

- daemon: ``agentSession.send`` on one connection, until ``turn.completed`` arrives
  as an ``agentSession.event`` on a second (subscribed) connection; the daemon
  journals every event durably on the way;
- direct: ``turn/start`` written to the app-server's stdin, until its
  ``turn/completed`` line is read.

Rounds alternate which side goes first so load from elsewhere on the shared machine
hits both alike. Target: the daemon's median at most 1.1x the direct one plus 20 ms.
Run with ``python -m tests.bench codex_turn``. Nothing here asserts.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import IO, Any

from agentsctl.client import Client
from agentsd.providers.programs import CODEX, find_program
from tests.daemon_process import make_temp_dir, running_daemon
from tests.peers.fake_openai import API_KEY_ENV, FakeOpenAI, TextReply, running_fake_openai

WARMUP_TURNS = 2  # per side: first-turn costs (model metadata, shell snapshot) are not a turn's
TURNS = 15  # per side, measured; the machine is shared, so more pairs than looks needed
TURN_TIMEOUT_S = 60.0  # one turn against a local fake takes ~0.1 s
RATIO_TARGET = 1.1
OVERHEAD_TARGET_S = 0.020
REPLY = TextReply("pong " * 20, chunks=5)


class DirectCodex:
    """``codex app-server`` driven over its pipes, the way an editor plugin would."""

    def __init__(self, program: str, home: Path, cwd: Path) -> None:
        env = {**os.environ, "CODEX_HOME": str(home), API_KEY_ENV: "dummy"}
        self.process = subprocess.Popen(
            [program, "app-server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin: IO[bytes] = self.process.stdin
        self._stdout: IO[bytes] = self.process.stdout
        self._next_id = 0
        self.request("initialize", {"clientInfo": {"name": "bench", "title": None, "version": "0"}})
        self._write({"method": "initialized"})
        started = self.request(
            "thread/start",
            {"cwd": str(cwd), "approvalPolicy": "on-request", "sandbox": "workspace-write"},
        )
        self.thread_id: str = started["thread"]["id"]

    def _write(self, message: dict[str, Any]) -> None:
        self._stdin.write(json.dumps(message).encode() + b"\n")
        self._stdin.flush()

    def _read(self) -> dict[str, Any]:
        line = self._stdout.readline()
        if not line:
            raise RuntimeError("codex app-server exited")
        message: dict[str, Any] = json.loads(line)
        return message

    def request(self, method: str, params: dict[str, Any]) -> Any:
        request_id = self._next_id
        self._next_id += 1
        self._write({"id": request_id, "method": method, "params": params})
        while True:
            message = self._read()
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message["result"]

    def turn(self, text: str) -> float:
        """Seconds from turn/start to turn/completed."""
        started = time.perf_counter()
        request_id = self._next_id
        self._next_id += 1
        self._write(
            {
                "id": request_id,
                "method": "turn/start",
                "params": {
                    "threadId": self.thread_id,
                    "input": [{"type": "text", "text": text, "text_elements": []}],
                },
            }
        )
        while True:
            message = self._read()
            if message.get("method") == "turn/completed":
                status = message["params"]["turn"]["status"]
                if status != "completed":
                    raise RuntimeError(f"the direct turn ended {status}")
                return time.perf_counter() - started

    def close(self) -> None:
        self._stdin.close()  # the app-server exits on EOF
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class DaemonCodex:
    """A codex session held by a daemon, driven with the client library."""

    def __init__(self, socket: Path, home: Path, cwd: Path) -> None:
        self.client = Client(socket, timeout_s=TURN_TIMEOUT_S)
        self.follower = Client(socket, timeout_s=TURN_TIMEOUT_S)
        created = self.client.call(
            "agentSession.create",
            {
                "provider": "codex",
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
    program = find_program(CODEX)
    if program is None:
        print(f"   skipped: codex is not installed; {CODEX.install_hint()}")
        return
    base = make_temp_dir()
    direct: DirectCodex | None = None
    held: DaemonCodex | None = None
    try:
        with running_fake_openai() as fake, running_daemon() as daemon:
            fake.default = REPLY
            homes = [_home(fake, base / name) for name in ("direct-home", "daemon-home")]
            cwd = base / "work"
            cwd.mkdir()
            direct = DirectCodex(program, homes[0], cwd)
            held = DaemonCodex(daemon.socket, homes[1], cwd)
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


def _home(fake: FakeOpenAI, path: Path) -> Path:
    return fake.write_codex_home(path)


if __name__ == "__main__":
    main()
