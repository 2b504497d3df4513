"""A real systemd user manager for a test, private to it and removed afterwards.

``systemd --user`` (Debian's ``systemd`` package, installed by ``.ci/run``) runs
here as a process of the test, not as PID 1, in three fences of its own:

- a cgroup of its own under the writable cgroup v2 directory (``tests.cgroup_root``)
  and, on a hybrid layout, the same in the ``name=systemd`` hierarchy: a user
  manager takes the cgroup it starts in as its root and moves every process of it
  into its ``init.scope``, so started at the root it would take the machine's;
- a mount namespace of its own (``unshare -m``, private propagation) with a tmpfs
  on ``/run/systemd`` holding ``/run/systemd/system``: the mark of a machine booted
  with systemd, which the manager refuses to run without;
- a home, ``XDG_RUNTIME_DIR`` and ``XDG_CONFIG_HOME`` of its own: its units, its
  private socket (which ``systemctl --user`` and ``systemd-run --user`` talk to
  with no D-Bus daemon), and ``%h`` in unit files.

On exit it is asked to exit, then whatever is left in its cgroup is killed, and
the cgroups are removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import attrs

from tests.cgroup_root import PARENT
from tests.cgroup_root import unavailable as cgroup_unavailable

SYSTEMD = Path("/lib/systemd/systemd")
NAMED_SYSTEMD = Path("/sys/fs/cgroup/systemd")  # the v1 name=systemd hierarchy (hybrid)
START_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 10.0
POLL_S = 0.05

# Run by ``sh`` inside the new mount namespace, then replaced by the manager.
_START = """set -e
for dir in "$@"; do echo $$ > "$dir/cgroup.procs"; done
mkdir -p /run/systemd
mount -t tmpfs -o mode=0755 agentsd-test /run/systemd
mkdir /run/systemd/system
exec {systemd} --user
"""


def unavailable() -> str | None:
    """Why no user manager can run here, or None."""
    if not SYSTEMD.exists():
        return f"no {SYSTEMD} (Debian package systemd)"
    for tool in ("unshare", "systemctl", "systemd-run"):
        if shutil.which(tool) is None:
            return f"no {tool}"
    if os.geteuid() != 0:
        return "a private mount namespace needs root here"
    return cgroup_unavailable()


@attrs.frozen
class UserManager:
    home: Path
    env: Mapping[str, str]  # what systemctl, the daemon's clients and the manager see
    cgroup: Path  # its root cgroup (v2)
    process: subprocess.Popen[bytes]

    @property
    def runtime_dir(self) -> Path:
        return Path(self.env["XDG_RUNTIME_DIR"])

    @property
    def unit_dir(self) -> Path:
        return Path(self.env["XDG_CONFIG_HOME"]) / "systemd" / "user"

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["systemctl", "--user", *args],
            env=dict(self.env),
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    def show(self, unit: str, prop: str) -> str:
        return self.systemctl("show", "--value", f"--property={prop}", unit).stdout.strip()

    def wait_for(
        self, what: str, predicate: Callable[[], bool], timeout_s: float = START_TIMEOUT_S
    ) -> None:
        """Poll ``predicate`` until true: a synchronous fixture's bounded poll of a
        manager that offers no event to wait on from here."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(POLL_S)


@contextlib.contextmanager
def user_manager(home: Path) -> Iterator[UserManager]:
    """A running user manager with ``home`` as its ``%h``; see the module docstring."""
    why = unavailable()
    if why is not None:
        raise RuntimeError(f"no systemd user manager here: {why}")
    name = f"agentsd-test-sd-{os.urandom(6).hex()}"
    cgroups = [PARENT / name]
    if (NAMED_SYSTEMD / "cgroup.procs").exists():
        cgroups.append(NAMED_SYSTEMD / name)
    runtime = home / "run"
    runtime.mkdir(mode=0o700)
    env = {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "XDG_RUNTIME_DIR": str(runtime),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
    }
    made: list[Path] = []
    process: subprocess.Popen[bytes] | None = None
    with open(home / "systemd.log", "wb") as log:
        try:
            for cgroup in cgroups:
                cgroup.mkdir()
                made.append(cgroup)
            process = subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--propagation=private",
                    "sh",
                    "-c",
                    _START.format(systemd=SYSTEMD),
                    "sh",
                    *map(str, cgroups),
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            manager = UserManager(home=home, env=env, cgroup=cgroups[0], process=process)
            running = process  # for the closure: started, never None
            manager.wait_for(
                "the user manager",
                lambda: (
                    running.poll() is None
                    and manager.systemctl(
                        "show", "--value", "--property=SystemState", check=False
                    ).stdout.strip()
                    in ("running", "degraded")
                ),
            )
            yield manager
        finally:
            if process is not None:
                _exit(env, process)
            _remove_tree(made)


def _exit(env: Mapping[str, str], process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        subprocess.run(
            ["systemctl", "--user", "exit"], env=dict(env), capture_output=True, timeout=60
        )
    try:
        process.wait(EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _remove_tree(cgroups: list[Path]) -> None:
    """Kill whatever is left in the manager's cgroups, then remove them, deepest first."""
    for top in cgroups:
        kill = top / "cgroup.kill"
        if kill.exists():
            kill.write_text("1")
        else:  # v1: signal each process left
            for pid in (top / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while _populated(top) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        # A cgroup still busy is left (and named), not raised over the test's outcome.
        for path in [*sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True), top]:
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                print(f"tests.systemd_user: {path} left: {exc}")


def _populated(top: Path) -> bool:
    events = top / "cgroup.events"
    if events.exists():
        return "populated 1" in events.read_text()
    return any(
        (p / "cgroup.procs").read_text().strip() for p in [top, *top.rglob("*")] if p.is_dir()
    )
