"""ACP agents by name: the built-in registry (``agentsd_protocol.providers``, which
clients share), and the config's ``[agents.NAME]``, which adds an agent or replaces a
built-in one of the same name.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from agentsd.config import AgentConfig
from agentsd_protocol.providers import BUILTIN_ACP_AGENTS


@attrs.frozen
class AcpAgent:
    name: str  # the session's provider name
    command: tuple[str, ...]
    display_name: str
    npm: str | None = None  # the npm package that installs it, for hints
    env: Mapping[str, str] = attrs.field(factory=dict)

    def install_hint(self) -> str:
        if self.npm is None:
            return "install it, or fix the command in its [agents.NAME] table"
        return f"install it (`npm install -g {self.npm}`) or set [agents.{self.name}] command"


BUILTIN_AGENTS: Mapping[str, AcpAgent] = {
    entry.name: AcpAgent(entry.name, entry.command, entry.display_name, entry.npm)
    for entry in BUILTIN_ACP_AGENTS
}


def acp_agents(configured: Mapping[str, AgentConfig]) -> dict[str, AcpAgent]:
    """The built-in agents with the config's added or replacing them."""
    agents = dict(BUILTIN_AGENTS)
    for name, entry in configured.items():
        builtin = BUILTIN_AGENTS.get(name)
        agents[name] = AcpAgent(
            name=name,
            command=tuple(entry.command),
            display_name=entry.display_name or (builtin.display_name if builtin else name),
            npm=builtin.npm if builtin is not None else None,
            env=dict(entry.env),
        )
    return agents
