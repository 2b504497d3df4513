"""A Codex session's options, and the Codex versions agentsd speaks to (pure).

Options come from ``agentSession.create``'s ``options`` (and ``setOptions``); they
are checked when the agent starts (and by ``setOptions``), so a typo fails with
``InvalidParams`` naming the option instead of being silently ignored. They apply to
every thread start or resume; the model, effort, approval policy and sandbox also
apply live, as overrides on the next ``turn/start`` (``OPTION_SPECS``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from agentsd.providers.base import OptionSpec
from agentsd.providers.mcp_servers import codex_config, parse_mcp_servers
from agentsd_protocol.errors import InvalidParams

MIN_VERSION = (0, 160, 0)  # the oldest the test extras install: thread/turn API v2, steer
_VERSION = re.compile(r"^[^/]*/(\d+\.\d+\.\d+[^\s(]*)")


@attrs.frozen
class CodexOptions:
    """A session's create-time ``options`` for Codex, checked."""

    model: str | None = None
    approval_policy: str | dict[str, Any] = "on-request"
    sandbox: str = "workspace-write"
    effort: str | None = None  # reasoning effort of each turn
    developer_instructions: str | None = None
    config: dict[str, Any] | None = None  # Codex config overrides (dotted keys) per thread
    mcp_servers: list[dict[str, Any]] | None = None  # ACP-shaped (``mcp_servers``)

    def thread_params(self) -> dict[str, Any]:
        """What ``thread/start`` and ``thread/resume`` take from the options."""
        params: dict[str, Any] = {"approvalPolicy": self.approval_policy, "sandbox": self.sandbox}
        if self.model is not None:
            params["model"] = self.model
        if self.developer_instructions is not None:
            params["developerInstructions"] = self.developer_instructions
        servers = codex_config(parse_mcp_servers(self.mcp_servers or []))
        if self.config is not None or servers:
            params["config"] = {**servers, **(self.config or {})}  # the session's own wins
        return params

    def turn_overrides(self, keys: set[str]) -> dict[str, Any]:
        """``turn/start``'s overrides of the options named in ``keys``."""
        params: dict[str, Any] = {}
        if "model" in keys and self.model is not None:
            params["model"] = self.model
        if "effort" in keys and self.effort is not None:
            params["effort"] = self.effort
        if "approvalPolicy" in keys:
            params["approvalPolicy"] = self.approval_policy
        if "sandbox" in keys:
            params["sandboxPolicy"] = SANDBOX_POLICIES[self.sandbox]
        return params


APPROVAL_POLICIES = ("untrusted", "on-request", "never")
SANDBOXES = ("read-only", "workspace-write", "danger-full-access")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
# ``turn/start``'s sandboxPolicy of each sandbox mode (app-server protocol v2).
SANDBOX_POLICIES = {
    "read-only": {"type": "readOnly"},
    "workspace-write": {"type": "workspaceWrite"},
    "danger-full-access": {"type": "dangerFullAccess"},
}
# Per-turn overrides (turn/start's model, effort, approvalPolicy, sandboxPolicy) apply
# "to this turn and subsequent turns": a change reaches the next turn the daemon
# starts. The others are thread settings, taken at thread start or resume. Models
# are open: a custom model provider serves models Codex's catalog does not list.
OPTION_SPECS: dict[str, OptionSpec] = {
    "model": OptionSpec(applies_at="nextTurn", description="the model of each turn"),
    "effort": OptionSpec(
        applies_at="nextTurn", choices=EFFORTS, description="reasoning effort of each turn"
    ),
    "approvalPolicy": OptionSpec(
        applies_at="nextTurn",
        choices=APPROVAL_POLICIES,
        description="when Codex asks before running a command (or {granular: ...})",
    ),
    "sandbox": OptionSpec(
        applies_at="nextTurn",
        choices=SANDBOXES,
        open=False,
        description="what commands may touch",
    ),
    "developerInstructions": OptionSpec(
        applies_at="nextStart", description="instructions added to the thread"
    ),
    "config": OptionSpec(applies_at="nextStart", description="Codex config overrides"),
    "mcpServers": OptionSpec(
        applies_at="nextStart", description="MCP servers the agent starts (ACP's shape)"
    ),
}
_OPTION_NAMES = {
    "model": "model",
    "approvalPolicy": "approval_policy",
    "sandbox": "sandbox",
    "effort": "effort",
    "developerInstructions": "developer_instructions",
    "config": "config",
    "mcpServers": "mcp_servers",
}


def parse_options(options: Mapping[str, Any]) -> CodexOptions:
    """Check a session's options; ``InvalidParams`` names the first bad one."""
    unknown = sorted(set(options) - set(_OPTION_NAMES))
    if unknown:
        raise InvalidParams(
            f"Invalid params: unknown codex option {unknown[0]!r} "
            f"(known: {', '.join(sorted(_OPTION_NAMES))})",
            option=unknown[0],
        )
    for name in ("model", "effort", "developerInstructions"):
        if name in options and not isinstance(options[name], str):
            raise InvalidParams(f"Invalid params: codex option {name!r} must be a string")
    policy = options.get("approvalPolicy", "on-request")
    granular = isinstance(policy, dict) and set(policy) == {"granular"}
    if policy not in APPROVAL_POLICIES and not granular:
        raise InvalidParams(
            f"Invalid params: codex option 'approvalPolicy' must be one of "
            f"{', '.join(APPROVAL_POLICIES)} (or {{'granular': {{...}}}}), got {policy!r}"
        )
    sandbox = options.get("sandbox", "workspace-write")
    if sandbox not in SANDBOXES:
        raise InvalidParams(
            f"Invalid params: codex option 'sandbox' must be one of {', '.join(SANDBOXES)}, "
            f"got {sandbox!r}"
        )
    if "config" in options and not isinstance(options["config"], dict):
        raise InvalidParams("Invalid params: codex option 'config' must be an object")
    if "mcpServers" in options:
        codex_config(parse_mcp_servers(options["mcpServers"]))  # checked now, not at start
    return CodexOptions(**{_OPTION_NAMES[k]: v for k, v in options.items()})


def parse_version(user_agent: str) -> str | None:
    """The Codex version in ``initialize``'s ``userAgent`` (``name/0.163.0 (...)``:
    the name is the client's, from ``clientInfo``)."""
    match = _VERSION.match(user_agent)
    return None if match is None else match.group(1)
