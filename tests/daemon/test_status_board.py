"""The status board (``agentsd.status_board``): a watcher hears each change of a
session's summary once, a change of phase without anyone asking, at a bounded rate
however fast sessions stream (counted over virtual time), always ending on the
latest summary; a watcher that cannot take a notification is dropped; notices go to
every feed."""

from __future__ import annotations

import itertools
from collections import Counter

import trio
import trio.testing

from agentsd.session import Session
from agentsd.status_board import BURST, CONTENT_INTERVAL_S, RATE_PER_S, StatusBoard
from agentsd.store.sessions import SessionRow
from agentsd_protocol.api.attention import NoticeNotification
from agentsd_protocol.api.events import (
    ApprovalRequested,
    Event,
    ItemStarted,
    ItemUpdated,
    SessionAcknowledged,
    Submission,
    SubmissionDispatched,
    TurnCompleted,
    TurnStarted,
)
from agentsd_protocol.api.stream import StatusNotification


def a_session(board: StatusBoard, session_id: str = "s1") -> Session:
    row = SessionRow(
        id=session_id,
        host_id="h",
        provider="mock",
        cwd="/",
        title="a title",
        options={"model": "m1"},
        env={},
        command=None,
        provider_handle=None,
        created_at=0.0,
        updated_at=0.0,
    )
    return Session(row=row, head_seq=0, board=board)


def commit(session: Session, *events: Event) -> None:
    """What the journal port does after a commit (``SessionJournal._committed``)."""
    for event in events:
        session.head_seq += 1
        session.conversation.apply(session.head_seq, event)
        notable = session.summary.apply(session.head_seq, event)
        session.board.changed(session)
        if notable:
            session.board.announce(session, session.head_seq, 0.0, event)


class Watcher:
    def __init__(self, *, accepts: bool = True) -> None:
        self.notes: list[StatusNotification] = []
        self.accepts = accepts

    def __call__(self, note: StatusNotification) -> bool:
        self.notes.append(note)
        return self.accepts

    @property
    def seen(self) -> list[tuple[str, str, bool]]:
        return [(n.session.phase, n.session.status, n.deleted) for n in self.notes]


async def test_a_watcher_hears_each_change_once_and_a_change_of_phase_unasked() -> None:
    board = StatusBoard()
    session = a_session(board)
    watcher = Watcher()
    _, snapshot = board.watch("w1", watcher, [session])
    assert [(s.session_id, s.phase, s.status, s.title, s.model) for s in snapshot] == [
        ("s1", "stopped", "idle", "a title", "m1")
    ]
    board.changed(session)  # nothing changed since the snapshot: not told
    commit(session, Submission(client_message_id="m1", text="hi"))
    board.changed(session)
    session.transition("starting")  # tells the board itself
    commit(session, SubmissionDispatched(client_message_id="m1", outcome="accepted"))
    board.deleted(session)
    assert watcher.seen == [
        ("stopped", "working", False),
        ("starting", "working", False),
        ("starting", "idle", False),
        ("starting", "idle", True),
    ]
    assert watcher.notes[0].session.last_prompt == "hi"
    assert {n.watch_id for n in watcher.notes} == {"w1"}


async def test_a_watcher_that_cannot_take_a_notification_is_dropped_and_others_still_hear() -> None:
    board = StatusBoard()
    session = a_session(board)
    gone, staying = Watcher(accepts=False), Watcher()
    board.watch("gone", gone, [])
    board.watch("staying", staying, [])
    session.transition("starting")
    session.transition("running")
    assert len(gone.notes) == 1
    assert [phase for phase, _, _ in staying.seen] == ["starting", "running"]
    board.unwatch("staying")
    session.transition("stopping")
    assert len(staying.notes) == 2


async def test_the_summary_says_what_needs_the_user_and_unseen_follows_acknowledgement() -> None:
    board = StatusBoard()
    session = a_session(board)
    watcher = Watcher()
    board.watch("w1", watcher, [session])
    commit(
        session,
        Submission(client_message_id="m1", text="fix it"),
        SubmissionDispatched(client_message_id="m1", outcome="accepted"),
        TurnStarted(turn_id="t1"),
        ItemStarted(item_id="i1", turn_id="t1", type="agentMessage"),
        ItemUpdated(item_id="i1", text="I could not"),
        TurnCompleted(turn_id="t1", outcome="failed", error=None, reason="model_unreachable"),
    )
    last = watcher.notes[-1].session
    assert (last.state, last.outcome, last.failure) == ("failed", "failed", "model_unreachable")
    assert (last.last_prompt, last.unseen, last.attention_seq) == ("fix it", True, 6)
    commit(session, SessionAcknowledged(seq=6))
    assert watcher.notes[-1].session.unseen is False
    commit(
        session,
        Submission(client_message_id="m2", text="again"),
        ApprovalRequested(
            approval_id="a1",
            native_id="n1",
            approval_kind="command",
            title="run make",
            detail="",
            options=["accept"],
        ),
    )
    last = watcher.notes[-1].session
    assert (last.state, last.unseen) == ("attention", True)
    assert [(a.approval_id, a.title) for a in last.approvals] == [("a1", "run make")]


async def test_notices_go_to_every_feed_and_a_feed_that_cannot_take_one_is_dropped() -> None:
    board = StatusBoard()
    session = a_session(board)
    kept: list[NoticeNotification] = []
    dropped: list[NoticeNotification] = []

    def keep(note: NoticeNotification) -> bool:
        kept.append(note)
        return True

    def refuse(note: NoticeNotification) -> bool:
        dropped.append(note)
        return False

    board.follow("kept", keep)
    board.follow("dropped", refuse)
    commit(
        session,
        Submission(client_message_id="m1", text="hi"),
        ItemStarted(item_id="i1", type="agentMessage", text="done, all green"),
        TurnCompleted(outcome="completed"),
        ApprovalRequested(
            approval_id="a1",
            native_id="n",
            approval_kind="tool",
            title="write x",
            detail="",
            options=[],
        ),
    )
    assert [(n.notice.kind, n.notice.text, n.notice.outcome) for n in kept] == [
        ("turn", "done, all green", "completed"),
        ("approval", "write x", None),
    ]
    assert [n.notice.title for n in kept] == ["a title", "a title"]
    assert len(dropped) == 1


async def test_three_sessions_streaming_at_full_speed_are_coalesced_to_a_bounded_rate(
    autojump_clock: trio.testing.MockClock,
) -> None:
    board = StatusBoard()
    sessions = [a_session(board, f"s{i}") for i in range(3)]
    watcher = Watcher()
    pump, snapshot = board.watch("w1", watcher, sessions)
    assert len(snapshot) == 3
    duration_s = 4.0
    updates_per_session = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump.run_pump)
        for s in sessions:
            commit(s, Submission(client_message_id="m", text="go"), TurnStarted(turn_id="t"))
            commit(s, ItemStarted(item_id="i", turn_id="t", type="agentMessage"))
        start = trio.current_time()
        # Every session commits a new snapshot of its reply every millisecond, and
        # flips between working and attention every 10 ms.
        for tick in itertools.count():
            now = trio.current_time()
            if now - start >= duration_s:
                break
            for s in sessions:
                commit(s, ItemUpdated(item_id="i", text=f"chunk {tick}"))
                updates_per_session += 1
                if tick % 10 == 0:
                    flip: Event = (
                        ApprovalRequested(
                            approval_id=f"a{tick}",
                            native_id="n",
                            approval_kind="tool",
                            title="t",
                            detail="",
                            options=[],
                        )
                        if tick % 20 == 0
                        else TurnStarted(turn_id="t")
                    )
                    commit(s, flip)
            await trio.sleep(0.001)
        await trio.sleep(5 * CONTENT_INTERVAL_S)  # the held changes go out
        nursery.cancel_scope.cancel()
    per_session = Counter(n.session.session_id for n in watcher.notes)
    assert updates_per_session > 2000
    elapsed_s = trio.current_time() - start + 1
    for s in sessions:
        assert 0 < per_session[s.id] <= BURST + RATE_PER_S * elapsed_s
        # The last thing each session's watcher heard is its latest summary.
        last = [n.session for n in watcher.notes if n.session.session_id == s.id][-1]
        assert last.last_reply == s.summary.last_reply
        assert last.head_seq == s.head_seq
    for a, b in itertools.pairwise(watcher.notes):
        assert a.session != b.session
