"""``agentsctl continue`` and ``agentsctl daemon restart``: carrying on what a daemon
restart cut off, and restarting without cutting anything off.

Rule 1: ``continue`` lists or continues the turns the daemon's reconciliation report
names (``daemon.status`` ``recovery.cutOff``); each continuation is one
``agentSession.continue``, never a re-send of the user's prompt.

Rule 2: ``daemon restart`` returns once a new daemon answers: one whose start is
after the old one replied (a re-executed daemon keeps its pid, so the pid proves
nothing).
"""

from __future__ import annotations

import argparse
import time

from agentsctl.cli import EXIT_OK, CommandFailed, UsageError
from agentsctl.daemon import (
    POLL_MAX_S,
    STOP_DEADLINE_S,
    DaemonNotRunning,
    DaemonUnreachable,
    quick_call,
)
from agentsctl.mutation import mutate, new_operation_id
from agentsctl.render import print_json
from agentsctl.target import Target
from agentsd_protocol import methods
from agentsd_protocol.api import conversation as c
from agentsd_protocol.api import daemon as d
from agentsd_protocol.errors import RpcError

RESTART_DEADLINE_S = 60.0  # a stop (about one kill ladder), recovery and a start, loaded
REPLY_MARGIN_S = 60.0  # beyond a drain's own timeout: its shutdown and the reply


def configure_continue(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Without SESSION or --all: list the turns a daemon restart cut off that wait\n"
        "to be carried on. A continuation resumes the agent's conversation natively and\n"
        "asks it to carry on; your prompt is never sent again."
    )
    parser.add_argument("session_id", metavar="SESSION", nargs="?", help="the session's id")
    parser.add_argument("--all", action="store_true", help="continue every cut-off turn")
    parser.add_argument("--json", action="store_true", help="print the JSON results")


def run_continue(args: argparse.Namespace, target: Target) -> int:
    if args.all and args.session_id is not None:
        raise UsageError("give a SESSION or --all, not both")
    if args.session_id is not None:
        result = mutate(target, methods.CONTINUE, c.ContinueParams(session_id=args.session_id))
        if args.json:
            print_json(result)
        else:
            print(describe_continued(result))
        return EXIT_OK if result.dispatch != "rejected" else _undelivered(result)
    with target.client() as client:
        status = client.call(methods.STATUS, d.StatusParams())
    waiting = [cut for cut in status.recovery.cut_off if not cut.continued]
    if not args.all:
        if args.json:
            print_json(waiting)
        elif not waiting:
            print("no turn cut off by a daemon restart waits to be continued")
        else:
            for cut in waiting:
                print(f"{cut.session_id}  {cut.title or '-'}  ({cut.provider}, {cut.reason})")
            print(f"`agentsctl continue SESSION` or `--all` ({len(waiting)}) carries them on")
        return EXIT_OK
    failures = 0
    results: list[c.ContinueResult] = []
    for cut in waiting:
        try:
            result = mutate(target, methods.CONTINUE, c.ContinueParams(session_id=cut.session_id))
        except RpcError as exc:
            failures += 1
            print(f"{cut.session_id}: not continued: {exc.message} [{exc.kind}]")
            continue
        results.append(result)
        if result.dispatch == "rejected":
            failures += 1
        if not args.json:
            print(describe_continued(result))
    if args.json:
        print_json(results)
    if failures:
        raise CommandFailed(
            f"{failures} of {len(waiting)} cut-off turns were not continued", "not_continued"
        )
    return EXIT_OK


def describe_continued(result: c.ContinueResult) -> str:
    text = (
        f"{result.session_id}: continued the turn cut off at seq {result.continued_seq} "
        f"(seq {result.seq}): {result.dispatch}"
    )
    return text + (f" ({result.reason})" if result.reason else "")


def _undelivered(result: c.ContinueResult) -> int:
    raise CommandFailed(
        f"the continuation of {result.session_id} was not delivered: {result.reason}",
        "not_delivered",
    )


# -- daemon restart ---------------------------------------------------------------


def configure_daemon_restart(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "agentsd restarts in place: the same process executes the daemon again (the\n"
        "code installed now runs), keeping its pid and, under systemd, its socket (no\n"
        "client sees a refused connection) and telling systemd RELOADING=1, then\n"
        "READY=1 (`systemctl --user reload agentsd` runs this command).\n"
        "With the holder (`holder = true`, the default), running agents are handed\n"
        "over and keep running (their turns go on); with `holder = false` they end, as\n"
        "at a stop, and the next send resumes each conversation natively.\n"
        "With --drain, agentsd first takes no new turn (a send gets `draining`) and\n"
        "waits for the running turns to end, or for --timeout; without it (and without\n"
        "the holder) running turns are cut off at once (`agentsctl continue` carries\n"
        "them on). Once asked, the drain goes on if this command is interrupted.\n"
        "A package upgrade: install, then `agentsctl daemon restart` (with the\n"
        "holder) or `agentsctl daemon restart --drain` (without). A new version that\n"
        "cannot start exits non-zero with its reason in the log; this command then\n"
        "fails, and agents the holder keeps are still held."
    )
    parser.add_argument(
        "--drain",
        nargs="?",
        const="turn",
        choices=["turn"],
        help="wait for running turns to end first (turn: the only kind yet)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="SECS",
        help="with --drain: restart after SECS even if turns still run (default: no bound)",
    )
    parser.add_argument("--json", action="store_true", help="print the JSON result")


def run_daemon_restart(args: argparse.Namespace, target: Target) -> int:
    if args.timeout is not None and args.drain is None:
        raise UsageError("--timeout goes with --drain")
    if args.timeout is not None and args.timeout < 0:
        raise UsageError("--timeout must not be negative")
    params = d.RestartParams(
        drain=args.drain, timeout_s=args.timeout, client_operation_id=new_operation_id()
    )
    try:
        with target.client(start=False) as client:
            # A drain waits as long as the turns run: the reply has no fixed bound.
            client.timeout_s = None if args.timeout is None else args.timeout + REPLY_MARGIN_S
            result = client.call(methods.RESTART, params)
    except DaemonNotRunning:
        if not target.may_start:
            raise
        pid = target.start_detached()
        print(f"agentsd was not running; started it (pid {pid}) at {target.socket_path}")
        return EXIT_OK
    replied = time.time()
    if args.json:
        print_json(result)
    elif result.drained:
        print(
            f"drained: {result.turns_running} turn{'s' if result.turns_running != 1 else ''} "
            f"running, {result.turns_finished} finished, {result.turns_cut_off} cut off"
            + (" at the timeout" if result.timed_out else "")
            + f" (waited {result.waited_s:.1f} s)"
        )
    pid = wait_for_new_daemon(target.socket_path, replied)
    if not args.json:
        agents = (
            "running agents kept running"
            if result.keeps_agents
            else "running agents ended; the next send resumes them"
        )
        print(f"agentsd restarted (pid {pid}, {result.how}) at {target.socket_path}; {agents}")
    return EXIT_OK


START_SLACK_S = 0.05  # uptime is rounded to the ms; the old daemon served far longer


def wait_for_new_daemon(socket_path: str, after: float) -> int:
    """The pid of a daemon at ``socket_path`` that started after ``after``, the
    moment the old one replied (Rule 2)."""
    deadline = time.monotonic() + max(RESTART_DEADLINE_S, STOP_DEADLINE_S)
    while time.monotonic() < deadline:
        try:
            status = quick_call(socket_path, "daemon.status")
        except (DaemonUnreachable, RpcError, TimeoutError):
            status = None
        if status is not None and time.time() - float(status["uptimeS"]) > after - START_SLACK_S:
            return int(status["pid"])
        time.sleep(POLL_MAX_S)
    raise CommandFailed(
        f"no new agentsd answered at {socket_path} within {RESTART_DEADLINE_S:g} s of the "
        "restart (see its log, or `journalctl --user -u agentsd`)",
        "restart_timeout",
    )
