"""Finding the real agent programs: on PATH, or shipped inside their PyPI packages.

``codex`` ships in ``openai-codex-cli-bin`` (``codex_cli_bin/bin/codex``) and
``claude`` in ``claude-agent-sdk`` (``claude_agent_sdk/_bundled/claude``); a user who
installed either package into agentsd's environment needs nothing on PATH. Both also
install from npm (``@openai/codex``, ``@anthropic-ai/claude-code``).

What each prints for ``--version`` (measured): ``2.1.197 (Claude Code)`` and
``codex-cli 0.171.0``; ``version_pattern`` reads the version out of that.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

import attrs


@attrs.frozen
class Program:
    name: str
    package: str  # the PyPI distribution that ships it
    module: str  # the import package inside it
    relative: str  # the binary's path inside the import package
    npm: str  # its npm package
    version_pattern: re.Pattern[str]  # group 1 is the version in its ``--version`` output

    def install_hint(self) -> str:
        return (
            f"install it (`npm install -g {self.npm}`, or `pip install {self.package}` into "
            f"agentsd's environment) or point the session's `command` at it"
        )

    def upgrade_hint(self) -> str:
        return (
            f"`npm install -g {self.npm}@latest`, or `pip install -U {self.package}` into "
            f"agentsd's environment"
        )

    def parse_version(self, output: str) -> str | None:
        """The version in what ``--version`` printed, or None when it is not there."""
        for line in output.splitlines():
            match = self.version_pattern.match(line.strip())
            if match is not None:
                return match.group(1)
        return None


CODEX = Program(
    "codex",
    "openai-codex-cli-bin",
    "codex_cli_bin",
    "bin/codex",
    npm="@openai/codex",
    version_pattern=re.compile(r"codex-cli (\d+\.\d+\.\d+\S*)"),
)
CLAUDE = Program(
    "claude",
    "claude-agent-sdk",
    "claude_agent_sdk",
    "_bundled/claude",
    npm="@anthropic-ai/claude-code",
    version_pattern=re.compile(r"(\d+\.\d+\.\d+\S*) \(Claude Code\)"),
)


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
