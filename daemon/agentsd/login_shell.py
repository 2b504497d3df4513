"""The environment the user's login shell gives: run it once, read what it exports.

    $SHELL -l -i -c 'echo M1; /usr/bin/env -0; echo M2'   (stdin /dev/null, own session)

Rules:

1. Only what lies between the two random markers counts. Start-up files print
   banners, MOTDs and version-manager notices to stdout; all of it is ignored.
   ``env -0`` separates entries with NUL, so a value with newlines survives. The
   markers differ: a shell may export the last argument of its previous command as
   ``$_``, so the first marker can appear inside the environment, never the second.
2. Bounded in time and size. The shell gets ``timeout_s`` to print its environment
   and ``MAX_OUTPUT_BYTES`` of output; past either it has failed.
3. Nothing of the shell outlives the capture. It runs in its own session (so an rc
   that reads a terminal, runs ``stty`` or starts tmux finds none) and its whole
   process group is SIGKILLed before the shell is reaped: background jobs an rc
   started die with it, as they would when a terminal closes. The group is killed
   while the shell is unreaped, so its id cannot have been reused (see
   ``agentsd.child`` Rule 5). Cleanup is shielded and bounded.
4. Failure is a value, never a crash or a hang: ``CaptureFailed`` says why (the
   shell is missing, exited, timed out, printed too much, or is not one that
   understands ``-c``), and the caller falls back to the daemon's own environment.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path

import trio

MAX_OUTPUT_BYTES = 8 * 1024 * 1024  # Linux caps an environment at a few MiB (ARG_MAX)
READ_BYTES = 64 * 1024
REAP_TIMEOUT_S = 2.0  # after SIGKILL only the kernel's cleanup remains
# Set while the shell runs, so a user's rc can tell (``[ -n "$AGENTSD_RESOLVING_ENVIRONMENT" ]``
# and skip slow or interactive things), plus the switches oh-my-zsh and its tmux
# plugin honour; none of them reaches an agent (``agentsd.agent_env``).
CAPTURE_VARS: Mapping[str, str] = {
    "AGENTSD_RESOLVING_ENVIRONMENT": "1",
    "DISABLE_AUTO_UPDATE": "true",
    "ZSH_TMUX_AUTOSTART": "false",
    "ZSH_TMUX_AUTOSTARTED": "true",
}
# A shell's own bookkeeping, meaningless in another process.
SHELL_STATE_VARS = frozenset({"SHLVL", "PWD", "OLDPWD", "_"})
# csh and tcsh take -l only as their sole flag; they get -i -c (what VS Code runs).
_CSH_FAMILY = frozenset({"csh", "tcsh"})


class CaptureFailed(Exception):
    """The login shell did not yield an environment; the message says why."""


def login_shell(env: Mapping[str, str]) -> str | None:
    """The user's shell: ``$SHELL``, else the passwd entry's; None without either."""
    shell = env.get("SHELL")
    if shell:
        return shell
    try:
        return pwd.getpwuid(os.getuid()).pw_shell or None
    except KeyError:
        return None


def shell_argv(shell: str, markers: tuple[str, str]) -> list[str]:
    """The command line that prints the environment between the two ``markers``.
    ``env`` by absolute path sidesteps aliases and functions named ``env``."""
    env_program = shutil.which("env", path="/usr/bin:/bin") or "env"
    script = f"echo {markers[0]}; {env_program} -0; echo {markers[1]}"
    flags = ["-i", "-c"] if Path(shell).name in _CSH_FAMILY else ["-l", "-i", "-c"]
    return [shell, *flags, script]


def parse_output(output: bytes, markers: tuple[str, str]) -> dict[str, str] | None:
    """The environment between the two ``markers`` lines of ``output``, or None when
    both are not there (Rule 1). Names and values are decoded as the OS does
    (``os.fsdecode``), so any bytes reach the agent unchanged."""
    start_tag = markers[0].encode() + b"\n"
    start = output.find(start_tag)
    if start < 0:
        return None
    body_start = start + len(start_tag)
    end = output.find(markers[1].encode(), body_start)
    if end < 0:
        return None
    env: dict[str, str] = {}
    for entry in output[body_start:end].split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name and b"\n" not in name:
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


async def capture(shell: str, base_env: Mapping[str, str], timeout_s: float) -> dict[str, str]:
    """Run ``shell`` as a login shell over ``base_env`` and return the environment it
    exports, with ``CAPTURE_VARS`` and ``SHELL_STATE_VARS`` removed (the caller puts
    back what it wants of its own). Raises ``CaptureFailed``; on cancellation the
    shell's group is killed and reaped before the cancellation propagates (Rule 3)."""
    markers = (f"agentsd-env-{os.urandom(16).hex()}", f"agentsd-end-{os.urandom(16).hex()}")
    home = base_env.get("HOME") or "/"
    cwd = home if await trio.to_thread.run_sync(os.path.isdir, home) else "/"
    argv = await trio.to_thread.run_sync(shell_argv, shell, markers)  # looks up env
    try:
        process = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env={**base_env, **CAPTURE_VARS, "SHELL": shell},
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        raise CaptureFailed(f"cannot run the login shell {shell}: {exc.strerror or exc}") from None
    output = bytearray()
    finished = False
    try:
        assert process.stdout is not None
        with trio.move_on_after(timeout_s):
            finished = await _read_until(process.stdout, output, markers[1])
    finally:
        await _end(process)
    if len(output) > MAX_OUTPUT_BYTES:
        raise CaptureFailed(
            f"the login shell {shell} printed more than {MAX_OUTPUT_BYTES} bytes "
            "before the end of its environment"
        )
    env = parse_output(bytes(output), markers)
    if env is not None:
        for name in (*CAPTURE_VARS, *SHELL_STATE_VARS):
            env.pop(name, None)
        return env
    if not finished:
        raise CaptureFailed(
            f"the login shell {shell} did not print its environment within {timeout_s:g} s"
        )
    code = process.returncode
    ended = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited {code}"
    raise CaptureFailed(
        f"the login shell {shell} {ended} without printing its environment "
        f"(a shell that does not take `-l -i -c COMMAND`?)"
    )


async def _read_until(stream: trio.abc.ReceiveStream, output: bytearray, closing: str) -> bool:
    """Read into ``output`` until the ``closing`` marker, end of output or the size
    bound. True unless the size bound stopped it."""
    tag = closing.encode()
    search_from = 0
    while len(output) <= MAX_OUTPUT_BYTES:
        chunk = await stream.receive_some(READ_BYTES)
        if not chunk:
            return True
        output += chunk
        if len(output) > MAX_OUTPUT_BYTES:
            return False  # past the bound, whatever this read holds
        if output.find(tag, search_from) >= 0:
            return True
        search_from = max(0, len(output) - len(tag) + 1)
    return False


async def _end(process: trio.Process) -> None:
    """Rule 3: SIGKILL the group while the shell is unreaped, then reap it. Shielded
    and bounded; never raises."""
    with trio.CancelScope(shield=True):
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with trio.move_on_after(REAP_TIMEOUT_S):
            await process.wait()
        assert process.stdout is not None
        await process.stdout.aclose()
