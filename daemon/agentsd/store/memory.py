"""What the writer keeps in memory instead of reading it back from SQLite: each
session's head seq and the number of rows in the operation ledger.

Rule 1: only the connection's writer changes this state, inside a transaction, and
every change can be undone: ``mark()`` before an op, ``rollback_to(mark)`` when the
op's savepoint is rolled back, ``rollback_to(0)`` when the whole transaction fails,
``commit()`` after COMMIT returned. So the memory never runs ahead of the file: after
a failed commit the heads are where the table has them, and the next append
continues the seqs with no gap.

Rule 2: a session's head is read from the table the first time the writer needs it
and kept from then on. The functions that append, create and delete sessions
(``journal``, ``sessions``) keep it in step, so the tables are never read back per
append.

Rule 3: ``committed_operation_rows`` is the ledger's row count as of the last
commit; it is the one field other threads read (a single int, replaced whole).

Rule 4: the undo log holds data, not closures: ``(session_id, previous head)``
(None: the session had no head in memory) or ``(None, rows added to the
ledger)``. Every append adds an entry and every commit drops them all, so what an
entry costs to build and to free is paid per append (with a closure per entry,
building and freeing them took about 4% of the time the GIL was held, writer's
thread and trio's together, with 100 writers sharing commits).
"""

from __future__ import annotations

import sqlite3

__all__ = ["UnknownSession", "WriterMemory"]


class UnknownSession(KeyError):
    """No session row with this id exists."""

    def __init__(self, session_id: str) -> None:
        super().__init__(session_id)
        self.session_id = session_id

    def __str__(self) -> str:
        return f"unknown session {self.session_id!r}"


class WriterMemory:
    def __init__(self) -> None:
        self._heads: dict[str, int] = {}
        self._undo: list[tuple[str, int | None] | tuple[None, int]] = []
        self.operation_rows = 0
        self.committed_operation_rows = 0

    # Transactions (Rule 1).

    def mark(self) -> int:
        return len(self._undo)

    def rollback_to(self, mark: int) -> None:
        undo, heads = self._undo, self._heads
        while len(undo) > mark:
            session_id, previous = undo.pop()
            if session_id is None:
                assert previous is not None
                self.operation_rows -= previous
            elif previous is None:
                heads.pop(session_id, None)
            else:
                heads[session_id] = previous

    def commit(self) -> None:
        self._undo.clear()
        self.committed_operation_rows = self.operation_rows

    # Heads (Rule 2).

    def head(self, conn: sqlite3.Connection, session_id: str) -> int:
        """The session's head seq. Raises ``UnknownSession`` if it has no row."""
        head = self._heads.get(session_id)
        if head is None:
            row = conn.execute(
                "SELECT (SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = sessions.id)"
                " FROM sessions WHERE id = ?",
                (session_id,),
            ).fetchone()
            if row is None:
                raise UnknownSession(session_id)
            head = int(row[0])
            self._set_head(session_id, head)
        return head

    def advance(self, conn: sqlite3.Connection, session_id: str, count: int) -> int:
        """Reserve ``count`` seqs of the session; the first of them."""
        head = self._heads.get(session_id)
        if head is None:
            head = self.head(conn, session_id)
        self._heads[session_id] = head + count
        self._undo.append((session_id, head))
        return head + 1

    def session_created(self, session_id: str) -> None:
        self._set_head(session_id, 0)

    def session_deleted(self, session_id: str) -> None:
        previous = self._heads.pop(session_id, None)
        if previous is not None:
            self._undo.append((session_id, previous))

    def _set_head(self, session_id: str, head: int) -> None:
        previous = self._heads.get(session_id)
        self._heads[session_id] = head
        self._undo.append((session_id, previous))

    # The operation ledger (Rule 3).

    def load_operation_rows(self, conn: sqlite3.Connection) -> None:
        """Count the ledger's rows (once, when the store opens)."""
        count = int(conn.execute("SELECT COUNT(*) FROM operations").fetchone()[0])
        self.operation_rows = self.committed_operation_rows = count

    def operation_rows_changed(self, delta: int) -> None:
        if delta:
            self.operation_rows += delta
            self._undo.append((None, delta))
