"""Daemon configuration: embedded defaults, the TOML file, then command-line options.

The file is ``$XDG_CONFIG_HOME/agentsd/config.toml`` (or ``--config``); a missing
default file is fine, a missing explicit one is an error. Unknown keys are refused
with msgspec's message naming the key, so a typo never silently does nothing.

Rule 1: every value is checked when the file is loaded, never first met by the code
that uses it. A key's check is written beside it, as ``Annotated`` metadata
(``Range``, ``AbsolutePath``, ``EnvTable``, ``Argv``): a new key gets one by naming
it there, and ``check_config`` finds it. msgspec ignores that metadata, so values
built in code (tests, defaults) are not checked; only a file is.

Rule 2: a refusal names the file, the key (dotted, ``ladder.term_grace_s``), the
value as written (a bounded excerpt) and what is allowed; ``agentsd`` prints it and
exits 2.
"""

from __future__ import annotations

import math
import os
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import attrs
import msgspec

from agentsd_protocol.display import excerpt

# An agent start waits for the first capture: minutes would look like a hang.
MAX_LOGIN_SHELL_TIMEOUT_S = 120.0
# The AF_UNIX sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
MAX_WAIT_S = 3600.0  # no wait in the daemon has a reason to be longer than an hour
MAX_GRACE_S = 600.0  # a close ladder of more than ten minutes a step looks like a hang
MAX_IDLE_TIMEOUT_S = 30 * 86400.0  # an idle agent kept a month is as good as never stopped
MIN_FRAME_BYTES = 4096  # a create or a send with its envelope fits; less refuses real work
MAX_FRAME_BYTES = 1024**3  # the daemon buffers a frame whole: a GiB is past any real use
MIN_KILL_WAIT_S = 0.1  # the reap after SIGKILL takes milliseconds, never zero
MIN_SCAN_TIMEOUT_S = 0.1  # one /proc scan takes milliseconds


@attrs.frozen
class Range:
    """A number from ``low`` to ``high`` (both finite); ``low_open`` excludes ``low``."""

    low: float
    high: float
    low_open: bool = False
    unit: str = ""

    def problem(self, value: Any) -> str | None:
        if value is None:  # an optional key left unset (msgspec typed the rest)
            return None
        # NaN compares false both ways, and inf is past any finite high.
        in_range = (
            isinstance(value, int | float)
            and math.isfinite(value)
            and (value > self.low if self.low_open else value >= self.low)
            and value <= self.high
        )
        if in_range:
            return None
        low = "more than" if self.low_open else "at least"
        unit = f" {self.unit}" if self.unit else ""
        return f"must be {low} {self.low:.15g} and at most {self.high:.15g}{unit}"


@attrs.frozen
class AbsolutePath:
    """An absolute path without NUL; ``max_bytes`` when the kernel bounds it."""

    max_bytes: int | None = None

    def problem(self, value: Any) -> str | None:
        if value is None:
            return None
        if "\0" in value or not os.path.isabs(value):
            return "must be an absolute path"
        if self.max_bytes is not None and len(os.fsencode(value)) > self.max_bytes:
            return f"must be at most {self.max_bytes} bytes long (the AF_UNIX limit)"
        return None


@attrs.frozen
class EnvTable:
    """Environment variables as ``exec`` takes them: names non-empty, without ``=``
    or NUL; values without NUL."""

    def problem(self, value: Any) -> str | None:
        for name, text in value.items():
            if not name or "=" in name or "\0" in name:
                return f"has an invalid variable name {excerpt(name)}: names are non-empty, without '=' or NUL"
            if "\0" in text:
                return f"has a NUL character in the value of {excerpt(name)}"
        return None


@attrs.frozen
class Argv:
    """A command line: a non-empty list of non-empty strings without NUL."""

    def problem(self, value: Any) -> str | None:
        if value is None:
            return None
        if not value or any(not word or "\0" in word for word in value):
            return "must be a non-empty list of non-empty strings without NUL"
        return None


Check = Range | AbsolutePath | EnvTable | Argv
MIN_LOG_BYTES = 64 * 1024  # a stderr log must hold one pipe buffer (agentsd.stderr_log)
MIN_MEMORY_MAX_BYTES = 16 * 1024 * 1024  # less and no agent's interpreter even starts
MAX_PIDS = 4 * 1024 * 1024  # the kernel's own pid_max ceiling
MIN_CPU_MAX = 0.01  # cpu.max takes a quota of at least 1 ms per 100 ms period
MAX_CPUS = 4096.0  # more CPUs than any machine has: no limit in practice


class Ladder(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Bounds of the close ladder (stdin EOF, SIGTERM, SIGKILL, then the proof of
    exit). Each wait ends as soon as its condition holds. The one type: the config
    file's ``[ladder]`` table decodes into it, and the child code takes it as is."""

    # After stdin EOF; codex and claude exit on EOF in milliseconds. 0: SIGTERM at once.
    eof_grace_s: Annotated[float, Range(0, MAX_GRACE_S, unit="s")] = 2.0
    # After SIGTERM; lets an agent end its own tool processes. 0: SIGKILL at once.
    term_grace_s: Annotated[float, Range(0, MAX_GRACE_S, unit="s")] = 3.0
    # After SIGKILL, which cannot be ignored: only the reap.
    kill_wait_s: Annotated[float, Range(MIN_KILL_WAIT_S, MAX_GRACE_S, unit="s")] = 2.0
    # Straggler re-scans and SIGKILLs before giving up on proof.
    proof_rounds: Annotated[int, Range(0, 100)] = 3
    # One /proc scan takes milliseconds; this is a safety net.
    scan_timeout_s: Annotated[float, Range(MIN_SCAN_TIMEOUT_S, MAX_GRACE_S, unit="s")] = 5.0


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What each agent, with everything it starts, may use: written to its cgroup's
    ``memory.max``, ``pids.max`` and ``cpu.max`` (agentsd.cgroup). Each needs its
    controller enabled in the cgroup root's ``cgroup.subtree_control``; one that
    cannot be applied fails the create or start that would need it."""

    memory_max_bytes: Annotated[int | None, Range(MIN_MEMORY_MAX_BYTES, 2**62, unit="bytes")] = None
    pids_max: Annotated[int | None, Range(1, MAX_PIDS)] = None
    cpu_max: Annotated[float | None, Range(MIN_CPU_MAX, MAX_CPUS, unit="CPUs")] = None

    def under(self, own: Limits) -> Limits:
        """These defaults with a session's ``own`` limits over them: each one the
        session set wins."""
        return Limits(
            memory_max_bytes=_first(own.memory_max_bytes, self.memory_max_bytes),
            pids_max=_first(own.pids_max, self.pids_max),
            cpu_max=_first(own.cpu_max, self.cpu_max),
        )

    def controllers(self) -> list[str]:
        """The cgroup controllers these limits need."""
        wanted = (
            ("memory", self.memory_max_bytes),
            ("pids", self.pids_max),
            ("cpu", self.cpu_max),
        )
        return [name for name, value in wanted if value is not None]


def _first(value: Any, default: Any) -> Any:
    return default if value is None else value


class ProviderConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # Overrides the provider's default program.
    command: Annotated[list[str] | None, Argv()] = None
    env: Annotated[dict[str, str], EnvTable()] = {}


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An ACP agent by name (``[agents.NAME]``): sessions with provider NAME run it."""

    command: Annotated[list[str], Argv()]
    env: Annotated[dict[str, str], EnvTable()] = {}
    display_name: str | None = None


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    socket: Annotated[str | None, AbsolutePath(MAX_SOCKET_PATH_BYTES)] = None
    state_dir: Annotated[str | None, AbsolutePath()] = None
    log_level: str = "info"
    # An agent idle for 30 min is stopped; the record stays.
    idle_timeout_s: Annotated[float, Range(0, MAX_IDLE_TIMEOUT_S, low_open=True, unit="s")] = 1800.0
    # Real agents start in about a second; 30 s covers cold caches.
    handshake_timeout_s: Annotated[float, Range(0, MAX_WAIT_S, low_open=True, unit="s")] = 30.0
    max_frame_bytes: Annotated[int, Range(MIN_FRAME_BYTES, MAX_FRAME_BYTES, unit="bytes")] = (
        8 * 1024 * 1024
    )
    # A frame, once begun, must arrive whole within this (a stalled half-frame
    # would hold a connection slot forever); local clients write one in microseconds.
    frame_timeout_s: Annotated[float, Range(0, MAX_WAIT_S, low_open=True, unit="s")] = 10.0
    # A client whose socket takes no batch of replies for this long is cut off.
    send_timeout_s: Annotated[float, Range(0, MAX_WAIT_S, low_open=True, unit="s")] = 30.0
    ladder: Ladder = Ladder()
    providers: dict[str, ProviderConfig] = {}
    # ACP agents by name, added to (or replacing) the built-in ones.
    agents: dict[str, AgentConfig] = {}
    # Where agents' environment comes from (agentsd.agent_env): "auto" takes the login
    # shell's under systemd and the daemon's own elsewhere.
    agent_env: Literal["auto", "login-shell", "inherit"] = "auto"
    # The login shell must have printed its environment within this, or agents get
    # the daemon's own. Shells with their rc files take 20-50 ms; 10 s is VS Code's bound.
    login_shell_timeout_s: Annotated[
        float, Range(0, MAX_LOGIN_SHELL_TIMEOUT_S, low_open=True, unit="s")
    ] = 10.0
    # Each agent's stderr log, in two rotated halves (the newest kept).
    stderr_log_max_bytes: Annotated[int, Range(MIN_LOG_BYTES, MAX_FRAME_BYTES, unit="bytes")] = (
        8 * 1024 * 1024
    )
    # A writable cgroup v2 directory in which each agent gets a cgroup of its own
    # (agentsd.cgroup); unset: under systemd the service's delegated subtree, else
    # the process group and spawn token.
    cgroup_root: Annotated[str | None, AbsolutePath()] = None
    # What a request from inside a session (an agent calling the daemon) may do
    # beyond the default (agentsd.caller): "approvals" (answer them), "sessions"
    # (create sessions and act on those it created: an orchestrating agent),
    # "other-sessions" (act on any other session), "daemon" (shut it down).
    agent_allowance: list[Literal["approvals", "sessions", "other-sessions", "daemon"]] = []
    # Per agent, with everything it starts (needs a cgroup with the controllers on).
    limits: Limits = Limits()
    # Start agents through the holder (agentsd.holder), a process that outlives the
    # daemon and holds their pipes, so that a daemon's crash does not end them. False:
    # the daemon starts them itself, and they end with it.
    holder: bool = True
    # What the next daemon does with the agents the holder kept through a daemon's
    # death (a crash, SIGKILL): "reattach" them (their turns go on, nothing streamed
    # meanwhile is lost) or "end" them (each turn cut off, `child.exited {cause:
    # daemon-restart}`). Without the holder every agent ends with its daemon.
    crash_policy: Literal["reattach", "end"] = "reattach"


class ConfigError(Exception):
    """The configuration file cannot be used; the message says which file and why."""


def load_config(path: Path, *, required: bool) -> Config:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if required:
            raise ConfigError(f"config file {path} does not exist") from None
        return Config()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        config = msgspec.toml.decode(data, type=Config)
    except msgspec.DecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}{_choices(str(exc))}") from None
    if config.log_level.lower() not in {"debug", "info", "warning", "error", "critical"}:
        raise ConfigError(
            f"config file {path}: log_level must be one of debug, info, warning, error, critical"
        )
    for key, value, problem in check_config(config):
        raise ConfigError(f"config file {path}: {key} = {_show(value)}: {problem}")
    return config


def _choices(problem: str) -> str:
    """What a top-level key that takes one of a few words takes, when ``problem``
    is a value outside them (msgspec names the key, not the words)."""
    match = re.search(r"Invalid enum value .* - at `\$\.(\w+)`$", problem)
    if match is None:
        return ""
    hints = typing.get_type_hints(Config)
    hint = hints.get(match.group(1))
    if typing.get_origin(hint) is not Literal:
        return ""
    return " (it takes " + " or ".join(f'"{word}"' for word in typing.get_args(hint)) + ")"


def check_config(value: msgspec.Struct, prefix: str = "") -> Iterator[tuple[str, Any, str]]:
    """Every ``(dotted key, value, problem)`` of ``value`` against the checks written
    beside its fields (Rule 1), nested tables included."""
    hints = typing.get_type_hints(type(value), include_extras=True)
    for field in msgspec.structs.fields(value):
        key = f"{prefix}{field.encode_name}"
        item = getattr(value, field.name)
        for check in _checks(hints[field.name]):
            problem = check.problem(item)
            if problem is not None:
                yield key, item, problem
        if isinstance(item, msgspec.Struct):
            yield from check_config(item, f"{key}.")
        elif isinstance(item, dict):
            for name, entry in item.items():
                if isinstance(entry, msgspec.Struct):
                    yield from check_config(entry, f"{key}.{name}.")


def _checks(hint: Any) -> list[Check]:
    if typing.get_origin(hint) is not Annotated:
        return []
    return [meta for meta in hint.__metadata__ if isinstance(meta, Check)]


def _show(value: Any) -> str:
    """A value as TOML spells it, bounded (Rule 2)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return excerpt(value)
    if isinstance(value, int | float):
        return repr(value)
    return excerpt(msgspec.json.encode(value).decode())
