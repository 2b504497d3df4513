"""Provider adapters (one module per agent protocol) and the mock agent program.

This package module stays import-light: ``python -m agentsd.providers.mock_agent``
imports it first, and the mock agent must start without trio or msgspec (tests start
hundreds of them). Adapters are imported where they are used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentsd.config import AgentConfig
    from agentsd.providers.base import Provider

# An [agents.NAME] cannot take these names (agentsd_protocol: clients know them too).
from agentsd_protocol.providers import BUILTIN_PROVIDERS

__all__ = ["BUILTIN_PROVIDERS", "provider_registry"]


def provider_registry(agents: Mapping[str, AgentConfig] | None = None) -> dict[str, Provider]:
    """Every provider the daemon knows, by name: the built-in ones and every ACP agent
    (the built-in registry, and ``agents`` from the config)."""
    from agentsd.providers.acp import AcpProvider
    from agentsd.providers.acp_agents import acp_agents
    from agentsd.providers.claude import ClaudeProvider
    from agentsd.providers.codex import CodexProvider
    from agentsd.providers.mock import MockProvider

    providers: list[Provider] = [MockProvider(), CodexProvider(), ClaudeProvider()]
    registry = {p.name: p for p in providers}
    for name, agent in acp_agents(agents or {}).items():
        registry.setdefault(name, AcpProvider(agent))
    return registry
