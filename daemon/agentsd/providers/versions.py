"""The version of an agent program, as the daemon learns it.

Each release offers its version in its own places. Codex puts it in ``initialize``'s
``userAgent``; Claude Code 2.1.332 in its ``initialize`` reply (``claude_code_version``),
while 2.1.197 says it only in ``system/init`` (with the first prompt, too late to
report a start) and in ``claude --version``. So the handshake is asked first and the
binary's ``--version`` second.

Rule 1: a version that cannot be read is reported unknown (None) and never refuses a
start; only a version known to be older than the provider's minimum does, with a
message naming it and the upgrade command (``refuse_if_too_old``).

Rule 2: ``--version`` runs at most once per binary: the cache is keyed by the
resolved file's identity (real path, inode, size, mtime), so an upgrade in place is
read again. It runs off the event loop (a child process, a ``stat`` in a worker
thread), bounded by ``VERSION_TIMEOUT_S``; at most one run per binary is under way,
and every other caller waits for it.

Rule 3: only a program that is the agent itself is asked: its file name is the
program's name (``claude``, ``claude.exe``, ``codex``). A session command such as
``npx claude`` or a wrapper script would answer with its own version, which would be
a wrong answer rather than none.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Mapping

import attrs
import trio

from agentsd.providers.programs import Program
from agentsd_protocol.errors import AgentUnsupported

log = logging.getLogger(__name__)

# A native CLI answers in 30-50 ms warm, 0.5 s cold or through a node wrapper; a
# binary that takes longer is not going to answer.
VERSION_TIMEOUT_S = 5.0
MAX_VERSION_OUTPUT_BYTES = 4096  # a version is a line; more is not a version
_NUMBERS = re.compile(r"^(\d+)\.(\d+)\.(\d+)")

FileKey = tuple[str, int, int, int]  # real path, inode, size, mtime in ns


def numeric(version: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of ``2.1.332`` or ``0.171.0-alpha.1``; None otherwise."""
    match = _NUMBERS.match(version)
    if match is None:
        return None
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def refuse_if_too_old(program: Program, version: str, minimum: tuple[int, int, int]) -> None:
    """Raise ``AgentUnsupported`` when ``version`` is known to be below ``minimum``
    (Rule 1: a version that does not parse is not known to be anything)."""
    found = numeric(version)
    if found is None or found >= minimum:
        return
    oldest = ".".join(map(str, minimum))
    raise AgentUnsupported(
        f"{program.name} {version} is too old for agentsd (it needs {oldest} or later); "
        f"upgrade it: {program.upgrade_hint()}",
        version=version,
        minimum=oldest,
    )


def is_the_program(argv0: str, program: Program) -> bool:
    """Whether ``argv0`` names ``program`` itself (Rule 3)."""
    stem = os.path.basename(argv0).removesuffix(".exe")
    return stem == program.name


def _file_key(path: str) -> FileKey | None:
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return real, st.st_ino, st.st_size, st.st_mtime_ns


@attrs.define(eq=False)
class _Reading:
    """A ``--version`` run under way; its waiters take ``version`` once ``done``."""

    done: trio.Event = attrs.field(factory=trio.Event)
    version: str | None = None


class ProgramVersions:
    """What each agent binary said its version is (Rule 2). One per daemon."""

    def __init__(self, timeout_s: float = VERSION_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._known: dict[FileKey, str | None] = {}
        self._by_path: dict[str, str] = {}  # the last version read for a path as given
        self._reading: dict[FileKey, _Reading] = {}

    def last_known(self, path: str) -> str | None:
        """The version last learned for ``path`` (no file system access), if any."""
        return self._by_path.get(path)

    async def remember(self, argv0: str, program: Program, version: str) -> None:
        """Record what the agent at ``argv0`` said in its handshake, so that the
        daemon's status reports it without running the binary."""
        if not is_the_program(argv0, program):
            return
        key = await trio.to_thread.run_sync(_file_key, argv0)
        if key is not None:
            self._known[key] = version
        self._by_path[argv0] = version

    def reported(self, argv0: str, version: str) -> None:
        """Record the version an agent that is no known ``Program`` (an ACP agent,
        from its ``agentInfo``) reported in its handshake, for the daemon's status."""
        self._by_path[argv0] = version

    async def read(self, argv0: str, program: Program, env: Mapping[str, str]) -> str | None:
        """The version ``argv0 --version`` prints, from the cache when this binary
        was asked before; None when it cannot be read (Rules 1-3). ``env`` is the
        agent's environment (a node wrapper finds ``node`` on its PATH). Never raises
        but cancellation."""
        if not is_the_program(argv0, program):
            return None
        key = await trio.to_thread.run_sync(_file_key, argv0)
        if key is None:
            return None
        if key in self._known:
            return self._known[key]
        reading = self._reading.get(key)
        if reading is not None:
            await reading.done.wait()
            return reading.version
        reading = self._reading[key] = _Reading()
        try:
            reading.version, final = await self._run(key[0], program, env)
            if final:
                self._known[key] = reading.version
            if reading.version is not None:
                self._by_path[argv0] = reading.version
        finally:
            del self._reading[key]
            reading.done.set()
        return reading.version

    async def _run(
        self, path: str, program: Program, env: Mapping[str, str]
    ) -> tuple[str | None, bool]:
        """The version, and whether that answer is final for this binary: a run that
        timed out (a loaded machine, a cold disk) is tried again at the next start."""
        with trio.move_on_after(self.timeout_s) as scope:
            try:
                done = await trio.run_process(
                    [path, "--version"],
                    stdin=subprocess.DEVNULL,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    env=dict(env),
                )
            except OSError as exc:
                log.info("cannot run %s --version: %s", path, exc)
                return None, True
        if scope.cancelled_caught:
            log.warning("%s --version did not answer within %g s", path, self.timeout_s)
            return None, False
        output = done.stdout[:MAX_VERSION_OUTPUT_BYTES].decode(errors="replace")
        version = program.parse_version(output) if done.returncode == 0 else None
        if version is None:
            log.info("%s --version (exit %s) said no version: %r", path, done.returncode, output)
        return version, True


async def settle_version(
    versions: ProgramVersions,
    program: Program | None,
    minimum: tuple[int, int, int] | None,
    reported: str | None,
    argv0: str,
    env: Mapping[str, str],
) -> str | None:
    """The version to report for an agent whose handshake just completed: what the
    handshake ``reported`` (the adapter already judged it), else what ``argv0
    --version`` says, refused when known to be below ``minimum`` (Rule 1)."""
    if program is None:
        if reported is not None:
            versions.reported(argv0, reported)
        return reported
    if reported is not None:
        await versions.remember(argv0, program, reported)
        return reported
    version = await versions.read(argv0, program, env)
    if version is not None and minimum is not None:
        refuse_if_too_old(program, version, minimum)
    return version
