"""What the real agents' reattach tests share (issue 19): a real Codex or Claude
turn, held by the holder, through ``agentsctl daemon restart`` (the same daemon pid
executing again) or a daemon SIGKILL and a fresh start.

A provider's test module scripts its fake model server (a reply held after its
first piece, ``fake_http``'s ``hold``: the turn is mid-stream when the daemon goes
away, and the test releases the rest while no daemon or the new one reads) and
creates the session; what is checked afterwards is the same for every agent: the
same agent process under a higher fence, the turn completed, a subscriber that
comes back from the last seq it had sees every seq once and ends with exactly the
text the fake server sent (``ItemFollower``: snapshots and deltas placed at their
offsets, text doubled or contradicted fails), and the journal contiguous.

Every wait is bounded by the test's ``Deadline``; nothing is timed.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

from agentsctl.client import Client
from agentsd.procfs import is_same_process, read_proc_info
from agentsd_protocol.errors import RpcError
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon
from tests.e2e.test_reattach import ItemFollower
from tests.e2e.test_restart_in_place import restart_cli
from tests.e2e.test_sessions import DATABASE_NAME, db_rows, kill_carriers
from tests.peers.conftest import CALL_TIMEOUT_S, Deadline

# A reply long enough to be streaming still when the new daemon reads on: after the
# hold, 60 pieces a few ms apart.
STORY = " ".join(f"word{i:03d}" for i in range(180))
STORY_PIECES = 60
PIECE_DELAY_S = 0.02


class Watcher:
    """A subscription from ``after_seq`` on its own connection, every notification
    kept in arrival order (what a client replays)."""

    def __init__(self, sock: Path, session_id: str, after_seq: int, deadline: Deadline) -> None:
        self.client = Client(sock, timeout_s=CALL_TIMEOUT_S)
        self.session_id = session_id
        self.deadline = deadline
        self.notes: list[tuple[str, dict[str, Any]]] = []
        self.client.call("agentSession.subscribe", {"sessionId": session_id, "afterSeq": after_seq})

    def close(self) -> None:
        self.client.close()

    def events(self) -> list[dict[str, Any]]:
        return [p["event"] for m, p in self.notes if m == "agentSession.event"]

    def deltas(self) -> list[dict[str, Any]]:
        return [p for m, p in self.notes if m == "agentSession.delta"]

    def wait(self, check: Callable[[], Any], what: str) -> Any:
        """Read notifications until ``check()`` returns something truthy."""
        while not (found := check()):
            try:
                note = self.client.next_notification(min(1.0, self.deadline.remaining()))
            except TimeoutError:
                seen = [(e["seq"], e["kind"]) for e in self.events()]
                raise TimeoutError(f"no {what}; saw {seen}") from None
            if note is None:
                continue
            params = note.decode(dict[str, Any])
            assert note.method != "agentSession.lagged", params
            self.notes.append((note.method, params))
        return found

    def wait_event(
        self, kind: str, where: Callable[[dict[str, Any]], bool] = lambda body: True
    ) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next((e for e in self.events() if e["kind"] == kind and where(e["body"])), None)

        event: dict[str, Any] = self.wait(found, kind)
        return event


@attrs.frozen
class HeldTurn:
    """A turn streaming (its reply held after the first piece) before the daemon
    goes away: what the subscriber had, and the agent's identity."""

    session_id: str
    watcher: Watcher
    item_id: str
    pid: int
    start_time: int
    fence: int

    def last_seq(self) -> int:
        seqs = [e["seq"] for e in self.watcher.events()]
        assert seqs == list(range(1, len(seqs) + 1)), seqs  # from 0, no gap or duplicate
        return len(seqs)


def begin_held_turn(sock: Path, session_id: str, prompt: str, deadline: Deadline) -> HeldTurn:
    """Subscribe from seq 0, send ``prompt``, and wait for the first streamed piece."""
    watcher = Watcher(sock, session_id, 0, deadline)
    with Client(sock, timeout_s=CALL_TIMEOUT_S) as client:
        sent = client.call("agentSession.send", {"sessionId": session_id, "text": prompt})
        assert sent["dispatch"] == "accepted", sent
        first = watcher.wait(lambda: next(iter(watcher.deltas()), None), "a streamed delta")
        session = client.call("agentSession.get", {"sessionId": session_id})["session"]
    pid = session["child"]["pid"]
    info = read_proc_info(pid)
    assert info is not None and not info.is_zombie
    return HeldTurn(
        session_id=session_id,
        watcher=watcher,
        item_id=first["itemId"],
        pid=pid,
        start_time=info.start_time,
        fence=session["fence"],
    )


def journal(sock: Path, session_id: str) -> list[dict[str, Any]]:
    """The session's whole journal, paged forward."""
    events: list[dict[str, Any]] = []
    with Client(sock, timeout_s=CALL_TIMEOUT_S) as client:
        while True:
            after = events[-1]["seq"] if events else 0
            page = client.call(
                "agentSession.history", {"sessionId": session_id, "afterSeq": after, "limit": 500}
            )
            events += page["events"]
            if not page["hasMore"] or not page["events"]:
                return events


def assert_contiguous(events: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


def restart_in_place(daemon: DaemonProcess) -> None:
    """``agentsctl daemon restart`` (the CLI, as the unit's reload runs it), which
    hands held agents to the new image."""
    done = restart_cli(daemon.socket)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "running agents kept running" in done.stdout, done.stdout


def wait_reattached(sock: Path, session_id: str, times: int, deadline: Deadline) -> None:
    def reattached() -> bool:
        kinds = [e["kind"] for e in journal(sock, session_id)]
        return kinds.count("child.reattached") == times

    deadline.poll(reattached, f"child.reattached x{times} in {session_id}")


def finish_reattached_turn(
    sock: Path, turn: HeldTurn, text: str, deadline: Deadline
) -> list[dict[str, Any]]:
    """After the daemon came back (the hold released): the same agent under a higher
    fence, a subscriber from the last seq seen before sees the turn complete with
    every seq once, and the text it shows is exactly ``text``. The journal."""
    last_seq = turn.last_seq()
    turn.watcher.close()
    with Client(sock, timeout_s=CALL_TIMEOUT_S) as client:
        session = client.call("agentSession.get", {"sessionId": turn.session_id})["session"]
    assert session["child"]["pid"] == turn.pid  # the same process, never started again
    assert is_same_process(turn.pid, turn.start_time)
    assert session["fence"] > turn.fence
    again = Watcher(sock, turn.session_id, last_seq, deadline)
    try:
        done = again.wait_event("turn.completed")
    finally:
        again.close()
    assert done["body"]["outcome"] == "completed", done
    resumed = [e["seq"] for e in again.events()]
    assert resumed == list(range(last_seq + 1, last_seq + 1 + len(resumed)))  # no gap, no dup
    follower = ItemFollower(turn.item_id)
    follower.feed(turn.watcher.notes)
    follower.feed(again.notes)
    assert follower.completed == text
    assert follower.text == text
    assert follower.gaps == []  # never a delta past the text it had
    events = journal(sock, turn.session_id)
    assert_contiguous(events)
    kinds = [e["kind"] for e in events]
    assert kinds.count("child.spawned") == 1 and "child.exited" not in kinds, kinds
    snapshots = [
        e["body"]["text"]
        for e in events
        if e["kind"] == "item.updated" and e["body"]["itemId"] == turn.item_id
    ]
    assert snapshots and all(text.startswith(s) for s in snapshots), snapshots
    return events


def streamed_through_a_restart_in_place(
    daemon: DaemonProcess, session_id: str, hold: threading.Event, text: str, deadline: Deadline
) -> None:
    """The turn of ``session_id`` (its reply held by ``hold``) through ``agentsctl
    daemon restart``: the same daemon pid, the same agent, the whole text."""
    turn = begin_held_turn(daemon.socket, session_id, "Tell me a story", deadline)
    restart_in_place(daemon)
    hold.set()  # the rest streams while the new image starts, or once it reads
    wait_reattached(daemon.socket, session_id, 1, deadline)
    with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
        assert client.call("daemon.status")["pid"] == daemon.process.pid
    events = finish_reattached_turn(daemon.socket, turn, text, deadline)
    [reattached] = [e for e in events if e["kind"] == "child.reattached"]
    assert reattached["body"]["pid"] == turn.pid


@contextlib.contextmanager
def crashable_daemons(
    config_text: str, crash_policy: str
) -> Iterator[Callable[[], contextlib.AbstractContextManager[DaemonProcess]]]:
    """Daemons on one state directory, configured with ``config_text`` (the holder
    on) and ``crash_policy``: each call of what is yielded starts one. Whatever
    carries one of their agents' spawn tokens is killed afterwards, so a failing
    test leaks no agent."""
    base = make_temp_dir()
    config = base / "config.toml"
    config.write_text(f'crash_policy = "{crash_policy}"\n{config_text}')
    db = base / "state" / DATABASE_NAME
    try:
        yield lambda: running_daemon(state_dir=base / "state", extra_args=["--config", str(config)])
    finally:
        if db.exists():
            kill_carriers([row[0] for row in db_rows(db, "SELECT token FROM leases")])
        shutil.rmtree(base, ignore_errors=True)


def sigkill(daemon: DaemonProcess) -> None:
    daemon.process.send_signal(signal.SIGKILL)
    assert daemon.wait() == -signal.SIGKILL


def respond_once(sock: Path, session_id: str, approval_id: str, decision: str) -> None:
    """Answer the approval; a second answer is refused (``already_resolved``)."""
    with Client(sock, timeout_s=CALL_TIMEOUT_S) as client:
        session = client.call("agentSession.get", {"sessionId": session_id})["session"]
        assert session["status"] == "attention"  # still pending, still answerable
        answer = client.call(
            "agentSession.respond",
            {"sessionId": session_id, "approvalId": approval_id, "decision": decision},
        )
        assert answer["decision"] == decision
        try:
            client.call(
                "agentSession.respond",
                {"sessionId": session_id, "approvalId": approval_id, "decision": decision},
            )
        except RpcError as refused:
            assert refused.kind == "already_resolved", refused
        else:
            raise AssertionError("a second answer to one approval was taken")


def streamed_through_a_crash(
    daemons: Callable[[], contextlib.AbstractContextManager[DaemonProcess]],
    create: Callable[[Client], str],
    hold: threading.Event,
    text: str,
    deadline: Deadline,
) -> None:
    """``crash_policy = "reattach"``: the daemon SIGKILLed mid-turn, the rest of the
    reply written while no daemon reads (the holder keeps it), and the next daemon
    takes the same agent over and journals it in order."""
    with daemons() as first:
        with Client(first.socket, timeout_s=CALL_TIMEOUT_S) as client:
            session_id = create(client)
        turn = begin_held_turn(first.socket, session_id, "Tell me a story", deadline)
        sigkill(first)
    assert is_same_process(turn.pid, turn.start_time)  # the holder keeps it
    hold.set()
    with daemons() as second:
        with Client(second.socket, timeout_s=CALL_TIMEOUT_S) as client:
            recovery = client.call("daemon.status")["recovery"]
        assert recovery["reattached"] == 1, recovery
        assert recovery["lost"] == 0 and recovery["turnsCutOff"] == 0, recovery
        events = finish_reattached_turn(second.socket, turn, text, deadline)
        [reattached] = [e for e in events if e["kind"] == "child.reattached"]
        assert reattached["body"]["pid"] == turn.pid
        assert reattached["body"]["previousFence"] == turn.fence
        with Client(second.socket, timeout_s=CALL_TIMEOUT_S) as client:
            client.call("agentSession.close", {"sessionId": session_id})


def cut_off_by_a_crash(
    daemons: Callable[[], contextlib.AbstractContextManager[DaemonProcess]],
    create: Callable[[Client], str],
    hold: threading.Event,
    deadline: Deadline,
) -> None:
    """``crash_policy = "end"``: as without the holder, the next daemon ends the
    agent (proven gone), cuts its turn off and records ``child.exited
    daemon-restart``."""
    with daemons() as first:
        with Client(first.socket, timeout_s=CALL_TIMEOUT_S) as client:
            session_id = create(client)
        turn = begin_held_turn(first.socket, session_id, "Tell me a story", deadline)
        turn.watcher.close()
        sigkill(first)
    hold.set()
    with daemons() as second:
        with Client(second.socket, timeout_s=CALL_TIMEOUT_S) as client:
            recovery = client.call("daemon.status")["recovery"]
            session = client.call("agentSession.get", {"sessionId": session_id})["session"]
        assert recovery["reattached"] == 0 and recovery["turnsCutOff"] == 1, recovery
        assert recovery["lost"] == 0, recovery
        assert session["phase"] == "stopped" and session["status"] == "idle", session
        assert not is_same_process(turn.pid, turn.start_time)  # ended, proven gone
        events = journal(second.socket, session_id)
    assert_contiguous(events)
    kinds = [e["kind"] for e in events]
    assert "child.reattached" not in kinds
    [exited] = [e for e in events if e["kind"] == "child.exited"]
    assert exited["body"]["cause"] == "daemon-restart"
    [done] = [e for e in events if e["kind"] == "turn.completed"]
    assert done["body"]["outcome"] == "interrupted", done
    assert done["body"]["reason"] == "daemon-restart", done
    assert kinds.index("turn.completed") < kinds.index("child.exited")


@attrs.frozen
class PendingApproval:
    session_id: str
    approval_id: str
    seq: int  # of its ``approval.requested``
    pid: int


def ask(sock: Path, session_id: str, prompt: str, deadline: Deadline) -> PendingApproval:
    """Send ``prompt`` and wait for the approval the fake model's tool call asks."""
    watcher = Watcher(sock, session_id, 0, deadline)
    try:
        with Client(sock, timeout_s=CALL_TIMEOUT_S) as client:
            sent = client.call("agentSession.send", {"sessionId": session_id, "text": prompt})
            assert sent["dispatch"] == "accepted", sent
            session = client.call("agentSession.get", {"sessionId": session_id})["session"]
        asked = watcher.wait_event("approval.requested")
    finally:
        watcher.close()
    return PendingApproval(
        session_id=session_id,
        approval_id=asked["body"]["approvalId"],
        seq=asked["seq"],
        pid=session["child"]["pid"],
    )


def answer_after_the_takeover(
    sock: Path, pending: PendingApproval, decision: str, deadline: Deadline
) -> list[dict[str, Any]]:
    """Once the agent is taken over: answer once (a second answer refused), and the
    turn completes on the same agent. The journal."""
    session_id = pending.session_id
    wait_reattached(sock, session_id, 1, deadline)
    respond_once(sock, session_id, pending.approval_id, decision)
    again = Watcher(sock, session_id, pending.seq, deadline)
    try:
        done = again.wait_event("turn.completed")
    finally:
        again.close()
    assert done["body"]["outcome"] == "completed", done
    events = journal(sock, session_id)
    assert_contiguous(events)
    kinds = [e["kind"] for e in events]
    assert "agent.error" not in kinds and "child.exited" not in kinds, kinds
    [resolved] = [e for e in events if e["kind"] == "approval.resolved"]
    assert resolved["body"]["approvalId"] == pending.approval_id
    assert resolved["body"]["decision"] == decision
    with Client(sock, timeout_s=CALL_TIMEOUT_S) as client:
        session = client.call("agentSession.get", {"sessionId": session_id})["session"]
    assert session["child"]["pid"] == pending.pid
    return events


def approval_through(
    how: str,
    daemon: DaemonProcess,
    daemons: Callable[[], contextlib.AbstractContextManager[DaemonProcess]],
    create: Callable[[Client], str],
    decision: str,
    deadline: Deadline,
) -> list[dict[str, Any]]:
    """A turn waiting for an approval through ``how``: ``restart`` (``agentsctl
    daemon restart`` of ``daemon``) or ``sigkill`` (of a daemon of ``daemons``,
    then the next one, ``crash_policy = "reattach"``); answered after it. The
    journal."""
    if how == "restart":
        with Client(daemon.socket, timeout_s=CALL_TIMEOUT_S) as client:
            session_id = create(client)
        pending = ask(daemon.socket, session_id, "Run it", deadline)
        restart_in_place(daemon)
        return answer_after_the_takeover(daemon.socket, pending, decision, deadline)
    with daemons() as first:
        with Client(first.socket, timeout_s=CALL_TIMEOUT_S) as client:
            session_id = create(client)
        pending = ask(first.socket, session_id, "Run it", deadline)
        sigkill(first)
    with daemons() as second:
        events = answer_after_the_takeover(second.socket, pending, decision, deadline)
        with Client(second.socket, timeout_s=CALL_TIMEOUT_S) as client:
            client.call("agentSession.close", {"sessionId": session_id})
    return events
