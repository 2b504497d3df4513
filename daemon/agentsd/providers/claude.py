"""The ``claude`` provider: Claude Code in stream-json mode over stdio.

The child is ``claude -p --input-format stream-json --output-format stream-json
--verbose --include-partial-messages --replay-user-messages --permission-prompt-tool
stdio``; ``claude_adapter`` speaks to it. This module chooses the command line.

Rule 1 (the session id is chosen before launch): Claude Code takes its session id
on the command line (``--session-id`` for a new conversation, ``--resume`` for an
existing one) and reports it only with the first user message (``system/init``),
so ``launch`` picks it and the adapter learns it from the provider. The runner calls
``launch`` and then ``adapter`` for the same session, in its one session task, with
the same fence; ``_launched`` carries the id between the two and is keyed by
session id and fence so that a stale entry is never used.

Rule 2 (resume only what exists): ``--resume`` needs the conversation's transcript
(``$CLAUDE_CONFIG_DIR/projects/*/<id>.jsonl``), which Claude Code writes only once a
message was sent; without one it answers "No conversation found with session ID".
An id with a transcript is resumed. One without is replaced by a fresh id
(``--session-id``), and the adapter's handshake decides from the journal: a
conversation that never had a turn is superseded, one that had turns is
``ResumeFailed`` (base Rule 4).

``session.command`` replaces the program only: the protocol flags are always
appended, since the adapter depends on every one of them.

Rule 3 (flags every supported release takes): the permission mode ``manual`` is
what 2.1.332 calls ``default`` (it reports ``current_permission_mode: "default"``
either way); 2.1.197 refuses ``manual`` at argument parsing, so it is passed as
``default``, which both accept.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from agentsd.providers.base import (
    Adapter,
    LaunchSpec,
    LineLink,
    OptionSpec,
    Provider,
    SessionSink,
)
from agentsd.providers.claude_adapter import MIN_VERSION, PERMISSION_MODE_FLAGS, ClaudeAdapter
from agentsd.providers.claude_transcript import project_slug
from agentsd.providers.mcp_servers import claude_mcp_config, parse_mcp_servers
from agentsd.providers.programs import CLAUDE, find_program
from agentsd.store.sessions import SessionRow
from agentsd_protocol.errors import AgentNotFound, AgentStartFailed, InvalidParams

PROTOCOL_FLAGS = (
    "-p",
    "--input-format",
    "stream-json",
    "--output-format",
    "stream-json",
    "--verbose",
    "--include-partial-messages",
    "--replay-user-messages",
    "--permission-prompt-tool",
    "stdio",
)
PERMISSION_MODES = (
    "default",
    "acceptEdits",
    "auto",
    "bypassPermissions",
    "manual",
    "dontAsk",
    "plan",
)
EFFORTS = ("low", "medium", "high", "xhigh", "max")


# -- options ---------------------------------------------------------------------------


def _string(name: str, value: Any) -> list[str]:
    if not isinstance(value, str) or not value or "\0" in value:
        raise InvalidParams(f"Invalid params: claude option {name!r} must be a non-empty string")
    return [value]


def _strings(name: str, value: Any) -> list[str]:
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, str) and v and "\0" not in v for v in value)
    ):
        raise InvalidParams(
            f"Invalid params: claude option {name!r} must be a non-empty list of strings"
        )
    return [str(v) for v in value]


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> list[str]:
    if value not in choices:
        raise InvalidParams(
            f"Invalid params: claude option {name!r} must be one of {', '.join(choices)}, "
            f"got {value!r}"
        )
    return [str(value)]


def _positive(name: str, value: Any) -> list[str]:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidParams(f"Invalid params: claude option {name!r} must be a positive integer")
    return [str(value)]


def option_flags(options: Mapping[str, Any]) -> list[str]:
    """The command-line flags of a session's ``options``. Raises ``InvalidParams``
    naming the first unknown or ill-typed option (in sorted order, so the message
    does not depend on the client's key order)."""
    flags: list[str] = []
    for name in sorted(options):
        value = options[name]
        match name:
            case "model":
                flags += ["--model", *_string(name, value)]
            case "permissionMode":
                (mode,) = _choice(name, value, PERMISSION_MODES)
                flags += ["--permission-mode", PERMISSION_MODE_FLAGS.get(mode, mode)]
            case "effort":
                flags += ["--effort", *_choice(name, value, EFFORTS)]
            case "allowedTools":
                flags += ["--allowedTools", ",".join(_strings(name, value))]
            case "disallowedTools":
                flags += ["--disallowedTools", ",".join(_strings(name, value))]
            case "systemPrompt":
                flags += ["--system-prompt", *_string(name, value)]
            case "appendSystemPrompt":
                flags += ["--append-system-prompt", *_string(name, value)]
            case "maxTurns":
                flags += ["--max-turns", *_positive(name, value)]
            case "addDirs":
                for directory in _strings(name, value):
                    flags += ["--add-dir", directory]
            case "mcpServers":
                servers = parse_mcp_servers(value)
                if servers:
                    flags += ["--mcp-config", claude_mcp_config(servers)]
            case _:
                raise InvalidParams(
                    f"Invalid params: unknown claude option {name!r} (known: "
                    f"{', '.join(sorted(KNOWN_OPTIONS))})",
                    option=name,
                )
    return flags


KNOWN_OPTIONS = frozenset(
    {
        "model",
        "permissionMode",
        "effort",
        "allowedTools",
        "disallowedTools",
        "systemPrompt",
        "appendSystemPrompt",
        "maxTurns",
        "addDirs",
        "mcpServers",
    }
)


# The model and the permission mode change live (control requests ``set_model`` and
# ``set_permission_mode``); the rest are command-line flags, taken at the next start.
OPTION_SPECS: dict[str, OptionSpec] = {
    "model": OptionSpec(applies_at="now", description="the model (an alias or a full name)"),
    "permissionMode": OptionSpec(
        applies_at="now",
        choices=PERMISSION_MODES,
        open=False,
        description="what Claude Code may do without asking",
    ),
    "effort": OptionSpec(
        applies_at="nextStart", choices=EFFORTS, open=False, description="reasoning effort"
    ),
    **{
        name: OptionSpec(applies_at="nextStart")
        for name in (
            "allowedTools",
            "disallowedTools",
            "systemPrompt",
            "appendSystemPrompt",
            "maxTurns",
            "addDirs",
        )
    },
    "mcpServers": OptionSpec(
        applies_at="nextStart", description="MCP servers the agent starts (ACP's shape)"
    ),
}

# -- the transcript (Rule 2) -----------------------------------------------------------


def config_dir(env: Mapping[str, str]) -> Path | None:
    """Where Claude Code keeps its state for this environment: ``CLAUDE_CONFIG_DIR``,
    else ``$HOME/.claude``; None without either."""
    configured = env.get("CLAUDE_CONFIG_DIR")
    if configured:
        return Path(configured)
    home = env.get("HOME")
    return Path(home) / ".claude" if home else None


def has_transcript(env: Mapping[str, str], session_id: str) -> bool:
    """Whether Claude Code wrote a transcript for ``session_id`` (in any project
    directory: the directory name encodes the cwd in a way that may change)."""
    directory = config_dir(env)
    if directory is None:
        return False
    try:
        return any((directory / "projects").glob(f"*/{session_id}.jsonl"))
    except OSError:
        return False


# -- the provider ----------------------------------------------------------------------


@attrs.frozen
class Launched:
    """What ``launch`` chose for one start of a session's agent."""

    fence: int
    session_id: str
    replaces: str | None = None  # the session's id, which has no transcript (Rule 2)
    transcript: Path | None = None  # where the resumed session's transcript is for this cwd


class ClaudeProvider(Provider):
    name = "claude"
    program = CLAUDE
    content_types = frozenset({"image", "file"})
    adopts = True
    minimum_version = MIN_VERSION

    def __init__(self) -> None:
        self._launched: dict[str, Launched] = {}  # by agentsd session id (Rule 1)

    def launch(self, session: SessionRow, state_dir: Any, env: Mapping[str, str]) -> LaunchSpec:
        """The command line for ``session`` (see the module docstring). Raises
        ``InvalidParams`` for bad options and ``AgentNotFound`` when no ``claude``
        is installed and no ``command`` was given."""
        flags = option_flags(session.options)
        agent_env = {**env, **session.env}
        if session.command:
            program = list(session.command)
        else:
            found = find_program(CLAUDE, agent_env.get("PATH", ""))
            if found is None:
                raise AgentNotFound(
                    f"cannot start claude: it is not installed; {CLAUDE.install_hint()}"
                )
            program = [found]
        handle = session.provider_handle
        if handle is not None and has_transcript(agent_env, handle):
            home = config_dir(agent_env)
            own = None if home is None else home / "projects" / project_slug(session.cwd)
            transcript = None if own is None else own / f"{handle}.jsonl"
            chosen = Launched(session.fence, handle, transcript=transcript)
            flags += ["--resume", handle]
        else:
            chosen = Launched(session.fence, str(uuid.uuid4()), replaces=handle)
            flags += ["--session-id", chosen.session_id]
        self._launched[session.id] = chosen
        return LaunchSpec(argv=[*program, *PROTOCOL_FLAGS, *flags])

    def adapter(self, link: LineLink, sink: SessionSink, session: SessionRow) -> Adapter:
        launched = self._launched.pop(session.id, None)
        if launched is None and session.provider_handle is not None:
            # Not launched here: a child an earlier daemon started, which the adapter
            # can only take over (its handshake refuses, keeping Rule 1).
            return ClaudeAdapter(link, sink, session_id=session.provider_handle, launched=False)
        if launched is None or launched.fence != session.fence:
            # Rule 1 broken: a bug, not the agent's doing. Refusing to guess keeps a
            # wrong id from ever becoming the provider handle.
            raise AgentStartFailed(f"claude for session {session.id} was not launched by agentsd")
        return ClaudeAdapter(
            link,
            sink,
            session_id=launched.session_id,
            replaces=launched.replaces,
            transcript=launched.transcript,
        )

    def option_specs(self) -> Mapping[str, OptionSpec]:
        return OPTION_SPECS

    def check_options(self, options: Mapping[str, Any]) -> None:
        option_flags(options)
