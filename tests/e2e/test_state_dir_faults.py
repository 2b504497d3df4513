"""A state directory deleted, moved or made read-only under a running daemon
(issue 18, Build 4): writes are refused with ``storage_unavailable``, reads and
``daemon.status`` say why, nothing is acknowledged that a restart would not find,
and writes resume by themselves once the directory is back.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests.daemon_process import (
    DaemonProcess,
    WireClient,
    make_temp_dir,
    running_daemon,
)
from tests.e2e.reliability import PingProbe


def _create(client: WireClient, cwd: Path) -> dict[str, Any]:
    reply = client.call(
        "agentSession.create", {"provider": "mock", "cwd": str(cwd), "start": False}
    )
    assert isinstance(reply, dict)
    return reply


def _refused(reply: dict[str, Any]) -> str:
    assert "error" in reply, reply
    assert reply["error"]["data"]["kind"] == "storage_unavailable", reply
    assert reply["error"]["data"]["retryable"] is True
    return str(reply["error"]["message"])


def _storage(client: WireClient) -> dict[str, Any]:
    storage: dict[str, Any] = client.call("daemon.status")["result"]["storage"]
    return storage


def _listed(state: Path) -> set[str]:
    with running_daemon(state_dir=state) as daemon, daemon.connect() as client:
        sessions = client.call("agentSession.list", {})["result"]["sessions"]
        return {s["sessionId"] for s in sessions}


def test_a_deleted_state_directory_never_acknowledges_a_write() -> None:
    """Before: records acknowledged after the deletion were gone after a restart."""
    cwd = make_temp_dir()
    state = make_temp_dir() / "state"
    with (
        running_daemon(state_dir=state) as daemon,
        daemon.connect() as client,
        PingProbe(daemon.socket) as probe,
    ):
        assert "result" in _create(client, cwd)
        shutil.rmtree(state)
        acknowledged = []
        for _ in range(3):
            reply = _create(client, cwd)
            if "result" in reply:
                acknowledged.append(reply["result"]["sessionId"])
            else:
                assert "deleted or moved" in _refused(reply)
        assert acknowledged == []
        storage = _storage(client)
        assert storage["state"] == "unavailable" and "deleted or moved" in storage["detail"]
        assert "storage unavailable" in daemon.log()
        probe.check()  # the daemon answered all along (invariant 8)
        _stops_cleanly(daemon)
    assert _listed(state) == set()  # nothing acknowledged is missing: none was


def test_a_moved_state_directory_refuses_writes_until_it_is_back() -> None:
    cwd = make_temp_dir()
    base = make_temp_dir()
    state, moved = base / "state", base / "moved"
    with (
        running_daemon(state_dir=state) as daemon,
        daemon.connect() as client,
        PingProbe(daemon.socket) as probe,
    ):
        kept = _create(client, cwd)["result"]["sessionId"]
        state.rename(moved)
        assert "deleted or moved" in _refused(_create(client, cwd))
        # Before: a start said "python3 was not found".
        started = client.call("agentSession.start", {"sessionId": kept})
        assert "deleted or moved" in _refused(started)
        assert _storage(client)["state"] == "unavailable"
        moved.rename(state)
        assert _storage(client) == {"state": "ok", "detail": ""}
        resumed = _create(client, cwd)["result"]["sessionId"]
        assert "result" in client.call("agentSession.start", {"sessionId": resumed})
        probe.check()  # the daemon answered all along (invariant 8)
        _stops_cleanly(daemon)
    assert _listed(state) == {kept, resumed}


def test_a_read_only_state_directory_refuses_writes_until_it_is_writable() -> None:
    """``chmod a-w`` on the state directory. (A read-only remount is refused as
    busy while the daemon holds its files open for writing.)"""
    cwd = make_temp_dir()
    state = make_temp_dir() / "state"
    with (
        running_daemon(state_dir=state) as daemon,
        daemon.connect() as client,
        PingProbe(daemon.socket) as probe,
    ):
        kept = _create(client, cwd)["result"]["sessionId"]
        state.chmod(0o500)
        try:
            assert "not writable" in _refused(_create(client, cwd))
            # Before: a start said "python3 is not executable".
            assert "not writable" in _refused(
                client.call("agentSession.start", {"sessionId": kept})
            )
            storage = _storage(client)
            assert storage["state"] == "unavailable" and "read-only" in storage["detail"]
            assert client.call("agentSession.get", {"sessionId": kept})["result"]
        finally:
            state.chmod(0o700)
        resumed = _create(client, cwd)["result"]["sessionId"]
        probe.check()  # the daemon answered all along (invariant 8)
        _stops_cleanly(daemon)
    assert _listed(state) == {kept, resumed}


def _stops_cleanly(daemon: DaemonProcess) -> None:
    code = daemon.stop()
    log = daemon.log()
    assert code == 0 and "Traceback" not in log, log
