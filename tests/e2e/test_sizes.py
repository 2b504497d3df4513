"""Sizes are bounded at the door (issue 18): limits refused at create with a clear
kind, a stored session's id never lost, ``list`` in pages no size can break, bad
input quoted in bounded excerpts, and the CLI never prints control characters raw."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsd_protocol.api.session import LIST_PAGE_BYTES, MAX_ARG_BYTES, MAX_ENV_BYTES
from tests.daemon_process import DaemonProcess, WireClient, make_temp_dir, running_daemon
from tests.e2e.conftest import assert_error
from tests.e2e.reliability import PingProbe

CLI_TIMEOUT_S = 60.0
INVALID_PARAMS = -32602
ENTRY_VALUE = "v" * (MAX_ARG_BYTES - 100)  # one env entry just within its limit


@pytest.fixture
def base() -> Iterator[Path]:
    path = make_temp_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def create(client: WireClient, workdir: Path, /, **params: Any) -> dict[str, Any]:
    reply: dict[str, Any] = client.call(
        "agentSession.create", {"provider": "mock", "cwd": str(workdir), **params}
    )
    return reply


def all_sessions(client: WireClient, **params: Any) -> list[dict[str, Any]]:
    sessions: list[dict[str, Any]] = []
    cursor = None
    while True:
        result = client.call("agentSession.list", {**params, "cursor": cursor})["result"]
        sessions += result["sessions"]
        if (cursor := result.get("nextCursor")) is None:
            return sessions


def cli(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentsctl.cli", "--socket", str(daemon.socket), "--no-start",
         *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
        check=False,
    )  # fmt: skip


def test_an_environment_too_large_for_exec_still_returns_the_id(base: Path) -> None:
    # The daemon's own environment (which agents inherit outside systemd) fills most
    # of what exec takes; a session env within its limits then tips it over.
    arg_max = os.sysconf("SC_ARG_MAX")
    chunk = 100_000
    fill = {f"FILL_{i}": "f" * chunk for i in range((arg_max - 150_000) // chunk)}
    session_env = {"BIG_A": ENTRY_VALUE, "BIG_B": ENTRY_VALUE}
    with (
        running_daemon(env=fill) as daemon,
        daemon.connect() as client,
        PingProbe(daemon.socket) as probe,
    ):
        reply = create(client, base, env=session_env)
        assert "error" in reply, reply
        data = reply["error"]["data"]
        session_id = data["sessionId"]
        assert isinstance(session_id, str) and session_id
        listed = {s["sessionId"]: s for s in all_sessions(client, brief=True)}
        assert listed[session_id]["phase"] == "stopped"
        assert listed[session_id]["error"]["kind"] == data["kind"]
        # The same operation again replays the stored session.
        op = {"clientOperationId": "op-e2big", "env": session_env}
        first = create(client, base, **op)
        again = create(client, base, **op)
        assert again["result"]["sessionId"] == first["error"]["data"]["sessionId"]
        probe.check()


def test_megabytes_of_env_in_sessions_do_not_break_ls(base: Path) -> None:
    env = {"BIG_A": ENTRY_VALUE, "BIG_B": ENTRY_VALUE}
    count = 40  # about 10 MB of env: more than a client's 8 MiB frame bound
    with (
        running_daemon() as daemon,
        daemon.connect() as client,
        PingProbe(daemon.socket) as probe,
    ):
        ids = {
            create(client, base, env=env, start=False)["result"]["sessionId"] for _ in range(count)
        }
        first = client.call("agentSession.list", {})["result"]  # an old client: no paging params
        assert first["nextCursor"] is not None and 0 < len(first["sessions"]) < count
        assert len(first["sessions"]) * 2 * len(ENTRY_VALUE) <= LIST_PAGE_BYTES
        assert {s["sessionId"] for s in all_sessions(client)} == ids
        brief = client.call("agentSession.list", {"brief": True})["result"]
        assert len(brief["sessions"]) == count and brief["sessions"][0]["env"] == {}

        ls = cli(daemon, "ls")
        assert ls.returncode == 0, ls.stderr
        assert len(ls.stdout.splitlines()) == count + 1
        as_json = cli(daemon, "ls", "--json")
        assert as_json.returncode == 0, as_json.stderr[-2000:]
        assert as_json.stdout.count('"sessionId"') == count
        probe.check()


@pytest.mark.parametrize(
    ("params", "limit"),
    [
        pytest.param({"env": {f"K{i}": ENTRY_VALUE for i in range(3)}}, "env", id="env-total"),
        pytest.param({"env": {"K": "v" * MAX_ARG_BYTES}}, "env entry", id="env-entry"),
        pytest.param({"options": {"x": "o" * 70_000}}, "options", id="options"),
        pytest.param({"command": ["a" * 100_000] * 3}, "command", id="command-total"),
        pytest.param({"command": ["a" * MAX_ARG_BYTES]}, "command argument", id="command-arg"),
        pytest.param({"cwd": "/" + "c" * 5000}, "cwd", id="cwd"),
    ],
)
def test_limits_are_refused_at_create_naming_the_limit(
    daemon: DaemonProcess, base: Path, params: dict[str, Any], limit: str
) -> None:
    with daemon.connect() as client:
        before = len(all_sessions(client, brief=True))
        error = assert_error(create(client, base, **params), INVALID_PARAMS, "invalid_params")
        assert error["data"]["limit"] == limit, error
        assert len(error["message"]) < 300, error["message"]
        assert len(all_sessions(client, brief=True)) == before  # nothing was stored
    assert 3 * (len(ENTRY_VALUE) + 4) > MAX_ENV_BYTES  # the env-total case is over


def test_a_1_mib_cwd_is_not_echoed_back_whole(daemon: DaemonProcess, base: Path) -> None:
    with daemon.connect() as client:
        reply = create(client, base, cwd="/" + "x" * (1024 * 1024))
    error = assert_error(reply, INVALID_PARAMS, "invalid_params")
    assert len(reply["error"]["message"]) < 300
    assert len(str(error["data"])) < 300


def test_titles_with_terminal_escapes_are_shown_escaped_by_ls_and_show(
    daemon: DaemonProcess, base: Path
) -> None:
    title = "\x1b]0;owned\x07\x1b[2Jtitle\x9b31m\r"
    with daemon.connect() as client:
        session_id = create(client, base, title=title, start=False)["result"]["sessionId"]
    ls = cli(daemon, "ls")
    show = cli(daemon, "show", session_id)
    for out in (ls, show):
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "\x9b" not in out.stdout
        assert "\r" not in out.stdout
        assert "\\x1b]0;owned\\x07\\x1b[2Jtitle\\x9b31m\\r" in out.stdout
