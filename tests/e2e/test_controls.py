"""Conversation controls over the real socket with real mock agents: options (what
can be set, live where the agent allows, bad input refused with nothing changed),
commands (the agent's and agentsd's: compact, clear), usage in ``get`` and the
status feed, two clients at once, and agent callers refused for another session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from agentsd.procfs import SPAWN_TOKEN_ENV
from tests.daemon_process import DaemonProcess
from tests.e2e.test_conversation import conversation_file, get, user_texts, wait_journal
from tests.e2e.test_sessions import (
    DATABASE_NAME,
    TEST_TIMEOUT_S,
    CallFailed,
    Rpc,
    create,
    db_rows,
    gather,
    history,
    kinds,
    open_rpc,
)


async def options_of(rpc: Rpc, sid: str) -> dict[str, dict[str, Any]]:
    result = await rpc.call("agentSession.options", {"sessionId": sid})
    return {o["key"]: o for o in result["options"]}


async def failure(rpc: Rpc, method: str, params: dict[str, Any]) -> CallFailed:
    try:
        await rpc.call(method, params)
    except CallFailed as exc:
        return exc
    raise AssertionError(f"{method} {params} succeeded")


async def reply_of(rpc: Rpc, sid: str, turns: int) -> str:
    """The agent's reply in the session's ``turns``-th completed turn."""
    events = await wait_journal(rpc, sid, "turn.completed", turns)
    replies = [
        e["body"]["text"]
        for e in events
        if e["kind"] == "item.completed" and e["body"]["type"] == "agentMessage"
    ]
    return str(replies[-1])


async def test_options_list_choices_and_a_model_switch_applies_now(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            sid = (await create(rpc, tmp_path, options={"chunks": 1}))["sessionId"]
            options = await options_of(rpc, sid)
            model = options["model"]
            assert [c["value"] for c in model["choices"]] == ["mock-fast", "mock-deep"]
            assert model["appliesAt"] == "now" and model["open"] is False
            chunks = options["chunks"]
            assert (chunks["value"], chunks["appliesAt"], chunks["choices"]) == (
                1,
                "nextStart",
                None,
            )

            await rpc.call("agentSession.send", {"sessionId": sid, "text": "which model"})
            assert await reply_of(rpc, sid, 1) == "I am mock-fast."
            result = await rpc.call(
                "agentSession.setOptions", {"sessionId": sid, "changes": {"model": "mock-deep"}}
            )
            assert result["appliesAt"] == {"model": "now"}
            assert result["session"]["options"] == {"chunks": 1, "model": "mock-deep"}
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "which model"})
            assert await reply_of(rpc, sid, 2) == "I am mock-deep."
            assert (await options_of(rpc, sid))["model"]["value"] == "mock-deep"

            # Unset: back to the agent's default at the next start.
            result = await rpc.call(
                "agentSession.setOptions", {"sessionId": sid, "changes": {"chunks": None}}
            )
            assert result["appliesAt"] == {"chunks": "nextStart"}
            assert result["session"]["options"] == {"model": "mock-deep"}

            # A stopped agent takes every change at its next start, and keeps it.
            await rpc.call("agentSession.close", {"sessionId": sid})
            stopped = await options_of(rpc, sid)
            assert stopped["model"]["appliesAt"] == "nextStart"
            result = await rpc.call(
                "agentSession.setOptions", {"sessionId": sid, "changes": {"model": "mock-fast"}}
            )
            assert result["appliesAt"] == {"model": "nextStart"}
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "which model"})
            assert await reply_of(rpc, sid, 3) == "I am mock-fast."


async def test_bad_options_are_refused_with_their_kind_and_nothing_changes(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            sid = (await create(rpc, tmp_path, options={"chunks": 2}))["sessionId"]
            before = await history(rpc, sid)
            bad: list[tuple[dict[str, Any], str, str]] = [
                ({"changes": {"modle": "mock-deep"}}, "unknown_option", "modle"),
                ({"changes": {"model": "gpt-9"}}, "unknown_option", "model"),
                # The whole set is refused when one key is bad, the good one included.
                ({"changes": {"model": "mock-deep", "x": 1}}, "unknown_option", "x"),
                ({"options": {"chunks": 3, "nonsense": True}}, "unknown_option", "nonsense"),
            ]
            for params, kind, option in bad:
                refused = await failure(
                    rpc, "agentSession.setOptions", {"sessionId": sid, **params}
                )
                assert (refused.kind, refused.data["option"]) == (kind, option), params
            refused = await failure(
                rpc,
                "agentSession.setOptions",
                {"sessionId": sid, "options": {}, "changes": {}},
            )
            assert refused.kind == "invalid_params"
            refused = await failure(
                rpc,
                "agentSession.setOptions",
                {"sessionId": sid, "changes": {"replyText": "x" * (64 * 1024)}},
            )
            assert (refused.kind, refused.data["limit"]) == ("invalid_params", "options")
            refused = await failure(rpc, "agentSession.options", {"sessionId": "nope"})
            assert refused.kind == "session_not_found"
            assert (await get(rpc, sid))["options"] == {"chunks": 2}
            assert await history(rpc, sid) == before  # nothing journaled
            # The agent kept its model too.
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "which model"})
            assert await reply_of(rpc, sid, 1) == "I am mock-fast."


async def test_commands_list_and_run_the_agents_and_compact(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            info = await create(rpc, tmp_path, options={"chunks": 1})
            sid = info["sessionId"]
            listed = await rpc.call("agentSession.commands", {"sessionId": sid})
            assert listed["running"] is True
            assert [(c["name"], c["source"]) for c in listed["commands"]] == [
                ("compact", "agentsd"),
                ("clear", "agentsd"),
                ("greet", "agent"),
            ]
            assert listed["commands"][2]["hint"] == "NAME"

            ran = await rpc.call(
                "agentSession.command", {"sessionId": sid, "name": "greet", "args": "Ann"}
            )
            assert ran["dispatch"] == "accepted" and ran["turnId"]
            assert await reply_of(rpc, sid, 1) == "Hello, Ann!"
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "echo two"})
            await wait_journal(rpc, sid, "turn.completed", 2)

            ran = await rpc.call("agentSession.command", {"sessionId": sid, "name": "/compact"})
            assert ran["name"] == "compact" and ran["dispatch"] == "accepted"
            assert await reply_of(rpc, sid, 3) == "Compacted 3 messages."
            events = await history(rpc, sid)
            runs = [e for e in events if e["kind"] == "command.run"]
            assert [r["body"] for r in runs] == [
                {"name": "greet", "args": "Ann"},
                {"name": "compact"},
            ]
            assert runs[1]["seq"] == ran["seq"]
            await rpc.call("agentSession.close", {"sessionId": sid})
            messages = conversation_file(daemon.state_dir, info["providerHandle"])
            assert messages[0] == {"role": "summary", "text": "Compacted 3 messages."}

            before = await history(rpc, sid)
            refused = await failure(
                rpc, "agentSession.command", {"sessionId": sid, "name": "frobnicate"}
            )
            assert refused.kind == "unknown_command"
            assert "greet" in refused.data["known"]
            refused = await failure(
                rpc,
                "agentSession.command",
                {"sessionId": sid, "name": "greet", "args": "x" * (64 * 1024 + 1)},
            )
            assert refused.kind == "invalid_params"
            after = await history(rpc, sid)
            # The unknown command started the agent (to ask it) but ran nothing.
            assert "command.run" not in kinds(after[len(before) :])


async def test_clear_starts_a_blank_conversation_and_keeps_the_history(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            info = await create(rpc, tmp_path, options={"chunks": 1})
            sid, old = info["sessionId"], info["providerHandle"]
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "echo before"})
            await wait_journal(rpc, sid, "turn.completed")
            cleared = await rpc.call("agentSession.command", {"sessionId": sid, "name": "clear"})
            new = cleared["handle"]
            assert new and new != old
            session = await get(rpc, sid)
            assert session["providerHandle"] == new and session["phase"] == "running"
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "echo after"})
            await wait_journal(rpc, sid, "turn.completed", 2)
            await rpc.call("agentSession.close", {"sessionId": sid})
            assert user_texts(conversation_file(daemon.state_dir, new)) == ["echo after"]
            assert user_texts(conversation_file(daemon.state_dir, old)) == ["echo before"]

            events = await history(rpc, sid)
            marker = next(e for e in events if e["kind"] == "conversation.cleared")
            assert marker["body"] == {"previousHandle": old}
            texts = [e["body"]["text"] for e in events if e["kind"] == "submission"]
            assert texts == ["echo before", "echo after"]  # history stays readable
            # The next start resumes the fresh conversation, not the old one.
            await rpc.call("agentSession.start", {"sessionId": sid})
            assert (await get(rpc, sid))["providerHandle"] == new


async def test_a_command_while_a_turn_runs_is_refused_and_two_clients_run_one(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    slow = {"replyText": "x" * 100, "chunks": 100, "chunkDelayS": 0.05}
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as one, open_rpc(daemon.socket) as two:
            sid = (await create(one, tmp_path, options=slow))["sessionId"]
            await one.call("agentSession.send", {"sessionId": sid, "text": "go"})
            refused = await failure(
                two, "agentSession.command", {"sessionId": sid, "name": "clear"}
            )
            assert refused.kind == "invalid_state"
            await one.call("agentSession.interrupt", {"sessionId": sid})
            await wait_journal(one, sid, "turn.completed")

            params = {"sessionId": sid, "name": "compact"}
            outcomes = await gather(
                lambda: one.request("agentSession.command", params),
                lambda: two.request("agentSession.command", params),
            )
            results = [o.get("result") for o in outcomes]
            errors = [o["error"]["data"]["kind"] for o in outcomes if "error" in o]
            assert errors == ["invalid_state"]
            assert [r["dispatch"] for r in results if r is not None] == ["accepted"]
            events = await history(one, sid)
            assert kinds(events).count("command.run") == 1

            # Two clients changing different options at once: both changes are kept.
            await one.call("agentSession.interrupt", {"sessionId": sid})
            await gather(
                lambda: one.call(
                    "agentSession.setOptions", {"sessionId": sid, "changes": {"model": "mock-deep"}}
                ),
                lambda: two.call(
                    "agentSession.setOptions", {"sessionId": sid, "changes": {"replyText": "hi"}}
                ),
            )
            assert (await get(one, sid))["options"] == {
                **slow,
                "replyText": "hi",
                "model": "mock-deep",
            }


async def test_usage_is_in_get_and_the_status_feed(daemon: DaemonProcess, tmp_path: Path) -> None:
    """The mock reports no usage: nothing is made up."""
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            sid = (await create(rpc, tmp_path, options={"chunks": 1}))["sessionId"]
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "echo hi"})
            await wait_journal(rpc, sid, "turn.completed")
            assert (await get(rpc, sid))["tokens"] is None
            watched = await rpc.call("agentSession.watch", {})
            mine = next(s for s in watched["sessions"] if s["sessionId"] == sid)
            assert mine["tokens"] is None


INTRUDER = """
import json, socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
reader = sock.makefile("rb")
for i, (method, params) in enumerate(json.loads(sys.argv[2])):
    sock.sendall(json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}).encode() + b"\\n")
    print(reader.readline().decode().strip(), flush=True)
"""


def _intrude(daemon: DaemonProcess, token: str, requests: Any) -> list[dict[str, Any]]:
    argv = [sys.executable, "-c", INTRUDER, str(daemon.socket), json.dumps(requests)]
    env = {**os.environ, SPAWN_TOKEN_ENV: token}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=True)
    return [json.loads(line) for line in done.stdout.splitlines()]


async def test_an_agent_may_not_change_options_or_run_commands_of_another_session(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            mine = (await create(rpc, tmp_path, options={"chunks": 1}))["sessionId"]
            other = (await create(rpc, tmp_path, options={"chunks": 1}))["sessionId"]
            [(token,)] = db_rows(
                daemon.state_dir / DATABASE_NAME,
                "SELECT token FROM leases WHERE session_id = ? ORDER BY fence DESC LIMIT 1",
                mine,
            )
            requests = [
                (
                    "agentSession.setOptions",
                    {"sessionId": other, "changes": {"model": "mock-deep"}},
                ),
                ("agentSession.command", {"sessionId": other, "name": "clear"}),
                # Its own options too: a permission mode it lifted itself.
                ("agentSession.setOptions", {"sessionId": mine, "changes": {"model": "mock-deep"}}),
                ("agentSession.setOptions", {"sessionId": mine, "title": "mine"}),
                ("agentSession.options", {"sessionId": other}),  # reading is never refused
                ("agentSession.commands", {"sessionId": mine}),
            ]
            replies = await trio.to_thread.run_sync(_intrude, daemon, token, requests)
            assert [r.get("error", {}).get("data", {}).get("refused") for r in replies] == [
                "changing the options of another session",
                "running a command in another session",
                "changing a session's options (its model, permissions or sandbox)",
                None,
                None,
                None,
            ]
            assert (await get(rpc, mine))["options"] == {"chunks": 1}
            other_info = await get(rpc, other)
            assert other_info["options"] == {"chunks": 1}
            assert "command.run" not in kinds(await history(rpc, other))


async def test_idempotent_mutations_a_command_retried_with_its_operation_id_runs_once(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            sid = (await create(rpc, tmp_path, options={"chunks": 1}))["sessionId"]
            params = {"sessionId": sid, "name": "greet", "args": "Ann", "clientOperationId": "op-1"}
            first = await rpc.call("agentSession.command", params)
            await wait_journal(rpc, sid, "turn.completed")
            again = await rpc.call("agentSession.command", params)
            assert again == first
            refused = await failure(rpc, "agentSession.command", {**params, "args": "Bob"})
            assert refused.kind == "operation_conflict"
            assert kinds(await history(rpc, sid)).count("command.run") == 1


async def test_completions_asked_again_on_one_connection_keep_one_feed(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """A client that re-asks (a redraw, a reconnect of its UI) is not told each notice
    once per ask: the feed is the connection's, replaced, never added to."""
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc, open_rpc(daemon.socket) as other:
            feeds = [(await rpc.call("agentSession.completions", {}))["feedId"] for _ in range(3)]
            assert len(set(feeds)) == 1
            elsewhere = (await other.call("agentSession.completions", {}))["feedId"]
            assert elsewhere != feeds[0]
            sid = (await create(rpc, tmp_path))["sessionId"]
            await rpc.call("agentSession.send", {"sessionId": sid, "text": "echo hi"})
            events = await wait_journal(rpc, sid, "turn.completed")
            done = next(e["seq"] for e in events if e["kind"] == "turn.completed")
            await wait_journal(other, sid, "turn.completed")

            def notices(client: Rpc) -> list[dict[str, Any]]:
                return [
                    params
                    for method, params in client.notes
                    if method == "agentSession.notice" and params["notice"]["seq"] == done
                ]

            # The journal reply was queued after the notice on the same connection.
            assert [n["feedId"] for n in notices(rpc)] == feeds[:1]
            assert [n["feedId"] for n in notices(other)] == [elsewhere]
