"""The status board (``agentsd.status_board``): a watcher hears each change of a
session's (phase, status) once, a change of phase without anyone asking, and a
watcher that cannot take a notification is dropped."""

from __future__ import annotations

from agentsd.session import Session
from agentsd.status_board import StatusBoard
from agentsd.store.sessions import SessionRow
from agentsd_protocol.api.events import Submission, SubmissionDispatched
from agentsd_protocol.api.stream import StatusNotification


def a_session(board: StatusBoard, session_id: str = "s1") -> Session:
    row = SessionRow(
        id=session_id,
        host_id="h",
        provider="mock",
        cwd="/",
        title="a title",
        options={},
        env={},
        command=None,
        provider_handle=None,
        created_at=0.0,
        updated_at=0.0,
    )
    return Session(row=row, head_seq=0, board=board)


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


def test_a_watcher_hears_each_change_once_and_a_change_of_phase_unasked() -> None:
    board = StatusBoard()
    session = a_session(board)
    watcher = Watcher()
    snapshot = board.watch("w1", watcher, [session])
    assert [(s.session_id, s.phase, s.status, s.title) for s in snapshot] == [
        ("s1", "stopped", "idle", "a title")
    ]
    board.changed(session)
    board.changed(session)  # nothing changed since: told once
    session.conversation.apply(1, Submission(client_message_id="m1", text="hi"))
    board.changed(session)
    board.changed(session)
    session.transition("starting")  # tells the board itself
    session.conversation.apply(2, SubmissionDispatched(client_message_id="m1", outcome="accepted"))
    board.changed(session)
    board.deleted(session)
    assert watcher.seen == [
        ("stopped", "idle", False),
        ("stopped", "working", False),
        ("starting", "working", False),
        ("starting", "idle", False),
        ("starting", "idle", True),
    ]
    assert {n.watch_id for n in watcher.notes} == {"w1"}


def test_a_watcher_that_cannot_take_a_notification_is_dropped_and_others_still_hear() -> None:
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
