"""``agentsctl doctor``: is everything agentsd needs in place?

Rule 1: the doctor only looks. It never starts a daemon, never creates or repairs a
file, opens the database read-only, and never imports the agent packages or the
``agentsd`` package (``importlib.util.find_spec`` locates a package without running it).

Rule 2: every check ends in one of ``ok``, ``info`` (fine, for your information),
``warn`` (works, but probably not what you want), ``fail`` (something agentsd needs
is wrong) or ``skip`` (cannot be checked here). The exit status is 1 when any check
failed, else 0; a ``fail`` or ``warn`` carries a hint that says how to fix it.

Rule 3: every external program runs with a timeout and its absence is a ``skip`` or
a finding, never a crash.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from agentsctl.cli import EXIT_DAEMON_ERROR, EXIT_OK
from agentsctl.daemon import DaemonNotRunning, DaemonUnreachable, quick_call
from agentsctl.render import Style, print_json
from agentsd_protocol.errors import RpcError
from agentsd_protocol.providers import BUILTIN_PROVIDERS

if TYPE_CHECKING:
    from collections.abc import Callable

    from agentsctl.target import Target

VERSION_TIMEOUT_S = 10.0  # `codex --version` answers in milliseconds; a hung one is a finding
SYSTEM_TIMEOUT_S = 5.0  # loginctl, systemctl: local D-Bus round trips
PING_TIMEOUT_S = 2.0  # a healthy daemon answers in about a millisecond
MAX_SOCKET_PATH_BYTES = 107  # sun_path is 108 bytes, NUL included
DATABASE_NAME = "agentsd.db"
UNITS = ("agentsd.socket", "agentsd.service")

Level = Literal["ok", "info", "warn", "fail", "skip"]


class Check(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One finding (Rule 2). ``facts`` are machine-readable details for ``--json``."""

    name: str
    status: Level
    detail: str
    hint: str | None = None
    facts: dict[str, Any] = {}


class Program(msgspec.Struct, frozen=True):
    """An agent CLI, and where its PyPI package ships it."""

    name: str
    package: str  # the PyPI distribution
    module: str  # its import package
    relative: str  # the binary inside the import package


PROGRAMS = (
    Program("codex", "openai-codex-cli-bin", "codex_cli_bin", "bin/codex"),
    Program("claude", "claude-agent-sdk", "claude_agent_sdk", "_bundled/claude"),
)


def configure_doctor(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "Each check is ok, info, warn (works, probably not what you want), fail\n"
        "(something agentsd needs is wrong) or skip; a warn or fail says how to fix it.\n"
        "Exits 1 when a check failed. Never starts a daemon or changes a file."
    )
    parser.add_argument("--json", action="store_true", help="print {ok, checks} as JSON")


def run_doctor(args: argparse.Namespace, target: Target) -> int:
    """Run every check and print them; exit 1 if any failed (Rule 2)."""
    checks: list[Check] = []
    checks += [check_program(program) for program in PROGRAMS]
    checks.append(check_daemon_package())
    daemon_status, socket_check = check_socket(target.socket_path)
    checks.append(check_private_dir("runtime dir", os.path.dirname(target.socket_path)))
    checks.append(socket_check)
    state_dir = target.state_dir
    if target.explicit_state_dir is None and daemon_status is not None:
        state_dir = str(daemon_status.get("stateDir") or state_dir)  # the one in use
    checks += check_agent_env(daemon_status)
    checks.append(check_containment(daemon_status))
    checks.append(check_private_dir("state dir", state_dir))
    checks.append(check_database(os.path.join(state_dir, DATABASE_NAME)))
    checks.append(check_storage(daemon_status))
    checks.append(check_linger())
    checks.append(check_service())
    ok = all(check.status != "fail" for check in checks)
    if args.json:
        print_json({"ok": ok, "checks": checks})
    else:
        _print_checks(checks, ok)
    return EXIT_OK if ok else EXIT_DAEMON_ERROR


def _print_checks(checks: list[Check], ok: bool) -> None:
    style = Style(sys.stdout)
    paint: dict[str, Callable[[str], str]] = {
        "ok": str,
        "info": str,
        "skip": style.dim,
        "warn": style.warn,
        "fail": style.bold,
    }
    width = max(len(check.name) for check in checks) + 2
    for check in checks:
        print(f"{paint[check.status](f'{check.status:<5}')} {check.name:<{width}}{check.detail}")
        if check.hint:
            print(f"{'':<6}{'':<{width}}{style.dim('-> ' + check.hint)}")
    failed = sum(check.status == "fail" for check in checks)
    warned = sum(check.status == "warn" for check in checks)
    verdict = "all needed checks passed" if ok else f"{failed} check(s) failed"
    print(f"\n{verdict}" + (f", {warned} warning(s)" if warned else ""))


# -- agents -----------------------------------------------------------------------


def find_program(program: Program) -> tuple[str, str] | None:
    """``(path, where)``: on PATH first (what the user chose), else inside its PyPI
    package in this Python environment, located without importing it (Rule 1)."""
    found = shutil.which(program.name)
    if found:
        return found, "PATH"
    try:
        spec = importlib.util.find_spec(program.module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = os.path.join(location, program.relative)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate, f"the {program.package} package"
    return None


def program_version(path: str) -> str:
    """The first line ``PATH --version`` prints; ``RuntimeError`` saying why not."""
    try:
        done = subprocess.run(
            [path, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=VERSION_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"`--version` did not finish within {VERSION_TIMEOUT_S:.0f} s") from None
    except OSError as exc:
        raise RuntimeError(f"cannot run it: {exc.strerror or exc}") from None
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines()]
    first = next((line for line in lines if line), "")
    if done.returncode != 0:
        raise RuntimeError(f"`--version` exited {done.returncode}: {first or 'no output'}")
    return first or "(no version printed)"


def check_program(program: Program) -> Check:
    found = find_program(program)
    if found is None:
        return Check(
            name=program.name,
            status="warn",
            detail=f"not found on PATH nor in the {program.package} package",
            hint=f"sessions with provider {program.name} cannot start; "
            f"`pip install {program.package}` into this environment, or install its CLI on PATH",
        )
    path, where = found
    try:
        version = program_version(path)
    except RuntimeError as exc:
        return Check(
            name=program.name,
            status="fail",
            detail=f"{path} is broken: {exc}",
            hint=f"reinstall {program.package}, or fix or remove {path}",
            facts={"path": path, "from": where},
        )
    return Check(
        name=program.name,
        status="ok",
        detail=f"{version} at {path} (from {where})",
        facts={"path": path, "from": where, "version": version},
    )


def check_containment(status: dict[str, Any] | None) -> Check:
    """How the daemon contains its agents (its ``daemon.status``): a cgroup per
    session, or the process group and spawn token, which a tool that calls setsid()
    and clears its environment escapes."""
    if status is None:
        return Check(name="containment", status="skip", detail="no daemon answers to report it")
    containment = status.get("containment")
    if not containment:
        return Check(name="containment", status="skip", detail="this daemon does not report it")
    mode = str(containment.get("mode", "?"))
    detail = f"{mode}: {containment.get('detail', '')}"
    if mode == "process-group":
        return Check(
            name="containment",
            status="warn",
            detail=detail,
            hint="set cgroup_root, or run under systemd with Delegate=yes, for a cgroup per session",
            facts=containment,
        )
    return Check(name="containment", status="ok", detail=detail, facts=containment)


def check_agent_env(status: dict[str, Any] | None) -> list[Check]:
    """What the *daemon* sees (its ``daemon.status``): the environment its agents
    start with, and where their programs resolve in it. It may differ from this
    shell's: a systemd user service has the user manager's short PATH."""
    if status is None:
        return [Check(name="agent env", status="skip", detail="no daemon answers to report it")]
    agent_env = status.get("agentEnv")
    if not agent_env:
        return [Check(name="agent env", status="skip", detail="this daemon does not report it")]
    from agentsctl.commands_daemon import describe_agent_env

    state = agent_env.get("state")
    path = agent_env.get("path") or ""
    facts = {k: agent_env.get(k) for k in ("mode", "configured", "state", "shell", "path")}
    facts["daemonPath"] = agent_env.get("daemonPath")
    detail = describe_agent_env(agent_env)
    if state == "fallback":
        checks = [
            Check(
                name="agent env",
                status="warn",
                detail=detail,
                hint="fix your shell's start-up files (they run with "
                "AGENTSD_RESOLVING_ENVIRONMENT=1 set), then `agentsctl daemon reload-env`; "
                'or set agent_env = "inherit" in the daemon\'s config',
                facts=facts,
            )
        ]
    else:
        status_level: Level = "info" if state == "pending" else "ok"
        checks = [Check(name="agent env", status=status_level, detail=detail, facts=facts)]
    checks.append(
        Check(name="agent PATH", status="info", detail=path or "(unset)", facts={"path": path})
    )
    for program in agent_env.get("programs") or []:
        checks.append(_daemon_program_check(program))
    return checks


def _daemon_program_check(program: dict[str, Any]) -> Check:
    provider = str(program.get("provider"))
    command = str(program.get("command"))
    name = f"{provider} (daemon)"
    facts = {
        "command": command,
        "path": program.get("path"),
        "from": program.get("source"),
        "version": program.get("version"),
    }
    if program.get("path") is None:
        mine = shutil.which(command)
        elsewhere = f"; this shell finds it at {mine}" if mine else ""
        # An ACP agent's command is its [agents.NAME] table's; a native provider's,
        # its [providers.NAME] table's.
        table = "providers" if provider in BUILTIN_PROVIDERS else "agents"
        return Check(
            name=name,
            status="warn",
            detail=f"the daemon's agents do not find {command}{elsewhere}",
            hint=f"install it on the agents' PATH, or set [{table}.{provider}] command "
            "in the daemon's config; then `agentsctl daemon reload-env`",
            facts=facts,
        )
    source = program.get("source")
    where = {
        "PATH": "on the agents' PATH",
        "package": "its PyPI package in agentsd's environment",
        "config": "the daemon's config",
    }.get(str(source), str(source))
    # The version its agents reported to the daemon; before any started, the
    # check of the same program above (this shell's view) says it.
    version = program.get("version")
    said = f"version {version}" if version else "version not known to the daemon yet"
    return Check(
        name=name, status="ok", detail=f"{program.get('path')} ({where}), {said}", facts=facts
    )


def check_daemon_package() -> Check:
    try:
        spec = importlib.util.find_spec("agentsd")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return Check(
            name="daemon",
            status="fail",
            detail=f"the agentsd package is not installed for {sys.executable}",
            hint="install agentsd into this environment (`make setup` or `pip install -e .`)",
        )
    return Check(
        name="daemon",
        status="ok",
        detail=f"agentsd importable by {sys.executable}",
        facts={"python": sys.executable, "package": spec.origin or ""},
    )


# -- directories, socket, database ---------------------------------------------------


def check_private_dir(name: str, path: str) -> Check:
    """The directory exists (or can be created by the daemon), is a real directory,
    ours, and closed to group and others: what the daemon itself insists on."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Check(
            name=name,
            status="info",
            detail=f"{path} does not exist yet (the daemon creates it, mode 0700)",
            facts={"path": path, "exists": False},
        )
    except OSError as exc:
        return Check(name=name, status="fail", detail=f"cannot inspect {path}: {exc.strerror}")
    mode = stat.S_IMODE(st.st_mode)
    facts = {"path": path, "exists": True, "mode": f"{mode:04o}", "uid": st.st_uid}
    if stat.S_ISLNK(st.st_mode):
        problem, hint = "is a symlink", f"replace it with a real directory: rm {path}"
    elif not stat.S_ISDIR(st.st_mode):
        problem, hint = "is not a directory", f"move {path} out of the way"
    elif st.st_uid != os.geteuid():
        problem = f"belongs to uid {st.st_uid}, not to us (uid {os.geteuid()})"
        hint = f"use a directory of your own, or chown {path}"
    elif mode & 0o077:
        problem, hint = f"has mode {mode:04o}: open to group or others", f"chmod 700 {path}"
    elif not os.access(path, os.W_OK | os.X_OK):
        problem, hint = f"is not writable (mode {mode:04o})", f"chmod 700 {path}"
    else:
        return Check(name=name, status="ok", detail=f"{path} (mode 0700, ours)", facts=facts)
    return Check(
        name=name,
        status="fail",
        detail=f"{path} {problem}; the daemon refuses to use it",
        hint=hint,
        facts=facts,
    )


def check_socket(path: str) -> tuple[dict[str, Any] | None, Check]:
    """Whether a daemon answers ``daemon.ping`` at ``path``; with its status if so."""
    facts: dict[str, Any] = {"path": path}
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        return None, Check(
            name="socket",
            status="fail",
            detail=f"{path} is longer than {MAX_SOCKET_PATH_BYTES} bytes: no socket can live there",
            hint="use a shorter --socket or $AGENTSD_SOCKET",
            facts=facts,
        )
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None, Check(
            name="socket",
            status="warn",
            detail=f"{path} does not exist: no daemon is running",
            hint="`agentsctl daemon start`; commands also start it on demand",
            facts={**facts, "exists": False, "answers": False},
        )
    except OSError as exc:
        return None, Check(
            name="socket", status="fail", detail=f"cannot inspect {path}: {exc.strerror}"
        )
    facts["exists"] = True
    if not stat.S_ISSOCK(st.st_mode):
        return None, Check(
            name="socket",
            status="fail",
            detail=f"{path} exists and is not a socket",
            hint=f"move {path} out of the way",
            facts=facts,
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        return None, Check(
            name="socket",
            status="fail",
            detail=f"{path} has mode {stat.S_IMODE(st.st_mode):04o}: others may connect",
            hint="restart the daemon (it creates the socket 0600), or fix SocketMode= in the unit",
            facts=facts,
        )
    started = time.perf_counter()
    try:
        quick_call(path, "daemon.ping", timeout_s=PING_TIMEOUT_S)
        elapsed_ms = (time.perf_counter() - started) * 1000
        status: dict[str, Any] = quick_call(path, "daemon.status", timeout_s=PING_TIMEOUT_S)
    except DaemonNotRunning:
        return None, Check(
            name="socket",
            status="warn",
            detail=f"{path} is stale: nothing listens on it",
            hint="`agentsctl daemon start` replaces it",
            facts={**facts, "answers": False},
        )
    except (DaemonUnreachable, TimeoutError, OSError) as exc:
        return None, Check(
            name="socket",
            status="fail",
            detail=f"{path} does not answer daemon.ping: {exc}",
            hint="see the daemon's log; `agentsctl daemon stop`, then start it again",
            facts={**facts, "answers": False},
        )
    except RpcError as exc:  # an error answer (for example shutting_down) is an answer
        return None, Check(
            name="socket",
            status="warn",
            detail=f"agentsd at {path} answered with an error: {exc.message} [{exc.kind}]",
            facts={**facts, "answers": True},
        )
    facts.update(answers=True, pingMs=round(elapsed_ms, 2), pid=status.get("pid"))
    return status, Check(
        name="socket",
        status="ok",
        detail=f"agentsd {status.get('version', '?')} (pid {status.get('pid', '?')}) "
        f"answers daemon.ping in {elapsed_ms:.1f} ms",
        facts=facts,
    )


def check_database(path: str) -> Check:
    """Readable, and its schema version (``PRAGMA user_version``), read-only (Rule 1)."""
    import sqlite3  # only here: it costs every other command's cold start
    from urllib.parse import quote

    facts: dict[str, Any] = {"path": path}
    if not os.path.exists(path):
        return Check(
            name="database",
            status="info",
            detail=f"{path} does not exist yet (the daemon creates it)",
            facts={**facts, "exists": False},
        )
    try:
        with sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=2.0) as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            journal_mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
            sessions: int | None
            try:
                sessions = int(conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])
            except sqlite3.OperationalError:
                sessions = None
        conn.close()
    except sqlite3.Error as exc:
        return Check(
            name="database",
            status="fail",
            detail=f"{path} cannot be read: {exc}",
            hint="check its permissions; if it is corrupt, move it away (sessions are lost)",
            facts=facts,
        )
    facts.update(exists=True, schemaVersion=version, journalMode=journal_mode, sessions=sessions)
    counted = "" if sessions is None else f", {sessions} session(s)"
    if version == 0:
        return Check(
            name="database",
            status="warn",
            detail=f"{path} has no schema yet (user_version 0)",
            hint="the daemon creates it at its next start",
            facts=facts,
        )
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        return Check(
            name="database",
            status="warn",
            detail=f"{path} has mode {mode:04o}: others may read your conversations",
            hint=f"chmod 600 {path}",
            facts=facts,
        )
    return Check(
        name="database",
        status="ok",
        detail=f"{path}: schema version {version}, {journal_mode} journal{counted}",
        facts=facts,
    )


def check_storage(status: dict[str, Any] | None) -> Check:
    """Whether the running daemon can make writes durable (its ``daemon.status``):
    a state directory deleted, moved or made read-only under it stops every write."""
    if status is None:
        return Check(name="storage", status="skip", detail="no daemon answers to report it")
    storage = status.get("storage")
    if not isinstance(storage, dict):
        return Check(name="storage", status="skip", detail="this daemon does not report it")
    if storage.get("state") == "ok":
        return Check(name="storage", status="ok", detail="the daemon's writes are durable")
    return Check(
        name="storage",
        status="fail",
        detail=f"the daemon refuses writes: {storage.get('detail', '')}",
        hint="put the state directory back where it was, or make it writable again: "
        "writes resume by themselves; otherwise restart the daemon",
        facts=dict(storage),
    )


# -- systemd ----------------------------------------------------------------------


def _user_name() -> str:
    name = os.environ.get("USER") or os.environ.get("LOGNAME")
    if name:
        return name
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _run_system(argv: list[str]) -> subprocess.CompletedProcess[str] | str:
    """Run a system tool (Rule 3); its result, or why it could not run."""
    try:
        return subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=SYSTEM_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"`{' '.join(argv)}` did not finish within {SYSTEM_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return f"cannot run {argv[0]}: {exc.strerror or exc}"


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def check_linger() -> Check:
    if shutil.which("loginctl") is None:
        return Check(name="linger", status="skip", detail="loginctl is not installed")
    user = _user_name()
    done = _run_system(["loginctl", "show-user", user, "-p", "Linger"])
    if isinstance(done, str):
        return Check(name="linger", status="skip", detail=done)
    value = done.stdout.strip().partition("=")[2]
    if done.returncode != 0 or value not in ("yes", "no"):
        reason = _first_line(done.stderr) or _first_line(done.stdout) or f"exit {done.returncode}"
        return Check(name="linger", status="skip", detail=f"loginctl cannot tell: {reason}")
    if value == "no":
        return Check(
            name="linger",
            status="warn",
            detail=f"off for {user}: your user services (agentsd with them) stop when you log out",
            hint=f"loginctl enable-linger {user}",
            facts={"linger": False},
        )
    return Check(name="linger", status="ok", detail=f"on for {user}", facts={"linger": True})


def check_service() -> Check:
    if not os.path.isdir("/run/systemd/system"):
        return Check(name="service", status="skip", detail="systemd is not running here")
    if shutil.which("systemctl") is None:
        return Check(name="service", status="skip", detail="systemctl is not installed")
    done = _run_system(["systemctl", "--user", "is-active", *UNITS])
    if isinstance(done, str):
        return Check(name="service", status="skip", detail=done)
    states = done.stdout.split()
    if len(states) != len(UNITS):
        reason = _first_line(done.stderr) or f"exit {done.returncode}"
        return Check(name="service", status="skip", detail=f"no user manager: {reason}")
    facts = dict(zip(UNITS, states, strict=True))
    shown = ", ".join(f"{unit} {state}" for unit, state in facts.items())
    if "failed" in states:
        return Check(
            name="service",
            status="warn",
            detail=shown,
            hint="journalctl --user -u agentsd.service",
            facts=facts,
        )
    if "active" in states:
        return Check(name="service", status="ok", detail=shown, facts=facts)
    return Check(
        name="service",
        status="info",
        detail=f"{shown} (optional: `make install-user-service`)",
        facts=facts,
    )
