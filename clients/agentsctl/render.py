"""How the CLI shows things: JSON documents and lines, and the conversation as text.

Rule 1 (each character once): a ``Transcript`` remembers, per item, how many
characters of the item's full text it has written. A snapshot (``item.updated``, the
text of ``item.completed``) or a delta (``offset``, ``text``) writes only what lies
beyond that. A delta that starts beyond it (deltas were lost while reconnecting, or
the view began mid-item) is dropped: the next snapshot carries the missing text. The
daemon only ever appends to an item's text, so this is exact.

Rule 2 (lines): agent text streams without a newline; anything else that is written
first ends the partial line, so meta lines never land inside agent text.

Rule 3: with ``--json`` a command prints one JSON document; with ``--jsonl`` one
compact JSON object per line, flushed at once (journal events as the daemon sends
them; a streamed delta as ``{"kind": "delta", ...}``, the one kind without ``seq``).
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TextIO

import msgspec

from agentsd_protocol.api.events import (
    AgentError,
    ApprovalRequested,
    ApprovalResolved,
    ChildExited,
    ChildReady,
    ChildReattached,
    ChildSpawned,
    CommandRun,
    ConversationCleared,
    ExitUnproven,
    InterruptRequested,
    ItemCompleted,
    ItemStarted,
    ItemUpdated,
    LeaseAcquired,
    LeaseReleased,
    MessageImported,
    SessionAcknowledged,
    SessionCreated,
    SessionUpdated,
    Submission,
    SubmissionDispatched,
    ThreadSuperseded,
    TurnCompleted,
    TurnStarted,
    UsageUpdated,
)
from agentsd_protocol.api.stream import DeltaNotification, JournalEvent
from agentsd_protocol.display import printable
from agentsd_protocol.usage import token_usage, usage_line

MAX_REMEMBERED_ITEMS = 512  # finished items kept to drop their late deltas; older ones are gone
MAX_SHOWN_CHARS = 400  # of a tool's input or a reasoning text in the human view
MAX_DETAIL_LINES = 8  # of an approval's detail in the human view

_encoder = msgspec.json.Encoder()


def print_json(result: Any, out: TextIO | None = None) -> None:
    """``result`` (a Struct or plain values) as one indented JSON document."""
    stream = sys.stdout if out is None else out
    stream.write(msgspec.json.format(_encoder.encode(result), indent=2).decode() + "\n")
    stream.flush()


def print_jsonl(value: Any, out: TextIO | None = None) -> None:
    """``value`` as one compact JSON line, flushed (Rule 3)."""
    stream = sys.stdout if out is None else out
    stream.write(_encoder.encode(value).decode() + "\n")
    stream.flush()


def delta_line(delta: DeltaNotification) -> dict[str, Any]:
    """The ``--jsonl`` form of a delta (Rule 3)."""
    return {
        "kind": "delta",
        "itemId": delta.item_id,
        "offset": delta.offset,
        "text": delta.text,
        "afterSeq": delta.after_seq,
    }


class Style:
    """ANSI emphasis when writing to a terminal, unless ``NO_COLOR`` is set."""

    def __init__(self, out: TextIO) -> None:
        try:
            tty = out.isatty()
        except (AttributeError, ValueError):
            tty = False
        self.enabled = tty and not os.environ.get("NO_COLOR")

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled else text

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def warn(self, text: str) -> str:
        return self._wrap("33", text)


def _clip(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _compact(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict) and set(value) == {"command"}:
        value = value["command"]
    if isinstance(value, str):
        return _clip(value)
    return _clip(_encoder.encode(value).decode())


class Transcript:
    """Writes a session's journal events and deltas to ``out`` as a readable
    conversation (Rules 1 and 2). Not thread-safe; the caller feeds it in order."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.style = Style(out)
        self._shown: OrderedDict[str, int] = OrderedDict()  # item id -> characters written
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._partial_item: str | None = None  # whose text the current line ends with
        # The last usage the agent reported in the running turn: shown at its end
        # (Codex reports after every model call; one line a turn is enough).
        self._usage: UsageUpdated | None = None

    # -- agent text ------------------------------------------------------------------

    def delta(self, delta: DeltaNotification) -> None:
        """Write the part of a streamed delta not yet shown (Rule 1)."""
        if delta.item_id in self._finished:
            return
        shown = self._shown.get(delta.item_id, 0)
        end = delta.offset + len(delta.text)
        if delta.offset > shown or end <= shown:
            return  # a gap (the next snapshot fills it) or nothing new
        self._text(delta.item_id, delta.text[shown - delta.offset :], end)

    def _snapshot(self, item_id: str, text: str) -> None:
        shown = self._shown.get(item_id, 0)
        if len(text) > shown:
            self._text(item_id, text[shown:], len(text))

    def _text(self, item_id: str, text: str, shown: int) -> None:
        if self._partial_item is not None and self._partial_item != item_id:
            self.end_line()
        self._shown[item_id] = shown
        self._shown.move_to_end(item_id)
        while len(self._shown) > MAX_REMEMBERED_ITEMS:
            self._shown.popitem(last=False)
        # An agent's text is its own: escapes would drive the user's terminal.
        self.out.write(printable(text, layout=True))
        self.out.flush()
        self._partial_item = None if text.endswith("\n") else item_id

    def _finish(self, item_id: str) -> None:
        self._shown.pop(item_id, None)
        self._finished[item_id] = None
        while len(self._finished) > MAX_REMEMBERED_ITEMS:
            self._finished.popitem(last=False)
        if self._partial_item == item_id:
            self.end_line()

    def end_line(self) -> None:
        """End a partial line of agent text, if one is open (Rule 2)."""
        if self._partial_item is not None:
            self._partial_item = None
            self.out.write("\n")
            self.out.flush()

    # -- everything else ---------------------------------------------------------------

    def line(self, text: str, emphasis: Callable[[str], str] | None = None) -> None:
        """Write one whole line (after ending a partial one). ``text`` is anyone's
        (prompts, agents' words, tool input): its control characters are escaped
        before ``emphasis`` adds this client's own styling, so nothing in it can drive
        the terminal."""
        self.end_line()
        shown = printable(text, layout=True)
        self.out.write((shown if emphasis is None else emphasis(shown)) + "\n")
        self.out.flush()

    def note(self, text: str) -> None:
        """A line about the session rather than from it (``-- ...``)."""
        self.line(f"-- {text}", self.style.dim)

    def event(self, journal_event: JournalEvent) -> None:
        """Write one journal event; kinds this client does not know show as notes."""
        match journal_event.event():
            case ItemUpdated(item_id=item_id, text=text):
                self._snapshot(item_id, text)
            case ItemCompleted() as item:
                self._item_completed(item)
            case ItemStarted() | TurnStarted():
                pass  # its text (or its completion), or the prompt line above, shows it
            case Submission(continues_seq=int(cut_at)):
                # The daemon's request to carry on, not words the user typed.
                self.note(
                    f"continued: the agent was asked to carry on the turn cut off at seq {cut_at}"
                )
            case Submission(text=text, attachments=attachments):
                self.line("> " + text.replace("\n", "\n  "), self.style.bold)
                for attached in attachments:
                    size = f", {attached.byte_length} bytes" if attached.byte_length else ""
                    kind = attached.media_type or attached.type
                    self.line(f"  [{kind}{size}] {attached.path or '(inline)'}", self.style.dim)
            case MessageImported(role=role, text=text):
                prefix = "> " if role == "user" else ""
                self.line(f"{prefix}{text}".replace("\n", "\n  "), self.style.dim)
            case SubmissionDispatched(outcome=outcome, reason=reason):
                if outcome != "accepted":
                    why = f": {reason}" if reason else ""
                    self.line(f"! prompt {outcome}{why}", self.style.warn)
            case TurnCompleted(turn_id=turn_id, outcome=outcome, reason=reason):
                if outcome == "completed":
                    self.end_line()
                elif outcome == "interrupted" and reason in ("daemon-restart", "shutdown"):
                    self.note(
                        f"turn {turn_id} cut off by a daemon "
                        f"{'stop' if reason == 'shutdown' else 'restart'}; "
                        "`agentsctl continue` carries it on"
                    )
                else:
                    why = f" ({reason})" if reason else ""
                    self.note(f"turn {turn_id} {outcome}{why}")
                self._turn_usage()
            case UsageUpdated() as usage:
                self._usage = usage
            case CommandRun(name=name, args=args):
                self.line(f"> /{name}" + (f" {args}" if args else ""), self.style.bold)
            case ConversationCleared():
                self.note("conversation cleared: the agent starts blank (the history above stays)")
            case InterruptRequested():
                self.note("interrupt requested")
            case ApprovalRequested() as asked:
                self._approval_requested(asked)
            case ApprovalResolved(approval_id=approval_id, decision=decision, by=by):
                self.note(f"approval {approval_id}: {decision} (by {by})")
            case AgentError(message=message):
                self.line(f"! agent error: {message}", self.style.warn)
            case SessionCreated(provider=provider, cwd=cwd, resume_from=adopted):
                adopting = f", adopting {adopted}" if adopted else ""
                self.note(f"session created ({provider} in {cwd}{adopting})")
            case ChildReady(agent_version=version):
                self.note(f"agent ready ({version})" if version else "agent ready")
            case ChildReattached(pid=pid):
                self.note(f"agent reattached (pid {pid}): it kept running through a daemon restart")
            case ChildExited() as exited:
                self.note(f"agent exited: {_exit_text(exited)}")
                if exited.stderr_tail:
                    self._stderr_tail(exited.stderr_tail)
            case SessionUpdated(by="daemon"):
                pass  # the title the daemon took from the prompt shown just above
            case SessionUpdated(title=title, options=options):
                if title is not None:
                    self.note(f"title: {title}")
                if options is not None:
                    self.note(f"options: {_compact(options) if options else '(none)'}")
            case ThreadSuperseded(previous_handle=previous, handle=handle, reason=reason):
                self.note(f"new conversation {handle} in place of {previous}: {reason}")
            case ExitUnproven():
                self.line(
                    "! the agent's exit could not be proven; it may still run", self.style.warn
                )
            case LeaseAcquired() | LeaseReleased() | ChildSpawned() | SessionAcknowledged():
                pass  # supervision detail, or the user's own reading; `log --jsonl` has it
            case _:
                self.note(journal_event.kind)

    def _turn_usage(self) -> None:
        usage, self._usage = self._usage, None
        if usage is not None and (words := usage_line(token_usage(usage))):
            self.line(f"({words})", self.style.dim)

    def _stderr_tail(self, tail: str) -> None:
        lines = [line for line in tail.splitlines() if line.strip()]
        self.line("  its stderr ends:", self.style.dim)
        if len(lines) > MAX_DETAIL_LINES:
            self.line(f"  ({len(lines) - MAX_DETAIL_LINES} lines before)", self.style.dim)
        for text in lines[-MAX_DETAIL_LINES:]:
            self.line(f"  | {text}", self.style.dim)

    def _item_completed(self, item: ItemCompleted) -> None:
        kind = item.type
        if kind == "agentMessage":
            self._snapshot(item.item_id, item.text or "")
        elif kind in ("toolCall", "commandExecution", "fileChange"):
            what = item.name or {"commandExecution": "command", "fileChange": "edit"}.get(
                kind, "tool"
            )
            parts = ["*", what]
            if shown := _compact(item.input or item.text):
                parts.append(shown)
            if item.status:
                parts.append(f"[{item.status}]")
            self.line(" ".join(parts))
        elif kind == "reasoning":
            if item.text:
                self.line("(thinking) " + _clip(item.text), self.style.dim)
        else:
            self.note(f"{kind} item {item.item_id}")
        self._finish(item.item_id)

    def _approval_requested(self, asked: ApprovalRequested) -> None:
        self.line(
            f"? approval {asked.approval_id} ({asked.approval_kind}): {asked.title}",
            self.style.bold,
        )
        detail = [line for line in asked.detail.splitlines() if line.strip()]
        for text in detail[:MAX_DETAIL_LINES]:
            self.line(f"  {text}")
        if len(detail) > MAX_DETAIL_LINES:
            self.line(f"  ({len(detail) - MAX_DETAIL_LINES} more lines)")
        if asked.options:
            self.line(f"  options: {', '.join(asked.options)}")


def _exit_text(exited: ChildExited) -> str:
    parts: list[str] = [exited.cause]
    if exited.returncode is not None:
        parts.append(f"code {exited.returncode}")
    if exited.signal is not None:
        parts.append(f"signal {exited.signal}")
    if exited.error is not None:
        parts.append(f"{exited.error.kind}: {exited.error.message}")
    return ", ".join(parts)
