"""The WAL copied back into the database file on a thread of its own, not by the writer.

In WAL mode SQLite's commit that finds the log past `wal_autocheckpoint` pages copies the log
back into the database file before it returns (and, at `synchronous=full`, syncs that file):
measured here, one commit in a few hundred then takes tens of milliseconds, about 200 µs a
commit on average, which is a fifth of a governed turn. A store that runs for a while (one that
reads, `SqliteBackend.start_reading`) hands that work to a `Checkpointer`: its writer turns
autocheckpoint off and wakes the thread every `EVERY` commits, and the thread runs a PASSIVE
checkpoint on its own connection (SQLite works outside the GIL, so on a second core it costs
the writer nothing; PASSIVE never waits for, nor blocks, a reader or a writer). The writer
then finds a log copied back at its next `BEGIN` and starts it again from the top, as before.

A process that only writes a few receipts (the hook command) keeps SQLite's autocheckpoint,
and so does a writer whose checkpointer has stopped: the log never grows unattended. Other
processes sharing the file keep theirs too.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable

EVERY = 256  # commits between two checkpoints (a receipt commit writes about ten pages)
"""About 2,500 log pages (10 MB) between checkpoints: under SQLite's own 4,000."""


class Checkpointer:
    """A thread running `PRAGMA wal_checkpoint(PASSIVE)` on `connect()`'s connection when the
    writer asks (`committed`). Start with `start()`, end with `stop()`."""

    def __init__(
        self, connect: Callable[[], sqlite3.Connection], *, every: int | None = None
    ) -> None:
        self._connect = connect
        self._every = every or EVERY
        self._commits = 0
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="loopwarden-wal", daemon=True)
        self.runs = 0  # checkpoints made
        self.failed: BaseException | None = None  # why the thread ended early, if it did

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def committed(self) -> None:
        """One more commit by the writer (called on its thread)."""
        self._commits += 1
        if self._commits >= self._every:
            self._commits = 0
            self._wake.set()

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread after the checkpoint it may be making."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            conn = self._connect()
        except Exception as exc:  # the writer checkpoints as SQLite would (`running` is False)
            self.failed = exc
            return
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                self.runs += 1
        except Exception as exc:
            self.failed = exc
        finally:
            conn.close()
