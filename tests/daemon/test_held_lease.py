"""The one settle path (``agentsd.held_lease.settle``) over a real store: one
``child.exited`` shape whoever settles, and no release without proof."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import msgspec
import pytest

from agentsd.child import ExitProof, ExitUnproven
from agentsd.held_lease import Proof, settle
from agentsd.leftovers import EndOutcome
from agentsd.session import Session
from agentsd.status_board import StatusBoard
from agentsd.store import leases as lease_rows
from agentsd.store import sessions as session_rows
from agentsd.store.journal import read_events
from agentsd.store.writer import Store, open_store
from agentsd_protocol.api.events import ChildExited, ErrorInfo, decode_event
from agentsd_protocol.errors import AgentExited
from tests.daemon.test_phase import a_session


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "agentsd.db") as store:
        yield store


async def held_session(store: Store, session_id: str) -> Session:
    """A session whose lease is held, as a previous daemon or a failed settle left it."""
    row = attrs.evolve(a_session().row, id=session_id)
    await store.write(lambda conn: session_rows.insert_session(conn, row, []))
    lease, _ = await store.write(
        lambda conn: lease_rows.acquire_lease(conn, session_id, time.time())
    )
    return Session(row=row, head_seq=1, board=StatusBoard(), lease=lease)


async def journal(store: Store, session_id: str) -> list[tuple[str, dict[str, Any]]]:
    events, _ = await store.read(
        lambda conn: read_events(conn, session_id, after_seq=0, limit=100, max_bytes=1 << 20)
    )
    return [(e.kind, msgspec.json.decode(e.body)) for e in events]


PROVEN: list[tuple[Proof, int | None, int | None]] = [
    (None, None, None),
    (ExitProof(returncode=0, signal=None, stragglers_killed=0), 0, None),
    (ExitProof(returncode=None, signal=9, stragglers_killed=2), None, 9),
    (EndOutcome.ENDED, None, None),
    (EndOutcome.ALREADY_GONE, None, None),
]


@pytest.mark.parametrize(("proof", "returncode", "signal"), PROVEN)
async def test_every_proven_settle_journals_the_one_child_exited_shape_and_releases(
    store: Store, proof: Proof, returncode: int | None, signal: int | None
) -> None:
    session = await held_session(store, "s1")
    await settle(session, store.write, "requested", proof)
    assert session.phase == "stopped"
    assert session.lease is not None and not session.lease.held
    assert session.last_exit is not None and session.last_exit.cause == "requested"
    kinds = [k for k, _ in await journal(store, "s1")]
    assert kinds[-2:] == ["child.exited", "lease.released"]
    [exited] = [b for k, b in await journal(store, "s1") if k == "child.exited"]
    event = decode_event("child.exited", msgspec.json.encode(exited))
    assert isinstance(event, ChildExited)
    assert (event.returncode, event.signal) == (returncode, signal)
    assert event.cause == "requested" and event.error is None
    durable = await store.read(lambda conn: lease_rows.latest_lease(conn, "s1"))
    assert durable is not None and not durable.held


async def test_a_failure_is_journaled_in_child_exited_and_on_the_session(store: Store) -> None:
    session = await held_session(store, "s1")
    proof = ExitProof(returncode=1, signal=None, stragglers_killed=0)
    await settle(session, store.write, "failed", proof, AgentExited("it crashed"))
    [exited] = [b for k, b in await journal(store, "s1") if k == "child.exited"]
    event = decode_event("child.exited", msgspec.json.encode(exited))
    assert isinstance(event, ChildExited)
    assert event.error == ErrorInfo(kind="agent_exited", message="it crashed")
    assert session.error is not None and session.error.kind == "agent_exited"
    row = await store.read(lambda conn: session_rows.load_session(conn, "s1"))
    assert row is not None and row.error is not None and row.error["kind"] == "agent_exited"


@pytest.mark.parametrize("proof", [ExitUnproven("no /proc scan finished"), EndOutcome.UNPROVEN])
async def test_reap_before_release_no_proof_keeps_the_lease_held(
    store: Store, proof: Proof
) -> None:
    session = await held_session(store, "s1")
    await settle(session, store.write, "daemon-restart", proof)
    assert session.phase == "exit-unproven"
    assert session.lease is not None and session.lease.held
    events = await journal(store, "s1")
    assert [k for k, _ in events][-1] == "exit.unproven"
    assert "child.exited" not in [k for k, _ in events]
    durable = await store.read(lambda conn: lease_rows.latest_lease(conn, "s1"))
    assert durable is not None and durable.held
    assert durable.death is not None and not durable.death.proven
