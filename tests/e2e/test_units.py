"""The unit files and socket activation, checked with systemd's own tools.

No systemd needs to run: ``systemd-analyze verify`` loads units offline, and
``systemd-socket-activate`` passes a listening socket exactly as a socket unit does.
Both come with the Debian/Ubuntu package ``systemd``; the Makefile test needs
``make``. Without them these tests skip, except under CI, where a missing tool fails
them: CI must prove the units.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"
SOCKET_UNIT = UNITS / "agentsd.socket"
SERVICE_UNIT = UNITS / "agentsd.service"
NOTIFY_UNIT = UNITS / "agentsd-notify.service"

DAEMON_LADDER_S = 2 + 3 + 2
"""The daemon's default close ladder: stdin EOF, SIGTERM, SIGKILL."""
LEGACY_EXIT_RESTART = 75  # what `daemon restart` exited with before the restart in place


def _require_tool(name: str, package: str = "systemd") -> str:
    """The tool's path; else a skip, or a failure under CI. Call it from sync code
    (a fixture for async tests): pytest-trio loses the reason of a skip raised
    inside the trio run."""
    path = shutil.which(name)
    if path is not None:
        return path
    reason = f"{name} not found on PATH (Debian/Ubuntu package: {package})"
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{reason}; CI must install it")
    pytest.skip(f"{reason}; skipped outside CI")


def _unit_settings(path: Path) -> dict[str, dict[str, list[str]]]:
    """``{section: {key: [values in order]}}``: systemd allows repeated keys, which
    configparser does not."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: {line!r} is outside any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not key=value"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _seconds(value: str) -> float:
    """A systemd time span as written in our units: ``30``, ``30s``, ``2min``."""
    for suffix, factor in (("min", 60.0), ("ms", 0.001), ("s", 1.0)):
        if value.endswith(suffix):
            return float(value.removesuffix(suffix)) * factor
    return float(value)


# --- systemd-analyze verify ----------------------------------------------------------


@pytest.fixture
def unit_home() -> Iterator[Path]:
    """A HOME holding the units and an executable ~/.local/bin/agentsd, so verify
    resolves ``%h`` in ExecStart to a real file, as after ``make
    install-user-service``; plus the XDG_RUNTIME_DIR a user manager needs."""
    home = Path(tempfile.mkdtemp(prefix="agentsd-units-", dir="/tmp"))
    (home / "run").mkdir(mode=0o700)
    (home / ".local" / "bin").mkdir(parents=True)
    for exe in ("agentsd", "agentsctl"):
        program = home / ".local" / "bin" / exe
        program.write_text("#!/bin/sh\nexit 0\n")
        program.chmod(0o755)
    shutil.copy(SOCKET_UNIT, home)
    shutil.copy(SERVICE_UNIT, home)
    shutil.copy(NOTIFY_UNIT, home)
    yield home
    shutil.rmtree(home)


def _verify(home: Path) -> subprocess.CompletedProcess[str]:
    tool = _require_tool("systemd-analyze")
    # Hermetic: no unit from the developer's own ~/.config/systemd/user takes part.
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    env |= {"HOME": str(home), "XDG_RUNTIME_DIR": str(home / "run")}
    return subprocess.run(
        [
            tool,
            "--user",
            "--man=no",
            "verify",
            "./agentsd.socket",
            "./agentsd.service",
            "./agentsd-notify.service",
        ],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_units_pass_systemd_analyze_verify(unit_home: Path) -> None:
    result = _verify(unit_home)
    # verify exits 0 on unknown keys and only warns, so any output is a failure too.
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        ("no-executable", "is not executable"),
        ("no-agentsctl", "is not executable"),
        ("unknown-key", "Unknown key 'HardenEverything'"),
        ("unknown-notify-key", "Unknown key 'HardenEverything'"),
    ],
)
def test_verify_catches_what_it_should(unit_home: Path, breakage: str, expected: str) -> None:
    """The check above has teeth: the same setup fails for a broken install or unit."""
    if breakage == "no-executable":
        (unit_home / ".local" / "bin" / "agentsd").unlink()
    elif breakage == "no-agentsctl":
        (unit_home / ".local" / "bin" / "agentsctl").unlink()
    else:
        name = "agentsd.service" if breakage == "unknown-key" else "agentsd-notify.service"
        service = unit_home / name
        text = service.read_text(encoding="utf-8")
        service.write_text(text.replace("[Service]\n", "[Service]\nHardenEverything=yes\n"))
    result = _verify(unit_home)
    assert expected in result.stderr


# --- the contract the daemon relies on -----------------------------------------------


def test_socket_unit_contract() -> None:
    socket_unit = _unit_settings(SOCKET_UNIT)
    assert socket_unit["Socket"]["ListenStream"] == ["%t/agentsd/agentsd.sock"]
    assert socket_unit["Socket"]["SocketMode"] == ["0600"]
    assert socket_unit["Socket"]["DirectoryMode"] == ["0700"]
    # The daemon finds its listener by the default name, the unit's own.
    assert "FileDescriptorName" not in socket_unit["Socket"]
    assert socket_unit["Install"]["WantedBy"] == ["sockets.target"]


def test_service_unit_contract() -> None:
    service = _unit_settings(SERVICE_UNIT)
    unit, svc = service["Unit"], service["Service"]
    assert unit["Requires"] == ["agentsd.socket"]
    assert unit["After"] == ["agentsd.socket"]
    assert svc["Type"] == ["notify"]
    assert svc["NotifyAccess"] == ["main"]
    assert svc["ExecStart"] == ["%h/.local/bin/agentsd"]
    assert svc["Environment"] == ["PYTHONUNBUFFERED=1"]
    assert svc["WatchdogSec"] == ["30"]
    assert svc["Restart"] == ["on-failure"]
    # A reload is the restart in place (agentsd.reexec), through the CLI, which
    # never starts a daemon outside the unit.
    assert svc["ExecReload"] == ["%h/.local/bin/agentsctl --no-start daemon restart"]
    # Daemons from before it exited 75 on a restart: upgrading from one must start
    # the new code, a clean exit restarted whatever Restart= says.
    assert svc["SuccessExitStatus"] == [str(LEGACY_EXIT_RESTART)]
    assert svc["RestartForceExitStatus"] == [str(LEGACY_EXIT_RESTART)]
    assert svc["KillMode"] == ["mixed"]
    [stop] = svc["TimeoutStopSec"]
    assert _seconds(stop) > DAEMON_LADDER_S
    [nofile] = svc["LimitNOFILE"]
    assert int(nofile) >= 65536
    for option in ("NoNewPrivileges", "LockPersonality", "RestrictRealtime", "RestrictSUIDSGID"):
        assert svc[option] == ["yes"], option
    # These would change what agents can do in the user's projects (see the unit).
    for option in ("ProtectHome", "ProtectSystem", "PrivateTmp", "PrivateUsers", "UMask"):
        assert option not in svc, option


def test_notify_unit_contract() -> None:
    """The notifier runs `agentsctl notify`, wants the socket (connecting starts the
    daemon) but is not bound to the daemon: it reconnects across its restarts."""
    notify = _unit_settings(NOTIFY_UNIT)
    unit, svc = notify["Unit"], notify["Service"]
    assert unit["Wants"] == ["agentsd.socket"]
    assert "agentsd.socket" in unit["After"][0].split()
    assert "BindsTo" not in unit and "Requires" not in unit
    assert svc["ExecStart"] == ["%h/.local/bin/agentsctl notify"]
    assert svc["Restart"] == ["on-failure"]
    assert notify["Install"]["WantedBy"] == ["graphical-session.target"]


# --- make install-user-service / uninstall-user-service --------------------------------

# Stand-ins that log their calls: no user manager runs here, and the real pip step
# is the same `pip install .` that `make test` already exercises.
_FAKE_SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >> "$AGENTSD_TEST_CALLS"
case "$*" in *is-active*) exit 3 ;; esac
"""
_FAKE_LOGINCTL = """#!/bin/sh
echo "loginctl $*" >> "$AGENTSD_TEST_CALLS"
echo "Linger=$AGENTSD_TEST_LINGER"
"""
_FAKE_VENV_PYTHON = """#!/bin/sh
echo "python $*" >> "$AGENTSD_TEST_CALLS"
if [ "$1 $2" = "-m pip" ]; then
  for exe in agentsd agentsctl; do
    printf '#!/bin/sh\\nexit 0\\n' > "$(dirname "$0")/$exe"
    chmod +x "$(dirname "$0")/$exe"
  done
fi
"""


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.mark.parametrize("linger", ["no", "yes"])
def test_make_installs_and_uninstalls_the_user_service(linger: str) -> None:
    make = _require_tool("make", "make")
    home = Path(tempfile.mkdtemp(prefix="agentsd-make-", dir="/tmp"))
    try:
        fakes = home / "fakes"
        _executable(fakes / "systemctl", _FAKE_SYSTEMCTL)
        _executable(fakes / "loginctl", _FAKE_LOGINCTL)
        venv = home / ".local" / "share" / "agentsd" / "venv"
        _executable(venv / "bin" / "python", _FAKE_VENV_PYTHON)
        calls = home / "calls"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("XDG_", "MAKE")) and k != "MFLAGS"
        }
        env |= {
            "HOME": str(home),
            "USER": "tester",
            "PATH": f"{fakes}:{os.environ['PATH']}",
            "AGENTSD_TEST_CALLS": str(calls),
            "AGENTSD_TEST_LINGER": linger,
        }

        def run(target: str) -> str:
            done = subprocess.run(
                [make, "--no-print-directory", target],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            calls_text = calls.read_text() if calls.exists() else ""
            calls.unlink(missing_ok=True)
            return done.stdout + calls_text

        out = run("install-user-service")
        units = home / ".config" / "systemd" / "user"
        for unit in (SOCKET_UNIT, SERVICE_UNIT, NOTIFY_UNIT):
            assert (units / unit.name).read_bytes() == unit.read_bytes()
        for exe in ("agentsd", "agentsctl"):
            assert os.readlink(home / ".local" / "bin" / exe) == str(venv / "bin" / exe)
        assert f"python -m pip install -q --disable-pip-version-check --upgrade {REPO}" in out
        steps = [line for line in out.splitlines() if line.startswith("systemctl")]
        assert steps == [
            "systemctl --user daemon-reload",
            "systemctl --user enable --now agentsd.socket",
            "systemctl --user --quiet is-active agentsd.service",
        ]
        assert ("loginctl enable-linger tester" in out) == (linger == "no")

        if shutil.which("systemd-analyze") is not None:
            # What make installed is what systemd would load: %h/.local/bin/agentsd
            # resolves through the link into the virtualenv.
            (home / "run").mkdir(mode=0o700)
            verify = subprocess.run(
                [
                    "systemd-analyze",
                    "--user",
                    "--man=no",
                    "verify",
                    str(units / "agentsd.socket"),
                    str(units / "agentsd.service"),
                    str(units / "agentsd-notify.service"),
                ],
                env={**env, "XDG_RUNTIME_DIR": str(home / "run")},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert (verify.returncode, verify.stderr) == (0, "")

        state = home / ".local" / "state" / "agentsd"
        state.mkdir(parents=True)
        (state / "agentsd.db").write_bytes(b"precious")
        out = run("uninstall-user-service")
        assert "systemctl --user disable --now agentsd-notify.service" in out
        assert "systemctl --user disable --now agentsd.socket agentsd.service" in out
        assert not (units / "agentsd-notify.service").exists()
        assert not (units / "agentsd.socket").exists()
        assert not (units / "agentsd.service").exists()
        assert not (home / ".local" / "bin" / "agentsd").is_symlink()
        assert not venv.exists()
        assert (state / "agentsd.db").read_bytes() == b"precious"
        assert f"kept in {state}" in out
    finally:
        shutil.rmtree(home)


# --- socket activation with the real tool --------------------------------------------

# The activated program: what the daemon will do at start, reported over the very
# connection that triggered the activation.
_ACTIVATED = r"""
import json, os
from agentsd.systemd import listen_fds

got = listen_fds()
report = {
    "env_left": sorted(k for k in os.environ if k.startswith("LISTEN_")),
    "sockets": [
        {"fd": s.fd, "name": s.name, "sockname": s.sock.getsockname(),
         "inheritable": s.sock.get_inheritable()}
        for s in got
    ],
}
conn, _ = got[0].sock.accept()
conn.sendall(json.dumps(report).encode())
conn.close()
"""


@pytest.fixture
def socket_activate() -> str:
    return _require_tool("systemd-socket-activate")


async def test_socket_activation_hands_over_the_named_listener(socket_activate: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="agentsd-act-", dir="/tmp"))
    sock_path = workdir / "agentsd.sock"
    command = [
        socket_activate,
        f"--listen={sock_path}",
        "--fdname=agentsd.socket",
        sys.executable,
        "-c",
        _ACTIVATED,
    ]
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                # run_process reaps the tool (and kills it if this test fails).
                proc: trio.Process = await nursery.start(
                    partial(trio.run_process, command, stderr=subprocess.PIPE, check=False)
                )
                assert proc.stderr is not None
                # The tool says when it listens; connecting is what starts the child.
                said = b""
                while b"Listening on" not in said:
                    chunk = await proc.stderr.receive_some()
                    assert chunk, f"systemd-socket-activate exited early: {said!r}"
                    said += chunk
                received = b""
                async with await trio.open_unix_socket(str(sock_path)) as stream:
                    while chunk := await stream.receive_some():
                        received += chunk
                # Drain stderr to EOF, so the tool can never block on a full pipe.
                while chunk := await proc.stderr.receive_some():
                    said += chunk
                assert await proc.wait() == 0, said.decode(errors="replace")
    finally:
        shutil.rmtree(workdir)
    assert json.loads(received) == {
        "env_left": [],
        "sockets": [
            {
                "fd": 3,
                "name": "agentsd.socket",
                "sockname": str(sock_path),
                "inheritable": False,
            }
        ],
    }
