"""What an editor can review through ``agentsctl acp``: tool calls with titles,
kinds, locations, diffs and output, plans, usage and titles, from the events the
real providers' own code writes; live and replayed alike; and the must-hold set
driven by the Python ACP SDK against the real ``codex`` and ``claude``.

The TypeScript SDK drives the same set in ``test_acp_sdk_review`` below, through
``acp_client/driver.mjs``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from agentsctl.acp.updates import UpdateTranslator
from agentsctl.client import Client
from agentsd.providers import codex_events
from agentsd.providers.claude_items import Items
from agentsd.providers.programs import CLAUDE, find_program
from agentsd_protocol.api.events import (
    ApprovalRequested,
    ApprovalResolved,
    Event,
    TurnCompleted,
    TurnStarted,
    encode_body,
    kind_of,
)
from agentsd_protocol.api.stream import DeltaNotification, JournalEvent
from tests.clients.test_acp import DRIVER, _require_node
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon
from tests.peers.agents import CODEX_RELEASES
from tests.peers.fake_anthropic import (
    FakeAnthropic,
    TextReply,
    ToolUseReply,
    running_fake_anthropic,
)
from tests.peers.fake_openai import (
    API_KEY_ENV,
    FakeOpenAI,
    ShellCall,
    running_fake_openai,
)
from tests.peers.fake_openai import TextReply as OpenAIText

# -- journals as the providers write them -----------------------------------------------


@attrs.define
class Journal:
    """What a provider's code emitted, in order: events and streamed deltas."""

    entries: list[Event | tuple[str, str]] = attrs.field(factory=list)

    async def emit(self, event: Event) -> int:
        self.entries.append(event)
        return len(self.entries)

    def delta(self, item_id: str, text: str) -> None:
        self.entries.append((item_id, text))

    def stream(self, *, deltas: bool) -> list[JournalEvent | DeltaNotification]:
        """The journal as a subscriber gets it: live (``deltas``) or replayed."""
        out: list[JournalEvent | DeltaNotification] = []
        offsets: dict[str, int] = {}
        for seq, entry in enumerate(self.entries, start=1):
            if isinstance(entry, tuple):
                item_id, text = entry
                offset = offsets.get(item_id, 0)
                offsets[item_id] = offset + len(text)
                if deltas:
                    out.append(
                        DeltaNotification(
                            subscription_id="s",
                            session_id="s",
                            item_id=item_id,
                            offset=offset,
                            text=text,
                            after_seq=seq,
                        )
                    )
                continue
            body = msgspec.Raw(encode_body(entry))
            out.append(JournalEvent(seq=seq, ts=0.0, fence=1, kind=kind_of(entry), body=body))
        return out


def shown(
    stream: list[JournalEvent | DeltaNotification], cwd: str | None = None
) -> list[dict[str, Any]]:
    """The editor's updates for ``stream``, consecutive chunks of one message merged
    (deltas cut text anywhere; what counts is the text and where it stands)."""
    translator = UpdateTranslator(cwd)
    updates: list[dict[str, Any]] = []
    for item in stream:
        produced = (
            translator.delta(item)
            if isinstance(item, DeltaNotification)
            else translator.event(item)
        )
        for update in msgspec.to_builtins(produced):
            last = updates[-1] if updates else None
            chunk = update["sessionUpdate"].endswith("_chunk")
            if (
                chunk
                and last is not None
                and last["sessionUpdate"] == update["sessionUpdate"]
                and last.get("messageId") == update.get("messageId")
            ):
                last["content"]["text"] += update["content"]["text"]
            else:
                updates.append(update)
    return updates


def codex_item(kind: str, item: dict[str, Any], turn: str = "t1") -> dict[str, Any]:
    return {"turnId": turn, "item": item}


def codex_journal(steps: list[tuple[str, Any]]) -> Journal:
    """A Codex turn through the provider's own translation (``codex_events``)."""
    journal = Journal()
    run = journal.entries.append
    done: dict[str, Any]
    run(TurnStarted(turn_id="t1"))
    for n, (what, value) in enumerate(steps):
        item_id = f"i{n}"
        if what == "message":
            pieces: list[str] = value
            run(
                codex_events.item_started(
                    codex_item("started", {"id": item_id, "type": "agentMessage"})
                )
            )
            for piece in pieces:
                journal.delta(item_id, piece)
            done = {"id": item_id, "type": "agentMessage", "text": "".join(pieces)}
            run(codex_events.item_completed(codex_item("completed", done)))
        elif what == "plan":
            pieces = value
            run(codex_events.item_started(codex_item("started", {"id": item_id, "type": "plan"})))
            for piece in pieces:
                journal.delta(item_id, piece)
            done = {"id": item_id, "type": "plan", "text": "".join(pieces)}
            run(codex_events.item_completed(codex_item("completed", done)))
        elif what == "command":
            command, output, asked = value
            item: dict[str, Any] = {
                "id": item_id,
                "type": "commandExecution",
                "command": command,
                "cwd": "/w",
            }
            run(codex_events.item_started(codex_item("started", {**item, "status": "inProgress"})))
            if asked is not None:
                run(
                    ApprovalRequested(
                        approval_id=f"ap-{n}",
                        native_id=str(n),
                        approval_kind="command",
                        title=f"Run {command}?",
                        detail=command,
                        options=["accept", "decline"],
                        item_id=item_id,
                    )
                )
                run(ApprovalResolved(approval_id=f"ap-{n}", decision=asked, by="client"))
            status = "declined" if asked == "decline" else "completed"
            done = {**item, "status": status, "aggregatedOutput": output, "exitCode": 0}
            run(codex_events.item_completed(codex_item("completed", done)))
        elif what == "edit":
            path, diff = value
            change = {"path": path, "kind": {"type": "update", "move_path": None}, "diff": diff}
            item = {"id": item_id, "type": "fileChange", "changes": [change]}
            run(codex_events.item_started(codex_item("started", {**item, "status": "inProgress"})))
            run(
                codex_events.item_completed(
                    codex_item("completed", {**item, "status": "completed"})
                )
            )
        elif what == "steps":
            run(codex_events.turn_plan({"turnId": "t1", "plan": value}))
    run(TurnCompleted(turn_id="t1", outcome="completed"))
    return journal


def claude_journal(steps: list[tuple[str, Any]]) -> Journal:
    """A Claude Code turn through the provider's own translation (``claude_items``)."""
    journal = Journal()
    items = Items(journal)  # type: ignore[arg-type]  # emit and delta are all it uses

    async def run() -> None:
        await journal.emit(TurnStarted(turn_id="t1"))
        for n, (what, value) in enumerate(steps):
            message_id = f"msg_{n}"
            if what == "message":
                pieces: list[str] = value
                await items.on_stream_event(
                    {"event": {"type": "message_start", "message": {"id": message_id}}}, "t1"
                )
                start = {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text"},
                }
                await items.on_stream_event({"event": start}, "t1")
                for piece in pieces:
                    delta = {"type": "text_delta", "text": piece}
                    event = {"type": "content_block_delta", "index": 0, "delta": delta}
                    await items.on_stream_event({"event": event}, "t1")
                block = {"type": "text", "text": "".join(pieces)}
                message = {"id": message_id, "content": [block]}
                await items.on_assistant({"message": message}, "t1")
            else:
                name, tool_input, output, error = value
                block = {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": tool_input}
                await items.on_assistant({"message": {"id": message_id, "content": [block]}}, "t1")
                result = {
                    "type": "tool_result",
                    "tool_use_id": f"toolu_{n}",
                    "content": output,
                    "is_error": error,
                }
                await items.on_tool_results({"message": {"content": [result]}}, "t1")
        await journal.emit(TurnCompleted(turn_id="t1", outcome="completed"))

    asyncio.run(run())
    return journal


UPDATE_DIFF = "@@ -2,3 +2,3 @@\n two\n-three\n+THREE\n four\n@@ -9,2 +9,2 @@\n nine\n-ten\n+TEN\n"


def test_a_codex_command_shows_its_command_line_and_output() -> None:
    journal = codex_journal([("command", ("/bin/bash -lc 'ls'", "a.py\nb.py\n", None))])
    calls = [u for u in shown(journal.stream(deltas=False)) if "toolCallId" in u]
    assert calls[0]["title"] == "/bin/bash -lc 'ls'"
    assert calls[0]["kind"] == "execute"
    assert calls[0]["status"] == "in_progress"
    assert calls[-1]["status"] == "completed"
    assert calls[-1]["content"] == [
        {"type": "content", "content": {"type": "text", "text": "a.py\nb.py\n"}}
    ]
    assert calls[-1]["rawOutput"] == {
        "status": "completed",
        "exitCode": 0,
        "output": "a.py\nb.py\n",
    }


def test_a_codex_edit_is_a_diff_per_hunk_at_its_lines() -> None:
    journal = codex_journal([("edit", ("/w/src/a.py", UPDATE_DIFF))])
    [call, done] = [u for u in shown(journal.stream(deltas=False), cwd="/w") if "toolCallId" in u]
    assert (call["title"], call["kind"], call["status"]) == ("Edit src/a.py", "edit", "in_progress")
    assert call["content"] == [
        {
            "type": "diff",
            "path": "/w/src/a.py",
            "oldText": "two\nthree\nfour\n",
            "newText": "two\nTHREE\nfour\n",
        },
        {"type": "diff", "path": "/w/src/a.py", "oldText": "nine\nten\n", "newText": "nine\nTEN\n"},
    ]
    assert call["locations"] == [
        {"path": "/w/src/a.py", "line": 2},
        {"path": "/w/src/a.py", "line": 9},
    ]
    assert done["status"] == "completed"
    assert [c["type"] for c in done["content"]] == ["diff", "diff"], "the diffs stay on the card"


def test_a_codex_new_file_is_a_diff_from_nothing() -> None:
    change = {"path": "/w/new.txt", "kind": {"type": "add"}, "diff": "hello\n"}
    item = {"id": "f", "type": "fileChange", "changes": [change], "status": "inProgress"}
    started = codex_events.item_started({"turnId": "t", "item": item})
    [call] = msgspec.to_builtins(UpdateTranslator("/w").event(as_journal_event(started)))
    assert call["title"] == "Create new.txt"
    assert call["content"] == [
        {"type": "diff", "path": "/w/new.txt", "oldText": None, "newText": "hello\n"}
    ]


def as_journal_event(event: Event, seq: int = 1) -> JournalEvent:
    return JournalEvent(
        seq=seq, ts=0.0, fence=1, kind=kind_of(event), body=msgspec.Raw(encode_body(event))
    )


def test_a_codex_plan_is_one_plan_update_and_its_proposed_plan_is_text_once() -> None:
    steps = [
        {"step": "Read the code", "status": "completed"},
        {"step": "Fix it", "status": "inProgress"},
    ]
    journal = codex_journal([("steps", steps), ("plan", ["# Plan\n", "1. fix"])])
    for deltas in (True, False):
        updates = shown(journal.stream(deltas=deltas))
        assert updates == [
            {
                "sessionUpdate": "plan",
                "entries": [
                    {"content": "Read the code", "priority": "medium", "status": "completed"},
                    {"content": "Fix it", "priority": "medium", "status": "in_progress"},
                ],
            },
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "# Plan\n1. fix"},
                "messageId": "i1",
            },
        ]


def test_a_claude_command_shows_its_output() -> None:
    journal = claude_journal([("tool", ("Bash", {"command": "echo hi"}, "hi", False))])
    calls = [u for u in shown(journal.stream(deltas=False)) if "toolCallId" in u]
    assert (calls[0]["title"], calls[0]["kind"]) == ("echo hi", "execute")
    assert calls[-1]["status"] == "completed"
    assert calls[-1]["content"] == [{"type": "content", "content": {"type": "text", "text": "hi"}}]


def test_claude_edits_are_diffs_with_their_file() -> None:
    edit = {"file_path": "/w/a.py", "old_string": "x = 1", "new_string": "x = 2"}
    write = {"file_path": "/w/b.py", "content": "print()\n"}
    journal = claude_journal(
        [("tool", ("Edit", edit, "ok", False)), ("tool", ("Write", write, "ok", False))]
    )
    announced = [
        u
        for u in shown(journal.stream(deltas=False), cwd="/w")
        if u["sessionUpdate"] == "tool_call"
    ]
    assert [(u["title"], u["kind"]) for u in announced] == [
        ("Edit a.py", "edit"),
        ("Write b.py", "edit"),
    ]
    assert [u["content"] for u in announced] == [
        [{"type": "diff", "path": "/w/a.py", "oldText": "x = 1", "newText": "x = 2"}],
        [{"type": "diff", "path": "/w/b.py", "oldText": None, "newText": "print()\n"}],
    ]
    assert [u["locations"] for u in announced] == [[{"path": "/w/a.py"}], [{"path": "/w/b.py"}]]


def test_claudes_todo_list_is_a_plan_not_a_tool_call() -> None:
    todos = [
        {"content": "Read", "status": "completed", "activeForm": "Reading"},
        {"content": "Edit", "status": "in_progress", "activeForm": "Editing"},
    ]
    journal = claude_journal([("tool", ("TodoWrite", {"todos": todos}, "ok", False))])
    assert shown(journal.stream(deltas=False)) == [
        {
            "sessionUpdate": "plan",
            "entries": [
                {"content": "Read", "priority": "medium", "status": "completed"},
                {"content": "Edit", "priority": "medium", "status": "in_progress"},
            ],
        }
    ]


@pytest.mark.parametrize(("answer", "status"), [("Blue", "in_progress"), ("decline", "failed")])
def test_a_questions_label_is_a_success(answer: str, status: str) -> None:
    translator = UpdateTranslator()
    question = ApprovalRequested(
        approval_id="ap-q",
        native_id="q",
        approval_kind="question",
        title="Colour?",
        detail="",
        options=["Red", "Blue", "decline"],
        item_id="toolu_q",
    )
    translator.event(as_journal_event(question))
    resolved = ApprovalResolved(approval_id="ap-q", decision=answer, by="client")
    [update] = msgspec.to_builtins(translator.event(as_journal_event(resolved, 2)))
    assert update["status"] == status


def test_usage_and_titles_reach_the_editor() -> None:
    usage = codex_events.usage_updated(
        {
            "turnId": "t",
            "tokenUsage": {
                "total": {"totalTokens": 30},
                "last": {"totalTokens": 15},
                "modelContextWindow": 1000,
            },
        }
    )
    translator = UpdateTranslator()
    assert msgspec.to_builtins(translator.event(as_journal_event(usage))) == [
        {"sessionUpdate": "usage_update", "used": 15, "size": 1000}
    ]
    titled = JournalEvent(
        seq=2, ts=0.0, fence=1, kind="session.updated", body=msgspec.Raw(b'{"title":"Fix the bug"}')
    )
    assert msgspec.to_builtins(translator.event(titled)) == [
        {"sessionUpdate": "session_info_update", "title": "Fix the bug"}
    ]


def test_long_output_is_bounded_and_says_so() -> None:
    journal = codex_journal([("command", ("yes", "y\n" * 100_000, None))])
    done = [u for u in shown(journal.stream(deltas=False)) if "toolCallId" in u][-1]
    text = done["content"][0]["content"]["text"]
    assert len(text) < 17 * 1024
    assert text.endswith("bytes in all; the rest is not shown)")
    assert "200000 bytes" in text


# -- live and replayed: the same updates -------------------------------------------------

_pieces = hs.lists(hs.text(min_size=1, max_size=12), min_size=1, max_size=4)
_codex_steps = hs.lists(
    hs.one_of(
        hs.tuples(hs.just("message"), _pieces),
        hs.tuples(hs.just("plan"), _pieces),
        hs.tuples(
            hs.just("command"),
            hs.tuples(
                hs.text(min_size=1, max_size=20),
                hs.text(max_size=40),
                hs.sampled_from([None, "accept", "decline"]),
            ),
        ),
        hs.tuples(hs.just("edit"), hs.tuples(hs.just("/w/a.py"), hs.just(UPDATE_DIFF))),
        hs.tuples(
            hs.just("steps"),
            hs.lists(
                hs.fixed_dictionaries(
                    {
                        "step": hs.text(max_size=10),
                        "status": hs.sampled_from(["pending", "inProgress", "completed"]),
                    }
                ),
                max_size=3,
            ),
        ),
    ),
    max_size=6,
)
_claude_tools = hs.sampled_from(
    [
        ("Bash", {"command": "echo hi"}, "hi", False),
        ("Bash", {"command": "false"}, "Exit code 1", True),
        ("Edit", {"file_path": "/w/a.py", "old_string": "a", "new_string": "b"}, "ok", False),
        ("Write", {"file_path": "/w/n.py", "content": "x\n"}, "ok", False),
        ("Read", {"file_path": "/w/a.py", "offset": 10}, "a", False),
        ("Grep", {"pattern": "TODO", "path": "/w"}, "a.py", False),
        ("TodoWrite", {"todos": [{"content": "x", "status": "pending"}]}, "ok", False),
        ("mcp__files__list", {"dir": "/"}, "[]", False),
    ]
)
_claude_steps = hs.lists(
    hs.one_of(hs.tuples(hs.just("message"), _pieces), hs.tuples(hs.just("tool"), _claude_tools)),
    max_size=6,
)


@settings(max_examples=60, deadline=None)  # a shared machine: no per-example deadline
@given(steps=_codex_steps)
def test_a_codex_journal_live_and_replayed_shows_the_same(steps: list[tuple[str, Any]]) -> None:
    journal = codex_journal(steps)
    assert shown(journal.stream(deltas=True), "/w") == shown(journal.stream(deltas=False), "/w")


@settings(max_examples=60, deadline=None)
@given(steps=_claude_steps)
def test_a_claude_journal_live_and_replayed_shows_the_same(steps: list[tuple[str, Any]]) -> None:
    journal = claude_journal(steps)
    assert shown(journal.stream(deltas=True), "/w") == shown(journal.stream(deltas=False), "/w")


# -- the must-hold set, against the real agents, through both ACP SDKs ---------------

ACP_TEST_AGENT = Path(__file__).parents[1] / "peers" / "acp_test_agent.py"
CODEX_NEWEST = next(r for r in CODEX_RELEASES if r.newest)
CLAUDE_PROGRAM = find_program(CLAUDE)
SDK_TIMEOUT_S = 240.0  # one scenario: a few real agent turns on a shared 2-core machine
A_PY = "one\ntwo\nthree\nfour\nfive\n"
PATCH = (
    "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: a.py\n@@\n two\n-three\n+THREE\n"
    " four\n*** End Patch\nEOF"
)


@attrs.frozen
class Review:
    """A daemon whose codex and claude talk to fake model servers, and
    ``testacp`` (the tests' ACP agent)."""

    daemon: DaemonProcess
    openai: FakeOpenAI
    anthropic: FakeAnthropic
    base: Path

    def workdir(self, name: str) -> Path:
        path = self.base / name
        path.mkdir()
        (path / "a.py").write_text(A_PY)
        return path

    def journals(self) -> str:
        """Every session's journal, for a failure's message."""
        with Client(self.daemon.socket) as client:
            sessions = client.call("agentSession.list", {})["sessions"]
        return "\n".join(
            f"{e['kind']} {json.dumps(e['body'])[:300]}"
            for info in sessions
            for e in self.journal(info["sessionId"])
        )

    def journal(self, session_id: str) -> list[dict[str, Any]]:
        with Client(self.daemon.socket) as client:
            events: list[dict[str, Any]] = client.call(
                "agentSession.history", {"sessionId": session_id, "afterSeq": 0, "limit": 1000}
            )["events"]
        return events


@pytest.fixture(scope="module")
def review() -> Iterator[Review]:
    if CLAUDE_PROGRAM is None:
        why = "claude is not installed (the test extras ship it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    base = make_temp_dir()
    try:
        with running_fake_openai() as openai, running_fake_anthropic() as anthropic:
            codex_home = openai.write_codex_home(base / "codex-home")
            env = {"CODEX_HOME": str(codex_home), API_KEY_ENV: "dummy"}
            env |= anthropic.claude_env(base / "claude-home")
            config = base / "config.toml"
            config.write_text(
                'agent_env = "inherit"\n'
                f"[providers.codex]\ncommand = {json.dumps(CODEX_NEWEST.command())}\n"
                f"[agents.testacp]\ncommand = {json.dumps([sys.executable, str(ACP_TEST_AGENT)])}\n"
            )
            with running_daemon(extra_args=["--config", str(config)], env=env) as daemon:
                yield Review(daemon, openai, anthropic, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def script_codex(review: Review) -> None:
    review.openai.script(
        ShellCall(PATCH, escalate=False),
        OpenAIText("Edited a.py."),
        ShellCall("touch approved.txt"),
        OpenAIText("Ran it."),
    )


def script_claude(review: Review) -> None:
    question = {
        "question": "Which colour?",
        "header": "Colour",
        "options": [
            {"label": "Red", "description": "warm"},
            {"label": "Blue", "description": "calm"},
        ],
        "multiSelect": False,
    }
    review.anthropic.script(
        ToolUseReply({"command": "echo claude-out", "description": "Say it"}),
        TextReply("Said it."),
        ToolUseReply({"questions": [question]}, name="AskUserQuestion"),
        TextReply("Blue it is."),
        ToolUseReply({"command": "echo hi > hi.txt", "description": "Write hi"}),
        TextReply("Wrote it."),
    )


def check_journals(review: Review, report: dict[str, Any]) -> None:
    """What the daemon recorded of a scenario: the CLI's answers won, once each."""
    for key in ("codexSession", "claudeSession"):
        if report[key] is None:
            continue
        resolved = [
            (e["body"]["decision"], e["body"]["by"])
            for e in review.journal(report[key])
            if e["kind"] == "approval.resolved"
        ]
        expected = (
            [("accept", "client")]
            if key == "codexSession"
            else [
                ("Blue", "client"),
                ("allow", "client"),
            ]
        )
        assert resolved == expected, (key, resolved)


# The Python ACP SDK: an editor written with it, driving `agentsctl acp`.


class PyEditor:
    """An ACP client on the Python SDK. It ignores ``$/cancel_request`` (the SDK has
    no handler for it): a permission request closes only by the tool call's update."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.permission: Any = None

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update.model_dump(mode="json", by_alias=True, exclude_none=True))
        self.changed.set()
        self.changed = asyncio.Event()

    async def request_permission(
        self, options: Any, session_id: str, tool_call: Any, **kwargs: Any
    ) -> Any:
        assert self.permission is not None, "no permission request was expected"
        return await self.permission(options, session_id, tool_call, kwargs)

    async def until(self, predicate: Any) -> None:
        while not predicate():
            await self.changed.wait()

    def mark(self) -> int:
        return len(self.updates)

    def since(self, mark: int) -> list[dict[str, Any]]:
        return self.updates[mark:]


def tool_history(updates: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each tool call's updates by id, the announcement first."""
    calls: dict[str, list[dict[str, Any]]] = {}
    for update in updates:
        if update["sessionUpdate"] == "tool_call":
            assert update["toolCallId"] not in calls, "announced twice"
            calls[update["toolCallId"]] = [update]
        elif update["sessionUpdate"] == "tool_call_update":
            calls[update["toolCallId"]].append(update)
    return calls


def final(history: list[dict[str, Any]], field: str) -> Any:
    return next(u[field] for u in reversed(history) if field in u)


def cancelled_outcome() -> Any:
    from acp.schema import DeniedOutcome, RequestPermissionResponse

    return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))


def selected(option_id: str) -> Any:
    from acp.schema import AllowedOutcome, RequestPermissionResponse

    return RequestPermissionResponse(
        outcome=AllowedOutcome(outcome="selected", option_id=option_id)
    )


async def approve_from_the_cli(
    review: Review, session_id: str, approval_id: str, decision: str
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentsctl.cli",
        "--socket",
        str(review.daemon.socket),
        "--no-start",
        "approve",
        "--decision",
        decision,
        session_id,
        approval_id,
        stdout=asyncio.subprocess.DEVNULL,
    )
    assert await process.wait() == 0


async def py_scenario(review: Review, provider: str, cwd: Path) -> dict[str, Any]:
    from acp import RequestError, text_block
    from acp.stdio import spawn_agent_process

    editor = PyEditor()
    args = ["-m", "agentsctl.cli", "--socket", str(review.daemon.socket), "--no-start", "acp"]
    report: dict[str, Any] = {}
    async with spawn_agent_process(
        lambda agent: editor,  # type: ignore[arg-type,return-value]
        sys.executable,
        *args,
        "--provider",
        provider,
    ) as (conn, _process):
        # Protocol hygiene: nothing before initialize; an unknown version gets 1.
        with pytest.raises(RequestError) as early:
            await conn.new_session(cwd=str(cwd))
        assert early.value.code == -32600
        initialized = await conn.initialize(protocol_version=0)
        assert initialized.protocol_version == 1
        session_id = (await conn.new_session(cwd=str(cwd))).session_id
        report["session"] = session_id

        async def prompt(text: str) -> str:
            result = await conn.prompt(session_id=session_id, prompt=[text_block(text)])
            return str(result.stop_reason)

        if provider == "codex":
            # An edit, reviewable as a diff at its file and line.
            mark = editor.mark()
            assert await prompt("Edit a.py") == "end_turn"
            [edit] = [
                h for h in tool_history(editor.since(mark)).values() if h[0]["kind"] == "edit"
            ]
            assert edit[0]["title"] == "Edit a.py"
            assert {
                "type": "diff",
                "path": str(cwd / "a.py"),
                "oldText": "two\nthree\nfour\n",
                "newText": "two\nTHREE\nfour\n",
            } in edit[0]["content"]
            assert {"path": str(cwd / "a.py"), "line": 2} in edit[0]["locations"]
            assert final(edit, "status") == "completed"
            # An approval answered from the CLI closes the editor's dialog.
            await approve_elsewhere(review, editor, session_id, prompt, report)
        elif provider == "claude":
            # A command with its output.
            mark = editor.mark()
            assert await prompt("Say it") == "end_turn"
            [bash] = [
                h for h in tool_history(editor.since(mark)).values() if h[0]["kind"] == "execute"
            ]
            assert bash[0]["title"] == "echo claude-out"
            assert final(bash, "status") == "completed"
            assert final(bash, "content") == [
                {"type": "content", "content": {"type": "text", "text": "claude-out"}}
            ]
            # A question answered with a label is a success.
            asked: list[Any] = []

            async def answer(options: Any, _sid: str, tool_call: Any, meta: dict[str, Any]) -> Any:
                asked.append([(o.option_id, o.kind) for o in options])
                report["questionId"] = tool_call.tool_call_id
                return selected("Blue")

            editor.permission = answer
            mark = editor.mark()
            assert await prompt("Ask me") == "end_turn"
            assert asked == [
                [("Red", "allow_once"), ("Blue", "allow_once"), ("decline", "reject_once")]
            ]
            history = tool_history(editor.since(mark))[report["questionId"]]
            assert [u["status"] for u in history if "status" in u][-1] == "completed"
            assert "failed" not in [u.get("status") for u in history]
            await approve_elsewhere(review, editor, session_id, prompt, report)
        else:
            # The agent's plan.
            mark = editor.mark()
            assert await prompt("hello") == "end_turn"
            plans = [u for u in editor.since(mark) if u["sessionUpdate"] == "plan"]
            assert plans == [
                {
                    "sessionUpdate": "plan",
                    "entries": [{"content": "echo", "priority": "medium", "status": "in_progress"}],
                }
            ]
        live = list(editor.updates)

    # session/load on a new bridge replays what was shown live.
    replayer = PyEditor()
    async with spawn_agent_process(
        lambda agent: replayer,  # type: ignore[arg-type,return-value]
        sys.executable,
        *args,
    ) as (conn, _process):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(cwd), session_id=session_id)
    assert merged(non_user(replayer.updates)) == merged(non_user(live))
    return report


def non_user(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # A replay shows the prompts this editor typed itself (the live editor had them).
    return [u for u in updates if u["sessionUpdate"] != "user_message_chunk"]


def merged(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for update in updates:
        update = json.loads(json.dumps(update))
        last = out[-1] if out else None
        if (
            update["sessionUpdate"].endswith("_chunk")
            and last is not None
            and last["sessionUpdate"] == update["sessionUpdate"]
            and last.get("messageId") == update.get("messageId")
        ):
            last["content"]["text"] += update["content"]["text"]
        else:
            out.append(update)
    return out


async def approve_elsewhere(
    review: Review, editor: PyEditor, session_id: str, prompt: Any, report: dict[str, Any]
) -> None:
    """The editor's permission dialog stays open until the tool call's update closes
    it; the answer comes from ``agentsctl approve``."""
    closed: list[str] = []
    handled = asyncio.Event()

    async def wait_for_the_cli(
        options: Any, _sid: str, tool_call: Any, meta: dict[str, Any]
    ) -> Any:
        tool_call_id = tool_call.tool_call_id
        mark = editor.mark()
        decision = "accept" if any(o.option_id == "accept" for o in options) else "allow"
        await approve_from_the_cli(review, session_id, meta["agentsd"]["approvalId"], decision)
        await editor.until(
            lambda: any(
                u.get("toolCallId") == tool_call_id and u.get("status") not in (None, "pending")
                for u in editor.since(mark)
            )
        )
        closed.append(tool_call_id)
        handled.set()
        return cancelled_outcome()  # ACP: the request no longer applies

    editor.permission = wait_for_the_cli
    assert await prompt("Do it") == "end_turn"
    # The turn may end before the CLI's process does: the dialog closes when the
    # update reaches the editor, whenever that is.
    await handled.wait()
    assert len(closed) == 1
    report["closedBy"] = "update"


def test_the_python_acp_sdk_reviews_codex_claude_and_plans(review: Review) -> None:
    script_codex(review)
    script_claude(review)

    async def run() -> dict[str, Any]:
        report: dict[str, Any] = {}
        async with asyncio.timeout(SDK_TIMEOUT_S):
            codex = await py_scenario(review, "codex", review.workdir("py-codex"))
            claude = await py_scenario(review, "claude", review.workdir("py-claude"))
            await py_scenario(review, "testacp", review.workdir("py-acp"))
        report["codexSession"], report["claudeSession"] = codex["session"], claude["session"]
        return report

    report = asyncio.run(run())
    check_journals(review, report)
    assert (review.base / "py-codex" / "a.py").read_text() == A_PY.replace("three", "THREE")
    assert (review.base / "py-codex" / "approved.txt").exists(), "the CLI's accept reached codex"
    assert (review.base / "py-claude" / "hi.txt").read_text() == "hi\n"


# The TypeScript ACP SDK (the official one): the same set, through driver.mjs.


@pytest.mark.parametrize("provider", ["codex", "claude", "testacp"])
def test_the_typescript_acp_sdk_reviews_codex_claude_and_plans(
    review: Review, provider: str
) -> None:
    node = _require_node()
    cwd = review.workdir(f"ts-{provider}")
    if provider == "codex":
        script_codex(review)
    elif provider == "claude":
        script_claude(review)
    config = {
        "scenario": "review",
        "provider": provider,
        "python": sys.executable,
        "socket": str(review.daemon.socket),
        "cwd": str(cwd),
    }
    done = subprocess.run(
        [node, str(DRIVER), json.dumps(config)],
        cwd=DRIVER.parent,
        capture_output=True,
        text=True,
        timeout=SDK_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{done.stderr}\n--- journals:\n{review.journals()}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if provider == "codex":
        check_journals(review, {"codexSession": report["session"], "claudeSession": None})
        assert (cwd / "a.py").read_text() == A_PY.replace("three", "THREE")
        assert (cwd / "approved.txt").exists(), "the CLI's accept reached codex"
    elif provider == "claude":
        check_journals(review, {"codexSession": None, "claudeSession": report["session"]})
        assert (cwd / "hi.txt").read_text() == "hi\n"


@pytest.mark.parametrize("provider", ["codex", "claude"])
def test_mcp_servers_from_the_editor_reach_the_agent_and_its_resumes(
    review: Review, provider: str
) -> None:
    """A stdio MCP server given at session/new is started by the agent (its command
    leaves a line in a marker file), is recorded with the session, and is started
    again when the session resumes after a close."""
    from acp import text_block
    from acp.schema import EnvVariable, McpServerStdio
    from acp.stdio import spawn_agent_process

    cwd = review.workdir(f"mcp-{provider}")
    marker = cwd / "mcp-started"
    server = McpServerStdio(
        name="probe",
        command="/bin/sh",
        args=["-c", f'echo "$PROBE" >> {marker}'],
        env=[EnvVariable(name="PROBE", value=provider)],
    )
    if provider == "codex":
        review.openai.script(OpenAIText("one"), OpenAIText("two"))
    else:
        review.anthropic.script(TextReply("one"), TextReply("two"))

    async def until_lines(count: int) -> None:
        # A file another process writes: there is no event to wait on but the file.
        while not marker.exists() or len(marker.read_text().splitlines()) < count:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def run() -> str:
        editor = PyEditor()
        async with spawn_agent_process(
            lambda agent: editor,  # type: ignore[arg-type,return-value]
            sys.executable,
            *["-m", "agentsctl.cli", "--socket", str(review.daemon.socket), "--no-start"],
            *["acp", "--provider", provider],
        ) as (conn, _process):
            initialized = await conn.initialize(protocol_version=1)
            capabilities = initialized.agent_capabilities
            assert capabilities is not None and capabilities.mcp_capabilities is not None
            assert capabilities.mcp_capabilities.http is True
            session_id = (await conn.new_session(cwd=str(cwd), mcp_servers=[server])).session_id
            prompted = await conn.prompt(session_id=session_id, prompt=[text_block("hi")])
            assert prompted.stop_reason == "end_turn"
            await until_lines(1)
            with Client(review.daemon.socket) as client:
                client.call("agentSession.close", {"sessionId": session_id})
            prompted = await conn.prompt(session_id=session_id, prompt=[text_block("again")])
            assert prompted.stop_reason == "end_turn"
            await until_lines(2)
            return session_id

    async def bounded() -> str:
        async with asyncio.timeout(SDK_TIMEOUT_S):
            return await run()

    session_id = asyncio.run(bounded())
    assert marker.read_text().splitlines()[:2] == [provider, provider]
    with Client(review.daemon.socket) as client:
        options = client.call("agentSession.get", {"sessionId": session_id})["session"]["options"]
    assert options["mcpServers"] == [
        {
            "name": "probe",
            "command": "/bin/sh",
            "args": ["-c", f'echo "$PROBE" >> {marker}'],
            "env": [{"name": "PROBE", "value": provider}],
        }
    ]
