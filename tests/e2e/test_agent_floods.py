"""An agent that floods (issue 18, Build 2), through a real daemon with the
reliability harness's control probe running: hundreds of MiB on stderr and a line
past the frame bound on stdout. The daemon keeps answering, the agent's stderr log
stays within its cap, and its session ends with one error, never a loop of them.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from agentsd.providers.base import MAX_LINE_BYTES
from tests.daemon_process import WireClient, make_temp_dir, running_daemon
from tests.e2e.reliability import PingProbe

LOG_CAP_BYTES = 256 * 1024  # the config's stderr_log_max_bytes for this daemon
STDERR_FLOOD_BYTES = 256 * 1024 * 1024  # a looping agent's output: far past any cap
FLOOD_TIMEOUT_S = 60.0  # only ends a run whose session never ends; it takes about a second

# Answers the handshake as the mock agent does, so the daemon serves it; then writes
# the flood to stderr, one stdout line past the frame bound, and waits for the daemon
# to end it (stdin EOF or a signal).
AGENT = f"""
import json, os, sys
hello = json.loads(sys.stdin.readline())
sys.stdout.write(json.dumps({{"type": "initialized", "handle": hello.get("handle") or "h-1",
                             "agent": "flood", "version": "1", "history": 0}}) + "\\n")
sys.stdout.flush()
block = b"e" * (1 << 20)
for _ in range({STDERR_FLOOD_BYTES} // len(block)):
    os.write(2, block)
os.write(2, b"\\nthe flood is over\\n")
line = b"x" * ({MAX_LINE_BYTES} + 1024) + b"\\n"
view = memoryview(line)
while view:
    view = view[os.write(1, view):]
sys.stdin.read()
"""


def _kinds(events: list[dict[str, Any]]) -> list[str]:
    return [event["kind"] for event in events]


def test_an_agent_flooding_stderr_and_breaking_framing_ends_once_and_stays_bounded() -> None:
    base = make_temp_dir()
    config = base / "config.toml"
    config.write_text(f"stderr_log_max_bytes = {LOG_CAP_BYTES}\n")
    state = base / "state"
    with (
        running_daemon(state_dir=state, extra_args=["--config", str(config)]) as daemon,
        daemon.connect() as client,
        PingProbe(daemon.socket) as probe,
    ):
        created = client.call(
            "agentSession.create",
            {
                "provider": "mock",
                "cwd": str(base),
                "command": [sys.executable, "-c", AGENT],
            },
        )
        session_id = created["result"]["session"]["sessionId"]
        deadline = time.monotonic() + FLOOD_TIMEOUT_S
        while _phase(client, session_id) != "stopped":
            assert time.monotonic() < deadline, "the flooding agent's session never ended"
            time.sleep(0.05)
        history = client.call(
            "agentSession.history", {"sessionId": session_id, "afterSeq": 0, "limit": 1000}
        )["result"]
        kinds = _kinds(history["events"])
        assert kinds.count("child.ready") == 1, kinds  # it was served, then broke framing
        assert kinds.count("agent.error") == 0, kinds  # never a loop of them
        assert kinds.count("child.exited") == 1, kinds
        exited = next(e for e in history["events"] if e["kind"] == "child.exited")
        assert exited["body"]["cause"] == "failed", exited
        error = exited["body"]["error"]  # the one error, with the end of the agent
        assert error["kind"] == "agent_protocol_error", error
        assert "longer than" in error["message"], error
        assert "the flood is over" in exited["body"]["stderrTail"], exited
        logs = list((state / "logs").glob(f"{session_id}.stderr.log*"))
        assert logs, "the agent's stderr was not logged"
        assert sum(path.stat().st_size for path in logs) <= LOG_CAP_BYTES
        probe.check()  # the daemon answered all along (invariant 8)


def _phase(client: WireClient, session_id: str) -> str:
    phase: str = client.call("agentSession.get", {"sessionId": session_id})["result"]["session"][
        "phase"
    ]
    return phase


def test_an_agent_crashing_while_its_child_holds_its_output_is_seen_to_end() -> None:
    """The agent exits (code 3) while a background child of its own keeps its stdout
    open: the session ends as a crash, ``unexpected`` with its code, the child is
    ended with it, and a send afterwards starts a fresh agent."""
    base = make_temp_dir()
    with (
        running_daemon(state_dir=base / "state") as daemon,
        daemon.connect() as client,
        PingProbe(daemon.socket) as probe,
    ):
        created = client.call(
            "agentSession.create",
            {
                "provider": "mock",
                "cwd": str(base),
                "options": {"crashAfterS": 0.5, "holdPipes": True},
            },
        )
        session_id = created["result"]["session"]["sessionId"]
        deadline = time.monotonic() + FLOOD_TIMEOUT_S
        while _phase(client, session_id) != "stopped":
            assert time.monotonic() < deadline, "the crashed agent's session never ended"
            time.sleep(0.05)
        info = client.call("agentSession.get", {"sessionId": session_id})["result"]["session"]
        assert info["lastExit"]["cause"] == "unexpected", info["lastExit"]
        assert info["lastExit"]["returncode"] == 3, info["lastExit"]
        client.call(
            "agentSession.setOptions", {"sessionId": session_id, "options": {}}
        )  # the next agent need not crash
        sent = client.call("agentSession.send", {"sessionId": session_id, "text": "echo again"})
        assert sent["result"]["dispatch"] == "accepted", sent
        probe.check()  # the daemon answered all along (invariant 8)
