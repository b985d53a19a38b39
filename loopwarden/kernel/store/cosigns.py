"""Witnesses' cosignatures and the witness client's state, written inside the store's write
transaction (`Txn.witnesses`).

A cosignature is kept as the signature line the witness returned, beside the checkpoint it
signs: it vouches for itself, so nothing here needs to be proved. The witness rows are the
client's operational state (`loopwarden/witnesses/submitter.py`); a conflict recorded in one
stays until an operator clears it (`loopwarden witness clear`), so that an alarm is never
overwritten by the next success.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from loopwarden.clock import format_time
from loopwarden.kernel.sql.dialect import Connection
from loopwarden.kernel.sql.records import CosignatureRow, WitnessRow
from loopwarden.kernel.sql.schema import COSIGNATURES, WITNESSES
from loopwarden.kernel.store.reader import Reader

MAX_TEXT = 300  # characters of an error's or a conflict's description kept


class WitnessRecords:
    """The witness writes of a write transaction, on its connection; `now` its time."""

    def __init__(self, conn: Connection, now: Callable[[], datetime]) -> None:
        self.conn = conn
        self.dialect = conn.dialect
        self._now = now
        self._reader = Reader(conn)

    def _row(self, vkey: str, url: str) -> WitnessRow:
        for row in self._reader.witness_rows():
            if row.vkey == vkey:
                return row
        row = WitnessRow(vkey, url, 0, None, None, None, None, None, 0)
        self.conn.execute(self.dialect.insert(WITNESSES), WITNESSES.encode(row))
        return row

    def cosigned(self, vkey: str, url: str, size: int, lines: list[tuple[str, str, str]]) -> None:
        """Record that the witness `vkey` cosigned the checkpoint of `size`: its signature
        lines as `(witness name, key hash hex, line)`, checked by the caller against the
        witness's key (a stored line under the same name and key hash is replaced: it did not
        verify, or the client would not have asked); it now holds `size`."""
        self._row(vkey, url)
        now = self._now()
        for name, key_hash, line in lines:
            row = CosignatureRow(size, name, key_hash, line, now)
            self.conn.execute(self.dialect.upsert(COSIGNATURES), COSIGNATURES.encode(row))
        self.conn.execute(
            "UPDATE witnesses SET cosigned = ?, url = ?, succeeded_at = ?, error = NULL, "
            "failures = 0 WHERE vkey = ?",
            (size, url, format_time(now), vkey),
        )

    def holds(self, vkey: str, url: str, size: int) -> None:
        """Record the size the witness says it holds for this log (its 409 answer)."""
        self._row(vkey, url)
        self.conn.execute("UPDATE witnesses SET cosigned = ? WHERE vkey = ?", (size, vkey))

    def failed(self, vkey: str, url: str, error: str) -> int:
        """Record a failed submission (`error`: short, no secret); returns the failures in a
        row, this one included."""
        row = self._row(vkey, url)
        self.conn.execute(
            "UPDATE witnesses SET failed_at = ?, error = ?, failures = failures + 1, url = ? "
            "WHERE vkey = ?",
            (format_time(self._now()), error[:MAX_TEXT], url, vkey),
        )
        return row.failures + 1

    def conflict(self, vkey: str, url: str, description: str) -> bool:
        """Record a conflict: the witness holds a view of this log that this log does not
        extend. Returns whether it is new (a conflict already recorded is kept as it was)."""
        row = self._row(vkey, url)
        if row.conflict is not None:
            return False
        self.conn.execute(
            "UPDATE witnesses SET conflict = ?, conflict_at = ? WHERE vkey = ?",
            (description[:MAX_TEXT], format_time(self._now()), vkey),
        )
        return True

    def clear_conflict(self, vkey: str) -> bool:
        """Clear a witness's recorded conflict (an operator who investigated it); whether there
        was one."""
        found = any(r.vkey == vkey and r.conflict for r in self._reader.witness_rows())
        if found:
            self.conn.execute(
                "UPDATE witnesses SET conflict = NULL, conflict_at = NULL WHERE vkey = ?", (vkey,)
            )
        return found
