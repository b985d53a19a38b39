"""Export sinks' cursors and leases, written inside the store's write transaction.

A sink (`exports/sink.py`) sends receipts to a receiver in log order and records here how far
the receiver acknowledged. Only the lease's holder moves the cursor: a process takes the lease
when it is free, expired or already its own, and keeps it by renewing it; a holder that lost it
(another process took over a lease it let expire) can no longer write, so the cursor never moves
back and two replicas never send as one. Every change is made holding the cursor's row
(SQLite's `BEGIN IMMEDIATE`, PostgreSQL's row lock taken by the read), so a read and the write
after it cannot race; two replicas making a new sink's cursor at once meet its key, and the
second's write fails with nothing written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from loopwarden.clock import format_time
from loopwarden.kernel.sql.dialect import Connection
from loopwarden.kernel.sql.records import ExportCursor
from loopwarden.kernel.sql.schema import EXPORT_CURSORS
from loopwarden.kernel.store.reader import Reader

MAX_ERROR = 200  # characters of a failure's description kept


@dataclass(frozen=True)
class Lease:
    """A lease taken: the cursor as it now stands, and whether it was taken from another
    holder whose lease had expired (a takeover)."""

    cursor: ExportCursor
    took_over: bool


class ExportCursors:
    """The cursor reads and writes of a write transaction (`Txn.cursors`), on its connection:
    `lock` is what a read appends to take the row it reads (`ProvedRows.lock_clause`), `now`
    the transaction's time."""

    def __init__(self, conn: Connection, lock: str, now: Callable[[], datetime]) -> None:
        self.conn = conn
        self.dialect = conn.dialect
        self._lock = lock
        self._now = now
        self._reader = Reader(conn)

    @property
    def now(self) -> datetime:
        return self._now()

    def export_cursor(self, sink: str) -> ExportCursor | None:
        """The sink's cursor, its row held by this transaction until it ends."""
        if self._lock:
            self.conn.execute(f"SELECT 1 FROM export_cursors WHERE sink = ?{self._lock}", (sink,))
        return self._reader.export_cursor(sink)

    def take_export_lease(
        self, sink: str, holder: str, target: str, seconds: float
    ) -> Lease | None:
        """Hold `sink`'s lease for `seconds` from now if it is free, expired or `holder`'s own
        (a new sink's cursor starts before the first receipt); None while another holder's lease
        is live."""
        cursor = self.export_cursor(sink)
        until = self.now + timedelta(seconds=seconds)
        if cursor is None:
            cursor = ExportCursor(sink, -1, target, holder, until, None, None, None, 0)
            self.conn.execute(self.dialect.insert(EXPORT_CURSORS), EXPORT_CURSORS.encode(cursor))
            return Lease(cursor, took_over=False)
        live = cursor.lease_expires_at is not None and cursor.lease_expires_at > self.now
        if cursor.holder not in (None, holder) and live:
            return None
        took_over = cursor.holder not in (None, holder)
        cursor = replace(cursor, holder=holder, lease_expires_at=until, target=target)
        self.conn.execute(
            "UPDATE export_cursors SET holder = ?, lease_expires_at = ?, target = ? WHERE sink = ?",
            (holder, format_time(until), target, sink),
        )
        return Lease(cursor, took_over)

    def advance_export(
        self, sink: str, holder: str, exported: int, sent: int, seconds: float
    ) -> bool:
        """Record that the receiver acknowledged every receipt up to leaf `exported` (`sent` of
        them in this delivery), clear the last error and renew the lease; False (nothing
        written) if `holder` no longer holds it. The cursor never moves back."""
        cursor = self.export_cursor(sink)
        if cursor is None or cursor.holder != holder:
            return False
        until = self.now + timedelta(seconds=seconds)
        self.conn.execute(
            "UPDATE export_cursors SET exported = ?, sent = sent + ?, succeeded_at = ?, "
            "error = NULL, lease_expires_at = ? WHERE sink = ?",
            (max(exported, cursor.exported), sent, format_time(self.now), format_time(until), sink),
        )
        return True

    def note_export_failure(self, sink: str, holder: str, error: str) -> bool:
        """Record a failed delivery (`error`: a short description with no URL or secret in it);
        False if `holder` no longer holds the lease."""
        cursor = self.export_cursor(sink)
        if cursor is None or cursor.holder != holder:
            return False
        self.conn.execute(
            "UPDATE export_cursors SET failed_at = ?, error = ? WHERE sink = ?",
            (format_time(self.now), error[:MAX_ERROR], sink),
        )
        return True

    def release_export_lease(self, sink: str, holder: str) -> bool:
        """Give the lease up (a server stopping): another process may take it at once."""
        cursor = self.export_cursor(sink)
        if cursor is None or cursor.holder != holder:
            return False
        self.conn.execute(
            "UPDATE export_cursors SET holder = NULL, lease_expires_at = NULL WHERE sink = ?",
            (sink,),
        )
        return True
