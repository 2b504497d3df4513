"""Continuity with the real agents: a daemon without the holder (``holder = false``,
so a crash ends its agents) SIGKILLed during three running turns (the real ``codex
app-server`` and Claude Code streaming slowly from their fake model servers, and the
mock agent waiting for an approval). The next daemon reports three cut-off turns and
none lost; ``agentsctl continue --all`` resumes each conversation natively, and each
fake model server sees the continuation request in the same conversation, after the
prompt the turn was cut off in: the user's prompt is never sent again.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsctl.client import Client
from agentsd.providers.base import CONTINUATION_PROMPT
from agentsd.providers.programs import CLAUDE, CODEX, find_program
from tests.daemon_process import make_temp_dir, no_holder_config, running_daemon
from tests.peers.conftest import CALL_TIMEOUT_S, Deadline, Follower
from tests.peers.fake_anthropic import FakeAnthropic, running_fake_anthropic
from tests.peers.fake_anthropic import TextReply as ClaudeReply
from tests.peers.fake_openai import API_KEY_ENV, FakeOpenAI, input_texts, running_fake_openai
from tests.peers.fake_openai import TextReply as CodexReply

pytestmark = pytest.mark.skipif(
    find_program(CODEX) is None or find_program(CLAUDE) is None,
    reason="codex and claude are needed (the test extras ship them)",
)

TEST_BUDGET_S = 240.0  # three agents, a crash, a recovery and three more turns, loaded
LONG_CODEX = CodexReply("word " * 400, chunks=400, chunk_delay_s=0.05)  # about 20 s
LONG_CLAUDE = ClaudeReply("A story that is cut short. " * 100, chunk_chars=5, delay_s=0.05)


@pytest.fixture
def base() -> Iterator[Path]:
    path = make_temp_dir()
    (path / "work").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def openai() -> Iterator[FakeOpenAI]:
    with running_fake_openai() as server:
        yield server


@pytest.fixture
def anthropic() -> Iterator[FakeAnthropic]:
    with running_fake_anthropic() as server:
        yield server


def journal(client: Client, session_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        page = client.call(
            "agentSession.history", {"sessionId": session_id, "afterSeq": after, "limit": 500}
        )
        events += page["events"]
        if not page["hasMore"] or not page["events"]:
            return events
        after = page["events"][-1]["seq"]


def continues(seq: int) -> Callable[[dict[str, Any]], bool]:
    """Matches the body of a continuation of the turn cut off at ``seq``."""
    return lambda body: body.get("continuesSeq") == seq


def test_a_sigkill_during_three_turns_then_continue_resumes_each_conversation(
    base: Path, openai: FakeOpenAI, anthropic: FakeAnthropic
) -> None:
    deadline = Deadline(TEST_BUDGET_S)
    state, sock = base / "state", base / "run" / "agentsd.sock"
    work = base / "work"
    codex_env = {
        "CODEX_HOME": str(openai.write_codex_home(base / "codex-home")),
        API_KEY_ENV: "dummy",
    }
    openai.script(LONG_CODEX, CodexReply("Carrying on from where I was."))
    anthropic.script(LONG_CLAUDE, ClaudeReply("Carrying on with the story."))
    prompts = {"codex": "Talk for a long while", "claude": "Tell me a story"}

    with (
        no_holder_config() as config,
        running_daemon(state_dir=state, socket_path=sock, extra_args=config) as first,
    ):
        with Client(sock, timeout_s=CALL_TIMEOUT_S) as client:
            sessions: dict[str, str] = {}
            for provider, env in (
                ("codex", codex_env),
                ("claude", anthropic.claude_env(base / "claude-home")),
            ):
                sid = client.call(
                    "agentSession.create",
                    {"provider": provider, "cwd": str(work), "env": env, "title": provider},
                )["sessionId"]
                sessions[provider] = sid
                with Follower(first, sid, deadline) as follower:
                    client.call("agentSession.send", {"sessionId": sid, "text": prompts[provider]})
                    follower.wait_for_delta()  # streaming: the turn runs
            mock = client.call(
                "agentSession.create", {"provider": "mock", "cwd": str(work), "title": "mock"}
            )["sessionId"]
            sessions["mock"] = mock
            with Follower(first, mock, deadline) as follower:
                client.call("agentSession.send", {"sessionId": mock, "text": "please approve"})
                follower.wait_for("approval.requested")
        first.process.kill()
        first.process.wait(timeout=CALL_TIMEOUT_S)

    with (
        no_holder_config() as config,
        running_daemon(state_dir=state, socket_path=sock, extra_args=config) as second,
        Client(sock, timeout_s=CALL_TIMEOUT_S) as client,
    ):
        report = client.call("daemon.status")["recovery"]
        assert report["sessionsRunning"] == 3
        assert report["turnsCutOff"] == 3
        assert report["lost"] == 0 and report["failed"] == [], report
        assert {c["sessionId"] for c in report["cutOff"]} == set(sessions.values())
        cut_seq = {c["sessionId"]: c["seq"] for c in report["cutOff"]}
        handles = {
            p: client.call("agentSession.get", {"sessionId": sid})["session"]["providerHandle"]
            for p, sid in sessions.items()
        }

        done = subprocess.run(
            [sys.executable, "-m", "agentsctl.cli", "--socket", str(sock), "continue",
             "--all"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=deadline.remaining(), check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.count(": continued the turn cut off at seq") == 3, done.stdout

        for provider, sid in sessions.items():
            with Follower(second, sid, deadline) as follower:
                continuation = follower.wait_for("submission", continues(cut_seq[sid]))
                assert continuation["body"]["text"] == CONTINUATION_PROMPT
                finished = follower.wait_for(
                    "turn.completed", lambda b: b["outcome"] == "completed"
                )
                assert finished["seq"] > continuation["seq"]
                # Resumed natively: the same provider conversation.
                ready = [e["body"] for e in follower.events if e["kind"] == "child.ready"]
                assert ready[-1]["providerHandle"] == handles[provider], ready
            texts = [e["body"]["text"] for e in journal(client, sid) if e["kind"] == "submission"]
            assert texts == [prompts.get(provider, "please approve"), CONTINUATION_PROMPT]
        report = client.call("daemon.status")["recovery"]
        assert report["continued"] == 3 and report["lost"] == 0

    # Each model server saw the continuation in the conversation the turn was cut
    # off in: the earlier prompt first, the continuation last, the prompt once.
    codex_users = input_texts(openai.requests()[-1].body, "user")
    assert codex_users[-1] == CONTINUATION_PROMPT, codex_users
    assert codex_users.count(prompts["codex"]) == 1, codex_users
    claude_texts = anthropic.message_requests()[-1].texts()
    assert CONTINUATION_PROMPT in claude_texts, claude_texts
    assert claude_texts.index(prompts["claude"]) < claude_texts.index(CONTINUATION_PROMPT)
    assert claude_texts.count(prompts["claude"]) == 1, claude_texts
