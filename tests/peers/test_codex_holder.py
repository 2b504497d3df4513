"""The real Codex with its agent in the holder (config ``holder = true``): a
streamed turn, an approved shell command, an interrupt and a native resume after a
close run exactly as with the agent the daemon's own child (the same tests, on a
daemon configured so), and the agent is the holder's child."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsctl.client import Client
from agentsd.holder_link import HOLDER_SCRIPT
from agentsd.procfs import read_proc_info
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon
from tests.peers.codex_peer import NEWEST, create_codex
from tests.peers.fake_openai import FakeOpenAI, TextReply
from tests.peers.test_codex import (
    test_a_turn_streams_text_and_completes,
    test_an_accepted_shell_command_runs,
    test_an_interrupt_mid_stream_ends_the_turn_interrupted,
    test_close_then_send_resumes_the_same_thread,
)

__all__ = [
    "test_a_turn_streams_text_and_completes",
    "test_an_accepted_shell_command_runs",
    "test_an_interrupt_mid_stream_ends_the_turn_interrupted",
    "test_close_then_send_resumes_the_same_thread",
]


@pytest.fixture(scope="module")
def peer_daemon() -> Iterator[DaemonProcess]:
    """As ``test_codex``'s, with ``holder = true``."""
    base = make_temp_dir()
    try:
        config = base / "config.toml"
        text = "holder = true\n"
        if NEWEST.binary() is not None:
            text += f"[providers.codex]\ncommand = {json.dumps(NEWEST.command())}\n"
        config.write_text(text)
        with running_daemon(extra_args=["--config", str(config)]) as daemon:
            yield daemon
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_codex_runs_as_the_holders_child(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
) -> None:
    fake.script(TextReply("hi"))
    session = create_codex(client, workdir, codex_env)
    child = read_proc_info(session["child"]["pid"])
    assert child is not None and child.ppid != peer_daemon.process.pid
    holder = read_proc_info(child.ppid)
    assert holder is not None and _runs_the_holder(child.ppid)
    client.call("agentSession.close", {"sessionId": session["sessionId"]})


def _runs_the_holder(pid: int) -> bool:
    return str(HOLDER_SCRIPT).encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
