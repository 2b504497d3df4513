"""Crash chaos: random workloads against mock sessions from several clients, SIGKILL
of the daemon at random moments, and DESIGN.md's promises checked after every
restart.

    python -m tests.e2e.chaos --rounds 200 --seed 7      # make chaos

Each round starts the daemon on the same state directory, runs ``--clients``
workers (create, send, approve, interrupt, close, delete, subscribe) for a random
time, then SIGKILLs the daemon. After the restart it checks:

1. no process carrying a spawn token from before the kill survives;
2. every mutation that got a success reply is in the journal as its own event, not
   merely as some event of its kind: a create by the session's ``session.created``;
   a send by the ``submission`` at the seq of its reply, with its message id; an
   answer by the ``approval.resolved`` at its seq, with its decision; an interrupt
   by the ``interrupt.requested`` at its seq; a close by the ``child.exited`` of the
   child it closed (the fence and cause of its reply). The workers keep their own
   record of replies. A later delete excuses the session: a delete whose reply was
   cut off by the kill may or may not have committed, and either outcome is right,
   decided at the next restart;
3. every session's seq is contiguous;
4. no session ever had two live children (child.spawned / child.exited alternate,
   at most one lease is held);
5. every subscription resumes from its last seq and ends with the same events as a
   fresh reader;
6. no streamed text is doubled or lost: while a child lives (reattached or not),
   each item starts at most once and each of its snapshots extends the one before,
   up to the text it completes with;
7. the recovery report accounts for every turn (``lost`` 0).

With ``--reattach`` every agent runs in the holder under ``crash_policy =
"reattach"`` and streams more slowly (the kills land mid-turn): check 1 then
excuses exactly the agents the restarted daemon took over (its lease, held, is the
one its ``child.reattached`` names), and the report must count them.

With ``--restart`` (``--reattach`` too) a round ends, at random, either in a
SIGKILL or in a planned ``daemon.restart`` asked while the workers run and the
agents stream: the same process executes the daemon again, hands its agents over
and the new image takes them over before it serves. The same checks follow a
restart as a kill (the survivors are exactly the agents taken over, nothing cut
off by the restart is lost or doubled), and the daemon must have kept its pid.

It prints one summary line; violations must be 0. The run is reproducible in its
choices (the seed fixes every worker's decisions and every kill delay), not in its
timing.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import msgspec

from agentsctl.client import Client
from agentsctl.daemon import DaemonUnreachable
from agentsd.procfs import scan_processes
from agentsd_protocol.errors import RpcError
from tests.daemon_process import (
    DaemonProcess,
    daemon_command,
    daemon_env,
    make_temp_dir,
    wait_until_serving,
)

CLIENT_TIMEOUT_S = 10.0  # one request against a local daemon, on a loaded machine
SUBSCRIBE_READ_S = 0.05  # how long a subscriber waits for one notification per poll
RESTART_SHARE = 0.5  # with --restart: the rounds that end in a planned restart
RESTART_TIMEOUT_S = 60.0  # the old image's hand-over, preflight and the new start, loaded
MAX_SESSIONS = 6  # per round; enough for interleavings, small enough for 2 cores
LADDER_CONFIG = """\
idle_timeout_s = 600.0
handshake_timeout_s = 10.0
[ladder]
eof_grace_s = 0.5
term_grace_s = 0.5
kill_wait_s = 1.0
"""


@attrs.define
class Acked:
    """A mutation that got a success reply: it must be visible after any crash."""

    kind: str
    session_id: str
    detail: dict[str, Any] = attrs.field(factory=dict)


@attrs.define
class Follower:
    """A subscriber's view: the events it received, in order."""

    session_id: str
    cursor: int = 0
    seen: list[tuple[int, str]] = attrs.field(factory=list)


@attrs.define
class Record:
    """What the clients know, shared by the workers of all rounds."""

    acked: list[Acked] = attrs.field(factory=list)
    followers: list[Follower] = attrs.field(factory=list)
    sessions: set[str] = attrs.field(factory=set)
    deleted: set[str] = attrs.field(factory=set)
    # Deletes whose reply never came (the daemon died first): either outcome is right.
    delete_unknown: set[str] = attrs.field(factory=set)
    threads: list[threading.Thread] = attrs.field(factory=list)  # followers' readers
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def ack(self, kind: str, session_id: str, **detail: Any) -> None:
        with self.lock:
            self.acked.append(Acked(kind, session_id, detail))


@attrs.define
class Summary:
    rounds: int = 0
    kills: int = 0
    restarts: int = 0  # planned restarts in place (``--restart``)
    acked: int = 0  # distinct acknowledged mutations
    acked_checked: int = 0  # checks made: each acked mutation after every later restart
    violations: list[str] = attrs.field(factory=list)
    # The windows a kill can land in, counted, so a run shows which it reached:
    # requests whose reply the kill cut off, by method (a mutation may or may not
    # have committed), and children that recovery had to end after a restart.
    cut_off: collections.Counter[str] = attrs.field(factory=collections.Counter)
    recovered: set[tuple[str, int]] = attrs.field(factory=set)  # (session, seq) of the exits
    reattached: int = 0  # agents restarted daemons took over (``--reattach``)
    mid_turn: int = 0  # of them, with a turn open at the takeover
    takeovers: dict[str, int] = attrs.field(factory=dict)  # child.reattached per session

    def line(self) -> str:
        cut = ", ".join(f"{op} {n}" for op, n in sorted(self.cut_off.items())) or "none"
        taken = (
            f"{self.reattached} agents reattached ({self.mid_turn} mid-turn); "
            if self.reattached
            else ""
        )
        restarts = f"{self.restarts} restarts in place, " if self.restarts else ""
        return (
            f"chaos: {self.rounds} rounds, {self.kills} kills, {restarts}"
            f"{self.acked} acknowledged mutations ({self.acked_checked} checks), "
            f"replies cut off by a kill or restart: {cut}; {len(self.recovered)} children ended by "
            f"recovery; {taken}{len(self.violations)} violations"
        )


# ---- the workload ------------------------------------------------------------------


class Worker(threading.Thread):
    def __init__(
        self,
        socket_path: Path,
        record: Record,
        rng: random.Random,
        cwd: Path,
        chunk_delay_s: float = 0.02,
    ) -> None:
        super().__init__(daemon=True)
        self.socket_path = socket_path
        self.record = record
        self.rng = rng
        self.cwd = cwd
        self.chunk_delay_s = chunk_delay_s  # how slowly its sessions' agents stream
        self.stop = threading.Event()
        self.in_flight: str | None = None  # the request awaiting its reply, if any

    def run(self) -> None:
        try:
            with Client(self.socket_path, timeout_s=CLIENT_TIMEOUT_S) as client:
                while not self.stop.is_set():
                    self.step(client)
        except (DaemonUnreachable, OSError, TimeoutError):
            return  # the daemon was killed under us: the round is over for this worker

    def _live(self) -> list[str]:
        with self.record.lock:
            return sorted(self.record.sessions - self.record.deleted)

    def step(self, client: Client) -> None:
        live = self._live()
        op = self.rng.choices(
            ["create", "send", "approve", "respond", "interrupt", "close", "delete", "follow"],
            weights=[3 if len(live) < MAX_SESSIONS else 0, 6, 3, 4, 2, 2, 1, 2],
        )[0]
        if op == "create" or not live:
            self.in_flight = "create"
            self.create(client)
            self.in_flight = None
            return
        session_id = self.rng.choice(live)
        # Refused (session deleted meanwhile, nothing to answer, ...): not acked.
        self.in_flight = op if op != "follow" else None  # a follow answers on its own thread
        with contextlib.suppress(RpcError):
            getattr(self, op)(client, session_id)
        self.in_flight = None

    def _op_id(self) -> str:
        return uuid.UUID(int=self.rng.getrandbits(128)).hex

    def create(self, client: Client) -> None:
        options: dict[str, Any] = {"chunks": 4, "chunkDelayS": self.chunk_delay_s}
        if self.rng.random() < 0.3:
            options["spawnGrandchild"] = True
        try:
            result = client.call(
                "agentSession.create",
                {
                    "provider": "mock",
                    "cwd": str(self.cwd),
                    "options": options,
                    "clientOperationId": self._op_id(),
                },
            )
        except RpcError:
            return
        session_id = result["sessionId"]
        with self.record.lock:
            self.record.sessions.add(session_id)
        self.record.ack("create", session_id)

    def send(self, client: Client, session_id: str, text: str | None = None) -> None:
        text = text or f"echo round message {self.rng.getrandbits(32)}"
        result = client.call(
            "agentSession.send",
            {"sessionId": session_id, "text": text, "clientOperationId": self._op_id()},
        )
        self.record.ack(
            "send", session_id, clientMessageId=result["clientMessageId"], seq=result["seq"]
        )

    def approve(self, client: Client, session_id: str) -> None:
        self.send(client, session_id, "please approve this")

    def respond(self, client: Client, session_id: str) -> None:
        history = client.call(
            "agentSession.history", {"sessionId": session_id, "beforeSeq": 1 << 62, "limit": 50}
        )
        resolved = {
            e["body"]["approvalId"] for e in history["events"] if e["kind"] == "approval.resolved"
        }
        pending = [
            e["body"]
            for e in history["events"]
            if e["kind"] == "approval.requested" and e["body"]["approvalId"] not in resolved
        ]
        if not pending:
            return
        approval = self.rng.choice(pending)
        decision = self.rng.choice(approval["options"])
        result = client.call(
            "agentSession.respond",
            {
                "sessionId": session_id,
                "approvalId": approval["approvalId"],
                "decision": decision,
                "clientOperationId": self._op_id(),
            },
        )
        self.record.ack(
            "respond",
            session_id,
            approvalId=approval["approvalId"],
            decision=decision,
            seq=result["seq"],
        )

    def interrupt(self, client: Client, session_id: str) -> None:
        result = client.call(
            "agentSession.interrupt", {"sessionId": session_id, "clientOperationId": self._op_id()}
        )
        if result["interrupted"]:
            self.record.ack("interrupt", session_id, seq=result["seq"])

    def close(self, client: Client, session_id: str) -> None:
        result = client.call(
            "agentSession.close", {"sessionId": session_id, "clientOperationId": self._op_id()}
        )
        if result["wasRunning"]:
            session = result["session"]
            self.record.ack(
                "close", session_id, fence=session["fence"], cause=session["lastExit"]["cause"]
            )

    def delete(self, client: Client, session_id: str) -> None:
        params = {"sessionId": session_id, "clientOperationId": self._op_id()}
        try:
            client.call("agentSession.delete", params)
        except (DaemonUnreachable, OSError, TimeoutError):
            with self.record.lock:
                self.record.delete_unknown.add(session_id)
            raise
        with self.record.lock:
            self.record.deleted.add(session_id)
        self.record.ack("delete", session_id)

    def follow(self, client: Client, session_id: str) -> None:
        """Subscribe on a connection of its own and read until the daemon dies."""
        follower = Follower(session_id)
        with self.record.lock:
            self.record.followers.append(follower)
        thread = threading.Thread(
            target=_follow, args=(self.socket_path, follower, self.stop), daemon=True
        )
        with self.record.lock:
            self.record.threads.append(thread)
        thread.start()


def _follow(socket_path: Path, follower: Follower, stop: threading.Event) -> None:
    try:
        with Client(socket_path, timeout_s=CLIENT_TIMEOUT_S) as client:
            client.call(
                "agentSession.subscribe",
                {"sessionId": follower.session_id, "afterSeq": follower.cursor},
            )
            while not stop.is_set():
                note = client.next_notification(SUBSCRIBE_READ_S)
                if note is None:
                    continue
                params = msgspec.json.decode(note.params)
                if note.method == "agentSession.event":
                    follower.seen.append((params["seq"], params["event"]["kind"]))
                    follower.cursor = params["seq"]
                elif note.method == "agentSession.lagged":
                    return  # resumed after the restart, from the cursor
    except (DaemonUnreachable, OSError, TimeoutError, RpcError):
        return


# ---- the daemon ------------------------------------------------------------------


@contextlib.contextmanager
def start_daemon(
    base: Path, holder: bool = False, reattach: bool = False
) -> Iterator[DaemonProcess]:
    state = base / "state"
    sock = base / "run" / "agentsd.sock"
    config = base / "chaos.toml"
    held = "holder = false\n"  # by default: the daemon starts its agents itself
    if holder or reattach:
        held = f'holder = true\ncrash_policy = "{"reattach" if reattach else "end"}"\n'
    config.write_text(held + LADDER_CONFIG)
    log_path = base / "agentsd.log"
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            daemon_command(sock, state, ["--config", str(config)]),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=daemon_env(base),
        )
    daemon = DaemonProcess(sock, state, process, log_path)
    try:
        wait_until_serving(daemon)
        yield daemon
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


# ---- the checks --------------------------------------------------------------------


def _holder_left(state: Path) -> bool:
    """Whether nothing listens on the holder's socket any more (it leaves once it
    holds nothing and no daemon is attached), within ``CLIENT_TIMEOUT_S``."""
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(str(state / "holder.sock"))
            except (ConnectionRefusedError, FileNotFoundError):
                return True
        time.sleep(0.05)
    return False


def _db(state: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{state / 'agentsd.db'}?mode=ro", uri=True)


def _tokens(state: Path) -> list[str]:
    with contextlib.closing(_db(state)) as conn:
        return [row[0] for row in conn.execute("SELECT token FROM leases")]


Journal = list[tuple[int, str, dict[str, Any]]]
"""(seq, kind, body) in seq order; the body carries the row's ``fence`` too."""


def _journal(conn: sqlite3.Connection, session_id: str) -> Journal:
    rows = conn.execute(
        "SELECT seq, kind, fence, body FROM events WHERE session_id = ? ORDER BY seq",
        (session_id,),
    )
    return [
        (seq, kind, {**msgspec.json.decode(body), "_fence": fence})
        for seq, kind, fence, body in rows
    ]


def check(
    state: Path,
    tokens_before: list[str],
    record: Record,
    summary: Summary,
    recovery: dict[str, Any] | None = None,
) -> None:
    """Checks 1-4 and 6 against the database of the daemon just restarted; 7
    against its ``recovery`` report (``daemon.status``)."""
    bad = summary.violations
    with contextlib.closing(_db(state)) as conn:
        existing = {row[0] for row in conn.execute("SELECT id FROM sessions")}
        journals = {sid: _journal(conn, sid) for sid in existing}
        held = conn.execute(
            "SELECT session_id, COUNT(*) FROM leases WHERE state != 'released' GROUP BY session_id"
        ).fetchall()
        held_leases = conn.execute(
            "SELECT session_id, token, fence FROM leases WHERE state != 'released'"
        ).fetchall()
    # Taken over by the daemon just restarted: its held lease is the one its last
    # child.reattached names (a takeover is fence + 1, so an earlier one never is).
    taken = {
        token: session_id
        for session_id, token, fence in held_leases
        if any(
            kind == "child.reattached" and body["fence"] == fence
            for _, kind, body in journals.get(session_id, [])
        )
    }
    survivors = scan_processes(tokens_before)
    for token in tokens_before:
        if token in taken:
            continue
        for proc in survivors.carrying(token):
            bad.append(f"process {proc.pid} with token {token[:8]} survived the restart")
    if recovery is not None:
        if recovery.get("lost", 0) != 0:
            bad.append(f"recovery lost turns: {recovery.get('summary')}")
        # The takeovers of this restart: child.reattached events journaled since the
        # last check (an agent taken over may have ended since, its lease released).
        counts = {
            sid: sum(1 for _, kind, _ in events if kind == "child.reattached")
            for sid, events in journals.items()
        }
        new = {sid for sid, n in counts.items() if n > summary.takeovers.get(sid, 0)}
        summary.takeovers = counts
        if recovery.get("reattached", 0) != len(new):
            bad.append(
                f"recovery counted {recovery.get('reattached')} reattached, "
                f"the journals show {len(new)}"
            )
        summary.reattached += len(new)
        summary.mid_turn += sum(1 for sid in new if _turn_open(journals[sid]))
    for session_id, events in journals.items():
        bad.extend(_text_problems(session_id, events))
    for session_id, count in held:
        if count > 1:
            bad.append(f"session {session_id} holds {count} leases")
    for session_id, events in journals.items():
        summary.recovered.update(
            (session_id, seq)
            for seq, kind, body in events
            if kind == "child.exited" and body.get("cause") == "daemon-restart"
        )
        seqs = [seq for seq, _, _ in events]
        if seqs != list(range(1, len(seqs) + 1)):
            bad.append(f"session {session_id}: seqs not contiguous")
        live = False
        for seq, kind, _ in events:
            if kind == "child.spawned":
                if live:
                    bad.append(f"session {session_id}: second live child at seq {seq}")
                live = True
            elif kind in ("child.exited",):
                live = False
    with record.lock:
        acked = list(record.acked)
        deleted = set(record.deleted)
        # An unanswered delete that took effect is a deleted session from now on.
        deleted |= record.delete_unknown - existing
        record.deleted |= deleted
        record.delete_unknown.clear()  # decided now: the ones still here were not deleted
    for ack in acked:
        summary.acked_checked += 1
        problem = _check_ack(ack, journals, deleted)
        if problem:
            bad.append(problem)


def _turn_open(events: Journal) -> bool:
    """Whether a turn was open when the session's last child.reattached was
    journaled (the takeover happened mid-turn)."""
    running = False
    at_takeover = False
    for event in events:
        kind = event[1]
        if kind == "turn.started":
            running = True
        elif kind in ("turn.completed", "child.exited"):
            running = False
        elif kind == "child.reattached":
            at_takeover = running
    return at_takeover


def _text_problems(session_id: str, events: Journal) -> list[str]:
    """Check 6: within each child's life (up to its child.exited), an item starts
    at most once, and each snapshot of its text extends the one before, up to the
    text it completes with: text doubled or lost by a takeover breaks one of them."""
    problems: list[str] = []
    started: set[str] = set()
    text: dict[str, str] = {}
    for seq, kind, body in events:
        if kind == "child.exited":
            started.clear()
            text.clear()
            continue
        item = str(body.get("itemId"))
        if kind == "item.started":
            if item in started:
                problems.append(f"session {session_id}: item {item} started twice (seq {seq})")
            started.add(item)
        elif kind in ("item.updated", "item.completed") and body.get("text") is not None:
            now = body["text"]
            before = text.get(item, "")
            if not now.startswith(before) and not body.get("truncated"):
                problems.append(
                    f"session {session_id}: item {item} at seq {seq} does not extend its text: "
                    f"{before[-40:]!r} then {now[-40:]!r}"
                )
            text[item] = now
            if kind == "item.completed":
                del text[item]
    return problems


def _check_ack(ack: Acked, journals: dict[str, Journal], deleted: set[str]) -> str | None:
    sid = ack.session_id
    if ack.kind == "delete":
        return f"deleted session {sid} is back" if sid in journals else None
    if sid in deleted:
        return None  # deleted later, by an acknowledged delete or one that took effect
    events = journals.get(sid)
    if events is None:
        return f"acknowledged {ack.kind} on {sid}, but the session is gone"
    by_seq = {seq: (kind, body) for seq, kind, body in events}
    if ack.kind == "create":
        # The session's id is this create's alone: its first event is the create's.
        if by_seq.get(1, ("", {}))[0] != "session.created":
            return f"acknowledged create of {sid} has no session.created at seq 1"
    elif ack.kind == "send":
        kind, body = by_seq.get(ack.detail["seq"], ("", {}))
        if kind != "submission" or body.get("clientMessageId") != ack.detail["clientMessageId"]:
            return f"acknowledged send {ack.detail} on {sid} is not in the journal"
    elif ack.kind == "respond":
        kind, body = by_seq.get(ack.detail["seq"], ("", {}))
        if kind != "approval.resolved" or body.get("decision") != ack.detail["decision"]:
            return f"acknowledged answer {ack.detail} on {sid} is not in the journal"
    elif ack.kind == "interrupt":
        kind, _ = by_seq.get(ack.detail["seq"], ("", {}))
        if kind != "interrupt.requested":
            return f"acknowledged interrupt {ack.detail} on {sid} is not in the journal"
    elif ack.kind == "close":
        # The child it closed: the one of the reply's fence, ended for the reply's cause.
        exits = [
            body
            for _, kind, body in events
            if kind == "child.exited" and body["_fence"] == ack.detail["fence"]
        ]
        if [body.get("cause") for body in exits] != [ack.detail["cause"]]:
            return f"acknowledged close {ack.detail} on {sid}: its child's exits are {exits}"
    return None


def check_followers(daemon: DaemonProcess, record: Record, summary: Summary) -> None:
    """Each follower resumes from its cursor; what it saw plus what it gets now must
    equal a fresh read from seq 0."""
    with record.lock:
        followers = list(record.followers)
        record.followers.clear()
        deleted = set(record.deleted)
    with Client(daemon.socket, timeout_s=CLIENT_TIMEOUT_S) as client:
        for follower in followers:
            if follower.session_id in deleted:
                continue
            try:
                resumed = _read_all(client, follower.session_id, follower.cursor)
            except RpcError:
                continue  # deleted by an unacknowledged delete just before the kill
            # Read second: an agent taken over (--reattach) journals on meanwhile, so
            # the fresh reader may see more, never something else.
            fresh = _read_all(client, follower.session_id, 0)
            combined = follower.seen + resumed
            if combined != fresh[: len(combined)]:
                summary.violations.append(
                    f"follower of {follower.session_id} diverged from a fresh reader"
                )


def _read_all(client: Client, session_id: str, after: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    while True:
        page = client.call(
            "agentSession.history", {"sessionId": session_id, "afterSeq": after, "limit": 1000}
        )
        out.extend((e["seq"], e["kind"]) for e in page["events"])
        if not page["hasMore"] or not page["events"]:
            return out
        after = page["events"][-1]["seq"]


# ---- the driver ----------------------------------------------------------------------


def run(
    rounds: int,
    seed: int,
    clients: int = 3,
    verbose: bool = False,
    reach: frozenset[str] = frozenset(),
    max_rounds: int = 0,
    holder: bool = False,
    reattach: bool = False,
    restart: bool = False,
) -> Summary:
    """``rounds`` rounds, then more (up to ``max_rounds``) until a kill has cut off
    the reply of every method named in ``reach``: the moment of a kill is random, so
    a window is reached by repetition, and a run stops short of it only at the cap.
    Without ``holder`` the daemon starts its agents itself (``holder = false``), so
    each kill ends them. With ``holder``, every agent runs in the holder (config ``holder = true``),
    which outlives each kill, and at the end it must have left; under ``crash_policy
    = "end"``, or with ``reattach`` under ``"reattach"``, its agents streaming
    slowly so that kills land mid-turn. With ``restart`` (``reattach`` too) each
    round but the last ends, with probability ``RESTART_SHARE``, in a planned
    restart in place instead of a kill."""
    reattach = reattach or restart
    holder = holder or reattach
    chunk_delay_s = 0.25 if reattach else 0.02
    rng = random.Random(seed)
    base = make_temp_dir()
    cwd = base / "work"
    cwd.mkdir()
    record = Record()
    summary = Summary()
    tokens_before: list[str] = []
    round_no = 0

    def more() -> bool:
        return round_no < rounds or bool(reach - set(summary.cut_off) and round_no < max_rounds)

    while more():
        with start_daemon(base, holder, reattach) as daemon:
            while True:
                if round_no:
                    check(daemon.state_dir, tokens_before, record, summary, _recovery(daemon))
                    check_followers(daemon, record, summary)
                delay = rng.uniform(0.3, 2.0)  # the moment of the kill is the experiment
                planned = restart and rng.random() < RESTART_SHARE
                workers = [
                    Worker(
                        daemon.socket,
                        record,
                        random.Random(rng.getrandbits(64)),
                        cwd,
                        chunk_delay_s,
                    )
                    for _ in range(clients)
                ]
                for worker in workers:
                    worker.start()
                time.sleep(delay)
                round_no += 1
                planned = planned and more()  # the last round ends in a kill
                if planned:
                    _restart_in_place(daemon, workers, record, summary)
                else:
                    daemon.process.send_signal(signal.SIGKILL)
                    daemon.process.wait(timeout=30)
                    summary.kills += 1
                    summary.cut_off.update(w.in_flight for w in workers if w.in_flight is not None)
                    _stop(workers, record)
                # Read once no daemon journals (killed), or once the new image serves
                # with no worker left (restarted): every lease of an agent started before.
                tokens_before = _tokens(daemon.state_dir)
                summary.rounds += 1
                summary.acked = len(record.acked)
                if verbose:
                    print(f"round {round_no}: {summary.line()}", flush=True)
                if not planned:
                    break
    with start_daemon(base, holder, reattach) as daemon:
        check(daemon.state_dir, tokens_before, record, summary, _recovery(daemon))
        check_followers(daemon, record, summary)
        daemon.process.send_signal(signal.SIGTERM)
        if daemon.process.wait(timeout=60) != 0:
            summary.violations.append("the daemon did not exit 0 on SIGTERM")
        if holder and not _holder_left(daemon.state_dir):
            summary.violations.append("the holder still listened after the daemon's clean stop")
    summary.acked = len(record.acked)
    shutil.rmtree(base, ignore_errors=True)
    return summary


def _stop(workers: list[Worker], record: Record) -> None:
    """Stop the workers and the followers' readers, and wait for them."""
    for worker in workers:
        worker.stop.set()
    with record.lock:
        threads = [*workers, *record.threads]
        record.threads.clear()
    for thread in threads:
        thread.join(timeout=CLIENT_TIMEOUT_S * 2)


def _restart_in_place(
    daemon: DaemonProcess, workers: list[Worker], record: Record, summary: Summary
) -> None:
    """Ask for ``daemon.restart`` while the workers run, stop them once it replied
    (the old image's connections are cut at the exec: none reaches the new image),
    and wait until the new image serves, under the same pid."""
    pid = daemon.process.pid
    try:
        with Client(daemon.socket, timeout_s=CLIENT_TIMEOUT_S) as client:
            result = client.call("daemon.restart", {"clientOperationId": uuid.uuid4().hex})
    except (RpcError, DaemonUnreachable, OSError, TimeoutError) as exc:
        summary.violations.append(f"daemon.restart failed: {exc!r}")
        raise
    replied = time.time()
    summary.restarts += 1
    summary.cut_off.update(w.in_flight for w in workers if w.in_flight is not None)
    _stop(workers, record)
    if not result.get("keepsAgents"):
        summary.violations.append(f"daemon.restart did not keep the agents: {result}")
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            break
        try:
            with Client(daemon.socket, timeout_s=CLIENT_TIMEOUT_S) as client:
                status = client.call("daemon.status")
        except (RpcError, DaemonUnreachable, OSError, TimeoutError):
            status = None  # the old image stopping, or the new one not serving yet
        # The new image: started after the reply (uptime is rounded to the ms).
        if status is not None and time.time() - status["uptimeS"] > replied - 0.05:
            if status["pid"] != pid:
                summary.violations.append(f"the daemon's pid changed: {pid} -> {status['pid']}")
            return
        time.sleep(0.05)
    summary.violations.append(
        f"the new image did not serve within {RESTART_TIMEOUT_S} s of the restart "
        f"(the daemon {'lives' if daemon.process.poll() is None else 'exited'})"
    )
    raise RuntimeError(summary.violations[-1])


def _recovery(daemon: DaemonProcess) -> dict[str, Any]:
    with Client(daemon.socket, timeout_s=CLIENT_TIMEOUT_S) as client:
        report: dict[str, Any] = client.call("daemon.status")["recovery"]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--holder", action="store_true", help="agents in the holder")
    parser.add_argument(
        "--reattach", action="store_true", help='agents in the holder, crash_policy = "reattach"'
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="as --reattach, rounds ending in a planned restart in place or a SIGKILL",
    )
    args = parser.parse_args(argv)
    summary = run(
        args.rounds,
        args.seed,
        args.clients,
        args.verbose,
        holder=args.holder,
        reattach=args.reattach,
        restart=args.restart,
    )
    print(summary.line())
    for violation in summary.violations[:50]:
        print(f"  violation: {violation}")
    return 0 if not summary.violations else 1


if __name__ == "__main__":
    sys.exit(main())
