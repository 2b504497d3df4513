"""Every pinned agent CLI release (``tests/peers/agents.py``), through the daemon.

The full peer suites (``test_claude.py``, ``test_codex.py``) run on the newest
release of each CLI. Here each listed release, old and new, goes through what a user
does with a session: create, a turn, a send during a turn, an approval, an
interrupt, a close and a native resume that keeps the history, a daemon killed
with SIGKILL mid-turn, then resumed, and the conversation controls (a model switch
reaching the next model request, a compaction, a clear). An older release that shows its version only
through ``--version`` (Claude Code 2.1.197) must be started and report it, in
``agentSession.get``, the journal and ``agentsctl doctor``.

Both CLIs run offline against the fake model servers; each session runs the
release's native binary through ``agentSession.create {command}``.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentsctl.cli import main
from agentsctl.client import Client
from agentsd.procfs import read_proc_info
from tests.daemon_process import DaemonProcess, make_temp_dir, no_holder_config, running_daemon
from tests.peers import fake_anthropic, fake_openai
from tests.peers.agents import CLAUDE_RELEASES, RELEASES, Release
from tests.peers.conftest import CALL_TIMEOUT_S, Deadline, Follower

TEST_TIMEOUT_S = 150.0  # a whole session's life, two daemons, on a shared 2-core machine
STREAM_DELAY_S = 0.05  # between streamed pieces of a slow reply


@attrs.define
class Agent:
    """One release against its fake model server: what to script, where to look."""

    release: Release
    work: Path  # the session's cwd
    env: dict[str, str]
    options: dict[str, Any]
    claude: fake_anthropic.FakeAnthropic | None = None
    codex: fake_openai.FakeOpenAI | None = None

    def say(self, text: str, *, seconds: float = 0.0, hold: threading.Event | None = None) -> Any:
        """A reply of ``text``, streamed over about ``seconds`` (repeated to fill them);
        with ``hold``, its first piece streams and the rest waits for that event."""
        pieces = int(seconds / STREAM_DELAY_S)
        if self.claude is not None:
            story = text if not pieces else " ".join([text] * (pieces * 5 // len(text) + 1))
            delay_s = STREAM_DELAY_S if pieces else 0.0
            return fake_anthropic.TextReply(story, chunk_chars=5, delay_s=delay_s, hold=hold)
        story = text if not pieces else " ".join([text] * pieces)
        return fake_openai.TextReply(
            story,
            chunks=max(3, pieces),
            chunk_delay_s=STREAM_DELAY_S if pieces else 0.0,
            hold=hold,
        )

    def script(self, *replies: Any) -> None:
        if self.claude is not None:
            self.claude.script(*replies)
        else:
            assert self.codex is not None
            self.codex.script(*replies)

    def tool(self) -> Any:
        """A model call asking to run ``echo hi > hi.txt``, which needs approval."""
        if self.claude is not None:
            return fake_anthropic.ToolUseReply(
                {"command": "echo hi > hi.txt", "description": "Write hi to a file"}
            )
        return fake_openai.ShellCall("echo hi > hi.txt")

    def allow(self, options: list[str]) -> str:
        decision = "allow" if self.claude is not None else "accept"
        assert decision in options, options
        return decision

    def requests(self) -> list[dict[str, Any]]:
        """The bodies of the model calls so far."""
        if self.claude is not None:
            return [r.body for r in self.claude.message_requests()]
        assert self.codex is not None
        return [r.body for r in self.codex.requests()]

    def user_texts(self) -> list[str]:
        """What the user said, as the model saw it in its last call."""
        if self.claude is not None:
            return self.claude.message_requests()[-1].texts()
        assert self.codex is not None
        return fake_openai.input_texts(self.codex.requests()[-1].body, "user")


@pytest.fixture(params=RELEASES, ids=lambda r: r.id)
def release(request: pytest.FixtureRequest) -> Release:
    r: Release = request.param
    return r


@pytest.fixture
def agent(release: Release) -> Iterator[Agent]:
    base = make_temp_dir()
    work = base / "work"
    work.mkdir()
    try:
        if release.provider == "claude":
            with fake_anthropic.running_fake_anthropic() as claude:
                # The mode the two releases name differently (2.1.197 refuses "manual").
                options = {"permissionMode": "manual"}
                yield Agent(release, work, claude.claude_env(base), options, claude=claude)
        else:
            with fake_openai.running_fake_openai() as codex:
                home = codex.write_codex_home(base / "codex-home")
                env = {"CODEX_HOME": str(home), fake_openai.API_KEY_ENV: "dummy"}
                yield Agent(release, work, env, {}, codex=codex)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    with running_daemon() as d:
        yield d


def create(client: Client, agent: Agent) -> dict[str, Any]:
    created = client.call(
        "agentSession.create",
        {
            "provider": agent.release.provider,
            "cwd": str(agent.work),
            "env": agent.env,
            "options": agent.options,
            "command": agent.release.command(),
        },
    )
    session: dict[str, Any] = created["session"]
    return session


def send(client: Client, sid: str, text: str) -> dict[str, Any]:
    result: dict[str, Any] = client.call("agentSession.send", {"sessionId": sid, "text": text})
    assert result["dispatch"] == "accepted", result
    return result


def get(client: Client, sid: str) -> dict[str, Any]:
    session: dict[str, Any] = client.call("agentSession.get", {"sessionId": sid})["session"]
    return session


def journal(client: Client, sid: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = client.call(
        "agentSession.history", {"sessionId": sid, "limit": 1000}
    )["events"]
    return events


def streaming(follower: Follower, turn_id: str) -> None:
    """Return once the reply of ``turn_id`` has streamed some text."""
    item = follower.wait_for(
        "item.started", lambda b: b["type"] == "agentMessage" and b["turnId"] == turn_id
    )
    follower.wait_for_delta(item["body"]["itemId"])


def settled(client: Client, sid: str) -> bool:
    """No turn runs: every turn started has completed, and the session is idle."""
    kinds = [e["kind"] for e in journal(client, sid)]
    return kinds.count("turn.started") == kinds.count("turn.completed") and (
        get(client, sid)["status"] == "idle"
    )


def test_a_session_lives_its_whole_life_on_every_release(
    daemon: DaemonProcess, agent: Agent, release: Release
) -> None:
    deadline = Deadline(TEST_TIMEOUT_S)
    with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
        session = create(client, agent)
        sid, handle = session["sessionId"], session["providerHandle"]
        assert session["child"]["agentVersion"] == release.version
        with Follower(daemon, sid, deadline) as follower:
            ready = follower.wait_for("child.ready")["body"]
            assert ready["agentVersion"] == release.version

            # A turn.
            agent.script(agent.say("Noted: PAPAYA."))
            first = send(client, sid, "Remember the word PAPAYA")
            done = follower.wait_for("turn.completed")["body"]
            assert done["outcome"] == "completed", done
            said = follower.wait_for("item.completed", lambda b: b["type"] == "agentMessage")
            assert said["body"]["text"] == "Noted: PAPAYA."
            assert said["body"]["turnId"] == first["turnId"]

            # An approval.
            agent.script(agent.tool(), agent.say("All done."))
            send(client, sid, "Write hi to hi.txt")
            asked = follower.wait_for("approval.requested")["body"]
            assert get(client, sid)["status"] == "attention"
            client.call(
                "agentSession.respond",
                {
                    "sessionId": sid,
                    "approvalId": asked["approvalId"],
                    "decision": agent.allow(asked["options"]),
                },
            )
            deadline.poll(lambda: settled(client, sid), "the approved turn to end", 0.1)
            assert (agent.work / "hi.txt").read_text() == "hi\n"

            # A send while a turn runs is confirmed at once, on every release (Codex
            # steers the turn; Claude Code queues the prompt behind it): the model server
            # holds both replies until the confirmation came, so no turn can have ended
            # before it (seen in the journal, not on a clock).
            held = threading.Event()
            agent.script(agent.say("Once upon a time,", hold=held), agent.say("Brief.", hold=held))
            story_turn = send(client, sid, "Tell me a story")["turnId"]
            streaming(follower, story_turn)
            send(client, sid, "Then be brief")
            ended = [
                e
                for e in journal(client, sid)
                if e["kind"] == "turn.completed" and e["body"]["turnId"] == story_turn
            ]
            assert ended == [], "the send was confirmed only once the running turn ended"
            held.set()
            # Settled only once the brief answer came: between the story's turn and the
            # one Claude Code runs after it, no turn runs for a moment.
            follower.wait_for(
                "item.completed", lambda b: b["type"] == "agentMessage" and b["text"] == "Brief."
            )
            deadline.poll(lambda: settled(client, sid), "the queued prompt's turn to end", 0.1)

            # An interrupt mid-stream: the model server holds the story until the end of
            # the test, so only the interrupt ends its turn.
            agent.script(agent.say("Once upon a time,", hold=threading.Event()))
            story = send(client, sid, "Tell me a long story")
            streaming(follower, story["turnId"])
            assert client.call("agentSession.interrupt", {"sessionId": sid})["interrupted"]
            stopped = follower.wait_for("turn.completed", lambda b: b["turnId"] == story["turnId"])
            assert stopped["body"]["outcome"] == "interrupted", stopped
            deadline.poll(lambda: settled(client, sid), "idle after the interrupt", 0.1)

            # A close, then a send resumes natively with the history kept.
            closed = client.call("agentSession.close", {"sessionId": sid})
            assert closed["wasRunning"] is True
            agent.script(agent.say("The word was PAPAYA."))
            again = send(client, sid, "What was the word?")
            follower.wait_for("turn.completed", lambda b: b["turnId"] == again["turnId"])
            assert "Remember the word PAPAYA" in agent.user_texts()
            info = get(client, sid)
            assert info["providerHandle"] == handle
            assert info["child"]["agentVersion"] == release.version
        client.call("agentSession.delete", {"sessionId": sid})


# The newest Codex is the one test_codex_controls drives through the same controls
# (and more of their checks); every other release, and both Claude Codes (the
# Claude suite runs the one the SDK bundles, not a pinned release), run them here:
# the controls' protocol differs between releases (Claude Code's set_model control
# and /compact, Codex's model for the next turn and thread/compact/start).
CONTROLS_RELEASES = [r for r in RELEASES if not (r.provider == "codex" and r.newest)]


@pytest.mark.parametrize("release", CONTROLS_RELEASES, ids=lambda r: r.id)
def test_a_model_switch_compaction_and_clear_on_every_release(
    daemon: DaemonProcess, agent: Agent, release: Release
) -> None:
    """The conversation controls on every release: a switched model reaches the next
    model request, compact reaches the model server, clear starts blank."""
    deadline = Deadline(TEST_TIMEOUT_S)
    claude = agent.claude is not None
    model = "sonnet" if claude else "other-model"
    with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
        sid = create(client, agent)["sessionId"]
        with Follower(daemon, sid, deadline) as follower:

            def ended(turns: int, what: str) -> None:
                follower.wait_for(
                    "turn.completed", lambda _: follower.kinds().count("turn.completed") >= turns
                )
                deadline.poll(lambda: settled(client, sid), what, 0.1)

            agent.script(agent.say("Noted: PAPAYA."))
            send(client, sid, "Remember the word PAPAYA")
            ended(1, "the first turn to end")
            switched = client.call(
                "agentSession.setOptions", {"sessionId": sid, "changes": {"model": model}}
            )
            assert switched["appliesAt"] == {"model": "now" if claude else "nextTurn"}
            agent.script(agent.say("Still PAPAYA."))
            send(client, sid, "And now?")
            ended(2, "the second turn to end")
            asked = agent.requests()[-1]["model"]
            assert model in asked, asked

            calls = len(agent.requests())
            agent.script(agent.say("A summary: the word is PAPAYA."))
            compacted = client.call("agentSession.command", {"sessionId": sid, "name": "compact"})
            assert compacted["dispatch"] == "accepted", compacted
            ended(3, "the compaction to end")
            assert len(agent.requests()) > calls  # the summarization call

            client.call("agentSession.command", {"sessionId": sid, "name": "clear"})
            agent.script(agent.say("Hello."))
            send(client, sid, "Hello again")
            ended(4, "the fresh turn to end")
            assert "Hello again" in agent.user_texts()
            assert not any("PAPAYA" in text for text in agent.user_texts())
        client.call("agentSession.delete", {"sessionId": sid})


def test_a_daemon_killed_mid_turn_resumes_on_every_release(agent: Agent, release: Release) -> None:
    """Without the holder (``holder = false``): the crash ends the agent."""
    deadline = Deadline(TEST_TIMEOUT_S)
    base = make_temp_dir()
    try:
        agent.script(agent.say("Noted: PAPAYA."), agent.say("A story cut short.", seconds=30))
        with (
            no_holder_config() as config,
            running_daemon(state_dir=base / "state", extra_args=config) as first,
        ):
            with Client(first.socket, timeout_s=CALL_TIMEOUT_S) as client:
                session = create(client, agent)
                sid, handle = session["sessionId"], session["providerHandle"]
                with Follower(first, sid, deadline) as follower:
                    send(client, sid, "Remember the word PAPAYA")
                    follower.wait_for("turn.completed")
                    turn_id = send(client, sid, "Tell me a story")["turnId"]
                    streaming(follower, turn_id)
                pid = get(client, sid)["child"]["pid"]
                child = read_proc_info(pid)
                assert child is not None
            first.process.kill()
            first.process.wait(timeout=10)

        with (
            no_holder_config() as config,
            running_daemon(state_dir=base / "state", extra_args=config) as second,
        ):
            now = read_proc_info(pid)  # recovery ended the orphan before serving
            assert now is None or now.is_zombie or now.start_time != child.start_time
            with Client(second.socket, timeout_s=CALL_TIMEOUT_S) as client:
                history = client.call("agentSession.history", {"sessionId": sid, "limit": 1000})
                ends = [e["body"] for e in history["events"] if e["kind"] == "turn.completed"]
                assert ends[-1] == {
                    "turnId": turn_id,
                    "outcome": "interrupted",
                    "reason": "daemon-restart",
                }
                agent.script(agent.say("Resumed after the restart."))
                with Follower(second, sid, deadline) as follower:
                    again = send(client, sid, "Where were we?")
                    done = follower.wait_for(
                        "turn.completed", lambda b: b["turnId"] == again["turnId"]
                    )
                    assert done["body"]["outcome"] == "completed", done
                # The completed turn is kept. The cut one is too on Claude Code 2.1.332
                # and Codex; 2.1.197 writes a prompt to its transcript only once the
                # reply's first block streamed, so a kill before that loses it there.
                assert "Remember the word PAPAYA" in agent.user_texts()
                info = get(client, sid)
                assert info["providerHandle"] == handle
                assert info["child"]["agentVersion"] == release.version
                client.call("agentSession.delete", {"sessionId": sid})
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("claude", CLAUDE_RELEASES, ids=lambda r: r.id)
def test_a_claude_reports_its_version_in_get_and_doctor(
    claude: Release, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """2.1.197's handshake has no version: the daemon reads it from ``--version``
    (2.1.332 says it in its handshake); both are started and reported."""
    base = make_temp_dir()
    try:
        bin_dir = base / "bin"
        bin_dir.mkdir()
        (bin_dir / "claude").symlink_to(claude.command()[0])
        path = f"{bin_dir}:{os.environ.get('PATH', '')}"
        monkeypatch.setenv("PATH", path)  # the doctor's own view
        with (
            fake_anthropic.running_fake_anthropic() as fake,
            running_daemon(env={"PATH": path}) as daemon,
            Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client,
        ):
            (base / "work").mkdir()
            created = client.call(
                "agentSession.create",
                {"provider": "claude", "cwd": str(base / "work"), "env": fake.claude_env(base)},
            )
            info = created["session"]
            assert info["child"]["agentVersion"] == claude.version

            capsys.readouterr()
            target = ["--socket", str(daemon.socket), "--state-dir", str(daemon.state_dir)]
            main([*target, "doctor", "--json"])
            checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
            assert checks["claude"]["facts"]["version"] == f"{claude.version} (Claude Code)"
            mine = checks["claude (daemon)"]
            assert mine["facts"]["path"] == str(bin_dir / "claude")
            assert mine["facts"]["version"] == claude.version
            assert f"version {claude.version}" in mine["detail"]
            client.call("agentSession.delete", {"sessionId": info["sessionId"]})
    finally:
        shutil.rmtree(base, ignore_errors=True)
