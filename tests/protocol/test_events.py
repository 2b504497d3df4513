"""The journal's event union: every kind round-trips, kinds follow one pattern, and
rows written before the union decode."""

from __future__ import annotations

import re

import msgspec
from hypothesis import given
from hypothesis import strategies as st
from msgspec import inspect as mi

from agentsd_protocol.api import events as ev
from tests.protocol.test_jsonrpc import strategy_for

EVENTS: st.SearchStrategy[ev.Event] = strategy_for(mi.type_info(ev.Event))


def test_every_event_type_is_a_kind_of_the_union() -> None:
    assert set(ev.KINDS.values()) == set(ev.EVENT_TYPES)
    assert len(ev.KINDS) == len(ev.EVENT_TYPES)


@given(EVENTS)
def test_every_event_round_trips_through_its_journal_body(event: ev.Event) -> None:
    kind = ev.kind_of(event)
    body = ev.encode_body(event)
    assert "kind" not in msgspec.json.decode(body)  # the tag is the row's, not the body's
    assert ev.decode_event(kind, body) == event
    # The body plus its kind is the tagged document of the union.
    fields = msgspec.json.decode(body)
    tagged = msgspec.json.encode({"kind": kind, **fields})
    assert msgspec.json.decode(tagged, type=ev.Event) == event


@given(EVENTS)
def test_every_event_round_trips_as_a_journal_event_on_the_wire(event: ev.Event) -> None:
    from agentsd_protocol.api.stream import JournalEvent

    wire = msgspec.json.encode(JournalEvent.of(event, seq=7, ts=1.5, fence=2))
    decoded = msgspec.json.decode(wire, type=JournalEvent)
    assert (decoded.seq, decoded.kind, decoded.event()) == (7, ev.kind_of(event), event)


def test_kinds_follow_one_naming_pattern() -> None:
    """``subject.event``, one lowercase word each side (``submission`` alone)."""
    pattern = re.compile(r"[a-z]+(\.[a-z]+)?")
    assert [k for k in ev.KINDS if not pattern.fullmatch(k)] == []
    assert not set(ev.RENAMED_KINDS) & set(ev.KINDS)  # a kind is never reused
    assert set(ev.RENAMED_KINDS.values()) <= set(ev.KINDS)


def test_a_renamed_kind_decodes_its_old_rows_as_the_new_type() -> None:
    assert ev.decode_event("turn.interruptRequested", b'{"turnId":"t1"}') == (
        ev.InterruptRequested(turn_id="t1")
    )
    old = b'{"cause":"requested","detail":"group 7 still has members"}'
    assert ev.decode_event("child.exit-unproven", old) == ev.ExitUnproven(
        cause="requested", detail="group 7 still has members"
    )
    assert ev.upgrade_row("turn.interruptRequested", b'{"turnId":"t1"}') == (
        "interrupt.requested",
        b'{"turnId":"t1"}',
    )


def test_a_kind_field_written_before_the_union_decodes_renamed() -> None:
    old = (
        b'{"approvalId":"ap-1-r1","nativeId":"r1","kind":"command","title":"Run ls",'
        b'"detail":"","options":["accept","decline"],"itemId":null}'
    )
    asked = ev.ApprovalRequested(
        approval_id="ap-1-r1",
        native_id="r1",
        approval_kind="command",
        title="Run ls",
        detail="",
        options=["accept", "decline"],
    )
    assert ev.decode_event("approval.requested", old) == asked
    kind, body = ev.upgrade_row("approval.requested", old)
    assert (kind, ev.decode_event(kind, body)) == ("approval.requested", asked)
    assert b'"kind"' not in body
    error = b'{"kind":"agent_protocol_error","message":"bad line"}'
    assert ev.decode_event("agent.error", error) == ev.AgentError(
        error_kind="agent_protocol_error", message="bad line"
    )
    current = ev.encode_body(asked)
    assert ev.upgrade_row("approval.requested", current) == ("approval.requested", current)


def test_a_row_as_stored_is_served_unchanged() -> None:
    body = ev.encode_body(ev.TurnStarted(turn_id="t"))
    assert ev.upgrade_row("turn.started", body) == ("turn.started", body)


def test_an_unknown_kind_decodes_as_unknown() -> None:
    event = ev.decode_event("widget.frobbed", b'{"x":1}')
    assert isinstance(event, ev.UnknownEvent)
    assert (event.kind, bytes(event.body)) == ("widget.frobbed", b'{"x":1}')


def test_defaults_are_left_out_of_a_body() -> None:
    """Fields a provider did not set cost nothing and read as absent, as before."""
    body = ev.encode_body(ev.ItemStarted(item_id="i1", type="agentMessage"))
    assert msgspec.json.decode(body) == {"itemId": "i1", "type": "agentMessage"}
    assert ev.encode_body(ev.TurnStarted()) == b"{}"
    assert ev.body_fields(ev.ApprovalResolved(approval_id="a", decision="x", by="client")) == {
        "approvalId": "a",
        "decision": "x",
        "by": "client",
    }
