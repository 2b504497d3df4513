"""The agent CLI releases the peer tests run against: ``tests/agents/package.json``.

``make test`` installs them with ``npm ci`` (pinned by the lockfile), each under an
npm alias (``claude-code-2.1.197``, ``codex-0.171.0``, ...). The binaries run are
the native ones in each release's platform package, never the node wrappers: the
Codex wrapper stays alive as a node parent on Node < 22.15, and the Claude one is a
placeholder until its postinstall ran. npm puts one copy of each platform package
at the top of ``node_modules`` and the others under their alias, so a release is
looked up the way Node resolves it (its alias's ``node_modules`` first) and its
version checked against the platform package's ``package.json``.

Under ``CI=true`` a listed release that is not installed fails its tests (the CI
policy: a missing tool never skips); elsewhere it skips them.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import attrs
import pytest

AGENTS_DIR = Path(__file__).resolve().parent.parent / "agents"
NODE_MODULES = AGENTS_DIR / "node_modules"

_ARCH = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
_TRIPLE = {"x64": "x86_64-unknown-linux-musl", "arm64": "aarch64-unknown-linux-musl"}.get(_ARCH)
# Per provider: the npm package, its platform package, and the binary inside that.
_LAYOUT = {
    "claude": ("@anthropic-ai/claude-code", f"@anthropic-ai/claude-code-linux-{_ARCH}", "claude"),
    "codex": ("@openai/codex", f"@openai/codex-linux-{_ARCH}", f"vendor/{_TRIPLE}/bin/codex"),
}


@attrs.frozen
class Release:
    provider: str  # "claude" or "codex"
    version: str
    alias: str  # its name in package.json
    newest: bool  # the newest listed for its provider

    @property
    def id(self) -> str:
        return f"{self.provider}-{self.version}"

    def binary(self) -> Path | None:
        """The installed native binary, or None (not installed, another platform)."""
        _, platform_package, relative = _LAYOUT[self.provider]
        for root in (NODE_MODULES / self.alias / "node_modules", NODE_MODULES):
            package_dir = root / platform_package
            try:
                manifest = json.loads((package_dir / "package.json").read_text())
            except (OSError, ValueError):
                continue
            # Codex's platform packages are versioned like "0.171.0-linux-x64".
            if str(manifest.get("version", "")).split("-linux")[0] != self.version:
                continue
            candidate = package_dir / relative
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        return None

    def command(self) -> list[str]:
        """``agentSession.create``'s ``command`` that runs this release. Skips the test
        (fails it under ``CI=true``) when the release is not installed."""
        binary = self.binary()
        if binary is None:
            why = f"{self.id} is not installed under {NODE_MODULES} (`make test` installs it)"
            if os.environ.get("CI") == "true":
                pytest.fail(why)
            pytest.skip(why)
        return [str(binary)] if self.provider == "claude" else [str(binary), "app-server"]


def _numeric(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def listed() -> list[Release]:
    """Every release in ``package.json``, newest first per provider."""
    manifest = json.loads((AGENTS_DIR / "package.json").read_text())
    found: list[tuple[str, str, str]] = []
    for alias, spec in manifest["dependencies"].items():
        for provider, (package, _, _) in _LAYOUT.items():
            prefix = f"npm:{package}@"
            if spec.startswith(prefix):
                found.append((provider, spec.removeprefix(prefix), alias))
    found.sort(key=lambda r: (r[0], _numeric(r[1])), reverse=True)
    newest = {
        provider: max(_numeric(v) for p, v, _ in found if p == provider) for provider, *_ in found
    }
    return [
        Release(provider, version, alias, newest=_numeric(version) == newest[provider])
        for provider, version, alias in found
    ]


RELEASES = listed()
CLAUDE_RELEASES = [r for r in RELEASES if r.provider == "claude"]
CODEX_RELEASES = [r for r in RELEASES if r.provider == "codex"]
