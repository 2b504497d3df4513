"""Conversations over the real socket: sends, approvals, interrupts, subscriptions,
history and watch, with real mock agents and a real daemon (killed where a crash is
the point).

Named after DESIGN.md section 2 where an invariant applies: acknowledged means
durable (6), idempotent mutations (7), nothing blocks the daemon (8). Every test runs
under an outer ``trio.fail_after``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.daemon_process import DaemonProcess, running_daemon
from tests.e2e.test_sessions import (
    DATABASE_NAME,
    SHORT_LADDER,
    TEST_TIMEOUT_S,
    CallFailed,
    Rpc,
    assert_contiguous,
    create,
    db_rows,
    gather,
    history,
    kill_carriers,
    kinds,
    ladder_config,
    open_rpc,
    temp_dir,
)
from tests.polling import eventually

# A turn that streams for a while: long enough to act on while it runs.
SLOW_TURN = {"replyText": "x" * 200, "chunks": 200, "chunkDelayS": 0.05}


# The mock waits this long before taking a prompt: the window in which a client that
# sent one can leave before its answer (it leaves as soon as the submission is
# journaled; the window only has to outlast that).
ACK_DELAY_S = 5.0


async def wait_journal(
    rpc: Rpc, sid: str, kind: str, count: int = 1, timeout_s: float = 20.0
) -> list[dict[str, Any]]:
    """Poll the journal until it holds ``count`` events of ``kind``; the journal."""
    events: list[dict[str, Any]] = []

    async def enough() -> bool:
        nonlocal events
        events = await history(rpc, sid)
        return kinds(events).count(kind) >= count

    await eventually(enough, timeout_s=timeout_s)
    return events


async def get(rpc: Rpc, sid: str) -> dict[str, Any]:
    info: dict[str, Any] = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
    return info


def _has_status(rpc: Rpc, sid: str, status: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return bool((await get(rpc, sid))["status"] == status)

    return check


def conversation_file(daemon_state: Path, handle: str) -> list[dict[str, Any]]:
    """The mock agent's own record of the conversation (written at each turn's end)."""
    path = daemon_state / "mock" / f"{handle}.json"
    if not path.exists():
        return []
    messages: list[dict[str, Any]] = json.loads(path.read_text())["messages"]
    return messages


def user_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["text"] for m in messages if m["role"] == "user"]


def of_message(events: list[dict[str, Any]], kind: str, cmid: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind and e["body"].get("clientMessageId") == cmid]


# ---- approvals ---------------------------------------------------------------------


async def test_two_clients_answer_one_approval_exactly_one_wins(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as a, open_rpc(daemon.socket) as b:
            sid = (await create(a, tmp_path))["sessionId"]
            for round_ in range(6):
                await a.call("agentSession.send", {"sessionId": sid, "text": "please approve"})
                events = await wait_journal(a, sid, "approval.requested", round_ + 1)
                approval_id = [e for e in events if e["kind"] == "approval.requested"][-1]["body"][
                    "approvalId"
                ]
                await eventually(_has_status(a, sid, "attention"))
                # Alternate who says what, so both decisions win some rounds.
                decisions = ("accept", "decline") if round_ % 2 else ("decline", "accept")

                replies = await gather(
                    *(
                        partial(
                            rpc.request,
                            "agentSession.respond",
                            {"sessionId": sid, "approvalId": approval_id, "decision": decision},
                        )
                        for rpc, decision in zip((a, b), decisions, strict=True)
                    )
                )
                won = [r for r in replies if "result" in r]
                lost = [r for r in replies if "error" in r]
                assert len(won) == 1 and len(lost) == 1, replies
                winner = won[0]["result"]["decision"]
                error = lost[0]["error"]
                assert error["data"]["kind"] == "already_resolved"
                assert error["data"]["winner"] == {
                    "approvalId": approval_id,
                    "decision": winner,
                    "by": "client",
                }

                events = await wait_journal(a, sid, "turn.completed", round_ + 1)
                resolved = [
                    e["body"]
                    for e in events
                    if e["kind"] == "approval.resolved" and e["body"]["approvalId"] == approval_id
                ]
                assert resolved == [{"approvalId": approval_id, "decision": winner, "by": "client"}]
                tools = [
                    e["body"]
                    for e in events
                    if e["kind"] == "item.completed" and e["body"]["type"] == "toolCall"
                ]
                assert tools[-1]["status"] == ("completed" if winner == "accept" else "declined")
                assert len(tools) == round_ + 1  # the agent acted on exactly one answer
                # A late answer still gets the winner, from the journal.
                with pytest.raises(CallFailed) as late:
                    await b.call(
                        "agentSession.respond",
                        {"sessionId": sid, "approvalId": approval_id, "decision": "accept"},
                    )
                assert late.value.kind == "already_resolved"
                assert late.value.data["winner"]["decision"] == winner
            # The agent never saw a second answer (it would report an unknown requestId).
            assert "agent.error" not in kinds(await history(a, sid))
            assert_contiguous(await history(a, sid))
            await a.call("agentSession.close", {"sessionId": sid})


# ---- invariant 6: acknowledged means durable; an unknown send is never re-sent ------


async def test_acknowledged_means_durable_a_send_cut_by_a_crash_is_unknown_never_resent(
    tmp_path: Path,
) -> None:
    """SIGKILL the daemon after a send's ``submission`` committed and before the agent
    took it (the mock waits ``ackDelayS`` before taking a prompt). After the restart
    the submission is ``unknown`` and was not re-sent; ``retryUnknown`` with the same
    ``clientOperationId`` delivers it exactly once. Without the holder (``holder =
    false``): the SIGKILL ends the agent before it took the prompt."""
    tokens: list[str] = []
    op = "send-cut-by-a-crash"
    text = "echo delivered after the crash"
    with (
        trio.fail_after(120),
        temp_dir() as base,
        ladder_config(*SHORT_LADDER, holder=False) as config,
    ):
        state = base / "state"
        args = ["--config", str(config)]
        db = state / DATABASE_NAME
        try:
            with running_daemon(state_dir=state, extra_args=args) as first:
                async with open_rpc(first.socket) as rpc:
                    info = await create(rpc, tmp_path)
                    sid, handle = info["sessionId"], info["providerHandle"]
                    first_send = await rpc.call(
                        "agentSession.send", {"sessionId": sid, "text": "echo before"}
                    )
                    assert first_send["dispatch"] == "accepted"
                    await wait_journal(rpc, sid, "turn.completed")
                    await rpc.call(
                        "agentSession.setOptions", {"sessionId": sid, "options": {"ackDelayS": 60}}
                    )
                    await rpc.call("agentSession.close", {"sessionId": sid})
                    await rpc.call("agentSession.start", {"sessionId": sid})
                    tokens = [r[0] for r in db_rows(db, "SELECT token FROM leases")]

                    async def send_in_flight() -> None:
                        with contextlib.suppress(AssertionError):  # the daemon dies first
                            await rpc.call(
                                "agentSession.send",
                                {"sessionId": sid, "text": text, "clientOperationId": op},
                            )
                        raise AssertionError("the send was answered before the crash")

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(send_in_flight)
                        await eventually(lambda: _submitted(db, sid, text))
                        first.process.send_signal(signal.SIGKILL)
                        assert first.wait() == -signal.SIGKILL
                        nursery.cancel_scope.cancel()
            assert conversation_file(state, handle) and text not in user_texts(
                conversation_file(state, handle)
            )

            with running_daemon(state_dir=state, extra_args=args) as second:
                async with open_rpc(second.socket) as rpc:
                    events = await history(rpc, sid)
                    assert_contiguous(events)
                    (submission,) = [
                        e for e in events if e["kind"] == "submission" and e["body"]["text"] == text
                    ]
                    cmid = submission["body"]["clientMessageId"]
                    assert submission["body"]["operationId"] == op
                    outcomes = [
                        e["body"] for e in of_message(events, "submission.dispatched", cmid)
                    ]
                    assert outcomes == [
                        {"clientMessageId": cmid, "outcome": "unknown", "reason": "daemon-restart"}
                    ]
                    assert (await get(rpc, sid))["status"] == "idle"
                    # A plain retry replays the recorded answer: unknown, nothing re-sent.
                    send = {"sessionId": sid, "text": text, "clientOperationId": op}
                    replay = await rpc.call("agentSession.send", send)
                    assert replay["clientMessageId"] == cmid
                    assert replay["seq"] == submission["seq"]
                    assert replay["dispatch"] == "unknown"
                    assert (
                        of_message(await history(rpc, sid), "submission.dispatched", cmid)
                        == [e for e in events if e["kind"] == "submission.dispatched"][-1:]
                    )
                    # Same id, other text: a conflict, even for a retry.
                    with pytest.raises(CallFailed) as conflict:
                        await rpc.call(
                            "agentSession.send", {**send, "text": "other", "retryUnknown": True}
                        )
                    assert conflict.value.kind == "operation_conflict"

                    # The agent never saw it: start it (it resumes its conversation) and look.
                    await rpc.call("agentSession.setOptions", {"sessionId": sid, "options": {}})
                    retried = await rpc.call("agentSession.send", {**send, "retryUnknown": True})
                    assert retried["dispatch"] == "accepted"
                    assert retried["clientMessageId"] == cmid
                    events = await wait_journal(rpc, sid, "turn.completed", 2)
                    texts = [e["body"]["text"] for e in events if e["kind"] == "item.completed"]
                    assert texts[-1] == "delivered after the crash"
                    # Once the outcome is known, a retry never re-sends.
                    again = await rpc.call("agentSession.send", {**send, "retryUnknown": True})
                    assert again["dispatch"] == "accepted"
                    assert again["reason"] == "not re-sent: the outcome is known"
                    replay = await rpc.call("agentSession.send", send)
                    assert replay["dispatch"] == "accepted"

                    await rpc.call("agentSession.close", {"sessionId": sid})
                    events = await history(rpc, sid)
                    assert_contiguous(events)
                    assert len([e for e in events if e["kind"] == "submission"]) == 2
                    outcomes = [
                        e["body"]["outcome"]
                        for e in of_message(events, "submission.dispatched", cmid)
                    ]
                    assert outcomes == ["unknown", "accepted"]
                    assert user_texts(conversation_file(state, handle)) == ["echo before", text]
        finally:
            kill_carriers(tokens)


def _submitted(db: Path, session_id: str, text: str) -> bool:
    try:
        rows = db_rows(
            db, "SELECT body FROM events WHERE session_id = ? AND kind = 'submission'", session_id
        )
    except sqlite3.OperationalError:
        return False  # busy: the writer is checkpointing
    return any(json.loads(body)["text"] == text for (body,) in rows)


# ---- invariant 7: idempotent sends ------------------------------------------------------


async def test_idempotent_mutations_a_send_repeated_after_reconnecting_is_one_submission(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            info = await create(rpc, tmp_path, options={"ackDelayS": ACK_DELAY_S})
            sid, handle = info["sessionId"], info["providerHandle"]
        send = {"sessionId": sid, "text": "echo once", "clientOperationId": "op-once"}

        # The client goes away while its send is in flight (journaled, its answer
        # not yet given), then retries on a new connection, twice at once: one
        # submission, one answer for all.
        async with open_rpc(daemon.socket) as rpc, open_rpc(daemon.socket) as watcher:
            with trio.CancelScope() as leaving:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(rpc.call, "agentSession.send", send)
                    await wait_journal(watcher, sid, "submission")
                    leaving.cancel()
            assert leaving.cancelled_caught  # the send was still unanswered: window hit
        async with open_rpc(daemon.socket) as a, open_rpc(daemon.socket) as b:
            first, second = await gather(
                lambda: a.call("agentSession.send", send), lambda: b.call("agentSession.send", send)
            )
            assert first == second
            assert first["dispatch"] == "accepted"
            third = await a.call("agentSession.send", send)
            assert third["clientMessageId"] == first["clientMessageId"]
            with pytest.raises(CallFailed) as conflict:
                await a.call("agentSession.send", {**send, "text": "echo twice"})
            assert conflict.value.kind == "operation_conflict"
            assert conflict.value.code == -32004

            events = await wait_journal(a, sid, "turn.completed")
            assert [e["body"]["text"] for e in events if e["kind"] == "submission"] == ["echo once"]
            await a.call("agentSession.close", {"sessionId": sid})
            assert user_texts(conversation_file(daemon.state_dir, handle)) == ["echo once"]


# ---- interrupt ----------------------------------------------------------------------


async def test_interrupt_says_when_nothing_runs_and_a_replay_never_interrupts_twice(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            sid = (await create(rpc, tmp_path, start=False, options=SLOW_TURN))["sessionId"]
            result = await rpc.call("agentSession.interrupt", {"sessionId": sid})
            assert result == {"interrupted": False, "reason": "no agent is running", "seq": None}
            await rpc.call("agentSession.start", {"sessionId": sid})
            result = await rpc.call("agentSession.interrupt", {"sessionId": sid})
            assert result == {"interrupted": False, "reason": "no turn is running", "seq": None}

            sent = await rpc.call("agentSession.send", {"sessionId": sid, "text": "go"})
            turn = sent["turnId"]
            result = await rpc.call(
                "agentSession.interrupt", {"sessionId": sid, "turnId": "no-such-turn"}
            )
            assert result["interrupted"] is False and "not the running turn" in result["reason"]
            interrupt = {"sessionId": sid, "clientOperationId": "op-interrupt"}
            first = await rpc.call("agentSession.interrupt", interrupt)
            assert first == {"interrupted": True, "reason": None, "seq": first["seq"]}
            events = await wait_journal(rpc, sid, "turn.completed")
            # The reply names its own evidence: the interrupt.requested at its seq.
            [requested] = [e for e in events if e["seq"] == first["seq"]]
            assert requested["kind"] == "interrupt.requested"
            assert requested["body"]["turnId"] == turn
            completed = [e["body"] for e in events if e["kind"] == "turn.completed"]
            assert completed == [{"turnId": turn, "outcome": "interrupted"}]

            # A new turn runs; the replayed interrupt answers as before and leaves it be.
            second_turn = (await rpc.call("agentSession.send", {"sessionId": sid, "text": "go"}))[
                "turnId"
            ]
            assert second_turn != turn
            assert await rpc.call("agentSession.interrupt", interrupt) == first
            assert (await get(rpc, sid))["status"] == "working"
            events = await history(rpc, sid)
            assert kinds(events).count("interrupt.requested") == 1
            assert kinds(events).count("turn.completed") == 1
            await rpc.call("agentSession.close", {"sessionId": sid})
            events = await history(rpc, sid)
            assert kinds(events).count("interrupt.requested") == 1
            completed = [e["body"] for e in events if e["kind"] == "turn.completed"]
            assert completed[-1] == {
                "turnId": second_turn,
                "outcome": "interrupted",
                "reason": "requested",
            }


# ---- invariant 8: a subscriber that does not read is dropped, nobody waits -----------

FLOOD_TURNS = 6
FLOOD_DELTAS = 3000  # per turn: less than a reading subscriber's buffers hold, in total more


async def test_nothing_blocks_the_daemon_a_subscriber_that_never_reads_lags_and_resumes(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Each turn floods ``FLOOD_DELTAS`` deltas. Two subscribers read and see every
    turn; one never reads and is dropped with ``lagged``; the session never waits
    for it. Resubscribing from ``resumeAfterSeq`` it catches up to the same text."""
    with trio.fail_after(TEST_TIMEOUT_S):
        async with contextlib.AsyncExitStack() as stack:
            rpc = await stack.enter_async_context(open_rpc(daemon.socket))
            sid = (await create(rpc, tmp_path, options={"floodStdout": FLOOD_DELTAS}))["sessionId"]
            readers = [await stack.enter_async_context(open_rpc(daemon.socket)) for _ in range(2)]
            for reader in readers:
                await reader.call("agentSession.subscribe", {"sessionId": sid, "afterSeq": 0})
            # The sleeper subscribes, then reads nothing until every turn has ended.
            sleeper_stream = await trio.open_unix_socket(str(daemon.socket))
            stack.push_async_callback(sleeper_stream.aclose)
            await sleeper_stream.send_all(_subscribe_frame(sid, after_seq=0))
            for turn in range(FLOOD_TURNS):
                await rpc.call("agentSession.send", {"sessionId": sid, "text": f"echo turn {turn}"})
                for reader in readers:
                    at = await reader.wait_note(partial(_lagged_or_completes, turn=turn))
                    assert reader.notes[at][0] != "agentSession.lagged", (turn, len(reader.notes))
            for reader in readers:
                assert "agentSession.lagged" not in {m for m, _ in reader.notes}
                assert _event_seqs(reader) == list(range(1, _event_seqs(reader)[-1] + 1))
                assert sum(1 for m, _ in reader.notes if m == "agentSession.delta") >= (
                    FLOOD_TURNS * FLOOD_DELTAS
                )
            expected = _final_texts(readers[0])
            assert _final_texts(readers[1]) == expected
            assert len(expected) == FLOOD_TURNS

            sleeper = Rpc(sleeper_stream)
            sleeper._next_id = 1  # its subscribe went out by hand
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sleeper.run_reader)
                lagged_at = await sleeper.wait_note(lambda m, p: m == "agentSession.lagged")
                resume = sleeper.notes[lagged_at][1]["resumeAfterSeq"]
                before = _event_seqs(sleeper)
                assert before == list(range(1, resume + 1))
                assert not [m for m, _ in sleeper.notes[lagged_at + 1 :]]  # dropped: silence
                await sleeper.call("agentSession.subscribe", {"sessionId": sid, "afterSeq": resume})
                await sleeper.wait_note(
                    lambda m, p: _completes_turn(m, p, FLOOD_TURNS - 1), start=lagged_at
                )
                assert _event_seqs(sleeper) == _event_seqs(readers[0])  # each once, in order
                assert _final_texts(sleeper) == expected
                nursery.cancel_scope.cancel()
            await rpc.call("agentSession.close", {"sessionId": sid})


def _subscribe_frame(sid: str, after_seq: int) -> bytes:
    """``agentSession.subscribe`` (id 1) for a client that will not read its reply."""
    params = {"sessionId": sid, "afterSeq": after_seq}
    request = {"jsonrpc": "2.0", "id": 1, "method": "agentSession.subscribe", "params": params}
    return json.dumps(request).encode() + b"\n"


def _lagged_or_completes(method: str, params: dict[str, Any], turn: int) -> bool:
    return method == "agentSession.lagged" or _completes_turn(method, params, turn)


def _completes_turn(method: str, params: dict[str, Any], turn: int) -> bool:
    if method != "agentSession.event":
        return False
    event = params["event"]
    return bool(event["kind"] == "turn.completed" and event["body"]["turnId"] == f"t{turn + 1}")


def _event_seqs(rpc: Rpc) -> list[int]:
    return [p["seq"] for m, p in rpc.notes if m == "agentSession.event"]


def _final_texts(rpc: Rpc) -> list[str]:
    return [
        p["event"]["body"]["text"]
        for m, p in rpc.notes
        if m == "agentSession.event" and p["event"]["kind"] == "item.completed"
    ]


# ---- invariant 8: a flooding agent and a slow journal -------------------------------


@contextlib.contextmanager
def slow_journal(db: Path, hold_s: float, gap_s: float) -> Iterator[None]:
    """Make the daemon's journal slow, as a stalling disk would: another connection
    takes the database's write lock for ``hold_s`` at a time (below the daemon's
    busy timeout, so its writes wait rather than fail), with ``gap_s`` between."""
    stop = threading.Event()

    def hog() -> None:
        conn = sqlite3.connect(db, timeout=10.0, isolation_level=None)
        try:
            while not stop.is_set():
                conn.execute("BEGIN IMMEDIATE")
                stop.wait(hold_s)
                conn.execute("ROLLBACK")
                if stop.wait(gap_s):
                    return
        finally:
            conn.close()

    thread = threading.Thread(target=hog, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=15)


def vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


FLOOD = 60_000
# Generous (a few MiB are measured), yet below what queueing the flood for the
# subscriber that never reads would take (~60 bytes of text, ~200 of frame, and
# the Python objects around them, per delta).
RSS_GROWTH_BOUND_KIB = 24 * 1024


async def test_nothing_blocks_the_daemon_a_flood_with_a_slow_journal_stays_bounded(
    tmp_path: Path,
) -> None:
    reply = "the end of a long answer"
    with trio.fail_after(90), running_daemon() as daemon:
        pid = daemon.process.pid
        db = daemon.state_dir / DATABASE_NAME
        async with (
            open_rpc(daemon.socket) as rpc,
            open_rpc(daemon.socket, keep_deltas=False) as follower,
        ):
            options = {"floodStdout": FLOOD, "replyText": reply}
            sid = (await create(rpc, tmp_path, options=options))["sessionId"]
            await follower.call("agentSession.subscribe", {"sessionId": sid, "afterSeq": 0})
            sleeper = await trio.open_unix_socket(str(daemon.socket))
            await sleeper.send_all(_subscribe_frame(sid, after_seq=0))
            before = vm_rss_kib(pid)
            peak = before
            with slow_journal(db, hold_s=0.2, gap_s=0.1):
                sent = await rpc.call("agentSession.send", {"sessionId": sid, "text": "flood"})
                assert sent["dispatch"] == "accepted"

                async def done() -> bool:
                    nonlocal peak
                    peak = max(peak, vm_rss_kib(pid))
                    return bool((await get(rpc, sid))["status"] == "idle")

                await eventually(done, timeout_s=60)
            growth = peak - before
            assert growth < RSS_GROWTH_BOUND_KIB, f"daemon RSS grew by {growth} KiB"

            events = await history(rpc, sid)
            assert_contiguous(events)
            (final,) = [e["body"] for e in events if e["kind"] == "item.completed"]
            assert final["text"] == "." * FLOOD + reply
            snapshots = [e["body"]["text"] for e in events if e["kind"] == "item.updated"]
            assert snapshots, "streamed text never reached the journal"
            assert all(final["text"].startswith(s) for s in snapshots)
            # The follower may have lagged (deltas are ephemeral), never lost an event.
            seqs = _event_seqs(follower)
            assert seqs == list(range(1, len(seqs) + 1))
            await sleeper.aclose()
            await rpc.call("agentSession.close", {"sessionId": sid})


# ---- history paging ------------------------------------------------------------------


async def test_history_pages_by_seq_and_by_bytes(daemon: DaemonProcess, tmp_path: Path) -> None:
    big = "b" * (600 * 1024)  # two of these do not fit one 1 MiB page
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            sid = (await create(rpc, tmp_path))["sessionId"]
            for i, text in enumerate(["echo 0", "echo 1", "echo 2", big, big]):
                await rpc.call("agentSession.send", {"sessionId": sid, "text": text})
                await wait_journal(rpc, sid, "turn.completed", i + 1)  # no steering
            await rpc.call("agentSession.close", {"sessionId": sid})
            everything = await history(rpc, sid)
            head = len(everything)
            assert_contiguous(everything)

            async def page(**params: Any) -> dict[str, Any]:
                result: dict[str, Any] = await rpc.call(
                    "agentSession.history", {"sessionId": sid, **params}
                )
                assert result["headSeq"] == head
                return result

            default = await page()
            assert [e["seq"] for e in default["events"]][:5] == [1, 2, 3, 4, 5]
            # Forward by afterSeq, five at a time.
            seqs: list[int] = []
            after = 0
            while True:
                result = await page(afterSeq=after, limit=5)
                batch = [e["seq"] for e in result["events"]]
                assert batch and len(batch) <= 5
                seqs.extend(batch)
                if not result["hasMore"]:
                    break
                after = batch[-1]
            assert seqs == list(range(1, head + 1))
            # Backward by beforeSeq: the nearest events before it, in ascending order.
            result = await page(beforeSeq=head + 1, limit=4)
            assert [e["seq"] for e in result["events"]] == list(range(head - 3, head + 1))
            assert result["hasMore"] is True
            result = await page(beforeSeq=3, limit=10)
            assert [e["seq"] for e in result["events"]] == [1, 2]
            assert result["hasMore"] is False
            result = await page(afterSeq=head)
            assert result == {"events": [], "hasMore": False, "headSeq": head}
            # The byte bound: the two big submissions never share a page.
            bigs = [e["seq"] for e in everything if e["body"].get("text") == big]
            result = await page(afterSeq=bigs[0] - 1, limit=1000)
            assert result["events"][0]["seq"] == bigs[0]
            assert bigs[1] not in [e["seq"] for e in result["events"]]
            assert result["hasMore"] is True

            for params in (
                {"afterSeq": 1, "beforeSeq": 5},
                {"limit": 0},
                {"limit": 1001},
                {"afterSeq": -1},
                {"beforeSeq": -1},
            ):
                with pytest.raises(CallFailed) as failed:
                    await page(**params)
                assert failed.value.code == -32602, params


# ---- watch -------------------------------------------------------------------------


async def test_watch_reports_phase_and_status_changes_including_attention(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc, open_rpc(daemon.socket) as watcher:
            known = (await create(rpc, tmp_path, start=False))["sessionId"]
            watch = await watcher.call("agentSession.watch", {})
            assert known in {s["sessionId"] for s in watch["sessions"]}
            sid = (await create(rpc, tmp_path, title="watched"))["sessionId"]
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "please approve"})
            await watcher.wait_note(lambda m, p: _status_of(p, sid) == ("running", "attention"))
            requested = [e for e in await history(rpc, sid) if e["kind"] == "approval.requested"]
            approval_id = requested[0]["body"]["approvalId"]
            await rpc.call(
                "agentSession.respond",
                {"sessionId": sid, "approvalId": approval_id, "decision": "accept"},
            )
            await wait_journal(rpc, sid, "turn.completed")
            await rpc.call("agentSession.delete", {"sessionId": sid})
            await watcher.wait_note(lambda m, p: p["session"]["sessionId"] == sid and p["deleted"])

            seen = [
                _status_of(p, sid)
                for m, p in watcher.notes
                if m == "agentSession.status" and p["session"]["sessionId"] == sid
            ]
            assert all(p["watchId"] == watch["watchId"] for _, p in watcher.notes)
            expected = [
                ("starting", "idle"),
                ("running", "idle"),
                ("running", "attention"),
                ("running", "idle"),
                ("stopped", "idle"),
            ]
            assert _is_subsequence(expected, seen), seen
            assert seen[-1] == ("deleted", "")
            # Each notification is a change: no two in a row say the same.
            assert all(a != b for a, b in itertools.pairwise(seen)), seen
            last = [p for m, p in watcher.notes if p["session"]["sessionId"] == sid][-2]
            assert last["session"]["title"] == "watched"
            assert last["session"]["provider"] == "mock"


def _status_of(params: dict[str, Any], sid: str) -> tuple[str, str] | None:
    session = params["session"]
    if session["sessionId"] != sid:
        return None
    if params.get("deleted"):
        return ("deleted", "")
    return (session["phase"], session["status"])


def _is_subsequence(wanted: list[Any], seen: list[Any]) -> bool:
    it = iter(seen)
    return all(any(w == s for s in it) for w in wanted)
