"""Continuity after a restart, with a real daemon and the mock agent: the
reconciliation report (``daemon.status``, systemd's ``STATUS=``, the log) after a
SIGKILL during running turns, ``agentsctl continue`` carrying each turn on in the
same conversation, and ``agentsctl daemon restart --drain`` waiting for a running
turn before it restarts.

A running turn here is one waiting for an approval: it runs until someone answers,
so no test depends on how fast a turn streams.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsctl.cli import EXIT_DAEMON_ERROR, EXIT_OK, EXIT_USAGE
from agentsctl.daemon import DaemonUnreachable, quick_call
from agentsd.providers.base import CONTINUATION_PROMPT
from agentsd_protocol.errors import Draining
from tests.daemon_process import IO_TIMEOUT_S, make_temp_dir, no_holder_config, running_daemon
from tests.e2e.notify_listener import NotifyListener

TURN_TIMEOUT_S = 30.0  # a mock turn, a restart, on a loaded machine


@pytest.fixture
def base() -> Iterator[Path]:
    import shutil

    path = make_temp_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def cli(sock: Path, *argv: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentsctl.cli", "--socket", str(sock), "--no-start", *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def journal(sock: Path, session_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        page = quick_call(
            sock, "agentSession.history", {"sessionId": session_id, "afterSeq": after, "limit": 500}
        )
        events.extend(page["events"])
        if not page["hasMore"]:
            return events
        after = events[-1]["seq"]


def wait_event(sock: Path, session_id: str, kind: str, **body: Any) -> dict[str, Any]:
    """The first journal event of ``kind`` whose body has ``body``."""
    deadline = time.monotonic() + TURN_TIMEOUT_S
    while True:
        for event in journal(sock, session_id):
            if event["kind"] == kind and all(event["body"].get(k) == v for k, v in body.items()):
                return event
        if time.monotonic() >= deadline:
            raise AssertionError(f"no {kind} {body} in {session_id}: {journal(sock, session_id)}")
        time.sleep(0.05)


def running_turn(sock: Path, cwd: Path, title: str) -> tuple[str, str]:
    """A mock session whose turn runs until its approval is answered: (id, approval)."""
    session_id = quick_call(
        sock, "agentSession.create", {"provider": "mock", "cwd": str(cwd), "title": title}
    )["sessionId"]
    quick_call(sock, "agentSession.send", {"sessionId": session_id, "text": "please approve"})
    approval = wait_event(sock, session_id, "approval.requested")["body"]["approvalId"]
    return session_id, approval


def status(sock: Path) -> dict[str, Any]:
    result: dict[str, Any] = quick_call(sock, "daemon.status")
    return result


def test_a_sigkill_during_three_turns_reports_three_cut_off_none_lost_and_continue_carries_each_on(
    base: Path,
) -> None:
    """Without the holder (``holder = false``): the SIGKILL ends the agents, so their
    turns are cut off."""
    state, sock = base / "state", base / "run" / "agentsd.sock"
    with (
        no_holder_config() as config,
        running_daemon(state_dir=state, socket_path=sock, extra_args=config) as first,
    ):
        sessions = [running_turn(sock, base, f"task {n}")[0] for n in range(3)]
        first.process.kill()
        first.process.wait(timeout=IO_TIMEOUT_S)

    with (
        no_holder_config() as config,
        NotifyListener.bound(base) as notify,
        running_daemon(
            state_dir=state, socket_path=sock, env=notify.env, extra_args=config
        ) as daemon,
    ):
        notify.wait_for(
            "STATUS",
            re.compile(r".*; at start: 3 turns cut off \(3 to continue\), 0 failed, 0 lost"),
            process=daemon.process,
            timeout_s=IO_TIMEOUT_S,
        )
        report = status(sock)["recovery"]
        assert report["sessionsRunning"] == 3
        assert report["turnsCutOff"] == 3
        assert report["lost"] == 0 and report["failed"] == []
        assert {c["sessionId"] for c in report["cutOff"]} == set(sessions)
        assert {c["reason"] for c in report["cutOff"]} == {"daemon-restart"}
        assert "3 turns cut off (0 continued, 3 waiting" in report["summary"]
        assert daemon.log().count("turn cut off by a daemon restart") == 3
        cut_seq = {c["sessionId"]: c["seq"] for c in report["cutOff"]}

        listed = cli(sock, "continue")
        assert listed.returncode == EXIT_OK, listed.stderr
        assert all(sid in listed.stdout for sid in sessions), listed.stdout

        done = cli(sock, "continue", "--all")
        assert done.returncode == EXIT_OK, done.stderr
        assert done.stdout.count(": continued the turn cut off at seq") == 3, done.stdout

        for session_id in sessions:
            continuation = wait_event(
                sock, session_id, "submission", continuesSeq=cut_seq[session_id]
            )
            assert continuation["body"]["text"] == CONTINUATION_PROMPT
            # The agent carries on: a turn after the continuation, completed.
            finished = wait_event(sock, session_id, "turn.completed", outcome="completed")
            assert finished["seq"] > continuation["seq"]
            # Never a silent re-send: the user's prompt was journaled once.
            prompts = [
                e["body"]["text"] for e in journal(sock, session_id) if e["kind"] == "submission"
            ]
            assert prompts == ["please approve", CONTINUATION_PROMPT]

        # The same conversation, resumed natively: the mock's saved conversation holds
        # the first prompt, then the continuation.
        conversations = [json.loads(path.read_text()) for path in (state / "mock").glob("*.json")]
        carried = [c for c in conversations if CONTINUATION_PROMPT in json.dumps(c)]
        assert len(carried) == 3
        for conversation in carried:
            texts = [m["text"] for m in conversation["messages"] if m["role"] == "user"]
            assert texts[:2] == ["please approve", CONTINUATION_PROMPT], conversation

        report = status(sock)["recovery"]
        assert report["continued"] == 3
        assert all(c["continued"] for c in report["cutOff"])
        assert "3 turns cut off (3 continued)" in report["summary"]

        # Once only: a second continue is refused, and says why.
        again = cli(sock, "continue", sessions[0])
        assert again.returncode == EXIT_DAEMON_ERROR
        assert "[not_cut_off]" in again.stderr


def test_continue_refuses_a_turn_that_was_not_cut_off(base: Path) -> None:
    with running_daemon(state_dir=base / "state") as daemon:
        sock = daemon.socket
        session_id = quick_call(
            sock, "agentSession.create", {"provider": "mock", "cwd": str(base)}
        )["sessionId"]
        quick_call(sock, "agentSession.send", {"sessionId": session_id, "text": "echo done"})
        wait_event(sock, session_id, "turn.completed", outcome="completed")
        done = cli(sock, "continue", session_id)
        assert done.returncode == EXIT_DAEMON_ERROR
        assert "[not_cut_off]" in done.stderr
        assert [e["kind"] for e in journal(sock, session_id)].count("submission") == 1
        assert cli(sock, "continue", "nope").returncode == EXIT_DAEMON_ERROR
        assert cli(sock, "continue", session_id, "--all").returncode == EXIT_USAGE
        nothing = cli(sock, "continue")
        assert "no turn cut off" in nothing.stdout


def test_a_drained_restart_waits_for_the_running_turn_then_restarts(base: Path) -> None:
    """Without the holder (``holder = false``): the restart closes the agents once
    the running turn has finished."""
    state, sock = base / "state", base / "run" / "agentsd.sock"
    with (
        no_holder_config() as config,
        running_daemon(state_dir=state, socket_path=sock, extra_args=config) as daemon,
    ):
        busy, approval = running_turn(sock, base, "busy")
        idle = quick_call(sock, "agentSession.create", {"provider": "mock", "cwd": str(base)})[
            "sessionId"
        ]
        old_pid = status(sock)["pid"]
        restart = subprocess.Popen(
            [sys.executable, "-m", "agentsctl.cli", "--socket", str(sock), "daemon", "restart",
             "--drain"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + TURN_TIMEOUT_S
            while not status(sock)["draining"]:
                assert time.monotonic() < deadline, "the daemon never started draining"
                time.sleep(0.05)
            # Draining: a new turn is refused before anything is journaled...
            before = len(journal(sock, idle))
            with pytest.raises(Draining):
                quick_call(sock, "agentSession.send", {"sessionId": idle, "text": "echo no"})
            assert len(journal(sock, idle)) == before
            refused = cli(sock, "send", idle, "echo no")
            assert refused.returncode == EXIT_DAEMON_ERROR and "[draining]" in refused.stderr
            # A command starts a turn too (compact, the agent's own): refused the same way.
            with pytest.raises(Draining):
                quick_call(sock, "agentSession.command", {"sessionId": idle, "name": "compact"})
            assert len(journal(sock, idle)) == before
            # ...while the running turn can still be answered, and finishes.
            quick_call(
                sock,
                "agentSession.respond",
                {"sessionId": busy, "approvalId": approval, "decision": "accept"},
            )
            out, err = restart.communicate(timeout=120)
        finally:
            if restart.poll() is None:
                restart.kill()
        assert restart.returncode == EXIT_OK, err
        assert "drained: 1 turn running, 1 finished, 0 cut off" in out, out
        assert "agentsd restarted" in out, out

        # The same process executed itself again: a new daemon, nothing cut off.
        after = status(sock)
        assert after["pid"] == old_pid == daemon.process.pid
        assert after["draining"] is False
        assert after["recovery"]["turnsCutOff"] == 0 and after["recovery"]["lost"] == 0
        events = journal(sock, busy)
        completed = [e for e in events if e["kind"] == "turn.completed"]
        assert [e["body"]["outcome"] for e in completed] == ["completed"]
        exited = [e for e in events if e["kind"] == "child.exited"]
        assert exited[-1]["body"]["cause"] == "shutdown"
        assert exited[-1]["seq"] > completed[-1]["seq"]
        # The restarted daemon takes turns again.
        quick_call(sock, "agentSession.send", {"sessionId": idle, "text": "echo yes"})
        wait_event(sock, idle, "turn.completed", outcome="completed")


def test_a_drain_that_times_out_cuts_the_turn_off_for_continue(base: Path) -> None:
    """Without the holder (``holder = false``): the restart closes the agent, so the
    turn still running at the timeout is cut off."""
    state, sock = base / "state", base / "run" / "agentsd.sock"
    with (
        no_holder_config() as config,
        running_daemon(state_dir=state, socket_path=sock, extra_args=config),
    ):
        busy, _ = running_turn(sock, base, "slow")
        assert cli(sock, "daemon", "restart", "--timeout", "1").returncode == EXIT_USAGE
        done = cli(sock, "daemon", "restart", "--drain=turn", "--timeout", "0.2")
        assert done.returncode == EXIT_OK, done.stderr
        assert "1 turn running, 0 finished, 1 cut off at the timeout" in done.stdout
        report = status(sock)["recovery"]
        assert report["turnsCutOff"] == 1 and report["lost"] == 0
        assert [(c["sessionId"], c["reason"]) for c in report["cutOff"]] == [(busy, "shutdown")]
        # Idempotent: a retry with the same operation id replays the answer.
        params = {"sessionId": busy, "clientOperationId": "op-continue-1"}
        first = quick_call(sock, "agentSession.continue", params)
        assert (
            first["dispatch"] == "accepted" and first["continuedSeq"] == report["cutOff"][0]["seq"]
        )
        assert quick_call(sock, "agentSession.continue", params) == first
        wait_event(sock, busy, "turn.completed", outcome="completed")
        again = cli(sock, "continue", busy)
        assert again.returncode == EXIT_DAEMON_ERROR and "[not_cut_off]" in again.stderr
        # The summary's last prompt stays the user's, also as rebuilt after a restart.
        for _ in range(2):
            [summary] = quick_call(sock, "agentSession.watch")["sessions"]
            assert summary["lastPrompt"] == "please approve"
            assert summary["outcome"] == "completed"
            assert cli(sock, "daemon", "restart").returncode == EXIT_OK


def test_under_systemd_a_restart_is_in_place_reloading_then_ready(base: Path) -> None:
    """With ``NOTIFY_SOCKET`` (a service manager) the daemon restarts in place as
    everywhere: the same pid executes itself again, saying ``RELOADING=1`` and then,
    from the new image, ``READY=1`` (``agentsd.reexec``), never ``STOPPING=1``.
    Without the holder (``holder = false``), so the restart keeps no agents."""
    with (
        no_holder_config() as config,
        NotifyListener.bound(base) as notify,
        running_daemon(state_dir=base / "state", env=notify.env, extra_args=config) as daemon,
    ):
        notify.wait_for("READY", "1", process=daemon.process, timeout_s=IO_TIMEOUT_S)
        result = quick_call(daemon.socket, "daemon.restart", {"drain": "turn", "timeoutS": 5})
        assert result["drained"] is True and result["how"] == "service-manager"
        assert result["keepsAgents"] is False
        notify.wait_for("RELOADING", "1", process=daemon.process, timeout_s=IO_TIMEOUT_S)
        notify.wait_for("READY", "1", process=daemon.process, timeout_s=TURN_TIMEOUT_S)
        assert status(daemon.socket)["pid"] == daemon.process.pid
        assert daemon.process.poll() is None
        assert not [n for n in notify.received if "STOPPING" in n.fields]


def test_a_drained_restart_goes_on_when_its_client_is_gone(base: Path) -> None:
    """Asked is asked: the client that asked for the drain went away (Ctrl-C); once
    the turn ends the daemon still restarts, and never stays refusing turns."""
    state, sock = base / "state", base / "run" / "agentsd.sock"
    with running_daemon(state_dir=state, socket_path=sock) as daemon:
        busy, approval = running_turn(sock, base, "busy")
        asker = daemon.connect()
        asker.send(
            {"jsonrpc": "2.0", "id": 1, "method": "daemon.restart", "params": {"drain": "turn"}}
        )
        deadline = time.monotonic() + TURN_TIMEOUT_S
        while not status(sock)["draining"]:
            assert time.monotonic() < deadline, "the daemon never started draining"
            time.sleep(0.05)
        asker.close()
        uptime = status(sock)["uptimeS"]
        quick_call(
            sock,
            "agentSession.respond",
            {"sessionId": busy, "approvalId": approval, "decision": "accept"},
        )
        while True:  # the same pid, executed again: its uptime starts over
            try:
                now = status(sock)
            except (OSError, DaemonUnreachable):
                now = None
            if now is not None and now["uptimeS"] < uptime and not now["draining"]:
                break
            assert time.monotonic() < deadline, "the daemon did not restart after the drain"
            time.sleep(0.05)
        assert now["recovery"]["turnsCutOff"] == 0
        wait_event(sock, busy, "turn.completed", outcome="completed")
