"""A damaged database is refused, never served or guessed (issue 18, Build 4).

Each test damages the state of a real daemon as a user's disk or hands might
(truncated, a block overwritten, the write-ahead log deleted while its index
stays), then checks that the next start refuses with one line naming the file and
what to do, exit status 1, no traceback and the file unchanged; that
``agentsd --salvage`` keeps the damaged files aside, copies what can be read and
reports what was lost; and that the daemon then serves what was saved.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_process import (
    WireClient,
    daemon_env,
    make_temp_dir,
    run_daemon,
    running_daemon,
)

DATABASE_NAME = "agentsd.db"
SESSIONS = 60  # with 4 KiB of options each: a few dozen pages of sessions
TIMEOUT_S = 60.0


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _populate(client: WireClient, cwd: Path) -> list[str]:
    ids = []
    for n in range(SESSIONS):
        reply = client.call(
            "agentSession.create",
            {
                "provider": "mock",
                "cwd": str(cwd),
                "start": False,
                "title": f"s{n:03d}",
                "options": {"pad": "o" * 4000},
            },
        )
        ids.append(reply["result"]["sessionId"])
    return ids


def _agentsd(base: Path, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentsd", "--state-dir", str(state), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=daemon_env(base),
        timeout=TIMEOUT_S,
        check=False,
    )


def _database_files(state: Path) -> dict[str, str]:
    return {p.name: _digest(p) for p in state.iterdir() if p.name.startswith(DATABASE_NAME)}


def _assert_refused(base: Path, state: Path, why: str) -> None:
    db = state / DATABASE_NAME
    files = _database_files(state)
    refused = run_daemon(["--socket", str(base / "d.sock"), "--state-dir", str(state)])
    assert refused.returncode == 1, refused
    assert "Traceback" not in refused.stderr, refused.stderr
    # One line for the user; the log's own lines (the agents' environment) aside.
    lines = [line for line in refused.stderr.splitlines() if line.startswith("agentsd:")]
    assert len(lines) == 1, refused.stderr
    assert f"database {db} is damaged" in lines[0] and why in lines[0], lines[0]
    assert "agentsd --salvage" in lines[0]
    assert _database_files(state) == files  # untouched, and no side file added
    assert not (base / "d.sock").exists()


def _salvage(base: Path, state: Path) -> tuple[subprocess.CompletedProcess[str], list[Path]]:
    before = _database_files(state)
    salvaged = _agentsd(base, state, "--salvage")
    assert "Traceback" not in salvaged.stderr, salvaged.stderr
    aside = sorted(p for p in state.iterdir() if ".damaged-" in p.name)
    # Every damaged file is kept aside, byte for byte.
    assert sorted(_digest(p) for p in aside) == sorted(before.values()), salvaged
    return salvaged, aside


def _served_sessions(state: Path) -> list[dict[str, Any]]:
    with running_daemon(state_dir=state) as daemon, daemon.connect() as client:
        listed = client.call("agentSession.list", {})["result"]["sessions"]
        for session in listed:
            history = client.call(
                "agentSession.history", {"sessionId": session["sessionId"], "afterSeq": 0}
            )
            assert "result" in history, history
        return list(listed)


@pytest.fixture(scope="module")
def populated() -> Iterator[tuple[Path, list[str]]]:
    """One daemon's state with ``SESSIONS`` sessions, cleanly stopped: made once, as
    each test damages a copy of its own (the creates and the daemon's start and stop
    were most of each test's time)."""
    base = make_temp_dir()
    state = base / "state"
    with running_daemon(state_dir=state) as daemon, daemon.connect() as client:
        ids = _populate(client, base)
    assert not (state / f"{DATABASE_NAME}-wal").exists()  # a clean stop checkpointed it
    yield state, ids
    shutil.rmtree(base, ignore_errors=True)


def _populated_state(populated: tuple[Path, list[str]]) -> tuple[Path, Path, list[str]]:
    """A private copy of the populated state: (base, state, session ids)."""
    source, ids = populated
    base = make_temp_dir()
    state = base / "state"
    shutil.copytree(source, state)
    return base, state, ids


def test_a_truncated_database_is_refused_and_salvaged(populated: tuple[Path, list[str]]) -> None:
    base, state, ids = _populated_state(populated)
    db = state / DATABASE_NAME
    os.truncate(db, db.stat().st_size // 2)
    _assert_refused(base, state, "truncated")
    checked = _agentsd(base, state, "--check")
    assert checked.returncode == 1 and "Traceback" not in checked.stderr, checked
    salvaged, _ = _salvage(base, state)
    assert salvaged.returncode == 1, salvaged  # something was lost, and it says so
    assert "rows copied" in salvaged.stdout
    served = _served_sessions(state)
    assert 0 < len(served) < len(ids)
    assert {s["sessionId"] for s in served} <= set(ids)


def test_an_overwritten_block_is_refused_and_salvaged(populated: tuple[Path, list[str]]) -> None:
    base, state, ids = _populated_state(populated)
    db = state / DATABASE_NAME
    page = 4096
    pages = db.stat().st_size // page
    with open(db, "r+b") as f:
        f.seek((pages // 2) * page)
        f.write(os.urandom(page))
    _assert_refused(base, state, "")
    salvaged, _ = _salvage(base, state)
    assert salvaged.returncode == 1, salvaged
    served = _served_sessions(state)
    assert 0 < len(served) < len(ids)


def test_a_deleted_write_ahead_log_with_its_index_left_is_refused() -> None:
    """A daemon killed with its commits in the log; the log deleted, its index
    (-shm) left. Served as it is, the database would show zero sessions."""
    base = make_temp_dir()
    state = base / "state"
    with running_daemon(state_dir=state) as daemon:
        with daemon.connect() as client:
            _populate(client, base)
        daemon.stop(signal.SIGKILL)
    wal = state / f"{DATABASE_NAME}-wal"
    assert wal.exists() and (state / f"{DATABASE_NAME}-shm").exists()
    wal.unlink()
    _assert_refused(base, state, "write-ahead log agentsd.db-wal is missing")
    salvaged, aside = _salvage(base, state)
    assert salvaged.returncode == 1, salvaged
    assert "write-ahead log agentsd.db-wal is missing" in salvaged.stdout
    assert any(p.name.endswith("-shm") for p in aside)
    assert _served_sessions(state) == []  # what the file held; the loss was reported


def test_check_of_a_sound_database_is_ok(populated: tuple[Path, list[str]]) -> None:
    base, state, _ = _populated_state(populated)
    checked = _agentsd(base, state, "--check")
    assert checked.returncode == 0, checked
    assert checked.stdout.strip() == f"{state / DATABASE_NAME}: ok"
