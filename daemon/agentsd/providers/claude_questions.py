"""Claude Code's two tools that ask the user, as daemon approvals (sans I/O).

Both arrive as ``can_use_tool`` requests (``requires_user_interaction: true``) and
are answered like any tool, but the answer carries what the user said. Checked
against Claude Code 2.1.332 and Anthropic's "Handle approvals and user input" guide
for the Agent SDK:

- ``AskUserQuestion`` input is ``{questions: [{question, header, options: [{label,
  description}], multiSelect}]}`` (1-4 questions of 2-4 options). The answer is
  ``allow`` with ``updatedInput`` = the input plus ``answers: {question text:
  label}`` (several labels of a multiSelect joined with ", "); the CLI turns it into
  the tool result ``Your questions have been answered: "<question>"="<label>"``. A
  question may also be free text (``kind: "text"`` or ``"number"``, no options)
  and may be left unanswered (no key in ``answers``).
- ``ExitPlanMode`` (plan mode only) carries ``{plan, planFilePath}``: Claude Code
  reads the plan from the plan file into the input. ``allow`` leaves plan mode
  (the tool result carries the approved plan); ``deny`` keeps it, and its message
  is the tool result the model reads.

How they are asked (Rule 1): the approval API answers with one decision out of the
approval's options, so each question is its own approval of kind ``question``,
asked in order once the one before it is answered: its options are the labels plus
``decline`` (``skip`` and ``decline`` for a question without options). A
multiSelect question takes one label this way. Declining or cancelling any question
refuses the whole call: the model learns that the user did not answer. A plan is
one approval of kind ``plan`` with ``approve`` and ``decline`` (keep planning).
Anything the options cannot say (free text, several labels) the user sends as a
message, which Claude Code folds into the running turn.
"""

from __future__ import annotations

from typing import Any

import attrs

QUESTION_TOOL = "AskUserQuestion"
PLAN_TOOL = "ExitPlanMode"
DECLINE = "decline"  # refuses the call; ``cancel`` (always accepted by respond) does too
SKIP = "skip"  # leaves a question without options unanswered
APPROVE = "approve"
MAX_TEXT_CHARS = 8 * 1024  # a question or an option is a line or two
MAX_PLAN_CHARS = 64 * 1024  # the plan is what the user decides on: show it whole


@attrs.frozen
class Ask:
    """What one approval shows: its kind, title, detail and options."""

    kind: str
    title: str
    detail: str
    options: list[str]


@attrs.frozen
class Question:
    text: str
    header: str | None
    labels: tuple[str, ...]  # distinct, in the model's order
    descriptions: tuple[str | None, ...]
    multi_select: bool


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def parse_questions(tool_input: Any) -> list[Question]:
    """The questions of an ``AskUserQuestion`` input; empty when it has none with a
    text (such a call is then asked about as a plain tool)."""
    raw = tool_input.get("questions") if isinstance(tool_input, dict) else None
    questions: list[Question] = []
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, dict) or _str(entry.get("question")) is None:
            continue
        labels: dict[str, str | None] = {}
        options = entry.get("options")
        for option in options if isinstance(options, list) else []:
            label = _str(option.get("label")) if isinstance(option, dict) else None
            if label is not None and label not in labels:
                labels[label] = _str(option.get("description"))
        questions.append(
            Question(
                text=str(entry["question"]),
                header=_str(entry.get("header")),
                labels=tuple(labels),
                descriptions=tuple(labels.values()),
                multi_select=entry.get("multiSelect") is True,
            )
        )
    return questions


def _declined(decision: str) -> dict[str, Any]:
    why = "cancelled the questions" if decision == "cancel" else "declined to answer"
    return {
        "behavior": "deny",
        "message": f"The user {why}; no answer was given. Ask again in your reply if "
        "you still need to know.",
    }


class QuestionForm:
    """The questions of one ``AskUserQuestion`` call, asked one at a time (Rule 1).

    ``ask`` describes the current question; ``answer`` takes its decision and
    returns the ``can_use_tool`` response once the call is settled (all answered,
    or one declined), None while another question follows.
    """

    def __init__(
        self,
        tool_input: Any,
        questions: list[Question],
        *,
        answers: dict[str, str] | None = None,
        index: int = 0,
    ) -> None:
        """``answers`` and ``index``: a form taken over part-answered (``progress``)."""
        if not questions:
            raise ValueError("a question form needs at least one question")
        self._input: dict[str, Any] = dict(tool_input) if isinstance(tool_input, dict) else {}
        self._questions = questions
        self._answers: dict[str, str] = dict(answers or {})
        self._index = min(max(index, 0), len(questions) - 1)

    def progress(self) -> dict[str, Any]:
        """The answers so far and the current question's index, to take it over."""
        return {"answers": dict(self._answers), "index": self._index}

    @property
    def number(self) -> int:
        """The current question's place, from 1."""
        return self._index + 1

    def ask(self) -> Ask:
        question = self._questions[self._index]
        title = f"{question.header}: {question.text}" if question.header else question.text
        if len(self._questions) > 1:
            title += f" ({self.number} of {len(self._questions)})"
        lines = [
            f"{label}: {description}" if description else label
            for label, description in zip(question.labels, question.descriptions, strict=True)
        ]
        if not question.labels:
            lines.append(f"(an answer in words: {SKIP} this question and send it as a message)")
            options = [SKIP, DECLINE]
        else:
            if question.multi_select:
                lines.append("(several may apply; choose one here, send more as a message)")
            options = [*question.labels, *([DECLINE] if DECLINE not in question.labels else [])]
        return Ask(
            kind="question",
            title=_clip(title),
            detail=_clip("\n".join(lines)),
            options=options,
        )

    def answer(self, decision: str) -> dict[str, Any] | None:
        question = self._questions[self._index]
        if decision in question.labels:
            self._answers[question.text] = decision
        elif not (decision == SKIP and not question.labels):
            return _declined(decision)
        self._index += 1
        if self._index < len(self._questions):
            return None
        return {"behavior": "allow", "updatedInput": {**self._input, "answers": self._answers}}


def plan_approval(tool_input: Any) -> Ask:
    """The approval for an ``ExitPlanMode`` call: the plan as its detail (else the
    plan file's path)."""
    fields = tool_input if isinstance(tool_input, dict) else {}
    plan = _str(fields.get("plan")) or _str(fields.get("planFilePath"))
    return Ask(
        kind="plan",
        title="Leave plan mode and carry out this plan? (decline: keep planning)",
        detail=_clip(plan or "(claude sent no plan text)", MAX_PLAN_CHARS),
        options=[APPROVE, DECLINE],
    )


def plan_response(decision: str, tool_input: Any) -> dict[str, Any]:
    """The ``can_use_tool`` answer for a plan: ``approve`` leaves plan mode;
    ``decline`` and ``cancel`` keep planning."""
    if decision == APPROVE:
        return {"behavior": "allow", "updatedInput": tool_input}
    why = "cancelled the request" if decision == "cancel" else "declined the plan"
    return {
        "behavior": "deny",
        "message": f"The user {why}: stay in plan mode and keep planning. They may "
        "say what to change in their next message.",
    }
