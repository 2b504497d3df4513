"""The supervisor: owner of the session registry and the session nursery.

Rule 1: every session task runs in the supervisor's nursery; nothing else spawns
agent children. Leaving ``open_supervisor`` stops every session concurrently (cause
``shutdown``) and returns only when every child was reaped and every lease settled.

Rule 2: the supervisor is not on the way of a session's events. It binds each
session it registers to its journal port (``agentsd.session_journal``), through
which the handlers, the session task and the provider sink write, commit first and
publish after; and it shares one status board among them (``agentsd.status_board``).

Rule 3: ``start`` and ``delete`` take the session's lock to check-and-act; waiting
for an agent to become ready or to be reaped happens outside it, so a close is never
stuck behind a slow start.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import msgspec
import trio

from agentsd.agent_env import AgentEnvironment
from agentsd.attachments import BlobStore
from agentsd.cgroup import FALLBACK, Containment
from agentsd.config import Config, Limits
from agentsd.drain import TurnGate
from agentsd.feed import Feed
from agentsd.held_lease import recorded_identity, settle
from agentsd.holder_link import HolderKeeper, open_holder_keeper
from agentsd.leftovers import EndOutcome, end_contained, reap_own_zombie
from agentsd.operations import Operation, record_provisional
from agentsd.procfs import current_scanner
from agentsd.prompt_queue import derive_queue
from agentsd.providers.base import Provider
from agentsd.recovery import Reattachable
from agentsd.runner import run_session
from agentsd.session import Session, derive_conversation
from agentsd.session_journal import SessionJournal
from agentsd.session_task import SessionTask
from agentsd.status_board import StatusBoard
from agentsd.stderr_log import remove_log
from agentsd.store import leases as lease_rows
from agentsd.store import sessions as session_rows
from agentsd.store.database import StoreConnection
from agentsd.store.journal import StoredEvent
from agentsd.store.writer import Store
from agentsd.summary import derive_summary
from agentsd_protocol.api.daemon import SessionCounts
from agentsd_protocol.api.events import QueuePaused, SessionCreated
from agentsd_protocol.api.session import ExitCause, ExitInfo, SessionError, SessionInfo
from agentsd_protocol.errors import (
    ConversationInUse,
    CwdNotDirectory,
    CwdNotFound,
    ExitUnproven,
    InvalidParams,
    InvalidState,
    LimitUnavailable,
    SessionNotFound,
    StaleFence,
    StorageUnavailable,
    UnknownProvider,
)

log = logging.getLogger(__name__)

HOST_ID_FILE = "host-id"
# How long a handover waits for each reader to reach a frame boundary: the frame it
# handles may be waiting for a commit, which slow storage bounds at 10 s.
HANDOVER_TIMEOUT_S = 15.0


class Supervisor:
    def __init__(
        self,
        store: Store,
        config: Config,
        state_dir: Path,
        providers: dict[str, Provider],
        nursery: trio.Nursery,
        agent_env: AgentEnvironment,
        containment: Containment = FALLBACK,
        holder: HolderKeeper | None = None,
    ) -> None:
        self.store = store
        self.holder = holder  # agents are spawned through it when set (config ``holder``)
        self.containment = containment
        self.config = config
        self.agent_env = agent_env
        self.state_dir = state_dir
        self.ladder = config.ladder
        self.feed = Feed()
        self.board = StatusBoard()
        self.gate = TurnGate()  # closed while a drained restart waits (agentsd.drain)
        self.continuing: set[str] = set()  # continuations being journaled (handlers.continuity)
        self.sessions: dict[str, Session] = {}
        self._providers = providers
        self._nursery = nursery
        self.host_id = _host_id(state_dir)
        self.blobs = BlobStore(state_dir / "blobs")

    # ---- lookup -------------------------------------------------------------------

    def provider(self, name: str) -> Provider:
        try:
            return self._providers[name]
        except KeyError:
            known = ", ".join(sorted(self._providers))
            raise UnknownProvider(f"unknown provider {name!r} (known: {known})") from None

    @property
    def provider_names(self) -> list[str]:
        return sorted(self._providers)

    def get(self, session_id: str, expected_fence: int | None = None) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise SessionNotFound(f"no session {session_id!r}", sessionId=session_id)
        if expected_fence is not None and expected_fence != session.fence:
            raise StaleFence(
                f"session {session_id} is at fence {session.fence}, not {expected_fence}",
                currentFence=session.fence,
            )
        return session

    def check_cwd(self, cwd: str) -> str:
        """``cwd``, if an agent may run there: an absolute path to a directory that does
        not resolve (symlinks and ``..`` followed) into the state directory. Checked at
        create and again at every start: a directory can be swapped for a symlink in
        between. Raises ``InvalidParams``, ``CwdNotFound`` or ``CwdNotDirectory``."""
        if not os.path.isabs(cwd):
            raise InvalidParams(f"Invalid params: cwd must be an absolute path, got {cwd!r}")
        if "\0" in cwd:  # os.stat would raise ValueError, an internal error
            raise InvalidParams("Invalid params: cwd must not contain a NUL character")
        try:
            st = os.stat(cwd)
        except FileNotFoundError:
            raise CwdNotFound(f"cwd {cwd} does not exist", cwd=cwd) from None
        except OSError as exc:
            raise CwdNotFound(f"cwd {cwd} cannot be used: {exc.strerror}", cwd=cwd) from None
        if not stat.S_ISDIR(st.st_mode):
            raise CwdNotDirectory(f"cwd {cwd} is not a directory", cwd=cwd)
        real = Path(cwd).resolve()
        state = self.state_dir.resolve()
        if real == state or state in real.parents:
            raise InvalidParams(
                "Invalid params: cwd must not be inside the daemon's state directory"
            )
        return cwd

    def stderr_path(self, session_id: str) -> Path:
        return self.state_dir / "logs" / f"{session_id}.stderr.log"

    def counts(self) -> SessionCounts:
        sessions = self.sessions.values()
        return SessionCounts(
            total=len(self.sessions),
            running=sum(1 for s in sessions if s.phase == "running"),
            working=sum(1 for s in sessions if s.status == "working"),
            attention=sum(1 for s in sessions if s.status == "attention"),
        )

    # ---- lifecycle ----------------------------------------------------------------

    async def load(self) -> None:
        """Load every session (after recovery settled the previous daemon's leases),
        and pause every queue that holds prompts: they are sent again only when a
        client resumes them (``agentsd.prompt_queue`` Rule 3)."""
        rows = await self.store.read(session_rows.load_sessions)
        for row in rows:
            convo = await self.store.read(functools.partial(derive_conversation, session_id=row.id))
            queue = await self.store.read(functools.partial(derive_queue, session_id=row.id))
            summary = await self.store.read(functools.partial(derive_summary, session_id=row.id))
            lease = await self.store.read(
                functools.partial(lease_rows.latest_lease, session_id=row.id)
            )
            # A lease still held (its exit unproven) makes the session exit-unproven.
            session = self._bound(
                Session(
                    row=row,
                    head_seq=row.head_seq,
                    board=self.board,
                    conversation=convo,
                    queue=queue,
                    summary=summary,
                    lease=lease,
                )
            )
            if row.last_exit is not None:
                session.last_exit = msgspec.convert(row.last_exit, ExitInfo)
            if row.error is not None:
                session.error = msgspec.convert(row.error, SessionError)
            self.sessions[row.id] = session
            if queue.prompts and queue.paused is None:
                await session.journal.append([QueuePaused(reason="daemon-restart")])

    async def create(
        self,
        *,
        provider: str,
        cwd: str,
        title: str | None,
        options: dict[str, Any],
        env: dict[str, str],
        command: list[str] | None,
        limits: dict[str, Any] | None = None,
        created_by: str | None = None,
        operation: Operation | None = None,
        provisional: Callable[[SessionInfo], Any] | None = None,
        resume_from: str | None = None,
    ) -> Session:
        """Insert the record and its ``session.created`` event; with ``operation``,
        the ledger's provisional entry commits in the same transaction, so a retry
        after a crash finds this session instead of creating another. ``limits`` are
        the session's own (``SessionLimits`` as the wire spells it); ``created_by``
        is the session whose agent asks (None: the user). With ``resume_from`` the
        session adopts that provider conversation: it is the handle its first start
        resumes (``runner``: an adoption). Raises ``LimitUnavailable``, with nothing
        stored, if its limits cannot be applied."""
        self.provider(provider)
        now = time.time()
        row = session_rows.SessionRow(
            id=uuid.uuid4().hex[:12],
            host_id=self.host_id,
            provider=provider,
            cwd=cwd,
            title=title,
            options=options,
            env=env,
            command=command,
            provider_handle=resume_from,
            created_at=now,
            updated_at=now,
            limits=limits,
            created_by=created_by,
        )
        created = SessionCreated(
            provider=provider, cwd=cwd, title=title, by=created_by, resume_from=resume_from
        )
        session = self._bound(Session(row=row, head_seq=0, board=self.board))
        await self.check_limits(session)

        def insert(conn: StoreConnection) -> tuple[None, list[StoredEvent]]:
            if resume_from is not None:
                # In the writer's transaction: two creates adopting one
                # conversation at once cannot both pass.
                holder = session_rows.holder_of(conn, resume_from)
                if holder is not None:
                    raise ConversationInUse(
                        f"conversation {resume_from} is held by session {holder}",
                        sessionId=holder,
                    )
            stored = session_rows.insert_session(conn, row, [created])
            if operation is not None and provisional is not None:
                info = attrs.evolve(session, head_seq=stored[-1].seq).info()
                record_provisional(conn, operation, provisional(info))
            return None, stored

        await session.journal.write(insert)
        self.sessions[row.id] = session
        return session

    def _bound(self, session: Session) -> Session:
        """``session``, bound to its journal port."""
        session.journal = SessionJournal(session, self.store, self.feed)
        return session

    def limits(self, session: Session) -> Limits:
        """What each agent of ``session`` may use: its own limits over the config's."""
        return self.config.limits.under(session.own_limits())

    async def check_limits(self, session: Session) -> None:
        """Raise ``LimitUnavailable`` if the session's limits cannot be applied to
        an agent: no cgroup, or a controller they need is not enabled."""
        limits = self.limits(session)
        wanted = limits.controllers()
        if not wanted:
            return
        root = self.containment.root
        if root is None:
            raise LimitUnavailable(
                f"limits on {', '.join(wanted)} need a cgroup per agent, and the daemon "
                f"runs without one ({self.containment.detail})",
                controllers=wanted,
            )
        missing = await trio.to_thread.run_sync(root.missing_controllers, limits)
        if missing:
            raise LimitUnavailable(
                f"limits on {', '.join(missing)} cannot be applied: the "
                f"{'controller is' if len(missing) == 1 else 'controllers are'} not enabled "
                f"in {root.path}/cgroup.subtree_control",
                controllers=missing,
            )

    async def start(self, session: Session) -> None:
        """Start the session's agent unless it runs; return once it is ready.

        Raises the start failure (``AgentNotFound``, ``HandshakeTimeout``, ...),
        ``ExitUnproven`` when a previous child still cannot be proven gone, and
        ``InvalidState`` while the session is being deleted, ``SessionNotFound`` once
        it was (a request that looked it up before the delete completed).
        """
        async with session.lock:
            if session.deleting:
                if self.sessions.get(session.id) is not session:
                    raise SessionNotFound(f"no session {session.id!r}", sessionId=session.id)
                raise InvalidState(f"session {session.id} is being deleted")
            task = session.task
            if task is None:
                if session.phase == "exit-unproven":
                    await self._retry_unproven(session)
                self.check_cwd(session.row.cwd)
                await self.check_limits(session)
                task = SessionTask()
                session.task = task
                self._nursery.start_soon(run_session, self, session, task)
        await task.ready.wait()
        if task.start_error is not None:
            raise task.start_error

    async def close(self, session: Session, cause: ExitCause = "requested") -> bool:
        """Stop the agent and wait until it is reaped and its lease settled.

        Returns whether an agent was running. Raises ``ExitUnproven`` when its exit
        cannot be proven, and ``StorageUnavailable`` when its end could not be
        recorded (either way the lease stays held; a later close retries).
        """
        task = session.task
        if task is None:
            if session.phase == "exit-unproven":
                async with session.lock:
                    await self._retry_unproven(session)
            return False
        task.stop(cause)
        await task.done.wait()
        settle_error = None if task.held is None else task.held.settle_error
        if settle_error is not None:
            raise StorageUnavailable(
                f"the end of the agent of session {session.id} could not be recorded "
                f"({settle_error.message}); close again to retry"
            )
        if session.phase == "exit-unproven":
            raise ExitUnproven(
                f"the agent of session {session.id} could not be proven gone; close again to retry"
            )
        return True

    async def delete(self, session: Session) -> None:
        async with session.lock:
            session.deleting = True
        try:
            await self.close(session)
            if session.task is not None:
                raise InvalidState(f"session {session.id} was started again while being deleted")
            await self.store.write(lambda conn: session_rows.delete_session(conn, session.id))
        except BaseException:
            session.deleting = False
            raise
        self.sessions.pop(session.id, None)
        try:
            await trio.to_thread.run_sync(remove_log, self.stderr_path(session.id))
        except OSError as exc:
            log.warning("could not remove the stderr log of session %s: %s", session.id, exc)
        await trio.to_thread.run_sync(self.blobs.drop, session.id)
        self.feed.end_session(session.id, "deleted")
        self.board.deleted(session)

    async def _retry_unproven(self, session: Session) -> None:
        """End what may remain of the child of the session's held lease and settle
        the lease through the one settle path. Raises ``ExitUnproven`` while its
        exit still cannot be proven (nothing is journaled again), and what the
        store raises."""
        lease = session.lease
        if lease is None or not lease.held:
            session.transition("stopped")
            return
        identity = recorded_identity(lease)
        report = await end_contained(
            [identity], self.ladder, current_scanner(), self.containment.root, sweep=False
        )
        outcome = report.outcomes.get(identity, EndOutcome.UNPROVEN)
        if outcome is EndOutcome.UNPROVEN:
            raise ExitUnproven(f"the agent of session {session.id} still cannot be proven gone")
        reap_own_zombie(identity)
        await settle(session, session.journal.write, "requested", outcome)

    @property
    def reattaches(self) -> bool:
        """Whether agents are held so that a later daemon can take them over
        (``holder = true``, ``crash_policy = "reattach"``)."""
        return self.holder is not None and self.config.crash_policy == "reattach"

    async def reattach(self, reattachable: Sequence[Reattachable]) -> list[str]:
        """Take over what recovery kept (``agentsd.takeover``), all at once;
        return once each was taken over or ended: the ids of the sessions whose
        agent now runs under this daemon."""
        tasks: list[tuple[Session, SessionTask]] = []
        for kept in reattachable:
            session = self.sessions.get(kept.lease.session_id)
            if session is None:  # leases cascade with their session: cannot happen
                continue
            task = SessionTask()
            session.task = task
            self._nursery.start_soon(run_session, self, session, task, kept)
            tasks.append((session, task))
        taken = []
        for session, task in tasks:
            await task.ready.wait()
            if task.start_error is None:
                taken.append(session.id)
            else:
                log.warning(
                    "session %s: its agent was not taken over: %s",
                    session.id,
                    task.start_error.message,
                )
        return taken

    def stop_all(self, cause: ExitCause) -> None:
        for session in self.sessions.values():
            if session.task is not None:
                session.task.stop(cause)

    async def hand_over_all(self, timeout_s: float = HANDOVER_TIMEOUT_S) -> int:
        """A planned restart with the holder (``agentsd.session_task`` Rule 2): leave every
        served agent running in the holder for the next image; how many were.
        Returns once each handover finished or ``timeout_s`` passed; what was not
        handed over by then (a session still starting, a reader that never reached a
        boundary) is stopped by the caller's ``stop_all``, as in a shutdown. Without
        the holder, or under ``crash_policy = "end"`` (the next image would end what
        it was handed), nothing is handed over (0)."""
        if not self.reattaches:
            return 0
        tasks = [
            session.task
            for session in self.sessions.values()
            if session.task is not None and session.task.hand_over()
        ]
        with trio.move_on_after(timeout_s):
            for task in tasks:
                await task.done.wait()
        return sum(1 for task in tasks if task.handed_over)


def _host_id(state_dir: Path) -> str:
    path = state_dir / HOST_ID_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        host_id = uuid.uuid4().hex
        path.write_text(host_id + "\n")
        return host_id


@asynccontextmanager
async def open_supervisor(
    store: Store,
    config: Config,
    state_dir: Path,
    providers: dict[str, Provider],
    agent_env: AgentEnvironment | None = None,
    containment: Containment = FALLBACK,
    holder: HolderKeeper | None = None,
) -> AsyncIterator[Supervisor]:
    """Yield a loaded supervisor. On exit every session is stopped concurrently
    (cause ``shutdown``); returns once every child was reaped and lease settled.
    Agents start with ``agent_env`` (default: the daemon's own environment); with
    the config's ``holder``, through ``holder`` (default: a keeper of its own)."""
    (state_dir / "logs").mkdir(mode=0o700, exist_ok=True)
    if agent_env is None:
        agent_env = AgentEnvironment(config, "inherit")
    async with AsyncExitStack() as stack:
        if config.holder and holder is None:
            # Outside the sessions' nursery: it outlasts their ladders.
            holder = await stack.enter_async_context(open_holder_keeper(state_dir))
        async with trio.open_nursery() as nursery:
            supervisor = Supervisor(
                store, config, state_dir, providers, nursery, agent_env, containment, holder
            )
            await supervisor.load()
            try:
                yield supervisor
            finally:
                supervisor.stop_all("shutdown")
