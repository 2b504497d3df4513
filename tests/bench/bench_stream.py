"""Streaming: a flooding mock agent fanned out to subscribers, and catch-up.

Figures (``python -m tests.bench stream``), each next to a baseline measured in the
same run:

- the mock emits ``FLOOD_DELTAS`` one-character deltas (``floodStdout``): end-to-end
  deltas/s to one subscriber, against the same agent read straight from its pipe;
- the same flood to ``SUBSCRIBERS`` subscribers (deltas/s per subscriber and in
  total, and how many of them lagged);
- daemon CPU (``/proc/<pid>/stat`` utime + stime) per delta read and per delta
  delivered;
- catch-up: events/s delivered to a subscriber resubscribing from seq 0 on a session
  of ``CATCH_UP_EVENTS`` events, against reading the same rows from SQLite directly
  (the daemon's query and page bounds, nothing built per row); the best of
  ``CATCH_UP_ROUNDS`` alternating rounds of each.

Subscribers are raw sockets that count frames without decoding them, so the client
costs far less than the daemon per delta. Nothing here asserts.
"""

from __future__ import annotations

import os
import selectors
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from agentsd.feed import CATCH_UP_PAGE_BYTES, CATCH_UP_PAGE_EVENTS
from agentsd.store.database import StoreConnection
from agentsd.store.journal import append_events, read_event_rows
from tests.daemon_process import DaemonProcess, running_daemon

FLOOD_DELTAS = 100_000
SUBSCRIBERS = 50
CATCH_UP_EVENTS = 100_000
CATCH_UP_ROUNDS = 3
IO_TIMEOUT_S = 120.0  # the whole flood to one set of subscribers
CLK_TCK = os.sysconf("SC_CLK_TCK")

DELTA = b'"method":"agentSession.delta"'
EVENT = b'"method":"agentSession.event"'
LAGGED = b'"method":"agentSession.lagged"'
TURN_COMPLETED = b'"kind":"turn.completed"'

_encoder = msgspec.json.Encoder()


def cpu_s(pid: int) -> float:
    """User + system CPU of ``pid`` so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def request(method: str, params: dict[str, Any], request_id: int = 1) -> bytes:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return _encoder.encode(message) + b"\n"


def call(path: Path, method: str, params: dict[str, Any]) -> Any:
    """One request on a fresh connection; the result."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(IO_TIMEOUT_S)
        sock.connect(str(path))
        sock.sendall(request(method, params))
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the daemon closed the connection")
            buf += chunk
    reply = msgspec.json.decode(buf)
    if "error" in reply:
        raise RuntimeError(f"{method}: {reply['error']}")
    return reply["result"]


class Subscriber:
    """A raw subscription that counts notifications by scanning complete lines.

    ``streaming`` False (catch-up) counts events and lag only: each scan of the
    received bytes costs this client about as much per event as SQLite's read costs
    the daemon, so scans for deltas that cannot come would time the client."""

    def __init__(
        self, path: Path, session_id: str, after_seq: int | None = None, *, streaming: bool = True
    ) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(IO_TIMEOUT_S)
        self.sock.connect(str(path))
        params: dict[str, Any] = {"sessionId": session_id}
        if after_seq is not None:
            params["afterSeq"] = after_seq
        self.sock.sendall(request("agentSession.subscribe", params))
        self.streaming = streaming
        self.buf = b""
        self.deltas = 0
        self.events = 0
        self.lagged = False
        self.turns_done = 0
        self.done_at = 0.0

    def feed(self, data: bytes) -> None:
        self.buf += data
        cut = self.buf.rfind(b"\n") + 1
        if not cut:
            return
        complete, self.buf = self.buf[:cut], self.buf[cut:]
        self.events += complete.count(EVENT)
        self.lagged = self.lagged or LAGGED in complete
        if self.streaming:
            self.deltas += complete.count(DELTA)
            self.turns_done += complete.count(TURN_COMPLETED)

    def close(self) -> None:
        self.sock.close()


def follow(subscribers: list[Subscriber], finished: Any) -> None:
    """Read every subscriber until ``finished(subscriber)`` holds for each (or it
    lagged); records when each finished."""
    selector = selectors.DefaultSelector()
    pending = set(subscribers)
    for sub in subscribers:
        selector.register(sub.sock, selectors.EVENT_READ, sub)
    deadline = time.monotonic() + IO_TIMEOUT_S
    try:
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} subscribers did not finish")
            for key, _ in selector.select(timeout=1.0):
                sub = key.data
                data = sub.sock.recv(1 << 20)
                if not data:
                    raise ConnectionError("the daemon closed a subscription's connection")
                sub.feed(data)
                if sub in pending and (finished(sub) or sub.lagged):
                    sub.done_at = time.monotonic()
                    pending.discard(sub)
                    selector.unregister(sub.sock)
    finally:
        selector.close()


def flood(daemon: DaemonProcess, session_id: str, subscribers: int, turn: int) -> dict[str, Any]:
    """Send one prompt to the flooding session; follow it on ``subscribers``."""
    subs = [Subscriber(daemon.socket, session_id) for _ in range(subscribers)]
    try:
        # The subscribe replies arrive first: the subscriptions are live before the send.
        for sub in subs:
            while b"\n" not in sub.buf:
                sub.buf += sub.sock.recv(65536)
            sub.buf = sub.buf[sub.buf.index(b"\n") + 1 :]
        pid = daemon.process.pid
        cpu_before = cpu_s(pid)
        started = time.monotonic()
        call(daemon.socket, "agentSession.send", {"sessionId": session_id, "text": f"turn {turn}"})
        follow(subs, lambda s: s.turns_done >= 1)
        elapsed = max(s.done_at for s in subs) - started
        cpu = cpu_s(pid) - cpu_before
        return {
            "elapsed": elapsed,
            "cpu": cpu,
            "delivered": sum(s.deltas for s in subs),
            "lagged": sum(1 for s in subs if s.lagged),
            "complete": sum(1 for s in subs if s.deltas >= FLOOD_DELTAS),
        }
    finally:
        for sub in subs:
            sub.close()


def bare_agent_s() -> float:
    """The mock agent alone: handshake, one prompt, its flood read straight from the
    pipe until ``turn_completed``."""
    env = {**os.environ, "AGENTSD_MOCK_OPTIONS": f'{{"floodStdout": {FLOOD_DELTAS}}}'}
    process = subprocess.Popen(
        [sys.executable, "-m", "agentsd.providers.mock_agent"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write(b'{"type":"initialize","handle":null}\n')
        process.stdin.flush()
        process.stdout.readline()
        started = time.monotonic()
        process.stdin.write(b'{"type":"prompt","id":"p","text":"turn"}\n')
        process.stdin.flush()
        fd = process.stdout.fileno()
        tail = b""
        while b'"turn_completed"' not in tail:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise ConnectionError("the mock agent exited")
            tail = tail[-64:] + chunk
        return time.monotonic() - started
    finally:
        process.stdin.close()
        process.wait(timeout=10)


def build_journal(daemon: DaemonProcess, session_id: str) -> None:
    """Append ``CATCH_UP_EVENTS`` events to a stopped daemon's session, as its
    journal would hold them (contiguous seqs, bodies like an agent message's)."""
    conn = sqlite3.connect(
        daemon.state_dir / "agentsd.db", isolation_level=None, factory=StoreConnection
    )
    try:
        body = msgspec.json.encode(
            {"itemId": "t1-message", "turnId": "t1", "type": "agentMessage", "text": "x" * 64}
        )
        conn.execute("BEGIN IMMEDIATE")
        append_events(conn, session_id, 0, [("item.completed", body)] * CATCH_UP_EVENTS, 0.0)
        conn.execute("COMMIT")
    finally:
        conn.close()


def sqlite_read_s(db: Path, session_id: str) -> tuple[float, int]:
    """The baseline of catch-up: page through the same rows from SQLite directly,
    with the daemon's query and page bounds, building nothing per row (the rows as
    the ``sqlite3`` module returns them: what SQLite alone costs)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        started = time.monotonic()
        after, count = 0, 0
        while True:
            page, more = read_event_rows(
                conn,
                session_id,
                after_seq=after,
                limit=CATCH_UP_PAGE_EVENTS,
                max_bytes=CATCH_UP_PAGE_BYTES,
            )
            count += len(page)
            if not page or not more:
                return time.monotonic() - started, count
            after = page[-1][0]
    finally:
        conn.close()


def catch_up() -> tuple[float, float, int]:
    """(daemon events/s, SQLite events/s, events) for a resubscribe from seq 0: the
    best of ``CATCH_UP_ROUNDS`` rounds each, alternating, as the least disturbed
    rounds on a shared machine."""
    with running_daemon() as first:
        session = call(
            first.socket, "agentSession.create", {"provider": "mock", "cwd": "/", "start": False}
        )
        session_id = session["sessionId"]
        state = first.state_dir
        first.stop()
        build_journal(first, session_id)
        with running_daemon(state_dir=state) as daemon:
            head = call(daemon.socket, "agentSession.get", {"sessionId": session_id})["session"][
                "headSeq"
            ]
            daemon_s, base_s = [], []
            for _ in range(CATCH_UP_ROUNDS):
                sub = Subscriber(daemon.socket, session_id, after_seq=0, streaming=False)
                try:
                    started = time.monotonic()
                    follow([sub], lambda s: s.events >= head)
                    daemon_s.append(sub.done_at - started)
                finally:
                    sub.close()
                seconds, count = sqlite_read_s(state / "agentsd.db", session_id)
                assert count == head
                base_s.append(seconds)
    return head / min(daemon_s), head / min(base_s), head


def main() -> None:
    bare_s = bare_agent_s()
    with running_daemon() as daemon:
        session = call(
            daemon.socket,
            "agentSession.create",
            {"provider": "mock", "cwd": "/", "options": {"floodStdout": FLOOD_DELTAS}},
        )
        session_id = session["sessionId"]
        one = flood(daemon, session_id, 1, turn=1)
        many = flood(daemon, session_id, SUBSCRIBERS, turn=2)
    catch_up_rate, sqlite_rate, events = catch_up()

    bare_rate = FLOOD_DELTAS / bare_s
    one_rate = FLOOD_DELTAS / one["elapsed"]
    print(
        f"   1 subscriber    {one_rate:9.0f} deltas/s   agent alone {bare_rate:9.0f} deltas/s   "
        f"ratio {one_rate / bare_rate:.2f}x   ({one['lagged']} lagged)"
    )
    many_total = many["delivered"] / many["elapsed"]
    print(
        f"   {SUBSCRIBERS} subscribers  {many_total / SUBSCRIBERS:9.0f} deltas/s each, "
        f"{many_total:.0f} in all   ratio to 1 subscriber {many_total / one_rate:.2f}x   "
        f"({many['complete']} got every delta, {many['lagged']} lagged)"
    )
    print(
        f"   daemon CPU      {one['cpu'] / FLOOD_DELTAS * 1e6:6.1f} us per delta "
        f"(1 subscriber)   "
        f"{many['cpu'] / max(1, many['delivered']) * 1e6:6.1f} us per delivered delta "
        f"({SUBSCRIBERS} subscribers)"
    )
    print(
        f"   catch-up        {catch_up_rate:9.0f} events/s from seq 0 of {events}   "
        f"SQLite alone {sqlite_rate:9.0f} events/s   ratio {catch_up_rate / sqlite_rate:.2f}x"
        " (goal >= 0.5x)"
    )
    print(f"   ({FLOOD_DELTAS} deltas per turn; {os.cpu_count()} cpus, shared)")
