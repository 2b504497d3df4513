"""Conversation controls against the real ``codex app-server`` (the newest pinned
release), offline against ``fake_openai``, which records what the model was asked:
the options list Codex's models, a model switch mid-session reaches the next model
request, a compaction request reaches the model server, and ``clear`` starts a
thread that shows the model none of the earlier messages while the journal keeps
them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentsctl.client import Client
from agentsd.providers.programs import CODEX, find_program
from tests.daemon_process import DaemonProcess
from tests.peers.codex_peer import create_codex, peer_daemon, send
from tests.peers.conftest import Deadline, Follower
from tests.peers.fake_openai import FakeOpenAI, TextReply, input_texts

__all__ = ["peer_daemon"]  # the module's daemon (codex_peer), a fixture

pytestmark = pytest.mark.skipif(
    find_program(CODEX) is None, reason="codex is not installed (the test extras ship it)"
)


def completed_turns(follower: Follower, count: int) -> None:
    """Wait for the session's ``count``-th ``turn.completed``."""
    follower.wait_for("turn.completed", lambda _: follower.kinds().count("turn.completed") >= count)


def history(client: Client, sid: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = client.call(
        "agentSession.history", {"sessionId": sid, "afterSeq": 0}
    )["events"]
    return events


def test_options_list_models_and_a_model_switch_reaches_the_next_request(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(TextReply("one"), TextReply("two"))
    sid = create_codex(client, workdir, codex_env, model="fake-model")["sessionId"]
    listed = client.call("agentSession.options", {"sessionId": sid})
    assert listed["running"] is True
    options = {o["key"]: o for o in listed["options"]}
    assert options["model"]["value"] == "fake-model"
    assert options["model"]["choices"], "codex's model/list names its models"
    assert options["model"]["appliesAt"] == "nextTurn"
    assert options["sandbox"]["open"] is False

    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "first")
        completed_turns(follower, 1)
        switched = client.call(
            "agentSession.setOptions",
            {"sessionId": sid, "changes": {"model": "other-model", "effort": "low"}},
        )
        assert switched["appliesAt"] == {"model": "nextTurn", "effort": "nextTurn"}
        send(client, sid, "second")
        completed_turns(follower, 2)
    first, second = fake.requests()
    assert first.body["model"] == "fake-model"
    assert second.body["model"] == "other-model"
    assert second.body["reasoning"]["effort"] == "low"
    assert input_texts(second.body, "user")[-1] == "second"


def test_compact_reaches_the_model_server_and_clear_starts_blank(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(TextReply("noted"), TextReply("A summary."), TextReply("fresh"))
    info = create_codex(client, workdir, codex_env, model="fake-model")
    sid, thread = info["sessionId"], info["providerHandle"]
    commands = client.call("agentSession.commands", {"sessionId": sid})["commands"]
    names = [c["name"] for c in commands]
    assert names[:3] == ["compact", "clear", "review"]

    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "remember the word pelican")
        completed_turns(follower, 1)
        compacted = client.call("agentSession.command", {"sessionId": sid, "name": "compact"})
        assert compacted["dispatch"] == "accepted", compacted
        completed_turns(follower, 2)
        follower.wait_for("item.completed", lambda b: b["type"] == "contextCompaction")
    requests = fake.requests()
    assert len(requests) == 2
    compaction = requests[1].body
    # The compaction request shows the model the conversation and asks for a summary.
    assert "remember the word pelican" in input_texts(compaction, "user")
    assert "CONTEXT CHECKPOINT COMPACTION" in input_texts(compaction, "user")[-1]

    cleared = client.call("agentSession.command", {"sessionId": sid, "name": "clear"})
    assert cleared["handle"] and cleared["handle"] != thread
    with Follower(peer_daemon, sid, deadline) as follower:
        send(client, sid, "hello again")
        completed_turns(follower, 3)
    fresh = fake.requests()[2].body
    assert input_texts(fresh, "user")[-1] == "hello again"
    shown = " ".join(input_texts(fresh, "user") + input_texts(fresh, "assistant"))
    assert "pelican" not in shown and "COMPACTION" not in shown
    events = history(client, sid)
    kinds = [e["kind"] for e in events]
    assert kinds.count("conversation.cleared") == 1
    texts = [e["body"]["text"] for e in events if e["kind"] == "submission"]
    assert texts == ["remember the word pelican", "hello again"]
    usage = client.call("agentSession.get", {"sessionId": sid})["session"]["tokens"]
    assert usage["totalTokens"] > 0


def test_review_runs_through_review_start(
    client: Client,
    peer_daemon: DaemonProcess,
    fake: FakeOpenAI,
    codex_env: dict[str, str],
    workdir: Path,
    deadline: Deadline,
) -> None:
    fake.script(TextReply("Looks fine to me."))
    sid = create_codex(client, workdir, codex_env, model="fake-model")["sessionId"]
    with Follower(peer_daemon, sid, deadline) as follower:
        ran = client.call(
            "agentSession.command",
            {"sessionId": sid, "name": "review", "args": "check the spelling"},
        )
        assert ran["dispatch"] == "accepted", ran
        assert ran["turnId"]
        done = follower.wait_for("turn.completed")
        assert done["body"]["turnId"] == ran["turnId"]
    (request,) = fake.requests()
    assert any("check the spelling" in text for text in input_texts(request.body, "user"))
    runs = [e["body"] for e in history(client, sid) if e["kind"] == "command.run"]
    assert runs == [{"name": "review", "args": "check the spelling"}]
