"""A cgroup v2 directory per agent child: what nothing escapes (DESIGN.md invariant 10).

Where the daemon finds a writable cgroup v2 subtree (`select_containment`), every
child it spawns runs in a cgroup of its own, ``agent-<spawn token>`` under that root,
joined before the agent's first instruction (``agentsd.child`` Rule 7): a process of the agent that double
forks, calls ``setsid()`` and clears its environment is still in it. Elsewhere the
process group and the spawn token of invariant 5 are the fallback.

Rule 1: a cgroup is named by its child's spawn token, which the lease records, so a
daemon starting up knows whose each one is; every ``agent-*`` cgroup under the root
at start-up is a previous daemon's, and recovery kills and removes it.

Rule 2: ending is ``cgroup.kill`` (SIGKILL to every member, atomically, including
those forking at that moment); proof is ``populated 0`` in ``cgroup.events``, waited
for through inotify (``agentsd.cgroup_events``), never by polling; the cgroup is
removed after.

Rule 3: nothing here blocks the trio thread on a slow file system for long: cgroupfs
is in memory, and every wait is bounded by its caller.

Rule 4: an emptied cgroup may have held the daemon's own children (the fork
server clones agents with ``CLONE_PARENT``), which are zombies until reaped, and a
zombie is no longer in ``cgroup.procs``: `own_children_in` finds them by
``/proc`` (the parent and the cgroup a zombie still names), `reap_child` reaps
one through a pidfd. `end_cgroups` does so, when asked, before it removes a
cgroup.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import attrs
import trio

from agentsd.cgroup_events import wait_until_changed
from agentsd.config import Limits

__all__ = [
    "CGROUP_PREFIX",
    "FALLBACK",
    "LIMIT_CONTROLLERS",
    "CgroupRoot",
    "Containment",
    "ContainmentError",
    "SessionCgroup",
    "end_cgroups",
    "own_cgroup",
    "own_children_in",
    "reap_child",
    "select_containment",
    "with_controllers",
]

CGROUP_PREFIX = "agent-"  # a session cgroup is agent-<spawn token>
CPU_PERIOD_US = 100_000  # cpu.max's default period: the quota is per 100 ms
DAEMON_LEAF = "daemon"  # under systemd, the leaf the daemon moves itself into
CGROUP2_MOUNTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")  # pure v2, hybrid
CGROUP2_SUPER_MAGIC = 0x63677270  # statfs f_type of a cgroup v2 mount
# The controllers of limits and figures, enabled for session cgroups where the root
# has them (``select_containment``): memory.max/current/peak, pids.max, cpu.max.
LIMIT_CONTROLLERS = ("memory", "pids", "cpu")


ContainmentMode = Literal["cgroup-root", "systemd-delegated", "process-group"]


class ContainmentError(Exception):
    """A configured cgroup root cannot be used; the message says which and why."""


@attrs.frozen
class SessionCgroup:
    """One agent child's cgroup directory."""

    path: Path

    def populated(self) -> bool:
        """Whether any process (in it or below) still lives; a removed cgroup is empty."""
        try:
            text = (self.path / "cgroup.events").read_text()
        except FileNotFoundError:
            return False
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "populated":
                return value.strip() != "0"
        raise OSError(errno.EINVAL, f"no 'populated' line in {self.path}/cgroup.events")

    def members(self) -> list[int]:
        """The pids in it now (a snapshot: for counts, never to signal)."""
        try:
            text = (self.path / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(word) for word in text.split()]

    def kill(self) -> None:
        """SIGKILL every process in it (``cgroup.kill``); nothing if it is gone."""
        try:
            (self.path / "cgroup.kill").write_text("1")
        except FileNotFoundError:
            return

    def remove(self) -> None:
        """Remove the (empty) directory; nothing if it is gone already."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return

    async def wait_empty(self) -> None:
        """Return once nothing lives in it. Waits on inotify, not by polling; the
        caller bounds it. Raises OSError if ``cgroup.events`` cannot be watched.
        An empty one is not watched at all: an inotify watch costs more than the
        read, and a close-all of hundreds asks after each one's reap."""
        if not self.populated():
            return
        await wait_until_changed(self.path / "cgroup.events", lambda: not self.populated())

    def apply(self, limits: Limits) -> None:
        """Write ``limits`` to its controller files (before anything runs in it).
        Raises OSError if a controller is not enabled for it."""
        if limits.memory_max_bytes is not None:
            (self.path / "memory.max").write_text(str(limits.memory_max_bytes))
        if limits.pids_max is not None:
            (self.path / "pids.max").write_text(str(limits.pids_max))
        if limits.cpu_max is not None:
            quota = max(1000, round(limits.cpu_max * CPU_PERIOD_US))
            (self.path / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")

    def oom_kills(self) -> int | None:
        """How many of its processes the OOM killer killed (``memory.events``
        ``oom_kill``); None without the memory controller or once it is gone."""
        try:
            return _keyed(self.path / "memory.events").get("oom_kill")
        except FileNotFoundError:
            return None

    def figures(self) -> CgroupFigures | None:
        """What it uses now, from its own files; None if it is gone."""
        try:
            cpu = _keyed(self.path / "cpu.stat").get("usage_usec")
            processes = len(self.members())
            return CgroupFigures(
                cpu_us=cpu,
                processes=processes,
                memory_bytes=_number(self.path / "memory.current"),
                memory_peak_bytes=_number(self.path / "memory.peak"),
            )
        except FileNotFoundError:
            return None


@attrs.frozen
class CgroupFigures:
    cpu_us: int | None
    processes: int
    memory_bytes: int | None  # None: no memory controller for this cgroup
    memory_peak_bytes: int | None


def _keyed(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        out[key] = int(value)
    return out


def _number(path: Path) -> int | None:
    """A one-number file of a controller that may not be enabled."""
    try:
        return int(path.read_text())
    except FileNotFoundError:
        return None


@attrs.frozen
class CgroupRoot:
    """The writable cgroup v2 directory under which session cgroups are made."""

    path: Path

    def enable_controllers(self, names: Sequence[str]) -> list[str]:
        """Enable for its session cgroups those of ``names`` it has (its
        ``cgroup.controllers``: what its parent gave it, or what systemd delegated)
        and that are not enabled yet; the ones enabled in the end. Raises OSError if
        the kernel refuses (the root holds processes of its own: cgroup v2 allows
        controllers only over cgroups without)."""
        available = (self.path / "cgroup.controllers").read_text().split()
        control = self.path / "cgroup.subtree_control"
        enabled = control.read_text().split()
        wanted = [name for name in names if name in available and name not in enabled]
        if wanted:
            control.write_text(" ".join(f"+{name}" for name in wanted))
        return [name for name in control.read_text().split() if name in names]

    def missing_controllers(self, limits: Limits) -> list[str]:
        """The controllers ``limits`` need that its session cgroups do not have."""
        wanted = limits.controllers()
        if not wanted:
            return []
        enabled = (self.path / "cgroup.subtree_control").read_text().split()
        return [name for name in wanted if name not in enabled]

    def for_token(self, token: str) -> SessionCgroup:
        return SessionCgroup(self.path / f"{CGROUP_PREFIX}{token}")

    def create(self, token: str) -> SessionCgroup:
        """A new, empty cgroup for the child spawned with ``token``. Raises OSError."""
        cgroup = self.for_token(token)
        cgroup.path.mkdir(mode=0o755)
        return cgroup

    def existing(self) -> list[SessionCgroup]:
        """Every session cgroup under the root now (Rule 1)."""
        try:
            entries = list(self.path.iterdir())
        except FileNotFoundError:
            return []
        return [
            SessionCgroup(entry)
            for entry in entries
            if entry.name.startswith(CGROUP_PREFIX) and entry.is_dir()
        ]


@attrs.frozen
class Containment:
    """How agents are contained: ``root`` is None in the fallback mode."""

    mode: ContainmentMode
    root: CgroupRoot | None
    detail: str


FALLBACK = Containment(
    mode="process-group", root=None, detail="no cgroup root: process group and spawn token"
)


def select_containment(
    configured_root: str | None,
    environ: Mapping[str, str],
    *,
    self_cgroup: Path = Path("/proc/self/cgroup"),
) -> Containment:
    """Choose the containment mode, in this order:

    1. a configured ``cgroup_root``: it must be a writable cgroup v2 directory with
       ``cgroup.kill`` (Linux 5.14); otherwise `ContainmentError`, never a silent
       fallback from what the user asked for;
    2. under systemd (``INVOCATION_ID`` set, in a ``*.service`` cgroup of the v2
       hierarchy) with a delegated subtree (``Delegate=yes``:
       the service's own cgroup is writable): the daemon moves itself into a leaf
       ``daemon`` of it (cgroup v2 allows processes only in leaves once a cgroup
       has children) and makes session cgroups beside that leaf;
    3. otherwise the process group and spawn token (``process-group``).
    """
    if configured_root is not None:
        root = Path(configured_root)
        problem = _unusable(root)
        if problem is not None:
            raise ContainmentError(f"cgroup_root = {configured_root!r}: {problem}")
        return with_controllers(
            Containment(mode="cgroup-root", root=CgroupRoot(root), detail=f"configured {root}")
        )
    if "INVOCATION_ID" not in environ:
        return FALLBACK
    own = own_cgroup(self_cgroup)
    if own is not None and own.name == DAEMON_LEAF and own.parent.name.endswith(".service"):
        # Moved there by an earlier image of this process: a restart in place
        # (agentsd.reexec) keeps the process, and with it its cgroup.
        own = own.parent
    if own is None or not own.name.endswith(".service"):
        # Only a service's own cgroup is moved into a leaf, never one we were merely
        # started in (a terminal's scope, a test runner's).
        return attrs.evolve(FALLBACK, detail="under systemd, but not in a cgroup v2 service")
    problem = _unusable(own)
    if problem is not None:
        return attrs.evolve(
            FALLBACK, detail=f"under systemd, but {own} is not delegated ({problem})"
        )
    leaf = own / DAEMON_LEAF
    leaf.mkdir(mode=0o755, exist_ok=True)
    (leaf / "cgroup.procs").write_text("0")
    return with_controllers(
        Containment(
            mode="systemd-delegated", root=CgroupRoot(own), detail=f"delegated subtree {own}"
        )
    )


def with_controllers(containment: Containment) -> Containment:
    """``containment`` with the `LIMIT_CONTROLLERS` its root has enabled for session
    cgroups (so limits can be applied and memory reported), named in its detail; a
    refusal is noted there too, never fatal: limits then fail at create."""
    assert containment.root is not None
    try:
        enabled = containment.root.enable_controllers(LIMIT_CONTROLLERS)
    except OSError as exc:
        note = f"limit controllers not enabled: {exc.strerror or exc}"
    else:
        note = f"limit controllers: {' '.join(enabled) if enabled else 'none available'}"
    return attrs.evolve(containment, detail=f"{containment.detail}; {note}")


def own_cgroup(self_cgroup: Path) -> Path | None:
    """The cgroup v2 directory ``self_cgroup`` (a ``/proc/PID/cgroup``) names, if a
    v2 hierarchy is mounted where we look. Raises OSError if it cannot be read."""
    for line in self_cgroup.read_text().splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            for mount in CGROUP2_MOUNTS:
                candidate = Path(mount + relative)
                if (Path(mount) / "cgroup.controllers").exists() and candidate.is_dir():
                    return candidate
    return None


def _unusable(path: Path) -> str | None:
    """Why session cgroups cannot be made under ``path``, or None. Probes by making
    (and removing) one: the root of a hierarchy has no ``cgroup.kill`` of its own,
    its children do on Linux 5.14 and later."""
    if not (path / "cgroup.procs").exists() or not (path / "cgroup.controllers").exists():
        return "not a cgroup v2 directory"
    probe = path / f"{CGROUP_PREFIX}probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as exc:
        return f"cannot make a cgroup in it: {exc.strerror}"
    try:
        if not (probe / "cgroup.kill").exists():
            return "no cgroup.kill (Linux 5.14 or later is needed)"
        if not os.access(probe / "cgroup.procs", os.W_OK):
            return "its cgroups are not writable by the daemon"
    finally:
        probe.rmdir()
    return None


async def end_cgroups(
    cgroups: list[SessionCgroup], wait_s: float, *, reap_children: bool = False
) -> dict[Path, bool | None]:
    """Kill every process in ``cgroups`` (all together), wait up to ``wait_s`` for
    each to be empty, and remove the empty ones. Per path: True if something ran and
    all of it is gone, False if nothing ran, None if something may still run.
    ``reap_children``: reap this process's children that were in an emptied one
    first (Rule 4), for callers whose children there nothing else waits for (a
    `trio.Process` that does would lose its exit status). Shielded and bounded;
    never raises."""
    found: dict[Path, bool | None] = {}
    with trio.CancelScope(shield=True):
        for cgroup in cgroups:
            try:
                found[cgroup.path] = cgroup.populated()
                if found[cgroup.path]:
                    cgroup.kill()
            except OSError:
                found[cgroup.path] = None
        with trio.move_on_after(wait_s):
            for cgroup in cgroups:
                if found[cgroup.path] is not None:
                    try:
                        await cgroup.wait_empty()
                    except OSError:
                        found[cgroup.path] = None
        emptied = [c for c in cgroups if found[c.path] and not _populated_or_true(c)]
        if reap_children and emptied:  # Rule 4: no zombie of ours outlives its cgroup
            try:
                children = await trio.to_thread.run_sync(own_children_in, emptied)
                with trio.move_on_after(wait_s):
                    for pid in children:
                        await trio.to_thread.run_sync(reap_child, pid, abandon_on_cancel=True)
            except OSError:
                pass
        for cgroup in cgroups:
            try:
                if found[cgroup.path] is not None and not cgroup.populated():
                    cgroup.remove()
                    continue
            except OSError:
                pass
            found[cgroup.path] = None
    return found


def own_children_in(cgroups: Sequence[SessionCgroup]) -> dict[int, Path]:
    """This process's children, exited or not, that are or were in one of
    ``cgroups`` (Rule 4): each one's cgroup path. One ``/proc`` scan. Blocking."""
    by_name = {cgroup.path.name: cgroup.path for cgroup in cgroups}
    if not by_name:
        return {}
    me = os.getpid()
    found: dict[int, Path] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                ppid = int(f.read().rpartition(b")")[2].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{entry.name}/cgroup") as f:
                lines = f.read().splitlines()
        except (OSError, ValueError, IndexError):
            continue
        for line in lines:
            if line.startswith("0::"):
                path = by_name.get(line.rpartition("/")[2])
                if path is not None:
                    found[int(entry.name)] = path
    return found


def reap_child(pid: int) -> int | None:
    """Reap this process's exited child ``pid`` through a pidfd (that process, never
    one that reused its pid); its returncode (negative: the signal), None if it was
    not ours to reap. Blocks until it exited: for a child whose cgroup is empty."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    try:
        result = os.waitid(os.P_PIDFD, fd, os.WEXITED)
    except ChildProcessError:
        return None
    finally:
        os.close(fd)
    if result is None:
        return None
    return result.si_status if result.si_code == os.CLD_EXITED else -result.si_status


def _populated_or_true(cgroup: SessionCgroup) -> bool:
    try:
        return cgroup.populated()
    except OSError:
        return True
