"""``agentsd``: parse options, merge configuration, run the daemon under trio."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import resource
import sys
from pathlib import Path
from typing import NoReturn

import msgspec
import trio

from agentsd import __version__
from agentsd.cgroup import ContainmentError
from agentsd.config import MAX_SOCKET_PATH_BYTES, Config, ConfigError, load_config
from agentsd.holder_scope import after_stop
from agentsd.listener import SocketInUse
from agentsd.logging_setup import configure_logging
from agentsd.paths import AlreadyRunning, UnsafeDirectory
from agentsd.providers import BUILTIN_PROVIDERS, provider_registry
from agentsd.reexec import PREFLIGHT_FLAG, exec_in_place, import_everything
from agentsd.server import ServiceManager, serve_daemon
from agentsd.store.database import SchemaTooNew
from agentsd.store.integrity import DatabaseDamaged
from agentsd.systemd import SystemdEnvError
from agentsd.upkeep import add_arguments, run_upkeep
from agentsd_protocol.errors import StorageUnavailable
from agentsd_protocol.paths import default_config_path, default_socket_path, default_state_dir

log = logging.getLogger("agentsd")

EXIT_OK = 0
EXIT_FAILURE = 1  # could not start: another daemon, unsafe directory, damaged store
EXIT_USAGE = 2  # bad options or configuration: nothing was started


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="agentsd",
        description="Keep AI coding-agent sessions supervised and durable; serve them "
        "over JSON-RPC 2.0 on a Unix socket.",
    )
    parser.add_argument(
        "--socket", help="socket path (default $XDG_RUNTIME_DIR/agentsd/agentsd.sock)"
    )
    parser.add_argument("--state-dir", help="state directory (default $XDG_STATE_HOME/agentsd)")
    parser.add_argument("--log-level", help="debug, info, warning, error (default info)")
    parser.add_argument(
        "--config", help="config file (default $XDG_CONFIG_HOME/agentsd/config.toml)"
    )
    parser.add_argument(
        "--cgroup-root",
        help="a writable cgroup v2 directory; each agent gets a cgroup in it (config cgroup_root)",
    )
    parser.add_argument("--version", action="version", version=f"agentsd {__version__}")
    parser.add_argument(
        PREFLIGHT_FLAG,
        action="store_true",
        help="load the configuration and the code as a start would, then exit (0: it "
        "would start); what a restart checks before it stops anything",
    )
    parser.add_argument(
        "--after-stop",
        action="store_true",
        help="what the unit's ExecStopPost= runs: after a stop (SERVICE_RESULT success or "
        "timeout) end what is left in the holder's scope; after a crash, nothing",
    )
    add_arguments(parser)
    return parser.parse_args(argv)


def raise_nofile_limit() -> None:
    """Every supervised child holds a pidfd; the common soft limit of 1024 would cap
    the number of sessions, so take the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config_path = Path(args.config) if args.config else default_config_path()
        config = load_config(config_path, required=args.config is not None)
        taken = sorted(set(config.agents) & set(BUILTIN_PROVIDERS))
        if taken:
            raise ConfigError(
                f"config file {config_path}: [agents.{taken[0]}]: {taken[0]} is a built-in "
                "provider, not an ACP agent; name the agent otherwise"
            )
        known = provider_registry(config.agents)
        unknown = sorted(set(config.providers) - set(known))
        if unknown:
            raise ConfigError(
                f"config file {config_path}: unknown provider(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        if args.cgroup_root is not None:
            config = msgspec.structs.replace(
                config, cgroup_root=str(Path(args.cgroup_root).absolute())
            )
    except ConfigError as exc:
        print(f"agentsd: {exc}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    # A relative path on the command line means one under the caller's directory;
    # the config file's own must be absolute (agentsd.config).
    state_dir = Path(args.state_dir or config.state_dir or default_state_dir()).absolute()
    socket_path = Path(
        args.socket or config.socket or default_socket_path(state_dir=state_dir)
    ).absolute()
    if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH_BYTES:
        print(
            f"agentsd: socket path {socket_path} is longer than {MAX_SOCKET_PATH_BYTES} bytes "
            "(the AF_UNIX limit); choose a shorter one with --socket",
            file=sys.stderr,
        )
        sys.exit(EXIT_USAGE)
    if args.after_stop:
        print(f"agentsd: {after_stop(state_dir, os.environ)}")
        sys.exit(EXIT_OK)
    upkeep_status = run_upkeep(args, state_dir, socket_path)
    if upkeep_status is not None:
        sys.exit(upkeep_status)
    level = (args.log_level or config.log_level).upper()
    if level not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        print(f"agentsd: unknown log level {args.log_level!r}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if args.preflight:
        print(f"agentsd: preflight: configuration and {import_everything()} modules load")
        sys.exit(EXIT_OK)
    configure_logging(level)
    faulthandler.enable()  # a watchdog kill (SIGABRT) leaves every thread's traceback
    try:
        service = ServiceManager.from_env(socket_path)
    except SystemdEnvError as exc:
        print(f"agentsd: {exc}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    raise_nofile_limit()
    refusals: list[BaseException] = []
    restart = False
    image_args = sys.argv[1:] if argv is None else argv
    try:
        restart = trio.run(_run, config, socket_path, state_dir, service, image_args)
    except* (
        AlreadyRunning,
        UnsafeDirectory,
        SocketInUse,
        SchemaTooNew,
        DatabaseDamaged,
        StorageUnavailable,
        ContainmentError,
    ) as group:
        # Raised inside the daemon's nurseries, these arrive wrapped in (nested)
        # exception groups; a plain except would let a traceback through.
        refusals.extend(_leaves(group))
    if refusals:
        for refusal in refusals:
            print(f"agentsd: {refusal}", file=sys.stderr)
        sys.exit(EXIT_FAILURE)
    if restart:
        _restart(service, image_args)
    sys.exit(EXIT_OK)


def _restart(service: ServiceManager, argv: list[str]) -> NoReturn:
    """Start again after ``daemon.restart``, in place (``agentsd.reexec``): this
    process becomes a new daemon with the same arguments, pid, log and environment,
    and the sockets a service manager passed (or the one it bound itself, still
    listening); whatever was installed since is what runs. The old image said
    ``RELOADING=1``; the new one says ``READY=1``."""
    exec_in_place(argv, service.image_env(), service.kept_fds())


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


async def _run(
    config: Config, socket_path: Path, state_dir: Path, service: ServiceManager, argv: list[str]
) -> bool:
    return await serve_daemon(
        config, socket_path=socket_path, state_dir=state_dir, service=service, image_args=argv
    )
