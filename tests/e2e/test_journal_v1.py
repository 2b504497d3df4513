"""A daemon started on a state directory written before the events were typed loads
every session with the status that code derived, and serves its history in the
current kinds, rendering as it did."""

from __future__ import annotations

import shutil
from typing import Any

import msgspec

from agentsd_protocol.api import events as ev
from agentsd_protocol.api.stream import HistoryResult, JournalEvent
from tests.daemon.test_journal_v1 import DB, EXPECTED, expected_transcript, transcript
from tests.daemon_process import make_temp_dir, running_daemon


def history(client: Any, session_id: str) -> list[JournalEvent]:
    events: list[JournalEvent] = []
    after = 0
    while True:
        reply = client.call("agentSession.history", {"sessionId": session_id, "afterSeq": after})
        page = msgspec.json.decode(msgspec.json.encode(reply["result"]), type=HistoryResult)
        events += page.events
        if not page.has_more or not page.events:
            return events
        after = page.events[-1].seq


def test_a_daemon_opens_a_journal_v1_and_replays_it_identically() -> None:
    base = make_temp_dir()
    try:
        state = base / "state"
        state.mkdir(mode=0o700)
        shutil.copyfile(DB, state / "agentsd.db")
        with running_daemon(state_dir=state) as daemon, daemon.connect() as client:
            listed = client.call("agentSession.list", {})["result"]["sessions"]
            assert {s["sessionId"]: s["status"] for s in listed} == {
                session_id: expected["status"] for session_id, expected in EXPECTED.items()
            }
            for session_id in EXPECTED:
                events = history(client, session_id)
                assert {e.kind for e in events} <= set(ev.KINDS)
                assert all(not isinstance(e.event(), ev.UnknownEvent) for e in events)
                assert transcript(events) == expected_transcript(session_id)
    finally:
        shutil.rmtree(base, ignore_errors=True)
