"""Shared fixtures and helpers for the peer tests: real agent CLIs driven through a
real daemon's socket, against fake model servers on 127.0.0.1.

Provider-specific fixtures (a fake model server, the agent's config directory) live
in each provider's test module; what is here is the daemon side they share.

Every wait is bounded by a ``Deadline`` owned by the test, so a stuck agent fails
the test with what was seen so far instead of hanging it; nothing sleeps to let
things settle.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsctl.client import Client
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon
from tests.peers.fake_openai import API_KEY_ENV, FakeOpenAI, running_fake_openai

TEST_TIMEOUT_S = 90.0  # one peer test: a few real agent turns on a shared 2-core machine
CALL_TIMEOUT_S = 45.0  # one daemon call; a send waits for the agent's acknowledgement


class Deadline:
    """The time budget of one test."""

    def __init__(self, total_s: float = TEST_TIMEOUT_S) -> None:
        self.total_s = total_s
        self.ends = time.monotonic() + total_s

    def remaining(self) -> float:
        """Seconds left; ``TimeoutError`` once the budget is spent."""
        left = self.ends - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the test ran past its {self.total_s:g} s budget")
        return left

    def poll(self, check: Callable[[], bool], what: str, interval_s: float = 0.02) -> None:
        """Return once ``check()`` holds; ``TimeoutError`` naming ``what`` otherwise."""
        while not check():
            if time.monotonic() >= self.ends:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(interval_s)


class Follower:
    """A subscription to one session's journal (from seq 0) and streamed deltas,
    on its own connection. ``events`` and ``deltas`` keep everything seen, in order.
    """

    def __init__(self, daemon: DaemonProcess, session_id: str, deadline: Deadline) -> None:
        self.client = Client(daemon.socket, timeout_s=CALL_TIMEOUT_S)
        self.session_id = session_id
        self.deadline = deadline
        self.events: list[dict[str, Any]] = []  # {seq, ts, fence, kind, body}
        self.deltas: list[dict[str, Any]] = []  # {itemId, offset, text, afterSeq, ...}
        self.client.call("agentSession.subscribe", {"sessionId": session_id, "afterSeq": 0})

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _pump(self) -> None:
        notification = self.client.next_notification(min(1.0, self.deadline.remaining()))
        if notification is None:
            return
        params = notification.decode(dict[str, Any])
        if notification.method == "agentSession.event":
            self.events.append(params["event"])
        elif notification.method == "agentSession.delta":
            self.deltas.append(params)
        elif notification.method == "agentSession.lagged":
            raise AssertionError(f"the subscription lagged: {params}")

    def wait_for(
        self, kind: str, where: Callable[[dict[str, Any]], bool] = lambda body: True
    ) -> dict[str, Any]:
        """The first event (seen before or arriving now) of ``kind`` whose body
        satisfies ``where``; ``TimeoutError`` listing what was seen otherwise."""
        checked = 0
        while True:
            for event in self.events[checked:]:
                if event["kind"] == kind and where(event["body"]):
                    return event
            checked = len(self.events)
            try:
                self._pump()
            except TimeoutError:
                seen = [(e["seq"], e["kind"]) for e in self.events]
                raise TimeoutError(f"no {kind} event; saw {seen}") from None

    def wait_for_delta(self, item_id: str | None = None) -> dict[str, Any]:
        """The first streamed delta (of ``item_id``, if given) seen before or arriving now."""
        while True:
            for delta in self.deltas:
                if item_id is None or delta["itemId"] == item_id:
                    return delta
            try:
                self._pump()
            except TimeoutError:
                raise TimeoutError(f"no delta; saw events {self.kinds()}") from None

    def kinds(self) -> list[str]:
        return [e["kind"] for e in self.events]

    def streamed_text(self, item_id: str) -> str:
        """The text streamed for ``item_id``, reassembled by offset."""
        text = ""
        for delta in self.deltas:
            if delta["itemId"] == item_id and delta["offset"] == len(text):
                text += delta["text"]
        return text


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A fresh working directory for an agent session."""
    path = make_temp_dir()
    (path / "work").mkdir()
    try:
        yield path / "work"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def peer_daemon() -> Iterator[DaemonProcess]:
    """One daemon for a module's peer tests (each test makes its own sessions)."""
    with running_daemon() as daemon:
        yield daemon


@pytest.fixture
def deadline() -> Deadline:
    return Deadline()


@pytest.fixture
def client(peer_daemon: DaemonProcess) -> Iterator[Client]:
    with Client(peer_daemon.socket, timeout_s=CALL_TIMEOUT_S) as c:
        yield c


def processes_with_env(name: str, value: str) -> list[int]:
    """Pids of live processes (not zombies) whose environment has ``name=value``:
    an agent and everything it started (they inherit its environment)."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        state = stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3]
        if needle in environ.split(b"\0") and state != b"Z":
            found.append(int(entry))
    return found


# The fake OpenAI server of the Codex-speaking peers (codex app-server, codex-acp);
# a module of another provider defines its own ``fake``.
@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with running_fake_openai() as server:
        yield server


# Codex's home for the Codex-speaking peers (codex app-server, codex-acp), pointed at
# the module's own ``fake`` OpenAI server.
@pytest.fixture
def codex_home(fake: FakeOpenAI) -> Iterator[Path]:
    base = make_temp_dir()
    try:
        yield fake.write_codex_home(base / "codex-home")
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def codex_env(codex_home: Path) -> dict[str, str]:
    return {"CODEX_HOME": str(codex_home), API_KEY_ENV: "dummy"}
