"""The mock agent: a small program speaking JSON lines on stdin and stdout.

Run as ``python -m agentsd.providers.mock_agent``. Standard library only and no
heavy imports, because tests start hundreds of them.

Options arrive as a JSON object in ``AGENTSD_MOCK_OPTIONS`` (all optional):
``ignoreSigterm``, ``ignoreEof`` (keep running after stdin EOF), ``hangHandshake``,
``spawnGrandchild`` (a setsid() grandchild that sleeps forever and keeps the
environment, hence the spawn token), ``holdPipes`` (a background child in our
process group that keeps our stdin, stdout and stderr open and sleeps forever, as a
shell's ``cmd &`` does: our exit then closes no pipe), ``spawnEscapee`` (a
double-forked, setsid() great-grandchild that execs ``sleep`` with an empty
environment, as ``env -i`` does: neither its group nor a token finds it, only a
cgroup), ``crashAfterS`` (``os._exit(3)``),
``floodStdout`` (N extra one-character deltas per turn, as fast as possible),
``invalidOutput`` (a non-JSON line right after ``initialized``), ``chunks`` (5),
``chunkDelayS`` (0.01), ``replyText``, ``stateDir`` (conversations for resume),
``ackDelayS`` (0: wait this long before taking each prompt, its ack and its turn;
nothing else is handled meanwhile; opens the window between a send's commit and its
delivery for crash tests), ``interruptGate`` (a path: an interrupt of the running
turn is acted on only once that path exists, and nothing else is handled meanwhile;
holds the interrupted turn open for crash tests), ``termBarrierDir`` with ``termBarrierCount`` (a SIGTERM is
not obeyed at once: the agent records its pid in that directory, waits until
``termBarrierCount`` agents have, then exits with ``BARRIER_EXIT_CODE``; an agent
whose supervisor ends agents one at a time never sees the count reached).

Frames in (one JSON object per line) and what answers them:

- ``initialize {handle}`` -> ``initialized {handle, agent, version, history}``;
  a null handle starts a conversation, a given one resumes
  ``<stateDir>/<handle>.json`` (history = number of earlier messages).
- ``prompt {id, text, images?, files?}`` -> ``ack {id, turnId}`` at once (each
  image ``{mediaType, data}`` (base64) and file path is recorded as a line after
  the text: ``[image MEDIA_TYPE SHA256 LENGTH]``, ``[file PATH]``); if no turn runs:
  ``turn_started``, ``delta``s, ``message`` (the full text: the deltas joined),
  ``turn_completed {outcome: "completed"}``. While a turn runs, a prompt steers it:
  its reply is appended to the running turn. The word ``approve`` first raises an
  ``approval_request {requestId, itemId, ...}`` and waits for ``approval_response
  {requestId, decision}``; then reports the ``tool_call`` of that ``itemId``.
  The word ``ask`` raises an ``approval_request`` of kind ``question`` instead (the
  options are answer labels, as Claude's questions are: ``Red``, ``Blue``,
  ``decline``) and answers with the label chosen.
  A text starting with ``echo `` is answered with the rest of it.
- ``interrupt {turnId}`` ends the running turn (``message`` with what was streamed,
  then ``outcome: "interrupted"``); with no turn running ``interrupt_result
  {running: false}``.
- ``set_model {model}`` -> ``model_set {model}``; a prompt ``which model`` is
  answered with the model's name (``mock-fast`` until one is set).
- ``command {id, name, args}`` runs a command as a turn of its own (``ack`` and a
  turn as for a prompt): ``compact`` forgets the conversation's messages but a
  summary and answers ``Compacted N messages.``; ``greet`` answers ``Hello, ARGS!``.
  An unknown name -> ``error {message}``. The ``initialized`` frame lists the
  ``models`` and ``commands``.
- ``shutdown`` or stdin EOF -> exit 0. Anything else -> ``error {message}``.

Every output line is flushed on its own. Only the main thread writes stdout; a
reader thread feeds stdin lines through a queue so deltas stream while input waits.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import sys
import threading
import time
from typing import Any

OPTIONS_ENV = "AGENTSD_MOCK_OPTIONS"
CRASH_EXIT_CODE = 3
BARRIER_EXIT_CODE = 4  # every agent of a termBarrier got its SIGTERM while this one lived
_HANDLE = re.compile(r"[A-Za-z0-9_-]{1,128}")  # a handle names a file: no "/" or ".."
_APPROVE = re.compile(r"\bapprove\b", re.IGNORECASE)
_APPROVAL_COMMAND = "ls -la"
_ASK = re.compile(r"\bask\b", re.IGNORECASE)
_QUESTION_OPTIONS = ["Red", "Blue", "decline"]
# The options this agent reads (the daemon's mock provider declares them).
OPTION_NAMES = (
    "ignoreSigterm",
    "ignoreEof",
    "hangHandshake",
    "spawnGrandchild",
    "holdPipes",
    "spawnEscapee",
    "crashAfterS",
    "floodStdout",
    "invalidOutput",
    "chunks",
    "chunkDelayS",
    "ackDelayS",
    "interruptGate",
    "replyText",
    "stateDir",
)
MODELS = ["mock-fast", "mock-deep"]  # the first is the default
COMMANDS = [{"name": "greet", "description": "Say hello to someone", "hint": "NAME"}]

Frame = dict[str, Any]


class Options:
    """The options, each checked for its type; a wrong type is a startup error."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.ignore_sigterm = _get(raw, "ignoreSigterm", bool, False)
        self.ignore_eof = _get(raw, "ignoreEof", bool, False)
        self.hang_handshake = _get(raw, "hangHandshake", bool, False)
        self.spawn_grandchild = _get(raw, "spawnGrandchild", bool, False)
        self.hold_pipes = _get(raw, "holdPipes", bool, False)
        self.spawn_escapee = _get(raw, "spawnEscapee", bool, False)
        self.crash_after_s = _get(raw, "crashAfterS", float, None)
        self.flood_stdout = _get(raw, "floodStdout", int, 0)
        self.invalid_output = _get(raw, "invalidOutput", bool, False)
        self.chunks = max(1, _get(raw, "chunks", int, 5))
        self.chunk_delay_s = max(0.0, _get(raw, "chunkDelayS", float, 0.01))
        self.ack_delay_s = max(0.0, _get(raw, "ackDelayS", float, 0.0))
        self.interrupt_gate = _get(raw, "interruptGate", str, None)
        self.reply_text = _get(raw, "replyText", str, "Hello from the mock agent.")
        self.state_dir = _get(raw, "stateDir", str, None)
        self.term_barrier_dir = _get(raw, "termBarrierDir", str, None)
        self.term_barrier_count = _get(raw, "termBarrierCount", int, 1)


def _get(raw: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = raw.get(key, default)
    if value is default:
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise SystemExit(f"mock agent: option {key} must be {kind.__name__}, not {value!r}")
    return value


def _split(text: str, n: int) -> list[str]:
    """``text`` in at most ``n`` non-empty pieces of about equal size."""
    if not text:
        return []
    size = -(-len(text) // min(n, len(text)))
    return [text[i : i + size] for i in range(0, len(text), size)]


class Output:
    def write(self, frame: Frame) -> None:
        self.write_line(json.dumps(frame, separators=(",", ":")))

    def write_line(self, line: str) -> None:
        try:
            sys.stdout.buffer.write(line.encode() + b"\n")
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            os._exit(1)  # the daemon is gone; nobody is left to talk to


class Turn:
    def __init__(self, number: int) -> None:
        self.turn_id = f"t{number}"
        self.message_id = f"{self.turn_id}-message"
        self.tool_id = f"{self.turn_id}-tool"  # the command an approval asks to run
        self.pending: list[str] = []  # pieces not yet streamed
        self.streamed: list[str] = []
        self.approval_id: str | None = None  # set while waiting for an answer
        self.asking = False  # the approval waited for is a question (``ask``)
        self.next_at = 0.0


class Agent:
    def __init__(self, options: Options, out: Output) -> None:
        self.options = options
        self.out = out
        self.handle: str | None = None
        self.messages: list[Frame] = []
        self.turn: Turn | None = None
        self.turns = 0
        self.requests = 0
        self.model = MODELS[0]

    def run(self, inbox: queue.Queue[bytes | None]) -> int:
        while True:
            turn = self.turn
            timeout = None
            if turn is not None and turn.approval_id is None:
                timeout = max(0.0, turn.next_at - time.monotonic())
            try:
                line = inbox.get(timeout=timeout)
            except queue.Empty:
                self._advance()
                continue
            if line is None:
                if self.options.ignore_eof:
                    continue  # nothing will arrive any more: only turns and signals
                return 0
            if not line.strip():
                continue
            try:
                frame = json.loads(line)
            except ValueError:
                self.out.write({"type": "error", "message": "invalid JSON line"})
                continue
            if not isinstance(frame, dict):
                self.out.write({"type": "error", "message": "a frame must be a JSON object"})
                continue
            if frame.get("type") == "shutdown":
                return 0
            self._handle(frame)

    def _handle(self, frame: Frame) -> None:
        kind = frame.get("type")
        if kind == "initialize":
            self._initialize(frame)
        elif kind == "prompt":
            self._prompt(frame)
        elif kind == "approval_response":
            self._approval_response(frame)
        elif kind == "interrupt":
            self._interrupt(frame)
        elif kind == "set_model":
            self._set_model(frame)
        elif kind == "command":
            self._command(frame)
        else:
            self.out.write({"type": "error", "message": f"unknown frame type {kind}"})

    def _initialize(self, frame: Frame) -> None:
        if self.options.hang_handshake:
            return
        if self.handle is not None:
            self.out.write({"type": "error", "message": "already initialized"})
            return
        handle = frame.get("handle")
        if handle is None:
            import uuid  # only here: keeps startup lean

            handle = uuid.uuid4().hex
        elif not isinstance(handle, str) or not _HANDLE.fullmatch(handle):
            self.out.write({"type": "error", "message": f"invalid handle {handle!r}"})
            return
        else:
            self._load(handle)
        self.handle = handle
        self.out.write(
            {
                "type": "initialized",
                "handle": handle,
                "agent": "mock",
                "version": 1,
                "history": len(self.messages),
                "models": MODELS,
                "commands": COMMANDS,
            }
        )
        if self.options.invalid_output:
            self.out.write_line("this line is not JSON {")

    def _set_model(self, frame: Frame) -> None:
        model = frame.get("model")
        if model not in MODELS:
            self.out.write({"type": "error", "message": f"unknown model {model!r}"})
            return
        self.model = model
        self.out.write({"type": "model_set", "model": model})

    def _command(self, frame: Frame) -> None:
        name, args = frame.get("name"), frame.get("args")
        if self.handle is None or self.turn is not None:
            self.out.write({"type": "error", "message": "a command needs an idle conversation"})
            return
        if name == "compact":
            reply = f"Compacted {len(self.messages)} messages."
            self.messages = [{"role": "summary", "text": reply}]
        elif name == "greet":
            reply = f"Hello, {args or 'world'}!"
        else:
            self.out.write({"type": "error", "message": f"unknown command {name!r}"})
            return
        self._prompt({"id": frame.get("id"), "text": f"echo {reply}"}, record=False)

    def _prompt(self, frame: Frame, *, record: bool = True) -> None:
        text = frame.get("text")
        if self.handle is None:
            self.out.write({"type": "error", "message": "prompt before initialize"})
            return
        if not isinstance(text, str):
            self.out.write({"type": "error", "message": "prompt text must be a string"})
            return
        attached = _attached(frame)
        if attached is None:
            self.out.write({"type": "error", "message": "images and files must be lists"})
            return
        text += attached
        if self.options.ack_delay_s:
            time.sleep(self.options.ack_delay_s)
        if record:
            self.messages.append({"role": "user", "text": text})
            # Kept at once, as Codex and Claude Code record a prompt when its turn
            # starts: a turn cut off by a crash is resumed with the prompt in its history.
            self._save()
        turn = self.turn
        steering = turn is not None
        if turn is None:
            self.turns += 1
            turn = self.turn = Turn(self.turns)
            turn.next_at = time.monotonic()
        self.out.write({"type": "ack", "id": frame.get("id"), "turnId": turn.turn_id})
        if steering:
            turn.pending.extend(_split(" " + self._reply_for(text), self.options.chunks))
            return
        self.out.write({"type": "turn_started", "turnId": turn.turn_id})
        for _ in range(self.options.flood_stdout):
            self._delta(turn, ".")
        if _APPROVE.search(text):
            self.requests += 1
            turn.approval_id = f"r{self.requests}"
            self.out.write(
                {
                    "type": "approval_request",
                    "requestId": turn.approval_id,
                    "turnId": turn.turn_id,
                    "itemId": turn.tool_id,
                    "kind": "command",
                    "title": f"Run `{_APPROVAL_COMMAND}`",
                    "detail": "The mock agent wants to run a shell command.",
                    "options": ["accept", "decline"],
                }
            )
        elif _ASK.search(text):
            self.requests += 1
            turn.approval_id = f"r{self.requests}"
            turn.asking = True
            self.out.write(
                {
                    "type": "approval_request",
                    "requestId": turn.approval_id,
                    "turnId": turn.turn_id,
                    "kind": "question",
                    "title": "Which colour do you like?",
                    "detail": "Red: warm\nBlue: cool",
                    "options": _QUESTION_OPTIONS,
                }
            )
        else:
            turn.pending.extend(_split(self._reply_for(text), self.options.chunks))
        self._maybe_finish()

    def _reply_for(self, text: str) -> str:
        if text.strip().lower() == "which model":
            return f"I am {self.model}."
        return text[len("echo ") :] if text.startswith("echo ") else self.options.reply_text

    def _approval_response(self, frame: Frame) -> None:
        turn = self.turn
        request_id = frame.get("requestId")
        decision = frame.get("decision")
        if turn is None or turn.approval_id is None or request_id != turn.approval_id:
            self.out.write({"type": "error", "message": f"unknown requestId {request_id}"})
            return
        allowed = [*_QUESTION_OPTIONS, "cancel"] if turn.asking else ["accept", "decline", "cancel"]
        if decision not in allowed:
            self.out.write({"type": "error", "message": f"invalid decision {decision!r}"})
            return
        turn.approval_id = None
        if turn.asking:
            turn.asking = False
            if decision == "cancel":
                self._finish("interrupted")
                return
            answer = (
                "You declined to answer." if decision == "decline" else f"You chose {decision}."
            )
            turn.pending[:0] = _split(answer, self.options.chunks)
            turn.next_at = time.monotonic()
            self._maybe_finish()
            return
        self.out.write(
            {
                "type": "tool_call",
                "turnId": turn.turn_id,
                "itemId": turn.tool_id,
                "name": "shell",
                "input": {"command": _APPROVAL_COMMAND},
                "status": "completed" if decision == "accept" else "declined",
            }
        )
        if decision == "cancel":
            self._finish("interrupted")
            return
        reply = "Command approved." if decision == "accept" else "Command declined."
        # Steering that arrived while waiting was queued: the reply goes first.
        turn.pending[:0] = _split(reply, self.options.chunks)
        turn.next_at = time.monotonic()
        self._maybe_finish()

    def _interrupt(self, frame: Frame) -> None:
        turn = self.turn
        wanted = frame.get("turnId")
        if turn is None or (wanted is not None and wanted != turn.turn_id):
            self.out.write({"type": "interrupt_result", "running": False})
            return
        gate = self.options.interrupt_gate
        while gate is not None and not os.path.exists(gate):
            time.sleep(0.01)
        self._finish("interrupted")

    def _advance(self) -> None:
        turn = self.turn
        if turn is None or turn.approval_id is not None:
            return
        if turn.pending:
            self._delta(turn, turn.pending.pop(0))
            turn.next_at = time.monotonic() + self.options.chunk_delay_s
        self._maybe_finish()

    def _delta(self, turn: Turn, text: str) -> None:
        turn.streamed.append(text)
        self.out.write(
            {"type": "delta", "turnId": turn.turn_id, "itemId": turn.message_id, "text": text}
        )

    def _maybe_finish(self) -> None:
        turn = self.turn
        if turn is not None and turn.approval_id is None and not turn.pending:
            self._finish("completed")

    def _finish(self, outcome: str) -> None:
        turn = self.turn
        assert turn is not None
        self.turn = None
        text = "".join(turn.streamed)
        if text:
            self.out.write(
                {"type": "message", "turnId": turn.turn_id, "itemId": turn.message_id, "text": text}
            )
            self.messages.append({"role": "assistant", "text": text})
        self.out.write({"type": "turn_completed", "turnId": turn.turn_id, "outcome": outcome})
        self._save()

    def _path(self, handle: str) -> str | None:
        if self.options.state_dir is None:
            return None
        return os.path.join(self.options.state_dir, f"{handle}.json")

    def _load(self, handle: str) -> None:
        path = self._path(handle)
        if path is None:
            return
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
        except FileNotFoundError:
            return  # nothing said yet in this conversation
        self.messages = list(state.get("messages", []))
        self.turns = int(state.get("turns", 0))

    def _save(self) -> None:
        assert self.handle is not None
        path = self._path(self.handle)
        if path is None:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"handle": self.handle, "turns": self.turns, "messages": self.messages}, f)
        os.replace(tmp, path)  # a crash leaves the old conversation, never half a file


def _spawn_grandchild() -> None:
    """Fork a process that leaves our session and group and sleeps forever.

    It keeps the environment (so the spawn token) but not our pipes: holding
    stdout open would keep the daemon from ever seeing EOF from us.
    """
    if os.fork() != 0:
        return
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        while True:
            time.sleep(3600)
    finally:
        os._exit(0)


def _hold_pipes() -> None:
    """Fork a process that stays in our group, keeps our pipes and sleeps forever."""
    if os.fork() != 0:
        return
    try:
        while True:
            time.sleep(3600)
    finally:
        os._exit(0)


def _spawn_escapee() -> None:
    """Double-fork a process that leaves our session and group, drops our pipes and
    execs ``sleep`` with an empty environment (no spawn token)."""
    sleep = shutil.which("sleep") or "/bin/sleep"
    if os.fork() != 0:
        os.wait()  # the intermediate exits at once: the escapee is reparented
        return
    try:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execve(sleep, [sleep, "100000"], {})
    finally:
        os._exit(0)


def _read_stdin(inbox: queue.Queue[bytes | None]) -> None:
    """Feed stdin lines to ``inbox``, then None at EOF.

    Raw ``os.read`` on fd 0, not ``sys.stdin.buffer``: a daemon thread blocked inside
    a buffered reader holds its lock, and the interpreter aborts (SIGABRT) when it
    exits on ``shutdown`` while that lock is held.
    """
    pending = b""
    try:
        while chunk := os.read(0, 65536):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                inbox.put(line)
        if pending:
            inbox.put(pending)
    except OSError:
        pass
    finally:
        inbox.put(None)


def _attached(frame: Frame) -> str | None:
    """What a prompt's images and files add to its text, as the mock records them:
    a line per image naming its media type, the sha256 of the bytes it received
    and their length (so a test sees the bytes themselves arrived), and a line per
    file reference. None when they are malformed."""
    images = frame.get("images", [])
    files = frame.get("files", [])
    if not isinstance(images, list) or not isinstance(files, list):
        return None
    import base64
    import hashlib

    lines = []
    for image in images:
        data = base64.b64decode(image.get("data", "")) if isinstance(image, dict) else b""
        media_type = image.get("mediaType") if isinstance(image, dict) else None
        lines.append(f"[image {media_type} {hashlib.sha256(data).hexdigest()} {len(data)}]")
    lines.extend(f"[file {path}]" for path in files)
    return "".join("\n" + line for line in lines)


def _term_barrier(directory: str, count: int) -> None:
    """On SIGTERM: record this pid, wait until ``count`` agents have, then exit."""
    signal.sigwait({signal.SIGTERM})
    with open(os.path.join(directory, str(os.getpid())), "x"):
        pass
    while len(os.listdir(directory)) < count:
        time.sleep(0.01)
    os._exit(BARRIER_EXIT_CODE)


def main() -> int:
    raw = json.loads(os.environ.get(OPTIONS_ENV) or "{}")
    if not isinstance(raw, dict):
        raise SystemExit(f"mock agent: {OPTIONS_ENV} must hold a JSON object")
    options = Options(raw)
    if options.spawn_grandchild:
        _spawn_grandchild()  # before any thread exists: fork is only safe then
    if options.hold_pipes:
        _hold_pipes()
    if options.spawn_escapee:
        _spawn_escapee()
    if options.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if options.term_barrier_dir is not None:
        # Blocked in every thread (threads inherit the mask), taken by sigwait in one.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        threading.Thread(
            target=_term_barrier,
            args=(options.term_barrier_dir, options.term_barrier_count),
            daemon=True,
        ).start()
    if options.crash_after_s is not None:
        crash = threading.Timer(options.crash_after_s, os._exit, args=(CRASH_EXIT_CODE,))
        crash.daemon = True
        crash.start()
    inbox: queue.Queue[bytes | None] = queue.Queue()
    threading.Thread(target=_read_stdin, args=(inbox,), daemon=True).start()
    return Agent(options, Output()).run(inbox)


if __name__ == "__main__":
    sys.exit(main())
