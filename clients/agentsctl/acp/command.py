"""``agentsctl acp``: its options and its run function (a row of
``agentsctl.cli.COMMANDS``).

Rule 1: importing this module costs what the CLI's other command modules cost:
argparse and the standard library. trio and the bridge are imported inside
``run_acp`` only, so ``agentsctl --help`` and the shell completion never load them.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentsctl.target import Target

PROVIDER_ENV = "AGENTSD_ACP_PROVIDER"  # the provider of new sessions when --provider is absent
DEFAULT_PROVIDER = "mock"


def configure_acp(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve the Agent Client Protocol on stdin and stdout, for an editor that starts\n"
        "this command as its agent. Each ACP session is the daemon session with the same\n"
        "id: session/new creates one (or binds --session), session/load replays it.\n"
        "Killing this process never stops a session."
    )
    parser.add_argument(
        "--session",
        metavar="ID",
        help="bind session/new to this existing daemon session instead of creating one",
    )
    parser.add_argument(
        "--provider",
        metavar="P",
        help=f"the provider of new sessions (default ${PROVIDER_ENV}, else {DEFAULT_PROVIDER})",
    )
    parser.add_argument(
        "--cwd",
        metavar="DIR",
        help="the working directory of new sessions (default: the one the editor sends)",
    )
    parser.add_argument("--title", help="the title of new sessions")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        type=_key_value,
        metavar="KEY=VALUE",
        help="provider option of new sessions; VALUE is parsed as JSON when it is JSON "
        "(repeatable)",
    )


def _key_value(text: str) -> tuple[str, str]:
    """argparse ``type`` for KEY=VALUE (a bad one is a usage error, exit 2)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _options(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key, text in pairs:
        try:
            options[key] = json.loads(text)
        except ValueError:
            options[key] = text
    return options


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("agentsd")
    except metadata.PackageNotFoundError:
        return "0"


def run_acp(args: argparse.Namespace, target: Target) -> int:
    """Start the daemon if none runs (unless ``--no-start``), then serve the editor
    until it closes stdin. Raises ``UsageError`` for ``--session`` with options of
    new sessions, and ``DaemonUnreachable`` when the daemon cannot be reached."""
    from agentsctl.cli import EXIT_OK, UsageError

    if args.session is not None and (args.provider or args.option or args.title or args.cwd):
        raise UsageError("--session binds an existing session; it takes no options of new ones")
    with target.link(start=True):
        pass  # reachable now, started if needed; the bridge connects on its own

    from agentsctl.acp.bridge import BridgeConfig
    from agentsctl.acp.stdio import run_bridge

    config = BridgeConfig(
        socket_path=target.socket_path,
        session_id=args.session,
        provider=args.provider or os.environ.get(PROVIDER_ENV) or DEFAULT_PROVIDER,
        cwd=os.path.abspath(args.cwd) if args.cwd else None,
        title=args.title,
        options=_options(args.option),
        version=_version(),
    )
    run_bridge(config)
    return EXIT_OK
