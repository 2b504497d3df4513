"""Session commands: ``new``, ``ls``, ``show``, ``start``, ``close``, ``rm``.

Each command is a ``configure_*`` (its options) and a ``run_*`` (returns the exit
status), named by a row of ``agentsctl.cli.COMMANDS``. Mutations go through
``agentsctl.mutation.mutate`` (a fresh operation id, one retry on a dropped
connection).
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import TYPE_CHECKING, Any

import msgspec

from agentsctl.cli import EXIT_OK, UsageError
from agentsctl.commands_conversation import report_send, send_prompt
from agentsctl.mutation import mutate
from agentsctl.render import print_json
from agentsd_protocol import methods
from agentsd_protocol.api import session as s
from agentsd_protocol.display import printable
from agentsd_protocol.errors import RpcError
from agentsd_protocol.usage import usage_line

if TYPE_CHECKING:
    from agentsctl.target import Target

PHASES = ("stopped", "starting", "running", "stopping", "exit-unproven")


def configure_session_id(parser: argparse.ArgumentParser) -> None:
    """``SESSION`` and ``--json``: the options of show, start, close and rm."""
    parser.add_argument("session_id", metavar="SESSION", help="the session's id")
    parser.add_argument("--json", action="store_true", help="print the whole JSON result")


def configure_new(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "provider",
        nargs="?",
        metavar="PROVIDER",
        help="codex, claude, mock or an ACP agent such as gemini (or --provider); "
        "`agentsctl providers` lists them",
    )
    parser.add_argument(
        "--provider",
        dest="provider_option",
        metavar="PROVIDER",
        help="the agent provider: codex, claude, mock or an ACP agent such as gemini",
    )
    parser.add_argument(
        "-m",
        "--message",
        metavar="TEXT",
        help="send TEXT as the first prompt once the session exists",
    )
    parser.add_argument(
        "--command",
        dest="agent_command",
        metavar="CMDLINE",
        help="the agent's command line, shell-quoted (for providers that take one)",
    )
    parser.add_argument(
        "--cwd",
        default=".",
        metavar="DIR",
        help="the agent's working directory, made absolute (default: the current one)",
    )
    parser.add_argument("--title", help="a title to show in listings")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="agent environment (repeatable)",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help="provider option; VALUE is parsed as JSON when it is JSON (repeatable)",
    )
    parser.add_argument(
        "--stopped", action="store_true", help="create the session without starting its agent"
    )
    parser.add_argument(
        "--memory-max",
        type=byte_size,
        metavar="SIZE",
        help="memory for the agent and all it starts (bytes, or 512M, 2G); needs a cgroup "
        "with the memory controller",
    )
    parser.add_argument(
        "--pids-max",
        type=int,
        metavar="N",
        help="processes the agent and all it starts may have at once; needs the pids controller",
    )
    parser.add_argument(
        "--cpu-max",
        type=float,
        metavar="CPUS",
        help="CPU time per second, in CPUs (0.5, 2); needs the cpu controller",
    )
    parser.add_argument(
        "--resume-from",
        metavar="HANDLE",
        help="adopt a conversation started elsewhere (a Codex thread id, a Claude session "
        "id) in this --cwd: its history is imported and the next prompt continues it",
    )
    parser.add_argument("--json", action="store_true", help="print the whole JSON result")


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def byte_size(text: str) -> int:
    """argparse ``type`` for a size: bytes, or a number with K, M, G or T (powers of
    1024); a bad one is a usage error, exit 2. The daemon checks the range."""
    number, unit = text[:-1], text[-1:].upper()
    if unit.isdigit():
        number, unit = text, ""
    if unit not in _SIZE_UNITS or not number.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or 512M, 2G)")
    return int(number) * _SIZE_UNITS[unit]


def key_value(text: str) -> tuple[str, str]:
    """argparse ``type`` for KEY=VALUE (a bad one is a usage error, exit 2)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _provider(args: argparse.Namespace) -> str:
    given = [str(p) for p in (args.provider, args.provider_option) if p is not None]
    if not given:
        raise UsageError("the provider is missing: give PROVIDER or --provider PROVIDER")
    if len(set(given)) > 1:
        raise UsageError(f"two different providers given: {given[0]} and {given[1]}")
    return given[0]


def run_new(args: argparse.Namespace, target: Target) -> int:
    """Create (and by default start) a session; with ``-m``, then send the prompt.

    Prints the session id (``--json``: the create result, plus ``send`` with ``-m``).
    A prompt that was not delivered exits 1 after the id is printed.
    """
    provider = _provider(args)
    if args.resume_from is not None and args.stopped:
        raise UsageError("--resume-from starts the agent: it cannot be --stopped")
    options: dict[str, Any] = {}
    for key, text in args.option:
        try:
            options[key] = msgspec.json.decode(text)
        except msgspec.DecodeError:
            options[key] = text
    params = s.CreateParams(
        provider=provider,
        cwd=os.path.abspath(args.cwd),
        title=args.title,
        options=options,
        env=dict(args.env),
        command=None if args.agent_command is None else shlex.split(args.agent_command),
        start=not args.stopped,
        memory_max=args.memory_max,
        pids_max=args.pids_max,
        cpu_max=args.cpu_max,
        resume_from=None if args.resume_from is None else s.ResumeFrom(handle=args.resume_from),
    )
    try:
        created = mutate(target, methods.CREATE, params)
    except RpcError as exc:
        # The session was stored but its agent did not start: its id still matters
        # (to `show`, `start` or `rm` it); the error follows on stderr, exit 1.
        if isinstance(exc.details.get("sessionId"), str):
            print(exc.details["sessionId"], flush=True)
        raise
    if args.message is None:
        if args.json:
            print_json(created)
        else:
            print(created.session_id, flush=True)
        return EXIT_OK
    if not args.json:
        print(created.session_id, flush=True)
    sent = send_prompt(target, created.session_id, args.message)
    if args.json:
        document = msgspec.to_builtins(created)
        document["send"] = msgspec.to_builtins(sent)
        print_json(document)
    return report_send(sent, quiet=True)


def configure_ls(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state", choices=PHASES, help="only sessions whose agent is in this phase"
    )
    parser.add_argument("--provider", metavar="PROVIDER", help="only sessions of this provider")
    parser.add_argument("--json", action="store_true", help="print the whole JSON result")


LS_PAGE = 500  # sessions per request; the daemon also bounds a page by bytes


def list_sessions(
    target: Target, *, state: s.Phase | None, provider: str | None, brief: bool
) -> list[s.SessionInfo]:
    """Every session, asked for a page at a time (so no number or size of sessions
    makes a reply too large to read)."""
    sessions: list[s.SessionInfo] = []
    cursor: str | None = None
    with target.client() as client:
        while True:
            params = s.ListParams(
                state=state, provider=provider, limit=LS_PAGE, cursor=cursor, brief=brief
            )
            page = client.call(methods.LIST, params)
            sessions += page.sessions
            if page.next_cursor is None:
                return sessions
            cursor = page.next_cursor


def run_ls(args: argparse.Namespace, target: Target) -> int:
    sessions = list_sessions(target, state=args.state, provider=args.provider, brief=not args.json)
    if args.json:
        print_json(s.ListResult(sessions=sessions))
        return EXIT_OK
    rows: list[tuple[str, ...]] = [("SESSION", "PROVIDER", "PHASE", "STATUS", "TITLE", "CWD")]
    rows += [
        tuple(
            printable(cell)
            for cell in (i.session_id, i.provider, i.phase, i.status, i.title or "-", i.cwd)
        )
        for i in sessions
    ]
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]) - 1)]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
            + "  "
            + row[-1]
        )
    return EXIT_OK


def run_show(args: argparse.Namespace, target: Target) -> int:
    with target.client() as client:
        result = client.call(methods.GET, s.GetParams(session_id=args.session_id))
    if args.json:
        print_json(result)
        return EXIT_OK
    info = result.session
    rows: list[tuple[str, object]] = [
        ("session", info.session_id),
        ("provider", info.provider),
        ("title", info.title or "-"),
        ("cwd", info.cwd),
        ("status", f"{info.status} ({info.phase})"),
        ("fence", info.fence),
        ("head seq", info.head_seq),
        ("agent", f"pid {info.child.pid}" if info.child else "-"),
        ("contained", _containment(info)),
        ("handle", info.provider_handle or "-"),
    ]
    if info.tokens is not None and (words := usage_line(info.tokens)):
        rows.append(("tokens", words))
    if info.last_exit is not None:
        rows.append(("last exit", f"{info.last_exit.cause} (code {info.last_exit.returncode})"))
    if info.error is not None:
        rows.append(("error", f"{info.error.message} [{info.error.kind}]"))
    if info.limits is not None:
        rows.append(("limits", _limits(info.limits)))
    for name, value in rows:
        # Titles, paths and agents' errors are anyone's text: never raw to a terminal.
        print(f"{name + ':':<11}{printable(str(value))}")
    tail = info.last_exit.stderr_tail if info.last_exit is not None else None
    if tail:
        print("stderr:    (the end of what the agent wrote)")
        for line in tail.splitlines():
            print(f"  | {printable(line)}")
    return EXIT_OK


def _limits(limits: s.SessionLimits) -> str:
    """The session's own limits (the daemon's defaults apply to the rest)."""
    words = []
    if limits.memory_max is not None:
        words.append(f"memory {limits.memory_max >> 20} MiB")
    if limits.pids_max is not None:
        words.append(f"{limits.pids_max} processes")
    if limits.cpu_max is not None:
        words.append(f"{limits.cpu_max:g} CPUs")
    return ", ".join(words)


def _containment(info: s.SessionInfo) -> str:
    """Where the running agent is held: its cgroup with what it uses, or the
    fallback (the process group and spawn token)."""
    if info.child is None:
        return "-"
    res = info.resources
    if res is None or res.cgroup is None:
        where = "process group and spawn token (no cgroup)"
        if res is None:
            return where
    else:
        where = f"cgroup {res.cgroup}"
    figures = [f"{res.processes} processes"]
    if res.cpu_us is not None:
        figures.append(f"cpu {res.cpu_us / 1e6:.2f} s")
    if res.memory_bytes is not None:
        peak = "" if res.memory_peak_bytes is None else f", peak {res.memory_peak_bytes >> 20} MiB"
        figures.append(f"memory {res.memory_bytes >> 20} MiB{peak}")
    return f"{where} ({', '.join(figures)})"


def run_start(args: argparse.Namespace, target: Target) -> int:
    params = s.StartParams(session_id=args.session_id)
    result = mutate(target, methods.START, params)
    if args.json:
        print_json(result)
    else:
        print(f"{result.session.session_id}: {result.session.phase}")
    return EXIT_OK


def run_close(args: argparse.Namespace, target: Target) -> int:
    params = s.CloseParams(session_id=args.session_id)
    result = mutate(target, methods.CLOSE, params)
    if args.json:
        print_json(result)
    else:
        what = "agent ended" if result.was_running else "agent was not running"
        print(f"{result.session.session_id}: {what}")
    return EXIT_OK


def run_rm(args: argparse.Namespace, target: Target) -> int:
    params = s.DeleteParams(session_id=args.session_id)
    result = mutate(target, methods.DELETE, params)
    if args.json:
        print_json(result)
    else:
        print(f"{result.session_id}: deleted")
    return EXIT_OK
