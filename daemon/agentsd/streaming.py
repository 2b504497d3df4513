"""Streaming text a subscriber arriving mid-stream has not seen: what was streamed
as deltas after the last committed ``item.updated`` snapshot of each open item.

A delta goes to the subscribers of its time and no further; its text reaches the
journal only in the next snapshot (``agentsd.sink`` Rule 2). So a subscriber that
joins (or comes back, after a daemon restart) between the two would see the next
live deltas past the text its catch-up gave it: a gap until that snapshot. The
journal port keeps that tail here, and a new subscription is handed it as one delta
before anything live (``agentsd.feed.Subscription``), so its text runs on with no
gap.

Rule 1 (exact): the tail of an item starts where its last committed snapshot ends
(or at the item's first delta), which the new subscription's catch-up covers: the
subscriber places it over text it has, agreeing.

Rule 2 (bounded): the tail holds at most the text of one snapshot interval; an item
whose tail passes ``MAX_TAIL_CHARS`` anyway (a snapshot not committing) is no
longer followed until its next snapshot, and a subscriber then sees the gap the
snapshot fills, as without it. An item's tail ends with its completion, its turn's
end, or its agent's exit.
"""

from __future__ import annotations

import attrs

from agentsd_protocol.api.events import (
    ChildExited,
    Event,
    ItemCompleted,
    ItemUpdated,
    TurnCompleted,
    UnknownEvent,
)

MAX_TAIL_CHARS = 1 << 20


@attrs.define
class _Tail:
    offset: int  # where ``parts`` start in the item's text
    parts: list[str]
    length: int  # of ``parts`` joined

    @property
    def end(self) -> int:
        return self.offset + self.length


class StreamingText:
    """The unjournaled tail of each open item's streamed text (Rule 1)."""

    __slots__ = ("_tails",)

    def __init__(self) -> None:
        self._tails: dict[str, _Tail | None] = {}  # None: not followed (Rule 2)

    def streamed(self, item_id: str, offset: int, text: str) -> None:
        """A delta was published."""
        tail = self._tails.get(item_id, _Tail(offset, [], 0))
        if tail is None:
            return
        if offset != tail.end or tail.length + len(text) > MAX_TAIL_CHARS:
            self._tails[item_id] = None  # not contiguous or too long: not followed
            return
        tail.parts.append(text)
        tail.length += len(text)
        self._tails[item_id] = tail

    def committed(self, event: Event | UnknownEvent) -> None:
        """An event was committed: a snapshot journals its item's text up to its
        end; an item's completion, a turn's end or the agent's exit ends tails."""
        match event:
            case ItemUpdated(item_id=item_id, text=text, truncated=truncated, length=length):
                self._journaled(item_id, length if truncated and length else len(text))
            case ItemCompleted(item_id=item_id):
                self._tails.pop(item_id, None)
            case TurnCompleted() | ChildExited():
                self._tails.clear()
            case _:
                pass

    def _journaled(self, item_id: str, end: int) -> None:
        if item_id not in self._tails:
            return
        tail = self._tails[item_id]
        if tail is None or end >= tail.end:
            # Everything streamed is journaled: followed again from ``end`` (a
            # delta streamed meanwhile past it leaves the item unfollowed).
            self._tails[item_id] = _Tail(end, [], 0)
        elif end > tail.offset:
            text = "".join(tail.parts)[end - tail.offset :]
            self._tails[item_id] = _Tail(end, [text], len(text))

    def tails(self) -> list[tuple[str, int, str]]:
        """Each followed item's tail: (item id, offset, text)."""
        return [
            (item_id, tail.offset, "".join(tail.parts))
            for item_id, tail in self._tails.items()
            if tail is not None and tail.length
        ]
