"""The commands about the daemon itself: ``status``, ``providers`` and ``daemon
start|stop|ping|reload-env``.

They talk to the daemon through ``Target.link()`` (stdlib JSON, no msgspec: the
cold start of ``agentsctl status`` is budgeted, see ``agentsctl.cli`` Rule 1);
``providers``, ``daemon ping``, ``daemon stop`` and ``daemon reload-env`` never
start one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from agentsctl.cli import EXIT_OK, EXIT_UNREACHABLE, CommandFailed
from agentsctl.daemon import (
    STOP_DEADLINE_S,
    DaemonDisconnected,
    DaemonNotRunning,
    DaemonSocketLost,
    DaemonUnreachable,
    answers,
    daemon_argv,
    wait_until_exited,
    wait_until_gone,
)

# typing costs a few ms of cold start and is needed by the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from agentsctl.daemon import LockHolder
    from agentsctl.target import Target


STATUS_FORMAT_HELP = """\
print one line for a status bar or prompt instead, and never start a daemon (no
daemon: an empty line, exit 3). Fields: {total} {idle} {working} {attention}
{failed} {unseen} (sessions in each state; unseen: finished or asking since you
last looked) and {needs} (titles of the sessions that need you). Examples:
tmux: set -g status-right '#(agentsctl status --format "{attention}! {unseen}*")';
bash: PS1='$(agentsctl status --format "[{needs}]") \\$ '"""


def configure_status(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the raw JSON result")
    parser.add_argument("--format", metavar="FORMAT", help=STATUS_FORMAT_HELP)


def run_status(args: argparse.Namespace, target: Target) -> int:
    if args.format is not None:
        return run_status_format(args.format, target)
    with target.link(start=True) as link:
        result = link.call("daemon.status")
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    print(format_status(result))
    return EXIT_OK


def run_providers(args: argparse.Namespace, target: Target) -> int:
    """The provider names ``new --provider`` takes, one a line (what shell completion
    offers): the running daemon's, which include its config's ``[agents.NAME]``; with
    no daemon answering, the built-in ones (said on stderr)."""
    names: list[str] = []
    try:
        with target.link(start=False) as link:
            names = list(link.call("daemon.status").get("providers") or [])
    except DaemonUnreachable:
        pass
    if not names:
        from agentsd_protocol.providers import builtin_provider_names

        names = builtin_provider_names()
        print(
            "agentsctl: no daemon answers (or it does not list its providers): the built-in "
            "providers; your config's [agents.NAME] are not among them",
            file=sys.stderr,
        )
    for name in names:
        print(name)
    return EXIT_OK


def run_status_format(template: str, target: Target) -> int:
    """One round trip (``agentSession.watch``'s snapshot) on the stdlib link: a prompt
    runs it at every redraw, so it stays inside the CLI's cold-start budget."""
    try:
        with target.link(start=False) as link:
            sessions = link.call("agentSession.watch")["sessions"]
    except DaemonUnreachable:
        print()
        return EXIT_UNREACHABLE
    try:
        print(template.format_map(status_fields(sessions)))
    except (KeyError, ValueError, IndexError) as exc:
        raise CommandFailed(f"bad --format {template!r}: {exc!r}", "usage") from None
    return EXIT_OK


def status_fields(sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields of ``status --format``, from session summaries."""
    fields: dict[str, Any] = {
        state: sum(1 for s in sessions if s.get("state") == state)
        for state in ("idle", "working", "attention", "failed")
    }
    fields["total"] = len(sessions)
    fields["unseen"] = sum(1 for s in sessions if s.get("unseen"))
    fields["needs"] = " ".join(
        s.get("title") or s["sessionId"]
        for s in sessions
        if s.get("unseen") or s.get("state") in ("attention", "failed")
    )
    return fields


def format_status(result: dict[str, Any]) -> str:
    sessions = result.get("sessions") or {}
    recovery = result.get("recovery") or {}
    counts = ", ".join(
        f"{sessions.get(key, 0)} {key}" for key in ("running", "working", "attention")
    )
    recovered = recovery.get("summary") or (
        f"{recovery.get('sessionsRecovered', 0)} sessions recovered, "
        f"{recovery.get('orphansEnded', 0)} orphans ended, "
        f"{recovery.get('unproven', 0)} unproven"
    )
    rows = [
        ("socket", result.get("socket", "?")),
        ("state dir", result.get("stateDir", "?")),
        ("connections", result.get("connections", "?")),
        ("sessions", f"{sessions.get('total', 0)} ({counts})"),
        ("recovery", recovered),
    ]
    if result.get("draining"):
        rows.append(("draining", "takes no new turn; restarts once the running turns end"))
    containment = result.get("containment")
    if containment:
        rows.append(("containment", f"{containment.get('mode')} ({containment.get('detail')})"))
    agent_env = result.get("agentEnv")
    if agent_env:
        rows += agent_env_rows(agent_env)
    head = (
        f"agentsd {result.get('version', '?')} (pid {result.get('pid', '?')}), "
        f"up {format_duration(float(result.get('uptimeS', 0.0)))}"
    )
    return "\n".join([head, *(f"  {name + ':':<13}{value}" for name, value in rows)])


def describe_agent_env(agent_env: dict[str, Any]) -> str:
    """One line: the mode in force and what became of it (``AgentEnv`` on the wire)."""
    mode, state = agent_env.get("mode", "?"), agent_env.get("state", "?")
    detail = agent_env.get("detail") or ""
    if state == "fallback":
        text = f"{mode} FAILED, agents get the daemon's own environment: {detail}"
    elif state == "captured":
        text = f"{mode}, captured {detail}"
    else:
        text = f"{mode}: {detail}" if detail else str(mode)
    if agent_env.get("configured") == "auto":
        text += " (agent_env = auto)"
    age_s = agent_env.get("ageS")
    if age_s is not None:
        text += f", {format_duration(float(age_s))} ago"
    return text


def describe_programs(agent_env: dict[str, Any]) -> str:
    found = []
    for program in agent_env.get("programs") or []:
        where = program.get("path")
        if where is None:
            found.append(f"{program.get('provider')} not found")
        else:
            source = program.get("source")
            found.append(
                f"{program.get('provider')} {where}" + (f" ({source})" if source != "PATH" else "")
            )
    return "; ".join(found) or "none configured"


def agent_env_rows(agent_env: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``status`` rows about the environment agents start with."""
    return [
        ("agent env", describe_agent_env(agent_env)),
        ("agent PATH", agent_env.get("path") or "(unset)"),
        ("agent bins", describe_programs(agent_env)),
    ]


def format_duration(seconds: float) -> str:
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{seconds:.1f}s"


def configure_daemon_start(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--foreground", action="store_true", help="run agentsd in this process (exec) instead"
    )
    parser.add_argument("--log-level", help="passed to agentsd: debug, info, warning, error")
    parser.add_argument("--config", metavar="FILE", help="passed to agentsd: its config file")


def run_daemon_start(args: argparse.Namespace, target: Target) -> int:
    if answers(target.socket_path):
        print(f"agentsd is already running at {target.socket_path}")
        return EXIT_OK
    if args.foreground:
        argv = daemon_argv(
            target.socket_path,
            state_dir=target.explicit_state_dir,
            log_level=args.log_level,
            config=args.config,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(argv[0], argv)
    pid = target.start_detached(log_level=args.log_level, config=args.config)
    print(f"agentsd started (pid {pid}) at {target.socket_path}; log: {target.log_path}")
    return EXIT_OK


def run_daemon_stop(args: argparse.Namespace, target: Target) -> int:
    """Ask the daemon to shut down and wait until it is gone. One that holds the state
    directory but cannot be reached through the socket gets SIGTERM (the same clean
    shutdown), after it was verified to be that daemon (``agentsctl.daemon`` Rule 4);
    "not running" is said only when no daemon holds the lock."""
    from agentsd_protocol.errors import ShuttingDown

    try:
        with target.link(start=False) as link:
            link.call("daemon.shutdown")
    except DaemonDisconnected:
        pass  # it went away before replying: what we asked for
    except ShuttingDown:
        pass  # someone else asked first; wait all the same
    except DaemonSocketLost as lost:
        return stop_unreachable(lost.holder, target)
    except DaemonNotRunning:
        print(f"agentsd is not running at {target.socket_path}")
        return EXIT_OK
    started = time.monotonic()
    if not wait_until_gone(target.socket_path):
        raise CommandFailed(
            f"agentsd at {target.socket_path} still answers "
            f"{time.monotonic() - started:.0f} s after daemon.shutdown",
            "stop_timeout",
        )
    print(f"agentsd at {target.socket_path} stopped")
    return EXIT_OK


def stop_unreachable(holder: LockHolder, target: Target) -> int:
    """SIGTERM the daemon named by the lock and wait until it has exited."""
    if not holder.is_running():
        print(f"agentsd (pid {holder.pid}) stopped by itself")
        return EXIT_OK
    print(
        f"agentsd (pid {holder.pid}) holds {target.state_dir} but cannot be reached at "
        f"{target.socket_path}; sending it SIGTERM"
    )
    import contextlib  # only here: the cold start of `status` is budgeted

    with contextlib.suppress(ProcessLookupError):  # it exited since the check
        os.kill(holder.pid, signal.SIGTERM)
    if not wait_until_exited(holder):
        raise CommandFailed(
            f"agentsd (pid {holder.pid}) still runs {STOP_DEADLINE_S:g} s after SIGTERM",
            "stop_timeout",
        )
    print(f"agentsd (pid {holder.pid}) stopped")
    return EXIT_OK


def run_daemon_ping(args: argparse.Namespace, target: Target) -> int:
    with target.link(start=False) as link:
        started = time.perf_counter()
        link.call("daemon.ping")
        elapsed = time.perf_counter() - started
    print(f"pong from agentsd at {target.socket_path}: {elapsed * 1000:.2f} ms")
    return EXIT_OK


RELOAD_TIMEOUT_S = 130.0  # the daemon bounds a capture by login_shell_timeout_s (at most 120 s)


def configure_daemon_reload_env(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the raw JSON result")


def run_daemon_reload_env(args: argparse.Namespace, target: Target) -> int:
    """``daemon.reloadEnv``: the next agent start gets the environment captured now;
    running agents keep theirs. Exit 1 when the login shell failed (the daemon then
    uses its own environment, and says why)."""
    import msgspec

    from agentsctl.mutation import new_operation_id
    from agentsd_protocol import methods
    from agentsd_protocol.api.daemon import ReloadEnvParams

    params = ReloadEnvParams(client_operation_id=new_operation_id())
    try:
        with target.client(start=False) as client:
            client.timeout_s = RELOAD_TIMEOUT_S
            result = client.call(methods.RELOAD_ENV, params)
    except DaemonNotRunning:
        print(
            f"agentsd is not running at {target.socket_path}; it captures the environment at its start"
        )
        return EXIT_OK
    agent_env: dict[str, Any] = msgspec.to_builtins(result.agent_env)
    if args.json:
        print(json.dumps(agent_env, indent=2))
    else:
        for name, value in agent_env_rows(agent_env):
            print(f"{name + ':':<13}{value}")
    if agent_env.get("state") == "fallback":
        raise CommandFailed(
            f"the login shell failed: {agent_env.get('detail')}", "login_shell_failed"
        )
    return EXIT_OK
