"""Fake login shells for the tests of ``agentsd.login_shell``: small ``/bin/sh`` scripts
used as ``$SHELL``. Each runs ``profile`` (what the user's start-up files would do),
then the command agentsd gives with ``-c``, as a real ``sh -l -i -c`` does."""

from __future__ import annotations

from pathlib import Path

BANNER = "Welcome to the fake login shell; you have new mail"
"""What the start-up files print on stdout before the command runs (rc-file noise)."""

MULTI_LINE = "first line\nsecond = line"
"""A value with a newline and an ``=``, exported by `profile_adding`."""


def write_shell(path: Path, profile: str) -> Path:
    """An executable fake login shell at ``path`` that runs ``profile`` first."""
    path.write_text(
        "#!/bin/sh\n"
        f"{profile}\n"
        '[ "$1" = -l ] || exit 64  # agentsd asks for a login shell\n'
        "for command; do :; done  # the last argument: the -c command\n"
        'eval "$command"\n'
    )
    path.chmod(0o755)
    return path


def profile_adding(directory: Path | str) -> str:
    """Start-up files that print a banner, put ``directory`` first on PATH and export
    a multi-line value, as ~/.profile adding ~/.local/bin does."""
    return (
        f'echo "{BANNER}"\n'
        f'PATH="{directory}:$PATH"; export PATH\n'
        f"MULTI_LINE='{MULTI_LINE}'; export MULTI_LINE"
    )


def profile_reading(path_file: Path) -> str:
    """Start-up files that put the directory named in ``path_file`` first on PATH:
    change the file to change what the next capture gets."""
    return f'PATH="$(cat {path_file}):$PATH"; export PATH'


def profile_hanging(pid_file: Path) -> str:
    """Start-up files that leave a background job (its pid in ``pid_file``) and then
    hang, as an rc waiting on a lock or a network mount does."""
    return f"sleep 300 &\necho $! > {pid_file}\nsleep 300"


def profile_waiting(release_file: Path) -> str:
    """Start-up files that wait until ``release_file`` exists: a capture the test ends."""
    return f"while [ ! -e {release_file} ]; do sleep 0.05; done"
