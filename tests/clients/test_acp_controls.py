"""Modes, config options, slash commands and image prompts through ``agentsctl acp``
(``agentsctl.acp.controls``): the mapping of each provider's options, and the
bridge in-process against a daemon's mock agent. The real Codex and Claude Code
behind the same requests, driven by both ACP SDKs, are in ``test_acp_sdks.py``."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
import trio

from agentsctl.acp import controls
from agentsctl.acp.peer import AcpError
from agentsctl.async_client import open_client
from agentsctl.client import Client
from agentsd_protocol import methods
from agentsd_protocol.api import controls as ctl
from agentsd_protocol.api.conversation import SetOptionsParams
from agentsd_protocol.api.session import GetParams
from tests.clients.test_acp import TEST_TIMEOUT_S, bridge
from tests.daemon_process import DaemonProcess

GIF = b"GIF89a" + b"\x01\x02\x03" * 50


def option(key: str, value: Any = None, choices: list[str] | None = None) -> ctl.OptionInfo:
    return ctl.OptionInfo(
        key=key,
        value=value,
        choices=None if choices is None else [ctl.OptionChoice(value=c) for c in choices],
        applies_at="now",
    )


CODEX = [
    option("model", "gpt-x", ["gpt-x", "gpt-y"]),
    option("effort", None, ["low", "high"]),
    option("approvalPolicy", None, ["untrusted", "on-request", "never"]),
    option("sandbox", None, ["read-only", "workspace-write", "danger-full-access"]),
]


def test_codex_modes_are_presets_of_approval_policy_and_sandbox() -> None:
    state = controls.Controls({o.key: o for o in CODEX})
    modes = state.modes()
    assert modes is not None
    assert modes.current_mode_id == "auto"  # Codex's defaults
    assert [m.id for m in modes.available_modes] == ["read-only", "auto", "full-access"]
    assert state.mode_changes("full-access") == {
        "approvalPolicy": "never",
        "sandbox": "danger-full-access",
    }
    with pytest.raises(controls.UnknownControl):
        state.mode_changes("yolo")
    # A combination no preset has (set from the CLI) is shown as it is.
    custom = controls.Controls(
        {o.key: o for o in [*CODEX[:2], option("approvalPolicy", "untrusted"), CODEX[3]]}
    )
    shown = custom.modes()
    assert shown is not None and shown.current_mode_id == "custom"
    assert "approvalPolicy=untrusted" in (shown.available_modes[-1].description or "")
    assert custom.mode_changes("custom") == {}
    # Config options: the mode again, the model, the effort (unset: "default").
    configs = {c.id: c for c in state.config_options()}
    assert [(c.id, c.category) for c in configs.values()] == [
        ("mode", "mode"),
        ("model", "model"),
        ("effort", "thought_level"),
    ]
    assert configs["effort"].current_value == "default"
    assert [c.value for c in configs["effort"].options] == ["default", "low", "high"]
    assert state.config_changes("effort", "default") == {"effort": None}
    assert state.config_changes("model", "gpt-y") == {"model": "gpt-y"}
    with pytest.raises(controls.UnknownControl):
        state.config_changes("sandbox", "read-only")  # not a config option: a mode


def test_claude_modes_are_its_permission_modes() -> None:
    modes_of = ["default", "acceptEdits", "plan", "bypassPermissions"]
    state = controls.Controls(
        {
            o.key: o
            for o in [option("model", None, ["sonnet"]), option("permissionMode", None, modes_of)]
        }
    )
    modes = state.modes()
    assert modes is not None and modes.current_mode_id == "default"
    assert [m.id for m in modes.available_modes] == modes_of
    assert state.mode_changes("acceptEdits") == {"permissionMode": "acceptEdits"}
    assert state.config_changes("mode", "plan") == {"permissionMode": "plan"}


def test_slash_commands_are_recognised_only_when_listed() -> None:
    names = {"compact", "greet"}
    assert controls.slash_command("/compact", names) == ("compact", None)
    assert controls.slash_command("/greet  Bob the\nbuilder ", names) == (
        "greet",
        "Bob the\nbuilder",
    )
    assert controls.slash_command("/nosuch x", names) is None
    assert controls.slash_command("compact", names) is None
    assert controls.slash_command("/", names) is None


def history(socket: Any, session_id: str) -> list[dict[str, Any]]:
    with Client(socket) as client:
        events: list[dict[str, Any]] = client.call(
            "agentSession.history", {"sessionId": session_id, "afterSeq": 0, "limit": 1000}
        )["events"]
    return events


async def test_models_commands_and_images_through_the_bridge(daemon: DaemonProcess) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with bridge(daemon.socket) as editor, open_client(str(daemon.socket)) as other:
            new = await editor.call("session/new", {"cwd": "/tmp", "mcpServers": []})
            session_id = new["sessionId"]
            assert "modes" not in new  # the mock has none
            [model] = new["configOptions"]
            assert (model["id"], model["category"], model["currentValue"]) == (
                "model",
                "model",
                "mock-fast",
            )
            assert [c["value"] for c in model["options"]] == ["mock-fast", "mock-deep"]
            # The unstable model state and set_model (editors before config options).
            assert new["models"] == {
                "currentModelId": "mock-fast",
                "availableModels": [
                    {"modelId": "mock-fast", "name": "mock-fast"},
                    {"modelId": "mock-deep", "name": "mock-deep"},
                ],
            }
            set_model = {"sessionId": session_id, "modelId": "mock-deep"}
            assert await editor.call("session/set_model", set_model) == {}
            got = await other.call(methods.GET, GetParams(session_id=session_id))
            assert got.session.options["model"] == "mock-deep"

            def commands() -> list[str]:
                updates = [
                    u for u in editor.updates if u["sessionUpdate"] == "available_commands_update"
                ]
                return [c["name"] for c in updates[-1]["availableCommands"]] if updates else []

            await editor.until(lambda: "compact" in commands())

            async def prompt(*blocks: dict[str, Any]) -> Any:
                params = {"sessionId": session_id, "prompt": list(blocks)}
                return await editor.call("session/prompt", params)

            def text(value: str) -> dict[str, Any]:
                return {"type": "text", "text": value}

            # A model switch from the editor reaches the agent.
            switched = await editor.call(
                "session/set_config_option",
                {"sessionId": session_id, "configId": "model", "value": "mock-deep"},
            )
            assert switched["configOptions"][0]["currentValue"] == "mock-deep"
            mark = len(editor.updates)
            assert await prompt(text("which model")) == {"stopReason": "end_turn"}
            assert "".join(editor.texts("agent_message_chunk", mark)) == "I am mock-deep."
            # Once the agent runs, its own commands are offered too.
            await editor.until(lambda: "greet" in commands())

            # Another client's change reaches the editor as a config_option_update.
            mark = len(editor.updates)
            params = SetOptionsParams(session_id=session_id, changes={"model": "mock-fast"})
            await other.call(methods.SET_OPTIONS, params)

            def current_model(since: int) -> str | None:
                for update in reversed(editor.updates[since:]):
                    if update["sessionUpdate"] == "config_option_update":
                        value: str = update["configOptions"][0]["currentValue"]
                        return value
                return None

            await editor.until(lambda: current_model(mark) == "mock-fast")

            # Slash commands run as commands, never as text for the agent.
            mark = len(editor.updates)
            assert await prompt(text("/greet Bob")) == {"stopReason": "end_turn"}
            assert "".join(editor.texts("agent_message_chunk", mark)) == "Hello, Bob!"
            mark = len(editor.updates)
            assert await prompt(text("/compact")) == {"stopReason": "end_turn"}
            assert "".join(editor.texts("agent_message_chunk", mark)).startswith("Compacted ")
            # One that is not listed is a prompt like any other.
            assert await prompt(text("/nosuch thing")) == {"stopReason": "end_turn"}

            # An image prompt: the agent gets the bytes.
            mark = len(editor.updates)
            image = {
                "type": "image",
                "data": base64.b64encode(GIF).decode(),
                "mimeType": "image/gif",
            }
            assert await prompt(text("echo look"), image) == {"stopReason": "end_turn"}
            digest = hashlib.sha256(GIF).hexdigest()
            reply = "".join(editor.texts("agent_message_chunk", mark))
            assert f"[image image/gif {digest} {len(GIF)}]" in reply, reply

            # Bad requests: clear errors, nothing changed.
            for method, bad in [
                ("session/set_mode", {"sessionId": session_id, "modeId": "auto"}),
                (
                    "session/set_config_option",
                    {"sessionId": session_id, "configId": "colour", "value": "red"},
                ),
                (
                    "session/set_config_option",
                    {"sessionId": session_id, "configId": "model", "value": "mock-huge"},
                ),
            ]:
                with pytest.raises(AcpError) as refused:
                    await editor.call(method, bad)
                assert refused.value.code == -32602, (method, refused.value)
            fake_image = {
                "type": "image",
                "data": base64.b64encode(b"not an image").decode(),
                "mimeType": "image/png",
            }
            with pytest.raises(AcpError) as refused:
                await prompt(text("echo no"), fake_image)
            assert refused.value.code == -32602
            assert refused.value.data["kind"] == "attachment_refused"

    events = history(daemon.socket, session_id)
    runs = [
        (e["body"]["name"], e["body"].get("args")) for e in events if e["kind"] == "command.run"
    ]
    assert runs == [("greet", "Bob"), ("compact", None)]
    texts = [e["body"]["text"] for e in events if e["kind"] == "submission"]
    assert texts == ["which model", "/nosuch thing", "echo look"]
    with Client(daemon.socket) as client:
        options = client.call("agentSession.get", {"sessionId": session_id})["session"]["options"]
    assert options["model"] == "mock-fast"


async def test_cancelling_a_command_interrupts_its_turn(daemon: DaemonProcess) -> None:
    """``session/cancel`` while a ``/command`` runs stops its turn, and the prompt
    that ran it ends ``cancelled``."""
    options = {"options": {"chunkDelayS": 0.05, "chunks": 20}}
    name = " ".join(f"n{i}" for i in range(40))
    with trio.fail_after(TEST_TIMEOUT_S):
        async with bridge(daemon.socket, **options) as editor:
            new = await editor.call("session/new", {"cwd": "/tmp", "mcpServers": []})
            session_id = new["sessionId"]
            hello = {"sessionId": session_id, "prompt": [{"type": "text", "text": "hello"}]}
            assert await editor.call("session/prompt", hello) == {"stopReason": "end_turn"}
            mark = len(editor.updates)
            async with trio.open_nursery() as nursery:

                async def cancel_on_first_chunk() -> None:
                    await editor.until(lambda: bool(editor.texts("agent_message_chunk", mark)))
                    assert editor.peer is not None
                    await editor.peer.notify("session/cancel", {"sessionId": session_id})

                nursery.start_soon(cancel_on_first_chunk)
                greet = {
                    "sessionId": session_id,
                    "prompt": [{"type": "text", "text": f"/greet {name}"}],
                }
                assert await editor.call("session/prompt", greet) == {"stopReason": "cancelled"}
    events = history(daemon.socket, session_id)
    outcomes = [e["body"]["outcome"] for e in events if e["kind"] == "turn.completed"]
    assert outcomes == ["completed", "interrupted"]
