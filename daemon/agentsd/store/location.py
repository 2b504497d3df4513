"""Where the database lives, and whether a commit made there still lasts.

SQLite keeps writing to the files it opened whatever happens to their names: a
state directory deleted, moved or made read-only while the daemon runs goes
unnoticed, and commits land in files that a restart will not find (or not at all).

Rule 1: the writer asks `Location.problem` right before each COMMIT and again
after it, before acknowledging anything (``writer``): each check is a few
``stat``/``access`` calls, microseconds against a commit's fsync. A problem before
the COMMIT rolls the batch back; one that appeared during it fails the batch's
callers too, since what committed may not survive a restart.

Rule 2: the checks are about names and permissions only: the database path must
still name the file that was opened, the write-ahead log's path the log that was
opened, and the state directory must be writable (by mode and by ``access``:
a read-only mount, or a directory its owner made read-only). When they hold again (the
directory moved back, made writable again), writes resume by themselves.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import attrs

__all__ = ["FileId", "Location"]


@attrs.frozen
class FileId:
    """Which file a path named (device and inode)."""

    dev: int
    ino: int

    @classmethod
    def of(cls, path: Path) -> FileId | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return cls(st.st_dev, st.st_ino)


@attrs.frozen
class Location:
    """The database file and write-ahead log the writer opened, by identity."""

    path: Path
    database: FileId
    wal: FileId | None  # None: no log existed when the database was opened

    @classmethod
    def of(cls, path: Path) -> Location:
        """The files ``path`` names now; call right after opening it for writing.
        Raises FileNotFoundError if the database does not exist."""
        database = FileId.of(path)
        if database is None:
            raise FileNotFoundError(f"database {path} does not exist")
        return cls(path=path, database=database, wal=FileId.of(_wal_path(path)))

    def problem(self) -> str | None:
        """Why a commit made now might not survive a restart; None when it would.
        Never raises."""
        try:
            if FileId.of(self.path) != self.database:
                return (
                    f"{self.path} no longer names the database this daemon opened: "
                    "its state directory was deleted or moved, or the file replaced"
                )
            wal = _wal_path(self.path)
            if self.wal is not None and FileId.of(wal) != self.wal:
                return f"the write-ahead log {wal} was deleted or replaced"
            # The mode bit too: root's access() ignores it, but a directory made
            # read-only by its owner is meant to be left alone.
            mode = os.stat(self.path.parent).st_mode
            if not mode & stat.S_IWUSR or not os.access(self.path.parent, os.W_OK):
                return f"the state directory {self.path.parent} is not writable (read-only)"
        except OSError as exc:
            return f"the state directory {self.path.parent} cannot be checked: {exc.strerror}"
        return None


def _wal_path(path: Path) -> Path:
    return path.with_name(path.name + "-wal")
