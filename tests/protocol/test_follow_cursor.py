"""The follow cursor: exactly once and in order across lags, drops, duplicates and
gaps; the end of a deleted session; catch-up markers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsd_protocol.api import stream as sm
from agentsd_protocol.client.core import Notification
from agentsd_protocol.client.cursor import CaughtUp, Ended, FollowCursor, FollowItem, Resubscribe

SETTINGS = settings(max_examples=200, deadline=None)


def note(method: str, params: dict[str, Any]) -> Notification:
    return Notification(method, msgspec.Raw(msgspec.json.encode(params)))


def event(subscription_id: str, seq: int, session_id: str = "s") -> Notification:
    body = {"seq": seq, "ts": 0.0, "fence": 1, "kind": f"e{seq}", "body": {}}
    params = {"subscriptionId": subscription_id, "sessionId": session_id, "seq": seq}
    return note("agentSession.event", params | {"event": body})


def lagged(subscription_id: str, resume_after_seq: int) -> Notification:
    params = {"subscriptionId": subscription_id, "sessionId": "s"}
    return note("agentSession.lagged", params | {"resumeAfterSeq": resume_after_seq})


def subscribed(subscription_id: str, head_seq: int) -> sm.SubscribeResult:
    return sm.SubscribeResult(subscription_id=subscription_id, head_seq=head_seq)


def seqs(items: Sequence[FollowItem]) -> list[int]:
    return [item.seq for item in items if isinstance(item, sm.JournalEvent)]


def test_catch_up_then_live_with_a_marker_at_the_head() -> None:
    cursor = FollowCursor("s", after_seq=0)
    assert cursor.subscribe_params() == sm.SubscribeParams(session_id="s", after_seq=0)
    assert cursor.subscribed(subscribed("sub-1", head_seq=2)) == []
    first = cursor.receive(event("sub-1", 1))
    second = cursor.receive(event("sub-1", 2))
    assert seqs(first) == [1]
    assert seqs(second) == [2] and second[-1] == CaughtUp(seq=2)
    assert seqs(cursor.receive(event("sub-1", 3))) == [3]
    assert cursor.head_seq == 2


def test_following_from_the_head_starts_there() -> None:
    cursor = FollowCursor("s", after_seq=None)
    assert cursor.subscribe_params().after_seq is None
    assert cursor.subscribed(subscribed("sub-1", head_seq=7)) == [CaughtUp(seq=7)]
    assert cursor.last_seq == 7
    assert seqs(cursor.receive(event("sub-1", 8))) == [8]


def test_lagged_resubscribes_from_the_last_seq_handed_out() -> None:
    cursor = FollowCursor("s")
    cursor.subscribed(subscribed("sub-1", head_seq=0))
    cursor.receive(event("sub-1", 1))
    assert cursor.receive(lagged("sub-1", 1)) == [Resubscribe()]
    assert cursor.subscribe_params().after_seq == 1
    assert cursor.receive(event("sub-1", 2)) == []  # the ended subscription's
    cursor.subscribed(subscribed("sub-2", head_seq=3))
    assert seqs(cursor.receive(event("sub-2", 2))) == [2]


def test_a_gap_or_garbage_abandons_the_subscription_once() -> None:
    cursor = FollowCursor("s")
    cursor.subscribed(subscribed("sub-1", head_seq=0))
    assert cursor.receive(event("sub-1", 2)) == [Resubscribe(stale="sub-1")]
    assert cursor.receive(note("agentSession.event", {"seq": "x"})) == []  # already resubscribing
    cursor.subscribed(subscribed("sub-2", head_seq=2))
    assert cursor.receive(note("agentSession.delta", {"bad": 1})) == [Resubscribe(stale="sub-2")]


def test_ended_ends_following_and_nothing_comes_after() -> None:
    cursor = FollowCursor("s")
    cursor.subscribed(subscribed("sub-1", head_seq=1))
    cursor.receive(event("sub-1", 1))
    ended = {"subscriptionId": "sub-0", "sessionId": "s", "lastSeq": 1, "reason": "deleted"}
    assert cursor.receive(note("agentSession.ended", ended)) == [Ended("s", "deleted", 1)]
    assert cursor.receive(event("sub-1", 2)) == []
    other = FollowCursor("t")
    other.subscribed(subscribed("sub-9", head_seq=0))
    assert other.receive(note("agentSession.ended", ended)) == []


def test_other_subscriptions_and_methods_are_ignored() -> None:
    cursor = FollowCursor("s")
    cursor.subscribed(subscribed("sub-1", head_seq=0))
    assert cursor.receive(event("sub-2", 1)) == []
    assert cursor.receive(note("agentSession.status", {"watchId": "w"})) == []
    delta = {"subscriptionId": "sub-1", "sessionId": "s", "itemId": "i", "offset": 0}
    (item,) = cursor.receive(note("agentSession.delta", delta | {"text": "t", "afterSeq": 0}))
    assert isinstance(item, sm.DeltaNotification) and item.text == "t"


# -- the property: a daemon that lags, drops and repeats ----------------------------

ACTIONS = st.sampled_from(["append", "deliver", "deliver", "lag", "drop", "repeat"])


@SETTINGS
@given(st.integers(min_value=0, max_value=5), st.lists(ACTIONS, max_size=60))
def test_any_lag_drop_or_repeat_hands_out_every_event_once_in_order(
    start: int, actions: list[str]
) -> None:
    head = start + 3  # the journal before following began
    cursor = FollowCursor("s", after_seq=start)
    handed: list[int] = []
    subscriptions = iter(f"sub-{n}" for n in range(1, 10_000))
    current = ""
    next_seq = 0  # the next seq the daemon sends on the current subscription
    sent_last = 0  # the last seq it sent (to repeat it)

    def subscribe() -> None:
        nonlocal current, next_seq
        params = cursor.subscribe_params()
        assert params.after_seq is not None
        current = next(subscriptions)
        next_seq = params.after_seq + 1
        take(cursor.subscribed(subscribed(current, head)))

    def take(items: Sequence[FollowItem]) -> None:
        handed.extend(seqs(items))
        if any(isinstance(item, Resubscribe) for item in items):
            subscribe()

    def deliver() -> None:
        nonlocal next_seq, sent_last
        if next_seq <= head:
            sent_last = next_seq
            next_seq += 1
            take(cursor.receive(event(current, sent_last)))

    subscribe()
    for action in actions:
        if action == "append":
            head += 1
        elif action == "deliver":
            deliver()
        elif action == "lag":
            take(cursor.receive(lagged(current, next_seq - 1)))
        elif action == "drop":  # the connection fails; what was in flight is lost
            cursor.unsubscribed()
            subscribe()
        elif action == "repeat" and sent_last:
            take(cursor.receive(event(current, sent_last)))
    while next_seq <= head:
        deliver()
    assert handed == list(range(start + 1, head + 1))
