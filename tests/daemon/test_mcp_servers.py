"""A session's ``mcpServers`` option as each agent takes it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentsd.providers.acp_handshake import parse_options as acp_options
from agentsd.providers.claude import option_flags
from agentsd.providers.codex_options import parse_options as codex_options
from agentsd.providers.mcp_servers import acp_servers, parse_mcp_servers
from agentsd_protocol.errors import InvalidParams

STDIO = {
    "name": "files",
    "command": "/usr/bin/mcp-files",
    "args": ["--root", "/w"],
    "env": [{"name": "TOKEN", "value": "t"}],
}
HTTP = {"type": "http", "name": "docs", "url": "http://127.0.0.1:9/mcp", "headers": []}


def test_codex_gets_config_overrides_under_the_sessions_own() -> None:
    options = codex_options({"mcpServers": [STDIO, HTTP], "config": {"mcp_servers.docs.url": "x"}})
    assert options.thread_params()["config"] == {
        "mcp_servers.files.command": "/usr/bin/mcp-files",
        "mcp_servers.files.args": ["--root", "/w"],
        "mcp_servers.files.env": {"TOKEN": "t"},
        "mcp_servers.docs.url": "x",  # the session's own config wins
    }


def test_claude_gets_an_mcp_config() -> None:
    flags = option_flags({"mcpServers": [STDIO, HTTP]})
    assert flags[0] == "--mcp-config"
    assert json.loads(flags[1]) == {
        "mcpServers": {
            "files": {
                "type": "stdio",
                "command": "/usr/bin/mcp-files",
                "args": ["--root", "/w"],
                "env": {"TOKEN": "t"},
            },
            "docs": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {}},
        }
    }
    assert option_flags({"mcpServers": []}) == []


def test_an_acp_agent_gets_them_as_given() -> None:
    assert acp_options({"mcpServers": [STDIO]}) is None
    assert acp_servers(parse_mcp_servers([STDIO, HTTP])) == [STDIO, HTTP]


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "x"},  # no command
        {"name": "a b", "command": "c"},  # a name no config key can hold
        {"name": "x", "command": "c", "args": "--flag"},
        {"name": "x", "command": "c", "env": [{"name": "A"}]},
        {"type": "ws", "name": "x", "url": "u"},
        "not a server",
    ],
)
def test_bad_servers_are_refused_by_every_provider(bad: Any) -> None:
    for check in (
        lambda: codex_options({"mcpServers": [bad]}),
        lambda: option_flags({"mcpServers": [bad]}),
        lambda: acp_options({"mcpServers": [bad]}),
    ):
        with pytest.raises(InvalidParams) as refused:
            check()
        assert "mcpServers" in str(refused.value)


def test_codex_refuses_an_sse_server() -> None:
    with pytest.raises(InvalidParams, match="SSE"):
        codex_options({"mcpServers": [{**HTTP, "type": "sse"}]})
