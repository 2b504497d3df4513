"""ACP agents as providers: agentsd is the *client* side of the Agent Client Protocol.

The wire is JSON-RPC 2.0 (with ``"jsonrpc": "2.0"``), one object per line, over the
agent's stdio (protocol version 1, agentclientprotocol/agent-client-protocol), spoken
through ``codex_rpc.RpcPeer``. The provider is split along the protocol's parts:

- ``acp_agents``: which agents there are (the built-in registry and the config's
  ``[agents.NAME]``), and ``AcpProvider`` here: how one is launched.
- ``acp_handshake``: opening a session (``initialize``, ``session/new``,
  ``session/resume`` or ``session/load``, ``session/set_mode``), including native
  resume and the fresh session that supersedes one that cannot be resumed.
- ``acp_adapter``: the open session: turns (``session/prompt``, ``session/cancel``),
  the reader, and the agent's requests.
- ``acp_updates``: ``session/update`` as journal events; ``acp_permissions``:
  ``session/request_permission`` as approvals.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import Any

from agentsd.providers.acp_adapter import AcpAdapter
from agentsd.providers.acp_agents import AcpAgent
from agentsd.providers.acp_handshake import parse_options
from agentsd.providers.base import (
    Adapter,
    LaunchSpec,
    LineLink,
    OptionSpec,
    Provider,
    SessionSink,
)
from agentsd.store.sessions import SessionRow
from agentsd_protocol.errors import AgentNotFound

# The session mode changes live (``session/set_mode``); the agent lists its modes.
OPTION_SPECS = {
    "mode": OptionSpec(applies_at="now", description="the agent's session mode"),
    "mcpServers": OptionSpec(
        applies_at="nextStart", description="MCP servers the agent starts (ACP's shape)"
    ),
}


class AcpProvider(Provider):
    """One ACP agent, by the name sessions give as their provider."""

    def __init__(self, agent: AcpAgent) -> None:
        self.name = agent.name
        self.agent = agent

    def launch(self, session: SessionRow, state_dir: Any, env: Mapping[str, str]) -> LaunchSpec:
        """``session.command``, else the agent's command, its program resolved on the
        agent's PATH. Raises ``InvalidParams`` for bad options and ``AgentNotFound``
        when the program is not there."""
        parse_options(session.options)
        argv = list(session.command or self.agent.command)
        path = {**env, **self.agent.env, **session.env}.get("PATH", "")
        # Resolved here, so the daemon's status finds the version it reported by path.
        program = shutil.which(argv[0], path=path)
        if program is None:
            raise AgentNotFound(
                f"cannot start {self.agent.display_name}: {argv[0]} is not installed; "
                f"{self.agent.install_hint()}"
            )
        return LaunchSpec(argv=[program, *argv[1:]], env=self.agent.env)

    content_types = frozenset({"file"})  # resource_link: every ACP agent takes it

    def refused_content(self, types: set[str], adapter: Adapter | None) -> str | None:
        """Images only when the running agent said at ``initialize`` it takes them
        (``promptCapabilities.image``); a stopped session is started to ask first."""
        if "image" in types and not (isinstance(adapter, AcpAdapter) and adapter.takes_images):
            return "image"
        return super().refused_content(types - {"image"}, adapter)

    def adapter(self, link: LineLink, sink: SessionSink, session: SessionRow) -> Adapter:
        return AcpAdapter(link, sink, session, self.agent)

    def option_specs(self) -> Mapping[str, OptionSpec]:
        return OPTION_SPECS

    def check_options(self, options: Mapping[str, Any]) -> None:
        parse_options(options)
