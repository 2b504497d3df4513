"""``create {resumeFrom}`` refusals over the real socket: what cannot be adopted is
refused before any session is stored (the adoptions themselves run against the
real agents in ``tests/peers/test_*_controls.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from tests.daemon_process import DaemonProcess
from tests.e2e.test_sessions import TEST_TIMEOUT_S, CallFailed, open_rpc


async def test_what_cannot_be_adopted_is_refused_before_a_session_is_stored(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    cases: list[dict[str, Any]] = [
        {"provider": "mock", "resumeFrom": {"handle": "abc"}},  # the mock cannot adopt
        {"provider": "codex", "resumeFrom": {"handle": "abc"}, "start": False},
        {"provider": "codex", "resumeFrom": {"handle": "--help"}},
        {"provider": "claude", "resumeFrom": {"handle": "../../etc/passwd"}},
        {"provider": "claude", "resumeFrom": {"handle": ""}},
        {"provider": "claude", "resumeFrom": {}},
    ]
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            before = (await rpc.call("agentSession.list", {}))["sessions"]
            for params in cases:
                with pytest.raises(CallFailed) as caught:
                    await rpc.call("agentSession.create", {"cwd": str(tmp_path), **params})
                assert caught.value.kind == "invalid_params", params
            assert (await rpc.call("agentSession.list", {}))["sessions"] == before


async def test_a_conversation_another_session_holds_is_not_adopted(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    """Two sessions on one conversation would interleave two agents' turns in it:
    a handle some stored session holds is refused, nothing stored."""
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            held = await rpc.call("agentSession.create", {"provider": "mock", "cwd": str(tmp_path)})
            handle = held["session"]["providerHandle"]
            assert handle
            before = (await rpc.call("agentSession.list", {}))["sessions"]
            for provider in ("codex", "claude"):
                with pytest.raises(CallFailed) as caught:
                    await rpc.call(
                        "agentSession.create",
                        {
                            "provider": provider,
                            "cwd": str(tmp_path),
                            "resumeFrom": {"handle": handle},
                        },
                    )
                assert caught.value.kind == "conversation_in_use"
                assert caught.value.data["sessionId"] == held["sessionId"]
            assert (await rpc.call("agentSession.list", {}))["sessions"] == before
