"""The provider interface: one agent protocol translated to journal events and back.

A ``Provider`` is a stateless description of one kind of agent (how to launch it);
an ``Adapter`` speaks to one running child. The session task owns both:

    spec = provider.launch(session, state_dir, env)  # what to spawn
    adapter = provider.adapter(link, sink, session)
    handle = await adapter.handshake(resume)       # under the handshake deadline
    adapter.superseded                             # set when a fresh conversation replaced resume
    # or, for an agent an earlier daemon started: await adapter.take_over(state)
    await adapter.run()                            # translate frames until EOF
    # meanwhile, from RPC handlers: send / interrupt / answer_approval

Rule 1: adapters never touch the store; they report through ``SessionSink``, which
journals (with the fence check) and fans out.

Rule 2: an agent request the adapter cannot record or does not understand gets a
safe refusal, never silence.

Rule 3 (framing): a line that is not a frame is journaled and skipped, as one bad
line need not end a healthy agent; ``MAX_BAD_LINES`` of them in a row, or one line
past ``MAX_LINE_BYTES``, is an agent that no longer speaks its protocol, and its
adapter's ``run`` raises ``AgentProtocolError``: the session ends with that one
error, never a loop of them.

Rule 4 (resume): the journal, not the provider, says whether a conversation must
exist (``Resume.had_turns``). A provider that never saved a conversation without a
turn gets a fresh one in its place (``Adapter.superseded``); one that lost a
conversation with turns is ``ResumeFailed``, never a silent fresh start.

Rule 5 (takeover): a daemon that reattaches a running agent an earlier daemon
handshook (``crash_policy = "reattach"``) calls ``Adapter.take_over`` instead of
``handshake``, then ``run``. The link then reads from the last durable position
(``OutputCursor``): lines the earlier daemon read but whose effects it had not all
journaled are read again, and the sink drops the first events of the line it had
journaled already. So an adapter makes its sink calls for a line from its reading
task, while it handles that line, the same ones for the same line whatever its
state; an adapter whose ``take_over`` restored state from the journal (an open item)
may leave out events that state makes redundant only at the end of a line's events.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Protocol

import attrs
import msgspec
import trio

from agentsd.holder_link import note_written
from agentsd.providers.programs import Program
from agentsd.store.journal import bounded_payload
from agentsd.store.sessions import SessionRow
from agentsd_protocol.api.controls import AppliesAt, OptionChoice
from agentsd_protocol.api.conversation import DispatchOutcome
from agentsd_protocol.api.events import (
    AgentCommand,
    ApprovalOption,
    BoundedPayload,
    Event,
    ThreadSuperseded,
)
from agentsd_protocol.errors import (
    AgentProtocolError,
    InvalidParams,
    ResumeFailed,
    UnknownCommand,
)

MAX_LINE_BYTES = 16 * 1024 * 1024  # a tool result can be big; a line past this is broken
MAX_BAD_LINES = 32  # non-frame lines in a row: past this the output is not the protocol
# One read holds ~1000 short lines (streaming deltas). Handling them all without a
# checkpoint would let a flooding agent hold the event loop, and fill every
# subscriber's queue by a thousand items before its pump runs once (invariant 8).
LINES_PER_CHECKPOINT = 256
READ_BYTES = 64 * 1024
# Lines read since the last durable position past which the position is committed
# alone (``OutputCursor.on_backlog``): a quarter of what the holder retains. Past
# half that, the reader asks for it without waiting (``on_backlog_soon``: the session
# task commits it), so a fast stream rarely stalls on the commit.
BACKLOG_BYTES = 256 * 1024
BACKLOG_SOON_BYTES = BACKLOG_BYTES // 2
# One line longer than this cannot be retained whole by the holder (1 MiB) beside
# what came before it: its start is given up (``OutputCursor.on_overrun``).
OVERRUN_BYTES = 512 * 1024

_encoder = msgspec.json.Encoder()  # stateless; one for every link


@attrs.frozen
class LaunchSpec:
    argv: list[str]
    env: Mapping[str, str] = attrs.field(factory=dict)  # merged over the daemon's env


@attrs.frozen
class Resume:
    """A start that resumes the provider conversation ``handle``. ``had_turns``: the
    journal shows a turn under it, so the provider must have saved it (Rule 4)."""

    handle: str
    had_turns: bool
    # The session adopts ``handle``, a conversation started outside the daemon
    # (``create {resumeFrom}``): check it belongs to the session's cwd, and keep
    # its history for ``Adapter.imported_history``. ``had_turns`` is then true.
    adopt: bool = False


@attrs.frozen
class ImageInput:
    """An image of a prompt: its bytes, read back from the session's copy."""

    media_type: str
    data: bytes


@attrs.frozen
class FileInput:
    """A file reference of a prompt: the agent reads ``path`` (absolute) itself."""

    path: str


@attrs.frozen
class OptionSpec:
    """One option a provider has: where a change applies while its agent runs
    (``applies_at``; ``nextStart`` when it does not run), the values it knows of
    without asking the agent (``choices``), and whether others are accepted
    (``open``; a closed option refuses a value outside its choices)."""

    applies_at: AppliesAt
    choices: tuple[str, ...] | None = None
    open: bool = True
    description: str | None = None


@attrs.frozen
class Submission:
    """A prompt the daemon journaled (write-ahead) and now hands to the agent:
    ``text``, then ``inputs`` in order."""

    client_message_id: str
    text: str
    inputs: tuple[ImageInput | FileInput, ...] = ()

    def file_note(self) -> str:
        """The file references as text, for agents whose input has no file item:
        the agent reads them with its own tools, as after an ``@path`` in its UI."""
        paths = [i.path for i in self.inputs if isinstance(i, FileInput)]
        return "".join(f"\n@{path}" for path in paths)


@attrs.frozen
class Dispatch:
    """What became of a submission: ``accepted`` (the agent confirmed it), ``rejected``
    (the agent refused it, with a reason) or ``unknown`` (no confirmation)."""

    outcome: DispatchOutcome
    reason: str | None = None
    turn_id: str | None = None


class SessionSink(Protocol):
    """How an adapter reports what its agent does."""

    async def emit(self, event: Event) -> int:
        """Journal one event (durable when this returns) and return its seq."""
        ...

    def delta(self, item_id: str, text: str) -> None:
        """Ephemeral streaming text of an item; coalesced into the journal."""
        ...

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
        """Record an approval durably and return its stable approval id. ``item_id``
        is the item (tool call) it asks about, when the agent names one: clients then
        show the question and the tool run as one thing. ``option_details`` describe
        the options when the agent does (names and kinds). ``request`` is what the
        adapter needs to answer it (the agent's request), kept for an adapter that
        takes over (``PendingTakeover.request``)."""
        ...

    async def approval_cancelled(self, native_id: str) -> None: ...

    async def options_changed(self, changes: Mapping[str, Any]) -> None:
        """The agent changed session options itself: keep ``changes`` (merged over
        the session's options) for its next start."""
        ...


@attrs.frozen
class PendingTakeover:
    """An approval an earlier daemon journaled and nobody answered: it stays
    pending across the takeover, answerable with its ``native_id``."""

    native_id: str
    approval_id: str
    kind: str
    options: tuple[str, ...]
    # What the adapter needs to answer it, as the earlier one recorded it
    # (``ApprovalRequested.request``); None when not kept: an answer that needs it
    # then takes the safe reading (nothing granted).
    request: Mapping[str, Any] | None = None


@attrs.frozen
class Takeover:
    """What an adapter taking over a running agent learns from the journal (Rule 5).

    ``generation`` is the new lease's fence, which grows with every takeover: request
    ids the adapter sends are made unique with it (``f"g{generation}-{n}"``), so none
    collides with an id the earlier daemon used whose response may still arrive."""

    handle: str  # the provider handle (thread id, session id)
    generation: int
    turn_id: str | None  # the open turn per the journal, if any
    turn_open: bool
    approvals: tuple[PendingTakeover, ...]
    undispatched: tuple[str, ...]  # clientMessageIds the takeover settled unknown
    options: Mapping[str, Any]  # the session's options as they are now
    agent_version: str | None  # from the last child.ready
    open_items: Mapping[str, str]  # item id -> its text journaled so far


class OutputCursor:
    """Where the reader of an agent's stdout is (absolute byte offsets from the
    agent's first byte), and how many events it journaled for the line it handles:
    what makes a takeover exact (Rule 5; ``agentsd.sink`` Rule 4).

    ``position`` is where a later reader starts again so that nothing is lost and
    nothing journaled twice: between lines, the end of the last one (nothing to
    skip); while a line is handled, its start and the number of its events
    journaled (``emits``). ``reader`` is the task that handles lines: sink calls
    from other tasks (a send's own events) are not a line's."""

    __slots__ = (
        "durable",
        "emits",
        "frame_end",
        "frame_start",
        "in_frame",
        "on_backlog",
        "on_backlog_soon",
        "on_overrun",
        "reader",
    )

    def __init__(self, base: int = 0) -> None:
        self.frame_start = base
        self.frame_end = base
        self.in_frame = False
        self.emits = 0
        self.reader: trio.lowlevel.Task | None = None
        # Set by whoever makes positions durable (``agentsd.sink``): the offset last
        # made durable; a commit of the position alone, which the link awaits between
        # lines once ``BACKLOG_BYTES`` of lines with no event of their own went by
        # (the holder retains what is not durable, and stops reading at its bound);
        # how to ask for that commit without waiting for it, past
        # ``BACKLOG_SOON_BYTES``; and what to do when one line alone outgrows
        # ``OVERRUN_BYTES`` (give up exactness for it: the holder could not hold it
        # whole).
        self.durable = base
        self.on_backlog: Callable[[], Awaitable[None]] | None = None
        self.on_backlog_soon: Callable[[], None] | None = None
        self.on_overrun: Callable[[int], None] | None = None

    def begin(self, start: int, end: int) -> None:
        self.frame_start = start
        self.frame_end = end
        self.in_frame = True
        self.emits = 0
        self.reader = trio.lowlevel.current_task()

    def end(self) -> None:
        self.in_frame = False

    def handling(self) -> bool:
        """Whether the calling task is handling a line now."""
        return self.in_frame and trio.lowlevel.current_task() is self.reader

    @property
    def position(self) -> tuple[int, int]:
        if self.in_frame:
            return self.frame_start, self.emits
        return self.frame_end, 0


class LineLink:
    """Newline-delimited JSON over the child's pipes, with a bound on line length.

    ``receive`` returns None at end of output. Sending after the child died raises
    ``trio.BrokenResourceError``. A line past ``MAX_LINE_BYTES`` breaks the link for
    good (``broken``): where the next line starts cannot be known, so every later
    read raises the same ``AgentProtocolError``.

    `stop_at_boundary` stops the reader between two frames (a handover: the agent
    is left running for the next daemon), never while a frame is being handled.
    """

    __slots__ = (
        "_at_boundary",
        "_broken",
        "_buf",
        "_lines_since_checkpoint",
        "_offset",
        "_parked",
        "_receive_stream",
        "_scan_from",
        "_send_lock",
        "_send_stream",
        "cursor",
    )

    def __init__(
        self, send: trio.abc.SendStream, receive: trio.abc.ReceiveStream, base: int = 0
    ) -> None:
        """``base``: the offset in the agent's stdout of the first byte ``receive``
        gives (a takeover reads from a durable position, Rule 5)."""
        self._send_stream = send
        self._receive_stream = receive
        self._offset = base  # of _buf[0] in the agent's stdout
        self.cursor = OutputCursor(base)
        self._buf = bytearray()
        self._scan_from = 0
        self._send_lock = trio.Lock()
        self._lines_since_checkpoint = 0
        self._broken: AgentProtocolError | None = None
        self._parked = False  # the reader waits for bytes: no frame is being handled
        self._at_boundary: Callable[[], None] | None = None

    @property
    def broken(self) -> bool:
        """Whether an overlong line lost the framing (nothing more can be read)."""
        return self._broken is not None

    def stop_at_boundary(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` once the reader is between frames: at once if it waits for
        bytes now, else when it next asks for a line (the frame it handles now is
        handled to its end first). ``stop`` cancels the reader (a cancel scope
        around it), which then raises ``Cancelled`` from `receive_line` having
        taken no further line: a line not returned yet, whole or partial, is left
        to whoever reads the agent's output next (the holder keeps what was not
        acknowledged)."""
        self._at_boundary = stop
        if self._parked:
            stop()

    async def send(self, message: Any) -> None:
        await self.send_raw(_encoder.encode(message) + b"\n")

    async def send_raw(self, data: bytes) -> None:
        """Write ``data`` as it is, whole, between two frames of ``send``. Inside
        `keyed`, once it went out (``note_written``): a direct pipe carries no key,
        but the order of what was written to it is settled as well."""
        async with self._send_lock:
            await self._send_stream.send_all(data)
        note_written()

    async def receive_line(self) -> bytes | None:
        cursor = self.cursor
        cursor.end()  # the caller is done with the line before
        if cursor.on_backlog is not None:
            backlog = cursor.frame_end - cursor.durable
            if backlog > BACKLOG_BYTES:
                await cursor.on_backlog()
            elif backlog > BACKLOG_SOON_BYTES and cursor.on_backlog_soon is not None:
                cursor.on_backlog_soon()
        if self._broken is not None:
            raise self._broken
        if self._at_boundary is not None:
            self._at_boundary()
            await trio.lowlevel.checkpoint()  # raises the Cancelled ``stop`` caused
        if self._lines_since_checkpoint >= LINES_PER_CHECKPOINT:
            # Before a line is taken: a cancellation here loses nothing.
            self._lines_since_checkpoint = 0
            await trio.lowlevel.checkpoint()
        while True:
            newline = self._buf.find(b"\n", self._scan_from)
            # A line is past the bound whether or not its end has arrived yet: the
            # read that crosses the bound may well hold its newline.
            if (newline if newline >= 0 else len(self._buf)) > MAX_LINE_BYTES:
                self._buf = bytearray()  # never read again: free it
                self._broken = AgentProtocolError(
                    f"the agent wrote a line longer than {MAX_LINE_BYTES} bytes; "
                    "its output cannot be read any further"
                )
                raise self._broken
            if newline >= 0:
                line = bytes(self._buf[:newline])
                del self._buf[: newline + 1]
                self._scan_from = 0
                start = self._offset
                self._offset += newline + 1
                if line.strip():
                    self._lines_since_checkpoint += 1
                    self.cursor.begin(start, self._offset)
                    return line
                continue
            self._scan_from = len(self._buf)
            if self.cursor.on_overrun is not None and len(self._buf) > OVERRUN_BYTES:
                self.cursor.on_overrun(self._offset + len(self._buf))
            self._parked = True
            try:
                data = await self._receive_stream.receive_some(READ_BYTES)
            finally:
                self._parked = False
            self._lines_since_checkpoint = 0  # receive_some is a checkpoint
            if not data:
                if self._buf.strip():
                    line = bytes(self._buf)
                    self._buf.clear()
                    start = self._offset
                    self._offset += len(line)
                    self.cursor.begin(start, self._offset)
                    return line
                return None
            self._buf += data

    async def receive(self) -> dict[str, Any] | None:
        """The next JSON object, or None at end of output; a line that is not a JSON
        object raises ``AgentProtocolError``."""
        line = await self.receive_line()
        if line is None:
            return None
        try:
            message = msgspec.json.decode(line)
        except msgspec.DecodeError:
            raise AgentProtocolError(
                f"the agent wrote a line that is not JSON: {line[:200]!r}"
            ) from None
        if not isinstance(message, dict):
            raise AgentProtocolError(f"the agent wrote JSON that is not an object: {line[:200]!r}")
        return message


class Adapter(abc.ABC):
    """Speaks to one running agent child. An adapter that cannot adopt a
    conversation (``Resume.adopt``) refuses it in ``handshake`` with
    ``ResumeFailed``."""

    __slots__ = ()  # a subclass may declare its own: one adapter lives per session

    supports_compact: ClassVar[bool] = False
    """Whether ``compact`` is the agent's own compaction (else an agent that offers a
    ``compact`` command runs that, and one that offers none has no compaction)."""

    superseded: ThreadSuperseded | None = None
    """Set by ``handshake`` when the provider never saved ``resume.handle`` and a fresh
    conversation took its place (Rule 4); the runner journals it with the new handle."""

    @property
    def agent_version(self) -> str | None:
        """The agent's version as its handshake reported it; None when it did not
        (the daemon then asks the binary: ``agentsd.providers.versions``)."""
        return None

    @property
    def agent_name(self) -> str | None:
        """The agent's own name as its handshake reported it (ACP's ``agentInfo``);
        None when it did not."""
        return None

    @abc.abstractmethod
    async def handshake(self, resume: Resume | None) -> str:
        """Initialize the agent (resuming natively when ``resume`` is given) and
        return the provider handle to store. Raise an ``RpcError`` on failure:
        ``ResumeFailed`` when a conversation that had turns cannot be resumed."""

    async def imported_history(self) -> list[Event]:
        """After a handshake that adopted a conversation (``Resume.adopt``): its
        earlier messages as ``message.imported`` events, oldest first, to journal
        with ``child.ready``. Raises ``ResumeFailed`` when it cannot be read."""
        return []

    async def take_over(self, state: Takeover) -> None:
        """Take over a running agent whose handshake an earlier daemon made:
        restore what the adapter needs from ``state`` (no frame is sent). Raises
        ResumeFailed when this adapter cannot (the caller then ends the agent and
        settles the session as today)."""
        raise ResumeFailed("this agent cannot be taken over")

    @abc.abstractmethod
    async def run(self) -> None:
        """Read and translate frames until the agent's output ends. Raises
        ``AgentProtocolError`` once the framing is broken beyond repair (Rule 3)."""

    @abc.abstractmethod
    async def send(self, submission: Submission) -> Dispatch:
        """Start a turn, or steer the running one."""

    @abc.abstractmethod
    async def interrupt(self, turn_id: str | None, *, confirm: bool = True) -> bool:
        """Interrupt the running turn; False when none runs. The frames are written
        from the calling task, so a write keyed by the caller carries its key
        (``agentsd.delivery`` Rule 3). With ``confirm`` False the agent's answer to
        the interrupt is not waited for: a takeover writes it before the reader runs
        (``agentsd.reattach`` Rule 2), and the turn's end tells the rest."""

    @abc.abstractmethod
    async def answer_approval(self, native_id: str, decision: str) -> None:
        """Deliver a committed approval decision to the agent."""

    # -- conversation controls: an adapter offers what its agent can do -------------

    async def option_choices(self) -> Mapping[str, list[OptionChoice]]:
        """The values the running agent offers for some options (its models, their
        efforts), by option key; asked of the agent, within a deadline."""
        return {}

    async def apply_options(self, changes: Mapping[str, Any]) -> None:
        """Apply ``changes`` (options whose ``OptionSpec`` applies ``now`` or
        ``nextTurn``, each set to a value) to the running agent. Raises an
        ``RpcError`` when the agent refused one; then the caller changes nothing."""
        if changes:
            raise InvalidParams(
                f"Invalid params: this agent cannot change {', '.join(sorted(changes))} live"
            )

    async def agent_commands(self) -> list[AgentCommand]:
        """The agent's own slash commands and skills, as its handshake or API lists them."""
        return []

    async def compact(self) -> Dispatch:
        """Ask the agent to compact its conversation (a turn of its own)."""
        raise UnknownCommand("this agent cannot compact its conversation", name="compact")

    async def run_command(self, name: str, args: str | None) -> Dispatch:
        """Run one of ``agent_commands`` (the caller checked ``name`` is one)."""
        raise UnknownCommand(f"this agent has no command {name!r}", name=name)


CONTINUATION_PROMPT = (
    "Your previous turn was cut off before it finished: the daemon that runs this "
    "session restarted. Continue the task from where you left off. Check the state of "
    "anything you were in the middle of (files being edited, commands that were "
    "running) before you repeat it."
)


class Provider(abc.ABC):
    name: str  # the session's provider name: a class attribute, or per instance (ACP agents)
    # What ``agentSession.continue`` sends into the natively resumed conversation, as
    # the user's next message (no provider has a native "carry on" request).
    continuation_prompt: ClassVar[str] = CONTINUATION_PROMPT
    # The content block types (``api.conversation.Content``) besides text that its
    # agent takes; a send with another is refused before it is journaled.
    content_types: ClassVar[frozenset[str]] = frozenset()
    # Whether its adapter can adopt a conversation started elsewhere (``Resume.adopt``).
    adopts: ClassVar[bool] = False
    # The agent program this provider runs, if it is a known one: its ``--version``
    # is asked when the handshake does not say (``agentsd.providers.versions``).
    program: ClassVar[Program | None] = None
    minimum_version: ClassVar[tuple[int, int, int] | None] = None

    @abc.abstractmethod
    def launch(self, session: SessionRow, state_dir: Any, env: Mapping[str, str]) -> LaunchSpec:
        """What to spawn for ``session`` (``session.command`` overrides the program).
        ``env`` is the environment the agent gets before the session's own ``env``:
        programs are looked up on its PATH."""

    @abc.abstractmethod
    def adapter(self, link: LineLink, sink: SessionSink, session: SessionRow) -> Adapter: ...

    def option_specs(self) -> Mapping[str, OptionSpec] | None:
        """The options this provider has, by key; None when it does not say (any key
        is kept, and applies at the next start)."""
        return None

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Raise ``InvalidParams`` naming the first option the agent could not start
        with (the launch checks the same). A provider without declared options
        checks them only when its agent starts."""
        return None

    def refused_content(self, types: set[str], adapter: Adapter | None) -> str | None:
        """The first of the block ``types`` its agent cannot take (``adapter`` is the
        running one, if any: some agents say what they take in their handshake)."""
        return next((t for t in sorted(types) if t not in self.content_types), None)


def journal_payload(data: str | bytes, max_bytes: int) -> BoundedPayload:
    """``bounded_payload`` of ``data`` as the journal's type: what an adapter journals
    of a payload that can grow without bound (tool output, a diff)."""
    return msgspec.convert(bounded_payload(data, max_bytes), BoundedPayload)
