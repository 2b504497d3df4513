"""What an editor can review through ``agentsctl acp``: tool calls with titles,
kinds, locations, diffs and output, plans, usage and titles, from the events the
real providers' own code writes (``codex_events``, ``claude_items``), live and
replayed alike. ``test_acp_sdks`` drives the same through both ACP SDKs against the
real ``codex`` and ``claude``."""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from agentsctl.acp.updates import UpdateTranslator
from agentsd.providers import codex_events
from agentsd.providers.claude_items import Items
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


def codex_item(item: dict[str, Any]) -> dict[str, Any]:
    """The params of Codex's ``item/started`` or ``item/completed`` for ``item``."""
    return {"turnId": "t1", "item": item}


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
            run(codex_events.item_started(codex_item({"id": item_id, "type": "agentMessage"})))
            for piece in pieces:
                journal.delta(item_id, piece)
            done = {"id": item_id, "type": "agentMessage", "text": "".join(pieces)}
            run(codex_events.item_completed(codex_item(done)))
        elif what == "plan":
            pieces = value
            run(codex_events.item_started(codex_item({"id": item_id, "type": "plan"})))
            for piece in pieces:
                journal.delta(item_id, piece)
            done = {"id": item_id, "type": "plan", "text": "".join(pieces)}
            run(codex_events.item_completed(codex_item(done)))
        elif what == "command":
            command, output, asked = value
            item: dict[str, Any] = {
                "id": item_id,
                "type": "commandExecution",
                "command": command,
                "cwd": "/w",
            }
            run(codex_events.item_started(codex_item({**item, "status": "inProgress"})))
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
            run(codex_events.item_completed(codex_item(done)))
        elif what == "edit":
            path, diff = value
            change = {"path": path, "kind": {"type": "update", "move_path": None}, "diff": diff}
            item = {"id": item_id, "type": "fileChange", "changes": [change]}
            run(codex_events.item_started(codex_item({**item, "status": "inProgress"})))
            run(codex_events.item_completed(codex_item({**item, "status": "completed"})))
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


def test_an_mcp_tool_is_named_by_server_and_tool_and_shows_its_text() -> None:
    item = {
        "id": "m",
        "type": "mcpToolCall",
        "server": "docs",
        "tool": "search",
        "arguments": {"q": "trio"},
        "status": "completed",
        "result": {"content": [{"type": "text", "text": "3 hits"}], "structuredContent": None},
    }
    done = codex_events.item_completed({"turnId": "t", "item": item})
    [call] = msgspec.to_builtins(UpdateTranslator().event(as_journal_event(done)))
    assert (call["title"], call["kind"], call["status"]) == ("docs: search", "other", "completed")
    assert call["rawInput"] == {"server": "docs", "tool": "search", "arguments": {"q": "trio"}}
    assert call["content"] == [{"type": "content", "content": {"type": "text", "text": "3 hits"}}]


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
