"""The bundled witness's own store: the latest checkpoint it cosigned for each log.

One SQLite file in the witness's directory, apart from any loopwarden store (a witness is run
by another party, on another machine). Checking a submission against the stored checkpoint and
storing the new one is one `BEGIN IMMEDIATE` transaction, so two submissions at once cannot
roll the witness back (the race tlog-witness warns about), even across processes. Refused
submissions whose log signature verified are kept too, as the spec allows: they may be the
evidence of a log that forked.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS logs (origin TEXT PRIMARY KEY, size INTEGER NOT NULL, "
    "root BLOB NOT NULL, note TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS refused (at INTEGER NOT NULL, origin TEXT NOT NULL, "
    "status INTEGER NOT NULL, reason TEXT NOT NULL, request TEXT NOT NULL)",
)
STORE_NAME = "witness.db"
KEEP_REFUSED = 1000  # refused submissions kept (the oldest go first)


@dataclass(frozen=True)
class Latest:
    """The latest checkpoint cosigned for a log: its size, root, and the note as served (the
    log's verified signatures and the witness's cosignature)."""

    size: int
    root: bytes
    note: str


class Held:
    """What a transaction sees and may change: the latest checkpoint of logs, by origin."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def latest(self, origin: str) -> Latest | None:
        row = self.conn.execute(
            "SELECT size, root, note FROM logs WHERE origin = ?", (origin,)
        ).fetchone()
        return None if row is None else Latest(int(row[0]), bytes(row[1]), str(row[2]))

    def store(self, origin: str, latest: Latest) -> None:
        self.conn.execute(
            "INSERT INTO logs (origin, size, root, note) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (origin) DO UPDATE SET size = excluded.size, root = excluded.root, "
            "note = excluded.note",
            (origin, latest.size, latest.root, latest.note),
        )

    def refused(self, at: int, origin: str, status: int, reason: str, request: str) -> None:
        self.conn.execute(
            "INSERT INTO refused (at, origin, status, reason, request) VALUES (?, ?, ?, ?, ?)",
            (at, origin, status, reason, request),
        )
        self.conn.execute(
            "DELETE FROM refused WHERE rowid <= (SELECT max(rowid) FROM refused) - ?",
            (KEEP_REFUSED,),
        )


class CosignerStore:
    """The witness's SQLite file. `atomically(fn)` runs `fn(held)` in one immediate
    transaction: it commits (durably) if `fn` returns, and leaves nothing if it raises."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        for ddl in SCHEMA:
            self._conn.execute(ddl)

    def atomically(self, fn: Callable[[Held], T]) -> T:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(Held(self._conn))
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            return result

    def latest(self, origin: str) -> Latest | None:
        with self._lock:
            return Held(self._conn).latest(origin)

    def origins(self) -> list[tuple[str, int]]:
        with self._lock:
            rows = self._conn.execute("SELECT origin, size FROM logs ORDER BY origin").fetchall()
        return [(str(o), int(s)) for o, s in rows]

    def refusals(self) -> list[tuple[int, str, int, str]]:
        """Refused submissions kept, oldest first: (time, origin, status, reason)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT at, origin, status, reason FROM refused ORDER BY rowid"
            ).fetchall()
        return [(int(a), str(o), int(s), str(r)) for a, o, s, r in rows]

    def close(self) -> None:
        with self._lock:
            self._conn.close()
