"""What the turn benchmarks of ``bench_codex_turn`` and ``bench_acp_turn`` share: a
session held by a daemon, driven with the client library; the measurement, in
rounds that alternate which side goes first (so load from elsewhere on the shared
machine hits both alike); and the report against the target (the daemon's median at
most 1.1x the direct one plus 20 ms). Each benchmark brings its direct side: an
object whose ``turn(text)`` returns the seconds one turn took.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from agentsctl.client import Client
from tests.peers.fake_openai import API_KEY_ENV, FakeOpenAI, TextReply

WARMUP_TURNS = 2  # per side: first-turn costs (model metadata, shell snapshot) are not a turn's
TURNS = 15  # per side, measured; the machine is shared, so more pairs than looks needed
TURN_TIMEOUT_S = 60.0  # one turn against a local fake takes ~0.1 s
RATIO_TARGET = 1.1
OVERHEAD_TARGET_S = 0.020
REPLY = TextReply("pong " * 20, chunks=5)


class Side(Protocol):
    def turn(self, text: str) -> float:
        """Seconds from the prompt leaving the client to the turn's end."""
        ...


class Direct(Side, Protocol):
    def close(self) -> None:
        """End the agent (and whatever it started)."""
        ...


class PipedAgent:
    """A Codex-speaking agent driven over its pipes in JSON lines, the way an editor
    would: started in ``cwd`` with its own ``CODEX_HOME``, in a process group of its
    own (ended whole at ``close``: a node wrapper's native child outlives it)."""

    name = "the agent"
    jsonrpc = False  # whether requests carry ``"jsonrpc": "2.0"``

    def __init__(self, argv: Sequence[str], home: Path, cwd: Path) -> None:
        env = {**os.environ, "CODEX_HOME": str(home), API_KEY_ENV: "dummy"}
        self.process = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._stdin: IO[bytes] = self.process.stdin
        self._stdout: IO[bytes] = self.process.stdout
        self._next_id = 0

    def write(self, message: dict[str, Any]) -> None:
        if self.jsonrpc:
            message = {"jsonrpc": "2.0", **message}
        self._stdin.write(json.dumps(message).encode() + b"\n")
        self._stdin.flush()

    def read(self) -> dict[str, Any]:
        line = self._stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited")
        message: dict[str, Any] = json.loads(line)
        return message

    def send_request(self, method: str, params: dict[str, Any]) -> int:
        """Write a request; its id."""
        request_id = self._next_id
        self._next_id += 1
        self.write({"id": request_id, "method": method, "params": params})
        return request_id

    def request(self, method: str, params: dict[str, Any]) -> Any:
        """Write a request and read until its result (what comes first is dropped)."""
        request_id = self.send_request(method, params)
        while True:
            message = self.read()
            if message.get("id") == request_id and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message["result"]

    def close(self) -> None:
        self._stdin.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


class DaemonSession:
    """A session of ``provider`` held by a daemon: ``agentSession.send`` on one
    connection, until ``turn.completed`` arrives as an ``agentSession.event`` on a
    second (subscribed) one; the daemon journals every event durably on the way."""

    def __init__(self, socket: Path, provider: str, cwd: Path, env: Mapping[str, str]) -> None:
        self.client = Client(socket, timeout_s=TURN_TIMEOUT_S)
        self.follower = Client(socket, timeout_s=TURN_TIMEOUT_S)
        created = self.client.call(
            "agentSession.create", {"provider": provider, "cwd": str(cwd), "env": dict(env)}
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
        """Close the session, then the connections."""
        self.client.call("agentSession.close", {"sessionId": self.session_id})
        self.disconnect()

    def disconnect(self) -> None:
        self.client.close()
        self.follower.close()


def measure(held: Side, direct: Side) -> tuple[list[float], list[float]]:
    """(daemon seconds, direct seconds) of ``TURNS`` turns each after the warm-up."""
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
    return ours, theirs


def codex_turns(
    fake: FakeOpenAI,
    socket: Path,
    provider: str,
    base: Path,
    open_direct: Callable[[Path, Path], Direct],
) -> tuple[list[float], list[float]]:
    """``measure`` a daemon session of ``provider`` against ``open_direct(home, cwd)``,
    both Codex-speaking agents in ``cwd`` under ``base``, each with its own
    ``CODEX_HOME`` pointing at ``fake`` (which answers ``REPLY``)."""
    fake.default = REPLY
    homes = [fake.write_codex_home(base / name) for name in ("direct-home", "daemon-home")]
    cwd = base / "work"
    cwd.mkdir()
    direct = open_direct(homes[0], cwd)
    try:
        env = {"CODEX_HOME": str(homes[1]), API_KEY_ENV: "dummy"}
        held = DaemonSession(socket, provider, cwd, env)
        try:
            ours, theirs = measure(held, direct)
        except BaseException:
            held.disconnect()
            raise
        held.close()
    finally:
        direct.close()
    return ours, theirs


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:7.1f} ms"


def report(ours: list[float], theirs: list[float]) -> None:
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
