"""A journal written before the events were typed (``tests/fixtures/journal_v1.db``,
made by ``make_journal_v1.py``) decodes row by row and replays to the same status
and the same transcript as the code that wrote it derived."""

from __future__ import annotations

import io
import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentsctl.render import Transcript
from agentsd.session import derive_conversation
from agentsd_protocol.api import events as ev
from agentsd_protocol.api.stream import JournalEvent

FIXTURES = Path(__file__).parent.parent / "fixtures"
DB = FIXTURES / "journal_v1.db"
EXPECTED: dict[str, Any] = json.loads((FIXTURES / "journal_v1.expected.json").read_text())

# The intended differences: the CLI showed an agent's failure at its exit as a
# Python dict; it now shows "kind: message". And a turn a daemon restart or stop cut
# off is now said to be one, with the command that carries it on.
OLD_EXIT_ERROR = (
    "failed, {'kind': 'agent_not_found', 'message': \"cannot start the agent: "
    "'/nonexistent/agent' was not found\"}"
)
NEW_EXIT_ERROR = (
    "failed, agent_not_found: cannot start the agent: '/nonexistent/agent' was not found"
)

Row = tuple[str, int, float, int, str, bytes]
# Kinds added after the fixture was written: no v1 journal can hold them.
KINDS_SINCE_V1 = {
    "thread.superseded",
    "prompt.queued",
    "prompt.edited",
    "prompt.withdrawn",
    "queue.paused",
    "queue.resumed",
    "session.acknowledged",
    "agent.request",
    "commands.updated",
    "command.run",
    "conversation.cleared",
    "message.imported",
    "child.reattached",
}
# A body's field "kind" before the union (the tag owns that name now).
RENAMED_FIELDS = {
    "approval.requested": {"kind": "approvalKind"},
    "agent.error": {"kind": "errorKind"},
}


@pytest.fixture(scope="module")
def conn() -> Iterator[sqlite3.Connection]:
    # immutable: read in place, without the -shm/-wal files a WAL database would get.
    connection = sqlite3.connect(f"file:{DB}?immutable=1", uri=True)
    yield connection
    connection.close()


def rows(conn: sqlite3.Connection, session_id: str | None = None) -> list[Row]:
    query = "SELECT session_id, seq, ts, fence, kind, body FROM events"
    if session_id is None:
        cursor = conn.execute(query + " ORDER BY session_id, seq")
    else:
        cursor = conn.execute(query + " WHERE session_id = ? ORDER BY seq", (session_id,))
    return [(s, seq, ts, fence, kind, bytes(body)) for s, seq, ts, fence, kind, body in cursor]


def transcript(events: list[JournalEvent]) -> str:
    out = io.StringIO()
    view = Transcript(out)
    for event in events:
        view.event(event)
    view.end_line()
    return out.getvalue()


# Intended differences since: a title or options change shows what changed, not its
# kind; the agent's usage shows as one line at its turn's end instead of a note per
# report. (session, as v1 showed it, as shown now), each replaced once, in order.
CHANGED_LINES = [
    ("63a1a8cf3f57", "-- session.updated\n", "-- title: journal v1\n"),
    ("63a1a8cf3f57", "-- session.updated\n", '-- options: {"chunks":50,"chunkDelayS":0.1}\n'),
    ("claudeshape1", "-- session.updated\n", '-- options: {"permissionMode":"default"}\n'),
    ("e2eae88c0d00", "-- session.updated\n", '-- options: {"ackDelayS":30}\n'),
    ("codexshapes1", "-- usage.updated\n", ""),
    (
        "codexshapes1",
        "-- turn 019a-turn-1 failed\n",
        "-- turn 019a-turn-1 failed\n"
        "(turn 30 tokens, 30 in all, 100% of the context left (271k of 272k))\n",
    ),
]
OLD_CUT_OFF = re.compile(r"^-- turn (\S+) interrupted \((daemon-restart|shutdown)\)$", re.M)


def _cut_off(match: re.Match[str]) -> str:
    by = "stop" if match.group(2) == "shutdown" else "restart"
    return f"-- turn {match.group(1)} cut off by a daemon {by}; `agentsctl continue` carries it on"


def expected_transcript(session_id: str) -> str:
    text: str = EXPECTED[session_id]["transcript"]
    for session, old, new in CHANGED_LINES:
        if session == session_id:
            assert old in text, (session_id, old)
            text = text.replace(old, new, 1)
    return OLD_CUT_OFF.sub(_cut_off, text.replace(OLD_EXIT_ERROR, NEW_EXIT_ERROR))


def test_the_fixture_holds_every_kind_the_daemon_writes(conn: sqlite3.Connection) -> None:
    stored = {row[4] for row in rows(conn)}
    current = {ev.RENAMED_KINDS.get(kind, kind) for kind in stored}
    assert current == set(ev.KINDS) - KINDS_SINCE_V1
    assert set(ev.RENAMED_KINDS) <= stored  # the old names, as that code wrote them


def test_every_row_written_before_the_union_decodes_and_round_trips(
    conn: sqlite3.Connection,
) -> None:
    for _, seq, _, _, kind, body in rows(conn):
        event = ev.decode_event(kind, body)
        assert not isinstance(event, ev.UnknownEvent), (seq, kind)
        assert ev.kind_of(event) == ev.RENAMED_KINDS.get(kind, kind)
        assert ev.decode_event(ev.kind_of(event), ev.encode_body(event)) == event
        # What the daemon serves for the row decodes to the same event.
        served_kind, served_body = ev.upgrade_row(kind, body)
        assert served_kind == ev.kind_of(event)
        assert ev.decode_event(served_kind, served_body) == event
        # Nothing the old body said is lost: each field with a value is a field now
        # (under its new name), only fields at their default are left out.
        said = {k for k, v in msgspec.json.decode(body).items() if v not in (None, False, [], {})}
        kept = set(msgspec.json.decode(ev.encode_body(event)))
        renamed = RENAMED_FIELDS.get(kind, {})
        assert {renamed.get(k, k) for k in said} <= kept, (seq, kind)


@pytest.mark.parametrize("session_id", sorted(EXPECTED))
def test_a_journal_v1_replays_to_the_same_status(conn: sqlite3.Connection, session_id: str) -> None:
    convo = derive_conversation(conn, session_id)
    expected = EXPECTED[session_id]
    assert convo.status == expected["status"]
    assert convo.turn_id == expected["turnId"]
    assert sorted(convo.undispatched) == expected["undispatched"]
    assert sorted(convo.approvals) == expected["approvals"]


@pytest.mark.parametrize("session_id", sorted(EXPECTED))
def test_a_journal_v1_shows_the_same_transcript(conn: sqlite3.Connection, session_id: str) -> None:
    events = [
        JournalEvent(seq=seq, ts=ts, fence=fence, kind=kind, body=msgspec.Raw(body))
        for _, seq, ts, fence, kind, body in rows(conn, session_id)
    ]
    assert transcript(events) == expected_transcript(session_id)
