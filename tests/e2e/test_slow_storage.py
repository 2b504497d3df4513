"""Slow storage is reported as slow storage (issue 18, Build 7).

The daemon's fsync calls are made to take 11 s each (12 s as reported) by a real
mechanism: ``strace`` attached to the running daemon with syscall fault injection
(``-e inject=fsync,fdatasync:delay_enter=11s``), so SQLite's commits really wait
in the kernel's syscall path. Where strace is missing or may not attach (no
ptrace), the test is skipped with the reason.

Before: a send was rejected as ``handshake_timeout`` after 60 s, a "task failed"
traceback was logged and a ``reserved`` lease was left in the database. Now the
send's dispatch is rejected with ``storage_unavailable`` once the start's write
bound is exceeded (its submission, journaled before, is durable), nothing is
logged with a traceback, the late reservation is withdrawn, and once the disk is
fast again the next send works.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import time
import urllib.parse
from pathlib import Path

from tests.daemon_process import WireClient, running_daemon
from tests.e2e.reliability import wait_until
from tests.strace import delayed

# Reported as 12 s; any delay over the start's bound takes the same path (the
# reservation's commit outlasts START_BOUND_S, load only lengthens it), and the
# send's reply waits out three of them in a row (submission, reservation, refusal).
FSYNC_DELAY_S = 11
START_BOUND_S = 10.0  # agentsd.held_lease.SETTLE_TIMEOUT_S


def slow_fsync(pid: int, delay_s: int) -> contextlib.AbstractContextManager[subprocess.Popen[str]]:
    """Every fsync/fdatasync of process ``pid`` (all its threads) takes ``delay_s``;
    yields the tracer (ending it ends the delays at once)."""
    return delayed(pid, "fsync,fdatasync", delay_s, "it is what makes fsync slow here")


def _held_leases(db: Path) -> list[tuple[str, str]]:
    uri = "file:" + urllib.parse.quote(str(db)) + "?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5.0)) as conn:
        rows = conn.execute("SELECT session_id, state FROM leases WHERE state != 'released'")
        return [(str(a), str(b)) for a, b in rows]


def test_slow_fsync_fails_a_send_as_storage_unavailable_and_leaves_no_reserved_lease() -> None:
    with running_daemon() as daemon, WireClient(daemon.socket, timeout_s=120.0) as client:
        cwd = daemon.state_dir.parent
        created = client.call(
            "agentSession.create", {"provider": "mock", "cwd": str(cwd), "start": False}
        )
        session_id = created["result"]["sessionId"]
        with slow_fsync(daemon.process.pid, FSYNC_DELAY_S):
            started = time.monotonic()
            reply = client.call("agentSession.send", {"sessionId": session_id, "text": "echo hi"})
            elapsed = time.monotonic() - started
        # The submission itself was journaled (acknowledged: it is durable, one slow
        # commit); starting the agent for it is what failed, and says why.
        result = reply["result"]
        assert result["dispatch"] == "rejected", reply
        assert result["reason"].startswith("storage_unavailable: storage too slow"), reply
        # The start's bound was waited (a lower bound: load only lengthens it). No
        # handshake deadline was: the reason names storage, not the handshake, and the
        # client's timeout is the hang guard.
        assert elapsed >= START_BOUND_S, elapsed
        # The reservation that committed late is withdrawn once the disk answers.
        db = daemon.state_dir / "agentsd.db"
        wait_until(lambda: _held_leases(db) == [], 30.0, "the late reservation withdrawn")
        wait_until(
            lambda: (
                client.call("agentSession.get", {"sessionId": session_id})["result"]["session"][
                    "phase"
                ]
                == "stopped"
            ),
            30.0,
            "the session stopped",
        )
        log = daemon.log()
        assert "Traceback" not in log and "task failed" not in log, log
        # Nothing is wedged: the same send works now.
        again = client.call("agentSession.send", {"sessionId": session_id, "text": "echo hi"})
        assert again["result"]["dispatch"] == "accepted", again
