"""Finding the real agent programs: on PATH, or shipped inside their PyPI packages.

``codex`` ships in ``openai-codex-cli-bin`` (``codex_cli_bin/bin/codex``) and
``claude`` in ``claude-agent-sdk`` (``claude_agent_sdk/_bundled/claude``); a user who
installed either package into agentsd's environment needs nothing on PATH.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import attrs


@attrs.frozen
class Program:
    name: str
    package: str  # the PyPI distribution that ships it
    module: str  # the import package inside it
    relative: str  # the binary's path inside the import package

    def install_hint(self) -> str:
        return (
            f"install it (`npm install -g` its CLI, or `pip install {self.package}` into "
            f"agentsd's environment) or point the session's `command` at it"
        )


CODEX = Program("codex", "openai-codex-cli-bin", "codex_cli_bin", "bin/codex")
CLAUDE = Program("claude", "claude-agent-sdk", "claude_agent_sdk", "_bundled/claude")


def find_program(program: Program, path: str | None = None) -> str | None:
    """The executable to run: PATH first (what the user chose), then the package."""
    found = shutil.which(program.name, path=path if path is not None else os.environ.get("PATH"))
    if found:
        return found
    spec = importlib.util.find_spec(program.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / program.relative
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None
