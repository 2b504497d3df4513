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

__all__ = ["FileId", "Location", "wal_bytes"]


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
    # What ``problem`` checks, as the syscalls take it: it runs twice per batch,
    # and building paths and ``FileId``s cost more than its four syscalls.
    _checks: tuple[str, tuple[int, int], str, tuple[int, int] | None, str] = attrs.field(
        init=False, repr=False, eq=False
    )

    def __attrs_post_init__(self) -> None:
        wal = None if self.wal is None else (self.wal.dev, self.wal.ino)
        checks = (
            str(self.path),
            (self.database.dev, self.database.ino),
            str(_wal_path(self.path)),
            wal,
            str(self.path.parent),
        )
        object.__setattr__(self, "_checks", checks)

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
        database, database_id, wal, wal_id, directory = self._checks
        try:
            if _file_id(database) != database_id:
                return (
                    f"{self.path} no longer names the database this daemon opened: "
                    "its state directory was deleted or moved, or the file replaced"
                )
            if wal_id is not None and _file_id(wal) != wal_id:
                return f"the write-ahead log {wal} was deleted or replaced"
            # The mode bit too: root's access() ignores it, but a directory made
            # read-only by its owner is meant to be left alone.
            mode = os.stat(directory).st_mode
            if not mode & stat.S_IWUSR or not os.access(directory, os.W_OK):
                return f"the state directory {directory} is not writable (read-only)"
        except OSError as exc:
            return f"the state directory {directory} cannot be checked: {exc.strerror}"
        return None

    def wal_bytes(self) -> int:
        """``wal_bytes`` of this database: the writer asks after every commit, and
        the log's path is built once."""
        return _size(self._checks[2])


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def wal_bytes(path: Path) -> int:
    """The size of the write-ahead log of the database at ``path`` (0 if there is
    none, or it cannot be read)."""
    return _size(str(_wal_path(path)))


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _wal_path(path: Path) -> Path:
    return path.with_name(path.name + "-wal")
