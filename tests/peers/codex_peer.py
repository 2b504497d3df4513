"""What the peer tests of the real ``codex app-server`` share: the newest pinned
release (``tests/peers/agents.py``), a module daemon running it, and sessions on it.
The ``fake`` OpenAI server and ``codex_env`` they run against are in ``conftest``."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsctl.client import Client
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon
from tests.peers.agents import CODEX_RELEASES
from tests.peers.conftest import processes_with_env

NEWEST = next(r for r in CODEX_RELEASES if r.newest)


@pytest.fixture(scope="module")
def peer_daemon() -> Iterator[DaemonProcess]:
    """The module's daemon, running the newest pinned Codex (``test_releases`` takes
    every pinned release through the must-hold set). Without it (outside CI, before
    ``make test`` installed it) the test extras' codex runs."""
    base = make_temp_dir()
    try:
        args: list[str] = []
        if NEWEST.binary() is not None or os.environ.get("CI") == "true":
            config = base / "config.toml"
            config.write_text(f"[providers.codex]\ncommand = {json.dumps(NEWEST.command())}\n")
            args = ["--config", str(config)]
        with running_daemon(extra_args=args) as daemon:
            yield daemon
    finally:
        shutil.rmtree(base, ignore_errors=True)


def create_codex(
    client: Client, workdir: Path, env: dict[str, str], **options: Any
) -> dict[str, Any]:
    """Create (and start) a codex session; returns its SessionInfo as plain JSON."""
    result = client.call(
        "agentSession.create",
        {"provider": "codex", "cwd": str(workdir), "env": env, "options": options},
    )
    session: dict[str, Any] = result["session"]
    return session


def send(client: Client, session_id: str, text: str) -> dict[str, Any]:
    result: dict[str, Any] = client.call(
        "agentSession.send", {"sessionId": session_id, "text": text}
    )
    return result


def codex_processes(codex_home: Path) -> list[int]:
    """Pids of live processes (not zombies) whose environment carries our CODEX_HOME."""
    return processes_with_env("CODEX_HOME", str(codex_home))
