"""Per-session limits and the OOM attribution of an agent's end (issue 17 item 4).

This machine's cgroup v2 hierarchy has no memory, pids or cpu controller (they are
bound to the v1 hierarchies), so no limit can take effect here and no agent can be
OOM-killed in its own cgroup: what runs for real is the refusal (tests/e2e/
test_cgroup.py) and, below, a real session cgroup reporting no OOM count. The
attribution itself is tested on the kernel's ``memory.events`` format in a plain
directory and on the decision it feeds, which is all the daemon adds to the
kernel's count.
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import attrs
import pytest

from agentsd.cgroup import CgroupRoot, SessionCgroup
from agentsd.child import ExitProof, ExitUnproven
from agentsd.config import Limits
from agentsd.held_lease import exit_cause, exited_event
from agentsd.leases import ExitEvidence
from agentsd.leftovers import EndOutcome
from agentsd.session import Session
from agentsd.status_board import StatusBoard
from agentsd.store.database import open_database
from agentsd.store.sessions import SessionRow, insert_session, load_sessions
from agentsd_protocol.api.session import SessionLimits
from tests.cgroup_root import cgroup_root, unavailable

# memory.events of a cgroup v2 whose member was OOM-killed (Documentation/
# admin-guide/cgroup-v2.rst: low, high, max, oom, oom_kill, oom_group_kill).
MEMORY_EVENTS = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n"


def test_oom_kills_are_read_from_memory_events(tmp_path: Path) -> None:
    cgroup = SessionCgroup(tmp_path)
    assert cgroup.oom_kills() is None  # no memory controller: no file
    (tmp_path / "memory.events").write_text(MEMORY_EVENTS)
    assert cgroup.oom_kills() == 1
    assert SessionCgroup(tmp_path / "gone").oom_kills() is None


@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
def test_a_session_cgroup_here_has_no_oom_count() -> None:
    """Without the memory controller a real session cgroup has no memory.events:
    the count is None (unknown), never a made-up 0."""
    with cgroup_root() as path:
        cgroup = CgroupRoot(path).create("t1")
        try:
            assert cgroup.oom_kills() is None
        finally:
            cgroup.remove()


def _proof(oom_kills: int | None, signal: int | None = 9) -> ExitProof:
    returncode = -signal if signal is not None else 0
    return ExitProof.from_returncode(returncode, 0, cgroup_empty=True, oom_kills=oom_kills)


def test_an_agent_that_ends_by_itself_after_an_oom_kill_exits_with_cause_oom() -> None:
    assert exit_cause(None, None, _proof(1)) == "oom"
    assert exit_cause("unexpected", None, _proof(2)) == "oom"
    # A tool the agent ran was killed but the agent ended cleanly: still attributed,
    # the count says what the kernel did inside its cgroup.
    assert exit_cause(None, None, _proof(1, signal=None)) == "oom"


def test_an_end_without_an_oom_kill_keeps_its_cause() -> None:
    assert exit_cause(None, None, _proof(0)) == "unexpected"
    assert exit_cause(None, None, _proof(None)) == "unexpected"  # no memory controller
    assert exit_cause(None, None, ExitUnproven("still ran")) == "unexpected"
    assert exit_cause(None, None, EndOutcome.ENDED) == "unexpected"
    # What stopped it on purpose wins over the count: a close is a close.
    assert exit_cause("requested", None, _proof(3)) == "requested"
    assert exit_cause("idle", None, _proof(3)) == "idle"


def test_child_exited_carries_the_cgroup_oom_count() -> None:
    evidence = ExitEvidence(cause="oom", proven=True, signal=9, detail="its cgroup was empty")
    event = exited_event("oom", evidence, None, "Killed", oom_kills=2)
    assert (event.cause, event.signal, event.oom_kills, event.stderr_tail) == (
        "oom",
        9,
        2,
        "Killed",
    )
    assert exited_event("requested", evidence, None).oom_kills is None


def test_a_session_limit_wins_over_the_default_and_unset_ones_keep_it() -> None:
    defaults = Limits(memory_max_bytes=1 << 30, pids_max=512)
    own = Limits(pids_max=64, cpu_max=0.5)
    assert defaults.under(own) == Limits(memory_max_bytes=1 << 30, pids_max=64, cpu_max=0.5)
    assert defaults.under(Limits()) == defaults
    assert Limits().under(own).controllers() == ["pids", "cpu"]


def test_a_session_limits_are_stored_with_it(tmp_path: Path) -> None:
    limits = {"memoryMax": 256 << 20, "pidsMax": None, "cpuMax": 1.5}
    row = SessionRow(
        id="s1",
        host_id="h",
        provider="mock",
        cwd="/",
        title=None,
        options={},
        env={},
        command=None,
        provider_handle=None,
        created_at=1.0,
        updated_at=1.0,
        limits=limits,
    )
    with closing(open_database(tmp_path / "db" / "agentsd.db")) as conn:
        conn.execute("BEGIN IMMEDIATE")
        insert_session(conn, row, [])
        insert_session(conn, attrs.evolve(row, id="s2", limits=None), [])
        conn.execute("COMMIT")
        loaded = {r.id: r.limits for r in load_sessions(conn)}
    assert loaded == {"s1": limits, "s2": None}


def test_a_session_shows_and_applies_the_limits_it_was_created_with() -> None:
    row = SessionRow(
        id="s1",
        host_id="h",
        provider="mock",
        cwd="/",
        title=None,
        options={},
        env={},
        command=None,
        provider_handle=None,
        created_at=1.0,
        updated_at=1.0,
        limits={"memoryMax": 1 << 30, "pidsMax": None, "cpuMax": 0.5},
        created_by="parent",
    )
    session = Session(row=row, head_seq=0, board=StatusBoard())
    assert session.own_limits() == Limits(memory_max_bytes=1 << 30, cpu_max=0.5)
    info = session.info()
    assert info.limits == SessionLimits(memory_max=1 << 30, cpu_max=0.5)
    assert info.created_by == "parent"
    plain = Session(row=attrs.evolve(row, limits=None), head_seq=0, board=StatusBoard())
    assert (plain.own_limits(), plain.info().limits) == (Limits(), None)
