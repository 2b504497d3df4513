"""Conversation controls against the real Claude Code CLI, offline against
``fake_anthropic``, which records what the model was asked: the options list the
models of its initialize answer, a model switch (``set_model``) reaches the next
model request, ``compact`` reaches the model server as Claude Code's own
summarization request, and ``clear`` starts a session whose next model request
carries none of the earlier messages while the journal keeps them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentsd_protocol.errors import UnknownOption
from tests.daemon_process import DaemonProcess
from tests.peers.fake_anthropic import FakeAnthropic, RecordedRequest, TextReply, _texts
from tests.peers.test_claude import (
    Conversation,
    conversation,
    daemon,
    fake,
    home,
    needs_claude,
)

__all__ = ["daemon", "fake", "home"]  # the fixtures this module shares with test_claude


def turns_done(convo: Conversation, count: int) -> None:
    """Wait for the session's ``count``-th ``turn.completed``."""
    seq = 0
    for _ in range(count):
        seq = convo.wait_for("turn.completed", after_seq=seq)["seq"]


def asked_with(fake: FakeAnthropic, text: str) -> list[RecordedRequest]:
    """The model calls whose last message carries ``text`` (the turn's own call, not
    a side request such as a title)."""
    return [r for r in fake.message_requests() if text in _last_user_texts(r)]


def _last_user_texts(request: RecordedRequest) -> list[str]:
    users = [m for m in request.messages if m.get("role") == "user"]
    return _texts(users[-1].get("content")) if users else []


def options_of(convo: Conversation) -> dict[str, dict[str, Any]]:
    return {o["key"]: o for o in convo.call("agentSession.options")["options"]}


@needs_claude
def test_options_list_models_and_set_model_reaches_the_next_request(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    fake.script(TextReply("one"), TextReply("two"))
    with conversation(daemon, fake.claude_env(home), home / "work") as convo:
        options = options_of(convo)
        assert options["model"]["choices"], "initialize lists the models"
        assert options["model"]["appliesAt"] == "now"
        assert options["permissionMode"]["appliesAt"] == "now"
        assert options["effort"]["appliesAt"] == "nextStart"

        convo.send("first question")
        turns_done(convo, 1)
        switched = convo.call(
            "agentSession.setOptions",
            changes={"model": "sonnet", "permissionMode": "acceptEdits"},
        )
        assert switched["appliesAt"] == {"model": "now", "permissionMode": "now"}
        convo.send("second question")
        turns_done(convo, 2)
        (first,) = asked_with(fake, "first question")
        (second,) = asked_with(fake, "second question")
        assert "sonnet" not in first.body["model"]
        assert "sonnet" in second.body["model"]  # the alias, as this release resolves it

        with pytest.raises(UnknownOption):
            convo.call("agentSession.setOptions", changes={"permissionMode": "yolo"})
        usage = convo.info()["tokens"]
        assert usage["turnTokens"] > 0 and usage["contextWindow"] > 0
        assert usage["contextLeft"] == usage["contextWindow"] - usage["contextTokens"]
        listed = convo.client.call("agentSession.list", {})["sessions"]
        assert next(i for i in listed if i["sessionId"] == convo.session_id)["tokens"] == usage
        watched = convo.client.call("agentSession.watch", {})["sessions"]
        assert next(i for i in watched if i["sessionId"] == convo.session_id)["tokens"] == usage


@needs_claude
def test_compact_reaches_the_model_server_and_clear_starts_blank(
    daemon: DaemonProcess, fake: FakeAnthropic, home: Path
) -> None:
    fake.script(TextReply("noted"), TextReply("A summary of it all."), TextReply("fresh"))
    with conversation(daemon, fake.claude_env(home), home / "work") as convo:
        old = convo.info()["providerHandle"]
        names = [c["name"] for c in convo.call("agentSession.commands")["commands"]]
        assert names[:2] == ["compact", "clear"]
        assert "compact" not in names[2:]  # the agent's own /compact is agentsd's compact

        convo.send("remember the word pelican")
        turns_done(convo, 1)
        before = len(fake.message_requests())
        compacted = convo.call("agentSession.command", name="compact")
        assert compacted["dispatch"] == "accepted", compacted
        turns_done(convo, 2)
        summarizing = fake.message_requests()[before:]
        # Claude Code's own summarization call: the conversation, then its instruction
        # to summarize it (never "/compact" handed to the model as a prompt).
        assert summarizing
        for request in summarizing:
            assert "pelican" in " ".join(request.texts())
            asked = " ".join(_last_user_texts(request))
            assert "summary" in asked.lower() and "/compact" not in asked

        cleared = convo.call("agentSession.command", name="clear")
        assert cleared["handle"] and cleared["handle"] != old
        convo.send("hello again")
        turns_done(convo, 3)
        (fresh,) = asked_with(fake, "hello again")
        assert not any("pelican" in text for text in fresh.texts())
        events = convo.history()
        assert [e["kind"] for e in events].count("conversation.cleared") == 1
        texts = [e["body"]["text"] for e in events if e["kind"] == "submission"]
        assert texts == ["remember the word pelican", "hello again"]
