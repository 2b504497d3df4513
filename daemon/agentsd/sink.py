"""The ``SessionSink`` a provider adapter reports to: one per child.

Rule 1 (fencing): an event is journaled only while its child's lease is the
session's current one; a stale child's events and deltas are dropped here.

Rule 2 (streaming): deltas go to subscribers at once and are coalesced into
``item.updated`` snapshots, which the session task flushes at most
``SNAPSHOT_INTERVAL_S`` late (by ``snapshot_due``) and which precede any other
event; an item's text is kept up to ``MAX_ITEM_TEXT_CHARS``.

Rule 3 (approvals): an approval id is stable across the journal
(``ap-<fence>-<native id>``); approvals still pending when their turn ends are
settled ``cancelled`` before the turn's end is journaled.

Rule 4 (held output, exact): for an agent held by the holder under ``crash_policy =
"reattach"`` (`HeldOutput`), every commit of the sink stores, in its own
transaction, the position of the link's cursor (``providers.base.OutputCursor``):
the stdout offset from which a later daemon reads again and how many events of the
line there are in the journal. Only then is the offset acknowledged to the holder,
which keeps everything after it. A sink that takes over (``replay``) drops the
first events of the line at the stored offset, which are journaled; and starts
each open item from its journaled text, so the deltas read again are neither lost
nor doubled in its snapshots.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import msgspec
import trio

from agentsd.leases import Lease, is_current
from agentsd.providers.base import OutputCursor
from agentsd.session import Session
from agentsd.store.journal import StoredEvent
from agentsd_protocol.api.events import (
    ApprovalOption,
    ApprovalRequested,
    ApprovalResolved,
    Event,
    ItemCompleted,
    ItemUpdated,
    SessionUpdated,
    TurnCompleted,
    kind_of,
)
from agentsd_protocol.errors import RpcError

if TYPE_CHECKING:
    from agentsd.session_task import SessionTask

log = logging.getLogger(__name__)

MAX_ITEM_TEXT_CHARS = 1 << 20  # one streamed message; a longer one is kept truncated
SNAPSHOT_INTERVAL_S = 0.05  # streaming text reaches the journal at most this stale
# An approval's request is kept whole or not at all (an answer made from a cut one
# would be wrong); a tool's input is kilobytes, a file it writes rarely a megabyte.
MAX_REQUEST_BYTES = 1 << 20


def kept_request(request: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``request`` as the journal keeps it: whole, or None past ``MAX_REQUEST_BYTES``."""
    if request is None:
        return None
    kept = dict(request)
    if len(msgspec.json.encode(kept)) > MAX_REQUEST_BYTES:
        log.info("an approval's request is past %d bytes: not kept", MAX_REQUEST_BYTES)
        return None
    return kept


class ItemText:
    """Streaming text of one item: what subscribers saw, and what the journal has.

    Only the first ``MAX_ITEM_TEXT_CHARS`` are kept (and journaled); past that the
    length still counts and snapshots say ``truncated``, so a runaway agent cannot
    grow the daemon's memory or the journal without bound.
    """

    __slots__ = ("journaled_length", "kept", "length", "parts")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.length = 0
        self.kept = 0
        self.journaled_length = 0

    @classmethod
    def journaled(cls, text: str, length: int) -> ItemText:
        """An item whose text up to ``length`` is journaled (``text`` its kept head)."""
        item = cls()
        item.parts = [text]
        item.kept = len(text)
        item.length = max(length, item.kept)
        item.journaled_length = item.length
        return item

    def add(self, text: str) -> int:
        offset = self.length
        self.length += len(text)
        room = MAX_ITEM_TEXT_CHARS - self.kept
        if room > 0:
            piece = text[:room]
            self.parts.append(piece)
            self.kept += len(piece)
        return offset

    @property
    def truncated(self) -> bool:
        return self.length > self.kept

    @property
    def text(self) -> str:
        joined = "".join(self.parts)
        self.parts = [joined]
        return joined


@attrs.frozen
class OpenItem:
    """An item whose streamed text the journal has up to here (its last
    ``item.updated``), not completed: a takeover's sink goes on from it."""

    text: str
    length: int  # the whole text's (longer than ``text`` when it was truncated)


@attrs.define(eq=False)
class HeldOutput:
    """Rule 4's bookkeeping for one held agent: the link's cursor, how to tell
    the holder an offset is durable, and, for a takeover, the stored position
    (``replay``: offset, events journaled of that line) and the open items."""

    cursor: OutputCursor
    acknowledge: Callable[[int], None]
    replay: tuple[int, int] | None = None
    open_items: Mapping[str, OpenItem] = attrs.field(factory=dict)


class Sink:
    """The ``SessionSink`` of one child: journals with the fence check, fans out,
    and coalesces streaming text into ``item.updated`` snapshots.

    ``snapshot_due`` is the trio time by which the coalesced text must be flushed
    (infinite while none waits), or the position committed (Rule 4, asked by the
    reader: ``_position_due``); ``alarm``, when set, is the session task's sleep,
    whose deadline ``delta`` pulls in to it."""

    __slots__ = (
        "_dirty",
        "_held",
        "_items",
        "_lease",
        "_position_due",
        "_replay",
        "_session",
        "_task",
        "alarm",
        "snapshot_due",
    )

    def __init__(
        self, session: Session, lease: Lease, task: SessionTask, held: HeldOutput | None = None
    ) -> None:
        self._session = session
        self._lease = lease
        self._task = task
        self._items: dict[str, ItemText] = {}
        # Item ids with unjournaled text, as a dict (an empty set costs four times
        # an empty dict, and every live session has one).
        self._dirty: dict[str, None] = {}
        self.snapshot_due = math.inf
        self.alarm: trio.CancelScope | None = None
        self._held = held  # Rule 4
        self._replay: tuple[int, int] | None = None
        self._position_due = False
        if held is not None:
            self._replay = held.replay
            held.cursor.on_backlog = self._commit_position
            held.cursor.on_backlog_soon = self._position_soon
            for item_id, item in held.open_items.items():
                self._items[item_id] = ItemText.journaled(item.text, item.length)

    def _position(self, emitting: bool) -> tuple[int, int] | None:
        """Rule 4: the position a commit stores; ``emitting``: the commit holds one
        of the line's events, counted first."""
        held = self._held
        if held is None:
            return None
        cursor = held.cursor
        if emitting and cursor.handling():
            cursor.emits += 1
        return cursor.position

    def _replayed(self) -> bool:
        """Rule 4: whether this event of the line being read again is journaled
        already (then it is dropped, and counted as the line's)."""
        if self._replay is None or self._held is None:
            return False
        cursor = self._held.cursor
        if not cursor.handling():
            return False
        offset, skip = self._replay
        if cursor.frame_start != offset:
            if cursor.frame_start > offset:
                self._replay = None  # past it: nothing more to drop
            return False
        if cursor.emits < skip:
            cursor.emits += 1
            return True
        return False

    async def _append(
        self, events: list[Event], position: tuple[int, int] | None, **fields: Any
    ) -> list[StoredEvent]:
        stored = await self._session.journal.append(
            events, fence=self._lease.fence, output=position, **fields
        )
        self.made_durable(position)
        return stored

    def handshake_position(self) -> tuple[int, int] | None:
        """Rule 4 for the handshake's commit (``child.ready``, journaled by the
        session task): the lines the handshake read are done with, so a takeover
        starts after them. None without Rule 4."""
        if self._held is None:
            return None
        self._held.cursor.end()
        return self._held.cursor.position

    def made_durable(self, position: tuple[int, int] | None) -> None:
        """A commit the session task made stored ``position`` (Rule 4)."""
        if position is not None and self._held is not None:
            self._held.cursor.durable = max(self._held.cursor.durable, position[0])
            self._held.acknowledge(position[0])

    async def _commit_position(self) -> None:
        """Rule 4: the position alone, after lines that journaled nothing."""
        if self._current():
            await self._append(self._snapshots(), self._position(emitting=False))

    def _position_soon(self) -> None:
        """Rule 4: ask the session task to commit the position now (with any text
        waiting), so that the reader goes on instead of waiting for the commit.
        Any commit meanwhile stores the position too and answers the request."""
        if self._position_due:
            return
        self._position_due = True
        now = trio.current_time()
        if self.snapshot_due > now:
            self.snapshot_due = now
            if self.alarm is not None:
                self.alarm.deadline = now

    def _current(self) -> bool:
        return is_current(self._session.lease, self._lease.fence, self._lease.generation)

    def _snapshots(self) -> list[Event]:
        out: list[Event] = []
        for item_id in sorted(self._dirty):
            item = self._items.get(item_id)
            if item is not None and item.length != item.journaled_length:
                truncated = item.truncated
                out.append(
                    ItemUpdated(
                        item_id=item_id,
                        text=item.text,
                        truncated=truncated,
                        length=item.length if truncated else None,
                    )
                )
                item.journaled_length = item.length
        self._dirty.clear()
        self.snapshot_due = math.inf
        self._position_due = False  # the commit these go with stores the position
        return out

    async def emit(self, event: Event) -> int:
        if not self._current():
            log.warning("dropped %s from a stale child of %s", kind_of(event), self._session.id)
            return self._session.head_seq
        self._task.touch()
        if self._replayed():
            return self._session.head_seq
        position = self._position(emitting=True)
        events = self._snapshots()
        match event:
            case TurnCompleted(turn_id=turn_id):
                events.extend(_orphaned_approvals(self._session, turn_id))
            case ItemCompleted(item_id=item_id):
                self._items.pop(item_id, None)
            case _:
                pass
        events.append(event)
        stored = await self._append_counted(events, position)
        return stored[-1].seq

    def delta(self, item_id: str, text: str) -> None:
        if not self._current() or not text:
            return
        self._task.touch()
        item = self._items.setdefault(item_id, ItemText())
        offset = item.add(text)
        self._dirty[item_id] = None
        if self.snapshot_due == math.inf:
            self.snapshot_due = trio.current_time() + SNAPSHOT_INTERVAL_S
            if self.alarm is not None and self.alarm.deadline > self.snapshot_due:
                self.alarm.deadline = self.snapshot_due
        self._session.journal.publish_delta(item_id, offset, text)

    async def _append_counted(
        self, events: list[Event], position: tuple[int, int] | None, **fields: Any
    ) -> list[StoredEvent]:
        """``_append`` of a commit that holds one of the line's events, counted by
        ``_position(emitting=True)``: a commit the store refused uncounts it, or a
        later commit would store one event too many to skip (Rule 4)."""
        try:
            return await self._append(events, position, **fields)
        except RpcError:
            held = self._held
            cursor = None if held is None else held.cursor
            if (
                position is not None
                and cursor is not None
                and cursor.handling()
                and cursor.frame_start == position[0]
                and cursor.emits > 0
            ):
                cursor.emits -= 1
            raise

    async def flush_snapshots(self) -> None:
        """Journal the coalesced text, and with it the position (Rule 4); the
        position alone when the reader asked for it (``_position_soon``)."""
        position_due = self._position_due
        events = self._snapshots()
        if (events or position_due) and self._current():
            await self._append(events, self._position(emitting=False))

    async def approval_requested(
        self,
        native_id: str,
        kind: str,
        title: str,
        detail: str,
        options: list[str],
        *,
        item_id: str | None = None,
        option_details: list[ApprovalOption] | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> str:
        approval_id = f"ap-{self._lease.fence}-{native_id}"
        if self._replay is not None:
            # Journaled before a takeover (Rule 4), under the fence of its time.
            for pending in self._session.conversation.approvals.values():
                if pending.native_id == native_id:
                    approval_id = pending.approval_id
        await self.emit(
            ApprovalRequested(
                approval_id=approval_id,
                native_id=native_id,
                approval_kind=kind,
                title=title,
                detail=detail,
                options=options,
                item_id=item_id,
                option_details=option_details or [],
                request=kept_request(request),
            )
        )
        return approval_id

    async def approval_cancelled(self, native_id: str) -> None:
        for approval in list(self._session.conversation.approvals.values()):
            if approval.native_id == native_id and approval.approval_id not in self._session.claims:
                await self.emit(
                    ApprovalResolved(
                        approval_id=approval.approval_id, decision="cancelled", by="agent"
                    )
                )

    async def options_changed(self, changes: Mapping[str, Any]) -> None:
        """The agent changed one of its own options (Claude leaves plan mode once its
        plan is approved): store it, so that the next start launches it as it is now
        rather than as it was configured."""
        if not self._current() or self._replayed():
            return
        # Counted as the line's event even when it changes nothing, as it does when
        # read again after a takeover that journaled it (Rule 4).
        position = self._position(emitting=True)
        options = {**self._session.row.options, **changes}
        if options == self._session.row.options:
            return
        events = [*self._snapshots(), SessionUpdated(options=options, by="agent")]
        await self._append_counted(events, position, options=options)


def _orphaned_approvals(session: Session, turn_id: str | None) -> list[Event]:
    """Approvals still pending when their turn ends (an interrupt, a failure): the
    agent will never read an answer, so they are settled as cancelled first."""
    return [
        ApprovalResolved(
            approval_id=a.approval_id, decision="cancelled", by="daemon", reason="turn ended"
        )
        for a in session.conversation.approvals.values()
        if a.turn_id is not None and a.turn_id == turn_id and a.approval_id not in session.claims
    ]
