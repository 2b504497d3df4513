"""The holder's own systemd scope: held agents outside the service's cgroup (issue 19).

Under systemd every process of ``agentsd.service``'s cgroup is killed when the
service stops or its main process dies (``KillMode=mixed``: SIGKILL to the rest
once the daemon is gone), whatever the process did to get away: a holder started
there dies with the daemon it should outlive, and its agents with it. So under
systemd, with ``Delegate=yes`` (containment ``systemd-delegated``), the daemon starts
the holder in a transient scope of its own, beside the service in the same slice,
and makes the agents' cgroups in that scope instead of under the service.

Rule 1 (one scope per state directory, always the same): the scope is named from
the state directory (``agentsd-holder-<hash>.scope``) and placed in the service's
slice, so its cgroup's path is known before it exists and is the same for every
holder of that state directory: a holder started again after one died, or the
holder a restarted daemon finds, has its agents' cgroups where the daemon's
containment root says. A new holder's scope may still be the dead one's, winding
down (systemd refuses a unit that is still loaded), or be kept loaded by what the
dead holder left in it: before a holder is started, whatever is left in its scope is
killed (`HolderScope.clear`; no holder of ours listens then), and starting is
retried for ``START_RETRY_S``.

Rule 2 (a leaf of its own): the scope is delegated (``Delegate=yes``), so it is the
user's to manage; cgroup v2 allows processes only in leaves once controllers are
enabled for children, so the holder is moved into the leaf ``holder`` of its scope
as soon as it reports its pid, before it spawns anything, and the limit controllers
are enabled for the agents' cgroups beside it.

Rule 3 (no scope, no holder): if the scope cannot be made (no ``systemd-run``, no
user manager to ask), the holder is not started inside the service's cgroup
instead: it would silently make the promise of running agents outliving the
daemon false. Spawning fails with the reason, as for any holder that cannot start.
A holder found running outside its scope (started by a daemon run by hand, on the
same state directory) is used as it is, with a warning: what it holds dies with
the service.

Rule 4 (a stop ends it): outside the service's cgroup, the holder's scope is out of
reach of systemd's own last resort at a stop (the SIGKILL when ``TimeoutStopSec=``
runs out), so the unit's ``ExecStopPost=`` (`after_stop`) does it: after a stop,
whatever is left in the scope is killed; after a crash, nothing is.

What a scope costs: one transient unit, made by ``systemd-run --user --scope`` (one
call to the user manager, about 50 ms), gone when the holder exits (``--collect``).
It ends with the user manager (logout without lingering), as the service does.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import attrs

from agentsd.cgroup import LIMIT_CONTROLLERS, CgroupRoot, Containment, own_cgroup

log = logging.getLogger(__name__)

__all__ = [
    "HOLDER_LEAF",
    "START_RETRY_S",
    "HolderScope",
    "after_stop",
    "holder_scope",
    "holder_unit",
    "is_holder_scope",
]

HOLDER_LEAF = "holder"  # Rule 2
UNIT_PREFIX = "agentsd-holder-"  # Rule 1
START_RETRY_S = 5.0  # Rule 1: a dead holder's scope winding down
SYSTEMD_RUN = "systemd-run"
SYSTEMCTL = "systemctl"
SYSTEMCTL_TIMEOUT_S = 10.0
CLEAR_POLL_S = 0.05  # systemd offers no wait for a unit's end short of D-Bus
STOP_RESULTS = ("success", "timeout")  # Rule 4: the SERVICE_RESULTs of a stop


@attrs.frozen
class HolderScope:
    """Where the holder of one state directory lives under systemd."""

    unit: str  # agentsd-holder-<hash>.scope
    slice: str  # the service's
    path: Path  # its cgroup directory: the agents' cgroups' root

    def command(self) -> list[str]:
        """What ``argv`` is run under to start it in the scope (Rule 1)."""
        return [
            SYSTEMD_RUN,
            "--user",
            "--scope",
            "--quiet",
            "--collect",
            f"--unit={self.unit}",
            f"--slice={self.slice}",
            "--property=Delegate=yes",
            "--description=agentsd holder: agents kept running across daemon restarts",
            "--",
        ]

    def place(self, holder_pid: int) -> list[str]:
        """Move the freshly started holder into its leaf and enable the limit
        controllers for the agents' cgroups (Rule 2); the controllers enabled.
        Raises OSError if the holder is not in the scope or cannot be moved."""
        where = own_cgroup(Path(f"/proc/{holder_pid}/cgroup"))
        if where != self.path:
            raise OSError(f"the holder (pid {holder_pid}) is in {where}, not in {self.path}")
        leaf = self.path / HOLDER_LEAF
        leaf.mkdir(mode=0o755, exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(holder_pid))
        return CgroupRoot(self.path).enable_controllers(LIMIT_CONTROLLERS)

    def holds(self, holder_pid: int) -> bool:
        """Whether the holder with ``holder_pid`` lives in this scope's leaf."""
        try:
            where = own_cgroup(Path(f"/proc/{holder_pid}/cgroup"))
        except OSError:
            return False
        return where == self.path / HOLDER_LEAF

    def clear(self) -> None:
        """End whatever is left in the scope and wait (within ``START_RETRY_S``) for
        its unit to go (Rule 1): run only when no holder listens, so anything there is
        a dead holder's leftover (an agent's process that left its cgroup, a straggler
        of an unfinished end) that would keep the unit loaded and every new holder
        out. Raises OSError when the user manager cannot be asked."""
        if self._state() in ("inactive", ""):
            return
        _systemctl("kill", "--signal=SIGKILL", self.unit)
        deadline = time.monotonic() + START_RETRY_S
        while self._state() not in ("inactive", "failed", "") and time.monotonic() < deadline:
            time.sleep(CLEAR_POLL_S)

    def _state(self) -> str:
        done = _systemctl("show", "--value", "--property=ActiveState", self.unit)
        if done.returncode != 0:
            raise OSError(f"systemctl --user: {done.stderr.strip() or done.returncode}")
        return done.stdout.strip()

    def containment(self) -> Containment:
        """The containment of agents held in this scope."""
        return Containment(
            mode="systemd-delegated",
            root=CgroupRoot(self.path),
            detail=f"the holder's scope {self.path}, outside the service's cgroup",
        )


def holder_scope(containment: Containment, state_dir: Path) -> HolderScope | None:
    """The holder's scope under systemd (containment ``systemd-delegated``: a
    delegated service in a slice); None elsewhere, where the holder needs none."""
    if containment.mode != "systemd-delegated" or containment.root is None:
        return None
    service = containment.root.path
    slice_dir = service.parent
    if not service.name.endswith(".service"):
        return None
    # A service of the manager's root slice sits in the manager's own cgroup.
    slice_name = slice_dir.name if slice_dir.name.endswith(".slice") else "-.slice"
    unit = holder_unit(state_dir)
    return HolderScope(unit=unit, slice=slice_name, path=slice_dir / unit)


def holder_unit(state_dir: Path) -> str:
    """The name of the holder's scope of ``state_dir`` (Rule 1)."""
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
    return f"{UNIT_PREFIX}{digest}.scope"


def is_holder_scope(name: str) -> bool:
    """Whether a cgroup directory's name is a holder's scope's (any state directory's)."""
    return name.startswith(UNIT_PREFIX) and name.endswith(".scope")


def after_stop(state_dir: Path, environ: Mapping[str, str]) -> str:
    """What the unit's ``ExecStopPost=`` does (Rule 4); a line saying what was done.
    After a stop (``SERVICE_RESULT`` ``success``, or ``timeout``: the stop outlasted
    ``TimeoutStopSec=`` and systemd SIGKILLed the service's cgroup), every process
    left in the holder's scope is SIGKILLed: the holder and whatever the daemon's
    close ladder did not end. After anything else (the daemon killed or crashed, a
    failed start) the scope is left alone: the next daemon takes its agents over."""
    result = environ.get("SERVICE_RESULT", "")
    unit = holder_unit(state_dir)
    if result not in STOP_RESULTS:
        return f"{unit} kept for the next daemon (the service's result is {result or 'unknown'})"
    done = _systemctl("kill", "--signal=SIGKILL", unit)
    if done.returncode != 0:
        return f"{unit}: nothing to end ({done.stderr.strip() or done.returncode})"
    return f"{unit}: what was left in it ended after the stop ({result})"


def _systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    """``systemctl --user ARGS``, bounded; never raises for its exit status."""
    try:
        return subprocess.run(
            [SYSTEMCTL, "--user", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=SYSTEMCTL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess([SYSTEMCTL], 1, "", str(exc))
