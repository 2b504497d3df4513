"""A journal item as an ACP tool call an editor can review: its title, kind,
locations, content (diffs, output) and raw input and output.

Rule 1: everything here is read from the item's own fields, never from the file
system or the clock, so a live stream and a ``session/load`` replay of the same
journal describe a tool call the same way (``updates`` Rule 2).

Rule 2: an edit is shown as ACP ``diff`` content. Claude Code's ``Edit``,
``MultiEdit`` and ``Write`` carry the old and new text in their input. A Codex
``fileChange`` carries, per file, the content of an added or deleted file or a
unified diff of an update: each hunk of that diff is one ``diff`` (its context and
removed lines the old text, its context and added lines the new), located at the
hunk's first new line. Nothing reads the file: its text on disk may have moved on.

Rule 3: output is bounded. The journal keeps a tool's output head (64 KiB); an editor
gets at most ``MAX_OUTPUT_CHARS`` of it, with a note saying how much there was.

Pure: no I/O, no trio.
"""

from __future__ import annotations

import os
import re
from typing import Any

import attrs
import msgspec

from agentsctl.acp import schema as acp
from agentsd_protocol.api.events import BoundedPayload, FileChange, ItemFields

MAX_OUTPUT_CHARS = 16 * 1024  # a tool card's worth; the journal keeps more (Rule 3)

# Claude Code's tools by name: ACP's kind of each.
_CLAUDE_KINDS: dict[str, acp.ToolKind] = {
    **dict.fromkeys(("Bash", "BashOutput", "KillShell", "KillBash"), "execute"),
    **dict.fromkeys(("Read", "NotebookRead"), "read"),
    **dict.fromkeys(("Edit", "MultiEdit", "Write", "NotebookEdit"), "edit"),
    **dict.fromkeys(("Grep", "Glob", "LS", "ToolSearch"), "search"),
    **dict.fromkeys(("WebFetch", "WebSearch"), "fetch"),
    **dict.fromkeys(("Task", "Agent", "TodoWrite"), "think"),
    "ExitPlanMode": "switch_mode",
}
# Codex item types: ACP's kind of each.
_CODEX_KINDS: dict[str, acp.ToolKind] = {
    "commandExecution": "execute",
    "fileChange": "edit",
    "webSearch": "fetch",
    "imageView": "read",
}
TODO_TOOL = "TodoWrite"  # Claude Code's todo list: an ACP plan, not a tool call
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_PLAN_STATUSES: dict[str, acp.PlanEntryStatus] = {
    "pending": "pending",
    "in_progress": "in_progress",
    "inProgress": "in_progress",
    "completed": "completed",
}
_decoder = msgspec.json.Decoder()


@attrs.frozen
class ToolView:
    """What an editor shows of a tool call before it ends."""

    title: str
    kind: acp.ToolKind
    locations: list[acp.ToolCallLocation]
    content: list[acp.ToolContent]  # what the call is about: its diffs
    raw_input: Any


def describe(item: ItemFields, cwd: str | None = None) -> ToolView:
    """The tool call of ``item`` (Rule 1); ``cwd`` shortens paths in its title."""
    if item.type == "toolCall":
        return _claude(item, cwd)
    match item.type:
        case "commandExecution":
            raw: dict[str, Any] = {"command": item.command, "cwd": item.cwd}
            return ToolView(item.command or "command", "execute", [], [], _present(raw))
        case "fileChange":
            paths = [c.path for c in item.changes if c.path]
            verb = "Edit"
            if item.changes and all(c.kind == "add" for c in item.changes):
                verb = "Create"
            elif item.changes and all(c.kind == "delete" for c in item.changes):
                verb = "Delete"
            title = f"{verb} {', '.join(_short(p, cwd) for p in paths)}" if paths else "Edit files"
            raw = {"changes": [{"path": c.path, "kind": c.kind} for c in item.changes]}
            content, locations = _codex_diffs(item.changes)
            return ToolView(title, "edit", locations, content, raw)
        case "mcpToolCall" | "dynamicToolCall":
            tool = item.tool or "tool"
            title = f"{item.server}: {tool}" if item.server else tool
            raw = {"server": item.server, "tool": item.tool, "arguments": _json(item.arguments)}
            return ToolView(title, "other", [], [], _present(raw))
        case _:
            detail = _json(item.detail)
            title = item.type
            if isinstance(detail, dict) and isinstance(detail.get("query"), str):
                title = f"Search the web: {detail['query']}"
            kind = _CODEX_KINDS.get(item.type, "other")
            return ToolView(title, kind, [], [], detail)


def output_content(item: ItemFields) -> list[acp.ToolContent]:
    """The tool's output as text content: a command's output, a tool's result or its
    error (Rule 3); none when it reported nothing. An MCP tool's result is its text
    blocks, as the tool wrote them."""
    if item.type == "mcpToolCall" and item.result is not None:
        result = _json(item.result)
        blocks = result.get("content") if isinstance(result, dict) else None
        texts = [
            block["text"]
            for block in blocks or []
            if isinstance(block, dict) and isinstance(block.get("text"), str)
        ]
        if texts:
            text = "\n".join(texts)
            whole = BoundedPayload(text=text, byte_length=len(text.encode()), truncated=False)
            return acp.text_content(_bounded_text(whole))
    for payload in (item.output, item.result, item.error):
        if payload is not None and payload.text:
            return acp.text_content(_bounded_text(payload))
    return []


def raw_output(item: ItemFields) -> dict[str, Any] | None:
    """The tool's outcome as the agent reported it (status, exit code, output)."""
    output = next((p for p in (item.output, item.result) if p is not None), None)
    raw = {
        "status": item.status,
        "exitCode": item.exit_code,
        "durationMs": item.duration_ms,
        "output": _bounded_text(output) if output is not None else None,
        "error": _bounded_text(item.error) if item.error is not None else None,
    }
    return _present(raw) or None


def todo_plan(item: ItemFields) -> list[acp.PlanEntry] | None:
    """Claude Code's ``TodoWrite`` input as ACP plan entries; None for any other item."""
    if item.type != "toolCall" or item.name != TODO_TOOL or item.input_truncated:
        return None
    todos = item.input.get("todos") if isinstance(item.input, dict) else None
    if not isinstance(todos, list):
        return None
    return [
        acp.PlanEntry(
            content=str(todo.get("content") or todo.get("activeForm") or ""),
            priority="medium",
            status=_PLAN_STATUSES.get(str(todo.get("status")), "pending"),
        )
        for todo in todos
        if isinstance(todo, dict)
    ]


def plan_entries(steps: list[tuple[str | None, str | None]]) -> list[acp.PlanEntry]:
    """A Codex plan's steps (text, status) as ACP plan entries."""
    return [
        acp.PlanEntry(
            content=step or "",
            priority="medium",
            status=_PLAN_STATUSES.get(status or "", "pending"),
        )
        for step, status in steps
    ]


# -- Claude Code, and any other agent's tool calls -------------------------------------


def _claude(item: ItemFields, cwd: str | None) -> ToolView:
    """A ``toolCall`` item: Claude Code's tools by name; any other agent's tool
    (an ACP agent's, the mock's) by its name and input."""
    name = item.name or "tool"
    # Claude Code journals the tool's input; an ACP agent's tool call its raw input.
    raw = item.input if item.input is not None else _json(item.arguments)
    args: dict[str, Any] = raw if isinstance(raw, dict) and not item.input_truncated else {}
    kind = _CLAUDE_KINDS.get(name) or acp.tool_kind(name)
    path = _str(args.get("file_path")) or _str(args.get("notebook_path"))
    locations = [acp.ToolCallLocation(path=path, line=_line(args.get("offset")))] if path else []
    content: list[acp.ToolContent] = []
    title = name
    match name:
        case "Bash":
            title = _str(args.get("command")) or name
        case "Read" | "NotebookRead" if path:
            title = f"Read {_short(path, cwd)}"
        case "Edit" if path:
            title = f"Edit {_short(path, cwd)}"
            old, new = _str(args.get("old_string")), _str(args.get("new_string"))
            if old is not None and new is not None:
                content = [acp.DiffContent(path=path, old_text=old, new_text=new)]
        case "MultiEdit" if path:
            title = f"Edit {_short(path, cwd)}"
            for edit in args.get("edits") or []:
                if isinstance(edit, dict):
                    old, new = _str(edit.get("old_string")), _str(edit.get("new_string"))
                    if old is not None and new is not None:
                        content.append(acp.DiffContent(path=path, old_text=old, new_text=new))
        case "Write" if path:
            title = f"Write {_short(path, cwd)}"
            text = _str(args.get("content"))
            if text is not None:
                content = [acp.DiffContent(path=path, old_text=None, new_text=text)]
        case "NotebookEdit" if path:
            title = f"Edit {_short(path, cwd)}"
        case "Grep" | "Glob":
            pattern = _str(args.get("pattern")) or ""
            where = _str(args.get("path"))
            title = f"{'Find' if name == 'Glob' else 'Grep'} {pattern}"
            if where:
                title += f" in {_short(where, cwd)}"
                locations = [acp.ToolCallLocation(path=where)] if os.path.isabs(where) else []
        case "WebFetch":
            title = f"Fetch {_str(args.get('url')) or ''}".rstrip()
        case "WebSearch":
            title = f"Search the web: {_str(args.get('query')) or ''}".rstrip(": ")
        case "Task" | "Agent":
            title = _str(args.get("description")) or name
        case "AskUserQuestion":
            questions = args.get("questions")
            first = questions[0] if isinstance(questions, list) and questions else {}
            title = _str(first.get("question") if isinstance(first, dict) else None) or name
        case _ if name.startswith("mcp__"):
            _, server, tool = [*name.split("__", 2), "", ""][:3]
            title = f"{server}: {tool}" if tool else name
        case _:
            command = args.get("command")  # another agent's shell tool (the mock's)
            if isinstance(command, list):
                command = " ".join(str(part) for part in command)
            if isinstance(command, str) and command:
                title = command
    return ToolView(title, kind, locations, content, raw)


# -- Codex -----------------------------------------------------------------------------


def _codex_diffs(
    changes: list[FileChange],
) -> tuple[list[acp.ToolContent], list[acp.ToolCallLocation]]:
    content: list[acp.ToolContent] = []
    locations: list[acp.ToolCallLocation] = []
    for change in changes:
        if not change.path:
            continue
        path = change.move_path or change.path
        text = change.diff.text if change.diff is not None and not change.diff.truncated else None
        if text is None:  # an older row, or a diff over the journal's bound
            locations.append(acp.ToolCallLocation(path=path))
            continue
        if change.kind == "add":
            content.append(acp.DiffContent(path=path, old_text=None, new_text=text))
            locations.append(acp.ToolCallLocation(path=path, line=1))
        elif change.kind == "delete":
            content.append(acp.DiffContent(path=path, old_text=text, new_text=""))
            locations.append(acp.ToolCallLocation(path=path))
        else:
            hunks = unified_hunks(text)
            for line, old, new in hunks:
                content.append(acp.DiffContent(path=path, old_text=old, new_text=new))
                locations.append(acp.ToolCallLocation(path=path, line=line))
            if not hunks:
                locations.append(acp.ToolCallLocation(path=path))
    return content, locations


def unified_hunks(diff: str) -> list[tuple[int, str, str]]:
    """Each hunk of a unified diff as (its first new line, old text, new text)."""
    hunks: list[tuple[int, list[str], list[str]]] = []
    for line in diff.splitlines(keepends=True):
        if match := _HUNK.match(line):
            hunks.append((int(match.group(2)), [], []))
        elif not hunks or line.startswith("\\"):
            continue  # file headers before the first hunk; "\ No newline at end of file"
        elif line.startswith("-"):
            hunks[-1][1].append(line[1:])
        elif line.startswith("+"):
            hunks[-1][2].append(line[1:])
        else:
            hunks[-1][1].append(line[1:])
            hunks[-1][2].append(line[1:])
    return [(max(start, 1), "".join(old), "".join(new)) for start, old, new in hunks]


# -- values ------------------------------------------------------------------------------


def _bounded_text(payload: BoundedPayload) -> str:
    text = payload.text
    cut = len(text) > MAX_OUTPUT_CHARS
    if cut:
        text = text[:MAX_OUTPUT_CHARS]
    if cut or payload.truncated:
        text += f"\n… ({payload.byte_length} bytes in all; the rest is not shown)"
    return text


def _json(payload: BoundedPayload | None) -> Any:
    """A journaled JSON payload as its value; its text when cut or not JSON."""
    if payload is None:
        return None
    if not payload.truncated:
        try:
            return _decoder.decode(payload.text)
        except msgspec.DecodeError:
            pass
    return payload.text


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _line(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _short(path: str, cwd: str | None) -> str:
    """``path`` relative to ``cwd`` when it lies under it."""
    if cwd and os.path.isabs(path):
        relative = os.path.relpath(path, cwd)
        if not relative.startswith(".."):
            return relative
    return path
