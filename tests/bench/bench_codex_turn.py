"""A real Codex turn through the daemon vs driving ``codex app-server`` directly.

Both sides talk to the same fake Responses API (``tests/peers/fake_openai``) on
127.0.0.1, with their own ``CODEX_HOME`` holding the same config, in the same run.
A turn is timed from the prompt leaving the client to ``turn/completed``:

- daemon: ``agentSession.send`` on one connection, until ``turn.completed`` arrives
  as an ``agentSession.event`` on a second (subscribed) connection; the daemon
  journals every event durably on the way;
- direct: ``turn/start`` written to the app-server's stdin, until its
  ``turn/completed`` line is read.

The daemon side, the alternating rounds and the report are ``turn_pairs``'s.
Target: the daemon's median at most 1.1x the direct one plus 20 ms.
Run with ``python -m tests.bench codex_turn``. Nothing here asserts.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from agentsd.providers.programs import CODEX, find_program
from tests.bench.turn_pairs import PipedAgent, codex_turns, report
from tests.daemon_process import make_temp_dir, running_daemon
from tests.peers.fake_openai import running_fake_openai


class DirectCodex(PipedAgent):
    """``codex app-server`` driven over its pipes, the way an editor plugin would."""

    name = "codex app-server"

    def __init__(self, program: str, home: Path, cwd: Path) -> None:
        super().__init__([program, "app-server"], home, cwd)
        self.request("initialize", {"clientInfo": {"name": "bench", "title": None, "version": "0"}})
        self.write({"method": "initialized"})
        started = self.request(
            "thread/start",
            {"cwd": str(cwd), "approvalPolicy": "on-request", "sandbox": "workspace-write"},
        )
        self.thread_id: str = started["thread"]["id"]

    def turn(self, text: str) -> float:
        """Seconds from turn/start to turn/completed."""
        started = time.perf_counter()
        self.send_request(
            "turn/start",
            {
                "threadId": self.thread_id,
                "input": [{"type": "text", "text": text, "text_elements": []}],
            },
        )
        while True:
            message = self.read()
            if message.get("method") == "turn/completed":
                status = message["params"]["turn"]["status"]
                if status != "completed":
                    raise RuntimeError(f"the direct turn ended {status}")
                return time.perf_counter() - started


def main() -> None:
    program = find_program(CODEX)
    if program is None:
        print(f"   skipped: codex is not installed; {CODEX.install_hint()}")
        return
    base = make_temp_dir()
    try:
        with running_fake_openai() as fake, running_daemon() as daemon:
            ours, theirs = codex_turns(
                fake,
                daemon.socket,
                "codex",
                base,
                lambda home, cwd: DirectCodex(program, home, cwd),
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(ours, theirs)


if __name__ == "__main__":
    main()
