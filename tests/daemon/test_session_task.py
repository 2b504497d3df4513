"""The session task against a real store and real mock agent children, in process.

Named after DESIGN.md section 2: reap before release, bounded cleanup, fencing,
single owner; plus the misbehaving agents of the mock provider."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import attrs
import msgspec
import pytest
import trio

from agentsd import child as child_module
from agentsd import held_lease
from agentsd.cgroup import SessionCgroup
from agentsd.child import ChildSpec as ProcessSpec
from agentsd.config import Config, Ladder, ProviderConfig
from agentsd.holder_link import HolderLink
from agentsd.procfs import (
    ProcessTable,
    ProcScanFailed,
    ProcScanner,
    is_same_process,
    scan_processes,
)
from agentsd.providers import provider_registry
from agentsd.providers.base import Submission
from agentsd.providers.mock_agent import BARRIER_EXIT_CODE
from agentsd.session import Session
from agentsd.session_task import SessionTask
from agentsd.sink import Sink
from agentsd.store import leases as lease_rows
from agentsd.store import sessions as session_rows
from agentsd.store.journal import read_events
from agentsd.store.writer import Store, open_store
from agentsd.supervisor import Supervisor, open_supervisor
from agentsd_protocol.api.events import AgentError
from agentsd_protocol.errors import AgentExited, HandshakeTimeout, StorageUnavailable
from tests.polling import eventually

FAST_LADDER = Ladder(eof_grace_s=0.5, term_grace_s=0.5, kill_wait_s=1.0)


def make_config(**overrides: Any) -> Config:
    base: dict[str, Any] = {"ladder": FAST_LADDER, "handshake_timeout_s": 10.0}
    base.update(overrides)
    return Config(**base)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    async with open_store(tmp_path / "agentsd.db") as store:
        yield store


async def _supervisor(store: Store, tmp_path: Path, config: Config) -> Any:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True, mode=0o700)
    return open_supervisor(store, config, state, provider_registry())


HANG_GUARD_S = 60.0  # how long any test here may take on a loaded machine: not a claim


async def create(sup: Supervisor, cwd: Path, **options: Any) -> Session:
    return await sup.create(
        provider="mock", cwd=str(cwd), title=None, options=options, env={}, command=None
    )


async def journal(store: Store, session_id: str) -> list[tuple[int, str, dict[str, Any]]]:
    events, _ = await store.read(
        lambda conn: read_events(conn, session_id, after_seq=0, limit=10_000, max_bytes=1 << 30)
    )
    return [(e.seq, e.kind, msgspec.json.decode(e.body)) for e in events]


def token_carriers(token: str) -> list[int]:
    return [p.pid for p in scan_processes([token]).carrying(token)]


def assert_contiguous(events: list[tuple[int, str, dict[str, Any]]]) -> None:
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))


class StepCounter(trio.abc.Instrument):
    """Counts the steps (await points passed) of the session task and sets
    ``reached`` when the count hits ``target``, or once the agent is ready (after
    that the task itself waits, and only its children step)."""

    def __init__(self, session: Session, target: int) -> None:
        self.session = session
        self.target = target
        self.steps = 0
        self.reached = trio.Event()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("run_session"):
            self.steps += 1
            if self.steps >= self.target:
                self.reached.set()
        running = self.session.task
        if running is not None and running.ready.is_set():
            self.reached.set()


@pytest.mark.parametrize("holder", [False, True], ids=["own-child", "held"])
async def test_reap_before_release_under_cancellation_at_every_await_point(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, holder: bool
) -> None:
    """Stop the session task after 1, 2, 3, ... of its steps (lease, spawn, identity,
    handshake, serving, closing). Whenever ``open_lease``'s exit releases a lease,
    its child is already reaped, its process group is empty and nothing carries its
    token; and a lease under which a process was spawned, even one cancelled before
    its identity was recorded, is released with how that process was reaped. The
    same for an agent the holder spawned (``holder = true``), whose reap is the
    holder's."""
    checked: list[tuple[bool, list[int], list[int]]] = []
    spawned: set[str] = set()  # tokens of every process spawned
    original_spawn = child_module._spawn
    original_held_spawn = HolderLink.spawn
    original = lease_rows.lease_released

    async def recording_spawn(spec: ProcessSpec, cgroup: SessionCgroup | None) -> trio.Process:
        process = await original_spawn(spec, cgroup)
        spawned.add(spec.token)
        return process

    async def recording_held_spawn(link: HolderLink, agent_id: str, *args: Any, **kw: Any) -> Any:
        agent = await original_held_spawn(link, agent_id, *args, **kw)
        spawned.add(agent_id)
        return agent

    def checking_release(conn: Any, lease: Any, evidence: Any, *args: Any, **kwargs: Any) -> Any:
        ident = lease.identity
        alive = ident is not None and is_same_process(ident.pid, ident.start_time)
        group = [] if ident is None else [p.pid for p in scan_processes().group_members(ident.pgid)]
        checked.append((alive, group, token_carriers(lease.token)))
        if lease.token in spawned:
            assert evidence.returncode is not None or evidence.signal is not None, evidence
        else:
            assert ident is None and evidence.detail == "the agent was never started"
        return original(conn, lease, evidence, *args, **kwargs)

    monkeypatch.setattr(child_module, "_spawn", recording_spawn)
    monkeypatch.setattr(HolderLink, "spawn", recording_held_spawn)
    monkeypatch.setattr(lease_rows, "lease_released", checking_release)
    with trio.fail_after(240):
        async with await _supervisor(store, tmp_path, make_config(holder=holder)) as sup:
            session = await create(sup, tmp_path)
            target = 1
            reached_ready = 0
            while reached_ready < 3:
                counter = StepCounter(session, target)
                trio.lowlevel.add_instrument(counter)
                try:
                    async with trio.open_nursery() as nursery:

                        async def start() -> None:
                            # Stopped before ready: expected for early targets.
                            with contextlib.suppress(AgentExited):
                                await sup.start(session)

                        nursery.start_soon(start)
                        await counter.reached.wait()
                        task = session.task
                        if task is not None:
                            if task.ready.is_set():
                                reached_ready += 1
                            task.stop("requested")
                            await task.done.wait()
                finally:
                    trio.lowlevel.remove_instrument(counter)
                assert session.task is None
                assert session.phase == "stopped", (target, session.phase)
                assert session.lease is not None and not session.lease.held
                assert token_carriers(session.lease.token) == []
                target += 1
            assert target > 5
    assert len(spawned) > 5, "too few rounds spawned a child"
    for alive, group, carriers in checked:
        assert not alive and group == [] and carriers == []
    assert_contiguous(await journal(store, session.id))


async def test_fence_increments_durably_before_each_spawn(store: Store, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path)
            fences = []
            for _ in range(3):
                await sup.start(session)
                fences.append(session.fence)
                row = await store.read(lambda conn: session_rows.load_session(conn, session.id))
                assert row is not None and row.fence == session.fence
                await sup.close(session)
            assert fences == [1, 2, 3]
            kinds = [k for _, k, _ in await journal(store, session.id)]
            # lease.acquired always precedes child.spawned of the same start
            assert kinds.count("lease.acquired") == 3
            for i, kind in enumerate(kinds):
                if kind == "child.spawned":
                    assert "lease.acquired" in kinds[:i]


async def test_single_owner_start_twice_is_one_child(store: Store, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path)
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(sup.start, session)
            assert session.fence == 1
            kinds = [k for _, k, _ in await journal(store, session.id)]
            assert kinds.count("child.spawned") == 1


async def test_ignore_sigterm_is_killed_after_the_grace(store: Store, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path, ignoreSigterm=True, ignoreEof=True)
            await sup.start(session)
            assert session.lease is not None and session.lease.identity is not None
            identity = session.lease.identity
            assert await sup.close(session)
            assert session.last_exit is not None
            assert session.last_exit.signal == 9  # SIGKILL: SIGTERM was ignored
            assert not is_same_process(identity.pid, identity.start_time)


async def test_hang_handshake_is_cancelled_and_reaped(store: Store, tmp_path: Path) -> None:
    with trio.fail_after(60):
        config = make_config(handshake_timeout_s=1.0)
        async with await _supervisor(store, tmp_path, config) as sup:
            session = await create(sup, tmp_path, hangHandshake=True)
            with pytest.raises(HandshakeTimeout):
                await sup.start(session)
            assert session.phase == "stopped"
            assert session.error is not None and session.error.kind == "handshake_timeout"
            assert session.lease is not None and not session.lease.held
            assert token_carriers(session.lease.token) == []
            exited = [b for _, k, b in await journal(store, session.id) if k == "child.exited"]
            assert exited[-1]["cause"] == "failed"
            assert exited[-1]["error"]["kind"] == "handshake_timeout"


async def test_spawn_grandchild_is_found_by_token_and_ended(store: Store, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path, spawnGrandchild=True)
            await sup.start(session)
            assert session.lease is not None
            token = session.lease.token
            await eventually(lambda: len(token_carriers(token)) >= 2)  # agent + grandchild
            await sup.close(session)
            assert token_carriers(token) == []


async def test_unexpected_exit_is_journaled_and_next_start_works(
    store: Store, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path, crashAfterS=0.3)
            await sup.start(session)
            task = session.task
            assert task is not None
            await task.done.wait()
            assert session.phase == "stopped"
            assert session.last_exit is not None
            assert session.last_exit.cause == "unexpected"
            assert session.last_exit.returncode == 3
            assert session.lease is not None and not session.lease.held
            # The record is reused on every start; drop the crash option for the restart.
            session.row = attrs.evolve(session.row, options={})
            await sup.start(session)
            assert session.info().phase == "running"
            await sup.close(session)
            assert_contiguous(await journal(store, session.id))


async def test_invalid_output_is_reported_and_the_session_goes_on(
    store: Store, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path, invalidOutput=True)
            await sup.start(session)

            async def reported() -> bool:
                return any(k == "agent.error" for _, k, _ in await journal(store, session.id))

            await eventually(reported)
            assert session.info().phase == "running"
            await sup.close(session)


async def test_idle_agent_is_stopped_and_record_kept(store: Store, tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config(idle_timeout_s=0.5)) as sup:
            session = await create(sup, tmp_path)
            await sup.start(session)
            task = session.task
            assert task is not None
            await task.done.wait()
            assert session.last_exit is not None and session.last_exit.cause == "idle"
            assert session.id in sup.sessions


async def test_idle_stop_waits_while_a_silent_turn_runs(store: Store, tmp_path: Path) -> None:
    """A turn that streams nothing for longer than the idle timeout is not idleness;
    once it ended and the agent stays quiet, the idle stop comes."""
    config = make_config(idle_timeout_s=0.5)
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, config) as sup:
            session = await create(sup, tmp_path, chunks=2, chunkDelayS=1.5)
            await sup.start(session)
            task = session.task
            assert task is not None and task.adapter is not None
            await task.adapter.send(Submission(client_message_id="m1", text="hello"))
            await task.done.wait()
            assert session.last_exit is not None and session.last_exit.cause == "idle"
            outcomes = [
                b["outcome"]
                for _, k, b in await journal(store, session.id)
                if k == "turn.completed"
            ]
            assert outcomes == ["completed"]  # not cut short as "interrupted" by the stop


async def test_streamed_text_is_journaled_while_the_agent_is_quiet(
    store: Store, tmp_path: Path
) -> None:
    """Streamed text reaches the journal as an ``item.updated`` snapshot even when no
    later event would carry it: the agent pauses for long after its first chunk."""
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path, chunks=2, chunkDelayS=30, replyText="ab")
            await sup.start(session)
            task = session.task
            assert task is not None and task.adapter is not None
            await task.adapter.send(Submission(client_message_id="m1", text="hello"))

            async def snapshot_journaled() -> bool:
                return any(k == "item.updated" for _, k, _ in await journal(store, session.id))

            await eventually(snapshot_journaled)
            kinds = [k for _, k, _ in await journal(store, session.id)]
            assert "item.completed" not in kinds  # the snapshot came while it was quiet
            await sup.close(session)


async def test_shutdown_closes_every_session_concurrently(store: Store, tmp_path: Path) -> None:
    """Leaving the supervisor stops all sessions at once: about one ladder for all.

    Counted, not timed: each agent ignores stdin EOF, and on SIGTERM records itself and
    exits (``BARRIER_EXIT_CODE``) only once all ten have, so every agent ending that way
    proves all ten ladders reached SIGTERM while every agent still ran. Serial closes
    leave the first agent waiting out the term grace (a hang guard here) and SIGKILLed.
    """
    count = 10
    barrier = tmp_path / "sigterm-barrier"
    barrier.mkdir()
    config = make_config(ladder=Ladder(eof_grace_s=0.2, term_grace_s=60.0, kill_wait_s=1.0))
    tokens: list[str] = []
    with trio.fail_after(120):
        async with await _supervisor(store, tmp_path, config) as sup:
            sessions = [
                await create(
                    sup,
                    tmp_path,
                    ignoreEof=True,
                    termBarrierDir=str(barrier),
                    termBarrierCount=count,
                )
                for _ in range(count)
            ]
            async with trio.open_nursery() as nursery:
                for s in sessions:
                    nursery.start_soon(sup.start, s)
            tokens = [s.lease.token for s in sessions if s.lease is not None]
    assert len(list(barrier.iterdir())) == count
    for token in tokens:
        assert token_carriers(token) == []
    for s in sessions:
        assert s.phase == "stopped" and s.last_exit is not None
        assert s.last_exit.returncode == BARRIER_EXIT_CODE, s.last_exit
        assert s.last_exit.cause == "shutdown"


async def test_an_approval_does_not_outlive_its_turn(store: Store, tmp_path: Path) -> None:
    """Interrupting a turn that waits for an approval settles the approval as
    cancelled before the turn ends: nobody can answer a question the agent dropped."""
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path)
            await sup.start(session)
            task = session.task
            assert task is not None and task.adapter is not None
            await task.adapter.send(Submission(client_message_id="m1", text="please approve"))
            await eventually(lambda: session.status == "attention")
            assert await task.adapter.interrupt(session.conversation.turn_id)
            await eventually(lambda: not session.conversation.turn_open)
            assert session.status == "idle"
            kinds = [(k, b.get("decision")) for _, k, b in await journal(store, session.id)]
            resolved = kinds.index(("approval.resolved", "cancelled"))
            assert kinds.index(("turn.completed", None)) > resolved
            await sup.close(session)


async def test_configured_provider_env_and_command_reach_the_agent(
    store: Store, tmp_path: Path
) -> None:
    """``[providers.NAME]`` in the daemon's config: its env is given to every agent of
    that provider (under the session's own env), its command replaces the default."""
    marker = tmp_path / "started-by-config"
    command = [
        sys.executable,
        "-c",
        f"open({str(marker)!r}, 'w').close(); "
        "import runpy; runpy.run_module('agentsd.providers.mock_agent', run_name='__main__')",
    ]
    config = make_config(
        providers={"mock": ProviderConfig(command=command, env={"AGENTSD_TEST_MARK": "config"})}
    )
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, config) as sup:
            session = await create(sup, tmp_path)
            await sup.start(session)
            assert session.child is not None
            environ = await trio.Path(f"/proc/{session.child.pid}/environ").read_bytes()
            assert b"AGENTSD_TEST_MARK=config" in environ.split(b"\0")
            assert await trio.Path(marker).exists()
            await sup.close(session)


async def test_fencing_events_from_a_previous_child_are_not_journaled(
    store: Store, tmp_path: Path
) -> None:
    """A sink bound to an earlier (fence, generation) drops what it is given: only
    the current child may write to the journal (DESIGN.md invariant 3)."""
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path)
            await sup.start(session)
            first = session.lease
            assert first is not None
            stale = Sink(session, first, SessionTask())
            await sup.close(session)
            await sup.start(session)
            assert session.fence == first.fence + 1
            head = session.head_seq
            await stale.emit(AgentError(message="from the old child"))
            stale.delta("item-x", "old text")
            await stale.flush_snapshots()
            assert session.lease is not None
            current = Sink(session, session.lease, SessionTask())
            await current.emit(AgentError(message="from the current child"))
            events = await journal(store, session.id)
            assert [b["message"] for _, k, b in events if k == "agent.error"] == [
                "from the current child"
            ]
            assert events[-1][0] == head + 1
            await sup.close(session)


async def test_a_close_whose_end_cannot_be_recorded_says_so_and_the_next_close_settles_it(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk at the release: the agent is reaped, the lease stays held, and
    the client is told the storage failed (retryable), not that the exit is
    unproven. The next close, with space back, releases it."""
    original = lease_rows.lease_released

    def full_disk(*args: Any, **kwargs: Any) -> Any:
        raise StorageUnavailable("storage unavailable: disk full")

    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path)
            await sup.start(session)
            assert session.lease is not None
            token = session.lease.token
            monkeypatch.setattr(lease_rows, "lease_released", full_disk)
            with pytest.raises(StorageUnavailable) as refused:
                await sup.close(session)
            assert "could not be recorded" in refused.value.message
            assert refused.value.retryable
            assert token_carriers(token) == []  # reaped all the same
            assert session.phase == "exit-unproven"  # the lease is still held
            states = await store.read(
                lambda conn: conn.execute(
                    "SELECT state FROM leases WHERE session_id = ?", (session.id,)
                ).fetchall()
            )
            assert [state for (state,) in states] == ["live"]

            monkeypatch.setattr(lease_rows, "lease_released", original)
            assert await sup.close(session) is False  # nothing ran; the lease is settled
            assert session.info().phase == "stopped"
            kinds = [k for _, k, _ in await journal(store, session.id)]
            assert kinds.count("child.exited") == 1


def _refuse_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store refuses the child's identity, right after the spawn."""

    def full_disk(*args: Any, **kwargs: Any) -> Any:
        raise StorageUnavailable("storage unavailable: disk full")

    monkeypatch.setattr(lease_rows, "lease_live", full_disk)


async def test_reap_before_release_records_the_proof_of_an_agent_whose_identity_was_refused(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent was spawned and laddered although its identity never became
    durable: the release records how it was reaped, never that it never started."""
    _refuse_identity(monkeypatch)
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path)
            with pytest.raises(StorageUnavailable):
                await sup.start(session)
            assert session.phase == "stopped"
            lease = await store.read(lambda conn: lease_rows.latest_lease(conn, session.id))
            assert lease is not None and not lease.held and lease.death is not None
            assert "never started" not in lease.death.detail
            assert lease.death.returncode == 0  # it exited on stdin EOF, and was reaped
            assert token_carriers(lease.token) == []
            [exited] = [b for _, k, b in await journal(store, session.id) if k == "child.exited"]
            assert exited["returncode"] == 0 and exited.get("signal") is None
            assert exited["error"]["kind"] == "storage_unavailable"


async def test_reap_before_release_keeps_the_lease_of_an_unidentified_agent_not_proven_gone(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spawned agent whose identity was refused and whose end cannot be proven (no
    /proc scan finishes) keeps its lease held; a later close proves it and releases."""

    async def broken_scan(self: ProcScanner, tokens: Iterable[str] = ()) -> ProcessTable:
        await trio.lowlevel.checkpoint()
        raise ProcScanFailed("no /proc here")

    _refuse_identity(monkeypatch)
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path)
            with monkeypatch.context() as scans:
                scans.setattr(ProcScanner, "scan", broken_scan)
                with pytest.raises(StorageUnavailable):
                    await sup.start(session)
                assert session.phase == "exit-unproven"
                assert session.lease is not None and session.lease.held
                kinds = [k for _, k, _ in await journal(store, session.id)]
                assert "exit.unproven" in kinds and "child.exited" not in kinds
            assert await sup.close(session) is False
            assert session.info().phase == "stopped"
            assert session.lease is not None and not session.lease.held
            kinds = [k for _, k, _ in await journal(store, session.id)]
            assert kinds[-2:] == ["child.exited", "lease.released"]


async def test_exit_is_seen_when_the_agent_exits_while_a_background_child_holds_its_stdout(
    store: Store, tmp_path: Path
) -> None:
    """The agent crashes; a process it started keeps its stdout open, so its output
    never ends by itself. The session task learns the exit from the process, ends
    what it left running, and records the crash as it was: ``unexpected``, with
    its status. A later close finds nothing to do and changes nothing."""
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path, crashAfterS=0.5, holdPipes=True)
            await sup.start(session)
            task = session.task
            assert task is not None and session.lease is not None
            token = session.lease.token
            await eventually(lambda: len(token_carriers(token)) >= 2)  # agent + its child
            await task.done.wait()
            assert session.phase == "stopped"
            assert session.last_exit is not None
            assert session.last_exit.cause == "unexpected"
            assert session.last_exit.returncode == 3
            assert session.lease is not None and not session.lease.held
            assert token_carriers(token) == []
            assert not await sup.close(session)
            assert session.last_exit.cause == "unexpected"
            exited = [b for _, k, b in await journal(store, session.id) if k == "child.exited"]
            assert exited == [
                {
                    "cause": "unexpected",
                    "returncode": 3,
                    "detail": "1 stragglers killed",
                }
            ]
            # Nothing stays wedged: the next start runs a fresh agent.
            session.row = attrs.evolve(session.row, options={})
            await sup.start(session)
            assert session.info().phase == "running"
            await sup.close(session)
            assert_contiguous(await journal(store, session.id))


async def test_exit_is_seen_when_the_agent_exits_during_its_handshake_holding_its_stdout(
    store: Store, tmp_path: Path
) -> None:
    """The same crash before the handshake completed fails the start with
    ``agent_exited`` at once, not ``handshake_timeout`` when the deadline expires.
    The deadline lies past the hang guard, so only the exit can end the start."""
    with trio.fail_after(HANG_GUARD_S):
        config = make_config(handshake_timeout_s=2 * HANG_GUARD_S)
        async with await _supervisor(store, tmp_path, config) as sup:
            session = await create(
                sup, tmp_path, crashAfterS=0.2, holdPipes=True, hangHandshake=True
            )
            with pytest.raises(AgentExited):
                await sup.start(session)
            assert session.phase == "stopped"
            assert session.last_exit is not None and session.last_exit.returncode == 3
            assert session.lease is not None and token_carriers(session.lease.token) == []


async def test_slow_storage_fails_a_start_as_storage_unavailable_and_leaves_no_reservation(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acquisition commits only after its bound: the start is told
    ``storage_unavailable`` at the bound, and the reservation that committed late
    is withdrawn, so the next start works."""
    bound_s = 0.5
    slow = [True]
    late = threading.Event()  # set by the test once the start was refused
    committed: list[bool] = []
    original = lease_rows.acquire_lease

    def slow_acquire(*args: Any, **kwargs: Any) -> Any:
        if slow[0]:
            # In the writer's thread: the commit waits until the start was refused,
            # however long the bound took to expire on a loaded machine.
            assert late.wait(HANG_GUARD_S)
        result = original(*args, **kwargs)
        committed.append(True)
        return result

    monkeypatch.setattr(held_lease, "SETTLE_TIMEOUT_S", bound_s)
    monkeypatch.setattr(lease_rows, "acquire_lease", slow_acquire)
    with trio.fail_after(60):
        async with await _supervisor(store, tmp_path, make_config()) as sup:
            session = await create(sup, tmp_path)
            with pytest.raises(StorageUnavailable, match="storage too slow"):
                await sup.start(session)
            assert committed == []  # refused at the bound, not once the commit came
            late.set()
            task = session.task
            assert task is not None
            await task.done.wait()
            held = await store.read(lambda conn: lease_rows.load_held_leases(conn))
            assert held == []
            assert session.lease is not None and session.lease.state.value == "released"
            assert session.error is not None and session.error.kind == "storage_unavailable"
            slow[0] = False
            await sup.start(session)
            assert session.info().phase == "running"
            await sup.close(session)
            kinds = [k for _, k, _ in await journal(store, session.id)]
            assert kinds.count("lease.acquired") == 2 and kinds.count("lease.released") == 2
