"""The providers every agentsd knows without any config, shared by the daemon (which
runs them) and clients (which offer their names, e.g. in shell completion, when no
daemon answers).

``BUILTIN_PROVIDERS`` are the providers agentsd speaks natively; an ``[agents.NAME]``
table cannot take their names. ``BUILTIN_ACP_AGENTS`` is the registry of well-known
ACP agents, checked against the public ACP agent registry
(agentclientprotocol/registry) and the agents' npm packages: the name a session gives
as its provider, the command the agent starts with, and the package that installs
it. A config's ``[agents.NAME]`` adds agents or replaces these; only a daemon knows
the result (``daemon.status`` ``providers``).
"""

from __future__ import annotations

from typing import NamedTuple

BUILTIN_PROVIDERS = ("mock", "codex", "claude")


class BuiltinAcpAgent(NamedTuple):
    name: str  # the session's provider name
    command: tuple[str, ...]
    display_name: str
    npm: str  # the npm package that installs it


BUILTIN_ACP_AGENTS = (
    BuiltinAcpAgent("codex-acp", ("codex-acp",), "Codex (ACP)", "@zed-industries/codex-acp"),
    BuiltinAcpAgent(
        "claude-agent-acp",
        ("claude-agent-acp",),
        "Claude Agent (ACP)",
        "@zed-industries/claude-agent-acp",
    ),
    BuiltinAcpAgent("gemini", ("gemini", "--acp"), "Gemini CLI", "@google/gemini-cli"),
)


def builtin_provider_names() -> list[str]:
    """The names ``create`` takes on a daemon with no ``[agents.NAME]``, in this order:
    the native providers, then the ACP registry."""
    return [*BUILTIN_PROVIDERS, *(agent.name for agent in BUILTIN_ACP_AGENTS)]
