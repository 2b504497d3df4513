"""The real Claude Code with its agent in the holder (config ``holder = true``): a
streamed turn, a tool call waiting for a client's decision, an interrupt and a native
resume after a close run exactly as with the agent the daemon's own child (the same
tests, on a daemon configured so), and the agent is the holder's child."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsctl.client import Client
from agentsd.holder_link import HOLDER_SCRIPT
from agentsd.procfs import read_proc_info
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon
from tests.peers.conftest import CALL_TIMEOUT_S
from tests.peers.fake_anthropic import FakeAnthropic
from tests.peers.test_claude import (
    alarm,
    fake,
    home,
    needs_claude,
    test_bash_tool_call_waits_for_a_clients_decision,
    test_close_then_send_resumes_natively,
    test_full_turn_streams_text,
    test_interrupt_mid_stream,
)

__all__ = [
    "alarm",
    "fake",
    "home",
    "test_bash_tool_call_waits_for_a_clients_decision",
    "test_close_then_send_resumes_natively",
    "test_full_turn_streams_text",
    "test_interrupt_mid_stream",
]


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    """As ``test_claude``'s, with ``holder = true``."""
    base = make_temp_dir()
    try:
        config = base / "config.toml"
        config.write_text("holder = true\n")
        with running_daemon(extra_args=["--config", str(config)]) as d:
            yield d
    finally:
        shutil.rmtree(base, ignore_errors=True)


@needs_claude
def test_claude_runs_as_the_holders_child(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
        created = client.call(
            "agentSession.create",
            {"provider": "claude", "cwd": str(home / "work"), "env": fake.claude_env(home)},
        )
        child = read_proc_info(created["session"]["child"]["pid"])
        assert child is not None and child.ppid != daemon.process.pid
        holder = read_proc_info(child.ppid)
        assert holder is not None and _runs_the_holder(child.ppid)
        client.call("agentSession.close", {"sessionId": created["sessionId"]})


def _runs_the_holder(pid: int) -> bool:
    return str(HOLDER_SCRIPT).encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
