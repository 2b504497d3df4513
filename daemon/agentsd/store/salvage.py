"""Copying what can still be read from a damaged database into a fresh one.

Rule 1: the damaged files are never changed: they are renamed aside together
(``agentsd.db`` -> ``agentsd.db.damaged-<time>``, its ``-wal`` and ``-shm`` with the
same new name, so the log still belongs to its database) and only read after.

Rule 2: reading goes row by row in rowid order, in small pages; a page SQLite
cannot read is stepped over by growing jumps of rowid, so one damaged b-tree page
loses the rows on it, not the rest of its table. What could not be read, or would
break the schema's references (events of a session that is gone), is counted
and reported, never silently dropped.

Rule 3: the fresh database is made by ``open_database`` (the current schema), the
rows go in in one transaction per table, and a salvage that fails midway leaves
the damaged files aside and the fresh file for inspection, never a mix.
"""

from __future__ import annotations

import sqlite3
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import attrs
import msgspec

from agentsd.store.database import open_database
from agentsd.store.integrity import DatabaseDamaged, check_files
from agentsd_protocol.api.events import decode_event

__all__ = ["SalvageReport", "TableReport", "salvage_database"]

# Tables in the order their references need (sessions before what points at them).
TABLES = ("sessions", "leases", "events", "operations")
_PAGE_ROWS = 256  # rows per read: a failed read loses no more than it must
_MAX_JUMP = 1 << 62  # the largest rowid step tried past a damaged page
# Columns holding JSON, per table: a row whose JSON does not parse was read from a
# page SQLite could not vouch for (a truncated file reads as zeros) and is dropped.
_JSON_COLUMNS = {
    "sessions": ("options", "env", "command", "last_exit", "error"),
    "leases": ("death",),
    "operations": ("result",),
}


@attrs.define
class TableReport:
    copied: int = 0
    unreadable_spans: list[tuple[int, int]] = attrs.field(factory=list)  # rowids skipped
    rejected: int = 0  # read, but refused by the fresh schema (a reference gone)
    garbled: int = 0  # read, but its content does not parse
    error: str | None = None  # the table could not be read at all


@attrs.define
class SalvageReport:
    kept_aside: list[Path]
    tables: dict[str, TableReport]
    journal_gaps: dict[str, int]  # session id -> events missing below its last seq
    damage: str | None  # what the file checks found (a lost log cannot be counted)

    def lines(self) -> list[str]:
        out = [f"kept the damaged files as {', '.join(str(p) for p in self.kept_aside)}"]
        if self.damage is not None:
            out.append(f"found: {self.damage}")
        for name, table in self.tables.items():
            if table.error is not None:
                out.append(f"{name}: nothing could be read ({table.error})")
                continue
            lost = ""
            if table.unreadable_spans:
                spans = ", ".join(f"{a}-{b}" for a, b in table.unreadable_spans[:5])
                lost = f"; unreadable rowids {spans}"
            if table.rejected:
                lost += f"; {table.rejected} rows dropped (what they refer to is lost)"
            if table.garbled:
                lost += f"; {table.garbled} garbled rows dropped"
            out.append(f"{name}: {table.copied} rows copied{lost}")
        for session_id, missing in sorted(self.journal_gaps.items()):
            out.append(f"session {session_id}: {missing} journal events lost")
        return out

    @property
    def lossless(self) -> bool:
        return (
            self.damage is None
            and not self.journal_gaps
            and all(
                t.error is None and not t.unreadable_spans and not t.rejected and not t.garbled
                for t in self.tables.values()
            )
        )


def salvage_database(path: Path) -> SalvageReport:
    """Move the database at ``path`` aside (Rule 1) and copy what can be read from
    it into a fresh database at ``path``. The caller holds the state directory's
    lock (no daemon runs). Raises FileNotFoundError if there is no database."""
    if not path.exists():
        raise FileNotFoundError(f"database {path} does not exist")
    try:
        check_files(path)
        damage = None
    except DatabaseDamaged as exc:
        damage = exc.detail
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
    kept: list[Path] = []
    for suffix in ("", "-wal", "-shm", "-journal"):
        source = path.with_name(path.name + suffix)
        if source.exists():
            target = aside.with_name(aside.name + suffix)
            source.rename(target)
            kept.append(target)
    source_conn = _open_source(aside)
    try:
        fresh = open_database(path)
        try:
            tables = {name: _copy_table(source_conn, fresh, name) for name in TABLES}
            gaps = _journal_gaps(fresh)
        finally:
            fresh.close()
    finally:
        source_conn.close()
    return SalvageReport(kept_aside=kept, tables=tables, journal_gaps=gaps, damage=damage)


def _open_source(path: Path) -> sqlite3.Connection:
    side_files = (path.with_name(path.name + s) for s in ("-wal", "-journal"))
    uri = "file:" + urllib.parse.quote(str(path.absolute())) + "?mode=ro"
    if not any(p.exists() for p in side_files):
        uri += "&immutable=1"
    conn = sqlite3.connect(uri, uri=True, timeout=5.0)
    # A truncated file's header counts more pages than it holds, which SQLite takes
    # as corruption of the whole file; with writable_schema it reads the pages
    # there are. Nothing is written: the connection is read-only.
    conn.execute("PRAGMA writable_schema = ON")
    return conn


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")]


def _copy_table(source: sqlite3.Connection, fresh: sqlite3.Connection, name: str) -> TableReport:
    report = TableReport()
    try:
        wanted = _columns(fresh, name)
        have = set(_columns(source, name))
    except sqlite3.DatabaseError as exc:
        report.error = str(exc)
        return report
    if not have:
        report.error = "the table is missing"
        return report
    # Columns both schemas know; a rowid alias ("id" of events) is renumbered.
    columns = [c for c in wanted if c in have and not (name == "events" and c == "id")]
    listed = ", ".join(columns)
    insert = f"INSERT INTO {name} ({listed}) VALUES ({', '.join('?' * len(columns))})"
    fresh.execute("BEGIN")
    try:
        for row in _readable_rows(source, name, listed, report):
            if not _parses(name, columns, row):
                report.garbled += 1
                continue
            try:
                fresh.execute(insert, row)
            except sqlite3.IntegrityError:
                report.rejected += 1
            else:
                report.copied += 1
        fresh.execute("COMMIT")
    except BaseException:
        fresh.execute("ROLLBACK")
        raise
    return report


def _parses(name: str, columns: list[str], row: tuple[object, ...]) -> bool:
    values = dict(zip(columns, row, strict=True))
    try:
        if name == "events":
            kind, body = values["kind"], values["body"]
            if not isinstance(kind, str) or not isinstance(body, bytes | str):
                return False
            decode_event(kind, body.encode() if isinstance(body, str) else body)
        for column in _JSON_COLUMNS.get(name, ()):
            value = values.get(column)
            if value is not None:
                if not isinstance(value, bytes | str):
                    return False
                msgspec.json.decode(value)
    except msgspec.MsgspecError:
        return False
    return True


def _readable_rows(
    conn: sqlite3.Connection, name: str, listed: str, report: TableReport
) -> Iterator[tuple[object, ...]]:
    """Rows in rowid order (our tables' rowids are positive), stepping over what
    cannot be read (Rule 2): after a page fails, rows are read one at a time up to
    the one that cannot be, which is skipped."""
    query = f"SELECT rowid, {listed} FROM {name} WHERE rowid > ? ORDER BY rowid LIMIT ?"
    after = 0
    limit = _PAGE_ROWS
    while True:
        try:
            page = conn.execute(query, (after, limit)).fetchall()
        except sqlite3.DatabaseError:
            if limit > 1:
                limit = 1
                continue
            resumed = _resume_after(conn, name, after)
            report.unreadable_spans.append((after + 1, _MAX_JUMP if resumed is None else resumed))
            if resumed is None:
                return
            after = resumed
            limit = _PAGE_ROWS
            continue
        if not page:
            return
        for row in page:
            yield tuple(row[1:])
        after = int(page[-1][0])


def _resume_after(conn: sqlite3.Connection, name: str, after: int) -> int | None:
    """A rowid past ``after`` from which rows can be read again (``rowid > it``),
    found by growing jumps, or None when none can."""
    step = 1
    while step <= _MAX_JUMP:
        try:
            conn.execute(
                f"SELECT rowid FROM {name} WHERE rowid > ? ORDER BY rowid LIMIT 1",
                (after + step,),
            ).fetchall()
        except sqlite3.DatabaseError:
            step *= 4
            continue
        return after + step
    return None


def _journal_gaps(conn: sqlite3.Connection) -> dict[str, int]:
    rows = conn.execute(
        "SELECT session_id, MAX(seq) - COUNT(*) FROM events GROUP BY session_id"
    ).fetchall()
    return {str(session_id): int(missing) for session_id, missing in rows if missing}
