"""The integrator: pending receipts into the one Merkle tree, a batch at a time.

Two orders (docs/architecture.md). A write transaction locks only the rows it decides on — its
loop, and the budget pools when it reads them — seals its receipt into its loop's chain (`seq`,
`prev`) and leaves it *pending* (`Txn.append`): writes on different loops run side by side, on
every replica. The integrator then gives pending receipts their leaves: in one short transaction
per batch it takes the log's row, moves up to `BATCH` pending receipts to the journal in ticket
order, extends the tree and signs the checkpoints that fall due (`Txn.integrate`).

Where one lock orders every write (SQLite's `BEGIN IMMEDIATE`) the store integrates in the write
transaction itself and this thread never runs (`Backend.integrates_inline`). On PostgreSQL each
replica runs one, and they take turns: the log's row is taken `FOR UPDATE SKIP LOCKED`, so a
replica whose integrator finds it held skips its turn instead of queueing behind it. Take-over
needs nothing more: a replica killed mid-batch has its transaction rolled back by the server and
its lock released with its session, and the next replica to poll (every `INTERVAL`) finds the
receipts still pending — none lost, none in the tree twice (the journal's keys refuse a second).

Its cadence: a local commit wakes it, and it lets receipts gather for `GATHER` before its
batch, so under load one hold of the log's row serves every commit of that time (a replica
that finds the row held skips its turn: `SKIP LOCKED`). What
it costs a receipt is measured: each batch reports its receipts' delays from their time to
their leaf (`loopwarden_integration_delay_seconds`). Past `MAX_PENDING` receipts waiting, the
store refuses writes (`Store.write`): push back, never a backlog without bound.

Why ticket order keeps every conflict's order: a write draws its tickets (the pending table's
identity) after it holds the rows it decides on, so of two writes to one row the later draws
after the earlier committed. A smaller ticket can commit after a larger one only when the two
share no row; a batch integrates what is committed, and the late one comes in a later batch.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime

from loopwarden.kernel.sql.backends import first_line
from loopwarden.kernel.sql.dialect import Connection

BATCH = 256
"""Pending receipts given leaves per transaction."""
INTERVAL = 0.05
"""Seconds between polls when no local commit wakes the integrator (other replicas' receipts,
and a dead replica's)."""
GATHER = 0.02
"""Seconds a woken integrator lets receipts gather before its batch: under load, one batch (one
hold of the log's row, one round of statements) then serves every commit of that time instead
of one each, at the price of that much delay to a receipt's leaf."""
MAX_PENDING = 10_000
"""Receipts waiting for their leaves past which this replica refuses new writes (`StoreBusy`,
`Store.write`): about ten seconds of the fleet's writes at this machine's rates. The count is
read at every poll, so a burst between two polls can pass it by what arrives in one interval."""

Integrate = Callable[[Connection, int, Callable[[], bool]], list[datetime] | None]
"""`Txn.integrate` on a connection: gives up to that many pending receipts their leaves and
returns their times, if the third argument says the log's row was granted (else None)."""
Delays = Callable[[Sequence[float]], None]
"""Told, after each batch, each receipt's seconds from its time to its leaf."""


def integrate_batch(
    conn: Connection, integrate: Integrate, limit: int = BATCH, *, wait: bool = False
) -> list[datetime] | None:
    """One batch in its own transaction on `conn` (an autocommit connection): the times of the
    receipts given leaves (none if nothing is pending), or None if another integrator holds
    the log's row (with `wait`: after it lets go).

    In one pipeline (`Connection.pipeline`), two round trips: the lock with the pending
    receipts and the log's state (`Txn.integrate` asks for them behind the lock, and reads the
    lock's answer first); then every write and the COMMIT — not one a statement (nine before):
    on a busy machine each round trip waits for this replica's turn on a core, and every other
    integrator waits for the row meanwhile."""
    lock = "FOR UPDATE" if wait else "FOR UPDATE SKIP LOCKED"
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            taken = conn.execute(f"SELECT 1 FROM log_state WHERE id = 1 {lock}")
            moved = integrate(conn, limit, lambda: taken.fetchone() is not None)
            conn.execute("COMMIT")
    except BaseException:
        with suppress(Exception):  # a lost connection rolls back by itself
            conn.execute("ROLLBACK")
        raise
    return moved


def pending_count(conn: Connection) -> int:
    """Receipts sealed and not yet integrated, across every replica (one statement)."""
    row = conn.execute("SELECT count(*) FROM pending").fetchone()
    return int(row[0]) if row else 0


def pending_and_size(conn: Connection) -> tuple[int, int]:
    """`pending_count`, and the Merkle log's size (one statement)."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM pending), (SELECT size FROM log_state WHERE id = 1)"
    ).fetchone()
    return (int(row[0]), int(row[1] or 0)) if row else (0, 0)


@dataclass(eq=False, repr=False)
class Integrator:
    """A replica's integrator thread: it runs a batch when woken (`poke`, after a commit that
    left receipts pending) or every `interval`, and batches again at once while they come full.
    A failed batch (the database away, a damaged log) changes nothing; it is counted, its first
    line kept in `last_error`, and the next poll tries again on a fresh connection.

    Replicas take turns without talking: a poll that finds the log grown since this integrator
    last looked (another replica's batch just ran, and took every receipt pending then, this
    replica's too) lets what came since gather for `gather` more before it batches. Each batch
    then serves every replica's commits of that time, as one replica's does, instead of each
    replica running its own small one: the row is held once per `gather` across the fleet, not
    once per replica. A replica that finds the log still for that long batches (a dead
    replica's integrator holds nothing up); `drain` and `stop` never wait their turn.

    `connect` opens its autocommit connection, `integrate` gives pending receipts their leaves
    on it, `delays` is told each batch's delays (times by `clock`); `monotonic` times the turns.
    """

    connect: Callable[[], Connection]
    integrate: Integrate
    _: KW_ONLY
    clock: Callable[[], datetime]
    delays: Delays | None = None
    batch: int = BATCH
    interval: float = INTERVAL
    gather: float = GATHER
    monotonic: Callable[[], float] = time.monotonic
    integrated: int = field(default=0, init=False)  # receipts this replica gave leaves
    backlog: int = field(default=0, init=False)  # pending across the store, at the last poll
    failures: int = field(default=0, init=False)
    last_error: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._conn: Connection | None = None
        self._size: int | None = None  # the log's size when this integrator last looked
        self._grown_at = -math.inf  # when it last found the log grown by another replica
        self._using = threading.Lock()  # the connection: this thread's, or a `drain`'s caller's
        self._wake = threading.Event()
        self._stopping = threading.Event()  # set when the thread is to end (wakes its waits)
        self._thread = threading.Thread(target=self._run, name="loopwarden-integrator", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        self._wake.set()

    def halt(self) -> None:
        """End the thread and leave what is pending as it is (a test's replica that has stopped
        integrating; `run_once` and `drain` still work)."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def stop(self) -> None:
        """End the thread, then give what is still pending its leaves (best effort: another
        replica, or the next start, does it otherwise)."""
        self.halt()
        with suppress(Exception):
            while self.run_once(turns=False):  # its last batch does not wait its turn
                pass
        if self._conn is not None:
            with suppress(Exception):
                self._conn.close()
            self._conn = None

    def run_once(self, *, wait: bool = False, turns: bool = True) -> int:
        """Count what is pending (`backlog`), then one batch (see `integrate_batch`) unless
        another replica's just ran (`turns`; never with `wait`); returns how many receipts it
        gave leaves. A failure leaves the count fresh and raises."""
        with self._using:
            if self._conn is None:
                self._conn = self.connect()
            try:
                self.backlog, size = pending_and_size(self._conn)
                turn = not self._grown_lately(size) or wait or not turns
                times = (
                    integrate_batch(self._conn, self.integrate, self.batch, wait=wait)
                    if self.backlog and turn
                    else []
                )
            except BaseException:
                conn, self._conn = self._conn, None
                with suppress(Exception):
                    conn.close()
                raise
            times = times or []  # None: another replica's integrator holds the log
            if times:  # the size it left (if another batch ran in between, the next look says so)
                self._size = size + len(times)
            self.integrated += len(times)
            self.backlog = max(self.backlog - len(times), 0)
        if times and self.delays is not None:
            now = self.clock()
            self.delays([max((now - at).total_seconds(), 0.0) for at in times])
        return len(times)

    def _grown_lately(self, size: int) -> bool:
        """Whether another replica's integrator grew the log less than `gather` ago, as far as
        this one can tell: since its last look, or within `gather` of the look that found it
        grown."""
        now = self.monotonic()
        if self._size is not None and size != self._size:
            self._grown_at = now
        self._size = size
        return now - self._grown_at < self.gather

    def drain(self) -> int:
        """Integrate every receipt committed before the call, waiting for another replica's
        integrator if it holds the log; returns how many this replica integrated."""
        total = 0
        while moved := self.run_once(wait=True):
            total += moved
        return total

    def _run(self) -> None:
        while not self._stopping.is_set():
            if self._wake.wait(self.interval) and self.gather:
                self._stopping.wait(self.gather)
            self._wake.clear()
            try:
                while self.run_once() >= self.batch and not self._stopping.is_set():
                    pass
            except Exception as exc:
                self.failures += 1
                self.last_error = first_line(exc)
