"""Conversation commands: ``send``, ``interrupt``, ``approve`` and ``log``.

Each command is a ``configure_*`` and a ``run_*`` named by a row of
``agentsctl.cli.COMMANDS``; mutations go through ``agentsctl.mutation.mutate``.
``attach`` (the interactive view) lives in ``agentsctl.attach``.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from agentsctl.cli import (
    EXIT_DAEMON_ERROR,
    EXIT_OK,
    EXIT_SESSION_GONE,
    CommandFailed,
    UsageError,
)
from agentsctl.follow import Follower, Note, SessionGone
from agentsctl.mutation import mutate
from agentsctl.render import Transcript, print_json, print_jsonl
from agentsd_protocol import methods
from agentsd_protocol.api import conversation as c
from agentsd_protocol.api import stream as st
from agentsd_protocol.errors import AlreadyResolved

if TYPE_CHECKING:
    from agentsctl.target import Target

LOG_PAGE_EVENTS = 500  # per history request; the daemon bounds a page's bytes as well


def add_session_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("session_id", metavar="SESSION", help="the session's id")


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the whole JSON result")


# -- send -------------------------------------------------------------------------


def configure_send(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Prints `seq N: OUTCOME`: the prompt's journal seq, and accepted, rejected or\n"
        "unknown (journaled, delivery unconfirmed; never re-sent by itself). Exits 1 unless\n"
        "accepted. The agent is started (resuming its conversation) if it is not running."
    )
    add_session_argument(parser)
    parser.add_argument(
        "text",
        nargs="+",
        metavar="TEXT",
        help="the prompt; several words are joined with spaces; - reads it from stdin",
    )
    add_json_option(parser)


def send_prompt(target: Target, session_id: str, text: str) -> c.SendResult:
    """``agentSession.send`` as a mutation (a fresh operation id, one retry)."""
    params = c.SendParams(session_id=session_id, text=text)
    return mutate(target, methods.SEND, params)


def report_send(result: c.SendResult, *, quiet: bool = False) -> int:
    """Print the outcome of a send (unless ``quiet``); the exit status.

    A prompt the agent did not accept (``rejected``, or ``unknown``: journaled but
    its delivery unconfirmed, and never re-sent by itself) exits 1 with an error
    line on stderr.
    """
    turn = f", turn {result.turn_id}" if result.turn_id else ""
    reason = f": {result.reason}" if result.reason else ""
    if not quiet:
        print(f"seq {result.seq}: {result.dispatch}{turn}{reason}", flush=True)
    if result.dispatch == "accepted":
        return EXIT_OK
    print(
        f"error: the prompt (seq {result.seq}) was not delivered: {result.dispatch}{reason} "
        f"[dispatch_{result.dispatch}]",
        file=sys.stderr,
    )
    return EXIT_DAEMON_ERROR


def run_send(args: argparse.Namespace, target: Target) -> int:
    """Journal and deliver a prompt; prints ``seq N: OUTCOME`` (``--json``: the result)."""
    text = " ".join(args.text)
    if args.text == ["-"]:
        text = sys.stdin.read()
    if not text.strip():
        raise UsageError("the prompt is empty")
    result = send_prompt(target, args.session_id, text)
    if args.json:
        print_json(result)
    return report_send(result, quiet=args.json)


# -- interrupt --------------------------------------------------------------------


def configure_interrupt(parser: argparse.ArgumentParser) -> None:
    add_session_argument(parser)
    parser.add_argument("--turn", metavar="TURN", help="interrupt only if TURN is the running turn")
    add_json_option(parser)


def run_interrupt(args: argparse.Namespace, target: Target) -> int:
    """Interrupt the running turn. Nothing running is not an error: it says so, exit 0."""
    params = c.InterruptParams(session_id=args.session_id, turn_id=args.turn)
    result = mutate(target, methods.INTERRUPT, params)
    if args.json:
        print_json(result)
    elif result.interrupted:
        print(f"{args.session_id}: interrupted")
    else:
        print(f"{args.session_id}: nothing to interrupt ({result.reason or 'no turn is running'})")
    return EXIT_OK


# -- approve ----------------------------------------------------------------------


def configure_approve(parser: argparse.ArgumentParser) -> None:
    add_session_argument(parser)
    parser.add_argument("approval_id", metavar="APPROVAL", help="the approval's id (ap-...)")
    decision = parser.add_mutually_exclusive_group()
    decision.add_argument("--decline", action="store_true", help="decline instead of accepting")
    decision.add_argument(
        "--decision",
        metavar="DECISION",
        help="any of the approval's options, or cancel (default: accept)",
    )
    add_json_option(parser)


def respond(target: Target, session_id: str, approval_id: str, decision: str) -> c.RespondResult:
    """Answer an approval (a mutation). The first answer wins: a later one raises
    ``CommandFailed`` (kind ``already_resolved``) naming the winning decision."""
    params = c.RespondParams(session_id=session_id, approval_id=approval_id, decision=decision)
    try:
        return mutate(target, methods.RESPOND, params)
    except AlreadyResolved as exc:
        winner: dict[str, Any] = exc.details.get("winner") or {}
        by = f" by {winner['by']}" if winner.get("by") else ""
        raise CommandFailed(
            f"approval {approval_id} was already answered{by}: "
            f"{winner.get('decision', 'unknown decision')}",
            AlreadyResolved.kind,
        ) from None


def run_approve(args: argparse.Namespace, target: Target) -> int:
    decision = "decline" if args.decline else (args.decision or "accept")
    result = respond(target, args.session_id, args.approval_id, decision)
    if args.json:
        print_json(result)
    else:
        print(f"{result.approval_id}: {result.decision} (seq {result.seq})")
    return EXIT_OK


# -- log --------------------------------------------------------------------------


LOG_EPILOG = """\
Without --follow the journal is read page by page and the command exits 0. With
--follow it streams until Ctrl-C (exit 0), across lost connections and daemon
restarts; when the session is deleted it says so (with the reason and the last seq
shown) on stderr and exits 4. --jsonl lines are journal events
{seq, ts, fence, kind, body}; streamed agent text shows in the text view only.
"""


def configure_log(parser: argparse.ArgumentParser) -> None:
    parser.epilog = LOG_EPILOG
    add_session_argument(parser)
    output = parser.add_mutually_exclusive_group()
    output.add_argument(
        "--json", action="store_true", help="print {sessionId, headSeq, events} as one document"
    )
    output.add_argument(
        "--jsonl", action="store_true", help="print one journal event per line, as JSON"
    )
    parser.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep streaming new events (and agent text) until Ctrl-C or the session's deletion",
    )
    parser.add_argument(
        "--after-seq",
        type=int,
        default=0,
        metavar="SEQ",
        help="start after this seq (default 0: the whole journal)",
    )


def run_log(args: argparse.Namespace, target: Target) -> int:
    """Print the session's journal, page by page; with ``--follow``, keep streaming."""
    if args.after_seq < 0:
        raise UsageError("--after-seq must not be negative")
    if args.follow:
        if args.json:
            raise UsageError("--follow streams: use --jsonl, not --json")
        return follow_log(args, target)
    transcript = None if args.json or args.jsonl else Transcript(sys.stdout)
    events: list[st.JournalEvent] = []
    head_seq = 0
    cursor = args.after_seq
    with target.client() as client:
        while True:
            page = client.call(
                methods.HISTORY,
                st.HistoryParams(
                    session_id=args.session_id, after_seq=cursor, limit=LOG_PAGE_EVENTS
                ),
            )
            head_seq = page.head_seq
            for event in page.events:
                if args.json:
                    events.append(event)
                elif args.jsonl:
                    print_jsonl(event)
                elif transcript is not None:
                    transcript.event(event)
            if page.events:
                cursor = page.events[-1].seq
            if not page.has_more or not page.events:
                break
    if args.json:
        print_json({"sessionId": args.session_id, "headSeq": head_seq, "events": events})
    elif transcript is not None:
        transcript.end_line()
    return EXIT_OK


def follow_log(args: argparse.Namespace, target: Target) -> int:
    """``log --follow``: catch up, then stream until Ctrl-C (exit 0) or the session
    is deleted (exit 4). Connection notes go to stderr, so stdout stays the log."""
    transcript = None if args.jsonl else Transcript(sys.stdout)
    with Follower(target, args.session_id, after_seq=args.after_seq) as follower:
        follower.open()
        try:
            while True:
                item = follower.next(None)
                if isinstance(item, st.JournalEvent):
                    if transcript is None:
                        print_jsonl(item)
                    else:
                        transcript.event(item)
                elif isinstance(item, st.DeltaNotification):
                    if transcript is not None:
                        transcript.delta(item)
                elif isinstance(item, Note):
                    if transcript is not None:
                        transcript.end_line()
                    print(f"agentsctl: {item.text}", file=sys.stderr, flush=True)
                if transcript is not None:
                    follower.acknowledge()  # a person reads it; JSON lines go to a program
        except KeyboardInterrupt:
            if transcript is not None:
                transcript.end_line()
            return EXIT_OK
        except SessionGone as gone:
            if transcript is not None:
                transcript.end_line()
            print(f"agentsctl: {gone}", file=sys.stderr)
            return EXIT_SESSION_GONE
