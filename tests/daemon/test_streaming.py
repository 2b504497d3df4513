"""A subscriber arriving mid-stream sees the streamed text with no gap
(``agentsd.streaming``, ``agentsd.feed`` Rule 5): the text streamed past the last
committed snapshot comes to it as one delta right after its catch-up, and the live
deltas run on from there, as after a daemon restart when a client comes back from
its last seq while the new daemon streams the rest of a turn."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
import trio

from agentsd.config import Config
from agentsd.connection import Connection
from agentsd.feed import Subscription
from agentsd.providers import provider_registry
from agentsd.store.writer import Store, open_store
from agentsd.streaming import MAX_TAIL_CHARS, StreamingText
from agentsd.supervisor import open_supervisor
from agentsd_protocol.api.events import ChildExited, ItemCompleted, ItemUpdated, TurnCompleted
from agentsd_protocol.api.stream import DeltaNotification, EventNotification
from tests.daemon.test_feed import FakeConnection
from tests.polling import eventually


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "agentsd.db") as store:
        yield store


def shown(sent: list[tuple[str, Any]], item_id: str) -> tuple[str, list[tuple[int, int]]]:
    """What a client shows of ``item_id`` from these notifications (snapshots and
    deltas placed at their offsets, any overlap agreeing), and every delta that
    started past the text it had: (offset, length known)."""
    text = ""
    gaps: list[tuple[int, int]] = []
    for method, params in sent:
        if method == "agentSession.event":
            event = cast(EventNotification, params).event
            if event.kind != "item.updated":
                continue
            snapshot = msgspec.json.decode(event.body, type=dict[str, Any])
            if snapshot["itemId"] != item_id:
                continue
            offset, piece = 0, snapshot["text"]
        elif method == "agentSession.delta":
            delta = cast(DeltaNotification, params)
            if delta.item_id != item_id:
                continue
            offset, piece = delta.offset, delta.text
        else:
            continue
        if offset > len(text):
            gaps.append((offset, len(text)))
            continue
        overlap = text[offset : offset + len(piece)]
        assert piece.startswith(overlap), (offset, piece, overlap)
        text = text[:offset] + piece + text[offset + len(piece) :]
    return text, gaps


async def test_a_subscriber_arriving_mid_stream_is_handed_the_unjournaled_text_first(
    store: Store, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    with trio.fail_after(30):
        async with (
            open_supervisor(store, Config(), state, provider_registry()) as sup,
            trio.open_nursery() as nursery,
        ):
            session = await sup.create(
                provider="mock", cwd=str(tmp_path), title=None, options={}, env={}, command=None
            )
            journal = session.journal
            # Streamed and journaled up to "Hello, "; then "world" streamed, not
            # yet journaled, before the subscriber comes (back) from seq 0.
            journal.publish_delta("it", 0, "Hello, ")
            await journal.append([ItemUpdated(item_id="it", text="Hello, ")])
            journal.publish_delta("it", 7, "wor")
            journal.publish_delta("it", 10, "ld")
            connection = FakeConnection()
            subscription = Subscription(sup.feed, session.id, cast(Connection, connection), 0)
            sup.feed.add(subscription)  # as the subscribe handler does
            subscription.start_from(journal.tails())
            nursery.start_soon(subscription.run, store, lambda: session.head_seq)
            # A live delta, before the snapshot that covers "world" is committed.
            journal.publish_delta("it", 12, "!")
            await eventually(
                lambda: bool(connection.sent) and connection.sent[-1][0].endswith("delta")
            )
            text, gaps = shown(connection.sent, "it")
            assert (text, gaps) == ("Hello, world!", [])
            deltas = [(p.offset, p.text) for m, p in connection.sent if m == "agentSession.delta"]
            assert deltas == [(7, "world"), (12, "!")]  # the tail once, then live
            # The snapshot covering it all agrees; the item's completion ends its tail.
            await journal.append([ItemUpdated(item_id="it", text="Hello, world!")])
            assert journal.tails() == []
            journal.publish_delta("it", 13, " Bye.")
            [tail] = journal.tails()
            assert (tail.offset, tail.text, tail.after_seq) == (13, " Bye.", session.head_seq)
            await journal.append(
                [ItemCompleted(item_id="it", type="agentMessage", text="Hello, world! Bye.")]
            )
            assert journal.tails() == []
            await eventually(lambda: len(connection.events()) == session.head_seq)
            assert shown(connection.sent, "it") == ("Hello, world! Bye.", [])
            subscription.end()


def test_a_snapshot_committed_trims_the_tail_to_what_it_does_not_cover() -> None:
    streaming = StreamingText()
    streaming.streamed("a", 0, "abc")
    streaming.streamed("a", 3, "def")
    # The snapshot was made of "abcd" while "ef" streamed on during its commit.
    streaming.committed(ItemUpdated(item_id="a", text="abcd"))
    assert streaming.tails() == [("a", 4, "ef")]
    streaming.committed(ItemUpdated(item_id="a", text="abcdef"))
    assert streaming.tails() == []
    streaming.streamed("a", 6, "g")
    assert streaming.tails() == [("a", 6, "g")]
    # An older snapshot committing late changes nothing.
    streaming.committed(ItemUpdated(item_id="a", text="abc"))
    assert streaming.tails() == [("a", 6, "g")]


def test_a_truncated_snapshot_journals_up_to_its_length() -> None:
    streaming = StreamingText()
    streaming.streamed("a", 0, "0123456789")
    streaming.committed(ItemUpdated(item_id="a", text="0123", truncated=True, length=8))
    assert streaming.tails() == [("a", 8, "89")]


def test_an_item_is_not_followed_past_a_break_until_a_snapshot_covers_all() -> None:
    """Rule 2: a delta that does not follow on (or a tail past the bound) leaves
    the item unfollowed, so no tail ever starts past the journaled text; a snapshot
    of everything streamed takes it up again."""
    streaming = StreamingText()
    streaming.streamed("a", 0, "abc")
    streaming.streamed("a", 5, "xy")  # not where the text ended
    assert streaming.tails() == []
    streaming.streamed("a", 7, "z")
    assert streaming.tails() == []
    streaming.committed(ItemUpdated(item_id="a", text="abc??xyz"))
    streaming.streamed("a", 8, "!")
    assert streaming.tails() == [("a", 8, "!")]
    streaming.streamed("b", 0, "x" * MAX_TAIL_CHARS)
    streaming.streamed("b", MAX_TAIL_CHARS, "y")
    assert streaming.tails() == [("a", 8, "!")]


def test_a_turns_end_or_the_agents_exit_ends_every_tail() -> None:
    streaming = StreamingText()
    for end in (TurnCompleted(outcome="interrupted"), ChildExited(cause="daemon-restart")):
        streaming.streamed("a", 0, "abc")
        streaming.streamed("b", 0, "x")
        assert len(streaming.tails()) == 2
        streaming.committed(end)
        assert streaming.tails() == []
