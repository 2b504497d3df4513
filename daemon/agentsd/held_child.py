"""An agent spawned through the holder (``agentsd.holder``): `open_child`'s rules,
with the holder as the agent's parent.

The agent is started as ``agentsd.child`` starts one (its own session and group,
the spawn token, its own cgroup made with its limits before it runs), but by the
holder, so it survives this daemon. What changes, rule by rule of ``agentsd.child``:

- Rule 8 (born in its cgroup): the fork servers of ``agentsd.spawner`` are this
  daemon's children and clone agents as this daemon's, which a held agent must
  not be; the holder clones it into its cgroup itself (``agentsd.holder`` Rule
  1), or, a holder of an earlier release, starts the shim (``JOIN_SCRIPT``), which
  joins the cgroup before it execs the agent (slower: the join waits for an RCU
  grace period).
- Rule 7 (exit from the process): the holder reports the exit (`HeldChild.wait`,
  `HeldChild.watch_exit`), not ``agentsd.agent_watch``'s pidfd: the agent is not
  our child, and the holder may have reaped it (its pid free for reuse) before a
  pidfd could be opened here.

- Rule 4 (exit is proven): the reap is the holder's; it reports the status
  (`HeldChild.wait`). The group, token and cgroup proofs are this daemon's, as for
  our own child.
- Rule 5 (killpg only while unreaped): the holder signals the group, and only
  while it has not reaped the agent; everything else goes through verified pidfds.
- The close ladder is the same (stdin EOF, SIGTERM, SIGKILL or ``cgroup.kill``,
  proof), its steps sent to the holder, and the holder forgets the agent only
  after the proof.
- A handover (a planned restart, ``agentsd.session_task`` Rule 2): `HeldChild.hand_over`
  leaves the agent running in the holder. Nothing of the ladder runs, ``on_exit``
  is not called (nothing ended: the lease stays held) and the holder is not told
  to forget it; the link then detaches, which leaves the holder everything it
  holds, for the next daemon.
- A lost holder (``agentsd.holder_link`` Rule 2): the agent lost its pipes and
  its exit can no longer be reaped here. The ladder then ends it by its identity
  as recovery ends a previous daemon's child (``agentsd.leftovers.end_contained``)
  and reports that outcome; the lease is released on it, or kept held when the
  agent could not be proven gone.
- A spawn the lost holder never confirmed: what it may have started is ended by
  its token (and cgroup), but only once no fork of that holder can still exec the
  agent. A fork has the holder's environment until its exec, so no token (a scan
  for it would miss a fork about to exec the agent, which would then run on with
  no one to end it) but the holder's mark (``agentsd.holder`` Rule 1). Every
  process carrying the mark, the holder itself aside, is waited for until it
  exec'd (it carries the token then) or exited, at most ``term_grace_s``; what
  outlasts that never became an agent and is SIGKILLed through a verified pidfd,
  for at most ``proof_rounds`` more rounds (`_end_forks`). Only then is the token
  scanned for, and every fork seen on the way ended by its identity (pid and
  start time, which an exec keeps): a fork in the middle of its exec shows no
  environment, neither mark nor token yet. A fork that could not be proven gone
  keeps the spawn's outcome unproven (its lease held). The wait is bounded
  whatever runs: an agent can copy the mark into processes of its own (it can read
  the holder's environment); that costs it those processes (SIGKILLed like a
  fork, counted as the spawn's start) and delays this end by the bound, or leaves
  it unproven (its lease held) if one of them cannot be killed, no more. A holder
  of an earlier release has no mark: the token is scanned for at once, as before.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress

import attrs
import trio

from agentsd.cgroup import CgroupRoot, SessionCgroup
from agentsd.child import (
    ChildExit,
    ChildSpec,
    ExitProof,
    ExitUnproven,
    find_carriers,
    kill_cgroup,
    launch,
    spawn_limiter,
)
from agentsd.config import Ladder
from agentsd.holder_link import (
    AgentStdin,
    AgentStdout,
    HeldAgent,
    HolderLink,
    HolderLost,
    HolderRefused,
)
from agentsd.leftovers import (
    ChildIdentity,
    EndOutcome,
    Remains,
    end_contained,
    end_remains,
    prove_gone,
    signal_and_wait,
    unproven_reason,
)
from agentsd.procfs import ProcInfo, ProcScanFailed, ProcScanner, current_scanner

__all__ = ["HeldChild", "adopt_held_child", "open_held_child"]

log = logging.getLogger(__name__)

FORK_POLL_S = 0.02  # between scans for a lost holder's forks (`_end_forks`)

HeldExit = ChildExit | EndOutcome
"""How the ladder left a held agent: proven as our own child would be, or, after the
holder was lost, as recovery ends a previous daemon's."""


@attrs.define(eq=False)
class HeldChild:
    """A running agent held by the holder, owned by the task inside
    `open_held_child`; the same surface as ``agentsd.child.Child``."""

    identity: ChildIdentity
    agent: HeldAgent
    stdin: AgentStdin
    stdout: AgentStdout
    ladder: Ladder
    scanner: ProcScanner
    signalled: set[tuple[int, int]] = attrs.field(factory=set)
    handed_over: bool = False

    def hand_over(self) -> bool:
        """Leave the agent running in the holder when `open_held_child` exits (a
        handover: see the module's docstring). False, and the exit ladders it as
        usual, once it exited or its holder was lost: there is nothing to hand
        over then, only an end to prove."""
        if self.agent.returncode is not None or self.agent.link.lost.is_set():
            return False
        self.handed_over = True
        return True

    async def wait(self) -> int:
        """Wait for the agent's own exit, as the holder reaped it; never returns once
        the holder is lost first (its output ends then: the reader stops the task)."""
        return await self.agent.wait()

    def watch_exit(self, on_exit: Callable[[], None]) -> Callable[[], None]:
        """Call ``on_exit`` once the holder reported the agent's exit (at once if it
        has): what ``agentsd.agent_watch`` does for our own child's pidfd. Returns
        what stops it. Never called once the holder is lost first."""
        self.agent.on_exit = on_exit
        if self.agent.exited.is_set():
            on_exit()

        def release() -> None:
            self.agent.on_exit = None

        return release

    async def end_remains(self) -> None:
        """``agentsd.child.Child.end_remains``: after `wait`, end what the agent
        left in its group or carrying its token. Shielded, bounded, never raises."""
        assert self.agent.returncode is not None, "end_remains is for a reaped agent"
        remains = [Remains(pgid=self.identity.pgid, token=self.identity.token, leader=None)]
        ladder = self.ladder
        bound_s = ladder.term_grace_s + (ladder.proof_rounds + 2) * (
            ladder.scan_timeout_s + ladder.kill_wait_s
        )
        with trio.move_on_after(bound_s, shield=True):
            self.signalled.update(await end_remains(remains, ladder, self.scanner))


@asynccontextmanager
async def open_held_child(
    spec: ChildSpec,
    ladder: Ladder,
    on_spawned: Callable[[ChildIdentity], Awaitable[None]],
    on_exit: Callable[[HeldExit], None],
    link: HolderLink,
    *,
    scanner: ProcScanner | None = None,
    durable_acks: bool = False,
) -> AsyncIterator[HeldChild]:
    """``agentsd.child.open_child`` through the holder of ``link``: the same
    contract (``on_spawned`` before the body, ``on_exit`` exactly once for every
    agent spawned, the shielded and bounded ladder on exit, never raising from it),
    except that ``on_exit`` may receive an `EndOutcome` (the holder was lost), and
    that an agent handed over (`HeldChild.hand_over`) is neither laddered nor
    reported: it runs on in the holder.

    Raises OSError if the agent cannot be started, `HolderLost` if the holder is
    gone before it started it (nothing runs then). ``durable_acks``: its output is
    acknowledged to the holder only as it is journaled (``agentsd.holder_link``
    Rule 3), so that a later daemon can take it over."""
    scanner = scanner if scanner is not None else current_scanner()
    cgroup = None if spec.cgroup_root is None else spec.cgroup_root.for_token(spec.token)
    try:
        if cgroup is not None:
            await trio.to_thread.run_sync(_make_cgroup, spec, limiter=spawn_limiter())
        argv, env = launch(spec, cgroup, shim=not link.clones_into_cgroups)
        # Once asked, the holder spawns whatever becomes of this task: its answer
        # must be heard (each request is bounded), or the agent would run unladdered.
        with trio.CancelScope(shield=True):
            try:
                agent = await link.spawn(
                    spec.token,
                    argv,
                    spec.cwd,
                    env,
                    spec.stderr_fd,
                    durable_acks=durable_acks,
                    cgroup=None if cgroup is None or not link.clones_into_cgroups else cgroup.path,
                )
            except HolderLost:
                # It may have started the agent before it was lost: end whatever
                # carries the token, and say how that went.
                on_exit(await _end_unconfirmed(spec, cgroup, ladder, scanner, link))
                cgroup = None  # ended and removed there
                raise
        del env
    except BaseException:
        if cgroup is not None:
            cgroup.remove()  # nothing was started in it (or it was never made)
        raise
    outcome: HeldExit = ExitUnproven(f"the close ladder of held agent {agent.pid} failed")
    signalled: set[tuple[int, int]] = set()  # (pid, start time) signalled individually
    child: HeldChild | None = None
    try:
        if agent.start_time is None:  # the holder reads it before it can reap
            raise ProcessLookupError(f"agent {agent.pid} vanished before it was identified")
        identity = ChildIdentity(
            pid=agent.pid, pgid=agent.pid, start_time=agent.start_time, token=spec.token
        )
        child = HeldChild(
            identity=identity,
            agent=agent,
            stdin=agent.stdin,
            stdout=agent.stdout,
            ladder=ladder,
            scanner=scanner,
            signalled=signalled,
        )
        await on_spawned(identity)
        yield child
    finally:
        if child is not None and child.handed_over:
            # Still known to the link, so that an exit the holder reports before
            # the link detaches is kept for the next daemon, never forgotten.
            log.info("agent %d handed over: it runs on in holder %d", agent.pid, link.holder_pid)
            agent.close_err()
        else:
            try:
                outcome = await _close(agent, spec, cgroup, ladder, scanner, signalled)
            finally:
                on_exit(outcome)
                proven = isinstance(outcome, ExitProof) or outcome in (
                    EndOutcome.ENDED,
                    EndOutcome.ALREADY_GONE,
                )
                if proven:
                    with trio.CancelScope(shield=True), trio.move_on_after(ladder.kill_wait_s):
                        await link.release(agent)


@asynccontextmanager
async def adopt_held_child(
    identity: ChildIdentity,
    cgroup_root: CgroupRoot | None,
    ladder: Ladder,
    on_exit: Callable[[HeldExit], None],
    link: HolderLink,
    out_offset: int,
    stderr_fd: int | None,
    *,
    scanner: ProcScanner | None = None,
) -> AsyncIterator[HeldChild]:
    """`open_held_child` for an agent an earlier daemon spawned through the holder
    of ``link`` and that link found at attach (a takeover): claimed with
    ``HolderLink.adopt`` (its stdout read from ``out_offset``, acknowledged only as
    it is journaled; its stderr from what the holder still has), never spawned.
    The same contract afterwards: ``on_exit`` exactly once, the shielded and
    bounded close ladder, the holder told to forget it only after the proof.

    Raises `HolderRefused` (the holder no longer has it, or no longer has
    ``out_offset``) or `HolderLost` when it cannot be claimed; it is then ended by
    its identity, as recovery ends a previous daemon's agent, and ``on_exit``
    hears that outcome before the exception propagates."""
    scanner = scanner if scanner is not None else current_scanner()
    cgroup = None
    if cgroup_root is not None and cgroup_root.for_token(identity.token).path.is_dir():
        cgroup = cgroup_root.for_token(identity.token)
    spec = ChildSpec(argv=[], cwd="/", env={}, token=identity.token, cgroup_root=cgroup_root)
    found = link.found.get(identity.token, {})
    err_offset = int(found.get("err_base", 0))
    try:
        if (found.get("pid"), found.get("start_time")) != (identity.pid, identity.start_time):
            raise HolderRefused(
                "unknown_agent",
                f"the holder's agent {identity.token} is not pid {identity.pid} as recorded",
            )
        with trio.CancelScope(shield=True):  # each of its requests is bounded
            agent = await link.adopt(
                identity.token, out_offset, err_offset, stderr_fd, durable_acks=True
            )
    except (HolderRefused, HolderLost):
        root = cgroup_root if cgroup is not None else None
        with trio.CancelScope(shield=True):
            report = await end_contained([identity], ladder, scanner, root, sweep=False)
        ended = report.outcomes.get(identity, EndOutcome.UNPROVEN)
        if cgroup is not None and ended is not EndOutcome.UNPROVEN:
            with suppress(OSError):
                cgroup.remove()
        on_exit(ended)
        raise
    outcome: HeldExit = ExitUnproven(f"the close ladder of held agent {agent.pid} failed")
    signalled: set[tuple[int, int]] = set()
    child = HeldChild(
        identity=identity,
        agent=agent,
        stdin=agent.stdin,
        stdout=agent.stdout,
        ladder=ladder,
        scanner=scanner,
        signalled=signalled,
    )
    try:
        yield child
    finally:
        if child.handed_over:
            log.info("agent %d handed over: it runs on in holder %d", agent.pid, link.holder_pid)
            agent.close_err()
        else:
            try:
                outcome = await _close(agent, spec, cgroup, ladder, scanner, signalled)
            finally:
                on_exit(outcome)
                if isinstance(outcome, ExitProof) or outcome in (
                    EndOutcome.ENDED,
                    EndOutcome.ALREADY_GONE,
                ):
                    with trio.CancelScope(shield=True), trio.move_on_after(ladder.kill_wait_s):
                        await link.release(agent)


def _make_cgroup(spec: ChildSpec) -> None:
    """The agent's cgroup, with its limits, before the holder starts anything in it
    (``agentsd.child`` Rule 8). The holder spawns, not this daemon: it clones the
    agent into it (or the agent joins it through the shim, `launch`), never a fork
    server of this daemon's."""
    assert spec.cgroup_root is not None
    cgroup = spec.cgroup_root.create(spec.token)
    if spec.limits.controllers():
        cgroup.apply(spec.limits)


async def _wait_exit(agent: HeldAgent, seconds: float) -> None:
    """Until the agent exited or the holder was lost, at most ``seconds``."""
    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery:

            async def exited() -> None:
                await agent.exited.wait()
                nursery.cancel_scope.cancel()

            async def lost() -> None:
                await agent.link.lost.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(exited)
            nursery.start_soon(lost)


async def _close(
    agent: HeldAgent,
    spec: ChildSpec,
    cgroup: SessionCgroup | None,
    ladder: Ladder,
    scanner: ProcScanner,
    signalled: set[tuple[int, int]],
) -> HeldExit:
    """The close ladder through the holder. Shielded, every step bounded, never
    raises."""
    outcome: HeldExit
    with trio.CancelScope(shield=True):
        try:
            outcome = await _ladder(agent, spec, cgroup, ladder, scanner, signalled)
        except HolderLost:
            outcome = await _end_lost(agent, spec, cgroup, ladder, scanner)
        except Exception:
            log.exception("the close ladder of held agent %d failed", agent.pid)
            outcome = ExitUnproven(f"the close ladder of held agent {agent.pid} failed")
    return outcome


async def _end_unconfirmed(
    spec: ChildSpec,
    cgroup: SessionCgroup | None,
    ladder: Ladder,
    scanner: ProcScanner,
    link: HolderLink,
) -> EndOutcome:
    """End what a spawn whose answer never came may have started, by its token (and
    cgroup): as recovery ends a spawn that was never confirmed, once no fork of the
    lost holder can exec it any more; and every fork of it seen on the way by its
    identity, which an exec keeps (the module's docstring)."""
    forks_gone, forks_killed, seen = await _end_forks(link, ladder, scanner)
    identity = ChildIdentity(pid=0, pgid=0, start_time=-1, token=spec.token)
    # A fork that exec'd has set up its own group (setsid) before it: its pid.
    forks = [
        ChildIdentity(pid=p.pid, pgid=p.pid, start_time=p.start_time, token=spec.token)
        for p in seen
    ]
    root = spec.cgroup_root if cgroup is not None else None
    report = await end_contained([identity, *forks], ladder, scanner, root, sweep=False)
    outcomes = {report.outcomes.get(i, EndOutcome.UNPROVEN) for i in (identity, *forks)}
    if not forks_gone or EndOutcome.UNPROVEN in outcomes:
        outcome = EndOutcome.UNPROVEN
    elif forks_killed or EndOutcome.ENDED in outcomes:
        outcome = EndOutcome.ENDED  # a fork was its start
    else:
        outcome = EndOutcome.ALREADY_GONE
    if cgroup is not None and outcome is not EndOutcome.UNPROVEN:
        try:
            cgroup.remove()
        except OSError as exc:
            log.warning("could not remove the empty cgroup %s: %s", cgroup.path, exc)
    return outcome


async def _end_forks(
    link: HolderLink, ladder: Ladder, scanner: ProcScanner
) -> tuple[bool, bool, list[ProcInfo]]:
    """Until no process carries the mark of the lost holder of ``link`` (the holder
    and this daemon aside): a fork of it that has not exec'd. Waits up to
    ``term_grace_s`` for each to exec or exit, then SIGKILLs what remains (through
    verified pidfds), up to ``1 + proof_rounds`` times. Returns whether none remains
    (False: a scan did not finish in time, or one outlived every SIGKILL), whether
    any was killed, and every fork seen: one in the middle of its exec shows no
    environment at all, neither the mark nor yet the token, and is ended by its
    identity. A holder without a mark (an earlier release's): (True, False, [])
    at once. Bounded; never raises."""
    mark = link.mark
    seen: dict[tuple[int, int], ProcInfo] = {}
    if mark is None:
        return True, False, []
    deadline = trio.current_time() + ladder.term_grace_s
    killed = False
    kills = 0
    ours = (link.holder_pid, os.getpid())
    while True:
        forks: list[ProcInfo] | None = None
        with trio.move_on_after(ladder.scan_timeout_s):
            try:
                table = await scanner.scan(marks=[mark])
            except ProcScanFailed:
                return False, killed, list(seen.values())
            forks = [p for p in table.marked(mark) if p.pid not in ours]
        if forks is None:
            return False, killed, list(seen.values())
        seen.update(((p.pid, p.start_time), p) for p in forks)
        if not forks:
            return True, killed, list(seen.values())
        if trio.current_time() < deadline:
            await trio.sleep(FORK_POLL_S)  # an exec takes milliseconds
            continue
        if kills > ladder.proof_rounds:
            return False, killed, list(seen.values())
        kills += 1
        log.warning(
            "processes %s forked by lost holder %d did not exec within %gs: killing them",
            sorted(p.pid for p in forks),
            link.holder_pid,
            ladder.term_grace_s,
        )
        killed |= bool(await signal_and_wait(forks, signal.SIGKILL, ladder.kill_wait_s))


async def _end_lost(
    agent: HeldAgent,
    spec: ChildSpec,
    cgroup: SessionCgroup | None,
    ladder: Ladder,
    scanner: ProcScanner,
) -> EndOutcome:
    """End an agent whose holder was lost by its identity, as recovery would."""
    log.warning("agent %d lost its holder: ending it by its identity", agent.pid)
    identity = ChildIdentity(
        pid=agent.pid, pgid=agent.pid, start_time=agent.start_time or -1, token=spec.token
    )
    root = spec.cgroup_root if cgroup is not None else None
    report = await end_contained([identity], ladder, scanner, root, sweep=False)
    outcome = report.outcomes.get(identity, EndOutcome.UNPROVEN)
    if cgroup is not None and outcome is not EndOutcome.UNPROVEN:
        try:
            cgroup.remove()
        except OSError as exc:
            log.warning("could not remove the empty cgroup %s: %s", cgroup.path, exc)
    agent.close_err()
    return outcome


async def _ladder(
    agent: HeldAgent,
    spec: ChildSpec,
    cgroup: SessionCgroup | None,
    ladder: Ladder,
    scanner: ProcScanner,
    signalled: set[tuple[int, int]],
) -> ChildExit:
    """``agentsd.child``'s ladders (``_close`` and ``_close_cgroup``), each signal
    sent through the holder; raises `HolderLost` when it is lost on the way."""
    link = agent.link
    pgid = agent.pid
    if link.lost.is_set():
        raise HolderLost(link.lost_reason)
    if agent.returncode is None:
        await agent.close_stdin()
        await _wait_exit(agent, ladder.eof_grace_s)
    # Token carriers outside the group, as the SIGTERM step's scan found them; the
    # SIGKILL step signals them again (each re-verified) without a scan of its own.
    carriers: list[ProcInfo] = []
    for sig, wait_s in (
        (signal.SIGTERM, ladder.term_grace_s),
        (signal.SIGKILL, ladder.kill_wait_s),
    ):
        if agent.returncode is not None or link.lost.is_set():
            break
        if cgroup is not None and sig == signal.SIGKILL:
            break  # the last rung is cgroup.kill, below
        await agent.signal_group(sig)
        if cgroup is None:
            if sig == signal.SIGTERM:
                carriers = await find_carriers(spec.token, pgid, scanner)
            signalled |= await signal_and_wait(carriers, sig, None)
        await _wait_exit(agent, wait_s)
    if cgroup is not None:
        return await _end_cgroup(agent, cgroup, ladder)
    if agent.returncode is None:
        if link.lost.is_set():
            raise HolderLost(link.lost_reason)
        return ExitUnproven(f"held agent {agent.pid} still ran {ladder.kill_wait_s}s after SIGKILL")
    live, killed = await prove_gone(
        [Remains(pgid=pgid, token=spec.token, leader=None)], ladder, scanner
    )
    signalled |= killed
    reason = unproven_reason(live, ladder)
    if reason is not None:
        return ExitUnproven(reason)
    return ExitProof.from_returncode(agent.returncode, len(signalled))


async def _end_cgroup(agent: HeldAgent, cgroup: SessionCgroup, ladder: Ladder) -> ChildExit:
    """The last rung in cgroup mode (``agentsd.child._close_cgroup``): ``cgroup.kill``
    (in a worker thread: it waits for the cgroup lock), the holder's reap first,
    then ``populated 0``."""
    try:
        stragglers = await trio.to_thread.run_sync(
            kill_cgroup, cgroup, agent.pid, limiter=spawn_limiter()
        )
        await _wait_exit(agent, ladder.kill_wait_s)
        if agent.returncode is None:
            if agent.link.lost.is_set():
                raise HolderLost(agent.link.lost_reason)
            return ExitUnproven(
                f"held agent {agent.pid} still ran {ladder.kill_wait_s}s after cgroup.kill"
            )
        with trio.move_on_after(ladder.kill_wait_s):
            await cgroup.wait_empty()
        if cgroup.populated():
            return ExitUnproven(
                f"cgroup {cgroup.path} still held processes {ladder.kill_wait_s}s after cgroup.kill"
            )
        oom_kills = cgroup.oom_kills()  # the file goes with the cgroup
        try:
            cgroup.remove()
        except OSError as exc:  # proven all the same; recovery removes it later
            log.warning("could not remove the empty cgroup %s: %s", cgroup.path, exc)
        return ExitProof.from_returncode(
            agent.returncode, stragglers, cgroup_empty=True, oom_kills=oom_kills
        )
    except OSError as exc:
        return ExitUnproven(f"cgroup {cgroup.path} could not be ended: {exc}")
