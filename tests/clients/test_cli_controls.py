"""``agentsctl options``, ``set``, ``commands``, ``command``, ``compact`` and ``clear``
against a real daemon running the mock agent; the transcript's usage line, commands
and clear marker; and token usage read from what the agents report."""

from __future__ import annotations

import io
import json

import msgspec
import pytest

from agentsctl.cli import EXIT_DAEMON_ERROR, EXIT_OK, EXIT_USAGE, UsageError
from agentsctl.commands_controls import parse_changes
from agentsctl.render import Transcript
from agentsctl.watch import render_table
from agentsd_protocol.api.events import UsageUpdated
from agentsd_protocol.api.session import TokenUsage
from agentsd_protocol.api.stream import SessionStatus
from agentsd_protocol.usage import token_usage, usage_line
from tests.clients.test_cli_conversation import (
    _event,
    events,
    new_session,
    run,
    wait_for_event,
    wait_until_idle,
)
from tests.daemon_process import DaemonProcess


def test_options_and_set_show_where_a_change_applies(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = new_session(daemon)
    code, out, _ = run(daemon, capsys, "options", sid)
    assert code == EXIT_OK
    assert "model = (default) (applies now)" in out.splitlines()
    assert "    one of mock-fast (default), mock-deep" in out.splitlines()

    code, out, _ = run(daemon, capsys, "set", sid, "model=mock-deep", "chunks=2")
    assert code == EXIT_OK
    assert out.splitlines() == [
        "chunks = 2: applies at the next start",
        "model = mock-deep: applies now",
    ]
    code, out, _ = run(daemon, capsys, "options", sid, "--json")
    values = {o["key"]: o["value"] for o in json.loads(out)["options"]}
    assert (values["model"], values["chunks"]) == ("mock-deep", 2)

    code, out, err = run(daemon, capsys, "set", sid, "model=gpt-9")
    assert code == EXIT_DAEMON_ERROR
    assert "[unknown_option]" in err and "mock-fast, mock-deep" in err
    code, out, err = run(daemon, capsys, "set", sid, "modelmock-deep")
    assert code == EXIT_USAGE and "KEY=VALUE" in err
    code, out, _ = run(daemon, capsys, "set", sid, "chunks=null")
    assert out.splitlines() == ["chunks = (default): applies at the next start"]


def test_parse_changes_reads_json_values_and_refuses_bad_words() -> None:
    assert parse_changes(["a=1", "b=true", "c=text", "d=null", 'e={"x": [1]}', "f="]) == {
        "a": 1,
        "b": True,
        "c": "text",
        "d": None,
        "e": {"x": [1]},
        "f": "",
    }
    for bad in (["a"], ["=1"], ["a=1", "a=2"]):
        with pytest.raises(UsageError):
            parse_changes(bad)


def test_commands_compact_command_and_clear(
    daemon: DaemonProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = new_session(daemon, "-m", "echo hello")
    wait_until_idle(daemon, sid)
    code, out, _ = run(daemon, capsys, "commands", sid)
    assert code == EXIT_OK
    lines = out.splitlines()
    assert lines[0].startswith("/compact") and lines[0].endswith("(agentsd)")
    assert lines[1].startswith("/clear")
    assert lines[2].split() == ["/greet", "NAME", "Say", "hello", "to", "someone"]

    code, out, _ = run(daemon, capsys, "command", sid, "greet", "Bob", "Smith")
    assert code == EXIT_OK and ": greet: accepted, turn " in out
    wait_until_idle(daemon, sid)
    replies = [e["body"]["text"] for e in events(daemon, sid) if e["kind"] == "item.completed"]
    assert replies[-1] == "Hello, Bob Smith!"

    code, out, _ = run(daemon, capsys, "compact", sid)
    assert code == EXIT_OK and ": compact: accepted" in out
    wait_until_idle(daemon, sid)
    code, out, err = run(daemon, capsys, "command", sid, "frobnicate")
    assert code == EXIT_DAEMON_ERROR and "[unknown_command]" in err

    code, out, _ = run(daemon, capsys, "clear", sid)
    assert code == EXIT_OK and ": clear: a fresh conversation (" in out
    marker = wait_for_event(daemon, sid, "conversation.cleared")
    code, out, _ = run(daemon, capsys, "log", sid)
    assert "> /greet Bob Smith" in out
    assert "-- conversation cleared: the agent starts blank (the history above stays)" in out
    assert out.index("> echo hello") < out.index("> /compact") < out.index("-- conversation")
    assert marker["seq"] > 0


def test_the_transcript_shows_usage_once_a_turn() -> None:
    out = io.StringIO()
    transcript = Transcript(out)
    usage = {
        "turnId": "t1",
        "total": {"totalTokens": 35_000, "inputTokens": 30_000, "outputTokens": 5_000},
        "last": {"totalTokens": 1_234},
        "modelContextWindow": 200_000,
    }
    transcript.event(_event(1, "usage.updated", **{**usage, "last": {"totalTokens": 900}}))
    transcript.event(_event(2, "usage.updated", **usage))
    transcript.event(_event(3, "turn.completed", turnId="t1", outcome="completed"))
    transcript.event(_event(4, "turn.completed", turnId="t2", outcome="completed"))
    assert out.getvalue().splitlines() == [
        "(turn 1.2k tokens, 35k in all, 99% of the context left (198k of 200k))"
    ]


def test_token_usage_reads_codex_and_claude_counts() -> None:
    codex = token_usage(
        UsageUpdated(
            total={"totalTokens": 5000, "inputTokens": 4000, "outputTokens": 1000},
            last={"totalTokens": 3000},
            model_context_window=10_000,
        )
    )
    assert (codex.turn_tokens, codex.total_tokens, codex.context_tokens) == (3000, 5000, 3000)
    assert codex.context_left == 7000
    # Claude Code sums a turn's calls; the context is the last call's (contextTokens).
    claude = token_usage(
        UsageUpdated(
            total={"totalTokens": 9000},
            last={"totalTokens": 6000, "contextTokens": 2500},
            model_context_window=2000,
        )
    )
    assert (claude.turn_tokens, claude.context_tokens, claude.context_left) == (6000, 2500, 0)
    nothing = token_usage(UsageUpdated())
    assert nothing.context_left is None and usage_line(nothing) is None


def test_watch_shows_the_context_left() -> None:
    base = SessionStatus(
        session_id="s1", title="t", provider="codex", phase="running", status="idle", head_seq=3
    )
    told = msgspec.structs.replace(
        base, tokens=TokenUsage(context_window=200_000, context_left=50_000), updated_at=10.0
    )
    table = render_table(
        {"s1": base, "s2": msgspec.structs.replace(told, session_id="s2")}, 10.0, 200
    )
    header, newer, older = table.splitlines()
    assert header.split() == ["STATE", "SESSION", "TITLE", "AGE", "CONTEXT", "NEEDS", "YOU"]
    assert "25% left" in newer and newer.split()[1] == "s2"
    assert older.split()[4] == "-"
