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

The daemon side, the alternating rounds and the report are ``turn_pairs``'s.
Target: the daemon's median at most 1.1x the direct one plus 20 ms.
Run with ``python -m tests.bench acp_turn``. Nothing here asserts.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from tests.bench.turn_pairs import PipedAgent, codex_turns, report
from tests.daemon_process import make_temp_dir
from tests.peers.acp_peer import acp_daemon
from tests.peers.fake_openai import running_fake_openai

BINARY = Path(__file__).parents[1] / "agents" / "node_modules" / "codex-acp-0.16.0" / "bin"
COMMAND = [str(BINARY / "codex-acp.js")]


class DirectAgent(PipedAgent):
    """The ACP agent driven over its pipes, the way an editor would."""

    name = "the ACP agent"
    jsonrpc = True

    def __init__(self, home: Path, cwd: Path) -> None:
        super().__init__(COMMAND, home, cwd)
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


def main() -> None:
    if not Path(COMMAND[0]).exists():
        print("   skipped: codex-acp is not installed (make test installs it)")
        return
    base = make_temp_dir()
    try:
        with running_fake_openai() as fake, acp_daemon(base, "codex-acp", COMMAND, {}) as daemon:
            ours, theirs = codex_turns(fake, daemon.socket, "codex-acp", base, DirectAgent)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(ours, theirs)


if __name__ == "__main__":
    main()
