"""The real Codex with its agent in the holder (config ``holder = true``): a
streamed turn, an approved shell command, an interrupt and a native resume after a
close run exactly as with the agent the daemon's own child (the same tests, on a
daemon configured so), and the agent is the holder's child.

And the agent keeps running through the daemon going away (issue 19,
``tests.peers.reattach_peer``): a turn streaming through ``agentsctl daemon
restart`` and through a daemon SIGKILL (``crash_policy`` ``reattach``; with ``end``
its turn is cut off), and an approval answered after a restart reaching Codex once."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsctl.client import Client
from agentsd.holder_link import HOLDER_SCRIPT
from agentsd.procfs import read_proc_info
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon
from tests.peers.codex_peer import NEWEST, create_codex
from tests.peers.conftest import Deadline
from tests.peers.fake_openai import FakeOpenAI, ShellCall, TextReply, shell_call_outputs
from tests.peers.reattach_peer import (
    PIECE_DELAY_S,
    STORY,
    STORY_PIECES,
    approval_through,
    crashable_daemons,
    cut_off_by_a_crash,
    streamed_through_a_crash,
    streamed_through_a_restart_in_place,
)
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


_HOLDER_CONFIG = "holder = true\n" + (
    f"[providers.codex]\ncommand = {json.dumps(NEWEST.command())}\n"
    if NEWEST.binary() is not None
    else ""
)


@pytest.fixture(scope="module")
def peer_daemon() -> Iterator[DaemonProcess]:
    """As ``test_codex``'s, with ``holder = true``."""
    base = make_temp_dir()
    try:
        config = base / "config.toml"
        config.write_text(_HOLDER_CONFIG)
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


# -- through the daemon going away (issue 19) -------------------------------------------


def _held_story(fake: FakeOpenAI) -> threading.Event:
    """Script the story, held after its first piece; the event releases the rest."""
    hold = threading.Event()
    fake.script(TextReply(STORY, chunks=STORY_PIECES, chunk_delay_s=PIECE_DELAY_S, hold=hold))
    return hold


def test_a_turn_streams_on_through_a_restart_in_place(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    hold = _held_story(fake)
    sid = create_codex(client, workdir, codex_env)["sessionId"]
    streamed_through_a_restart_in_place(peer_daemon, sid, hold, STORY, deadline)
    assert len(fake.requests()) == 1  # one model call: the turn was never started again


@pytest.mark.parametrize("crash_policy", ["reattach", "end"])
def test_a_turn_through_a_daemon_sigkill(
    crash_policy: str,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    hold = _held_story(fake)

    def create(client: Client) -> str:
        sid: str = create_codex(client, workdir, codex_env)["sessionId"]
        return sid

    with crashable_daemons(_HOLDER_CONFIG, crash_policy) as daemons:
        if crash_policy == "reattach":
            streamed_through_a_crash(daemons, create, hold, STORY, deadline)
        else:
            cut_off_by_a_crash(daemons, create, hold, deadline)
    assert len(fake.requests()) == 1


@pytest.mark.parametrize("how", ["restart", "sigkill"])
def test_an_approval_answered_after_the_daemon_came_back_reaches_codex_once(
    how: str,
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    ran = workdir / "ran.txt"
    fake.script(ShellCall(f"echo ran >> {ran}"), TextReply("Ran it."))

    def create(client: Client) -> str:
        sid: str = create_codex(client, workdir, codex_env)["sessionId"]
        return sid

    with crashable_daemons(_HOLDER_CONFIG, "reattach") as daemons:
        events = approval_through(how, peer_daemon, daemons, create, "accept", deadline)
    commands = [
        e["body"]
        for e in events
        if e["kind"] == "item.completed" and e["body"]["type"] == "commandExecution"
    ]
    assert [c["status"] for c in commands] == ["completed"]
    assert ran.read_text() == "ran\n"  # the command ran once
    first, second = fake.requests()  # the ask, and the one call with its result
    assert shell_call_outputs(first.body) == []
    assert len(shell_call_outputs(second.body)) == 1, second.body["input"]
