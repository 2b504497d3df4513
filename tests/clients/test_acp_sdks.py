"""The must-hold set of an editor reviewing agentsd sessions, through
``agentsctl acp`` driven by the Python ACP SDK and the official TypeScript one
(``acp_client/driver.mjs``), against a daemon whose real ``codex`` and ``claude``
talk to the fake model servers (and the tests' ACP agent, for a plan): a Codex
edit as a diff at its location, a Claude command with its output, a plan, a
question answered as a success, an approval answered from the CLI closing the
editor's dialog, MCP servers reaching the agent; each scenario's ``session/load``
replay shows what was shown live.

The SDK tests need ``node`` and ``npm ci --prefix tests/clients/acp_client`` (and
the test extras' ``agent-client-protocol``); without them they skip, except under
CI, where a missing piece fails."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from agentsctl.client import Client
from agentsd.providers.programs import CLAUDE, find_program
from tests.clients.test_acp import DRIVER, _require_node
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon
from tests.peers.agents import CODEX_RELEASES
from tests.peers.fake_anthropic import (
    FakeAnthropic,
    TextReply,
    ToolUseReply,
    running_fake_anthropic,
)
from tests.peers.fake_openai import API_KEY_ENV, FakeOpenAI, ShellCall, running_fake_openai
from tests.peers.fake_openai import TextReply as OpenAIText
from tests.peers.test_claude_prompts import tiny_png

ACP_TEST_AGENT = Path(__file__).parents[1] / "peers" / "acp_test_agent.py"
CODEX_NEWEST = next(r for r in CODEX_RELEASES if r.newest)
CLAUDE_PROGRAM = find_program(CLAUDE)
SDK_TIMEOUT_S = 240.0  # one scenario: a few real agent turns on a shared 2-core machine
A_PY = "one\ntwo\nthree\nfour\nfive\n"
PATCH = (
    "apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: a.py\n@@\n two\n-three\n+THREE\n"
    " four\n*** End Patch\nEOF"
)


@attrs.frozen
class Review:
    """A daemon whose codex and claude talk to fake model servers, and
    ``testacp`` (the tests' ACP agent)."""

    daemon: DaemonProcess
    openai: FakeOpenAI
    anthropic: FakeAnthropic
    base: Path

    def workdir(self, name: str) -> Path:
        path = self.base / name
        path.mkdir()
        (path / "a.py").write_text(A_PY)
        return path

    def journals(self) -> str:
        """Every session's journal, for a failure's message."""
        with Client(self.daemon.socket) as client:
            sessions = client.call("agentSession.list", {})["sessions"]
        return "\n".join(
            f"{e['kind']} {json.dumps(e['body'])[:300]}"
            for info in sessions
            for e in self.journal(info["sessionId"])
        )

    def journal(self, session_id: str) -> list[dict[str, Any]]:
        with Client(self.daemon.socket) as client:
            events: list[dict[str, Any]] = client.call(
                "agentSession.history", {"sessionId": session_id, "afterSeq": 0, "limit": 1000}
            )["events"]
        return events


@pytest.fixture(scope="module")
def review() -> Iterator[Review]:
    if CLAUDE_PROGRAM is None:
        why = "claude is not installed (the test extras ship it)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    base = make_temp_dir()
    try:
        with running_fake_openai() as openai, running_fake_anthropic() as anthropic:
            codex_home = openai.write_codex_home(base / "codex-home")
            env = {"CODEX_HOME": str(codex_home), API_KEY_ENV: "dummy"}
            env |= anthropic.claude_env(base / "claude-home")
            config = base / "config.toml"
            config.write_text(
                'agent_env = "inherit"\n'
                f"[providers.codex]\ncommand = {json.dumps(CODEX_NEWEST.command())}\n"
                f"[agents.testacp]\ncommand = {json.dumps([sys.executable, str(ACP_TEST_AGENT)])}\n"
            )
            with running_daemon(extra_args=["--config", str(config)], env=env) as daemon:
                yield Review(daemon, openai, anthropic, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def script_codex(review: Review) -> None:
    review.openai.script(
        ShellCall(PATCH, escalate=False),
        OpenAIText("Edited a.py."),
        ShellCall("touch approved.txt"),
        OpenAIText("Ran it."),
    )


def script_claude(review: Review) -> None:
    question = {
        "question": "Which colour?",
        "header": "Colour",
        "options": [
            {"label": "Red", "description": "warm"},
            {"label": "Blue", "description": "calm"},
        ],
        "multiSelect": False,
    }
    review.anthropic.script(
        ToolUseReply({"command": "echo claude-out", "description": "Say it"}),
        TextReply("Said it."),
        ToolUseReply({"questions": [question]}, name="AskUserQuestion"),
        TextReply("Blue it is."),
        ToolUseReply({"command": "echo hi > hi.txt", "description": "Write hi"}),
        TextReply("Wrote it."),
    )


def check_journals(review: Review, report: dict[str, Any]) -> None:
    """What the daemon recorded of a scenario: the CLI's answers won, once each."""
    for key in ("codexSession", "claudeSession"):
        if report[key] is None:
            continue
        resolved = [
            (e["body"]["decision"], e["body"]["by"])
            for e in review.journal(report[key])
            if e["kind"] == "approval.resolved"
        ]
        expected = (
            [("accept", "client")]
            if key == "codexSession"
            else [
                ("Blue", "client"),
                ("allow", "client"),
            ]
        )
        assert resolved == expected, (key, resolved)


# The Python ACP SDK: an editor written with it, driving `agentsctl acp`.


class PyEditor:
    """An ACP client on the Python SDK. It ignores ``$/cancel_request`` (the SDK has
    no handler for it): a permission request closes only by the tool call's update."""

    def __init__(self) -> None:
        self.updates: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self.permission: Any = None

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update.model_dump(mode="json", by_alias=True, exclude_none=True))
        self.changed.set()
        self.changed = asyncio.Event()

    async def request_permission(
        self, options: Any, session_id: str, tool_call: Any, **kwargs: Any
    ) -> Any:
        assert self.permission is not None, "no permission request was expected"
        return await self.permission(options, session_id, tool_call, kwargs)

    async def until(self, predicate: Any) -> None:
        while not predicate():
            await self.changed.wait()

    def mark(self) -> int:
        return len(self.updates)

    def since(self, mark: int) -> list[dict[str, Any]]:
        return self.updates[mark:]


def tool_history(updates: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each tool call's updates by id, the announcement first."""
    calls: dict[str, list[dict[str, Any]]] = {}
    for update in updates:
        if update["sessionUpdate"] == "tool_call":
            assert update["toolCallId"] not in calls, "announced twice"
            calls[update["toolCallId"]] = [update]
        elif update["sessionUpdate"] == "tool_call_update":
            calls[update["toolCallId"]].append(update)
    return calls


def final(history: list[dict[str, Any]], field: str) -> Any:
    return next(u[field] for u in reversed(history) if field in u)


def cancelled_outcome() -> Any:
    from acp.schema import DeniedOutcome, RequestPermissionResponse

    return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))


def selected(option_id: str) -> Any:
    from acp.schema import AllowedOutcome, RequestPermissionResponse

    return RequestPermissionResponse(
        outcome=AllowedOutcome(outcome="selected", option_id=option_id)
    )


async def approve_from_the_cli(
    review: Review, session_id: str, approval_id: str, decision: str
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agentsctl.cli",
        "--socket",
        str(review.daemon.socket),
        "--no-start",
        "approve",
        "--decision",
        decision,
        session_id,
        approval_id,
        stdout=asyncio.subprocess.DEVNULL,
    )
    assert await process.wait() == 0


async def py_scenario(review: Review, provider: str, cwd: Path) -> dict[str, Any]:
    from acp import RequestError, text_block
    from acp.stdio import spawn_agent_process

    editor = PyEditor()
    args = ["-m", "agentsctl.cli", "--socket", str(review.daemon.socket), "--no-start", "acp"]
    report: dict[str, Any] = {}
    async with spawn_agent_process(
        lambda agent: editor,  # type: ignore[arg-type,return-value]
        sys.executable,
        *args,
        "--provider",
        provider,
    ) as (conn, _process):
        # Protocol hygiene: nothing before initialize; an unknown version gets 1.
        with pytest.raises(RequestError) as early:
            await conn.new_session(cwd=str(cwd))
        assert early.value.code == -32600
        initialized = await conn.initialize(protocol_version=0)
        assert initialized.protocol_version == 1
        session_id = (await conn.new_session(cwd=str(cwd))).session_id
        report["session"] = session_id

        async def prompt(text: str) -> str:
            result = await conn.prompt(session_id=session_id, prompt=[text_block(text)])
            return str(result.stop_reason)

        if provider == "codex":
            # An edit, reviewable as a diff at its file and line.
            mark = editor.mark()
            assert await prompt("Edit a.py") == "end_turn"
            [edit] = [
                h for h in tool_history(editor.since(mark)).values() if h[0]["kind"] == "edit"
            ]
            assert edit[0]["title"] == "Edit a.py"
            assert {
                "type": "diff",
                "path": str(cwd / "a.py"),
                "oldText": "two\nthree\nfour\n",
                "newText": "two\nTHREE\nfour\n",
            } in edit[0]["content"]
            assert {"path": str(cwd / "a.py"), "line": 2} in edit[0]["locations"]
            assert final(edit, "status") == "completed"
            # An approval answered from the CLI closes the editor's dialog.
            await approve_elsewhere(review, editor, session_id, prompt, report)
        elif provider == "claude":
            # A command with its output.
            mark = editor.mark()
            assert await prompt("Say it") == "end_turn"
            [bash] = [
                h for h in tool_history(editor.since(mark)).values() if h[0]["kind"] == "execute"
            ]
            assert bash[0]["title"] == "echo claude-out"
            assert final(bash, "status") == "completed"
            assert final(bash, "content") == [
                {"type": "content", "content": {"type": "text", "text": "claude-out"}}
            ]
            # A question answered with a label is a success.
            asked: list[Any] = []

            async def answer(options: Any, _sid: str, tool_call: Any, meta: dict[str, Any]) -> Any:
                asked.append([(o.option_id, o.kind) for o in options])
                report["questionId"] = tool_call.tool_call_id
                return selected("Blue")

            editor.permission = answer
            mark = editor.mark()
            assert await prompt("Ask me") == "end_turn"
            assert asked == [
                [("Red", "allow_once"), ("Blue", "allow_once"), ("decline", "reject_once")]
            ]
            history = tool_history(editor.since(mark))[report["questionId"]]
            assert [u["status"] for u in history if "status" in u][-1] == "completed"
            assert "failed" not in [u.get("status") for u in history]
            await approve_elsewhere(review, editor, session_id, prompt, report)
        else:
            # The agent's plan.
            mark = editor.mark()
            assert await prompt("hello") == "end_turn"
            plans = [u for u in editor.since(mark) if u["sessionUpdate"] == "plan"]
            assert plans == [
                {
                    "sessionUpdate": "plan",
                    "entries": [{"content": "echo", "priority": "medium", "status": "in_progress"}],
                }
            ]
        live = list(editor.updates)

    # session/load on a new bridge replays what was shown live.
    replayer = PyEditor()
    async with spawn_agent_process(
        lambda agent: replayer,  # type: ignore[arg-type,return-value]
        sys.executable,
        *args,
    ) as (conn, _process):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(cwd), session_id=session_id)
    assert merged(non_user(replayer.updates)) == merged(non_user(live))
    return report


# The session's state as it is now, sent when it changes (not history a replay repeats).
STATE_UPDATES = {"available_commands_update", "current_mode_update", "config_option_update"}


def non_user(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # A replay shows the prompts this editor typed itself (the live editor had them).
    return [
        u
        for u in updates
        if u["sessionUpdate"] != "user_message_chunk" and u["sessionUpdate"] not in STATE_UPDATES
    ]


def merged(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for update in updates:
        update = json.loads(json.dumps(update))
        last = out[-1] if out else None
        if (
            update["sessionUpdate"].endswith("_chunk")
            and last is not None
            and last["sessionUpdate"] == update["sessionUpdate"]
            and last.get("messageId") == update.get("messageId")
        ):
            last["content"]["text"] += update["content"]["text"]
        else:
            out.append(update)
    return out


async def approve_elsewhere(
    review: Review, editor: PyEditor, session_id: str, prompt: Any, report: dict[str, Any]
) -> None:
    """The editor's permission dialog stays open until the tool call's update closes
    it; the answer comes from ``agentsctl approve``."""
    closed: list[str] = []
    handled = asyncio.Event()

    async def wait_for_the_cli(
        options: Any, _sid: str, tool_call: Any, meta: dict[str, Any]
    ) -> Any:
        tool_call_id = tool_call.tool_call_id
        mark = editor.mark()
        decision = "accept" if any(o.option_id == "accept" for o in options) else "allow"
        await approve_from_the_cli(review, session_id, meta["agentsd"]["approvalId"], decision)
        await editor.until(
            lambda: any(
                u.get("toolCallId") == tool_call_id and u.get("status") not in (None, "pending")
                for u in editor.since(mark)
            )
        )
        closed.append(tool_call_id)
        handled.set()
        return cancelled_outcome()  # ACP: the request no longer applies

    editor.permission = wait_for_the_cli
    assert await prompt("Do it") == "end_turn"
    # The turn may end before the CLI's process does: the dialog closes when the
    # update reaches the editor, whenever that is.
    await handled.wait()
    assert len(closed) == 1
    report["closedBy"] = "update"


def _require_python_sdk() -> None:
    """The Python ACP SDK (the test extras install it); skip without it, except
    under CI, where its absence fails."""
    try:
        import acp  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("agent-client-protocol is not installed (required under CI)")
        pytest.skip("agent-client-protocol is not installed (pip install -e '.[test]')")


def test_the_python_acp_sdk_reviews_codex_claude_and_plans(review: Review) -> None:
    _require_python_sdk()
    script_codex(review)
    script_claude(review)

    async def run() -> dict[str, Any]:
        report: dict[str, Any] = {}
        async with asyncio.timeout(SDK_TIMEOUT_S):
            codex = await py_scenario(review, "codex", review.workdir("py-codex"))
            claude = await py_scenario(review, "claude", review.workdir("py-claude"))
            await py_scenario(review, "testacp", review.workdir("py-acp"))
        report["codexSession"], report["claudeSession"] = codex["session"], claude["session"]
        return report

    report = asyncio.run(run())
    check_journals(review, report)
    assert (review.base / "py-codex" / "a.py").read_text() == A_PY.replace("three", "THREE")
    assert (review.base / "py-codex" / "approved.txt").exists(), "the CLI's accept reached codex"
    assert (review.base / "py-claude" / "hi.txt").read_text() == "hi\n"


# The TypeScript ACP SDK (the official one): the same set, through driver.mjs.


@pytest.mark.parametrize("provider", ["codex", "claude", "testacp"])
def test_the_typescript_acp_sdk_reviews_codex_claude_and_plans(
    review: Review, provider: str
) -> None:
    node = _require_node()
    cwd = review.workdir(f"ts-{provider}")
    if provider == "codex":
        script_codex(review)
    elif provider == "claude":
        script_claude(review)
    config = {
        "scenario": "review",
        "provider": provider,
        "python": sys.executable,
        "socket": str(review.daemon.socket),
        "cwd": str(cwd),
    }
    done = subprocess.run(
        [node, str(DRIVER), json.dumps(config)],
        cwd=DRIVER.parent,
        capture_output=True,
        text=True,
        timeout=SDK_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{done.stderr}\n--- journals:\n{review.journals()}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if provider == "codex":
        check_journals(review, {"codexSession": report["session"], "claudeSession": None})
        assert (cwd / "a.py").read_text() == A_PY.replace("three", "THREE")
        assert (cwd / "approved.txt").exists(), "the CLI's accept reached codex"
    elif provider == "claude":
        check_journals(review, {"codexSession": None, "claudeSession": report["session"]})
        assert (cwd / "hi.txt").read_text() == "hi\n"


@pytest.mark.parametrize("provider", ["codex", "claude"])
def test_mcp_servers_from_the_editor_reach_the_agent_and_its_resumes(
    review: Review, provider: str
) -> None:
    """A stdio MCP server given at session/new is started by the agent (its command
    leaves a line in a marker file), is recorded with the session, and is started
    again when the session resumes after a close."""
    _require_python_sdk()
    from acp import text_block
    from acp.schema import EnvVariable, McpServerStdio
    from acp.stdio import spawn_agent_process

    cwd = review.workdir(f"mcp-{provider}")
    marker = cwd / "mcp-started"
    server = McpServerStdio(
        name="probe",
        command="/bin/sh",
        args=["-c", f'echo "$PROBE" >> {marker}'],
        env=[EnvVariable(name="PROBE", value=provider)],
    )
    if provider == "codex":
        review.openai.script(OpenAIText("one"), OpenAIText("two"))
    else:
        review.anthropic.script(TextReply("one"), TextReply("two"))

    async def until_lines(count: int) -> None:
        # A file another process writes: there is no event to wait on but the file.
        while not marker.exists() or len(marker.read_text().splitlines()) < count:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def run() -> str:
        editor = PyEditor()
        async with spawn_agent_process(
            lambda agent: editor,  # type: ignore[arg-type,return-value]
            sys.executable,
            *["-m", "agentsctl.cli", "--socket", str(review.daemon.socket), "--no-start"],
            *["acp", "--provider", provider],
        ) as (conn, _process):
            initialized = await conn.initialize(protocol_version=1)
            capabilities = initialized.agent_capabilities
            assert capabilities is not None and capabilities.mcp_capabilities is not None
            assert capabilities.mcp_capabilities.http is True
            session_id = (await conn.new_session(cwd=str(cwd), mcp_servers=[server])).session_id
            prompted = await conn.prompt(session_id=session_id, prompt=[text_block("hi")])
            assert prompted.stop_reason == "end_turn"
            await until_lines(1)
            with Client(review.daemon.socket) as client:
                client.call("agentSession.close", {"sessionId": session_id})
            prompted = await conn.prompt(session_id=session_id, prompt=[text_block("again")])
            assert prompted.stop_reason == "end_turn"
            await until_lines(2)
            return session_id

    async def bounded() -> str:
        async with asyncio.timeout(SDK_TIMEOUT_S):
            return await run()

    session_id = asyncio.run(bounded())
    assert marker.read_text().splitlines()[:2] == [provider, provider]
    with Client(review.daemon.socket) as client:
        options = client.call("agentSession.get", {"sessionId": session_id})["session"]["options"]
    assert options["mcpServers"] == [
        {
            "name": "probe",
            "command": "/bin/sh",
            "args": ["-c", f'echo "$PROBE" >> {marker}'],
            "env": [{"name": "PROBE", "value": provider}],
        }
    ]


# Modes, models, slash commands and images, through both SDKs.

PNG_B64 = base64.b64encode(tiny_png(7, 5)).decode()  # a model server has it only from the prompt
# What each provider's modes and models are, and what proves a switch reached the agent.
NEW_MODE = {"codex": "read-only", "claude": "plan"}
NEW_MODEL = {"codex": "other-model", "claude": "sonnet"}
SANDBOX_READ_ONLY = r"sandbox_mode[\\\"`:\s]+read-only"  # in Codex's permissions text


def script_controls(review: Review, provider: str) -> None:
    if provider == "codex":
        review.openai.script(
            OpenAIText("Before."),
            OpenAIText("Switched."),
            OpenAIText("A summary."),
            OpenAIText("Saw it."),
        )
    else:
        review.anthropic.script(
            TextReply("Before."),
            TextReply("Switched."),
            TextReply("A summary of it all."),
            TextReply("Saw it."),
        )


def model_requests(review: Review, provider: str) -> list[Any]:
    """The bodies of the model server's conversation requests, in order."""
    if provider == "codex":
        return [r.body for r in review.openai.requests()]
    return [r.body for r in review.anthropic.message_requests()]


def check_controls(review: Review, provider: str, before: int) -> None:
    """What the model server received from the scenario: the mode and the model in
    the turn after the switch, a compaction request, the image's bytes."""
    bodies = model_requests(review, provider)[before:]
    texts = [json.dumps(body) for body in bodies]
    before_switch = next(i for i, t in enumerate(texts) if "Before the switch" in t)
    switched = next(i for i, t in enumerate(texts) if "Use the new settings" in t)
    if provider == "codex":
        assert bodies[before_switch]["model"] != NEW_MODEL[provider]
        assert not re.search(SANDBOX_READ_ONLY, texts[before_switch])
        assert bodies[switched]["model"] == NEW_MODEL[provider]
        # Codex tells the model its sandbox in the turn's permissions instructions
        # ("sandbox_mode":"read-only"; Auto would be workspace-write).
        assert re.search(SANDBOX_READ_ONLY, texts[switched])
        assert any("CONTEXT CHECKPOINT COMPACTION" in t for t in texts[switched + 1 :])
    else:
        assert "sonnet" not in bodies[before_switch]["model"]
        assert "Plan mode is active" not in texts[before_switch]
        assert "sonnet" in bodies[switched]["model"]
        # Claude Code's reminder in plan mode (the tools mention plan mode always).
        assert "Plan mode is active" in texts[switched], "Claude Code is in plan mode"
        assert any("summary" in t.lower() and "/compact" not in t for t in texts[switched + 1 :])
    assert any(PNG_B64 in t for t in texts[switched + 1 :]), "the image reached the model"


async def py_controls(review: Review, provider: str, cwd: Path) -> str:
    from acp import image_block, text_block
    from acp.stdio import spawn_agent_process

    editor = PyEditor()
    args = ["-m", "agentsctl.cli", "--socket", str(review.daemon.socket), "--no-start", "acp"]
    async with spawn_agent_process(
        lambda agent: editor,  # type: ignore[arg-type,return-value]
        sys.executable,
        *args,
        *["--provider", provider],
    ) as (conn, _process):
        initialized = await conn.initialize(protocol_version=1)
        capabilities = initialized.agent_capabilities
        assert capabilities is not None and capabilities.prompt_capabilities is not None
        assert capabilities.prompt_capabilities.image is True
        new = await conn.new_session(cwd=str(cwd))
        session_id = new.session_id
        assert new.modes is not None
        modes = [m.id for m in new.modes.available_modes]
        assert NEW_MODE[provider] in modes
        configs = {c.id: c for c in new.config_options or []}
        assert configs["mode"].current_value == new.modes.current_mode_id
        assert configs["model"].category == "model"

        def names() -> list[str]:
            updates = [
                u for u in editor.updates if u["sessionUpdate"] == "available_commands_update"
            ]
            return [c["name"] for c in updates[-1]["availableCommands"]] if updates else []

        await editor.until(lambda: "compact" in names())
        prompted = await conn.prompt(
            session_id=session_id, prompt=[text_block("Before the switch")]
        )
        assert prompted.stop_reason == "end_turn"

        # A mode switch and a model switch, reaching the agent's next turn.
        mark = editor.mark()
        await conn.set_session_mode(session_id=session_id, mode_id=NEW_MODE[provider])
        await editor.until(
            lambda: (
                {"sessionUpdate": "current_mode_update", "currentModeId": NEW_MODE[provider]}
                in editor.since(mark)
            )
        )
        answer = await conn.set_config_option(
            config_id="model", session_id=session_id, value=NEW_MODEL[provider]
        )
        current = {c.id: c.current_value for c in answer.config_options}
        assert current == {**current, "mode": NEW_MODE[provider], "model": NEW_MODEL[provider]}
        prompted = await conn.prompt(
            session_id=session_id, prompt=[text_block("Use the new settings")]
        )
        assert prompted.stop_reason == "end_turn"
        # A slash command typed in the editor runs the session's command.
        prompted = await conn.prompt(session_id=session_id, prompt=[text_block("/compact")])
        assert prompted.stop_reason == "end_turn"
        # An image prompt.
        prompted = await conn.prompt(
            session_id=session_id,
            prompt=[text_block("What is this?"), image_block(PNG_B64, "image/png")],
        )
        assert prompted.stop_reason == "end_turn"
        # The agent's usage, with its context window (Claude's too).
        usage = [u for u in editor.updates if u["sessionUpdate"] == "usage_update"]
        assert any(u["used"] > 0 for u in usage), usage
        assert all(u["size"] > 0 for u in usage), usage
    return session_id


def check_journal_controls(review: Review, session_id: str) -> None:
    events = review.journal(session_id)
    assert [e["body"]["name"] for e in events if e["kind"] == "command.run"] == ["compact"]
    submissions = [e["body"] for e in events if e["kind"] == "submission"]
    assert [b["text"] for b in submissions] == [
        "Before the switch",
        "Use the new settings",
        "What is this?",
    ]
    assert [a["type"] for a in submissions[-1]["attachments"]] == ["image"]


@pytest.mark.parametrize("provider", ["codex", "claude"])
def test_the_python_acp_sdk_switches_modes_and_models_runs_commands_and_sends_images(
    review: Review, provider: str
) -> None:
    _require_python_sdk()
    script_controls(review, provider)
    before = len(model_requests(review, provider))

    async def bounded() -> str:
        async with asyncio.timeout(SDK_TIMEOUT_S):
            return await py_controls(review, provider, review.workdir(f"py-controls-{provider}"))

    session_id = asyncio.run(bounded())
    check_controls(review, provider, before)
    check_journal_controls(review, session_id)


@pytest.mark.parametrize("provider", ["codex", "claude"])
def test_the_typescript_acp_sdk_switches_modes_and_models_runs_commands_and_sends_images(
    review: Review, provider: str
) -> None:
    node = _require_node()
    script_controls(review, provider)
    before = len(model_requests(review, provider))
    config = {
        "scenario": "controls",
        "provider": provider,
        "mode": NEW_MODE[provider],
        "model": NEW_MODEL[provider],
        "png": PNG_B64,
        "python": sys.executable,
        "socket": str(review.daemon.socket),
        "cwd": str(review.workdir(f"ts-controls-{provider}")),
    }
    done = subprocess.run(
        [node, str(DRIVER), json.dumps(config)],
        cwd=DRIVER.parent,
        capture_output=True,
        text=True,
        timeout=SDK_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"{done.stderr}\n--- journals:\n{review.journals()}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    check_controls(review, provider, before)
    check_journal_controls(review, report["session"])


def test_an_adopted_claude_conversation_replays_its_history_in_the_editor(
    review: Review,
) -> None:
    """A conversation started with ``claude -p`` outside the daemon, adopted with
    ``create {resumeFrom}``: ``session/load`` shows its messages as the user's and
    the agent's, as they were."""
    _require_python_sdk()
    from acp.stdio import spawn_agent_process

    assert CLAUDE_PROGRAM is not None
    cwd = review.workdir("adopted")
    review.anthropic.script(TextReply("Noted: KIWI."))
    handle = str(uuid.uuid4())
    subprocess.run(
        [CLAUDE_PROGRAM, "-p", "Remember the word KIWI", "--session-id", handle],
        cwd=cwd,
        env={**os.environ, **review.anthropic.claude_env(review.base / "claude-home")},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=SDK_TIMEOUT_S,
        check=True,
    )
    with Client(review.daemon.socket, timeout_s=SDK_TIMEOUT_S) as client:
        created = client.call(
            "agentSession.create",
            {"provider": "claude", "cwd": str(cwd), "resumeFrom": {"handle": handle}},
        )
    session_id = created["sessionId"]

    async def load() -> list[dict[str, Any]]:
        editor = PyEditor()
        async with (
            asyncio.timeout(SDK_TIMEOUT_S),
            spawn_agent_process(
                lambda agent: editor,  # type: ignore[arg-type,return-value]
                sys.executable,
                *["-m", "agentsctl.cli", "--socket", str(review.daemon.socket), "--no-start"],
                "acp",
            ) as (conn, _process),
        ):
            await conn.initialize(protocol_version=1)
            await conn.load_session(cwd=str(cwd), session_id=session_id)
        return editor.updates

    shown = [
        (u["sessionUpdate"], u["content"]["text"])
        for u in merged(asyncio.run(load()))
        if u["sessionUpdate"].endswith("message_chunk")
    ]
    assert shown == [
        ("user_message_chunk", "Remember the word KIWI"),
        ("agent_message_chunk", "Noted: KIWI."),
    ]


def test_an_acp_agents_own_modes_reach_the_editor_and_back(review: Review) -> None:
    """The tests' ACP agent offers modes ``ask`` and ``code``: the editor gets them
    with the agent's current one, its choice reaches the agent (which says its mode),
    and the agent's own switch reaches the editor."""
    _require_python_sdk()
    from acp import text_block
    from acp.stdio import spawn_agent_process

    cwd = review.workdir("acp-modes")

    async def run() -> None:
        editor = PyEditor()
        async with (
            asyncio.timeout(SDK_TIMEOUT_S),
            spawn_agent_process(
                lambda agent: editor,  # type: ignore[arg-type,return-value]
                sys.executable,
                *["-m", "agentsctl.cli", "--socket", str(review.daemon.socket), "--no-start"],
                *["acp", "--provider", "testacp"],
            ) as (conn, _process),
        ):
            await conn.initialize(protocol_version=1)
            new = await conn.new_session(cwd=str(cwd))
            session_id = new.session_id
            assert new.modes is not None
            assert new.modes.current_mode_id == "ask", "the mode the agent said it is in"
            assert [(m.id, m.name) for m in new.modes.available_modes] == [
                ("ask", "Ask"),
                ("code", "Code"),
            ]

            async def said(text: str) -> str:
                mark = editor.mark()
                prompted = await conn.prompt(session_id=session_id, prompt=[text_block(text)])
                assert prompted.stop_reason == "end_turn"
                return "".join(
                    u["content"]["text"]
                    for u in editor.since(mark)
                    if u["sessionUpdate"] == "agent_message_chunk"
                )

            assert await said("whatmode") == "mode: ask"
            mark = editor.mark()
            await conn.set_session_mode(session_id=session_id, mode_id="code")
            assert await said("whatmode") == "mode: code"
            # The agent's own switch (``switch``) reaches the editor as the current mode.
            await editor.until(
                lambda: (
                    {"sessionUpdate": "current_mode_update", "currentModeId": "code"}
                    in editor.since(mark)
                )
            )
            await conn.set_session_mode(session_id=session_id, mode_id="ask")
            mark = editor.mark()
            await said("switch")
            await editor.until(
                lambda: (
                    {"sessionUpdate": "current_mode_update", "currentModeId": "code"}
                    in editor.since(mark)
                )
            )

    asyncio.run(run())
