"""The daemon's life: lock, store, recovery, listen, serve, then close everything.

Rule 1: nothing is served before recovery finished (DESIGN.md invariant 5): the
socket is bound only after the previous daemon's children were dealt with.

Rule 2: shutdown is cancellation. SIGTERM, SIGINT and ``daemon.shutdown`` cancel the
serving scope; connections end, then every session closes concurrently, then the
socket file is removed (if it is still ours) and the lock released.

Rule 5: the socket is the daemon's to keep (``agentsd.socket_keeper``): removed,
replaced, or its directory created again, it is bound again within seconds, while
connections already open go on being served.

Rule 3: SIGHUP means what it means to the one who can send it. A daemon with no
controlling terminal (``systemctl --user kill -s HUP agentsd``, ``agentsctl``
autostart, ``setsid``) takes it as "reload": it captures the agents' environment
again, as
``daemon.reloadEnv`` does. A daemon run in a terminal gets SIGHUP when that terminal
hangs up, and shuts down as for SIGTERM.

Rule 7: with the holder (config ``holder``) a holder left running is attached
before recovery; under ``crash_policy = "reattach"`` recovery hands the agents it
kept to the supervisor, which takes each over (``agentsd.takeover``) before
anything is served, and what it did not take is given up to the holder after.

Rule 4: the first capture of the agents' environment (``agentsd.agent_env``) runs
beside recovery and serving, never before them: a login shell that hangs delays
the first agent start, by at most its bound, and nothing else.

Rule 6: a restart (``daemon.restart``) is a shutdown that says ``RELOADING=1``
instead of ``STOPPING=1``, and in which, when the holder keeps the agents for the
next image to take over (``crash_policy = "reattach"``), every
served agent is handed over (``agentsd.session_task`` Rule 2) instead of closed: the
caller then executes the new image in this process (``agentsd.reexec``), which says
``READY=1`` once it serves. Without the holder the agents are closed, as in a
shutdown: they end, and the next send resumes each conversation natively. SIGTERM
or SIGINT meanwhile turns the restart into a stop: no new image, what is not
handed over yet is closed, and what was handed over already is ended after (cause
``shutdown``), as recovery under ``crash_policy = "end"`` ends a previous daemon's
agents. A SIGTERM after that point (the store and the holder link closing, or the
instant before the exec) leaves what was handed over to the holder: under systemd
the unit's ``ExecStopPost=`` ends it (``agentsd.holder_scope`` Rule 4); run by hand,
the next daemon to start takes it over.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import attrs
import trio

from agentsd.agent_env import AgentEnvironment, resolve_mode
from agentsd.app import App
from agentsd.caller import UNIDENTIFIED, Caller, identify_peer
from agentsd.cgroup import select_containment, with_controllers
from agentsd.config import Config
from agentsd.connection import Connection, Transport
from agentsd.holder_link import HolderKeeper, HolderLink, HolderLost, open_holder_keeper
from agentsd.holder_link import socket_path as holder_socket_path
from agentsd.holder_scope import HolderScope, holder_scope
from agentsd.listener import (
    TRANSIENT_ACCEPT_ERRNOS,
    SocketTransport,
    peer_credentials,
    peer_pidfd,
)
from agentsd.operations import Ledger
from agentsd.paths import StateLock, ensure_private_dir
from agentsd.providers import provider_registry
from agentsd.recovery import reconcile, recover
from agentsd.resources import run_sampler
from agentsd.socket_keeper import SocketHandover, serve_kept_socket
from agentsd.store.writer import open_store
from agentsd.supervisor import open_supervisor
from agentsd.systemd import (
    InheritedSocket,
    Notifier,
    listen_fds,
    run_watchdog,
    watchdog_interval_s,
)

log = logging.getLogger(__name__)

DATABASE_NAME = "agentsd.db"
SOCKET_UNIT_NAME = "agentsd.socket"  # LISTEN_FDNAMES entry of systemd/agentsd.socket
FORGET_WAIT_S = 5.0  # Rule 6: the holder's reports of the handed-over agents' ends
STATUS_INTERVAL_S = 5.0  # how stale `systemctl status` may be
MAX_CONNECTIONS = 4096  # each costs a few KiB; far beyond any real set of clients
ACCEPT_RETRY_S = 0.1  # back off when out of file descriptors, as trio's serve_listeners does


@attrs.frozen
class ServiceManager:
    """What systemd handed us (all empty when not run by systemd)."""

    notifier: Notifier = attrs.field(factory=lambda: Notifier.from_env({}))
    inherited: list[InheritedSocket] = attrs.field(factory=list)
    watchdog_s: float | None = None
    # The variables as systemd set them (the notify socket, the passed fds' names),
    # removed from our environment once read: a restart in place gives them back.
    variables: dict[str, str] = attrs.field(factory=dict)
    # The listener this daemon binds itself, when there is no inherited one: what
    # the previous image handed over, and what this one hands to the next.
    kept: SocketHandover = attrs.field(factory=SocketHandover)

    @classmethod
    def from_env(cls, socket_path: Path | None = None) -> ServiceManager:
        """Read and consume the systemd environment, and the listener on
        ``socket_path`` a previous image handed over (``agentsd.socket_keeper``
        Rule 5); ``SystemdEnvError`` if malformed."""
        variables = {
            name: os.environ[name]
            for name in ("NOTIFY_SOCKET", "LISTEN_FDNAMES")
            if name in os.environ
        }
        notifier = Notifier.from_env()
        inherited = listen_fds()
        kept = SocketHandover() if socket_path is None else SocketHandover.adopt(socket_path)
        if inherited and kept.sock is not None:  # the service manager's socket wins
            kept.sock.close()
            kept = SocketHandover()
        return cls(
            notifier=notifier,
            inherited=inherited,
            watchdog_s=watchdog_interval_s(),
            variables=variables,
            kept=kept,
        )

    @property
    def active(self) -> bool:
        """Whether a service manager runs the daemon."""
        return self.notifier.active or bool(self.inherited)

    def image_env(self) -> dict[str, str]:
        """The environment of the next image of this process (``agentsd.reexec``):
        ours, with systemd's variables as they describe this process (the same pid
        keeps the same descriptors)."""
        env = {**os.environ, **self.kept.env()}
        if "NOTIFY_SOCKET" in self.variables:
            env["NOTIFY_SOCKET"] = self.variables["NOTIFY_SOCKET"]
        if self.inherited:
            env["LISTEN_PID"] = str(os.getpid())
            env["LISTEN_FDS"] = str(len(self.inherited))
            if "LISTEN_FDNAMES" in self.variables:
                env["LISTEN_FDNAMES"] = self.variables["LISTEN_FDNAMES"]
        return env

    def kept_fds(self) -> list[int]:
        """What the next image inherits besides stdio: the passed sockets, or the
        one this daemon bound and still listens on."""
        kept = [] if self.kept.sock is None else [self.kept.sock.fileno()]
        return [inherited.fd for inherited in self.inherited] + kept

    def listener(self) -> socket.socket | None:
        for inherited in self.inherited:
            if inherited.name in (SOCKET_UNIT_NAME, "unknown"):
                return inherited.sock
        return None


async def serve_daemon(
    config: Config,
    *,
    socket_path: Path,
    state_dir: Path,
    service: ServiceManager | None = None,
    image_args: list[str] | None = None,
    task_status: trio.TaskStatus[App] = trio.TASK_STATUS_IGNORED,
) -> bool:
    """Run the daemon until shutdown is requested. ``task_status.started(app)`` is
    called once the socket accepts connections (and systemd is told READY=1).
    Returns whether a restart was asked for (``daemon.restart``): the caller starts
    the daemon again (``agentsd.main``) with ``image_args``, which a restart first
    checks the new code with (``agentsd.reexec.preflight``; None: no check)."""
    service = service or ServiceManager()
    ensure_private_dir(state_dir)
    lock = StateLock(state_dir, socket_path)
    lock.acquire()
    try:
        mode = resolve_mode(config.agent_env, under_service_manager=service.active)
        # Once, and before any agent: under systemd this moves the daemon into a leaf.
        containment = await trio.to_thread.run_sync(
            select_containment, config.cgroup_root, dict(os.environ)
        )
        log.info("agent containment: %s (%s)", containment.mode, containment.detail)
        app = App(
            config,
            socket_path=socket_path,
            state_dir=state_dir,
            agent_env=AgentEnvironment(config, mode),
            containment=containment,
        )
        app.under_service_manager = service.active
        app.image_args = image_args
        service.kept.wanted = lambda: app.restart_requested
        hangup_reloads = not has_controlling_terminal()
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
            async with trio.open_nursery() as root:
                root.start_soon(app.agent_env.snapshot)  # Rule 4
                root.start_soon(
                    _watch_signals, signals, app, service.notifier, root, hangup_reloads
                )
                await _serve_sessions(app, service, task_status)
                root.cancel_scope.cancel()
        log.info("agentsd stopped" + ("; restarting" if app.restart_requested else ""))
    finally:
        lock.release()
    return app.restart_requested


async def _serve_sessions(
    app: App, service: ServiceManager, task_status: trio.TaskStatus[App]
) -> None:
    config = app.config
    async with (
        open_store(app.state_dir / DATABASE_NAME) as store,
        _open_holder(app) as holder,
    ):
        # Rule 1: the previous daemon's children are dealt with before anything is
        # served; with the holder and crash_policy "reattach", those it kept are
        # taken over instead (Rule 7), also before.
        link = None if holder is None else holder.current()
        found = link.found if link is not None and config.crash_policy == "reattach" else None
        async with _left_holder(app, holder) as left:
            recovered = await recover(
                store, config.ladder, app.containment.root, holder_found=found
            )
            await _dismiss(left)
        providers = provider_registry(config.agents)
        async with open_supervisor(
            store, config, app.state_dir, providers, app.agent_env, app.containment, holder
        ) as supervisor:
            if recovered.reattachable:
                started = trio.current_time()
                reattached = await supervisor.reattach(recovered.reattachable)
                log.info(
                    "took over %d of %d agents the holder kept, in %.2f s",
                    len(reattached),
                    len(recovered.reattachable),
                    trio.current_time() - started,
                )
            else:
                reattached = []
            if holder is not None:
                holder.claimed()
            app.recovery = reconcile(recovered, supervisor.sessions.values(), reattached)
            app.attach(supervisor, Ledger(store))
            inherited = service.listener()
            notifier = service.notifier
            with app.serving_scope:
                async with trio.open_nursery() as nursery:
                    serve = functools.partial(_serve_connections, app=app, nursery=nursery)
                    if inherited is not None:
                        # A socket-activated listener belongs to the socket unit: used
                        # as is, never bound, chmod-ed, watched or unlinked by us.
                        nursery.start_soon(serve, trio.socket.from_stdlib_socket(inherited))
                    else:
                        await nursery.start(
                            functools.partial(
                                serve_kept_socket, app.socket_path, serve, handover=service.kept
                            )
                        )
                    if service.watchdog_s is not None:
                        await nursery.start(
                            run_watchdog, notifier, service.watchdog_s, store.writer_healthy
                        )
                    log.info("agentsd %s serving on %s", app.version, app.socket_path)
                    _log_reconciliation(app)
                    notifier.ready()
                    nursery.start_soon(_report_status, app, notifier)
                    nursery.start_soon(run_sampler, supervisor)
                    task_status.started(app)
            handed = 0
            if app.restart_requested:  # Rule 6
                notifier.reloading()
                if supervisor.reattaches:  # else the next image would end them
                    running = supervisor.counts().running
                    notifier.status(f"handing {running} running agents over to the next image")
                    handed = await supervisor.hand_over_all()
                    log.info(
                        "restart: %d of %d running agents handed over, kept by the holder",
                        handed,
                        running,
                    )
            else:
                notifier.stopping()
            running = supervisor.counts().running
            notifier.status(f"closing {running} running sessions")
            log.info("closing %d running sessions", running)
        if handed and not app.restart_requested:
            # A stop came during the handover (Rule 6): no image is coming to take
            # over what was handed to the holder, so it is ended now, as the recovery
            # of crash_policy "end" would, and the holder forgets it (else it would
            # never leave: holder Rule 6).
            notifier.status(f"ending the {handed} agents handed over before the stop")
            ended = await recover(store, config.ladder, app.containment.root, cause="shutdown")
            log.info("the restart was abandoned: %s", ended.report.summary)
            if holder is not None:
                await _forget_ended(holder)


async def _forget_ended(keeper: HolderKeeper) -> None:
    """Let the holder forget the agents handed over and ended since (their exits
    arrive as the holder reaps them), within ``FORGET_WAIT_S``."""
    link = keeper.current()
    if link is None:
        return
    with trio.move_on_after(FORGET_WAIT_S):
        for agent in list(link.agents.values()):
            await agent.wait()
            await link.release(agent)


@asynccontextmanager
async def _open_holder(app: App) -> AsyncIterator[HolderKeeper | None]:
    """With the config's ``holder``, the supervisor's holder keeper, attached to a
    holder left running (if any) before recovery, which may take over what it holds.
    Under systemd the holder lives in a scope of its own, and so do the agents'
    cgroups (``agentsd.holder_scope``): the containment moves there."""
    if not app.config.holder:
        yield None
        return
    scope = holder_scope(app.containment, app.state_dir)
    async with open_holder_keeper(app.state_dir, claim=True, scope=scope) as keeper:
        if scope is not None:
            await _contain_in_scope(app, keeper, scope)
        yield keeper


async def _contain_in_scope(app: App, keeper: HolderKeeper, scope: HolderScope) -> None:
    """Make the holder's scope the agents' containment: started now if no holder
    runs, so that its cgroup exists before recovery looks in it. A holder left
    running outside it (started by a daemon run by hand) keeps its agents where they
    are, under the service's cgroup, which a stop or crash of the service ends; so do
    the holders started after it, for the containment to stay where they are."""
    link = keeper.current()
    if link is not None and not scope.holds(link.holder_pid):
        log.warning(
            "the holder (pid %d) runs outside its scope %s: its agents end with the "
            "service; stop every session and restart the daemon to move it",
            link.holder_pid,
            scope.unit,
        )
        keeper.scope = None
        return
    started = ""
    if link is None:
        try:
            await keeper.link()
        except HolderLost as exc:
            log.error("the holder could not be started in its scope %s: %s", scope.unit, exc)
            started = f"; its holder not started yet: {exc}"
    contained = await trio.to_thread.run_sync(with_controllers, scope.containment())
    app.containment = attrs.evolve(contained, detail=contained.detail + started)
    log.info("agent containment: %s (%s)", app.containment.mode, app.containment.detail)


@asynccontextmanager
async def _left_holder(app: App, holder: HolderKeeper | None) -> AsyncIterator[HolderLink | None]:
    """Without the holder (config ``holder = false``), the one an earlier daemon left
    running (``holder = true`` then), attached for recovery to end what it holds;
    None when there is none (or the holder is in use)."""
    if holder is not None or not holder_socket_path(app.state_dir).exists():
        yield None
        return
    async with open_holder_keeper(app.state_dir, claim=True) as keeper:
        yield keeper.current()


async def _dismiss(link: HolderLink | None) -> None:
    """Let a holder left by an earlier config forget the agents recovery ended, so
    that it leaves once detached (holder Rule 6) instead of keeping their exit
    statuses, and itself, for ever. Their exits arrive as the holder reaps them:
    waited for within ``FORGET_WAIT_S``."""
    if link is None:
        return
    with trio.move_on_after(FORGET_WAIT_S):
        await link.found_ended()
    link.forget_unclaimed()
    with suppress(HolderLost), trio.move_on_after(FORGET_WAIT_S):
        await link.flush()


def has_controlling_terminal() -> bool:
    """Whether this process has a terminal that can hang up (Rule 3)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


async def _watch_signals(
    signals: AsyncIterator[int],
    app: App,
    notifier: Notifier,
    nursery: trio.Nursery,
    hangup_reloads: bool,
) -> None:
    async for signum in signals:
        if signum == signal.SIGHUP and hangup_reloads:
            log.info("received SIGHUP; capturing the agents' environment again")
            nursery.start_soon(app.agent_env.refresh)
            continue
        log.info("received %s; shutting down", signal.Signals(signum).name)
        notifier.stopping()
        app.request_shutdown()
        if app.restart_requested:
            # A stop overrides a restart under way (systemctl stop during a reload):
            # no new image, and agents not handed over yet are ended as at a stop.
            log.info("the restart under way is abandoned: stopping instead")
            app.restart_requested = False
            app.supervisor.stop_all("shutdown")
        return


def _log_reconciliation(app: App) -> None:
    """The reconciliation report in the log (journald under systemd): one line, and
    one per cut-off turn and per failure, so ``journalctl`` says what to carry on."""
    report = app.recovery
    log.info("recovery: %s", report.summary)
    for cut in report.cut_off:
        log.info(
            "recovery: session %s (%s): turn cut off by a daemon %s at seq %d; "
            "`agentsctl continue %s` carries it on",
            cut.session_id,
            cut.title or cut.provider,
            "stop" if cut.reason == "shutdown" else "restart",
            cut.seq,
            cut.session_id,
        )
    for failure in report.failed:
        log.warning("recovery: session %s failed: %s", failure.session_id, failure.reason)


def status_text(app: App) -> str:
    """systemd's STATUS= line: the counts, and the reconciliation while a cut-off
    turn waits to be carried on or a session failed."""
    counts = app.session_counts()
    text = (
        f"{counts.total} sessions, {counts.running} running, {counts.working} working, "
        f"{counts.attention} need attention; {len(app.connections)} clients"
    )
    report = app.recovery
    waiting = report.turns_cut_off - report.continued
    if waiting or report.failed or report.lost or report.reattached:
        reattached = f"{report.reattached} reattached, " if report.reattached else ""
        text += (
            f"; at start: {reattached}{report.turns_cut_off} turns cut off "
            f"({waiting} to continue), "
            f"{len(report.failed)} failed, {report.lost} lost"
        )
    if app.draining:
        text += "; draining before a restart"
    return text


async def _report_status(app: App, notifier: Notifier) -> None:
    """Keep systemd's STATUS= line current (``systemctl --user status agentsd``)."""
    if not notifier.active:
        return
    last = ""
    while True:
        text = status_text(app)
        if text != last:
            notifier.status(text)
            last = text
        await trio.sleep(STATUS_INTERVAL_S)


async def _serve_connections(
    listener: trio.socket.SocketType, *, app: App, nursery: trio.Nursery
) -> None:
    """Accept on ``listener`` until cancelled; each connection runs in ``nursery``,
    which outlives the listener (``agentsd.socket_keeper`` Rule 3)."""
    my_uid = os.geteuid()
    while True:
        sock: trio.socket.SocketType | None = None
        with app.accept_scope():
            try:
                sock, _addr = await listener.accept()
            except OSError as exc:
                if exc.errno in TRANSIENT_ACCEPT_ERRNOS:
                    log.warning("accept failed (%s); retrying", os.strerror(exc.errno or 0))
                    await trio.sleep(ACCEPT_RETRY_S)
                    continue
                raise
        if sock is None:  # a restart is under way: what connects now is the next image's
            await trio.sleep_forever()
        pid, uid = peer_credentials(sock)
        if uid != my_uid:
            log.warning("refused a connection from uid %d", uid)
            sock.close()
            continue
        if len(app.connections) >= MAX_CONNECTIONS:
            log.warning("refused a connection: %d connections already open", MAX_CONNECTIONS)
            sock.close()
            continue
        # Pinned now, before anything awaits: the peer may exit and leave the
        # socket to a child (agentsd.caller Rule 1).
        try:
            pidfd = peer_pidfd(sock)
        except ProcessLookupError:
            pidfd = -1
        transport = SocketTransport(trio.SocketStream(sock))
        nursery.start_soon(_run_connection, app, transport, pid, pidfd)


async def _run_connection(
    app: App, transport: Transport, peer_pid: int | None = None, peer_pidfd: int | None = None
) -> None:
    connection = Connection(app, transport)
    app.connections.add(connection)
    try:
        if peer_pid is not None:
            connection.caller = await _identify(app, peer_pid, peer_pidfd)
            if connection.caller is UNIDENTIFIED:
                log.warning(
                    "connection %d (peer pid %d) could not be identified: "
                    "treated as an agent's, refused every user-only action",
                    connection.id,
                    peer_pid,
                )
            elif connection.caller is not None:
                log.info(
                    "connection %d comes from inside session %s", connection.id, connection.caller
                )
        await connection.serve()
    except Exception:
        # The connection boundary: a bug met by one client ends that connection only;
        # it must never cancel the serving nursery and with it the daemon.
        log.exception("connection %d failed", connection.id)
    finally:
        app.connections.discard(connection)


async def _identify(app: App, pid: int, pidfd: int | None) -> Caller:
    """Who the peer ``pid`` is (``agentsd.caller``); ``pidfd`` -1: it had exited by
    the time it was accepted."""
    if pidfd == -1:
        return UNIDENTIFIED
    sessions = list(app.supervisor.sessions.values())
    try:
        # Not abandoned on cancel: the thread is done with the pidfd when this returns.
        return await trio.to_thread.run_sync(identify_peer, pid, pidfd, sessions)
    finally:
        if pidfd is not None:
            os.close(pidfd)
