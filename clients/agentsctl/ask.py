"""``agentsctl ask``: a one-line way in, for people and scripts.

Rule 1 (which session): ``ask`` continues "this directory's session for that
agent": the session of ``--provider`` whose cwd is the current directory and whose
environment carries ``AGENTSCTL_ASK=NAME`` (``-s NAME``; ``default`` without it),
the most recently updated one if several do. None: it is created (and started)
with that mark, so the next ``ask`` here finds it. The mark is an environment
variable of the session because the session record has no free-form labels; the
agent sees it too, harmlessly. A session created by ``new`` is never picked up.

Rule 2 (nothing on its own): ``ask`` streams the agent's answer to stdout and its
notes to stderr; an approval the agent asks for is shown on stderr with the
command that answers it, and ``ask`` waits for someone to answer (``attach``,
``approve``, an editor): it never answers one. Ctrl-C stops waiting (exit 130) and
leaves the turn running.

Rule 3 (exit status, the turn's outcome): 0 the turn completed; 5 it failed (or
its end is unknown: the agent died); 6 it was interrupted; 1 the daemon refused
the prompt or the agent did not take it; 4 the session was deleted meanwhile. With
``--no-wait`` it exits once the prompt is durable: 0 when the agent took it (or it
was queued), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from agentsctl.cli import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SESSION_GONE,
    EXIT_TURN_FAILED,
    EXIT_TURN_INTERRUPTED,
)
from agentsctl.commands_conversation import (
    add_attachment_options,
    attachments,
    prompt_text,
    report_send,
    send_prompt,
)
from agentsctl.commands_session import list_sessions
from agentsctl.follow import Follower, Note, SessionGone
from agentsctl.mutation import mutate
from agentsctl.render import Transcript
from agentsd_protocol import methods
from agentsd_protocol.api import session as s
from agentsd_protocol.api import stream as st
from agentsd_protocol.api.events import (
    ApprovalRequested,
    Submission,
    SubmissionDispatched,
    TurnCompleted,
)

if TYPE_CHECKING:
    from agentsctl.target import Target

MARK = "AGENTSCTL_ASK"  # the session's environment variable naming its ask session
DEFAULT_NAME = "default"
PROVIDER_ENV = "AGENTSCTL_PROVIDER"  # the provider when --provider is not given
DEFAULT_PROVIDER = "claude"


def configure_ask(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Continues this directory's session for the agent (created on first use; -s\n"
        "names a parallel one), streams the answer to stdout, answers nothing on its\n"
        "own (an approval is shown on stderr; answer it with `agentsctl approve`), and\n"
        "exits with the turn's outcome: 0 completed, 5 failed, 6 interrupted, 1 the\n"
        "prompt was not taken, 4 the session was deleted, 130 Ctrl-C (the turn goes on)."
    )
    parser.add_argument(
        "--provider",
        default=os.environ.get(PROVIDER_ENV) or DEFAULT_PROVIDER,
        metavar="PROVIDER",
        help=f"the agent (default ${PROVIDER_ENV}, else {DEFAULT_PROVIDER})",
    )
    parser.add_argument(
        "-s",
        "--session",
        dest="name",
        default=DEFAULT_NAME,
        metavar="NAME",
        help=f"a parallel session of this directory (default: {DEFAULT_NAME})",
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="return once the prompt is durable; print its seq and outcome",
    )
    add_attachment_options(parser)
    parser.add_argument(
        "text",
        nargs="+",  # "*" would be taken empty before options that follow SESSION
        metavar="TEXT",
        help="the prompt; several words are joined with spaces; - reads it from stdin",
    )


def find_session(target: Target, provider: str, cwd: str, name: str) -> s.SessionInfo | None:
    """This directory's ask session ``name`` for ``provider`` (Rule 1), if any."""
    mine = [
        info
        for info in list_sessions(target, state=None, provider=provider, brief=False)
        if info.env.get(MARK) == name and os.path.realpath(info.cwd) == os.path.realpath(cwd)
    ]
    return max(mine, key=lambda info: info.updated_at, default=None)


def run_ask(args: argparse.Namespace, target: Target) -> int:
    text = prompt_text(args)
    content = attachments(args)
    cwd = os.getcwd()
    session = find_session(target, args.provider, cwd, args.name)
    if session is None:
        params = s.CreateParams(provider=args.provider, cwd=cwd, env={MARK: args.name})
        session = mutate(target, methods.CREATE, params).session
        print(
            f"agentsctl: new {args.provider} session {session.session_id} ({args.name}) in {cwd}",
            file=sys.stderr,
            flush=True,
        )
    if args.no_wait:
        return report_send(send_prompt(target, session.session_id, text, content=content))
    sid = session.session_id
    with Follower(target, sid, after_seq=_head_seq(target, sid)) as follower:
        follower.open()  # before the send: nothing of the turn is missed
        sent = send_prompt(target, sid, text, content=content)
        if sent.dispatch != "accepted" or sent.turn_id is None:
            return report_send(sent, quiet=True)
        try:
            return _follow_turn(follower, sid, sent.client_message_id, sent.turn_id)
        except KeyboardInterrupt:
            print(f"\nagentsctl: stopped waiting; the turn goes on in {sid}", file=sys.stderr)
            return EXIT_INTERRUPTED
        except SessionGone as gone:
            print(f"agentsctl: {gone}", file=sys.stderr)
            return EXIT_SESSION_GONE


def _head_seq(target: Target, session_id: str) -> int:
    with target.client() as client:
        return client.call(methods.GET, s.GetParams(session_id=session_id)).session.head_seq


def _follow_turn(follower: Follower, sid: str, cmid: str, turn_id: str) -> int:
    """Stream the turn ``turn_id`` until it ends; its exit status (Rule 3)."""
    transcript = Transcript(sys.stdout)
    while True:
        item = follower.next(None)
        if isinstance(item, st.DeltaNotification):
            transcript.delta(item)
        elif isinstance(item, Note):
            transcript.end_line()
            print(f"agentsctl: {item.text}", file=sys.stderr, flush=True)
        elif isinstance(item, st.JournalEvent):
            event = item.event()
            match event:
                case TurnCompleted(turn_id=ended, outcome=outcome) if ended == turn_id:
                    transcript.end_line()
                    if outcome == "completed":
                        return EXIT_OK
                    why = f": {event.reason}" if event.reason else ""
                    error = f" ({event.error.message})" if event.error else ""
                    print(f"agentsctl: the turn {outcome}{why}{error}", file=sys.stderr)
                    return EXIT_TURN_INTERRUPTED if outcome == "interrupted" else EXIT_TURN_FAILED
                case ApprovalRequested():
                    transcript.end_line()
                    print(
                        f"agentsctl: the agent asks: {event.title}; answer with "
                        f"`agentsctl approve {sid} {event.approval_id}` (or --decline), "
                        f"or `agentsctl attach {sid}`",
                        file=sys.stderr,
                        flush=True,
                    )
                case Submission() | SubmissionDispatched():
                    if isinstance(event, SubmissionDispatched) and event.client_message_id == cmid:
                        continue
                    if isinstance(event, Submission) and event.client_message_id == cmid:
                        continue  # our own prompt: the user just typed it
                    transcript.event(item)
                case _:
                    transcript.event(item)
