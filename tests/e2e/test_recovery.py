"""Crashes and restarts of a real daemon: recovery, the state-dir lock, and a database
from the future.

Named after DESIGN.md section 2: no orphan survives (invariant 5), single owner
(invariant 4). Every test runs under an outer ``trio.fail_after``.
"""

from __future__ import annotations

import hashlib
import signal
import sqlite3
from pathlib import Path
from typing import Any

import trio

from agentsd.store.database import SCHEMA_VERSION
from tests.daemon_process import run_daemon, running_daemon
from tests.e2e.test_sessions import (
    DATABASE_NAME,
    SHORT_LADDER,
    assert_contiguous,
    create,
    db_rows,
    history,
    kill_carriers,
    kinds,
    ladder_config,
    open_rpc,
    temp_dir,
    token_carriers,
)
from tests.polling import eventually

# Sessions of each kind; what a SIGKILLed daemon leaves behind differs per kind.
KINDS: list[dict[str, Any]] = [
    {},  # exits on stdin EOF, i.e. as soon as the daemon dies
    {"spawnGrandchild": True},  # its setsid() grandchild survives; only the token finds it
    {"ignoreEof": True},  # keeps running until signalled
    {"ignoreEof": True, "ignoreSigterm": True},  # needs SIGKILL
]
SESSIONS = 20


async def test_no_orphan_survives_a_sigkilled_daemon() -> None:
    """SIGKILL the daemon with 20 live sessions (some mid-turn with an approval
    pending, some with a grandchild that left the group); start it again on the same
    state directory: nothing carrying our spawn tokens survives, every session is
    settled with ``child.exited {cause: daemon-restart}`` and contiguous seqs, and
    ``daemon.status`` reports what recovery did. Without the holder (``holder =
    false``), whose agents the next daemon would take over instead."""
    tokens: list[str] = []
    no_holder = ladder_config(*SHORT_LADDER, holder=False)
    with trio.fail_after(120), temp_dir() as base, no_holder as config:
        state = base / "state"
        args = ["--config", str(config)]
        db = state / DATABASE_NAME
        try:
            with running_daemon(state_dir=state, extra_args=args) as first:
                async with open_rpc(first.socket) as rpc:
                    sids: list[str] = []
                    for i in range(SESSIONS):
                        info = await create(rpc, base, options=KINDS[i % len(KINDS)])
                        sids.append(info["sessionId"])
                    # A quarter of them wait on an approval: an open turn to settle.
                    waiting = sids[::4]
                    for sid in waiting:
                        await rpc.call("agentSession.send", {"sessionId": sid, "text": "approve"})
                    for sid in waiting:
                        await eventually(lambda sid=sid: _status(db, sid) == "attention")
                tokens = [r[0] for r in db_rows(db, "SELECT token FROM leases")]
                assert len(tokens) == SESSIONS
                grandchildren = SESSIONS // len(KINDS)
                await eventually(lambda: len(token_carriers(tokens)) == SESSIONS + grandchildren)
                first.process.send_signal(signal.SIGKILL)
                assert first.wait() == -signal.SIGKILL
            # The daemon is gone; what it could not clean up still runs.
            survivors = token_carriers(tokens)
            assert len(survivors) >= SESSIONS // 2 + grandchildren

            with running_daemon(state_dir=state, extra_args=args) as second:
                assert token_carriers(tokens) == []  # before the daemon answered anything
                async with open_rpc(second.socket) as rpc:
                    status = await rpc.call("daemon.status")
                    recovery = status["recovery"]
                    assert recovery["sessionsRecovered"] == SESSIONS
                    assert recovery["unproven"] == 0
                    # Every session whose agent or grandchild outlived the first daemon.
                    assert recovery["orphansEnded"] >= SESSIONS * 3 // 4
                    assert f"{SESSIONS} sessions recovered" in recovery["summary"]
                    assert status["sessions"]["running"] == 0

                    for sid in sids:
                        events = await history(rpc, sid)
                        assert_contiguous(events)
                        exited = [e for e in events if e["kind"] == "child.exited"]
                        assert len(exited) == 1
                        assert exited[0]["body"]["cause"] == "daemon-restart"
                        assert kinds(events)[-2:] == ["child.exited", "lease.released"]
                        info = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
                        assert info["phase"] == "stopped" and info["status"] == "idle"
                        assert info["lastExit"]["cause"] == "daemon-restart"
                        if sid in waiting:
                            settled = {e["kind"]: e["body"] for e in events[-5:]}
                            assert settled["approval.resolved"]["decision"] == "cancelled"
                            assert settled["turn.completed"]["outcome"] == "interrupted"
                            assert settled["turn.completed"]["reason"] == "daemon-restart"

                    # The record survived: the next start takes a higher fence and
                    # resumes the agent's conversation natively.
                    before = (await rpc.call("agentSession.get", {"sessionId": sids[1]}))["session"]
                    started = await rpc.call("agentSession.start", {"sessionId": sids[1]})
                    assert started["session"]["fence"] == before["fence"] + 1 == 2
                    assert started["session"]["providerHandle"] == before["providerHandle"]
                    await rpc.call("agentSession.close", {"sessionId": sids[1]})
        finally:
            kill_carriers(tokens)


def _status(db: Path, session_id: str) -> str:
    """Whether the journal shows a pending approval (read from the database, since
    the daemon is about to be killed and its answers would not matter)."""
    rows = db_rows(
        db,
        "SELECT kind FROM events WHERE session_id = ? AND kind LIKE 'approval.%' ORDER BY seq",
        session_id,
    )
    return "attention" if rows and rows[-1][0] == "approval.requested" else "other"


# ---- invariant 4: one daemon per state directory -------------------------------------


def test_single_owner_a_second_daemon_on_the_same_state_dir_refuses() -> None:
    # Synchronous: every step is a subprocess under its own deadline.
    with temp_dir() as base:
        state = base / "state"
        with running_daemon(state_dir=state) as first:
            refused = run_daemon(["--socket", str(base / "other.sock"), "--state-dir", str(state)])
            assert refused.returncode == 1, refused
            assert "already running" in refused.stderr
            assert str(first.process.pid) in refused.stderr  # it names the holder
            assert "Traceback" not in refused.stderr
            assert not (base / "other.sock").exists()
            first.ping()


# ---- a database written by a newer agentsd ------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_a_newer_schema_refuses_to_start_and_leaves_the_file_unchanged() -> None:
    with trio.fail_after(60), temp_dir() as base:
        state = base / "state"
        with running_daemon(state_dir=state) as daemon:
            async with open_rpc(daemon.socket) as rpc:
                await create(rpc, base, start=False)
        db = state / DATABASE_NAME
        conn = sqlite3.connect(db)
        try:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        finally:
            conn.close()
        files_before = sorted(p.name for p in state.iterdir())
        digest = _digest(db)

        refused = run_daemon(["--socket", str(base / "d.sock"), "--state-dir", str(state)])
        assert refused.returncode == 1, refused
        assert f"schema version {SCHEMA_VERSION + 1}" in refused.stderr
        assert "newer than this agentsd supports" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert _digest(db) == digest
        assert sorted(p.name for p in state.iterdir()) == files_before  # no -wal, no -shm
        assert not (base / "d.sock").exists()
