"""``agentSession.event`` notifications spliced from bytes (feed Rule 4) are the
bytes msgspec writes for ``EventNotification``: for any row, any ids, and every kind,
renamed kinds and old bodies included. (``test_connection`` checks a whole catch-up
on the wire.)"""

from __future__ import annotations

import time

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from agentsd.feed import EventFrames, journal_event
from agentsd.store.journal import StoredEvent
from agentsd_protocol.api.events import KINDS, RENAMED_KINDS
from agentsd_protocol.api.stream import EventNotification
from agentsd_protocol.jsonrpc import encode_notification

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
kinds = st.sampled_from([*KINDS, *RENAMED_KINDS, "approval.requested", "agent.error"]) | st.text()
# Bodies as stored: any object, and old bodies with a field "kind" (events rule 5).
bodies = st.dictionaries(st.sampled_from(["kind", "text", "itemId", 'é"\n']), json_values).map(
    msgspec.json.encode
)
events = st.builds(
    StoredEvent,
    session_id=st.just("s"),
    seq=st.integers(0, 2**63 - 1),
    ts=st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.0, -0.0, 1e20, 1.5e-7, time.time()]),
    fence=st.integers(-(2**63), 2**63 - 1),
    kind=kinds,
    body=bodies,
)


def old_notification(subscription_id: str, session_id: str, event: StoredEvent) -> bytes:
    """The notification as the feed built it before Rule 4: through the Structs."""
    return encode_notification(
        "agentSession.event",
        EventNotification(
            subscription_id=subscription_id,
            session_id=session_id,
            seq=event.seq,
            event=journal_event(event),
        ),
    )


@given(subscription_id=st.text(), session_id=st.text(), page=st.lists(events, max_size=8))
def test_spliced_event_notifications_are_the_bytes_msgspec_writes(
    subscription_id: str, session_id: str, page: list[StoredEvent]
) -> None:
    frames = EventFrames(subscription_id, session_id)
    rows = [(e.seq, e.ts, e.fence, e.kind, e.body) for e in page]
    expected = [old_notification(subscription_id, session_id, e) for e in page]
    assert frames.encode_rows(rows) == expected
    assert [frames.encode(e) for e in page] == expected
