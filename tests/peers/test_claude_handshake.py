"""``ClaudeAdapter`` against a scripted CLI over memory streams: what differs between
Claude Code releases (the version in ``initialize``, ``command_lifecycle`` frames)
and the control requests only a real MCP server or host could provoke."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import wait_all_tasks_blocked

from agentsd.providers.base import LineLink, Submission
from agentsd.providers.claude import option_flags
from agentsd.providers.claude_adapter import ACK_TIMEOUT_S, ClaudeAdapter
from agentsd.providers.claude_permissions import Permissions
from agentsd_protocol.errors import AgentUnsupported
from tests.recording_sink import RecordingSink

SESSION = "5f0c1ad4-7a53-4f0e-9a55-3d8c41f1d2a7"
TEST_TIMEOUT_S = 60.0  # virtual time under autojump_clock; a real second or two otherwise


class ScriptedClaude:
    """The CLI's end of a ``ClaudeAdapter``'s pipes."""

    def __init__(self, sink: RecordingSink) -> None:
        to_cli = trio.testing.memory_stream_one_way_pair()
        from_cli = trio.testing.memory_stream_one_way_pair()
        self.peer = LineLink(from_cli[0], to_cli[1])
        self.adapter = ClaudeAdapter(LineLink(to_cli[0], from_cli[1]), sink, session_id=SESSION)

    async def receive(self) -> dict[str, Any]:
        frame = await self.peer.receive()
        assert frame is not None
        return frame

    async def answer_initialize(self, reply: dict[str, Any]) -> None:
        request = await self.receive()
        assert request["request"]["subtype"] == "initialize"
        await self.respond(request, reply)

    async def respond(self, request: dict[str, Any], reply: dict[str, Any]) -> None:
        await self.peer.send(
            {
                "type": "control_response",
                "response": {
                    "subtype": "success",
                    "request_id": request["request_id"],
                    "response": reply,
                },
            }
        )


INIT_2_1_197 = {"account": {}, "agents": [], "commands": [], "models": [], "pid": 4242}
INIT_2_1_332 = {**INIT_2_1_197, "claude_code_version": "2.1.332", "capabilities": []}


@pytest.mark.parametrize(("reply", "version"), [(INIT_2_1_197, None), (INIT_2_1_332, "2.1.332")])
async def test_initialize_with_or_without_a_version_starts(
    reply: dict[str, Any], version: str | None
) -> None:
    claude = ScriptedClaude(RecordingSink())
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(claude.answer_initialize, reply)
            assert await claude.adapter.handshake(None) == SESSION
    assert claude.adapter.agent_version == version


async def test_a_version_known_to_be_too_old_is_refused_with_the_upgrade_command() -> None:
    claude = ScriptedClaude(RecordingSink())
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(claude.answer_initialize, {"claude_code_version": "1.0.3"})
            with pytest.raises(AgentUnsupported) as raised:
                await claude.adapter.handshake(None)
    message = raised.value.message
    assert "claude 1.0.3 is too old" in message and "2.0.0 or later" in message
    assert "npm install -g @anthropic-ai/claude-code@latest" in message


@pytest.mark.parametrize("lifecycle", [True, False], ids=["2.1.332", "2.1.197"])
async def test_a_prompt_is_acknowledged_on_every_release(
    lifecycle: bool, autojump_clock: trio.abc.Clock
) -> None:
    """2.1.332 reports a prompt queued at once (``command_lifecycle``). 2.1.197 does
    not, and echoes it only once it takes it up (after a running turn): the answer
    to the read barrier written after it acknowledges it instead."""
    claude = ScriptedClaude(RecordingSink())
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(claude.answer_initialize, INIT_2_1_197)
            await claude.adapter.handshake(None)
            nursery.start_soon(claude.adapter.run)
            dispatches = []

            async def send(text: str) -> None:
                dispatches.append(await claude.adapter.send(Submission("m", text)))

            for text in ("first", "second"):
                nursery.start_soon(send, text)
                prompt = await claude.receive()
                assert prompt["type"] == "user" and prompt["message"]["content"] == text
                if lifecycle:
                    queued = {"command_uuid": prompt["uuid"], "state": "queued"}
                    await claude.peer.send({"type": "command_lifecycle", **queued})
                if text == "first" or not lifecycle:
                    barrier = await claude.receive()
                    assert barrier["request"] == {"subtype": "mcp_status"}
                    await claude.respond(barrier, {"mcpServers": []})
                await wait_all_tasks_blocked()
            # Once the CLI showed command_lifecycle, no barrier follows a prompt.
            with trio.move_on_after(1.0):
                unexpected = await claude.peer.receive()
                raise AssertionError(f"the adapter wrote {unexpected}")
            nursery.cancel_scope.cancel()
    assert [d.outcome for d in dispatches] == ["accepted", "accepted"]


async def test_a_prompt_nothing_confirms_is_unknown(autojump_clock: trio.abc.Clock) -> None:
    claude = ScriptedClaude(RecordingSink())
    with trio.fail_after(TEST_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(claude.answer_initialize, INIT_2_1_197)
            await claude.adapter.handshake(None)
            nursery.start_soon(claude.adapter.run)
            started = trio.current_time()
            dispatch = await claude.adapter.send(Submission("m", "hello"))
            assert trio.current_time() - started >= ACK_TIMEOUT_S
            nursery.cancel_scope.cancel()
    assert dispatch.outcome == "unknown"


def test_the_manual_permission_mode_is_passed_as_default_which_every_release_takes() -> None:
    assert option_flags({"permissionMode": "manual"}) == ["--permission-mode", "default"]
    assert option_flags({"permissionMode": "plan"}) == ["--permission-mode", "plan"]


# -- control requests ------------------------------------------------------------------


def cli_end() -> tuple[Permissions, RecordingSink, LineLink]:
    """Permissions writing to a pipe whose other end the test reads."""
    sink = RecordingSink()
    send, receive = trio.testing.memory_stream_one_way_pair()
    dummy_send, _ = trio.testing.memory_stream_one_way_pair()
    return Permissions(LineLink(send, receive), sink), sink, LineLink(dummy_send, receive)


@pytest.mark.parametrize(
    ("request_fields", "decision", "answer"),
    [
        (
            {"mode": "url", "url": "https://example.com/login", "elicitation_id": "e1"},
            "accept",
            {"action": "accept"},
        ),
        ({"mode": "form", "requested_schema": {"type": "object"}}, "accept", {"action": "accept"}),
        ({"mode": "form"}, "decline", {"action": "decline"}),
        ({"mode": "url", "url": "https://example.com"}, "cancel", {"action": "cancel"}),
    ],
)
async def test_an_mcp_elicitation_is_an_approval(
    request_fields: dict[str, Any], decision: str, answer: dict[str, Any]
) -> None:
    permissions, sink, cli = cli_end()
    request = {"subtype": "elicitation", "mcp_server_name": "tickets", "message": "Log in?"}
    with trio.fail_after(TEST_TIMEOUT_S):
        frame = {"type": "control_request", "request_id": "e-1"}
        await permissions.on_request({**frame, "request": {**request, **request_fields}})
        (asked,) = sink.approvals
        assert asked["kind"] == "elicitation"
        assert asked["options"] == ["accept", "decline"]
        assert asked["title"] == "tickets: Log in?"
        await permissions.answer("e-1", decision)
        sent = await cli.receive()
    if decision == "accept" and request_fields["mode"] == "form":
        answer = {**answer, "content": {}}
    assert sent == {
        "type": "control_response",
        "response": {"subtype": "success", "response": answer, "request_id": "e-1"},
    }


async def test_an_elicitation_that_needs_typed_content_is_declined_at_once() -> None:
    permissions, sink, cli = cli_end()
    schema = {"type": "object", "properties": {"name": {}}, "required": ["name"]}
    request = {"subtype": "elicitation", "mcp_server_name": "tickets", "message": "Your name?"}
    with trio.fail_after(TEST_TIMEOUT_S):
        await permissions.on_request(
            {
                "type": "control_request",
                "request_id": "e-2",
                "request": {**request, "mode": "form", "requested_schema": schema},
            }
        )
        sent = await cli.receive()
    assert sent == {
        "type": "control_response",
        "response": {"subtype": "success", "response": {"action": "decline"}, "request_id": "e-2"},
    }
    assert sink.approvals == []
    assert sink.kinds() == ["agent.warning"]


@pytest.mark.parametrize(
    "subtype",
    [
        "hook_callback",
        "mcp_message",
        "request_user_dialog",
        "host_auth_token_refresh",
        "oauth_token_refresh",
        "remote_control_work_secret",
        "register_device_hooks",
        "upload_device_hook_template",
    ],
)
async def test_requests_for_hosts_that_asked_for_them_get_an_error_answer(subtype: str) -> None:
    permissions, sink, cli = cli_end()
    with trio.fail_after(TEST_TIMEOUT_S):
        await permissions.on_request(
            {"type": "control_request", "request_id": "x-1", "request": {"subtype": subtype}}
        )
        sent = await cli.receive()
    assert sent is not None
    assert sent["response"]["subtype"] == "error"
    assert sent["response"]["request_id"] == "x-1"
    assert subtype in sent["response"]["error"]
    assert sink.kinds() == ["agent.warning"]
