"""A daemon session's journal and deltas, as ACP ``session/update`` notifications.

Rule 1: every character of an item's text reaches the editor exactly once and in
order, whatever mix of ``agentSession.delta`` (live), ``item.updated`` (coalesced
snapshots) and ``item.completed`` (the full text) carries it. The translator counts
what it sent per item: a delta is cut to what is new, a delta that would leave a hole
is dropped (the next snapshot fills it), a snapshot sends only its unsent tail.

Rule 2: a replay from seq 0 and the live stream produce the same updates, so an
editor that ``session/load``s sees what an editor that was attached saw, except for
the user's own prompts: those a bridge sent itself (known by their
``clientOperationId``) are not echoed back to the editor that typed them.

Rule 3: a tool call is announced once (``tool_call``) and then only updated
(``tool_call_update``).

Rule 4: an approval is about a tool call. One that names its item (``itemId``) is
that item's tool call, whichever of the two the journal shows first: ``pending``
while it waits for the decision, ``in_progress`` once allowed, then what the item
reports; ``failed`` once refused, whatever follows. An approval without an item is
a tool call of its own, keyed by its approval id, ``completed`` when allowed and
``failed`` otherwise. A decision allows when the agent said that option allows (an
ACP agent's ``allow_*`` kinds), else when its first word does; a question's
answer is one of its labels, so any answer but ``decline`` or ``cancel`` resolves it.

Rule 5: a tool call says what it is and what it did (``tools``): a human title,
its kind, locations, diffs and output. Claude Code's todo list (``TodoWrite``) and a
Codex plan (``turn.plan``) are ACP ``plan`` updates, never tool calls; a Codex
``plan`` item (the plan it proposes in plan mode) is message text.

Rule 6: what the daemon said rather than the user is not user text: a
continuation (a ``submission`` with ``continuesSeq``, the daemon asking the agent to
carry on after a restart cut its turn off) is a note (a thought). A conversation's
history imported when the session adopted it (``message.imported``) is shown as it
was: the user's messages as user text, the agent's as its messages.

Pure: no I/O, no trio.
"""

from __future__ import annotations

from typing import Any

import attrs

from agentsctl.acp import schema as acp
from agentsctl.acp import tools
from agentsd_protocol.api.events import (
    ApprovalRequested,
    ApprovalResolved,
    ChildExited,
    ItemCompleted,
    ItemStarted,
    ItemUpdated,
    MessageImported,
    SessionCreated,
    SessionUpdated,
    Submission,
    ThreadSuperseded,
    TurnCompleted,
    TurnPlan,
    TurnStarted,
    UsageUpdated,
)
from agentsd_protocol.api.stream import DeltaNotification, JournalEvent

_MESSAGE_TYPES: dict[str, type[acp.AgentMessageChunk | acp.AgentThoughtChunk]] = {
    "agentMessage": acp.AgentMessageChunk,
    "reasoning": acp.AgentThoughtChunk,
    "plan": acp.AgentMessageChunk,  # Codex's proposed plan (plan mode): its text (Rule 5)
}
# An item status that means the tool did not run to the end: ACP's ``failed``.
_FAILED_STATUSES = {
    *("failed", "error", "declined", "denied", "rejected", "cancelled", "canceled"),
    *("interrupted", "incomplete", "aborted"),
}
_ALLOWING = ("accept", "allow", "approve", "yes")
_REFUSING_ANSWERS = {"decline", "cancel"}  # a question's answers that refuse (Rule 4)


@attrs.define
class _Item:
    type: str
    turn_id: str | None = None
    sent: int = 0  # characters of its text already sent (Rule 1)
    announced: bool = False  # a tool call was sent for it (Rule 3)
    described: bool = False  # its tool call has the agent's input and kind (Rule 4)
    asking: set[str] = attrs.field(factory=set)  # its approvals awaiting a decision (Rule 4)
    refused: bool = False  # an approval of it was refused: it stays failed (Rule 4)
    plan: bool = False  # a todo list shown as a plan, not a tool call (Rule 5)
    view: tools.ToolView | None = None  # what its tool call shows (Rule 5)


class UpdateTranslator:
    """Translates one session's stream, in order; feed it every event and delta."""

    def __init__(self, cwd: str | None = None) -> None:
        self.own_operations: set[str] = set()  # clientOperationIds of this bridge's prompts
        self.cwd = cwd  # the session's; paths under it are shown relative in titles
        self._items: dict[str, _Item] = {}
        # Approvals announced, by approval id: the item each is about, or None when
        # the approval is a tool call of its own (Rule 4).
        self._approvals: dict[str, str | None] = {}
        # The options that allow, by approval id, where the agent described its options.
        self._allowing: dict[str, set[str]] = {}
        self._questions: set[str] = set()  # approval ids of questions (Rule 4)
        self._turn_id: str | None = None  # the turn running, as far as this stream shows

    def event(self, journal_event: JournalEvent) -> list[acp.SessionUpdate]:
        match event := journal_event.event():
            case Submission(continues_seq=int() as cut):
                return self._notice(
                    journal_event.seq,
                    f"agentsd asked the agent to carry on with the turn a daemon restart "
                    f"cut off (at #{cut}).",
                )
            case Submission():
                return self._submission(event)
            case MessageImported(role=role, text=text) if text:
                message_id = f"imported-{journal_event.seq}"
                content = acp.TextContent(text=text)
                if role == "user":
                    return [acp.UserMessageChunk(content=content, message_id=message_id)]
                return [acp.AgentMessageChunk(content=content, message_id=message_id)]
            case ItemStarted():
                return self._item_started(event)
            case ItemUpdated(item_id=item_id, text=text):
                return self._text(item_id, self._item(item_id), text)
            case ItemCompleted():
                return self._item_completed(event)
            case ApprovalRequested():
                return self._approval_requested(event)
            case ApprovalResolved():
                return self._approval_resolved(event)
            case TurnStarted(turn_id=turn_id):
                self._turn_id = turn_id
                return []
            case TurnCompleted(turn_id=turn_id, outcome=outcome):
                self._turn_id = None
                return self._settle(turn_id, outcome)
            case ChildExited(stderr_tail=tail):
                self._turn_id = None
                return self._settle(None, "exited") + self._notice(
                    journal_event.seq,
                    f"The agent exited; its stderr ends:\n{tail}" if tail else None,
                )
            case TurnPlan(plan=steps):
                return [acp.Plan(entries=tools.plan_entries([(s.step, s.status) for s in steps]))]
            case UsageUpdated(last=last, model_context_window=window) if window:
                used = last.get("totalTokens")
                if isinstance(used, int) and not isinstance(used, bool):
                    return [acp.UsageUpdate(used=used, size=window)]
                return []
            case SessionCreated(title=str() as title) | SessionUpdated(title=str() as title):
                return [acp.SessionInfoUpdate(title=title)]
            case ThreadSuperseded(previous_handle=previous, handle=handle, reason=reason):
                return self._notice(
                    journal_event.seq,
                    f"A new conversation ({handle}) took the place of {previous}: {reason}",
                )
            case _:
                return []

    def _notice(self, seq: int, text: str | None) -> list[acp.SessionUpdate]:
        """A note from agentsd about the session, not the agent's words: shown as a
        thought, which editors set apart from the conversation."""
        if text is None:
            return []
        return [
            acp.AgentThoughtChunk(content=acp.TextContent(text=text), message_id=f"agentsd-{seq}")
        ]

    def delta(self, delta: DeltaNotification) -> list[acp.SessionUpdate]:
        item = self._items.get(delta.item_id)
        if item is None:
            # Deltas stream message text; an item not seen starting is a message.
            item = self._items[delta.item_id] = _Item(type="agentMessage")
        end = delta.offset + len(delta.text)
        if delta.offset > item.sent or end <= item.sent:
            return []  # a hole before it, or nothing new (Rule 1)
        return self._chunk(delta.item_id, item, delta.text[item.sent - delta.offset :])

    # -- messages ----------------------------------------------------------------------

    def _submission(self, submission: Submission) -> list[acp.SessionUpdate]:
        if submission.operation_id in self.own_operations:
            return []  # the editor shows what it sent itself (Rule 2)
        if not submission.text:
            return []
        return [
            acp.UserMessageChunk(
                content=acp.TextContent(text=submission.text),
                message_id=submission.client_message_id,
            )
        ]

    def _item(
        self, item_id: str, item_type: str = "agentMessage", turn_id: str | None = None
    ) -> _Item:
        item = self._items.get(item_id)
        if item is None:
            item = self._items[item_id] = _Item(type=item_type or "agentMessage", turn_id=turn_id)
        return item

    def _text(self, item_id: str, item: _Item, text: str) -> list[acp.SessionUpdate]:
        if item.type not in _MESSAGE_TYPES or len(text) <= item.sent:
            return []
        return self._chunk(item_id, item, text[item.sent :])

    def _chunk(self, item_id: str, item: _Item, text: str) -> list[acp.SessionUpdate]:
        item.sent += len(text)
        chunk = _MESSAGE_TYPES.get(item.type, acp.AgentMessageChunk)
        return [chunk(content=acp.TextContent(text=text), message_id=item_id)]

    # -- items and tool calls --------------------------------------------------------

    def _item_started(self, started: ItemStarted) -> list[acp.SessionUpdate]:
        item = self._item(started.item_id, started.type, started.turn_id)
        if item.type in _MESSAGE_TYPES:
            return []
        entries = tools.todo_plan(started)
        if entries is not None and not item.announced:
            item.plan = True
            return [acp.Plan(entries=entries)]
        status: acp.ToolCallStatus = "pending" if item.asking else "in_progress"
        if item.refused:
            status = "failed"
        view = item.view = tools.describe(started, self.cwd)
        if item.announced:
            return [self._described(view, started.item_id, item, status=status)]
        item.announced = item.described = True
        return [
            acp.ToolCall(
                tool_call_id=started.item_id,
                title=view.title,
                kind=view.kind,
                status=status,
                content=view.content,
                locations=view.locations,
                raw_input=view.raw_input,
            )
        ]

    def _item_completed(self, done: ItemCompleted) -> list[acp.SessionUpdate]:
        item_id = done.item_id
        item = self._item(item_id, done.type, done.turn_id)
        del self._items[item_id]
        if item.type in _MESSAGE_TYPES:
            return self._text(item_id, item, done.text or "")
        if item.plan:
            return []  # its plan was shown when it started (Rule 5)
        entries = tools.todo_plan(done)
        if entries is not None and not item.announced:
            return [acp.Plan(entries=entries)]
        failed = item.refused or str(done.status).lower() in _FAILED_STATUSES
        status: acp.ToolCallStatus = "failed" if failed else "completed"
        view = tools.describe(done, self.cwd)
        content = view.content + tools.output_content(done)
        output = tools.raw_output(done)
        if item.announced and item.described:
            return [
                acp.ToolCallUpdate(
                    tool_call_id=item_id,
                    status=status,
                    content=content or None,
                    raw_output=output,
                )
            ]
        if item.announced:
            return [
                self._described(
                    view, item_id, item, status=status, content=content, raw_output=output
                )
            ]
        return [
            acp.ToolCall(
                tool_call_id=item_id,
                title=view.title,
                kind=view.kind,
                status=status,
                content=content,
                locations=view.locations,
                raw_input=view.raw_input,
                raw_output=output,
            )
        ]

    def _described(
        self,
        view: tools.ToolView,
        item_id: str,
        item: _Item,
        *,
        status: acp.ToolCallStatus,
        content: list[acp.ToolContent] | None = None,
        raw_output: Any = None,
    ) -> acp.ToolCallUpdate:
        """The update of a tool call its approval announced (Rule 4), once the agent
        says what the tool is: its title, kind, locations, diffs and input."""
        item.described = True
        return acp.ToolCallUpdate(
            tool_call_id=item_id,
            title=view.title,
            kind=view.kind,
            status=status,
            content=content if content is not None else (view.content or None),
            locations=view.locations or None,
            raw_input=view.raw_input,
            raw_output=raw_output,
        )

    def _settle(self, turn_id: str | None, outcome: str) -> list[acp.SessionUpdate]:
        """A turn ended (or the agent did): forget its items; a tool call still open
        ends ``failed`` unless the turn completed."""
        updates: list[acp.SessionUpdate] = []
        for item_id, item in list(self._items.items()):
            if turn_id is not None and item.turn_id is not None and item.turn_id != turn_id:
                continue
            del self._items[item_id]
            if item.announced and not item.refused:  # a refused one was failed already
                status: acp.ToolCallStatus = "completed" if outcome == "completed" else "failed"
                updates.append(acp.ToolCallUpdate(tool_call_id=item_id, status=status))
        return updates

    # -- approvals (Rule 4) --------------------------------------------------------------

    def _approval_requested(self, asked: ApprovalRequested) -> list[acp.SessionUpdate]:
        approval_id = asked.approval_id
        item_id = asked.item_id
        self._approvals[approval_id] = item_id
        if asked.approval_kind == "question":
            self._questions.add(approval_id)
        if asked.option_details:
            self._allowing[approval_id] = {
                o.option_id for o in asked.option_details if (o.kind or "").startswith("allow")
            }
        tool_call_id = item_id or approval_id
        detail = asked.detail
        if item_id is not None:
            item = self._items.get(item_id)
            if item is None:
                item = self._items[item_id] = _Item(
                    type=asked.approval_kind or "tool", turn_id=self._turn_id
                )
            item.asking.add(approval_id)
            if item.announced:
                # The agent announced the tool first; it now waits for the decision.
                return [acp.ToolCallUpdate(tool_call_id=item_id, status="pending")]
            item.announced = True
        return [
            acp.ToolCall(
                tool_call_id=tool_call_id,
                title=asked.title or "Permission requested",
                kind=acp.tool_kind(asked.approval_kind),
                status="pending",
                content=acp.text_content(detail) if detail else [],
                raw_input={"kind": asked.approval_kind, "options": asked.options},
            )
        ]

    def _approval_resolved(self, resolved: ApprovalResolved) -> list[acp.SessionUpdate]:
        approval_id = resolved.approval_id
        if approval_id not in self._approvals:
            return []  # requested before this stream began: nothing to update
        item_id = self._approvals.pop(approval_id)
        decision = resolved.decision
        allowing = self._allowing.pop(approval_id, None)
        if allowing is not None:  # the agent said which of its options allow
            allowed = decision in allowing
        elif approval_id in self._questions:  # an answer is one of its labels
            self._questions.discard(approval_id)
            allowed = decision not in _REFUSING_ANSWERS
        else:
            allowed = decision.lower().startswith(_ALLOWING)
        outcome = {"decision": decision, "by": resolved.by}
        if item_id is None:
            return [
                acp.ToolCallUpdate(
                    tool_call_id=approval_id,
                    status="completed" if allowed else "failed",
                    raw_output=outcome,
                )
            ]
        item = self._items.get(item_id)
        if item is None or item.refused:
            return []  # the item already ended (or failed): nothing left to decide
        item.asking.discard(approval_id)
        if not allowed:
            item.refused = True
            return [acp.ToolCallUpdate(tool_call_id=item_id, status="failed", raw_output=outcome)]
        if item.asking:
            # Another question about it is still open: it stays pending, and the update
            # says so, which closes the editor's dialog for the one just answered (an
            # editor replaces a tool call's pending permission on any status update).
            return [acp.ToolCallUpdate(tool_call_id=item_id, status="pending")]
        return [acp.ToolCallUpdate(tool_call_id=item_id, status="in_progress")]

    def permission_tool_call(self, asked: ApprovalRequested) -> acp.PermissionToolCall:
        """The ``toolCall`` of the permission request for an ``approval.requested``:
        the tool call announced for it (its item's, Rule 4), by id, with the question's
        fields again for an editor that missed the announcement, and the item's diffs
        and locations where it showed them, so an edit is reviewed before it is
        allowed."""
        item = self._items.get(asked.item_id) if asked.item_id else None
        view = item.view if item is not None else None
        content = acp.text_content(asked.detail) if asked.detail else []
        if view is not None and view.content:
            content = view.content
        return acp.PermissionToolCall(
            tool_call_id=asked.item_id or asked.approval_id,
            title=asked.title or "Permission requested",
            kind=view.kind if view is not None else acp.tool_kind(asked.approval_kind),
            status="pending",
            content=content or None,
            locations=(view.locations or None) if view is not None else None,
        )
