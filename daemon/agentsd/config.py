"""Daemon configuration: embedded defaults, the TOML file, then command-line options.

The file is ``$XDG_CONFIG_HOME/agentsd/config.toml`` (or ``--config``); a missing
default file is fine, a missing explicit one is an error. Unknown keys are refused
with msgspec's message naming the key, so a typo never silently does nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

# An agent start waits for the first capture: minutes would look like a hang.
MAX_LOGIN_SHELL_TIMEOUT_S = 120.0
MIN_LOG_BYTES = 64 * 1024  # a stderr log must hold one pipe buffer (agentsd.stderr_log)


class Ladder(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Bounds of the close ladder (stdin EOF, SIGTERM, SIGKILL, then the proof of
    exit). Each wait ends as soon as its condition holds. The one type: the config
    file's ``[ladder]`` table decodes into it, and the child code takes it as is."""

    eof_grace_s: float = 2.0  # after stdin EOF; codex and claude exit on EOF in milliseconds
    term_grace_s: float = 3.0  # after SIGTERM; lets an agent end its own tool processes
    kill_wait_s: float = 2.0  # after SIGKILL, which cannot be ignored: only the reap
    proof_rounds: int = 3  # straggler re-scans and SIGKILLs before giving up on proof
    scan_timeout_s: float = 5.0  # one /proc scan takes milliseconds; this is a safety net


class ProviderConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    command: list[str] | None = None  # overrides the provider's default program
    env: dict[str, str] = {}


class Config(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    socket: str | None = None
    state_dir: str | None = None
    log_level: str = "info"
    idle_timeout_s: float = 1800.0  # an agent idle for 30 min is stopped; the record stays
    handshake_timeout_s: float = (
        30.0  # real agents start in about a second; 30 s covers cold caches
    )
    max_frame_bytes: int = 8 * 1024 * 1024
    # A frame, once begun, must arrive whole within this (a stalled half-frame
    # would hold a connection slot forever); local clients write one in microseconds.
    frame_timeout_s: float = 10.0
    # A client whose socket takes no batch of replies for this long is cut off.
    send_timeout_s: float = 30.0
    ladder: Ladder = Ladder()
    providers: dict[str, ProviderConfig] = {}
    # Where agents' environment comes from (agentsd.agent_env): "auto" takes the login
    # shell's under systemd and the daemon's own elsewhere.
    agent_env: Literal["auto", "login-shell", "inherit"] = "auto"
    # The login shell must have printed its environment within this, or agents get
    # the daemon's own. Shells with their rc files take 20-50 ms; 10 s is VS Code's bound.
    login_shell_timeout_s: float = 10.0
    # Each agent's stderr log, in two rotated halves (the newest kept); at least 64 KiB.
    stderr_log_max_bytes: int = 8 * 1024 * 1024


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
        raise ConfigError(f"config file {path}: {exc}") from None
    if config.log_level.lower() not in {"debug", "info", "warning", "error", "critical"}:
        raise ConfigError(
            f"config file {path}: log_level must be one of debug, info, warning, error, critical"
        )
    if not 0 < config.login_shell_timeout_s <= MAX_LOGIN_SHELL_TIMEOUT_S:
        raise ConfigError(
            f"config file {path}: login_shell_timeout_s must be more than 0 and at most "
            f"{MAX_LOGIN_SHELL_TIMEOUT_S:g}"
        )
    if config.stderr_log_max_bytes < MIN_LOG_BYTES:
        raise ConfigError(
            f"config file {path}: stderr_log_max_bytes must be at least {MIN_LOG_BYTES}"
        )
    return config
