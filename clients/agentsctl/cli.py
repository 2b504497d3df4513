"""``agentsctl``: the command line client of agentsd.

Rule 1: the CLI never imports trio or the ``agentsd`` package, and imports at module
level only what ``agentsctl status`` needs (argparse, ``agentsctl.target`` and the
stdlib-only ``agentsctl.daemon``): its cold start is budgeted at 3x ``python -c
pass``. This module holds the command table, the parser built from it, and ``main``;
every command lives in a module of its concept (``commands_daemon``,
``commands_session``, ``commands_conversation``, ``attach``, ``doctor``,
``completion``), named in its ``COMMANDS`` row as ``"module:function"`` and imported
only when that command runs or its options are built; msgspec and the typed
``Client`` come in with the commands that use them.

Rule 2: one function per command and one table (``COMMANDS``) that builds the parser,
the help and the shell completion; a new command is a function and a row. A command
reaches the daemon through its ``agentsctl.target.Target``: ``link()`` (stdlib) or
``client()`` (typed),
which start a detached daemon when none runs unless ``--no-start``; the commands that
must never start one (``daemon ping``, ``daemon stop``, ``doctor``, and reconnecting
streams) pass ``start=False``. Every mutation goes through
``agentsctl.mutation.mutate``: a fresh ``clientOperationId``, one retry on a dropped
connection.

Rule 3: exit codes are the constants below and nothing else: 0 ok, 1 the daemon
answered with an error (or did not do what was asked, or ``doctor`` found a problem),
2 usage error (argparse's own), 3 daemon unreachable, 4 the followed session was
deleted, 5 / 6 the turn ``ask`` waited for failed / was interrupted, 130 interrupted (except ``attach`` and ``log --follow``, for which Ctrl-C is
the normal way out: 0), 141 stdout was closed by its reader (``| head``).
"""

from __future__ import annotations

import argparse
import os
import sys

from agentsctl.daemon import DaemonNotRunning, DaemonUnreachable
from agentsctl.target import Target

# typing costs a few ms of cold start and is needed by the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

EXIT_OK = 0
EXIT_DAEMON_ERROR = 1  # the daemon answered with an error, or what was asked did not happen
EXIT_USAGE = 2  # argparse's own code for a bad command line
EXIT_UNREACHABLE = 3  # no daemon answers and none was (or could be) started
EXIT_SESSION_GONE = 4  # attach / log --follow: the session was deleted while followed
EXIT_TURN_FAILED = 5  # ask: the turn failed, or its end is unknown (the agent died)
EXIT_TURN_INTERRUPTED = 6  # ask: the turn was interrupted
EXIT_INTERRUPTED = 128 + 2  # what a shell reports for SIGINT
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for SIGPIPE: the reader went away

START_HINT = "start it with `agentsctl daemon start` or `make run`"


class CommandFailed(Exception):
    """A command could not do what was asked although the daemon answered (exit 1)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


class UsageError(Exception):
    """The command line is wrong in a way argparse cannot see (exit 2, with usage)."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter, sized without importing shutil.

    argparse imports shutil (and with it bz2, lzma, fnmatch) for the terminal width
    each time it builds a formatter, which ``add_argument`` does: about 0.3x of
    ``python -c pass`` on every run (Rule 1). This measures the width the same way.
    """

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = _terminal_columns() - 2  # argparse's own margin
        super().__init__(prog, indent_increment, max_help_position, width)


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``: $COLUMNS, else the terminal, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


if TYPE_CHECKING:
    Runner = Callable[[argparse.Namespace, Target], int]
    Configurer = Callable[[argparse.ArgumentParser], None]


class Command:
    """One row of the command table. ``name`` may be ``group verb`` (``daemon stop``).

    ``run`` and ``configure`` are functions, or ``"module:function"`` references that
    are imported only when used (Rule 1). ``section`` groups the row in ``--help``.
    """

    __slots__ = ("_configure", "_run", "name", "section", "summary")

    def __init__(
        self,
        name: str,
        summary: str,
        run: Runner | str,
        configure: Configurer | str | None = None,
        *,
        section: str = "more",
    ) -> None:
        self.name = name
        self.summary = summary
        self._run = run
        self._configure = configure
        self.section = section

    @property
    def run(self) -> Runner:
        runner: Runner = _resolve(self._run)
        return runner

    @property
    def configure(self) -> Configurer | None:
        if self._configure is None:
            return None
        configurer: Configurer = _resolve(self._configure)
        return configurer


def _resolve(ref: Any) -> Any:
    """A ``Command`` reference: the function itself, or imported from ``module:name``."""
    if not isinstance(ref, str):
        return ref
    import importlib

    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


GROUPS = {
    "daemon": "start, stop, restart or ping the agentsd process, or reload the agents' environment"
}

# (section, heading) in the order --help shows them; a row without a known section
# is listed under "more".
SECTIONS = (
    ("sessions", "session commands"),
    ("conversation", "conversation commands"),
    ("daemon", "daemon commands"),
    ("setup", "setup commands"),
    ("more", "more commands"),
)

_S = "agentsctl.commands_session"
_C = "agentsctl.commands_conversation"
_D = "agentsctl.commands_daemon"
_K = "agentsctl.commands_controls"
COMMANDS = (
    Command("new", "create a session and start its agent (-m: and send a prompt); prints its id", f"{_S}:run_new", f"{_S}:configure_new", section="sessions"),
    Command("ls", "list sessions", f"{_S}:run_ls", f"{_S}:configure_ls", section="sessions"),
    Command("watch", "every session's state and what needs you, live (JSON lines when piped)", "agentsctl.watch:run_watch", "agentsctl.watch:configure_watch", section="sessions"),
    Command("notify", "a desktop notification for each finished turn and each approval (notify-send or D-Bus)", "agentsctl.notify:run_notify", "agentsctl.notify:configure_notify", section="sessions"),
    Command("show", "one session's record, status and agent", f"{_S}:run_show", f"{_S}:configure_session_id", section="sessions"),
    Command("start", "start a session's agent if it is not running", f"{_S}:run_start", f"{_S}:configure_session_id", section="sessions"),
    Command("close", "end a session's agent; keep its record and journal", f"{_S}:run_close", f"{_S}:configure_session_id", section="sessions"),
    Command("rm", "close a session, then delete its record and journal", f"{_S}:run_rm", f"{_S}:configure_session_id", section="sessions"),
    Command("ask", "continue this directory's session for an agent (created on first use), stream the answer", "agentsctl.ask:run_ask", "agentsctl.ask:configure_ask", section="conversation"),
    Command("send", "send a prompt (--image, --file attach); prints its seq and whether the agent took it", f"{_C}:run_send", f"{_C}:configure_send", section="conversation"),
    Command("queue", "the prompts held behind the running turn: list, --withdraw, --edit, --send-now, --resume", f"{_C}:run_queue", f"{_C}:configure_queue", section="conversation"),
    Command("options", "a session's options, what each may be (models, modes) and where a change applies", f"{_K}:run_options", f"{_K}:configure_options", section="conversation"),
    Command("set", "change options (KEY=VALUE ...): live where the agent allows", f"{_K}:run_set", f"{_K}:configure_set", section="conversation"),
    Command("commands", "the commands a session offers: the agent's slash commands, compact and clear", f"{_K}:run_commands", f"{_K}:configure_commands", section="conversation"),
    Command("command", "run one of the agent's commands (NAME [ARGS...])", f"{_K}:run_command", f"{_K}:configure_command", section="conversation"),
    Command("compact", "compact the conversation to free context", f"{_K}:run_compact", f"{_K}:configure_compact", section="conversation"),
    Command("clear", "start a fresh conversation in the session; its history stays readable", f"{_K}:run_clear", f"{_K}:configure_clear", section="conversation"),
    Command("attach", "follow a session live and answer its approvals; Ctrl-C detaches", "agentsctl.attach:run_attach", "agentsctl.attach:configure_attach", section="conversation"),
    Command("log", "a session's journal (--follow: then stream it)", f"{_C}:run_log", f"{_C}:configure_log", section="conversation"),
    Command("interrupt", "interrupt the running turn", f"{_C}:run_interrupt", f"{_C}:configure_interrupt", section="conversation"),
    Command("approve", "answer a pending approval (accept, or --decline / --decision)", f"{_C}:run_approve", f"{_C}:configure_approve", section="conversation"),
    Command("continue", "carry on the turns a daemon restart cut off (SESSION, --all; none: list them)", "agentsctl.continuity:run_continue", "agentsctl.continuity:configure_continue", section="conversation"),
    Command("acp", "serve the Agent Client Protocol on stdio for an editor (a daemon session per ACP session)", "agentsctl.acp.command:run_acp", "agentsctl.acp.command:configure_acp", section="conversation"),
    Command("status", "the daemon's version, uptime, paths, connections and sessions", f"{_D}:run_status", f"{_D}:configure_status", section="daemon"),
    Command("providers", "the providers `new` takes: the daemon's, with its config's ACP agents", f"{_D}:run_providers", section="daemon"),
    Command("daemon start", "start agentsd detached (or --foreground) and wait until it answers", f"{_D}:run_daemon_start", f"{_D}:configure_daemon_start", section="daemon"),
    Command("daemon stop", "ask agentsd to shut down and wait until it is gone", f"{_D}:run_daemon_stop", section="daemon"),
    Command("daemon restart", "restart agentsd (--drain: after the running turns end)", "agentsctl.continuity:run_daemon_restart", "agentsctl.continuity:configure_daemon_restart", section="daemon"),
    Command("daemon ping", "time one round trip to a running agentsd", f"{_D}:run_daemon_ping", section="daemon"),
    Command("daemon reload-env", "capture the agents' environment again from your login shell", f"{_D}:run_daemon_reload_env", f"{_D}:configure_daemon_reload_env", section="daemon"),
    Command("doctor", "check the agents, directories, socket, database and service", "agentsctl.doctor:run_doctor", "agentsctl.doctor:configure_doctor", section="setup"),
    Command("completion", "print a bash, zsh or fish completion script", "agentsctl.completion:run_completion", "agentsctl.completion:configure_completion", section="setup"),
)  # fmt: skip

DESCRIPTION = """\
Control agentsd, the per-user daemon that keeps AI coding-agent sessions alive,
supervised and durable. agentsctl talks to it over its Unix socket; a command that
needs the daemon starts it (detached, logging to STATE_DIR/agentsd.log) when none
answers, unless --no-start is given. Every command that changes something sends a
fresh operation id and retries once, safely, if the connection drops."""


def _epilog() -> str:
    width = max(len(c.name) for c in COMMANDS) + 2
    known = {key for key, _ in SECTIONS}
    blocks = []
    for key, heading in SECTIONS:
        rows = [
            c for c in COMMANDS if c.section == key or (key == "more" and c.section not in known)
        ]
        if rows:
            lines = "\n".join(f"  {c.name:<{width}}{c.summary}" for c in rows)
            blocks.append(f"{heading}:\n{lines}")
    commands = "\n\n".join(blocks)
    return f"""\
{commands}

Run `agentsctl COMMAND --help` for a command's options.

examples:
  agentsctl new --provider mock -m "echo hello"   create a session, send a prompt
  agentsctl ask --provider codex "fix the tests"  this directory's session: ask, stream
  agentsctl send SESSION --image shot.png "why?"  a prompt with a screenshot
  agentsctl attach SESSION                          watch it live; answer approvals
  agentsctl log SESSION --jsonl --follow            the journal as JSON lines, live
  agentsctl doctor                                  is everything in place?
  source <(agentsctl completion bash)               tab completion in bash

environment:
  AGENTSD_SOCKET     the socket, as --socket
  AGENTSD_STATE_DIR  the state directory, as --state-dir
  XDG_RUNTIME_DIR    the socket defaults to $XDG_RUNTIME_DIR/agentsd/agentsd.sock
  XDG_STATE_HOME     the state directory defaults to $XDG_STATE_HOME/agentsd
  NO_COLOR           no emphasis in the conversation view, even on a terminal

files:
  $XDG_RUNTIME_DIR/agentsd/agentsd.sock  the daemon's socket (directory 0700, socket 0600)
  STATE_DIR/agentsd.db                   sessions, journals and the operation ledger (SQLite)
  STATE_DIR/agentsd.log                  the log of a daemon started by agentsctl
  $XDG_CONFIG_HOME/agentsd/config.toml   the daemon's configuration
  ~/.config/systemd/user/agentsd.socket  the user service (`make install-user-service`)

exit status:
  {EXIT_OK}  success
  {EXIT_DAEMON_ERROR}  the daemon answered with an error (printed as `error: MESSAGE [KIND]`), a
     prompt was not delivered, or `doctor` found something wrong
  {EXIT_USAGE}  usage error
  {EXIT_UNREACHABLE}  the daemon is unreachable: not running (and --no-start), or not answering
  {EXIT_SESSION_GONE}  `attach`, `log --follow` or `ask`: the session was deleted
  {EXIT_TURN_FAILED}  `ask`: the turn failed (or the agent died before it ended)
  {EXIT_TURN_INTERRUPTED}  `ask`: the turn was interrupted
  {EXIT_INTERRUPTED}  interrupted by Ctrl-C (`attach` and `log --follow` detach with 0 instead)
  {EXIT_BROKEN_PIPE}  the reader of stdout went away (`agentsctl log ID | head`)
"""


# The global options that take a value, for ``command_word`` to skip it.
GLOBAL_OPTIONS_WITH_VALUE = ("--socket", "--state-dir")


def command_word(argv: list[str]) -> str | None:
    """The first word of ``argv`` that is not a global option or its value, if it
    names a command or a group (``status``, ``daemon``); None otherwise."""
    words = iter(argv)
    for word in words:
        if word in GLOBAL_OPTIONS_WITH_VALUE:
            next(words, None)
        elif not word.startswith("-"):
            known = {c.name.partition(" ")[0] for c in COMMANDS}
            return word if word in known else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line, built from ``COMMANDS`` and ``GROUPS``.

    With ``only`` (a ``command_word``), just that command's (or group's) subparsers
    are built. A command line naming that command parses exactly as with the whole
    parser, for less than half the cost: argparse looks up translations on disk for
    every subparser it makes, and each other command's module stays unimported
    (Rule 1). Abbreviated options are off, so an option can never be mistaken for a
    command word.
    """
    parser = argparse.ArgumentParser(
        prog="agentsctl",
        description=DESCRIPTION,
        epilog=_epilog(),
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--socket",
        metavar="PATH",
        help="the daemon's socket (default $AGENTSD_SOCKET, else $XDG_RUNTIME_DIR/agentsd/agentsd.sock)",
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="the daemon's state directory, passed to a daemon started from here "
        "(default $AGENTSD_STATE_DIR, else $XDG_STATE_HOME/agentsd)",
    )
    parser.add_argument(
        "--no-start",
        action="store_true",
        help=f"never start a daemon; exit {EXIT_UNREACHABLE} when none answers",
    )
    top = parser.add_subparsers(metavar="COMMAND", required=True, help="one of the commands below")
    groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for command in COMMANDS:
        if only is not None and command.name.partition(" ")[0] != only:
            continue
        group, _, verb = command.name.rpartition(" ")
        if not group:
            sub = top.add_parser(verb, description=command.summary, formatter_class=HelpFormatter)
        else:
            if group not in groups:
                group_parser = top.add_parser(
                    group, description=GROUPS[group], formatter_class=HelpFormatter
                )
                groups[group] = group_parser.add_subparsers(metavar="SUBCOMMAND", required=True)
            sub = groups[group].add_parser(
                verb,
                help=command.summary,
                description=command.summary,
                formatter_class=HelpFormatter,
            )
        configure = command.configure
        if configure is not None:
            configure(sub)
        sub.set_defaults(cli_command=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command line; returns the exit status (argparse exits 2 by itself)."""
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_word(words))
    args = parser.parse_args(words)
    command: Command = args.cli_command
    try:
        return command.run(args, Target(args))
    except UsageError as exc:
        sys.stderr.write(parser.format_usage())
        print(f"agentsctl {command.name}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DaemonNotRunning as exc:
        print(f"agentsctl: {exc.message} ({START_HINT})", file=sys.stderr)
        return EXIT_UNREACHABLE
    except DaemonUnreachable as exc:
        print(f"agentsctl: {exc.message}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except TimeoutError as exc:
        print(f"agentsctl: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except CommandFailed as exc:
        print(f"error: {exc.message} [{exc.kind}]", file=sys.stderr)
        return EXIT_DAEMON_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Whatever is still buffered for the closed pipe would fail again at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        # Imported here: only an answered error pays for msgspec (Rule 1).
        from agentsd_protocol.errors import RpcError

        if not isinstance(exc, RpcError):
            raise
        print(f"error: {exc.message} [{exc.kind}]", file=sys.stderr)
        return EXIT_DAEMON_ERROR


if __name__ == "__main__":
    # Run as a script this module is ``__main__``, and the command modules would
    # import a second copy as ``agentsctl.cli`` whose exceptions this copy's ``main``
    # would not catch: hand over to that copy.
    from agentsctl.cli import main as _main

    sys.exit(_main())
