"""Our own agent child process: spawn, identity and the close ladder.

Rules this module keeps (DESIGN.md sections 2 and 6):

1. A child runs in its own session and process group (pgid == pid) with a spawn
   token in its environment, so everything it starts can be found again: by group,
   or by token when a descendant called ``setsid()``.
2. Its identity (pid, pgid, start time, token) reaches the caller before the body
   runs, so the caller can make it durable before any handshake.
3. Leaving `open_child` always runs the close ladder, whatever ended the body
   (return, exception, cancellation) and even when the child was never identified.
   Every await in it is shielded and has a time bound, and it never raises: the
   body's exception propagates unchanged.
4. Exit is proven, not assumed: the child was reaped, its group is empty and no
   live process carries its token (``agentsd.leftovers.prove_gone``). Whoever owns
   the spawn learns the outcome through ``on_exit``: an `ExitProof`, or an
   `ExitUnproven` saying why (the caller then keeps the lease held).
5. `os.killpg` is used only while our child is unreaped, which keeps its pid, and
   so its group id, from being reused. Anything else is signalled through a
   verified pidfd (``agentsd.leftovers``).
6. No PR_SET_PDEATHSIG: trio spawns from a worker thread and the signal would fire
   when that thread exits. Crash safety is recovery at start
   (``agentsd.leftovers.end_processes``).
7. The child's own exit is learned from the process (`Child.wait`: trio waits on
   its pidfd), never from its stdout closing: a process it started in the
   background may hold that open for ever. `Child.end_remains` then ends what it
   left running, so its output ends too.
8. With a cgroup root (``agentsd.cgroup``), the child is in its own cgroup before
   the agent's first instruction: the fork server of ``agentsd.spawner`` clones it
   there (``CLONE_INTO_CGROUP``, as the daemon's own child, pid and start time the
   agent's), which waits for no RCU grace period. Without a free fork server (none
   could start, they died, or each serves another spawn of a burst) it starts as
   ``/bin/sh`` running `JOIN_SCRIPT`, which writes ``0`` (itself) to
   ``cgroup.procs`` and then execs the agent; if the write fails, the shell exits
   and the agent never runs (the write waits for the kernel's grace period unless
   another join went just before: ``bench_spawn`` compares both). A
   ``preexec_fn`` would make subprocess fork instead of vfork and run the
   interpreter's at-fork handlers: 2-20 ms a spawn. The ladder's last rung is then ``cgroup.kill``, and
   exit is proven by the reap plus the cgroup's ``populated 0``; the cgroup is
   removed after.
9. A fork server that breaks mid-request (`SpawnerFailed`: stopped, killed, or
   too slow) may have cloned the agent into its cgroup as the daemon's child, pid
   unknown. The server is reaped first (nothing more can be cloned), then the
   cgroup is killed and watched until ``populated 0``, its clone found by
   ``/proc`` (our child, in that cgroup, a zombie too) and reaped by pidfd; only
   then is the cgroup removed. Not proven: ``on_exit`` gets an `ExitUnproven` and
   the cgroup stays; the spawn's own error propagates either way.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress

import attrs
import trio

from agentsd.cgroup import CgroupRoot, SessionCgroup, own_children_in, reap_child
from agentsd.config import Ladder, Limits
from agentsd.leftovers import (
    ChildIdentity,
    Remains,
    end_remains,
    prove_gone,
    signal_and_wait,
    unproven_reason,
)
from agentsd.procfs import (
    SPAWN_TOKEN_ENV,
    ProcInfo,
    ProcScanFailed,
    ProcScanner,
    current_scanner,
    read_start_time,
)
from agentsd.spawner import SpawnerFailed, spawn_into

__all__ = [
    "SPAWN_TOKEN_ENV",
    "Child",
    "ChildExit",
    "ChildSpec",
    "ExitProof",
    "ExitUnproven",
    "find_carriers",
    "kill_cgroup",
    "launch",
    "new_spawn_token",
    "open_child",
    "spawn_limiter",
]


log = logging.getLogger(__name__)

SHELL = "/bin/sh"  # POSIX; dash or bash: either starts in well under a millisecond
# $0 is the cgroup.procs path, "$@" the agent's argv; `&&`: no join, no agent.
JOIN_SCRIPT = 'echo 0 >"$0" && exec "$@"'

SPAWN_THREADS = 4  # worker threads that spawn at once; see `spawn_limiter`


def new_spawn_token() -> str:
    """A fresh, unguessable spawn token (128 bits, hex)."""
    return os.urandom(16).hex()


@attrs.frozen
class ChildSpec:
    """What to run. The child's environment is ``env`` over ``base_env``, with the
    spawn token added. Its stderr is ``stderr_fd`` (the caller's, which it keeps
    open and closes; ``agentsd.stderr_log`` reads it) or discarded."""

    argv: list[str]
    cwd: str
    env: Mapping[str, str]
    token: str
    stderr_fd: int | None = None
    # Shared by every child started from it (``agentsd.agent_env.Snapshot``), never
    # copied here: the merged environment is built at the spawn and dropped right
    # after it, as a copy per live child is kilobytes per session.
    base_env: Mapping[str, str] = attrs.field(factory=dict)
    # Where its cgroup is made (Rule 7); None: the process group and token fallback.
    cgroup_root: CgroupRoot | None = None
    limits: Limits = attrs.field(factory=Limits)  # written to its cgroup before it runs


@attrs.frozen
class ExitProof:
    """The child was reaped, its group is empty and no live process carries its
    token (or, with a cgroup, its cgroup was empty). Exactly one of ``returncode``
    (normal exit) and ``signal`` is set."""

    returncode: int | None
    signal: int | None
    stragglers_killed: int  # processes other than the child that had to be signalled
    cgroup_empty: bool = False  # proven by the cgroup's ``populated 0`` (Rule 7)
    # Its cgroup's OOM kills (``memory.events``), read before the cgroup was removed;
    # None without a cgroup or its memory controller.
    oom_kills: int | None = None

    @classmethod
    def from_returncode(
        cls,
        returncode: int,
        stragglers_killed: int,
        *,
        cgroup_empty: bool = False,
        oom_kills: int | None = None,
    ) -> ExitProof:
        return cls(
            returncode=None if returncode < 0 else returncode,
            signal=-returncode if returncode < 0 else None,
            stragglers_killed=stragglers_killed,
            cgroup_empty=cgroup_empty,
            oom_kills=oom_kills,
        )


@attrs.frozen
class ExitUnproven:
    """The ladder could not show that nothing of the child runs any more."""

    reason: str


ChildExit = ExitProof | ExitUnproven
"""How the close ladder left a spawned child."""


@attrs.define(eq=False)
class Child:
    """A running child, owned by the task inside `open_child`.

    The body reads ``stdout`` and writes ``stdin``; it may close ``stdin`` early
    (asking the child to exit) but `open_child` owns both streams and closes them.
    """

    identity: ChildIdentity
    process: trio.Process
    stdin: trio.abc.SendStream
    stdout: trio.abc.ReceiveStream
    ladder: Ladder
    scanner: ProcScanner
    # Processes of its group, or carrying its token, that `end_remains` signalled;
    # the close ladder counts them among its stragglers.
    signalled: set[tuple[int, int]] = attrs.field(factory=set)

    async def wait(self) -> int:
        """Wait for the child itself to exit (and reap it); its returncode.

        This is the process's own exit (trio waits on its pidfd), not the end of its
        output: a process it started may hold its stdout open long after it died."""
        return await self.process.wait()

    async def end_remains(self) -> None:
        """After `wait` returned: end what the child left running in its group or
        carrying its token (SIGTERM, then SIGKILL, through verified pidfds, as the
        close ladder would), so that nothing holds its pipes any more. Shielded,
        so that what it signals is counted even when the end of the output it
        causes cancels the caller, and bounded by the ladder; never raises. The
        close ladder still proves exit afterwards."""
        assert self.process.returncode is not None, "end_remains is for a reaped child"
        remains = [Remains(pgid=self.identity.pgid, token=self.identity.token, leader=None)]
        ladder = self.ladder
        bound_s = ladder.term_grace_s + (ladder.proof_rounds + 2) * (
            ladder.scan_timeout_s + ladder.kill_wait_s
        )
        with trio.move_on_after(bound_s, shield=True):
            self.signalled.update(await end_remains(remains, ladder, self.scanner))


@asynccontextmanager
async def open_child(
    spec: ChildSpec,
    ladder: Ladder,
    on_spawned: Callable[[ChildIdentity], Awaitable[None]],
    on_exit: Callable[[ChildExit], None],
    *,
    scanner: ProcScanner | None = None,
) -> AsyncIterator[Child]:
    """Spawn ``spec`` and yield the running `Child`; end it on exit.

    ``on_spawned(identity)`` is awaited right after the spawn, before the body; the
    caller writes the identity durably there. If it raises, the ladder runs and the
    exception propagates.

    ``on_exit(outcome)`` is called exactly once for every process spawned, when the
    ladder is done and before `open_child` exits: also when identifying the child,
    ``on_spawned`` or the body failed or were cancelled, which the caller may see
    before it ever holds the `Child`. It is not called when nothing was spawned.

    On exit, whatever the cause, the close ladder runs shielded and bounded (at most
    ``eof_grace_s + term_grace_s + kill_wait_s`` plus ``proof_rounds`` straggler
    rounds of ``kill_wait_s``, each scan capped by ``scan_timeout_s``; in practice
    no longer than the child takes to exit): close stdin, wait; SIGTERM the group
    and every token carrier, wait; SIGKILL them, wait for the reap; then prove exit.
    It never raises. It closes both pipes; the child is reaped unless the outcome
    is an `ExitUnproven` saying it still ran.

    Raises OSError if the program cannot be started (nothing is left running), and
    whatever ``on_spawned`` or the body raise. ``scanner`` defaults to the run's
    shared `current_scanner()`, so concurrent closes share /proc scans.
    """
    scanner = scanner if scanner is not None else current_scanner()
    cgroup = None if spec.cgroup_root is None else spec.cgroup_root.for_token(spec.token)
    try:
        process = await _spawn(spec, cgroup)  # makes the cgroup first
    except SpawnerFailed as exc:
        # The fork server broke mid-request: it may have cloned a child into the
        # cgroup (Rule 9). The error propagates as it is; what became of the child
        # goes to on_exit.
        assert cgroup is not None
        contained = await _contain_failed_spawn(cgroup, exc, ladder)
        if contained is not None:
            on_exit(contained)
        raise
    except BaseException:
        if cgroup is not None:
            try:  # nothing was started in it: it is empty (or was never made)
                cgroup.remove()
            except OSError as exc:  # never in place of the spawn's own error
                log.warning("could not remove the cgroup %s: %s", cgroup.path, exc)
        raise
    signalled: set[tuple[int, int]] = set()  # (pid, start time) signalled individually
    # From here on nothing may stand between the spawn and the try: the ladder
    # must run even if the very next checkpoint is cancelled.
    try:
        assert process.stdin is not None and process.stdout is not None
        start_time = await trio.to_thread.run_sync(
            read_start_time, process.pid, limiter=spawn_limiter()
        )
        if start_time is None:  # cannot happen while the child is unreaped
            raise ProcessLookupError(f"child {process.pid} vanished before it was identified")
        identity = ChildIdentity(
            pid=process.pid, pgid=process.pid, start_time=start_time, token=spec.token
        )
        child = Child(
            identity=identity,
            process=process,
            stdin=process.stdin,
            stdout=process.stdout,
            ladder=ladder,
            scanner=scanner,
            signalled=signalled,
        )
        await on_spawned(identity)
        yield child
    finally:
        # Should the ladder itself fail (a bug), the caller still learns that a
        # process was spawned and may run: never that nothing was.
        outcome: ChildExit | None = None
        try:
            if cgroup is None:
                outcome = await _close(process, spec.token, ladder, scanner, signalled)
            else:
                outcome = await _close_cgroup(process, cgroup, ladder)
        finally:
            if outcome is None:  # put in words only then: a close-all does not pay for it
                outcome = ExitUnproven(f"the close ladder of {_describe(process)} failed")
            on_exit(outcome)


async def _spawn(spec: ChildSpec, cgroup: SessionCgroup | None) -> trio.Process:
    """Start ``spec`` (in ``cgroup``, Rule 7); its environment lives only as long as
    this call."""
    async with spawn_limiter():  # open_process runs Popen in a thread of its own
        # Built here, not before the wait: a burst queued above holds no copies.
        env = {**spec.base_env, **spec.env, SPAWN_TOKEN_ENV: spec.token}
        argv = spec.argv
        if cgroup is not None:
            made = False

            def make() -> None:  # the cgroup, with its limits, before anything runs in it
                nonlocal made
                assert spec.cgroup_root is not None
                spec.cgroup_root.create(spec.token)
                made = True
                if spec.limits.controllers():
                    cgroup.apply(spec.limits)

            # In the trio thread, as the fork server's request (cgroupfs is in memory).
            # SpawnerFailed: open_child ends what the server may have started there.
            cloned = await spawn_into(
                cgroup, argv, cwd=spec.cwd, env=env, stderr=spec.stderr_fd, prepare=make
            )
            if cloned is not None:
                return cloned
            # The shim execs the program: its failure must still be Popen's error.
            _check_program(spec.argv[0], spec.cwd, env)
            if not made:  # trio's default threads, as open_process: we hold a spawn token
                await trio.to_thread.run_sync(make)
            argv = shim_argv(spec, cgroup)
        return await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if spec.stderr_fd is None else spec.stderr_fd,
            cwd=spec.cwd,
            env=env,
            start_new_session=True,  # own session and group: pgid == pid
            close_fds=True,  # never hand the daemon's socket or database to an agent
        )


def shim_argv(spec: ChildSpec, cgroup: SessionCgroup) -> list[str]:
    """The argv that joins ``cgroup`` and then execs ``spec``'s program (Rule 8's
    fallback: `JOIN_SCRIPT`)."""
    return [SHELL, "-c", JOIN_SCRIPT, str(cgroup.path / "cgroup.procs"), *spec.argv]


def launch(
    spec: ChildSpec, cgroup: SessionCgroup | None, *, shim: bool = True
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start ``spec`` from another process (the
    holder, ``agentsd.held_child``), joining ``cgroup`` through the shim of Rule 8
    unless ``shim`` is False (the other process clones into it): the fork servers
    are this daemon's children and clone only as its own. Raises what Popen would
    for a missing or non-executable program."""
    env = {**spec.base_env, **spec.env, SPAWN_TOKEN_ENV: spec.token}
    if cgroup is None:
        return list(spec.argv), env
    _check_program(spec.argv[0], spec.cwd, env)
    return (shim_argv(spec, cgroup) if shim else list(spec.argv)), env


def _check_program(program: str, cwd: str, env: Mapping[str, str]) -> None:
    """Raise what Popen would for ``program``, which the shell of Rule 7 execs: a
    missing or non-executable agent is still FileNotFoundError / PermissionError at
    the spawn, not a shell's exit status."""
    if os.sep in program:
        path = os.path.join(cwd, program)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        if not os.access(path, os.X_OK) or os.path.isdir(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


_SPAWN_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar(
    "agentsd_spawn_limiter"
)


def spawn_limiter() -> trio.CapacityLimiter:
    """The worker threads of spawning (and of what a start must do on disk before
    it, such as creating the agent's stderr log): a burst of starts queues here,
    rather than raising trio's thread pool to its limit, each thread's stack and
    state staying resident after the burst. A spawn is a CPU-bound fork and exec:
    more threads than cores would not make a burst finish sooner."""
    try:
        return _SPAWN_LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(SPAWN_THREADS)
        _SPAWN_LIMITER.set(limiter)
        return limiter


async def _close(
    process: trio.Process,
    token: str,
    ladder: Ladder,
    scanner: ProcScanner,
    signalled: set[tuple[int, int]],
) -> ChildExit:
    """The close ladder. Shielded, every step bounded, never raises. ``signalled``
    holds the processes signalled individually so far; it counts the stragglers."""
    pgid = process.pid
    with trio.CancelScope(shield=True):
        assert process.stdin is not None and process.stdout is not None
        await process.stdin.aclose()
        steps = (
            (None, ladder.eof_grace_s),
            (signal.SIGTERM, ladder.term_grace_s),
            (signal.SIGKILL, ladder.kill_wait_s),
        )
        # Token carriers outside the group, as the SIGTERM step's scan found them.
        # SIGKILL goes to them again (each re-verified) without a scan of its own:
        # the proof scans right after the reap and kills whatever carries the token
        # then, so a second scan here would only delay the reap of a close-all.
        carriers: list[ProcInfo] = []
        for sig, wait_s in steps:
            # `returncode` reaps an exited child. Until then its pid (and so its
            # group id) cannot be reused, which makes killpg safe here.
            if process.returncode is not None:
                break
            with trio.move_on_after(wait_s):
                if sig is not None:
                    with suppress(ProcessLookupError, PermissionError):
                        os.killpg(pgid, sig)
                    if sig == signal.SIGTERM:
                        carriers = await find_carriers(token, pgid, scanner)
                    signalled |= await signal_and_wait(carriers, sig, None)
                await process.wait()
        outcome: ChildExit
        if process.returncode is None:
            outcome = ExitUnproven(
                f"child {_describe(process)} still ran {ladder.kill_wait_s}s after SIGKILL"
            )
        else:
            live, killed = await prove_gone(
                [Remains(pgid=pgid, token=token, leader=None)], ladder, scanner
            )
            signalled |= killed
            reason = unproven_reason(live, ladder)
            if reason is None:
                outcome = ExitProof.from_returncode(process.returncode, len(signalled))
            else:
                outcome = ExitUnproven(reason)
        await process.stdout.aclose()
    return outcome


async def _close_cgroup(process: trio.Process, cgroup: SessionCgroup, ladder: Ladder) -> ChildExit:
    """The close ladder of a child in its own cgroup (Rule 7): stdin EOF, SIGTERM
    to its group, then ``cgroup.kill``; proof is the reap plus ``populated 0``,
    watched through ``cgroup.events``. Shielded, every step bounded, never raises."""
    with trio.CancelScope(shield=True):
        assert process.stdin is not None and process.stdout is not None
        await process.stdin.aclose()
        if process.returncode is None:
            with trio.move_on_after(ladder.eof_grace_s):
                await process.wait()
        if process.returncode is None:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)  # unreaped: the group id is ours
            with trio.move_on_after(ladder.term_grace_s):
                await process.wait()
        outcome: ChildExit
        try:
            # The last rung: every member, atomically. In a worker thread: a write
            # to cgroup.kill waits for the cgroup lock, which a close-all of
            # hundreds holds in turn (about a millisecond each, measured).
            stragglers = await trio.to_thread.run_sync(
                kill_cgroup, cgroup, process.pid, limiter=spawn_limiter()
            )
            with trio.move_on_after(ladder.kill_wait_s):
                # The reap first: its pidfd wakes this task alone. An agent that
                # left nothing behind has normally emptied its cgroup by then (the
                # kernel unlinks an exiting task from its cgroup before it tells
                # the parent), so a close-all mostly watches no cgroup.events.
                await process.wait()
                await cgroup.wait_empty()
            if process.returncode is None or cgroup.populated():
                outcome = ExitUnproven(
                    f"cgroup {cgroup.path} still held processes {ladder.kill_wait_s}s "
                    "after cgroup.kill"
                )
            else:
                oom_kills = cgroup.oom_kills()  # the file goes with the cgroup
                try:
                    cgroup.remove()
                except OSError as exc:  # proven all the same; recovery removes it later
                    log.warning("could not remove the empty cgroup %s: %s", cgroup.path, exc)
                outcome = ExitProof.from_returncode(
                    process.returncode, stragglers, cgroup_empty=True, oom_kills=oom_kills
                )
        except OSError as exc:
            outcome = ExitUnproven(f"cgroup {cgroup.path} could not be ended: {exc}")
        await process.stdout.aclose()
    return outcome


async def _contain_failed_spawn(
    cgroup: SessionCgroup, failure: SpawnerFailed, ladder: Ladder
) -> ChildExit | None:
    """After the fork server broke mid-request (Rule 9): ``cgroup.kill``, wait
    (bounded) for ``populated 0``, then reap what the server cloned there, the
    daemon's own child (``CLONE_PARENT``) whose pid it never learned, and remove the
    cgroup. None: nothing was cloned (the agent never started); an `ExitProof` once
    a clone was reaped; an `ExitUnproven` (the lease stays held, the cgroup is
    left for the retry) if the server could not be ended or the cgroup not
    emptied. Shielded, bounded, never raises."""
    with trio.CancelScope(shield=True):
        try:
            await trio.to_thread.run_sync(cgroup.kill, limiter=spawn_limiter())
            with trio.move_on_after(ladder.kill_wait_s):
                await cgroup.wait_empty()
            if cgroup.populated():
                return ExitUnproven(
                    f"cgroup {cgroup.path} still held processes {ladder.kill_wait_s}s after "
                    f"cgroup.kill, after the fork server failed ({failure})"
                )
            if not failure.server_ended:
                return ExitUnproven(
                    f"the fork server that spawned into {cgroup.path} could not be ended: "
                    "it may still start the agent there"
                )
            returncodes: list[int] = []
            with trio.move_on_after(ladder.kill_wait_s):
                for pid in await trio.to_thread.run_sync(own_children_in, [cgroup]):
                    returncode = await trio.to_thread.run_sync(
                        reap_child, pid, abandon_on_cancel=True
                    )
                    if returncode is not None:
                        returncodes.append(returncode)
            if await trio.to_thread.run_sync(own_children_in, [cgroup]):
                return ExitUnproven(f"a child cloned into {cgroup.path} could not be reaped")
            oom_kills = cgroup.oom_kills()
            try:
                cgroup.remove()
            except OSError as exc:  # empty all the same; recovery removes it later
                log.warning("could not remove the empty cgroup %s: %s", cgroup.path, exc)
        except OSError as exc:
            return ExitUnproven(f"cgroup {cgroup.path} could not be ended: {exc}")
    if not returncodes:
        return None
    return ExitProof.from_returncode(
        returncodes[0], len(returncodes) - 1, cgroup_empty=True, oom_kills=oom_kills
    )


def kill_cgroup(cgroup: SessionCgroup, pid: int) -> int:
    """``cgroup.kill`` if anything runs in ``cgroup``; how many besides ``pid`` did."""
    stragglers = len([member for member in cgroup.members() if member != pid])
    if cgroup.populated():
        cgroup.kill()
    return stragglers


async def find_carriers(token: str, pgid: int, scanner: ProcScanner) -> list[ProcInfo]:
    """The token carriers outside group ``pgid``: a descendant that called setsid()
    left the group but still carries the token. If the scan fails or the step's
    deadline cuts it short, none; the proof scans again and kills what it finds."""
    try:
        table = await scanner.scan([token])
    except ProcScanFailed:
        return []
    return [p for p in table.carrying(token) if p.pgid != pgid]


def _describe(process: trio.Process) -> str:
    return f"pid {process.pid} ({process.args!r})"
