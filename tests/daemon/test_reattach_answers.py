"""Which committed answers and interrupts a takeover writes to the agent
(``agentsd.reattach`` Rule 2): those journaled after the last one the holder took,
in journal order, none when the holder cannot say. The whole path, crash included,
is ``tests/e2e/test_reattach_answers.py`` and ``tests/e2e/test_reattach_interrupts.py``."""

from __future__ import annotations

from agentsd.reattach import Answer, Interrupt, KeyedWrite, owed, undelivered
from agentsd_protocol.api.events import ApprovalRequested


def _answer(approval_id: str, seq: int, decision: str = "accept") -> Answer:
    asked = ApprovalRequested(
        approval_id=approval_id,
        native_id=f"native-{approval_id}",
        approval_kind="command",
        title="run it",
        detail="ls",
        options=["accept", "decline"],
        request={"requestId": f"native-{approval_id}"},
    )
    return Answer(asked, decision, seq)


ANSWERS = [_answer("a", 7), _answer("b", 9, "decline"), _answer("c", 12)]
# Answers and interrupts interleaved as one session journals them: the keyed writes.
MIXED: list[KeyedWrite] = [
    _answer("a", 7),
    Interrupt("turn-1", 8),
    _answer("b", 11),
    Interrupt("turn-2", 15),
    _answer("c", 16),
]


def _ids(writes: list[KeyedWrite]) -> list[str]:
    return [w.approval_id if isinstance(w, Answer) else f"stop {w.turn_id}" for w in writes]


def test_the_answers_after_the_holders_last_key_are_written() -> None:
    """The key is the seq of the last answer the holder took."""
    assert _ids(undelivered(ANSWERS, "7", keys_known=True)) == ["b", "c"]
    assert _ids(undelivered(ANSWERS, "12", keys_known=True)) == []


def test_with_no_key_taken_every_answer_of_the_child_is_written() -> None:
    assert _ids(undelivered(ANSWERS, None, keys_known=True)) == ["a", "b", "c"]


def test_nothing_is_written_when_the_holder_cannot_say() -> None:
    """At most once before exactly once: an earlier holder, a daemon that wrote
    unkeyed, or a key that is none of this child's answers."""
    assert undelivered(ANSWERS, None, keys_known=False) == []
    assert undelivered(ANSWERS, "7", keys_known=False) == []
    assert undelivered(ANSWERS, "8", keys_known=True) == []
    assert undelivered(ANSWERS, "a", keys_known=True) == []


def test_answers_and_interrupts_after_the_last_key_are_written_in_journal_order() -> None:
    """One order for all keyed writes: the key may be an answer's seq or an
    interrupt's, and what follows it, of either kind, is written in order."""
    assert _ids(undelivered(MIXED, "7", keys_known=True)) == [
        "stop turn-1",
        "b",
        "stop turn-2",
        "c",
    ]
    assert _ids(undelivered(MIXED, "11", keys_known=True)) == ["stop turn-2", "c"]
    assert _ids(undelivered(MIXED, None, keys_known=True)) == _ids(MIXED)


def test_the_last_key_may_be_an_interrupts() -> None:
    assert _ids(undelivered(MIXED, "8", keys_known=True)) == ["b", "stop turn-2", "c"]
    assert _ids(undelivered(MIXED, "15", keys_known=True)) == ["c"]
    assert undelivered([Interrupt("turn-3", 20)], "20", keys_known=True) == []
    assert _ids(undelivered([Interrupt("turn-3", 20)], None, keys_known=True)) == ["stop turn-3"]


def test_no_interrupt_is_written_when_the_holder_cannot_say() -> None:
    """An unknown key (a seq between the keyed writes, or none of this child's) or
    keys unknown: nothing, not even an interrupt of a turn still open."""
    assert undelivered(MIXED, None, keys_known=False) == []
    assert undelivered(MIXED, "15", keys_known=False) == []
    assert undelivered(MIXED, "9", keys_known=True) == []
    assert undelivered(MIXED, "turn-2", keys_known=True) == []


def test_a_written_answer_restores_its_question_for_the_adapter() -> None:
    [answer] = undelivered(ANSWERS, "9", keys_known=True)
    assert isinstance(answer, Answer)
    pending = answer.pending()
    assert (pending.native_id, pending.approval_id, pending.kind) == ("native-c", "c", "command")
    assert pending.options == ("accept", "decline")
    assert pending.request == {"requestId": "native-c"}


def test_an_interrupt_is_written_only_for_the_open_turn_and_once() -> None:
    """Answers are all written; an interrupt only when it names the turn still open
    (one that ended needs none, one of no named turn proves nothing), the first
    such one only, each in its place in journal order."""
    writes: list[KeyedWrite] = [
        Interrupt("turn-1", 8),
        _answer("b", 11),
        Interrupt("turn-2", 15),
        _answer("c", 16),
        Interrupt("turn-2", 17),
        Interrupt(None, 18),
    ]
    assert _ids(owed(writes, turn_open=True, turn_id="turn-2")) == ["b", "stop turn-2", "c"]
    assert _ids(owed(writes, turn_open=True, turn_id="turn-1")) == ["stop turn-1", "b", "c"]
    assert _ids(owed(writes, turn_open=True, turn_id="turn-3")) == ["b", "c"]
    assert _ids(owed(writes, turn_open=False, turn_id="turn-2")) == ["b", "c"]
    assert _ids(owed(writes, turn_open=True, turn_id=None)) == ["b", "c"]
