"""Provider adapters (one module per agent protocol) and the mock agent program.

This package module stays import-light: ``python -m agentsd.providers.mock_agent``
imports it first, and the mock agent must start without trio or msgspec (tests start
hundreds of them). Adapters are imported where they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentsd.providers.base import Provider


def provider_registry() -> dict[str, Provider]:
    """Every provider the daemon knows, by name."""
    from agentsd.providers.claude import ClaudeProvider
    from agentsd.providers.codex import CodexProvider
    from agentsd.providers.mock import MockProvider

    providers: list[Provider] = [MockProvider(), CodexProvider(), ClaudeProvider()]
    return {p.name: p for p in providers}
