"""A session's MCP servers (option ``mcpServers``), as each agent takes them (pure).

The option is a list in ACP's own shape (what an editor passes to ``session/new``,
so ``agentsctl acp`` forwards it unchanged): ``{name, command, args, env: [{name,
value}]}`` for a stdio server, ``{type: "http" | "sse", name, url, headers: [{name,
value}]}`` for a remote one. It is kept with the session's options, so every start
and native resume gets the same servers.

- Codex: thread config overrides ``mcp_servers.NAME.command`` / ``args`` / ``env``
  (stdio) or ``url`` / ``http_headers`` (http), merged under the session's own
  ``config`` (which wins).
- Claude Code: ``--mcp-config`` with ``{"mcpServers": {NAME: {type, ...}}}``.
- ACP agents: ``mcpServers`` of ``session/new`` and ``session/load`` as given.

Agents are untrusted (DESIGN invariant 9): a server's command runs with the user's
uid, outside any agent sandbox, exactly as the user's own agent configuration would;
only the user (creating or changing the session) chooses it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

from agentsd_protocol.errors import InvalidParams

OPTION = "mcpServers"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a TOML bare key and a CLI-safe name


@attrs.frozen
class McpServer:
    name: str
    transport: str  # "stdio", "http" or "sse"
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = attrs.field(factory=dict)
    url: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict)


def _bad(why: str) -> InvalidParams:
    return InvalidParams(f"Invalid params: option {OPTION!r}: {why}", option=OPTION)


def _pairs(value: Any, what: str) -> dict[str, str]:
    """ACP's ``[{name, value}]`` as a dict (a plain object is taken too)."""
    if value is None:
        return {}
    if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
        return {str(k): v for k, v in value.items()}
    if not isinstance(value, list):
        raise _bad(f"{what} must be a list of {{name, value}}")
    out: dict[str, str] = {}
    for pair in value:
        if not (
            isinstance(pair, dict)
            and isinstance(pair.get("name"), str)
            and isinstance(pair.get("value"), str)
        ):
            raise _bad(f"{what} must be a list of {{name, value}} strings")
        out[pair["name"]] = pair["value"]
    return out


def parse_mcp_servers(value: Any) -> list[McpServer]:
    """The option's servers, checked; ``InvalidParams`` says what is wrong."""
    if not isinstance(value, list):
        raise _bad("must be a list of MCP servers")
    servers: list[McpServer] = []
    for raw in value:
        if not isinstance(raw, dict):
            raise _bad("each server must be an object")
        name = raw.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise _bad(f"a server's name must be letters, digits, '_' or '-', got {name!r}")
        if name in {s.name for s in servers}:
            raise _bad(f"two servers are named {name!r}")
        transport = raw.get("type", "stdio")
        if transport == "stdio":
            command, args = raw.get("command"), raw.get("args", [])
            if not isinstance(command, str) or not command:
                raise _bad(f"server {name!r} needs a command")
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise _bad(f"server {name!r}: args must be a list of strings")
            env = _pairs(raw.get("env"), f"server {name!r}: env")
            servers.append(McpServer(name, "stdio", command=command, args=tuple(args), env=env))
        elif transport in ("http", "sse"):
            url = raw.get("url")
            if not isinstance(url, str) or not url:
                raise _bad(f"server {name!r} needs a url")
            headers = _pairs(raw.get("headers"), f"server {name!r}: headers")
            servers.append(McpServer(name, transport, url=url, headers=headers))
        else:
            raise _bad(f"server {name!r}: unknown type {transport!r} (stdio, http or sse)")
    return servers


def codex_config(servers: list[McpServer]) -> dict[str, Any]:
    """Codex thread config overrides (dotted keys) for ``servers``. Codex speaks
    stdio and streamable HTTP; an SSE server is refused."""
    config: dict[str, Any] = {}
    for server in servers:
        key = f"mcp_servers.{server.name}"
        if server.transport == "stdio":
            config[f"{key}.command"] = server.command
            config[f"{key}.args"] = list(server.args)
            if server.env:
                config[f"{key}.env"] = dict(server.env)
        elif server.transport == "http":
            config[f"{key}.url"] = server.url
            if server.headers:
                config[f"{key}.http_headers"] = dict(server.headers)
        else:
            raise _bad(f"server {server.name!r}: codex does not speak MCP over SSE")
    return config


def claude_mcp_config(servers: list[McpServer]) -> str:
    """The JSON of Claude Code's ``--mcp-config`` for ``servers``."""
    entries: dict[str, Any] = {}
    for server in servers:
        if server.transport == "stdio":
            entries[server.name] = {
                "type": "stdio",
                "command": server.command,
                "args": list(server.args),
                "env": dict(server.env),
            }
        else:
            entries[server.name] = {
                "type": server.transport,
                "url": server.url,
                "headers": dict(server.headers),
            }
    return json.dumps({"mcpServers": entries})


def acp_servers(servers: list[McpServer]) -> list[dict[str, Any]]:
    """``servers`` in ACP's shape, for an ACP agent's ``session/new``."""
    out: list[dict[str, Any]] = []
    for server in servers:
        if server.transport == "stdio":
            out.append(
                {
                    "name": server.name,
                    "command": server.command,
                    "args": list(server.args),
                    "env": [{"name": k, "value": v} for k, v in server.env.items()],
                }
            )
        else:
            out.append(
                {
                    "type": server.transport,
                    "name": server.name,
                    "url": server.url,
                    "headers": [{"name": k, "value": v} for k, v in server.headers.items()],
                }
            )
    return out
