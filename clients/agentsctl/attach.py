"""``agentsctl attach``: a live view of one session that answers approvals in place.

Rule 1: being attached changes nothing. Ctrl-C detaches (exit 0) and the session
keeps running; the only mutation attach ever sends is an answer typed at its prompt.

Rule 2 (approvals): an approval is asked about (stdin a terminal) or hinted at
(printed ``agentsctl approve ...`` lines) only once the view has caught up with the
journal, so approvals settled long ago are shown, not asked. One question at a time,
oldest first; one answered elsewhere is withdrawn and the next one asked.

Rule 3 (the terminal): stdin is in cbreak mode only while a question waits for a key,
input typed before the question is discarded (a stray key never answers it), and the
terminal is restored whatever ends the command.

The view itself (catch-up, streaming, resubscribing, reconnecting) is
``agentsctl.follow.Follower`` rendered by ``agentsctl.render.Transcript``.
"""

from __future__ import annotations

import argparse
import os
import select
import shlex
import sys
import termios
import tty
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from agentsctl.cli import EXIT_OK, EXIT_SESSION_GONE, CommandFailed
from agentsctl.commands_conversation import respond
from agentsctl.daemon import DaemonUnreachable
from agentsctl.follow import CaughtUp, Follower, Note, SessionGone
from agentsctl.render import Transcript, delta_line, print_jsonl
from agentsd_protocol.api import stream as st
from agentsd_protocol.api.events import ApprovalRequested, ApprovalResolved, ChildExited
from agentsd_protocol.errors import RpcError

if TYPE_CHECKING:
    from agentsctl.target import Target

KEY_POLL_S = 0.05  # how often a waiting question looks at the keyboard; feels instant
ERASE_LINE = "\r\x1b[K"


ATTACH_EPILOG = """\
The view catches up from the journal, then streams: prompts (> ...), agent text as
it is written, tool calls (* ...), approvals (? ...) and notes (-- ...). With a
terminal on stdin, a pending approval is asked about in place ([a]ccept/[d]ecline);
otherwise the `agentsctl approve` command lines that answer it are printed. A lost
connection or a restarted daemon is waited for and followed again from the last seq.
Deleting the session ends the view at once, saying so and why (exit 4).

exit status:
  0  detached with Ctrl-C (the session keeps running)
  1  the daemon refused to attach (for example: no such session)
  3  the daemon is unreachable
  4  the session was deleted while attached
"""


def configure_attach(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ATTACH_EPILOG
    parser.add_argument("session_id", metavar="SESSION", help="the session's id")
    parser.add_argument(
        "--jsonl",
        action="store_true",
        help="print journal events and streamed deltas as JSON lines; ask nothing",
    )
    parser.add_argument(
        "--no-input",
        action="store_true",
        help="never ask about approvals; print how to answer them instead",
    )
    parser.add_argument(
        "--after-seq",
        type=int,
        default=0,
        metavar="SEQ",
        help="catch up from after this seq (default 0: the whole conversation)",
    )


def option_keys(options: list[str]) -> dict[str, str]:
    """One key per option: its first letter not taken yet (accept -> a, decline -> d)."""
    keys: dict[str, str] = {}
    for option in options:
        for char in option.lower() + "123456789":
            if char.isalnum() and char not in keys:
                keys[char] = option
                break
    return keys


def keys_label(keys: dict[str, str]) -> str:
    """``[a]ccept/[d]ecline``: each option with its key bracketed."""
    labels = []
    for key, option in keys.items():
        at = option.lower().find(key)
        if at < 0:
            labels.append(f"[{key}] {option}")
        else:
            labels.append(f"{option[:at]}[{option[at]}]{option[at + 1 :]}")
    return "/".join(labels)


def approve_command(target: Target, session_id: str, approval_id: str, option: str) -> str:
    """The command line that answers ``approval_id`` with ``option``, quoted for a
    POSIX shell (a question's option is the agent's label: ``Use Redis``)."""
    words = ["agentsctl", *target.global_args(), "approve", session_id, approval_id]
    if option == "decline":
        words.append("--decline")
    elif option != "accept":
        words += ["--decision", option]
    return shlex.join(words)


class KeyQuestion:
    """One question on the terminal, answered by a single key (Rule 3)."""

    def __init__(self, fd: int, transcript: Transcript) -> None:
        self._fd = fd
        self._transcript = transcript
        self._saved: list[Any] | None = None
        self._text = ""
        self._keys: dict[str, str] = {}
        self._visible = False
        self.approval_id: str | None = None

    def ask(self, approval_id: str, title: str, options: list[str]) -> None:
        self._keys = option_keys(options)
        self._text = f"{title} {keys_label(self._keys)}? "
        self.approval_id = approval_id
        termios.tcflush(self._fd, termios.TCIFLUSH)  # a key typed earlier never answers
        if self._saved is None:
            self._saved = termios.tcgetattr(self._fd)
            tty.setcbreak(self._fd)
        self.show()

    def show(self) -> None:
        if self.approval_id is not None and not self._visible:
            self._transcript.end_line()
            out = self._transcript.out
            out.write(self._transcript.style.bold(self._text))
            out.flush()
            self._visible = True

    def hide(self) -> None:
        """Take the question off the screen while something else is written."""
        if self._visible:
            out = self._transcript.out
            out.write(ERASE_LINE if self._transcript.style.enabled else "\n")
            out.flush()
            self._visible = False

    def read(self) -> str | None:
        """The option whose key was pressed, if one was; other keys are ignored.

        Raises ``EOFError`` when stdin is closed.
        """
        readable, _, _ = select.select([self._fd], [], [], 0)
        if not readable:
            return None
        data = os.read(self._fd, 64)
        if not data:
            raise EOFError
        for char in data.decode(errors="ignore").lower():
            if char in self._keys:
                return self._keys[char]
        return None

    def close(self, answer: str | None = None) -> None:
        """End the question (showing ``answer`` after it, if given) and restore the
        terminal. Idempotent."""
        if answer is not None and self._visible:
            out = self._transcript.out
            out.write(answer + "\n")
            out.flush()
            self._visible = False
        self.hide()
        self.approval_id = None
        if self._saved is not None:
            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
            self._saved = None


class AttachView:
    """The state of one attach: what is pending, asked, hinted, and the output."""

    def __init__(self, args: argparse.Namespace, target: Target) -> None:
        self.session_id: str = args.session_id
        self.target = target
        self.jsonl: bool = args.jsonl
        self.transcript = Transcript(sys.stdout)
        interactive = not args.jsonl and not args.no_input and sys.stdin.isatty()
        self.question = KeyQuestion(sys.stdin.fileno(), self.transcript) if interactive else None
        self.pending: OrderedDict[str, ApprovalRequested] = OrderedDict()  # by approval id
        self.answered: set[str] = set()  # answered from here; its resolution is awaited
        self.hinted: set[str] = set()
        self.caught_up = False

    def handle(self, item: st.JournalEvent | st.DeltaNotification | CaughtUp | Note) -> None:
        if self.question is not None:
            self.question.hide()
        if isinstance(item, st.JournalEvent):
            self._event(item)
        elif isinstance(item, st.DeltaNotification):
            if self.jsonl:
                print_jsonl(delta_line(item))
            else:
                self.transcript.delta(item)
        elif isinstance(item, CaughtUp):
            self.caught_up = True
        elif isinstance(item, Note):
            self.transcript.end_line()
            print(f"agentsctl: {item.text}", file=sys.stderr, flush=True)

    def _event(self, event: st.JournalEvent) -> None:
        if self.jsonl:
            print_jsonl(event)
        else:
            self.transcript.event(event)
        match event.event():
            case ApprovalRequested() as asked:
                self.pending[asked.approval_id] = asked
            case ApprovalResolved(approval_id=approval_id):
                self.pending.pop(approval_id, None)
                self.answered.discard(approval_id)
            case ChildExited():
                self.pending.clear()  # the daemon settles them as its child ends
                self.answered.clear()
            case _:
                pass

    def after_items(self) -> None:
        """Ask, withdraw or hint, once caught up (Rule 2)."""
        if not self.caught_up or self.jsonl:
            return
        question = self.question
        if question is None:
            for approval_id, asked in self.pending.items():
                if approval_id not in self.hinted:
                    self.hinted.add(approval_id)
                    self._hint(approval_id, asked)
            return
        if question.approval_id is not None and question.approval_id not in self.pending:
            question.close()  # answered elsewhere: its resolution was just shown
        if question.approval_id is None:
            for approval_id, asked in self.pending.items():
                if approval_id not in self.answered:
                    question.ask(approval_id, f"approval {approval_id}:", _options(asked))
                    break
        else:
            question.show()

    def _hint(self, approval_id: str, asked: ApprovalRequested) -> None:
        for option in _options(asked):
            command = approve_command(self.target, self.session_id, approval_id, option)
            self.transcript.line(f"  to {option}: {command}")

    def poll_keyboard(self) -> None:
        """Answer the question if its key was pressed (one ``respond`` mutation)."""
        question = self.question
        if question is None or question.approval_id is None:
            return
        try:
            option = question.read()
        except EOFError:
            question.close("(stdin closed: no more questions)")
            self.question = None
            self.hinted.clear()
            self.after_items()
            return
        if option is None:
            return
        approval_id = question.approval_id
        question.close(option)
        self.answered.add(approval_id)
        try:
            respond(self.target, self.session_id, approval_id, option)
        except CommandFailed as exc:
            self.transcript.line(self.transcript.style.warn(f"! {exc.message}"))
        except RpcError as exc:
            self.answered.discard(approval_id)
            self.transcript.line(self.transcript.style.warn(f"! {exc.message} [{exc.kind}]"))
        except DaemonUnreachable as exc:
            self.answered.discard(approval_id)  # ask again once reconnected
            self.transcript.line(self.transcript.style.warn(f"! not answered: {exc.message}"))

    def close(self) -> None:
        if self.question is not None:
            self.question.close()
        self.transcript.end_line()


def run_attach(args: argparse.Namespace, target: Target) -> int:
    """Follow the session live until Ctrl-C (exit 0, the session keeps running) or
    its deletion (exit 4); answers approvals in place (Rules 1-3)."""
    view = AttachView(args, target)
    with Follower(target, args.session_id, after_seq=max(0, args.after_seq)) as follower:
        follower.open()
        print(
            f"agentsctl: attached to {args.session_id}; Ctrl-C detaches (the session keeps running)",
            file=sys.stderr,
            flush=True,
        )
        try:
            while True:
                asking = view.question is not None and view.question.approval_id is not None
                item = follower.next(KEY_POLL_S if asking else None)
                if item is not None:
                    view.handle(item)
                if not view.jsonl:
                    follower.acknowledge()  # a person sees it; JSON lines go to a program
                view.after_items()
                view.poll_keyboard()
        except KeyboardInterrupt:
            view.close()
            print(f"agentsctl: detached; {args.session_id} keeps running", file=sys.stderr)
            return EXIT_OK
        except SessionGone as gone:
            view.close()
            print(f"agentsctl: {gone}", file=sys.stderr)
            return EXIT_SESSION_GONE
        finally:
            view.close()


def _options(asked: ApprovalRequested) -> list[str]:
    return asked.options or ["accept", "decline"]
