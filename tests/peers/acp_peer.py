"""What the peer tests of real ACP agents share: a daemon with the agent configured
as ``[agents.NAME]``, sessions on it, and the agent's processes found by a variable
of their environment (every process an agent starts inherits it)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentsctl.client import Client
from tests.daemon_process import DaemonProcess, running_daemon


def daemon_args(base: Path, name: str, command: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``--config`` with ``[agents.NAME]`` running ``command`` with ``env``."""
    config = base / "config.toml"
    table = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in env.items())
    config.write_text(
        f"[agents.{name}]\ncommand = {json.dumps(list(command))}\nenv = {{ {table} }}\n"
    )
    return ["--config", str(config)]


@contextmanager
def acp_daemon(
    base: Path, name: str, command: Sequence[str], env: Mapping[str, str], state: Path | None = None
) -> Iterator[DaemonProcess]:
    with running_daemon(state_dir=state, extra_args=daemon_args(base, name, command, env)) as d:
        yield d


def create(client: Client, provider: str, workdir: Path, env: dict[str, str]) -> dict[str, Any]:
    """Create (and start) a session; its SessionInfo as plain JSON."""
    result = client.call(
        "agentSession.create", {"provider": provider, "cwd": str(workdir), "env": env}
    )
    session: dict[str, Any] = result["session"]
    return session


def send(client: Client, session_id: str, text: str) -> dict[str, Any]:
    result: dict[str, Any] = client.call(
        "agentSession.send", {"sessionId": session_id, "text": text}
    )
    assert result["dispatch"] == "accepted", result
    return result


def processes_with_env(name: str, value: str) -> list[int]:
    """Pids of live processes (not zombies) whose environment has ``name=value``."""
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
