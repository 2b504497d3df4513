"""``agentsd_protocol`` is pure: msgspec and the standard library only. Editor plugins
and the CLI depend on it alone, so importing it must never pull in trio, attrs,
sqlite or the daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

FORBIDDEN = ("trio", "attr", "attrs", "sqlite3", "_sqlite3", "agentsd")

# Runs in a fresh interpreter: import the package and every submodule, then report
# which forbidden top-level packages ended up in sys.modules.
# Modules are found on disk, not with pkgutil, which skips namespace packages (api/).
PROBE = """
import importlib, json, pathlib, sys
import agentsd_protocol
root = pathlib.Path(agentsd_protocol.__file__).parent
names = []
for path in sorted(root.rglob("*.py")):
    parts = path.relative_to(root.parent).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    importlib.import_module(name)
    names.append(name)
forbidden = %r
loaded = sorted(
    m for m in sys.modules if m.split(".")[0] in forbidden
)
print(json.dumps({"imported": names, "loaded": loaded}))
"""


def run_probe(code: str) -> dict[str, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, list[str]] = json.loads(proc.stdout)
    return result


@pytest.fixture(scope="module")
def probe() -> dict[str, list[str]]:
    return run_probe(PROBE % (FORBIDDEN,))


def test_importing_the_protocol_package_loads_nothing_forbidden(
    probe: dict[str, list[str]],
) -> None:
    assert probe["loaded"] == []


def test_every_submodule_was_imported(probe: dict[str, list[str]]) -> None:
    imported = set(probe["imported"])
    for name in (
        "agentsd_protocol.errors",
        "agentsd_protocol.jsonrpc",
        "agentsd_protocol.framing",
        "agentsd_protocol.methods",
        "agentsd_protocol.openrpc",
        "agentsd_protocol.paths",
        "agentsd_protocol.api.base",
        "agentsd_protocol.api.daemon",
        "agentsd_protocol.api.session",
    ):
        assert name in imported


def test_the_probe_would_notice_a_forbidden_import() -> None:
    # Guards the guard: the same probe, with trio imported on purpose.
    result = run_probe("import trio\n" + PROBE % (FORBIDDEN,))
    assert "trio" in result["loaded"]
