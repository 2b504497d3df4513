"""When an ACP prompt ends, and how: prompts, turns and approvals read off the journal.

Rule 1: a prompt is recognised in the journal by the ``operationId`` of its
``submission`` (the bridge sends every prompt with a fresh ``clientOperationId``).
Its turn is the one its ``submission.dispatched`` names; else the turn open at that
moment (the prompt steered it); else the next turn to start.

Rule 2: a prompt ends when its turn completes (``completed`` -> ``end_turn``,
``interrupted`` -> ``cancelled``; ``failed`` and ``unknown`` are errors), when the
agent refused it (dispatch ``rejected`` -> ``refusal``: the agent never saw it),
when delivery is ``unknown`` (an error), or when the agent exits first (an error).
Once the editor asked to cancel, the stop reason is ``cancelled`` whatever happened,
as ACP requires.

Rule 3: an approval is pending from ``approval.requested`` until its
``approval.resolved``, or until the agent exits (the daemon settles them then).

Pure: no I/O, no trio. The bridge turns the returned actions into calls.
"""

from __future__ import annotations

import attrs

from agentsctl.acp.schema import StopReason
from agentsd_protocol.api.events import (
    ApprovalRequested,
    ApprovalResolved,
    ChildExited,
    Submission,
    SubmissionDispatched,
    TurnCompleted,
    TurnStarted,
)
from agentsd_protocol.api.stream import JournalEvent


@attrs.frozen
class PromptFailed:
    """A prompt that ended in an error rather than a stop reason."""

    message: str
    kind: str


@attrs.define
class Prompt:
    operation_id: str
    arrival: int = 0  # when the editor sent it, among its messages (see ``cancel``)
    client_message_id: str | None = None
    turn_id: str | None = None
    awaiting_turn: bool = False  # dispatched while no turn ran: the next one is its own
    cancel_requested: bool = False
    # Turns that completed after its submission, for a dispatch that names one late.
    completed: dict[str, str] = attrs.field(factory=dict)
    stop_reason: StopReason | None = None
    failure: PromptFailed | None = None
    reason: str | None = None  # why the agent refused it

    @property
    def finished(self) -> bool:
        return self.stop_reason is not None or self.failure is not None


@attrs.frozen
class Approval:
    asked: ApprovalRequested

    @property
    def approval_id(self) -> str:
        return self.asked.approval_id

    @property
    def options(self) -> list[str]:
        return self.asked.options

    @property
    def kind(self) -> str:
        """What it asks about (``command``, ``tool``, ``question``, ``plan``, ...)."""
        return self.asked.approval_kind


@attrs.frozen
class Finished:
    """A prompt ended; answer its ``session/prompt``."""

    prompt: Prompt


@attrs.frozen
class Interrupt:
    """Ask the daemon to interrupt the running turn (a cancel is in effect)."""

    turn_id: str | None


@attrs.frozen
class ApprovalOpened:
    approval: Approval


@attrs.frozen
class ApprovalClosed:
    approval_id: str
    decision: str
    by: str


Action = Finished | Interrupt | ApprovalOpened | ApprovalClosed


class TurnTracker:
    """Follows one session's journal, in seq order, for the prompts of one bridge."""

    def __init__(self) -> None:
        self.open_turn: str | None = None
        self.prompts: dict[str, Prompt] = {}  # by operation id
        self.approvals: dict[str, Approval] = {}  # pending (Rule 3)
        self._by_message: dict[str, Prompt] = {}  # by clientMessageId, once seen

    def add(self, operation_id: str, arrival: int = 0) -> Prompt:
        """Track a prompt before it is sent, so no journal event of it is missed."""
        prompt = Prompt(operation_id=operation_id, arrival=arrival)
        self.prompts[operation_id] = prompt
        return prompt

    def discard(self, operation_id: str) -> None:
        prompt = self.prompts.pop(operation_id, None)
        if prompt is not None and prompt.client_message_id is not None:
            self._by_message.pop(prompt.client_message_id, None)

    def cancel(self, before: int | None = None) -> list[Action]:
        """The editor cancels: every unfinished prompt it sent before the cancel (by
        ``arrival``; all without ``before``) will stop ``cancelled``; the running turn
        is interrupted now, a turn still to start when it starts."""
        unfinished = [
            p
            for p in self.prompts.values()
            if not p.finished and (before is None or p.arrival < before)
        ]
        for prompt in unfinished:
            prompt.cancel_requested = True
        if unfinished or self.open_turn is not None:
            return [Interrupt(self.open_turn)]
        return []

    def event(self, journal_event: JournalEvent) -> list[Action]:
        match event := journal_event.event():
            case Submission(operation_id=operation_id, client_message_id=cmid):
                prompt = self.prompts.get(str(operation_id))
                if prompt is not None and not prompt.finished:
                    prompt.client_message_id = cmid
                    self._by_message[cmid] = prompt
                return []
            case SubmissionDispatched():
                return self._dispatched(event)
            case TurnStarted(turn_id=turn_id):
                return self._turn_started(turn_id)
            case TurnCompleted():
                return self._turn_completed(event)
            case ApprovalRequested():
                approval = Approval(event)
                self.approvals[approval.approval_id] = approval
                return [ApprovalOpened(approval)]
            case ApprovalResolved(approval_id=approval_id, decision=decision, by=by):
                if self.approvals.pop(approval_id, None) is None:
                    return []
                return [ApprovalClosed(approval_id, decision, by)]
            case ChildExited() as exited:
                return self._exited(exited)
            case _:
                return []

    def _dispatched(self, dispatched: SubmissionDispatched) -> list[Action]:
        prompt = self._by_message.get(dispatched.client_message_id)
        if prompt is None or prompt.finished:
            return []
        outcome = dispatched.outcome
        reason = dispatched.reason
        if outcome == "rejected":
            prompt.reason = reason
            return self._finish(prompt, "refusal")
        if outcome != "accepted":
            failure = PromptFailed(
                f"delivery to the agent is unknown ({reason or 'not confirmed'}); "
                "it may or may not have seen the prompt",
                "dispatch_unknown",
            )
            return self._finish(prompt, failure)
        turn_id = dispatched.turn_id or self.open_turn
        if turn_id is None:
            prompt.awaiting_turn = True
            return []
        if turn_id in prompt.completed:
            return self._finish(prompt, _turn_outcome(prompt.completed[turn_id], reason))
        prompt.turn_id = turn_id
        return []

    def _turn_started(self, turn_id: str | None) -> list[Action]:
        self.open_turn = turn_id
        actions: list[Action] = []
        for prompt in self.prompts.values():
            if prompt.awaiting_turn and not prompt.finished:
                prompt.awaiting_turn = False
                prompt.turn_id = turn_id
                if prompt.cancel_requested:
                    actions.append(Interrupt(turn_id))
        return actions

    def _turn_completed(self, done: TurnCompleted) -> list[Action]:
        self.open_turn = None
        turn_id = done.turn_id
        actions: list[Action] = []
        for prompt in list(self.prompts.values()):
            if prompt.finished or prompt.client_message_id is None:
                continue
            if turn_id is not None and prompt.turn_id == turn_id:
                actions += self._finish(prompt, _turn_outcome(done.outcome, done.reason))
            elif turn_id is not None:
                prompt.completed[turn_id] = done.outcome
        return actions

    def _exited(self, exited: ChildExited) -> list[Action]:
        self.open_turn = None
        why = f"the agent exited ({exited.cause}) before the turn ended"
        if exited.error is not None:
            why += f": {exited.error.message}"
        if exited.stderr_tail:
            why += f"\nits stderr ends:\n{exited.stderr_tail.strip()}"
        actions: list[Action] = [
            ApprovalClosed(approval_id, "cancelled", "daemon") for approval_id in self.approvals
        ]
        self.approvals.clear()
        for prompt in list(self.prompts.values()):
            if not prompt.finished and prompt.client_message_id is not None:
                failure = PromptFailed(why, "agent_exited")
                actions += self._finish(prompt, failure)
        return actions

    def _finish(self, prompt: Prompt, outcome: StopReason | PromptFailed) -> list[Action]:
        if prompt.cancel_requested:
            prompt.stop_reason = "cancelled"
        elif isinstance(outcome, PromptFailed):
            prompt.failure = outcome
        else:
            prompt.stop_reason = outcome
        self.discard(prompt.operation_id)
        return [Finished(prompt)]


def _turn_outcome(outcome: str, reason: str | None) -> StopReason | PromptFailed:
    match outcome:
        case "completed":
            return "end_turn"
        case "interrupted":
            return "cancelled"
        case "failed":
            return PromptFailed("the agent's turn failed", "turn_failed")
        case _:
            why = f" ({reason})" if reason else ""
            return PromptFailed(f"the turn ended without a known outcome{why}", "turn_unknown")
