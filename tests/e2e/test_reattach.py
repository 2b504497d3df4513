"""Reattach (issue 19): with ``holder = true`` and the default ``crash_policy =
"reattach"``, a daemon SIGKILLed mid-turn takes nothing with it. The next daemon
takes over the same agent process under fence + 1: the turn completes, what the
agent wrote while no daemon read it is journaled in order, a subscriber that comes
back from its last seq ends with exactly the streamed text (no seq gap or
duplicate, no text doubled or lost), and a pending approval answered after the
takeover reaches the agent once."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from agentsd.procfs import read_proc_info
from tests.daemon_process import running_daemon
from tests.e2e.test_holder import containment, holder_config
from tests.e2e.test_sessions import (
    DATABASE_NAME,
    Rpc,
    assert_contiguous,
    create,
    db_rows,
    history,
    kill_carriers,
    open_rpc,
    temp_dir,
    token_carriers,
)
from tests.polling import eventually

TIMEOUT_S = 120.0
# A reply streamed in 80 pieces a tenth of a second apart: the daemon is killed a
# few pieces in, and the turn is still streaming when the next daemon takes over.
REPLY = " ".join(f"word{i:03d}" for i in range(240))
SLOW = {"chunks": 80, "chunkDelayS": 0.1, "replyText": REPLY}
CRASH_AFTER_DELTAS = 5
# Both daemons of a test in one containment: in the cgroup pass (AGENTSD_TEST_CGROUP=1)
# one cgroup root shared by both, which each would otherwise make and empty for itself.
SHARED = "process-group"


def _events(rpc: Rpc) -> list[dict[str, Any]]:
    return [p for m, p in rpc.notes if m == "agentSession.event"]


class ItemFollower:
    """What a client shows of one item: snapshots (``item.updated``) and deltas
    placed at their offsets, as the protocol says (``DeltaNotification``). Any
    overlap must agree: text doubled fails here, text lost fails the final
    comparison. A delta past the known text would be dropped (the next snapshot
    fills it in); the daemon hands a subscriber arriving mid-stream the text no
    snapshot has yet (``agentsd.feed`` Rule 5), so ``gaps`` records any, and the
    tests hold it empty."""

    def __init__(self, item_id: str) -> None:
        self.item_id = item_id
        self.text = ""
        self.completed: str | None = None
        self.gaps: list[tuple[int, int]] = []  # (a delta's offset, the length known)

    def feed(self, notes: list[tuple[str, dict[str, Any]]]) -> None:
        for method, params in notes:
            if method == "agentSession.delta" and params["itemId"] == self.item_id:
                self._place(params["offset"], params["text"])
            elif method == "agentSession.event":
                event = params["event"]
                body = event["body"]
                if body.get("itemId") != self.item_id:
                    continue
                if event["kind"] == "item.updated":
                    self._place(0, body["text"])
                elif event["kind"] == "item.completed":
                    self.completed = body["text"]

    def _place(self, offset: int, text: str) -> None:
        if offset > len(self.text):
            self.gaps.append((offset, len(self.text)))
            return  # a gap: the next snapshot fills it
        overlap = self.text[offset : offset + len(text)]
        assert text.startswith(overlap), f"text at {offset} disagrees: {text!r} vs {overlap!r}"
        self.text = self.text[:offset] + text + self.text[offset + len(text) :]


def lease_tokens(state: Path) -> list[str]:
    """The spawn tokens of the state's leases (what its agents carry)."""
    database = state / DATABASE_NAME
    if not database.exists():
        return []
    return [r[0] for r in db_rows(database, "SELECT token FROM leases")]


@contextlib.contextmanager
def held_state(mode: str = SHARED) -> Iterator[tuple[Path, Path, list[str]]]:
    """A scratch directory, its state directory and the daemon arguments for
    ``holder = true`` under ``crash_policy = "reattach"``; whatever still carries a
    lease's token is ended at the end."""
    with temp_dir() as base, holder_config("reattach") as config, containment(mode) as extra:
        state = base / "state"
        try:
            yield base, state, ["--config", str(config), *extra]
        finally:
            kill_carriers(lease_tokens(state))


def _agent_alive(pid: int) -> bool:
    info = read_proc_info(pid)
    return info is not None and not info.is_zombie


@pytest.mark.parametrize("mode", ["process-group", "cgroup"])
async def test_a_turn_streaming_through_a_daemon_sigkill_is_reattached_exactly(mode: str) -> None:
    with trio.fail_after(TIMEOUT_S), held_state(mode) as (base, state, args):
        with running_daemon(state_dir=state, extra_args=args) as first:
            async with open_rpc(first.socket) as rpc, open_rpc(first.socket) as watcher:
                sid = (await create(rpc, base, options=SLOW))["sessionId"]
                await watcher.call("agentSession.subscribe", {"sessionId": sid, "afterSeq": 0})
                await rpc.call("agentSession.send", {"sessionId": sid, "text": "tell me"})
                info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
                pid = info["child"]["pid"]
                fence = info["fence"]
                await eventually(
                    lambda: (
                        sum(m == "agentSession.delta" for m, _ in watcher.notes)
                        >= CRASH_AFTER_DELTAS
                    )
                )
                first.process.send_signal(signal.SIGKILL)
                assert first.wait() == -signal.SIGKILL
                before = list(watcher.notes)
        assert _agent_alive(pid)  # the holder keeps it and its pipes
        seen = [p["seq"] for m, p in before if m == "agentSession.event"]
        assert seen == list(range(1, len(seen) + 1))
        last_seq = seen[-1]
        [item_id] = {p["itemId"] for m, p in before if m == "agentSession.delta"}

        with running_daemon(state_dir=state, extra_args=args) as second:
            async with open_rpc(second.socket) as rpc, open_rpc(second.socket) as watcher:
                status = await rpc.call("daemon.status")
                recovery = status["recovery"]
                assert recovery["reattached"] == 1, recovery
                assert recovery["lost"] == 0 and recovery["turnsCutOff"] == 0, recovery
                assert recovery["sessionsRunning"] == 1, recovery
                assert "1 reattached" in recovery["summary"], recovery
                info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
                assert info["child"]["pid"] == pid  # the same process, never restarted
                assert info["fence"] == fence + 1
                assert info["phase"] == "running"
                await watcher.call(
                    "agentSession.subscribe", {"sessionId": sid, "afterSeq": last_seq}
                )
                await watcher.wait_note(
                    lambda m, p: (
                        m == "agentSession.event" and p["event"]["kind"] == "turn.completed"
                    )
                )
                after = list(watcher.notes)
                journal = await history(rpc, sid)
                # Still the same agent: it serves the next turn too.
                reply = await rpc.call(
                    "agentSession.send", {"sessionId": sid, "text": "echo again"}
                )
                assert reply["dispatch"] == "accepted", reply
                assert _agent_alive(pid)
                await rpc.call("agentSession.close", {"sessionId": sid})

        resumed = [p["seq"] for m, p in after if m == "agentSession.event"]
        assert resumed == list(range(last_seq + 1, last_seq + 1 + len(resumed)))  # no gap, no dup
        assert_contiguous(journal)
        kinds = [e["kind"] for e in journal]
        assert kinds.count("child.reattached") == 1
        assert kinds.count("child.spawned") == 1  # never spawned again
        assert "child.exited" not in kinds[: kinds.index("turn.completed")]
        [reattached] = [e for e in journal if e["kind"] == "child.reattached"]
        assert reattached["body"]["pid"] == pid
        assert reattached["body"]["previousFence"] == fence
        assert reattached["body"]["fromSeq"] >= last_seq
        [done] = [e for e in journal if e["kind"] == "turn.completed"]
        assert done["body"]["outcome"] == "completed"
        assert kinds.count("item.started") == 1
        [completed] = [
            e for e in journal if e["kind"] == "item.completed" and e["body"]["itemId"] == item_id
        ]
        assert completed["body"]["text"] == REPLY
        # Every snapshot in the journal is a prefix of the reply, each longer.
        snapshots = [
            e["body"]["text"]
            for e in journal
            if e["kind"] == "item.updated" and e["body"]["itemId"] == item_id
        ]
        assert snapshots and all(REPLY.startswith(t) for t in snapshots)
        assert [len(t) for t in snapshots] == sorted({len(t) for t in snapshots})
        # What a client shows: the first daemon's stream, then from its last seq on.
        story = [
            (e["seq"], e["kind"], len(e["body"].get("text", "")))
            for e in journal
            if e["seq"] > last_seq - 3
        ]
        notes = [
            (m, p.get("seq"), p.get("offset"), len(p.get("text", "")))
            for m, p in after
            if m == "agentSession.delta" or p["event"]["kind"].startswith("item")
        ]
        follower = ItemFollower(item_id)
        follower.feed(before)
        follower.feed(after)
        assert follower.text == REPLY, (last_seq, story, notes[:20])
        assert follower.gaps == [], (last_seq, story, notes[:20])
        assert follower.completed == REPLY


async def ask_approval(rpc: Rpc, base: Path, **options: Any) -> tuple[str, int, str]:
    """A session whose agent (with mock ``options``) asks an approval: (session id,
    agent pid, approval id)."""
    sid = (await create(rpc, base, options=options))["sessionId"]
    await rpc.call("agentSession.send", {"sessionId": sid, "text": "approve it"})

    async def asked() -> bool:
        info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
        return bool(info["status"] == "attention")

    await eventually(asked)
    info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
    [question] = [e for e in await history(rpc, sid) if e["kind"] == "approval.requested"]
    return sid, int(info["child"]["pid"]), str(question["body"]["approvalId"])


async def test_a_pending_approval_answered_after_the_takeover_reaches_the_agent_once() -> None:
    with trio.fail_after(TIMEOUT_S), held_state() as (base, state, args):
        with running_daemon(state_dir=state, extra_args=args) as first:
            async with open_rpc(first.socket) as rpc:
                sid, pid, approval_id = await ask_approval(rpc, base)
            first.process.send_signal(signal.SIGKILL)
            assert first.wait() == -signal.SIGKILL

        with running_daemon(state_dir=state, extra_args=args) as second:
            async with open_rpc(second.socket) as rpc, open_rpc(second.socket) as watcher:
                info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
                assert info["child"]["pid"] == pid
                assert info["status"] == "attention"  # still pending, still answerable
                head = info["headSeq"]
                await watcher.call("agentSession.subscribe", {"sessionId": sid, "afterSeq": head})
                answer = await rpc.call(
                    "agentSession.respond",
                    {"sessionId": sid, "approvalId": approval_id, "decision": "accept"},
                )
                assert answer["decision"] == "accept"
                again = await rpc.request(
                    "agentSession.respond",
                    {"sessionId": sid, "approvalId": approval_id, "decision": "decline"},
                )
                assert again["error"]["data"]["kind"] == "already_resolved"
                await watcher.wait_note(
                    lambda m, p: (
                        m == "agentSession.event" and p["event"]["kind"] == "turn.completed"
                    )
                )
                journal = await history(rpc, sid)
                await rpc.call("agentSession.close", {"sessionId": sid})
        assert_contiguous(journal)
        kinds = [e["kind"] for e in journal]
        assert "agent.error" not in kinds  # a second answer would be an unknown requestId
        tools = [
            e
            for e in journal
            if e["kind"] == "item.completed" and e["body"].get("type") == "toolCall"
        ]
        assert len(tools) == 1 and tools[0]["body"]["status"] == "completed"
        [resolved] = [e for e in journal if e["kind"] == "approval.resolved"]
        assert resolved["body"]["decision"] == "accept"
        [done] = [e for e in journal if e["kind"] == "turn.completed"]
        assert done["body"]["outcome"] == "completed"


async def test_a_send_in_flight_at_the_crash_is_unknown_after_the_takeover() -> None:
    """A submission journaled but with no dispatch outcome when the daemon died: the
    next daemon cannot know whether its write reached the agent (``unknown``,
    never re-sent), and the agent it took over serves the next send."""
    with trio.fail_after(TIMEOUT_S), held_state() as (base, state, args):
        with running_daemon(state_dir=state, extra_args=args) as first:
            async with open_rpc(first.socket) as rpc:
                # Each prompt is taken 3 s late: the crash lands between the
                # submission's commit and the agent's ack.
                sid = (await create(rpc, base, options={"ackDelayS": 3.0}))["sessionId"]
                await rpc.call("agentSession.start", {"sessionId": sid})
                pid = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]["child"][
                    "pid"
                ]
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        rpc.request,
                        "agentSession.send",
                        {"sessionId": sid, "text": "echo in flight"},
                    )

                    async def journaled() -> bool:
                        return "submission" in [e["kind"] for e in await history(rpc, sid)]

                    await eventually(journaled)
                    first.process.send_signal(signal.SIGKILL)
                    assert first.wait() == -signal.SIGKILL
                    nursery.cancel_scope.cancel()

        with running_daemon(state_dir=state, extra_args=args) as second:
            async with open_rpc(second.socket) as rpc:
                info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
                assert info["child"]["pid"] == pid
                journal = await history(rpc, sid)
                [dispatched] = [e for e in journal if e["kind"] == "submission.dispatched"]
                assert dispatched["body"]["outcome"] == "unknown"
                assert dispatched["body"]["reason"] == "daemon-restart"
                kinds = [e["kind"] for e in journal]
                assert kinds.index("child.reattached") < kinds.index("submission.dispatched")
                await rpc.call("agentSession.close", {"sessionId": sid})


async def test_an_idle_agent_is_reattached_without_reading_its_handshake_again() -> None:
    """Killed before any event of its own after ``child.ready``: the takeover reads
    on after the handshake's lines (no ``initialized`` frame taken for output), and
    the agent serves the next turn."""
    with trio.fail_after(TIMEOUT_S), held_state() as (base, state, args):
        with running_daemon(state_dir=state, extra_args=args) as first:
            async with open_rpc(first.socket) as rpc:
                sid = (await create(rpc, base))["sessionId"]
                started = await rpc.call("agentSession.start", {"sessionId": sid})
                pid = started["session"]["child"]["pid"]
            first.process.send_signal(signal.SIGKILL)
            assert first.wait() == -signal.SIGKILL

        with running_daemon(state_dir=state, extra_args=args) as second:
            async with open_rpc(second.socket) as rpc:
                info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
                assert info["child"]["pid"] == pid
                assert info["status"] == "idle"
                reply = await rpc.call(
                    "agentSession.send", {"sessionId": sid, "text": "echo still here"}
                )
                assert reply["dispatch"] == "accepted", reply
                await eventually(lambda: _turn_done(rpc, sid))
                journal = await history(rpc, sid)
                await rpc.call("agentSession.close", {"sessionId": sid})
        kinds = [e["kind"] for e in journal]
        assert "agent.error" not in kinds, journal
        assert kinds.count("child.ready") == 1 and kinds.count("child.reattached") == 1
        texts = [
            e["body"]["text"]
            for e in journal
            if e["kind"] == "item.completed" and e["body"].get("type") == "agentMessage"
        ]
        assert texts == ["still here"]


async def _turn_done(rpc: Rpc, sid: str) -> bool:
    info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
    return bool(info["status"] == "idle")


async def test_agents_whose_holder_died_too_are_ended_and_their_sessions_settle() -> None:
    """The daemon and then the holder are SIGKILLed: nothing can be taken over (no
    holder has the agents' pipes), so the next daemon ends the agents by their
    recorded identity, proves them gone and settles their sessions, as without the
    holder."""
    with trio.fail_after(TIMEOUT_S), held_state() as (base, state, args):
        with running_daemon(state_dir=state, extra_args=args) as first:
            async with open_rpc(first.socket) as rpc:
                sids = []
                for options in (
                    {"ignoreEof": True},
                    {"ignoreEof": True, "ignoreSigterm": True},
                ):
                    sid = (await create(rpc, base, options=options))["sessionId"]
                    await rpc.call("agentSession.start", {"sessionId": sid})
                    sids.append(sid)
                pid = (await rpc.call("agentSession.get", {"sessionId": sids[0]}))["session"][
                    "child"
                ]["pid"]
                info = read_proc_info(pid)
                assert info is not None
                holder = info.ppid
                tokens = lease_tokens(state)
            first.process.send_signal(signal.SIGKILL)
            assert first.wait() == -signal.SIGKILL
        os.kill(holder, signal.SIGKILL)
        await eventually(lambda: not _agent_alive(holder))
        assert len(token_carriers(tokens)) == 2  # they ignore the end of their input

        with running_daemon(state_dir=state, extra_args=args) as second:
            assert token_carriers(tokens) == []  # ended before anything was served
            async with open_rpc(second.socket) as rpc:
                recovery = (await rpc.call("daemon.status"))["recovery"]
                assert recovery["reattached"] == 0, recovery
                assert recovery["sessionsRecovered"] == 2 and recovery["unproven"] == 0
                for sid in sids:
                    info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
                    assert info["phase"] == "stopped"
                    events = await history(rpc, sid)
                    assert_contiguous(events)
                    [exited] = [e for e in events if e["kind"] == "child.exited"]
                    assert exited["body"]["cause"] == "daemon-restart"
                    assert "child.reattached" not in [e["kind"] for e in events]
