"""Wire types of the conversation controls: ``agentSession.options`` (what can be
set, and where a change applies), ``agentSession.commands`` and ``.command`` (the
agent's slash commands and agentsd's own: ``compact``, ``clear``).

Where a change applies (``AppliesAt``): ``now`` (the running agent took it at once),
``nextTurn`` (the agent takes it with the next prompt it starts a turn with) or
``nextStart`` (the agent is started with it: the next ``start``, or the next send
after a ``close``). A session whose agent is not running applies every change at
its next start.
"""

from __future__ import annotations

from typing import Any, Literal

from agentsd_protocol.api.base import MutationParams, Params, Result

AppliesAt = Literal["now", "nextTurn", "nextStart"]
CommandSource = Literal["agentsd", "agent"]
MAX_COMMAND_ARGS_BYTES = 64 * 1024  # what follows a slash command: typed, not a file


class OptionChoice(Result, frozen=True, kw_only=True):
    """One value an option may take (a model, an effort, a mode)."""

    value: str
    label: str | None = None
    description: str | None = None
    default: bool = False  # the agent's default when the option is not set


class OptionInfo(Result, frozen=True, kw_only=True):
    """One option of the session's provider. ``value``: the session's (None: not
    set, the agent's default). ``choices``: the values the agent offers, when it
    says; ``open``: other values are accepted too (a model of a custom model
    provider), else a value outside ``choices`` is refused (``unknown_option``).
    ``applies_at``: where a change applies now (see the module)."""

    key: str
    value: Any = None
    choices: list[OptionChoice] | None = None
    open: bool = True
    applies_at: AppliesAt
    description: str | None = None


class OptionsParams(Params, frozen=True, kw_only=True):
    session_id: str


class OptionsResult(Result, frozen=True, kw_only=True):
    """``running``: whether the agent runs (the model list comes from it; without it
    the catalog is what agentsd knows, and every change applies at the next start)."""

    session_id: str
    provider: str
    running: bool
    options: list[OptionInfo]


class CommandInfo(Result, frozen=True, kw_only=True):
    """A command a client may run with ``agentSession.command``: agentsd's own
    (``compact``, ``clear``; ``source: agentsd``) or one the agent offers (its slash
    commands and skills; ``source: agent``). ``hint`` describes its arguments."""

    name: str
    description: str | None = None
    hint: str | None = None
    source: CommandSource


class CommandsParams(Params, frozen=True, kw_only=True):
    session_id: str


class CommandsResult(Result, frozen=True, kw_only=True):
    """``running``: whether the agent runs; the agent's own commands are listed only
    then (they come from its handshake or its API)."""

    session_id: str
    running: bool
    commands: list[CommandInfo]


class CommandParams(MutationParams, frozen=True, kw_only=True):
    """Run command ``name`` (without its slash) with ``args`` (its text after the
    name). The agent is started if it is not running."""

    session_id: str
    name: str
    args: str | None = None


class CommandResult(Result, frozen=True, kw_only=True):
    """``seq``: of the ``command.run`` event journaling it. ``dispatch`` as a
    send's (``accepted``: the agent took it); ``turn_id`` when it runs as a turn;
    ``handle``: the fresh provider conversation after ``clear``."""

    name: str
    seq: int
    dispatch: Literal["accepted", "rejected", "unknown"]
    reason: str | None = None
    turn_id: str | None = None
    handle: str | None = None
