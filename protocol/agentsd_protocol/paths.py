"""Where agentsd keeps its files, as pure functions of the environment.

Shared by the daemon and every client so both agree without talking. No I/O here:
the daemon creates and checks the directories (``agentsd.paths``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SOCKET_ENV = "AGENTSD_SOCKET"
STATE_DIR_ENV = "AGENTSD_STATE_DIR"
SOCKET_NAME = "agentsd.sock"


def default_state_dir(env: Mapping[str, str] = os.environ) -> Path:
    """``$AGENTSD_STATE_DIR``, else ``$XDG_STATE_HOME/agentsd``, else
    ``~/.local/state/agentsd``."""
    if explicit := env.get(STATE_DIR_ENV):
        return Path(explicit)
    if xdg := env.get("XDG_STATE_HOME"):
        return Path(xdg) / "agentsd"
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".local" / "state" / "agentsd"


def default_socket_path(env: Mapping[str, str] = os.environ, state_dir: Path | None = None) -> Path:
    """``$AGENTSD_SOCKET``, else ``$XDG_RUNTIME_DIR/agentsd/agentsd.sock``; without a
    runtime dir, a private ``run/`` directory under the state dir (never bare /tmp)."""
    if explicit := env.get(SOCKET_ENV):
        return Path(explicit)
    if runtime := env.get("XDG_RUNTIME_DIR"):
        return Path(runtime) / "agentsd" / SOCKET_NAME
    return (state_dir or default_state_dir(env)) / "run" / SOCKET_NAME


def default_config_path(env: Mapping[str, str] = os.environ) -> Path:
    if xdg := env.get("XDG_CONFIG_HOME"):
        return Path(xdg) / "agentsd" / "config.toml"
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".config" / "agentsd" / "config.toml"
