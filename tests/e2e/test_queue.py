"""Delivery modes and the prompt queue over the real socket, with real mock agents
and a real daemon (killed where a crash is the point): a queued prompt waits for the
running turn, survives a SIGKILL paused, has one fate when clients race on it, and an
interrupt returns it to the user's control. Every test runs under an outer
``trio.fail_after``."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import trio

from tests.daemon_process import DaemonProcess, running_daemon
from tests.e2e.test_conversation import (
    SLOW_TURN,
    conversation_file,
    get,
    user_texts,
    wait_journal,
)
from tests.e2e.test_sessions import (
    DATABASE_NAME,
    SHORT_LADDER,
    TEST_TIMEOUT_S,
    CallFailed,
    Rpc,
    assert_contiguous,
    create,
    db_rows,
    history,
    kill_carriers,
    kinds,
    ladder_config,
    open_rpc,
    temp_dir,
)


async def queue(rpc: Rpc, sid: str, text: str) -> dict[str, Any]:
    result: dict[str, Any] = await rpc.call(
        "agentSession.send", {"sessionId": sid, "text": text, "delivery": "queue"}
    )
    return result


def seq_of(events: list[dict[str, Any]], kind: str, **body: Any) -> int:
    (seq,) = [
        e["seq"]
        for e in events
        if e["kind"] == kind and all(e["body"].get(k) == v for k, v in body.items())
    ]
    return int(seq)


async def test_a_queued_prompt_is_sent_only_after_the_running_turn_ended(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            info = await create(rpc, tmp_path, options={**SLOW_TURN, "chunks": 20})
            sid = info["sessionId"]
            running = await rpc.call("agentSession.send", {"sessionId": sid, "text": "go"})
            first = await queue(rpc, sid, "echo one")
            second = await queue(rpc, sid, "echo two")
            assert first["queued"] and second["queued"]
            assert first["dispatch"] == "unknown"
            listed = await rpc.call("agentSession.queue", {"sessionId": sid})
            assert [p["text"] for p in listed["prompts"]] == ["echo one", "echo two"]
            assert (await get(rpc, sid))["queued"] == 2

            events = await wait_journal(rpc, sid, "turn.completed", 3)
            ended = seq_of(events, "turn.completed", turnId=running["turnId"])
            one = seq_of(events, "submission", clientMessageId=first["clientMessageId"])
            two = seq_of(events, "submission", clientMessageId=second["clientMessageId"])
            assert ended < one < two
            completions = [e["seq"] for e in events if e["kind"] == "turn.completed"]
            assert completions[1] < two  # one turn each, in order
            assert (await get(rpc, sid))["queued"] == 0
            # Queued while idle with an empty queue: sent at once, like a steer.
            now = await queue(rpc, sid, "echo idle")
            assert not now["queued"] and now["dispatch"] == "accepted"
            await wait_journal(rpc, sid, "turn.completed", 4)
            await rpc.call("agentSession.close", {"sessionId": sid})
            assert user_texts(conversation_file(daemon.state_dir, info["providerHandle"])) == [
                "go",
                "echo one",
                "echo two",
                "echo idle",
            ]


async def test_queued_prompts_survive_a_daemon_sigkill_and_stay_paused(tmp_path: Path) -> None:
    """Without the holder (``holder = false``): the SIGKILL ends the agent, so the
    next daemon keeps the queue paused until the user resumes it."""
    tokens: list[str] = []
    no_holder = ladder_config(*SHORT_LADDER, holder=False)
    with trio.fail_after(120), temp_dir() as base, no_holder as config:
        state = base / "state"
        args = ["--config", str(config)]
        try:
            with running_daemon(state_dir=state, extra_args=args) as first:
                async with open_rpc(first.socket) as rpc:
                    info = await create(rpc, tmp_path, options=SLOW_TURN)
                    sid, handle = info["sessionId"], info["providerHandle"]
                    await rpc.call("agentSession.send", {"sessionId": sid, "text": "go"})
                    await queue(rpc, sid, "echo one")
                    await queue(rpc, sid, "echo two")
                    tokens = [
                        r[0] for r in db_rows(state / DATABASE_NAME, "SELECT token FROM leases")
                    ]
                    first.process.send_signal(signal.SIGKILL)
                    assert first.wait() == -signal.SIGKILL

            with running_daemon(state_dir=state, extra_args=args) as second:
                async with open_rpc(second.socket) as rpc:
                    session = await get(rpc, sid)
                    assert session["queued"] == 2
                    assert session["queuePaused"] == "daemon-restart"
                    assert session["phase"] == "stopped"
                    events = await history(rpc, sid)
                    assert_contiguous(events)
                    assert kinds(events).count("queue.paused") == 1
                    assert kinds(events).count("submission") == 1  # "go" only: nothing sent
                    listed = await rpc.call("agentSession.queue", {"sessionId": sid})
                    assert [p["text"] for p in listed["prompts"]] == ["echo one", "echo two"]
                    assert listed["paused"] == "daemon-restart"

                    await rpc.call("agentSession.setOptions", {"sessionId": sid, "options": {}})
                    resumed = await rpc.call(
                        "agentSession.queue", {"sessionId": sid, "action": "resume"}
                    )
                    assert resumed["paused"] is None
                    assert resumed["sent"]["dispatch"] == "accepted"
                    await wait_journal(rpc, sid, "turn.completed", 3)
                    assert (await get(rpc, sid))["queued"] == 0
                    await rpc.call("agentSession.close", {"sessionId": sid})
                    assert user_texts(conversation_file(state, handle))[-2:] == [
                        "echo one",
                        "echo two",
                    ]
        finally:
            kill_carriers(tokens)


async def test_two_clients_withdrawing_and_sending_now_the_same_queued_prompt_resolve_once(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    rounds = 6
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as one, open_rpc(daemon.socket) as two:
            sid = (await create(one, tmp_path, options={**SLOW_TURN, "chunks": 600}))["sessionId"]
            await one.call("agentSession.send", {"sessionId": sid, "text": "go"})
            prompts = [
                (await queue(one, sid, f"echo {i}"))["clientMessageId"] for i in range(rounds)
            ]
            outcomes: list[list[str]] = []
            for prompt_id in prompts:
                answers: list[str] = []

                async def act(
                    rpc: Rpc, action: str, prompt_id: str = prompt_id, answers: list[str] = answers
                ) -> None:
                    params = {"sessionId": sid, "action": action, "promptId": prompt_id}
                    try:
                        await rpc.call("agentSession.queue", params)
                    except CallFailed as exc:
                        answers.append(exc.kind)
                    else:
                        answers.append(action)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(act, one, "withdraw")
                    nursery.start_soon(act, two, "sendNow")
                outcomes.append(sorted(answers))
            for answers in outcomes:
                assert answers in (
                    ["prompt_not_queued", "withdraw"],
                    ["prompt_not_queued", "sendNow"],
                ), answers
            events = await history(one, sid)
            for answers, prompt_id in zip(outcomes, prompts, strict=True):
                withdrawn = [
                    e
                    for e in events
                    if e["kind"] == "prompt.withdrawn" and e["body"]["promptId"] == prompt_id
                ]
                sent = [
                    e
                    for e in events
                    if e["kind"] == "submission" and e["body"]["clientMessageId"] == prompt_id
                ]
                assert (len(withdrawn), len(sent)) == ((1, 0) if "withdraw" in answers else (0, 1))
            assert (await get(one, sid))["queued"] == 0
            await one.call("agentSession.close", {"sessionId": sid})


async def test_an_interrupt_pauses_the_queue_and_withdraws_nothing(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            sid = (await create(rpc, tmp_path, options=SLOW_TURN))["sessionId"]
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "go"})
            queued = await queue(rpc, sid, "echo later")
            edited = await rpc.call(
                "agentSession.queue",
                {
                    "sessionId": sid,
                    "action": "edit",
                    "promptId": queued["clientMessageId"],
                    "text": "echo edited",
                },
            )
            assert [p["text"] for p in edited["prompts"]] == ["echo edited"]
            # Interrupt-and-send: the turn ends, this prompt runs next, the queue waits.
            now = await rpc.call(
                "agentSession.send",
                {"sessionId": sid, "text": "echo instead", "delivery": "interrupt"},
            )
            assert now["dispatch"] == "accepted"
            events = await wait_journal(rpc, sid, "turn.completed", 2)
            completed = [e["body"]["outcome"] for e in events if e["kind"] == "turn.completed"]
            assert completed == ["interrupted", "completed"]
            listed = await rpc.call("agentSession.queue", {"sessionId": sid})
            assert listed["paused"] == "interrupted"
            assert [p["text"] for p in listed["prompts"]] == ["echo edited"]
            assert kinds(events).count("submission") == 2
            assert (await get(rpc, sid))["status"] == "idle"

            sent = await rpc.call(
                "agentSession.queue",
                {"sessionId": sid, "action": "sendNow", "promptId": queued["clientMessageId"]},
            )
            assert sent["sent"]["dispatch"] == "accepted"
            assert sent["prompts"] == [] and sent["paused"] is None
            events = await wait_journal(rpc, sid, "turn.completed", 3)
            texts = [e["body"]["text"] for e in events if e["kind"] == "submission"]
            assert texts == ["go", "echo instead", "echo edited"]
            await rpc.call("agentSession.close", {"sessionId": sid})


async def test_a_session_is_titled_by_its_first_prompt_unless_it_has_a_title(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            sid = (await create(rpc, tmp_path, start=False))["sessionId"]
            prompt = "\n  echo   fix the flaky\ttest " + "x" * 100 + "\nmore lines"
            await rpc.call("agentSession.send", {"sessionId": sid, "text": prompt})
            title = (await get(rpc, sid))["title"]
            assert title.startswith("echo fix the flaky test xxx") and len(title) == 80
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "echo second"})
            assert (await get(rpc, sid))["title"] == title
            events = await history(rpc, sid)
            updates = [e["body"] for e in events if e["kind"] == "session.updated"]
            assert updates == [{"title": title, "by": "daemon"}]
            renamed = await rpc.call("agentSession.setTitle", {"sessionId": sid, "title": "flaky"})
            assert renamed["session"]["title"] == "flaky"

            titled = (await create(rpc, tmp_path, start=False, title="mine"))["sessionId"]
            await rpc.call("agentSession.send", {"sessionId": titled, "text": "echo hi"})
            assert (await get(rpc, titled))["title"] == "mine"
            for session in (sid, titled):
                await rpc.call("agentSession.close", {"sessionId": session})
