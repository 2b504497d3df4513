"""agentsd.cgroup and the cgroup mode of agentsd.child (DESIGN.md invariant 10):
mode selection, joining before the first instruction, cgroup.kill and the proof
of exit by ``populated 0``. Every cgroup made here is removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from agentsd.cgroup import CgroupRoot, ContainmentError, end_cgroups, select_containment
from agentsd.child import ChildExit, ChildSpec, ExitProof, new_spawn_token, open_child
from agentsd.config import ConfigError, Ladder, Limits, load_config
from agentsd.leftovers import ChildIdentity
from agentsd.procfs import is_same_process, read_start_time
from tests.cgroup_root import cgroup_root, unavailable

needs_cgroup = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))

# The child ignores EOF and SIGTERM: short graces reach cgroup.kill soon.
QUICK = Ladder(eof_grace_s=0.2, term_grace_s=0.2, kill_wait_s=5.0)
# Prints its cgroup as its first act, then leaves a double-forked, setsid()
# process with an empty environment behind, and ignores stdin EOF and SIGTERM.
ESCAPING = (
    "import os, signal, sys\n"
    "sys.stdout.write(open('/proc/self/cgroup').read().splitlines()[-1] + '\\n')\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        os.execve('/bin/sleep', ['sleep', '100000'], {})\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "sys.stdout.write('forked\\n'); sys.stdout.flush()\n"
    "while True: signal.pause()\n"
)


@pytest.fixture
def root() -> Iterator[Path]:
    if unavailable() is not None:
        pytest.skip(str(unavailable()))
    with cgroup_root() as path:
        yield path


def test_no_root_and_no_systemd_is_the_process_group_fallback() -> None:
    containment = select_containment(None, {})
    assert containment.mode == "process-group"
    assert containment.root is None


def test_a_configured_root_that_is_no_cgroup_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ContainmentError, match="not a cgroup v2 directory"):
        select_containment(str(tmp_path), {})


def test_systemd_outside_a_service_cgroup_falls_back(tmp_path: Path) -> None:
    """Under systemd, only a ``*.service`` cgroup is taken over (never, say, the
    scope of the terminal that ran the daemon)."""
    self_cgroup = tmp_path / "cgroup"
    self_cgroup.write_text("0::/user.slice/session-1.scope\n")
    containment = select_containment(None, {"INVOCATION_ID": "x"}, self_cgroup=self_cgroup)
    assert containment.mode == "process-group"
    assert "not in a cgroup v2 service" in containment.detail


@needs_cgroup
def test_a_configured_cgroup_root_is_used(root: Path) -> None:
    containment = select_containment(str(root), {})
    assert containment.mode == "cgroup-root"
    assert containment.root == CgroupRoot(root)
    assert CgroupRoot(root).existing() == []  # the probe was removed


@needs_cgroup
async def test_nothing_escapes_the_session_cgroup_of_a_child(root: Path) -> None:
    """The child is in its cgroup at its first instruction; a setsid() grandchild
    with an empty environment does not escape the ladder, whose proof is the reap
    plus an empty cgroup; the cgroup is removed after."""
    outcomes: list[ChildExit] = []
    token = new_spawn_token()
    spec = ChildSpec(
        argv=[sys.executable, "-c", ESCAPING],
        cwd="/",
        env={},
        token=token,
        cgroup_root=CgroupRoot(root),
        base_env=dict(os.environ),
    )
    cgroup = CgroupRoot(root).for_token(token)

    async def spawned(identity: ChildIdentity) -> None:
        return None

    with trio.fail_after(30):
        async with open_child(spec, QUICK, spawned, outcomes.append) as child:
            first = b""
            while first.count(b"\n") < 2:
                first += await child.stdout.receive_some(4096)
            assert first.decode().splitlines()[0] == f"0::/{root.name}/agent-{token}"
            procs = [(pid, read_start_time(pid)) for pid in cgroup.members()]
            assert len(procs) == 2  # the child and its escaped great-grandchild
    [outcome] = outcomes
    assert isinstance(outcome, ExitProof)
    assert outcome.cgroup_empty and outcome.signal == 9 and outcome.stragglers_killed == 1
    assert not any(start is not None and is_same_process(pid, start) for pid, start in procs)
    assert not cgroup.path.exists()


@needs_cgroup
async def test_a_missing_agent_is_not_found_at_the_spawn(root: Path) -> None:
    """Through the joining shell, a missing program still fails the spawn as it
    does without a cgroup, and leaves no cgroup behind."""
    spec = ChildSpec(
        argv=["no-such-agent-program"],
        cwd="/",
        env={"PATH": "/nonexistent"},
        token=new_spawn_token(),
        cgroup_root=CgroupRoot(root),
    )
    outcomes: list[ChildExit] = []
    with pytest.raises(FileNotFoundError):
        async with open_child(spec, QUICK, _never_spawned, outcomes.append):
            pytest.fail("the body ran")
    assert outcomes == []
    assert CgroupRoot(root).existing() == []


async def _never_spawned(identity: ChildIdentity) -> None:
    raise AssertionError(f"spawned {identity}")


@needs_cgroup
async def test_end_cgroups_kills_and_removes_what_a_previous_daemon_left(root: Path) -> None:
    cgroups = CgroupRoot(root)
    full = cgroups.create("full")
    empty = cgroups.create("empty")
    sleeper = await trio.lowlevel.open_process(
        ["/bin/sleep", "100000"],
        preexec_fn=lambda: (full.path / "cgroup.procs").write_text("0"),
    )
    with trio.fail_after(10):
        found = await end_cgroups([full, empty], 5.0)
        assert await sleeper.wait() == -9
    assert found == {full.path: True, empty.path: False}
    assert cgroups.existing() == []


# Forks up to 200 sleeping children (bounded even if no limit held) and prints how
# many forks succeeded before the first refusal.
FORK_BOMB = (
    "import os, time\n"
    "made = 0\n"
    "for _ in range(200):\n"
    "    try:\n"
    "        pid = os.fork()\n"
    "    except BlockingIOError:\n"
    "        break\n"
    "    if pid == 0:\n"
    "        time.sleep(1000)\n"
    "        os._exit(0)\n"
    "    made += 1\n"
    "print(made, flush=True)\n"
    "time.sleep(1000)\n"
)
PIDS_MAX = 16


def _pids_unavailable(root: Path) -> str | None:
    if "pids" not in (root.parent / "cgroup.subtree_control").read_text().split():
        return f"the pids controller is not enabled in {root.parent} (hybrid layout: bound to v1)"
    return None


@pytest.fixture
def pids_root(root: Path) -> Path:
    """A test root whose session cgroups have the pids controller."""
    reason = _pids_unavailable(root)
    if reason is not None:
        pytest.skip(reason)
    (root / "cgroup.subtree_control").write_text("+pids")
    return root


@needs_cgroup
async def test_a_fork_bomb_is_contained_by_pids_max(pids_root: Path) -> None:
    root = pids_root
    outcomes: list[ChildExit] = []
    spec = ChildSpec(
        argv=[sys.executable, "-c", FORK_BOMB],
        cwd="/",
        env={},
        token=new_spawn_token(),
        cgroup_root=CgroupRoot(root),
        limits=Limits(pids_max=PIDS_MAX),
        base_env=dict(os.environ),
    )
    with trio.fail_after(30):
        async with open_child(spec, QUICK, _ignore_spawn, outcomes.append) as child:
            made = int((await child.stdout.receive_some(64)).decode())
    assert made < PIDS_MAX  # the bomb itself counts
    [outcome] = outcomes
    assert isinstance(outcome, ExitProof) and outcome.cgroup_empty


async def _ignore_spawn(identity: ChildIdentity) -> None:
    return None


def test_a_limit_out_of_range_is_refused_with_its_key(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[limits]\npids_max = 0\n")
    with pytest.raises(ConfigError, match=r"limits\.pids_max = 0: must be at least 1"):
        load_config(path, required=True)
    path.write_text("[limits]\ncpu_max = 1.5\nmemory_max_bytes = 1073741824\n")
    limits = load_config(path, required=True).limits
    assert limits.controllers() == ["memory", "cpu"]


# Runs in a process started inside a fake service cgroup: selects the mode as a
# daemon under systemd would, then prints the mode, the root and its own cgroup.
UNDER_SYSTEMD = (
    "import json\n"
    "from agentsd.cgroup import select_containment\n"
    "found = select_containment(None, {'INVOCATION_ID': 'x'})\n"
    "print(json.dumps([found.mode, str(found.root.path if found.root else None),\n"
    "                  open('/proc/self/cgroup').read().splitlines()[-1]]))\n"
)


@needs_cgroup
def test_under_systemd_the_daemon_moves_into_a_leaf_of_its_delegated_service(root: Path) -> None:
    service = root / "agentsd-test.service"
    service.mkdir()
    try:
        done = subprocess.run(
            [sys.executable, "-c", UNDER_SYSTEMD],
            preexec_fn=lambda: (service / "cgroup.procs").write_text("0"),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        mode, found_root, own = json.loads(done.stdout)
        assert mode == "systemd-delegated"
        assert found_root == str(service)
        assert own == f"0::/{root.name}/{service.name}/daemon"
    finally:
        for leaf in (service / "daemon", service):
            if leaf.exists():
                leaf.rmdir()


@needs_cgroup
def test_a_daemon_restarted_in_place_finds_its_service_from_its_leaf(root: Path) -> None:
    """The second selection runs as the image a restart in place executes would:
    already in the leaf, it takes the service's cgroup again, not the leaf."""
    service = root / "agentsd-test.service"
    service.mkdir()
    twice = UNDER_SYSTEMD.replace(
        "found = ", "select_containment(None, {'INVOCATION_ID': 'x'})\nfound = "
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", twice],
            preexec_fn=lambda: (service / "cgroup.procs").write_text("0"),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        mode, found_root, own = json.loads(done.stdout)
        assert mode == "systemd-delegated"
        assert found_root == str(service)
        assert own == f"0::/{root.name}/{service.name}/daemon"
    finally:
        for leaf in (service / "daemon", service):
            if leaf.exists():
                leaf.rmdir()


@needs_cgroup
def test_a_root_without_limit_controllers_says_so(root: Path) -> None:
    """Here the v2 hierarchy has none of memory, pids and cpu (bound to v1): nothing
    is enabled, and the containment's detail says so (limits then fail at create)."""
    assert CgroupRoot(root).enable_controllers(["memory", "pids", "cpu"]) == []
    assert (root / "cgroup.subtree_control").read_text().split() == []
    assert "limit controllers: none available" in select_containment(str(root), {}).detail


def test_the_root_enables_the_limit_controllers_it_was_given(tmp_path: Path) -> None:
    """What the daemon writes, on the kernel's file format (a plain directory: no
    controller but hugetlb can be enabled in this machine's v2 hierarchy, and not
    without changing its root for everyone): the ones the root has and has not
    enabled yet, each as ``+name`` in one write; what it has not got is left out."""
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    control = tmp_path / "cgroup.subtree_control"
    control.write_text("memory\n")
    writes: list[str] = []
    real_write = Path.write_text

    def write(path: Path, text: str, *args: object, **kwargs: object) -> int:
        if path == control:
            writes.append(text)
            text = "memory " + " ".join(word[1:] for word in text.split())
        return real_write(path, text)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "write_text", write)
        enabled = CgroupRoot(tmp_path).enable_controllers(["memory", "pids", "cpu", "hugetlb"])
    assert writes == ["+pids +cpu"]
    assert enabled == ["memory", "pids", "cpu"]
