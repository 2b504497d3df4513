"""``agentsctl watch``: every session's summary, live.

Rule 1: on a terminal the table is redrawn in place (the cursor goes home and the
screen below is cleared), on each update and once a second so ages stay true; when
stdout is not a terminal each summary is one JSON line (the snapshot, then each
update, a deleted session with ``"deleted": true``), for programs.

Rule 2: watching is not looking: ``watch`` never acknowledges; only attaching or
following a session does.

Rule 3: a daemon restart does not end ``watch``: the table says ``reconnecting``
(piped: a line on stderr) until a daemon answers again (``agentsctl.reconnect``),
then shows its snapshot afresh (piped: every summary again, as at the start).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from typing import TYPE_CHECKING

import msgspec

from agentsctl.cli import EXIT_OK
from agentsctl.client import Client
from agentsctl.commands_daemon import format_duration
from agentsctl.daemon import DaemonUnreachable
from agentsctl.reconnect import Backoff, reconnect
from agentsctl.render import print_jsonl
from agentsd_protocol import methods
from agentsd_protocol.api import stream as st
from agentsd_protocol.display import printable
from agentsd_protocol.errors import ShuttingDown

if TYPE_CHECKING:
    from agentsctl.target import Target

REDRAW_S = 1.0  # ages in the table move on at this step
HOME_AND_CLEAR = "\x1b[H\x1b[J"  # cursor home, erase below: no flicker of a full clear


def configure_watch(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jsonl", action="store_true", help="print JSON lines even on a terminal")


def run_watch(args: argparse.Namespace, target: Target) -> int:
    """Until Ctrl-C (exit 0). A daemon restart is a pause (Rule 3)."""
    table = sys.stdout.isatty() and not args.jsonl
    backoff = Backoff()
    try:
        client = target.client()
        while True:
            try:
                with client:
                    follow(client, table)
            except (DaemonUnreachable, ShuttingDown) as exc:
                # ShuttingDown: it was connected to just as it began to stop.
                if table:
                    sys.stdout.write(HOME_AND_CLEAR + f"agentsd: reconnecting ({exc.message})\n")
                    sys.stdout.flush()
                else:
                    print(f"agentsctl watch: {exc.message}; reconnecting", file=sys.stderr)
            client = reconnect(target, backoff)
    except KeyboardInterrupt:
        return EXIT_OK


def follow(client: Client, table: bool) -> None:
    """Show one connection's snapshot, then its updates; raises ``DaemonUnreachable``
    when the connection ends."""
    result = client.call(methods.WATCH, st.WatchParams())
    sessions = {s.session_id: s for s in result.sessions}
    if not table:
        for status in result.sessions:
            print_jsonl(status)
    while True:
        if table:
            sys.stdout.write(
                HOME_AND_CLEAR
                + render_table(sessions, time.time(), shutil.get_terminal_size().columns)
            )
            sys.stdout.flush()
        note = client.next_notification(REDRAW_S if table else None)
        if note is None or note.method != "agentSession.status":
            continue
        update = note.decode(st.StatusNotification)
        if update.deleted:
            sessions.pop(update.session.session_id, None)
        else:
            sessions[update.session.session_id] = update.session
        if not table:
            line = msgspec.to_builtins(update.session)
            if update.deleted:
                line["deleted"] = True
            print_jsonl(line)


def needs(status: st.SessionStatus) -> str:
    """What the session wants from the user, in a few words."""
    if status.approvals:
        return "approve: " + "; ".join(a.title for a in status.approvals)
    if status.state == "failed":
        return f"failed: {status.failure or 'unknown'}"
    if status.unseen:
        return f"finished: {status.last_reply or status.outcome or ''}"
    return ""


def context_left(status: st.SessionStatus) -> str:
    """How much of the context window is left (``82% left``), where the agent says."""
    tokens = status.tokens
    if tokens is None or tokens.context_left is None or not tokens.context_window:
        return "-"
    return f"{round(100 * tokens.context_left / tokens.context_window)}% left"


def render_table(sessions: dict[str, st.SessionStatus], now: float, columns: int) -> str:
    rows = [("", "STATE", "SESSION", "TITLE", "AGE", "CONTEXT", "NEEDS YOU")]
    for status in sorted(sessions.values(), key=lambda s: -s.updated_at):
        rows.append(
            (
                "*" if status.unseen else " ",
                status.state,
                status.session_id,
                printable(status.title or "-"),
                format_duration(max(0.0, now - status.updated_at)),
                context_left(status),
                printable(needs(status)),
            )
        )
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]) - 1)]
    lines = [
        ("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
        for row in rows
    ]
    # A line wider than the terminal would wrap and push the table down at each redraw.
    return "".join(line[:columns].rstrip() + "\n" for line in lines)
