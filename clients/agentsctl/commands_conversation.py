"""Conversation commands: ``send``, ``queue``, ``interrupt``, ``approve`` and ``log``.

Each command is a ``configure_*`` and a ``run_*`` named by a row of
``agentsctl.cli.COMMANDS``; mutations go through ``agentsctl.mutation.mutate``.
``attach`` (the interactive view) lives in ``agentsctl.attach``.
"""

from __future__ import annotations

import argparse
import os
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
from agentsd_protocol.display import excerpt
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
        "unknown (journaled, delivery unconfirmed; never re-sent by itself), or queued.\n"
        "Exits 1 unless accepted or queued. The agent is started (resuming its\n"
        "conversation) if it is not running. While a turn runs, the prompt steers it\n"
        "(the default), or waits behind it (--queue), or interrupts it (--interrupt).\n"
        "--image attaches an image the daemon reads (PNG, JPEG, GIF, WebP, at most\n"
        "5 MiB) and keeps with the session; --file names a file the agent reads itself."
    )
    add_session_argument(parser)
    delivery = parser.add_mutually_exclusive_group()
    delivery.add_argument(
        "--steer",
        dest="delivery",
        action="store_const",
        const="steer",
        default="steer",
        help="fold it into the running turn (the default)",
    )
    delivery.add_argument(
        "--queue",
        dest="delivery",
        action="store_const",
        const="queue",
        help="hold it until the running turn (and every prompt queued before) ended",
    )
    delivery.add_argument(
        "--interrupt",
        dest="delivery",
        action="store_const",
        const="interrupt",
        help="interrupt the running turn, then send it as the next one",
    )
    add_attachment_options(parser)
    parser.add_argument(
        "text",
        nargs="+",  # "*" would be taken empty before options that follow SESSION
        metavar="TEXT",
        help="the prompt; several words are joined with spaces; - reads it from stdin",
    )
    add_json_option(parser)


def add_attachment_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="attach an image (PNG, JPEG, GIF or WebP, at most 5 MiB; repeatable)",
    )
    parser.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH",
        help="refer the agent to a file, which it reads itself (repeatable)",
    )


def attachments(args: argparse.Namespace) -> list[c.Content]:
    """The content blocks of ``--image`` and ``--file``, their paths made absolute
    here (the daemon would take a relative one from the session's cwd)."""
    blocks: list[c.Content] = [c.ImageBlock(path=os.path.abspath(p)) for p in args.image]
    blocks += [c.FileBlock(path=os.path.abspath(p)) for p in args.file]
    return blocks


def prompt_text(args: argparse.Namespace) -> str:
    """The prompt's words (``-``: stdin); a usage error when there is no prompt."""
    text = " ".join(args.text)
    if args.text == ["-"]:
        text = sys.stdin.read()
    if not text.strip():
        raise UsageError("the prompt is empty")
    return text


def send_prompt(
    target: Target,
    session_id: str,
    text: str,
    delivery: c.Delivery = "steer",
    content: list[c.Content] | None = None,
) -> c.SendResult:
    """``agentSession.send`` as a mutation (a fresh operation id, one retry)."""
    params = c.SendParams(
        session_id=session_id, text=text, delivery=delivery, content=content or []
    )
    return mutate(target, methods.SEND, params)


def report_send(result: c.SendResult, *, quiet: bool = False) -> int:
    """Print the outcome of a send (unless ``quiet``); the exit status.

    A prompt the agent did not accept (``rejected``, or ``unknown``: journaled but
    its delivery unconfirmed, and never re-sent by itself) exits 1 with an error
    line on stderr.
    """
    if result.queued:
        if not quiet:
            print(f"seq {result.seq}: queued as {result.client_message_id}", flush=True)
        return EXIT_OK
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
    text = prompt_text(args)
    result = send_prompt(target, args.session_id, text, args.delivery, attachments(args))
    if args.json:
        print_json(result)
    return report_send(result, quiet=args.json)


# -- queue ------------------------------------------------------------------------


def configure_queue(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Lists the prompts held behind the running turn as `N. PROMPT_ID TEXT`, in the\n"
        "order they are sent (N counts from 1). A queue paused by a daemon restart or an\n"
        "interrupt waits for --resume."
    )
    add_session_argument(parser)
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--withdraw", metavar="N", help="take prompt N (or its id) out, unsent")
    action.add_argument("--send-now", metavar="N", help="send prompt N (or its id) now, as a steer")
    action.add_argument("--edit", nargs=2, metavar=("N", "TEXT"), help="replace prompt N's text")
    action.add_argument("--resume", action="store_true", help="resume a paused queue")
    add_json_option(parser)


def _prompt_id(target: Target, session_id: str, ref: str) -> str:
    """A prompt's id from ``ref``: its position in the listed queue, or its id."""
    if not ref.isdigit():
        return ref
    listed = _list_queue(target, session_id)
    index = int(ref) - 1
    if not 0 <= index < len(listed.prompts):
        raise UsageError(f"the queue has no prompt {ref} (it holds {len(listed.prompts)})")
    return listed.prompts[index].prompt_id


def _list_queue(target: Target, session_id: str) -> c.QueueResult:
    with target.client() as client:
        return client.call(methods.QUEUE, c.QueueParams(session_id=session_id))


def run_queue(args: argparse.Namespace, target: Target) -> int:
    """List, withdraw, edit, send now or resume the session's queued prompts."""
    sid = args.session_id
    params = c.QueueParams(session_id=sid)
    if args.withdraw is not None:
        params = c.QueueParams(
            session_id=sid, action="withdraw", prompt_id=_prompt_id(target, sid, args.withdraw)
        )
    elif args.send_now is not None:
        params = c.QueueParams(
            session_id=sid, action="sendNow", prompt_id=_prompt_id(target, sid, args.send_now)
        )
    elif args.edit is not None:
        ref, text = args.edit
        params = c.QueueParams(
            session_id=sid, action="edit", prompt_id=_prompt_id(target, sid, ref), text=text
        )
    elif args.resume:
        params = c.QueueParams(session_id=sid, action="resume")
    result = (
        _list_queue(target, sid)
        if params.action == "list"
        else (mutate(target, methods.QUEUE, params))
    )
    if args.json:
        print_json(result)
        return EXIT_OK
    if result.withdrawn is not None:
        print(f"withdrawn: {result.withdrawn.text}")
    if result.paused is not None:
        print(f"paused ({result.paused}): `agentsctl queue {sid} --resume` sends them")
    for number, prompt in enumerate(result.prompts, 1):
        attached = f" (+{len(prompt.attachments)} attached)" if prompt.attachments else ""
        print(f"{number}. {prompt.prompt_id} {excerpt(prompt.text, 70)}{attached}")
    if result.sent is not None:
        return report_send(result.sent)
    return EXIT_OK


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
