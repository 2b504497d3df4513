"""Supervised sessions over the real socket, with real mock agent children.

Every test runs under an outer ``trio.fail_after``; the daemon is a real
``python -m agentsd`` subprocess (``tests.daemon_process``), the agents are the mock
provider's program. Named after DESIGN.md section 2 where an invariant applies.

``Rpc`` (a small trio JSON-RPC client that keeps notifications) and the helpers
below are shared with ``test_recovery`` and ``test_conversation``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from agentsd.procfs import scan_processes
from agentsd.providers.mock_agent import BARRIER_EXIT_CODE
from agentsd_protocol.framing import FrameDecoder, Framing, encode_frame
from tests.daemon_process import DaemonProcess, make_temp_dir, running_daemon
from tests.polling import eventually

DATABASE_NAME = "agentsd.db"
TEST_TIMEOUT_S = 60.0  # one e2e test; most take well under a second

_encoder = msgspec.json.Encoder()


# ---- a trio JSON-RPC client --------------------------------------------------------


class CallFailed(Exception):
    """An error reply, as it came over the wire."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        super().__init__(f"{method}: {error.get('message')} ({error.get('data')})")
        self.method = method
        self.code: int = error["code"]
        self.data: dict[str, Any] = error.get("data") or {}
        self.kind: str = str(self.data.get("kind"))


class Rpc:
    """One NDJSON connection. Replies are matched by id; every notification is kept,
    in order, in ``notes`` (method, params) and announced through ``arrived``."""

    def __init__(self, stream: trio.SocketStream, *, keep_deltas: bool = True) -> None:
        self.stream = stream
        self.notes: list[tuple[str, dict[str, Any]]] = []
        # Without keep_deltas, agentSession.delta notifications are only counted: a
        # flood of them costs this process next to nothing.
        self.keep_deltas = keep_deltas
        self.deltas = 0
        self.closed = False
        self._decoder = FrameDecoder(framing=Framing.NDJSON)
        self._next_id = 0
        self._waiting: dict[int, trio.Event] = {}
        self._replies: dict[int, dict[str, Any]] = {}
        self._arrived = trio.Event()
        self._send_lock = trio.Lock()

    async def call(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        """The result; ``CallFailed`` for an error reply."""
        reply = await self.request(method, params)
        if "error" in reply:
            raise CallFailed(method, reply["error"])
        return reply["result"]

    async def request(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        """The whole reply object (result or error)."""
        self._next_id += 1
        request_id = self._next_id
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = dict(params)
        done = self._waiting[request_id] = trio.Event()
        async with self._send_lock:
            await self.stream.send_all(encode_frame(Framing.NDJSON, _encoder.encode(message)))
        await done.wait()
        del self._waiting[request_id]
        if request_id not in self._replies:
            raise AssertionError(f"the daemon closed the connection before answering {method}")
        return self._replies.pop(request_id)

    async def wait_note(
        self, check: Callable[[str, dict[str, Any]], bool], *, start: int = 0
    ) -> int:
        """The index in ``notes`` (from ``start``) of the first notification passing
        ``check``; waits for it."""
        index = start
        while True:
            while index < len(self.notes):
                method, params = self.notes[index]
                if check(method, params):
                    return index
                index += 1
            if self.closed:
                raise AssertionError("the connection closed while waiting for a notification")
            self._arrived = trio.Event()
            await self._arrived.wait()

    async def run_reader(self) -> None:
        try:
            while data := await self.stream.receive_some(256 * 1024):
                self._decoder.feed(data)
                for frame in self._decoder.frames():
                    if _DELTA_MARK in frame[:_DELTA_MARK_WITHIN]:
                        self.deltas += 1
                        if not self.keep_deltas:
                            continue
                    self._dispatch(msgspec.json.decode(frame))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.closed = True
            self._arrived.set()
            for event in self._waiting.values():
                event.set()

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "method" in message:
            self.notes.append((message["method"], message.get("params") or {}))
            self._arrived.set()
            return
        request_id = message.get("id")
        if isinstance(request_id, int) and request_id in self._waiting:
            self._replies[request_id] = message
            self._waiting[request_id].set()


_DELTA_MARK = b'"agentSession.delta"'
_DELTA_MARK_WITHIN = 64  # the method comes first: {"jsonrpc":"2.0","method":...


@contextlib.asynccontextmanager
async def open_rpc(path: Path, *, keep_deltas: bool = True) -> AsyncIterator[Rpc]:
    """Connect; the reader runs until the block ends, then the connection closes."""
    stream = await trio.open_unix_socket(str(path))
    rpc = Rpc(stream, keep_deltas=keep_deltas)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rpc.run_reader)
        try:
            yield rpc
        finally:
            nursery.cancel_scope.cancel()
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await stream.aclose()


# ---- helpers -----------------------------------------------------------------------


@contextlib.contextmanager
def temp_dir() -> Iterator[Path]:
    path = make_temp_dir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def ladder_config(
    eof_grace_s: float, term_grace_s: float, kill_wait_s: float, *, holder: bool = True
) -> Iterator[Path]:
    """A config file (for ``--config``) with a short close ladder; ``holder=False``
    for a daemon that starts its agents itself (``holder = false``)."""
    with temp_dir() as base:
        path = base / "config.toml"
        path.write_text(
            ("" if holder else "holder = false\n") + "[ladder]\n"
            f"eof_grace_s = {eof_grace_s}\nterm_grace_s = {term_grace_s}\n"
            f"kill_wait_s = {kill_wait_s}\n"
        )
        yield path


def read_only(db: Path) -> sqlite3.Connection:
    """A read-only connection to the daemon's database (never blocks its writer)."""
    uri = "file:" + urllib.parse.quote(str(db)) + "?mode=ro"
    return sqlite3.connect(uri, uri=True, timeout=5.0)


def db_rows(db: Path, query: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = read_only(db)
    try:
        return conn.execute(query, args).fetchall()
    finally:
        conn.close()


def token_carriers(tokens: list[str]) -> list[int]:
    table = scan_processes(tokens)
    return sorted({p.pid for t in tokens for p in table.carrying(t)})


def kill_carriers(tokens: list[str]) -> None:
    """Safety net for a failing test: nothing carrying our tokens outlives it."""
    for pid in token_carriers(tokens):
        with contextlib.suppress(OSError):
            os.kill(pid, 9)


async def create(rpc: Rpc, cwd: Path | str, **params: Any) -> dict[str, Any]:
    """``agentSession.create`` with the mock provider; the session info."""
    result = await rpc.call("agentSession.create", {"provider": "mock", "cwd": str(cwd), **params})
    info: dict[str, Any] = result["session"]
    return info


async def history(rpc: Rpc, session_id: str) -> list[dict[str, Any]]:
    """The whole journal, paged forward."""
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        page = await rpc.call(
            "agentSession.history", {"sessionId": session_id, "afterSeq": after, "limit": 1000}
        )
        events.extend(page["events"])
        if not page["hasMore"]:
            return events
        after = events[-1]["seq"]


def assert_contiguous(events: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


async def gather(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls concurrently; their results in order."""
    results: list[Any] = [None] * len(calls)

    async def run(i: int) -> None:
        results[i] = await calls[i]()

    async with trio.open_nursery() as nursery:
        for i in range(len(calls)):
            nursery.start_soon(run, i)
    return results


# ---- the life of a session --------------------------------------------------------


async def test_create_get_start_close_delete(daemon: DaemonProcess, tmp_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            info = await create(rpc, tmp_path, title="life", start=False)
            sid = info["sessionId"]
            assert info["phase"] == "stopped" and info["status"] == "idle"
            assert info["fence"] == 0 and info["child"] is None
            assert info["title"] == "life" and info["cwd"] == str(tmp_path)

            started = (await rpc.call("agentSession.start", {"sessionId": sid}))["session"]
            assert started["phase"] == "running" and started["fence"] == 1
            child = started["child"]
            assert child is not None and child["pid"] == child["pgid"]
            # Starting a running session is a no-op: same fence, same child.
            again = (await rpc.call("agentSession.start", {"sessionId": sid}))["session"]
            assert again["fence"] == 1 and again["child"] == child

            got = (await rpc.call("agentSession.get", {"sessionId": sid}))["session"]
            assert got["phase"] == "running" and got["providerHandle"]

            closed = await rpc.call("agentSession.close", {"sessionId": sid})
            assert closed["wasRunning"] is True
            assert closed["session"]["phase"] == "stopped"
            assert closed["session"]["lastExit"]["cause"] == "requested"
            assert not _alive(child)

            # close is idempotent: a stopped session stays stopped, nothing to report.
            for _ in range(2):
                closed = await rpc.call("agentSession.close", {"sessionId": sid})
                assert closed["wasRunning"] is False
                assert closed["session"]["phase"] == "stopped"

            events = await history(rpc, sid)
            assert_contiguous(events)
            assert kinds(events)[:4] == [
                "session.created",
                "lease.acquired",
                "child.spawned",
                "child.ready",
            ]
            assert kinds(events)[-2:] == ["child.exited", "lease.released"]

            deleted = await rpc.call("agentSession.delete", {"sessionId": sid})
            assert deleted == {"sessionId": sid, "deleted": True}
            with pytest.raises(CallFailed) as failed:
                await rpc.call("agentSession.get", {"sessionId": sid})
            assert failed.value.kind == "session_not_found"
            listed = (await rpc.call("agentSession.list", {}))["sessions"]
            assert sid not in {s["sessionId"] for s in listed}

        db = daemon.state_dir / DATABASE_NAME
        for table, column in (
            ("sessions", "id"),
            ("events", "session_id"),
            ("leases", "session_id"),
        ):
            assert db_rows(db, f"SELECT COUNT(*) FROM {table} WHERE {column} = ?", sid) == [(0,)]


def _alive(child: dict[str, Any]) -> bool:
    info = scan_processes().get(child["pid"])
    return info is not None and not info.is_zombie


async def test_reap_before_release_delete_of_a_running_session_ends_its_agent_first(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            info = await create(rpc, tmp_path, options={"spawnGrandchild": True})
            sid = info["sessionId"]
            db = daemon.state_dir / DATABASE_NAME
            tokens = [
                r[0] for r in db_rows(db, "SELECT token FROM leases WHERE session_id = ?", sid)
            ]
            try:
                await eventually(lambda: len(token_carriers(tokens)) >= 2)  # agent + grandchild
                await rpc.call("agentSession.delete", {"sessionId": sid})
                assert token_carriers(tokens) == []
                assert db_rows(db, "SELECT COUNT(*) FROM events WHERE session_id = ?", sid) == [
                    (0,)
                ]
            finally:
                kill_carriers(tokens)


async def test_list_filters_by_phase_and_provider(tmp_path: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT_S), running_daemon() as daemon:
        async with open_rpc(daemon.socket) as rpc:
            running = [(await create(rpc, tmp_path))["sessionId"] for _ in range(2)]
            stopped = [(await create(rpc, tmp_path, start=False))["sessionId"] for _ in range(3)]

            async def listed(**params: Any) -> set[str]:
                result = await rpc.call("agentSession.list", params)
                return {s["sessionId"] for s in result["sessions"]}

            assert await listed() == {*running, *stopped}
            assert await listed(state="running") == set(running)
            assert await listed(state="stopped") == set(stopped)
            assert await listed(state="exit-unproven") == set()
            assert await listed(provider="mock") == {*running, *stopped}
            assert await listed(provider="codex") == set()
            assert await listed(state="running", provider="mock") == set(running)
            await rpc.call("agentSession.close", {"sessionId": running[0]})
            assert await listed(state="running") == {running[1]}
            with pytest.raises(CallFailed) as failed:
                await rpc.call("agentSession.list", {"state": "sleeping"})
            assert failed.value.code == -32602


# ---- bad input ---------------------------------------------------------------------


async def test_bad_input_each_with_its_own_kind(daemon: DaemonProcess, tmp_path: Path) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("not a directory")
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:

            async def fails(method: str, params: dict[str, Any]) -> CallFailed:
                with pytest.raises(CallFailed) as failed:
                    await rpc.call(method, params)
                error = failed.value
                assert isinstance(error.data.get("retryable"), bool)
                return error

            create_base = {"provider": "mock", "cwd": str(tmp_path), "start": False}
            error = await fails("agentSession.create", {**create_base, "provider": "nope"})
            assert (error.code, error.kind) == (-32006, "unknown_provider")
            error = await fails("agentSession.create", {**create_base, "cwd": str(tmp_path / "x")})
            assert (error.code, error.kind) == (-32007, "cwd_not_found")
            error = await fails("agentSession.create", {**create_base, "cwd": str(a_file)})
            assert (error.code, error.kind) == (-32008, "cwd_not_directory")
            error = await fails("agentSession.create", {**create_base, "colour": "blue"})
            assert (error.code, error.kind) == (-32602, "invalid_params")
            assert "colour" in str(error)

            for method in ("get", "start", "close", "delete", "history", "send", "subscribe"):
                params: dict[str, Any] = {"sessionId": "no-such-session"}
                if method == "send":
                    params["text"] = "hi"
                error = await fails(f"agentSession.{method}", params)
                assert (error.code, error.kind) == (-32002, "session_not_found"), method

            sid = (await create(rpc, tmp_path, start=False))["sessionId"]
            error = await fails("agentSession.get", {"sessionId": sid, "verbose": True})
            assert (error.code, error.kind) == (-32602, "invalid_params")
            assert "verbose" in str(error)


async def test_fencing_a_mutation_with_a_stale_expected_fence_fails_with_the_current_one(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with open_rpc(daemon.socket) as rpc:
            sid = (await create(rpc, tmp_path, start=False))["sessionId"]
            for method in ("start", "close", "delete", "send", "interrupt", "setOptions"):
                params: dict[str, Any] = {"sessionId": sid, "expectedFence": 7}
                if method == "send":
                    params["text"] = "hi"
                with pytest.raises(CallFailed) as failed:
                    await rpc.call(f"agentSession.{method}", params)
                assert (failed.value.code, failed.value.kind) == (-32003, "stale_fence"), method
                assert failed.value.data["currentFence"] == 0
                assert failed.value.data["retryable"] is False
            # None of the refusals touched the session.
            assert kinds(await history(rpc, sid)) == ["session.created"]
            # The right fence is accepted; each start takes the next one.
            started = await rpc.call("agentSession.start", {"sessionId": sid, "expectedFence": 0})
            assert started["session"]["fence"] == 1
            with pytest.raises(CallFailed) as failed:
                await rpc.call("agentSession.close", {"sessionId": sid, "expectedFence": 0})
            assert failed.value.data["currentFence"] == 1
            await rpc.call("agentSession.close", {"sessionId": sid, "expectedFence": 1})
            started = await rpc.call("agentSession.start", {"sessionId": sid, "expectedFence": 1})
            assert started["session"]["fence"] == 2
            await rpc.call("agentSession.delete", {"sessionId": sid, "expectedFence": 2})


# ---- invariant 2: bounded, concurrent cleanup ----------------------------------------

SHORT_LADDER = (0.2, 0.3, 1.0)  # eof grace, term grace, kill wait (seconds)
# A ladder whose SIGTERM rung comes quickly and whose wait after it is only a hang guard:
# the barrier agents below end themselves once every one of them got its SIGTERM.
BARRIER_LADDER = (0.2, 120.0, 1.0)  # eof grace, term grace, kill wait (seconds)


async def test_bounded_cleanup_closing_200_sessions_takes_about_one_ladder(
    tmp_path: Path,
) -> None:
    """200 agents that ignore stdin EOF: each close must walk the ladder to SIGTERM.
    Concurrent closes run all 200 ladders at once, which is counted, not timed: an
    agent given SIGTERM records itself and exits (code ``BARRIER_EXIT_CODE``) only once
    all 200 have, so every agent exiting that way proves every ladder reached SIGTERM
    while every other agent was still alive. Closes run one after another would leave
    the first agent waiting out the term grace for a count that never comes, and its
    SIGKILL fails the test (or the hang guard does)."""
    count = 200
    barrier = tmp_path / "sigterm-barrier"
    barrier.mkdir()
    options = {"ignoreEof": True, "termBarrierDir": str(barrier), "termBarrierCount": count}
    tokens: list[str] = []
    with (
        trio.fail_after(240),
        ladder_config(*BARRIER_LADDER) as config,
        running_daemon(extra_args=["--config", str(config)]) as daemon,
    ):
        try:
            async with contextlib.AsyncExitStack() as stack:
                # MAX_IN_FLIGHT requests per connection: spread over a few connections.
                rpcs = [await stack.enter_async_context(open_rpc(daemon.socket)) for _ in range(5)]
                infos = await gather(
                    *(
                        partial(create, rpcs[i % len(rpcs)], tmp_path, options=options)
                        for i in range(count)
                    )
                )
                assert {info["phase"] for info in infos} == {"running"}
                db = daemon.state_dir / DATABASE_NAME
                tokens = [r[0] for r in db_rows(db, "SELECT token FROM leases")]
                assert len(token_carriers(tokens)) == count
                closed = await gather(
                    *(
                        partial(
                            rpcs[i % len(rpcs)].call,
                            "agentSession.close",
                            {"sessionId": info["sessionId"]},
                        )
                        for i, info in enumerate(infos)
                    )
                )
            assert token_carriers(tokens) == []
        finally:
            kill_carriers(tokens)
    assert len(list(barrier.iterdir())) == count  # every ladder sent its SIGTERM
    for result in closed:
        assert result["wasRunning"] is True
        # Not SIGKILLed: this agent saw all 200 SIGTERMs sent while it still ran.
        assert result["session"]["lastExit"]["returncode"] == BARRIER_EXIT_CODE, result


# ---- idempotent create ----------------------------------------------------------------


async def test_idempotent_mutations_create_replays_and_conflicts(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        op = f"create-{time.monotonic_ns()}"
        params = {"provider": "mock", "cwd": str(tmp_path), "start": False}
        async with open_rpc(daemon.socket) as rpc:
            before = len((await rpc.call("agentSession.list", {}))["sessions"])
            first = await rpc.call("agentSession.create", {**params, "clientOperationId": op})
        async with open_rpc(daemon.socket) as rpc:  # a retry after a reconnect
            again = await rpc.call("agentSession.create", {**params, "clientOperationId": op})
            assert again == first
            with pytest.raises(CallFailed) as failed:
                await rpc.call(
                    "agentSession.create", {**params, "title": "other", "clientOperationId": op}
                )
            assert failed.value.kind == "operation_conflict"
            listed = (await rpc.call("agentSession.list", {}))["sessions"]
            assert len(listed) == before + 1
