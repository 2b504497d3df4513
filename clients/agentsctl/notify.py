"""``agentsctl notify``: a desktop notification for each turn completion and each
approval request, from ``agentSession.completions``.

Rule 1 (exactly once): every notice is identified by its session and journal seq.
The highest seq notified per session is kept in a cursor file (``STATE_DIR/
notify-cursor.json``), written before the notification is shown: a notice at or
below it is never shown again, whether it comes back in the snapshot after a
reconnect, twice around a subscription, or to a notifier restarted by systemd. (A
crash between the write and the show loses that one notification rather than
repeating it.)

Rule 2 (no replay of what was seen): the feed's snapshot holds only what the user
has not acknowledged. A session the cursor knows, unseen again, may have had several
notable events while the notifier was away (a completion, then the restart that cut
the next turn off): its journal is read from the cursor, and each turn completion
and approval request in it not covered by an acknowledgement is shown, in order. A
session the cursor does not know (a first run) shows its latest notice only.

Rule 3 (restarts): the daemon going away is a pause (``agentsctl.reconnect``); the
notifier never starts a daemon.

Rule 4 (the sink): ``notify-send`` when it is on PATH, otherwise the
``org.freedesktop.Notifications.Notify`` D-Bus call through ``gdbus``; ``--via``
chooses. Text from agents is untrusted: it goes after ``--`` (a title starting with
``-`` is no option), control characters are dropped, and the body's markup
characters are escaped (a body may be shown as markup: no links or images from an
agent).
"""

from __future__ import annotations

import argparse
import html
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from agentsctl.cli import EXIT_OK, CommandFailed
from agentsctl.client import Client
from agentsctl.daemon import DaemonUnreachable
from agentsctl.reconnect import Backoff, reconnect
from agentsctl.target import Target
from agentsd_protocol import methods
from agentsd_protocol.api import attention as at
from agentsd_protocol.api import session as s
from agentsd_protocol.api import stream as st
from agentsd_protocol.api.events import (
    ApprovalRequested,
    ItemCompleted,
    SessionAcknowledged,
    Submission,
    TurnCompleted,
    TurnOutcome,
)
from agentsd_protocol.display import printable
from agentsd_protocol.errors import SessionNotFound, ShuttingDown

# Turns settled ``interrupted`` for these reasons were cut off by the daemon (as the
# daemon's agentsd.summary.CUT_OFF_REASONS; the client does not import the daemon).
CUT_OFF_REASONS = ("daemon-restart", "shutdown")
APP_NAME = "agentsd"
CURSOR_FILE = "notify-cursor.json"
SINK_TIMEOUT_S = 10.0  # one notification; a hung notification service must not stall the feed
HISTORY_PAGE = 200
SUMMARY_CHARS = 80  # what a notification's title line shows
BODY_CHARS = 200  # the daemon's own notice text bound (agentsd.summary.MAX_TEXT_CHARS)
VIAS = ("auto", "notify-send", "gdbus")


def configure_notify(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--via",
        choices=VIAS,
        default="auto",
        help="how to reach the desktop's notification service (default: notify-send if "
        "on PATH, else gdbus)",
    )
    parser.add_argument(
        "--cursor",
        metavar="FILE",
        help=f"where what was notified is remembered (default STATE_DIR/{CURSOR_FILE})",
    )


def run_notify(args: argparse.Namespace, target: Target) -> int:
    """Until Ctrl-C (exit 0) or SIGTERM."""
    sink = Sink.choose(args.via)
    cursor = Cursor(args.cursor or os.path.join(target.state_dir, CURSOR_FILE))
    backoff = Backoff()
    try:
        try:
            client = target.client(start=False)
        except DaemonUnreachable as exc:
            print(f"agentsctl notify: {exc.message}; waiting for agentsd", file=sys.stderr)
            client = reconnect(target, backoff)
        while True:
            try:
                with client:
                    follow(client, cursor, sink)
            except (DaemonUnreachable, ShuttingDown) as exc:
                # ShuttingDown: it was connected to just as it began to stop.
                print(f"agentsctl notify: {exc.message}; reconnecting", file=sys.stderr)
            client = reconnect(target, backoff)
            print("agentsctl notify: reconnected", file=sys.stderr)
    except KeyboardInterrupt:
        return EXIT_OK


def follow(client: Client, cursor: Cursor, sink: Sink) -> None:
    """Show what is due from one connection's feed; returns never, raises
    ``DaemonUnreachable`` when the connection ends."""
    client.timeout_s = None  # a history page of a long journal may take a while
    feed = client.call(methods.COMPLETIONS, at.CompletionsParams())
    cursor.keep_only(session_ids(client))
    for notice in sorted(feed.unseen, key=lambda n: n.ts):
        for due in catch_up(client, notice, cursor.get(notice.session_id)):
            show(due, cursor, sink)
    while True:
        note = client.next_notification(None)
        if note is not None and note.method == "agentSession.notice":
            show(note.decode(at.NoticeNotification).notice, cursor, sink)


def session_ids(client: Client) -> set[str]:
    """Every session the daemon holds, page by page."""
    ids: set[str] = set()
    page_cursor: str | None = None
    while True:
        page = client.call(methods.LIST, s.ListParams(brief=True, cursor=page_cursor))
        ids.update(info.session_id for info in page.sessions)
        page_cursor = page.next_cursor
        if page_cursor is None:
            return ids


def catch_up(client: Client, latest: at.Notice, last: int | None) -> Iterator[at.Notice]:
    """The notices of ``latest``'s session after ``last`` (Rule 2), ``latest`` last."""
    if last is None or latest.seq <= last:
        yield latest
        return
    found: list[at.Notice] = []
    reply: str | None = None
    seen_up_to = last
    after = last
    while True:
        try:
            page = client.call(
                methods.HISTORY,
                st.HistoryParams(session_id=latest.session_id, after_seq=after, limit=HISTORY_PAGE),
            )
        except SessionNotFound:
            return  # deleted meanwhile: nothing of it to show
        for row in page.events:
            after = row.seq
            if row.seq >= latest.seq:
                continue
            match row.event():
                case Submission():
                    reply = None
                case ItemCompleted(type="agentMessage", text=text) if text:
                    reply = text  # the reply a completion shows, as the daemon's notices do
                case TurnCompleted(outcome=outcome, error=error, reason=reason):
                    text = error.message if error is not None else (reply or outcome)
                    cut = outcome == "interrupted" and reason in CUT_OFF_REASONS
                    found.append(_notice(latest, row, "turn", text, outcome=outcome, cut_off=cut))
                case ApprovalRequested(approval_id=approval_id, title=title):
                    found.append(_notice(latest, row, "approval", title, approval_id=approval_id))
                case SessionAcknowledged(seq=acked):
                    seen_up_to = max(seen_up_to, acked)
                case _:
                    pass
        if not page.has_more or not page.events or after >= latest.seq:
            break
    yield from (n for n in found if n.seq > seen_up_to)
    yield latest


def _notice(
    latest: at.Notice,
    row: st.JournalEvent,
    kind: at.NoticeKind,
    text: str,
    *,
    outcome: TurnOutcome | None = None,
    approval_id: str | None = None,
    cut_off: bool = False,
) -> at.Notice:
    return at.Notice(
        session_id=latest.session_id,
        seq=row.seq,
        kind=kind,
        title=latest.title,
        text=text,
        ts=row.ts,
        outcome=outcome,
        approval_id=approval_id,
        cut_off=cut_off,
    )


def show(notice: at.Notice, cursor: Cursor, sink: Sink) -> None:
    """Show ``notice`` unless it was (Rule 1)."""
    last = cursor.get(notice.session_id)
    if last is not None and notice.seq <= last:
        return
    cursor.advance(notice.session_id, notice.seq)
    summary, body, urgency = describe(notice)
    sink.show(summary, body, urgency, notice)


def describe(notice: at.Notice) -> tuple[str, str, str]:
    """(summary, body, urgency) of a notice."""
    name = printable(notice.title or notice.session_id)[:SUMMARY_CHARS]
    if notice.kind == "approval":
        return f"{name}: needs your approval", notice.text, "critical"
    if notice.cut_off:
        carry_on = f"`agentsctl continue {notice.session_id}` carries it on"
        return f"{name}: cut off by a daemon restart", carry_on, "normal"
    if notice.outcome == "failed":
        return f"{name}: failed", notice.text, "critical"
    if notice.outcome == "interrupted":
        return f"{name}: interrupted", notice.text, "normal"
    if notice.outcome == "unknown":
        return f"{name}: ended, outcome unknown", notice.text, "normal"
    return f"{name}: finished", notice.text, "normal"


class Cursor:
    """The highest seq notified per session, in a small JSON file (Rule 1)."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open(path, encoding="utf-8") as f:
                loaded = json.load(f)
        except FileNotFoundError:
            loaded = {}
        except (OSError, ValueError) as exc:
            raise CommandFailed(f"cannot read the cursor {path}: {exc}", "bad_cursor") from None
        if not isinstance(loaded, dict) or not all(isinstance(v, int) for v in loaded.values()):
            raise CommandFailed(
                f"the cursor {path} is not a JSON object of seqs; remove it to start afresh",
                "bad_cursor",
            )
        self._seqs: dict[str, int] = loaded

    def get(self, session_id: str) -> int | None:
        return self._seqs.get(session_id)

    def advance(self, session_id: str, seq: int) -> None:
        self._seqs[session_id] = seq
        self._save()

    def keep_only(self, session_ids: set[str]) -> None:
        """Forget deleted sessions, so the file stays as small as the session list."""
        gone = self._seqs.keys() - session_ids
        if gone:
            for session_id in gone:
                del self._seqs[session_id]
            self._save()

    def _save(self) -> None:
        """Atomically (temporary file, fsync, rename): a crash leaves the old cursor
        or the new one, never half of one."""
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".notify-cursor-", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self._seqs, f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            os.unlink(tmp)
            raise


class Sink:
    """The desktop's notification service, through a program (Rule 4)."""

    def __init__(self, via: str, program: str) -> None:
        self.via = via
        self.program = program

    @classmethod
    def choose(cls, via: str) -> Sink:
        for name in ("notify-send", "gdbus") if via == "auto" else (via,):
            program = shutil.which(name)
            if program is not None:
                return cls(name, program)
        wanted = "notify-send or gdbus" if via == "auto" else via
        raise CommandFailed(
            f"{wanted} not found on PATH (Debian/Ubuntu: libnotify-bin for notify-send, "
            "libglib2.0-bin for gdbus)",
            "notifier_missing",
        )

    def argv(self, summary: str, body: str, urgency: str, notice: at.Notice) -> list[str]:
        summary = printable(summary)
        body = html.escape(printable(notice_body(body), layout=True), quote=False)
        if self.via == "notify-send":
            return [
                self.program,
                f"--app-name={APP_NAME}",
                f"--urgency={urgency}",
                f"--hint=string:x-agentsd-session:{notice.session_id}",
                f"--hint=int:x-agentsd-seq:{notice.seq}",
                "--",
                summary,
                body,
            ]
        level = {"low": 0, "normal": 1, "critical": 2}[urgency]
        hints = (
            f"{{'urgency': <byte {level}>, "
            f"'x-agentsd-session': <{gvariant_string(notice.session_id)}>, "
            f"'x-agentsd-seq': <{notice.seq}>}}"
        )
        return [
            self.program,
            "call",
            "--session",
            "--dest=org.freedesktop.Notifications",
            "--object-path=/org/freedesktop/Notifications",
            "--method=org.freedesktop.Notifications.Notify",
            "--",
            gvariant_string(APP_NAME),
            "uint32 0",  # replaces no earlier notification
            gvariant_string(""),  # no icon
            gvariant_string(summary),
            gvariant_string(body),
            "@as []",  # no actions
            hints,
            "int32 -1",  # the server's default expiry
        ]

    def show(self, summary: str, body: str, urgency: str, notice: at.Notice) -> None:
        """Run the program; a failure is reported and the feed goes on."""
        argv = self.argv(summary, body, urgency, notice)
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                timeout=SINK_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"agentsctl notify: {self.via} failed: {exc}", file=sys.stderr)
            return
        if done.returncode != 0:
            print(
                f"agentsctl notify: {self.via} exited {done.returncode}: "
                f"{done.stderr.strip()[:200]}",
                file=sys.stderr,
            )


def notice_body(text: str) -> str:
    return text if len(text) <= BODY_CHARS else text[: BODY_CHARS - 1] + "…"


def gvariant_string(text: str) -> str:
    """``text`` as a GVariant text-format string literal (gdbus parses its args so)."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"'{escaped}'"
