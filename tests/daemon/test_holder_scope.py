"""Where the holder lives under systemd (``agentsd.holder_scope``): the scope's name,
slice and cgroup are known before it exists and the same for every holder of a
state directory, and a scope that cannot be made means no holder, never one inside
the service's cgroup. A real user manager runs these in
``tests/e2e/test_systemd_user.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from agentsd.cgroup import FALLBACK, CgroupRoot, Containment
from agentsd.holder_link import HolderLost, open_holder_link, socket_path
from agentsd.holder_scope import after_stop, holder_scope, holder_unit

MANAGER = Path("/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service")


def _delegated(service: Path) -> Containment:
    return Containment(mode="systemd-delegated", root=CgroupRoot(service), detail="test")


def test_the_scope_sits_beside_the_service_in_its_slice_named_after_the_state_dir(
    tmp_path: Path,
) -> None:
    service = MANAGER / "app.slice" / "agentsd.service"
    scope = holder_scope(_delegated(service), tmp_path / "state")
    assert scope is not None
    assert scope.unit.startswith("agentsd-holder-") and scope.unit.endswith(".scope")
    assert scope.slice == "app.slice"
    assert scope.path == MANAGER / "app.slice" / scope.unit
    # The same for every holder of that state directory, another for another.
    assert holder_scope(_delegated(service), tmp_path / "state") == scope
    other = holder_scope(_delegated(service), tmp_path / "other")
    assert other is not None and other.unit != scope.unit
    command = scope.command()
    assert command[:3] == ["systemd-run", "--user", "--scope"]
    assert f"--unit={scope.unit}" in command and "--slice=app.slice" in command
    assert "--property=Delegate=yes" in command and command[-1] == "--"
    assert scope.containment().root == CgroupRoot(scope.path)
    assert scope.containment().mode == "systemd-delegated"


def test_a_service_of_the_root_slice_gets_its_scope_there_too(tmp_path: Path) -> None:
    scope = holder_scope(_delegated(MANAGER / "agentsd.service"), tmp_path)
    assert scope is not None
    assert scope.slice == "-.slice" and scope.path == MANAGER / scope.unit


def test_no_scope_outside_systemd(tmp_path: Path) -> None:
    assert holder_scope(FALLBACK, tmp_path) is None
    configured = Containment(mode="cgroup-root", root=CgroupRoot(tmp_path), detail="x")
    assert holder_scope(configured, tmp_path) is None
    # A delegated cgroup that is not a service's (a test runner's) gets none.
    assert holder_scope(_delegated(MANAGER / "app.slice" / "run-x.scope"), tmp_path) is None


def test_a_holder_is_never_found_in_a_scope_it_is_not_in(tmp_path: Path) -> None:
    scope = holder_scope(_delegated(MANAGER / "app.slice" / "agentsd.service"), tmp_path)
    assert scope is not None
    assert not scope.holds(os.getpid())
    assert not scope.holds(2**22 + 1)  # no such process
    with pytest.raises(OSError, match="not in"):
        scope.place(os.getpid())


async def test_without_a_user_manager_to_ask_no_holder_starts_and_none_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    scope = holder_scope(_delegated(MANAGER / "app.slice" / "agentsd.service"), state)
    assert scope is not None
    with trio.fail_after(30), pytest.raises(HolderLost, match=f"{scope.unit} cannot be made"):
        async with open_holder_link(state, scope):
            raise AssertionError("attached a holder that should not have started")
    with pytest.raises(OSError):
        await trio.open_unix_socket(str(socket_path(state)))


def test_after_a_crash_the_stop_post_leaves_the_scope_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # nothing could be run
    unit = holder_unit(tmp_path)
    for result in ("signal", "exit-code", "core-dump", "watchdog", ""):
        said = after_stop(tmp_path, {"SERVICE_RESULT": result})
        assert said.startswith(f"{unit} kept for the next daemon"), said
    # After a stop it asks the manager; with none to ask it says so, and fails nothing.
    said = after_stop(tmp_path, {"SERVICE_RESULT": "timeout"})
    assert said.startswith(f"{unit}: nothing to end"), said
