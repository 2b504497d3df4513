"""ACP agents by name: the built-in registry, and the config's ``[agents.NAME]``.

Each entry is what a user installs to get that agent, checked against the public
ACP agent registry (agentclientprotocol/registry) and the agents' npm packages: the
command it is started with, and where it comes from. ``[agents.NAME]`` in the
config adds an agent or replaces a built-in one of the same name.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from agentsd.config import AgentConfig


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
    agent.name: agent
    for agent in (
        AcpAgent("codex-acp", ("codex-acp",), "Codex (ACP)", "@zed-industries/codex-acp"),
        AcpAgent(
            "claude-agent-acp",
            ("claude-agent-acp",),
            "Claude Agent (ACP)",
            "@zed-industries/claude-agent-acp",
        ),
        AcpAgent("gemini", ("gemini", "--acp"), "Gemini CLI", "@google/gemini-cli"),
    )
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
