"""Conversation controls: ``options``, ``set``, ``commands``, ``command``, ``compact``
and ``clear``.

Each command is a ``configure_*`` and a ``run_*`` named by a row of
``agentsctl.cli.COMMANDS``; mutations go through ``agentsctl.mutation.mutate``.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any, TypeVar

from agentsctl.cli import EXIT_DAEMON_ERROR, EXIT_OK, UsageError
from agentsctl.commands_conversation import add_json_option, add_session_argument
from agentsctl.mutation import mutate
from agentsctl.render import print_json
from agentsd_protocol import methods
from agentsd_protocol.api import controls as ctl
from agentsd_protocol.api import conversation as c
from agentsd_protocol.display import excerpt, printable
from agentsd_protocol.methods import Method

if TYPE_CHECKING:
    from agentsctl.target import Target

P = TypeVar("P")
R = TypeVar("R")

WHERE = {"now": "now", "nextTurn": "at the next turn", "nextStart": "at the next start"}
MAX_CHOICES_SHOWN = 12  # a model catalog can be long; --json has all of it
MAX_DESCRIPTION_CHARS = 70  # one line of a command menu


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _value_text(value: Any) -> str:
    if value is None:
        return "(default)"
    return value if isinstance(value, str) else json.dumps(value)


def _configure(parser: argparse.ArgumentParser, epilog: str) -> None:
    """A command on one session (its positional SESSION first), with ``--json``."""
    parser.epilog = epilog
    add_session_argument(parser)
    add_json_option(parser)


def _ask(args: argparse.Namespace, target: Target, method: Method[P, R], params: P) -> R | None:
    """The daemon's answer to a read; None once ``--json`` printed it whole."""
    with target.client() as client:
        result = client.call(method, params)
    if args.json:
        print_json(result)
        return None
    return result


# -- options ------------------------------------------------------------------------


def configure_options(parser: argparse.ArgumentParser) -> None:
    _configure(
        parser,
        "Prints each option as `KEY = VALUE (applies WHERE)`, then the values it may take\n"
        "(the running agent lists its models). `agentsctl set` changes them.",
    )


def run_options(args: argparse.Namespace, target: Target) -> int:
    """The session's options, what each may be, and where a change applies."""
    params = ctl.OptionsParams(session_id=args.session_id)
    result = _ask(args, target, methods.OPTIONS, params)
    if result is None:
        return EXIT_OK
    if not result.running:
        print(f"({result.provider}: the agent is not running; its model list comes when it is)")
    for option in result.options:
        where = WHERE[option.applies_at]
        print(printable(f"{option.key} = {_value_text(option.value)} (applies {where})"))
        if option.choices:
            shown = [
                choice.value + (" (default)" if choice.default else "")
                for choice in option.choices[:MAX_CHOICES_SHOWN]
            ]
            more = len(option.choices) - len(shown)
            suffix = f", and {more} more" if more > 0 else ""
            kind = "one of" if not option.open else "e.g."
            print(printable(f"    {kind} {', '.join(shown)}{suffix}"))
    return EXIT_OK


# -- set ----------------------------------------------------------------------------


def configure_set(parser: argparse.ArgumentParser) -> None:
    _configure(
        parser,
        "Each VALUE is read as JSON when it is JSON (3, true, {...}), else as text;\n"
        "KEY=null unsets KEY. Prints where each change applies: now, at the next turn,\n"
        "or at the next start. An unknown key or value changes nothing (exit 1).",
    )
    parser.add_argument(
        "changes", nargs="+", metavar="KEY=VALUE", help="an option and its new value"
    )


def parse_changes(words: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` words as a ``changes`` object; ``UsageError`` for a word
    without ``=`` or with an empty key, or a key given twice."""
    changes: dict[str, Any] = {}
    for word in words:
        key, sep, text = word.partition("=")
        if not sep or not key:
            raise UsageError(f"expected KEY=VALUE, got {excerpt(word, 40)}")
        if key in changes:
            raise UsageError(f"{key} is given twice")
        try:
            changes[key] = json.loads(text)
        except ValueError:
            changes[key] = text
    return changes


def run_set(args: argparse.Namespace, target: Target) -> int:
    """Change options; the daemon applies each as live as the agent allows."""
    changes = parse_changes(args.changes)
    params = c.SetOptionsParams(session_id=args.session_id, changes=changes)
    result = mutate(target, methods.SET_OPTIONS, params)
    if args.json:
        print_json(result)
        return EXIT_OK
    if not result.applies_at:
        print(f"{args.session_id}: nothing changed")
    for key, where in sorted(result.applies_at.items()):
        value = result.session.options.get(key)
        print(printable(f"{key} = {_value_text(value)}: applies {WHERE[where]}"))
    return EXIT_OK


# -- commands -------------------------------------------------------------------------


def configure_commands(parser: argparse.ArgumentParser) -> None:
    _configure(
        parser,
        "Lists `/NAME HINT  DESCRIPTION`: agentsd's own (compact, clear) and, while the\n"
        "agent runs, its slash commands and skills. `agentsctl command` runs one.",
    )


def run_commands(args: argparse.Namespace, target: Target) -> int:
    params = ctl.CommandsParams(session_id=args.session_id)
    result = _ask(args, target, methods.COMMANDS, params)
    if result is None:
        return EXIT_OK
    rows = [(f"/{cmd.name}" + (f" {cmd.hint}" if cmd.hint else ""), cmd) for cmd in result.commands]
    width = max(len(name) for name, _ in rows) + 2
    for name, cmd in rows:
        source = " (agentsd)" if cmd.source == "agentsd" else ""
        description = _clip(cmd.description or "", MAX_DESCRIPTION_CHARS)
        # The agent's words: never raw to a terminal.
        print(printable(f"{name:<{width}}{description}{source}".rstrip()))
    if not result.running:
        print("(the agent is not running: its own commands are listed once it is)")
    return EXIT_OK


# -- command, compact, clear -----------------------------------------------------------


def configure_command(parser: argparse.ArgumentParser) -> None:
    _configure(parser, "Runs in an idle conversation; while a turn runs it is refused (exit 1).")
    parser.add_argument("name", metavar="COMMAND", help="the command, with or without its slash")
    parser.add_argument("words", nargs="*", metavar="ARGS", help="what follows the command")


def configure_compact(parser: argparse.ArgumentParser) -> None:
    _configure(
        parser,
        "The agent summarizes the conversation so far in a turn of its own (Codex: its\n"
        "compaction; Claude Code: /compact), freeing context. Follow it with `attach`.",
    )


def configure_clear(parser: argparse.ArgumentParser) -> None:
    _configure(
        parser,
        "Starts a fresh provider conversation in the same session: the agent starts blank;\n"
        "the journal keeps everything before (`agentsctl log`), marked where it was cleared.",
    )


def _run(args: argparse.Namespace, target: Target, name: str, words: str | None) -> int:
    params = ctl.CommandParams(session_id=args.session_id, name=name, args=words)
    result = mutate(target, methods.COMMAND, params)
    if args.json:
        print_json(result)
    elif result.handle is not None:
        print(f"seq {result.seq}: {result.name}: a fresh conversation ({result.handle})")
    else:
        reason = f" ({result.reason})" if result.reason else ""
        turn = f", turn {result.turn_id}" if result.turn_id else ""
        print(printable(f"seq {result.seq}: {result.name}: {result.dispatch}{turn}{reason}"))
    return EXIT_OK if result.dispatch == "accepted" else EXIT_DAEMON_ERROR


def run_command(args: argparse.Namespace, target: Target) -> int:
    return _run(args, target, args.name, " ".join(args.words) or None)


def run_compact(args: argparse.Namespace, target: Target) -> int:
    return _run(args, target, "compact", None)


def run_clear(args: argparse.Namespace, target: Target) -> int:
    return _run(args, target, "clear", None)
