"""Which committed answers a takeover writes to the agent (``agentsd.reattach`` Rule 2):
those journaled after the last one the holder took, none when the holder cannot
say. The whole path, crash included, is ``tests/e2e/test_reattach_answers.py``."""

from __future__ import annotations

from agentsd.reattach import Answer, undelivered
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


def _ids(answers: list[Answer]) -> list[str]:
    return [a.approval_id for a in answers]


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


def test_a_written_answer_restores_its_question_for_the_adapter() -> None:
    [answer] = undelivered(ANSWERS, "9", keys_known=True)
    pending = answer.pending()
    assert (pending.native_id, pending.approval_id, pending.kind) == ("native-c", "c", "command")
    assert pending.options == ("accept", "decline")
    assert pending.request == {"requestId": "native-c"}
