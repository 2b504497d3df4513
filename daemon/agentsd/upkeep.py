"""``agentsd --check`` and ``agentsd --salvage``: the database, without serving it.

``--check`` runs the full ``PRAGMA integrity_check`` read-only (a running daemon may
keep running) and exits 0 when the database is sound, 1 when it is damaged.
``--salvage`` takes the state directory's lock (no daemon may run), moves the
damaged files aside and copies what can be read into a fresh database
(``agentsd.store.salvage``), then reports what was lost; it exits 0 when nothing
was, 1 when something was, 2 when there was nothing to salvage.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

from agentsd.paths import AlreadyRunning, StateLock
from agentsd.store.integrity import full_check
from agentsd.store.salvage import salvage_database

__all__ = ["add_arguments", "run_upkeep"]

DATABASE_NAME = "agentsd.db"
EXIT_SOUND = 0
EXIT_DAMAGED = 1
EXIT_NOTHING = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--check",
        action="store_true",
        help="check the whole database (PRAGMA integrity_check) and exit: 0 sound, 1 damaged",
    )
    group.add_argument(
        "--salvage",
        action="store_true",
        help="move a damaged database aside, copy what can be read into a fresh one "
        "and report what was lost (no daemon may run)",
    )


def run_upkeep(args: argparse.Namespace, state_dir: Path, socket_path: Path) -> int | None:
    """Run ``--check`` or ``--salvage`` if asked; their exit status, else None."""
    path = state_dir / DATABASE_NAME
    if args.check:
        return _check(path)
    if args.salvage:
        return _salvage(path, state_dir, socket_path)
    return None


def _check(path: Path) -> int:
    try:
        problems = full_check(path)
    except FileNotFoundError as exc:
        print(f"agentsd: {exc}", file=sys.stderr)
        return EXIT_NOTHING
    if not problems:
        print(f"{path}: ok")
        return EXIT_SOUND
    for problem in problems:
        print(f"{path}: {problem}")
    print(
        f"agentsd: {path} is damaged; `agentsd --salvage` copies what can be read", file=sys.stderr
    )
    return EXIT_DAMAGED


def _salvage(path: Path, state_dir: Path, socket_path: Path) -> int:
    lock = StateLock(state_dir, socket_path)
    try:
        lock.acquire()
    except (AlreadyRunning, FileNotFoundError) as exc:
        print(f"agentsd: cannot salvage: {exc}; stop the daemon first", file=sys.stderr)
        return EXIT_NOTHING
    try:
        report = salvage_database(path)
    except FileNotFoundError as exc:
        print(f"agentsd: {exc}", file=sys.stderr)
        return EXIT_NOTHING
    except (OSError, sqlite3.Error) as exc:
        print(f"agentsd: the salvage of {path} failed: {exc}", file=sys.stderr)
        return EXIT_DAMAGED
    finally:
        lock.release()
    for line in report.lines():
        print(line)
    if report.lossless:
        print(f"{path}: a fresh database holds every row that was read")
        return EXIT_SOUND
    print(f"{path}: a fresh database holds what could be read; the rest is listed above")
    return EXIT_DAMAGED
