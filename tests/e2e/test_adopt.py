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
