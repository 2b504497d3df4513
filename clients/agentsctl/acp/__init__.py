"""``agentsctl acp``: an Agent Client Protocol agent on stdio, backed by agentsd.

An ACP editor (Zed, the ACP clients of Neovim and Emacs, ...) starts
``agentsctl acp [--session ID | --provider P --cwd DIR]`` as its agent and drives a
daemon-held session through it. Covered (ACP v1):

- ``initialize``: protocol version 1; ``loadSession``, image prompts, embedded
  context in prompts, MCP servers, ``session/list`` and ``session/resume``.
- ``session/new`` creates a daemon session (or binds ``--session``); its id is the
  ACP session id. ``session/load`` replays the journal as ``session/update``s, then
  follows live; ``session/resume`` follows live without the replay. Each answers
  the session's modes and config options (``controls``).
- ``session/prompt`` answers ``end_turn``, ``cancelled`` or ``refusal`` when its turn
  ends; ``session/cancel`` interrupts it. A ``/command`` the session lists runs as
  ``agentSession.command``.
- ``session/set_mode``, ``session/set_config_option`` (model, effort, mode) and the
  unstable ``session/set_model`` change the session's options.
- ``session/update``: ``user_message_chunk`` (prompts from other clients, and all of
  them on load), ``agent_message_chunk`` (streamed deltas), ``agent_thought_chunk``
  (reasoning, agentsd's notes), ``tool_call`` and ``tool_call_update`` (tool items and
  approvals), ``plan``, ``usage_update``, ``session_info_update``,
  ``current_mode_update``, ``config_option_update`` and ``available_commands_update``.
- ``session/request_permission`` for each approval, about the tool call it gates
  (one toolCallId from the question to the tool's result, when the agent names the
  tool); ``$/cancel_request`` withdraws it when another client answered first, and
  cancels the editor's own requests.

Not covered: audio prompts (not advertised), the editor's ``fs/*`` and
``terminal/*`` methods (agents run in the daemon's sessions, not in the editor),
``authenticate``, ``session/close`` and ``session/delete`` (a session outlives every
client: ``agentsctl close``/``rm``).

Modules: ``schema`` (ACP wire types), ``updates`` (journal -> updates), ``turns``
(prompt and approval bookkeeping), ``tools`` (what a tool call shows) and
``controls`` (options and commands as modes, config options and commands) are pure; ``peer`` (JSON-RPC on the pipes),
``bridge`` (the glue) and ``stdio`` (the process) do the I/O; ``command`` is the CLI
row. This package imports nothing itself (PEP 562): the CLI loads ``command`` to
build its parser, and trio comes in only when the bridge runs.
"""

from __future__ import annotations

# typing costs a few ms of cold start and is needed by the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from agentsctl.acp.bridge import BridgeConfig
    from agentsctl.acp.stdio import run_bridge, serve_acp

__all__ = ["BridgeConfig", "run_bridge", "serve_acp"]


def __getattr__(name: str) -> object:
    if name == "BridgeConfig":
        from agentsctl.acp import bridge

        return bridge.BridgeConfig
    if name in ("run_bridge", "serve_acp"):
        from agentsctl.acp import stdio

        return getattr(stdio, name)
    raise AttributeError(f"module 'agentsctl.acp' has no attribute {name!r}")
