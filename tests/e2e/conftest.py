"""Fixtures for end-to-end tests against a real daemon over a real socket.

The daemon fixtures are module-scoped: starting one costs ~0.3 s (importing trio), and
every test that uses one ends by checking it still answers, so a test that breaks the
daemon fails where it happened.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from agentsd_protocol.framing import Framing
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon

SMALL_MAX_FRAME_BYTES = 4096


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    with running_daemon() as d:
        yield d


@pytest.fixture(scope="module")
def small_frames_daemon() -> Iterator[DaemonProcess]:
    """A daemon configured (through ``--config``) to refuse frames over 4 KiB."""
    config_dir = make_temp_dir()
    config = config_dir / "config.toml"
    config.write_text(f"max_frame_bytes = {SMALL_MAX_FRAME_BYTES}\n")
    try:
        with running_daemon(extra_args=["--config", str(config)]) as d:
            yield d
    finally:
        shutil.rmtree(config_dir, ignore_errors=True)


@pytest.fixture(params=list(Framing), ids=lambda f: f.value)
def framing(request: pytest.FixtureRequest) -> Framing:
    value: Framing = request.param
    return value


def assert_error(reply: Any, code: int, kind: str | None = None) -> dict[str, Any]:
    """``reply`` is a JSON-RPC error response with ``code``; every error carries
    ``data.kind`` and ``data.retryable`` and never a traceback."""
    assert isinstance(reply, dict), reply
    assert reply.get("jsonrpc") == "2.0", reply
    assert "result" not in reply, reply
    error = reply["error"]
    assert error["code"] == code, reply
    assert isinstance(error["message"], str) and error["message"], reply
    assert "Traceback" not in error["message"], reply
    assert isinstance(error["data"]["kind"], str), reply
    assert isinstance(error["data"]["retryable"], bool), reply
    if kind is not None:
        assert error["data"]["kind"] == kind, reply
    out: dict[str, Any] = error
    return out
