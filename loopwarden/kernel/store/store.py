"""The store: the only writer. One contract over every backend of the registry
(`backends.py`) — a SQLite file (the embedded default, `sqlite.py`) or a PostgreSQL database
shared by many server replicas (`postgres.py`).

One write path. `Store.write(fn)` runs `fn(tx)` inside one write transaction on the store's
writer thread: `fn` reads current state and decides, and each `tx.append(...)` seals a receipt,
chains it to the loop's previous one and folds it into the projection tables; the receipt's
Merkle leaf is given in the same transaction on SQLite and by the integrator soon after on
PostgreSQL (`integrator.py`). Either everything `fn` did commits, or nothing does. Concurrent
writes are group-committed: one transaction, one savepoint per body, one durable COMMIT for all.

Why a sync transaction body on a dedicated thread (and not a statement-per-await async driver
such as aiosqlite or psycopg's async side): no `await` can split a transaction, so a cancelled
caller can never leave one half done, and a whole governed step costs one queue hop to the
writer thread instead of one per statement (measured: a statement-per-await transaction adds
1.7-10.5 ms per turn). Reads are one hop too: `read(fn)` runs `fn` on the backend's read side
(aiosqlite's connection thread; PostgreSQL's reader threads) over one consistent snapshot.

A process that makes one write and exits (the `loopwarden hook` command, started for every tool
call a model makes) opens with `open_now` and writes with `write_now` on its own thread: the
same transaction with no event loop, no writer thread and no read side to start.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Required, TypedDict, TypeVar, Unpack

import anyio
import anyio.to_thread

from loopwarden.clock import Clock, format_time, system_clock
from loopwarden.errors import (
    IntegrityError,
    InvalidInput,
    KeyRetired,
    NotFound,
    StoreBusy,
    StoreError,
    StoreUnavailable,
)
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.log.keys import Keyring, KeyStore, Signer
from loopwarden.kernel.log.rotations import Tenure, Window, history_chain
from loopwarden.kernel.log.seals import parse_envelope
from loopwarden.kernel.sql.backends import Backend, StoreClosed, Synchronous, first_line
from loopwarden.kernel.sql.dialect import Connection
from loopwarden.kernel.sql.location import Location, parse_location
from loopwarden.kernel.sql.records import SealedRow
from loopwarden.kernel.sql.schema import LEGACY_SCHEMA, SCHEMA_VERSION
from loopwarden.kernel.sql.sqlite import connect, make_private
from loopwarden.kernel.sql.worker import Job, Worker
from loopwarden.kernel.state.events import ReceiptBody
from loopwarden.kernel.state.registry import Kinds
from loopwarden.kernel.store.integrator import (
    MAX_PENDING,
    Integrator,
    integrate_batch,
    pending_count,
)
from loopwarden.kernel.store.migrations import anchor_key_history, migrate
from loopwarden.kernel.store.reader import PolicyCache, Reader
from loopwarden.kernel.store.txn import Appended, Txn
from loopwarden.kernel.store.written import Written
from loopwarden.observe import NOBODY, Observer

__all__ = [
    "Appended",
    "Backend",
    "Store",
    "StoreClosed",
    "Synchronous",
    "Txn",
    "connect",
    "make_private",
    "migrate",
    "snapshot",
    "startup_check",
]

T = TypeVar("T")

BACKLOG = 1024
"""Calls waiting for the writer past which a new write or quota is refused (`StoreBusy`) rather
than queued: under a load the database cannot keep up with, callers hear "retry" at once
instead of waiting longer and longer (and the queue's memory stays bounded)."""
BODIES_KEPT = 1024
"""Typed receipt bodies a store keeps decoded (`Store.body_of`)."""
RETRIES = 3
"""Times a body that lost a row lock to another transaction (`Backend.contended`) is run again
in a transaction of its own before its caller hears `StoreBusy`."""


class OpenOptions(TypedDict, total=False):
    """`Store.open`'s options: `Store.open_now`'s keyword arguments."""

    kinds: Required[Kinds]
    keyring: Keyring | None
    secret: bytes | None
    key_dir: Path | None
    clock: Clock
    checkpoint_every: int
    synchronous: Synchronous
    check: bool
    create: bool
    backlog: int


@dataclass(eq=False, repr=False)
class Store:
    """The store. Open with `await Store.open(...)`; close with `await store.close()`."""

    backend: Backend
    location: Location
    signer: Signer
    keyring: Keyring
    integrity: Integrity
    clock: Clock
    checkpoint_every: int
    kinds: Kinds
    backlog: int = BACKLOG
    # A server sets its telemetry here (`observe/`).
    observer: Observer = field(default=NOBODY, init=False)
    policies: PolicyCache = field(default_factory=PolicyCache, init=False)
    # The loop rows and log state its writer last wrote (`written.py`).
    written: Written = field(default_factory=Written, init=False)
    # That of a started store whose writes lock rows only.
    integrator: Integrator | None = field(default=None, init=False)
    # Receipts awaiting leaves past which writes are refused.
    max_pending: int = field(default=MAX_PENDING, init=False)
    # The last time the key history lets `signer` sign (None: no rotation retired it yet).
    signs_until: datetime | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.origin = Reader(self.backend.writer).meta("origin") or "loopwarden.local/unknown"
        self._bodies: OrderedDict[tuple[str, str], ReceiptBody | None] = OrderedDict()
        self._bodies_lock = threading.Lock()
        self._writer = Worker("loopwarden-writer", self._commit_group)
        self._started = False  # `open` started the writer thread and the read side
        self._closed = False

    @property
    def file(self) -> Path:
        """The database file of a store that is one (SQLite); `StoreError` for a store on a
        server, which has none (`location` says where every store is)."""
        file = self.location.file
        if file is None:
            raise StoreError(f"the {self.location.backend.title} store {self.location} is no file")
        return file

    @classmethod
    async def open(
        cls, location: Path | str | Location, signer: Signer, **options: Unpack[OpenOptions]
    ) -> Store:
        """Open (creating and migrating if needed) the store at `location`: a path or
        `sqlite:///PATH` for SQLite, `postgresql://…` for PostgreSQL (`location.py`), for the
        application's receipt kinds `kinds` (`loopwarden/catalog.py`: the kernel imports no
        feature, so the store is given the registry its receipts are built and folded by).

        `keyring` is the trusted public keys receipts are verified against (default: the
        signer's own); `secret` the integrity secret (default: the one in the key directory of
        the home `key_dir`, created on first use; for a SQLite file the home defaults to the
        file's directory, and a PostgreSQL store needs one of the two). With `check` (the
        default) the store refuses to serve a database whose journal head, Merkle frontier and
        projection disagree: `IntegrityError`, and `loopwarden verify` explains what is wrong.
        With `create` false a store that does not exist yet is `NotFound`, and not made. The
        options and their defaults are `open_now`'s.
        """

        def _open() -> Store:
            return cls.open_now(location, signer, **options)

        store = await anyio.to_thread.run_sync(_open)
        try:
            await store.backend.start_reading()
        except BaseException:
            await store.backend.close()
            raise
        store._writer.start()
        if not store.backend.integrates_inline:
            store.integrator = Integrator(
                store.backend.connect_integrator,
                store._integrate,
                clock=store.clock,
                delays=lambda seconds: store.observer.integrated(seconds),
            )
            store.integrator.start()
        store._started = True
        return store

    @classmethod
    def open_now(
        cls,
        location: Path | str | Location,
        signer: Signer,
        *,
        kinds: Kinds,
        keyring: Keyring | None = None,
        secret: bytes | None = None,
        key_dir: Path | None = None,
        clock: Clock = system_clock,
        checkpoint_every: int = 256,
        synchronous: Synchronous = "full",
        check: bool = True,
        create: bool = True,
        backlog: int = BACKLOG,
    ) -> Store:
        """`open`, on the calling thread, for a process that makes one write and exits (a host
        hook) and need not start an event loop for it: only the backend's write connection is
        opened (no writer thread, no read side), so the store serves `write_now` and
        `close_now` only."""
        if backlog < 1:
            raise InvalidInput(
                f"a store's backlog limit is a positive number of calls, not {backlog}"
            )
        where = parse_location(location)
        if secret is None and key_dir is None:
            if where.file is None:
                raise StoreError(f"a {where.backend.title} store needs the home whose keys it uses")
            key_dir = where.file.parent
        trusted = keyring if keyring is not None else Keyring({signer.key_id: signer.public_key})
        backend = where.backend.load().open(where.target, synchronous=synchronous)
        try:
            integrity = _integrity(backend, where, secret, key_dir, create=create)
            migrate(backend, integrity, kinds)
            backend.check_secret(integrity)
            store = cls(
                backend, where, signer, trusted, integrity, clock, checkpoint_every, kinds, backlog
            )
            if key_dir is not None:
                keys = KeyStore(key_dir)
                chain = history_chain(keys)
                if chain.first is not None:
                    anchor_key_history(backend, keys.statements()[0])
                store.signs_until = chain.windows.get(signer.key_id, Window()).until
            if check:  # on one snapshot: a writer committing meanwhile cannot skew its counts
                with type(backend).snapshot(where.target) as conn:
                    startup_check(Reader(conn))
            return store
        except BaseException as exc:
            _close_quietly(backend)
            if isinstance(exc, backend.errors):
                raise StoreError(f"cannot open the database: {exc}") from None
            raise

    def signer_at(self, at: datetime) -> Signer:
        """The signer for something dated `at`; `KeyRetired` past the time the key history
        retired it (`rotations.follow` moves a server on to the new key before then)."""
        signer, until = self.signer, self.signs_until
        if until is not None and at > until:
            raise KeyRetired(
                f"this server's signing key {signer.key_id} was retired by `keys rotate`: it "
                f"signs nothing after {format_time(until)}, and the home's new key cannot be "
                "used here. Nothing was sealed; give this server the rotated key directory "
                "(or restart it)"
            )
        return signer

    def sign_with(self, tenure: Tenure) -> None:
        """Sign from now on with `tenure`'s signer, until its stated end (`rotations.follow`);
        the new key's public half joins the keys receipts are verified against."""
        if tenure.signer.key_id not in self.keyring:
            self.keyring.add(tenure.signer.public_key)
        self.signs_until = None  # never a moment with the new key and the old one's end
        self.signer = tenure.signer
        self.signs_until = tenure.until

    def body_of(self, row: SealedRow) -> ReceiptBody | None:
        """The typed body of a stored receipt, or None where its payload is not one of this
        application's bodies (a tampered or unknown one). Not verified: `receipt`, `journal`
        and the audit check signatures. Memoized per store by receipt id and the hash of the
        envelope bytes it holds (a bounded LRU): a projection shows the same recent receipts
        call after call, and a loop's opening receipt can carry 10⁵ todos."""
        key = (row.receipt_id, hashlib.sha256(row.envelope).hexdigest())
        with self._bodies_lock:
            if key in self._bodies:
                self._bodies.move_to_end(key)
                return self._bodies[key]
        parsed = parse_envelope(row.envelope)
        body = None if parsed is None else self.kinds.parse_payload(parsed.payload)
        with self._bodies_lock:
            self._bodies[key] = body
            while len(self._bodies) > BODIES_KEPT:
                self._bodies.popitem(last=False)
        return body

    def queue_depth(self) -> int:
        """Write calls waiting for the writer thread (not yet in a commit): cheap, lock-free."""
        return self._writer.depth()

    def write_now(self, fn: Callable[[Txn], T]) -> T:
        """`write` for the one caller of a store opened with `open_now`, on the calling thread
        (no group commit, no event loop): the same transaction, committed whole or not at all.
        A store opened with `open` has a writer thread that owns its connection: `StoreError`."""
        if self._closed or self._started:
            raise StoreUnavailable("write_now is for a store opened with open_now")
        if not self.backend.integrates_inline:
            self._refuse_past_pending(pending_count(self.backend.writer), None)
        job = Job(fn, None, groupable=False)
        while self._commit_group([job]):  # a body alone is given back only after a deadlock
            pass
        if job.error is not None:
            raise job.error
        if not self.backend.integrates_inline:  # the process may exit next: integrate now
            with suppress(Exception):  # else a server's integrator does, within its poll
                integrate_batch(self.backend.writer, self._integrate)
        result: T = job.result
        return result

    def close_now(self) -> None:
        """`close` for a store opened with `open_now`, on the calling thread."""
        if self._closed:
            return
        if self._started:
            raise StoreError("a store opened with open is closed with close")
        self._closed = True
        self.backend.close_now()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._writer.stop()
        if self.integrator is not None:
            await anyio.to_thread.run_sync(self.integrator.stop)
        await self.backend.close()

    async def integrate(self) -> int:
        """Give every receipt pending now its Merkle leaf before returning (this replica's
        integrator, on its own thread; where the store integrates as it writes, nothing is
        pending and this returns 0). Returns how many this call integrated."""
        if self.integrator is None:
            return 0
        return await anyio.to_thread.run_sync(self.integrator.drain)

    async def checkpoint(self) -> int:
        """Sign a checkpoint of the whole tree, every receipt committed before the call in it
        (`integrate` first); returns its size."""
        await self.integrate()
        size: int = await self.write(Txn.checkpoint)
        return size

    def _txn(self, conn: Connection | None = None, *, wait: bool = True) -> Txn:
        conn = conn if conn is not None else self.backend.writer
        written = self.written if conn is self.backend.writer else None
        return Txn(
            conn, self.policies, self.integrity, self, self.clock, wait=wait, written=written
        )

    def _integrate(
        self, conn: Connection, limit: int, held: Callable[[], bool]
    ) -> list[datetime] | None:
        return self._txn(conn).integrate(limit, held=held)

    def pending_backlog(self) -> int:
        """Receipts sealed and awaiting their Merkle leaves, as this replica's integrator last
        counted them (0 where the store integrates as it writes)."""
        return self.integrator.backlog if self.integrator is not None else 0

    def _refuse_past_pending(self, pending: int, last_error: str | None) -> None:
        if pending <= self.max_pending:
            return
        why = f" (the integrator's last failure: {last_error})" if last_error else ""
        raise StoreBusy(
            f"{pending} receipts are waiting for their Merkle leaves (the limit is "
            f"{self.max_pending}){why}: nothing was written; retry"
        )

    async def write(self, fn: Callable[[Txn], T]) -> T:
        """Run `fn(tx)` atomically: it commits whole if it returns, and leaves nothing if it raises.

        Calls that arrive while a commit is in progress are grouped into the next one: a single
        write transaction in which each body runs in its own savepoint (so one failure rolls
        back only itself) and one COMMIT makes them all durable before any caller returns.
        Runs to completion even if the awaiting task is cancelled once the writer has taken it,
        so nothing is ever cut in half. Database failures become `StoreError`;
        `LoopwardenError`s pass through. Refused at once with `StoreBusy`, nothing written, past
        `backlog` waiting calls or `max_pending` receipts waiting for their Merkle leaves.
        """
        if self.integrator is not None:  # receipts waiting for leaves past the limit: push back
            self._refuse_past_pending(self.integrator.backlog, self.integrator.last_error)
        result: T = await self._call(fn, groupable=True)
        return result

    async def _call(self, fn: Callable[..., Any], *, groupable: bool) -> Any:
        if self._closed:
            raise StoreClosed()
        if not self._started:  # opened with open_now: no writer thread to hand it to
            raise StoreError("a store opened with open_now writes with write_now")
        waiting = self._writer.depth()
        if waiting >= self.backlog:
            raise StoreBusy(
                f"{waiting} writes are already waiting for the store (its limit is "
                f"{self.backlog}): nothing was written; retry"
            )
        return await self._writer.call(fn, groupable=groupable)

    def _commit_group(self, batch: list[Job]) -> list[Job]:
        """The writer thread's group commit: one transaction, a savepoint per body if several.
        Returns the bodies to run again, first, in the next transaction (the others are done).

        Where the backend locks rows (PostgreSQL), only the first body waits for the locks it
        needs; a later body that finds one held fails at once, is rolled back to its savepoint
        and is given back, to run as the first body of the next transaction. So no two
        transactions ever wait for each other in a circle because of grouping (the database
        breaks any other cycle, and that body is run again too, at most `RETRIES` times)."""
        backend = self.backend
        grouped = len(batch) > 1
        try:
            backend.begin()
        except BaseException as exc:
            busy = StoreBusy(f"the database is unavailable: {exc}")
            self._finish(batch, busy)
            return []
        again: list[Job] = []
        try:
            conn = backend.writer
            log = None  # the Merkle log as the bodies committed so far left it
            for index, job in enumerate(batch):
                tx = self._txn(wait=index == 0)
                tx.rows.carry_log(log)
                try:
                    with backend.body():  # the savepoint's statements ride in the body's batch
                        if grouped:
                            conn.execute("SAVEPOINT body")
                        job.result = job.fn(tx)
                        if grouped:  # last: a statement of the body that failed skips it
                            conn.execute("RELEASE body")
                except BaseException as exc:
                    if not grouped:
                        raise
                    conn.execute("ROLLBACK TO body")  # and the log is as it was before it
                    conn.execute("RELEASE body")
                    if isinstance(exc, backend.contended) and _again(job, first=index == 0):
                        again.append(job)
                    else:
                        job.error = self._as_store_error(exc)
                else:
                    log = tx.rows.log_carried or log
            if backend.integrates_inline:
                tx = self._txn()
                tx.rows.carry_log(log)
                tx.integrate()
            backend.commit()
        except BaseException as exc:
            backend.rollback()
            if isinstance(exc, backend.contended) and all(_again(j, first=True) for j in batch):
                return batch  # a deadlock the database broke: nothing was written
            self._finish(batch, self._as_store_error(exc))
            return []
        if self.integrator is not None:
            self.integrator.poke()
        return again

    @staticmethod
    def _finish(batch: list[Job], error: BaseException | None) -> None:
        """A failed commit fails every body in the group (none was durable)."""
        if error is not None:
            for job in batch:
                job.error, job.result = error, None

    async def simulate(self, fn: Callable[[Txn], T]) -> T:
        """Run `fn(tx)` in a write transaction that is always rolled back: what would happen
        now, with nothing persisted (used to predict a claim exactly)."""
        result: T = await self._call(lambda: self._simulate(fn), groupable=False)
        return result

    def _simulate(self, fn: Callable[[Txn], T]) -> T:
        backend = self.backend
        try:
            backend.begin()
            try:
                return fn(self._txn())
            finally:
                backend.rollback()
        except backend.errors as exc:
            raise StoreError(f"database error: {exc}") from exc

    async def read(self, fn: Callable[[Reader], T], *, snapshot: bool = True) -> T:
        """Run `fn(reader)` on a consistent snapshot of committed state (one read transaction).
        `snapshot=False` is for a read of one statement, which is consistent by itself: it
        runs without a transaction around it (on PostgreSQL two statements fewer)."""
        if self._closed:
            raise StoreClosed()
        if not self._started:
            raise StoreError("a store opened with open_now has no read side")
        return await self.backend.read(lambda c: fn(Reader(c, self.policies)), snapshot=snapshot)

    def _as_store_error(self, exc: BaseException) -> BaseException:
        """Database errors become `StoreError`; everything else is delivered as raised."""
        if isinstance(exc, self.backend.errors):
            error = StoreError(f"database error: {exc}")
            error.__cause__ = exc
            return error
        return exc


def _again(job: Job, *, first: bool) -> bool:
    """Whether a body that lost a row lock runs again: always if it was not its transaction's
    first (as the next one's first it waits, so it cannot lose again that way); a first body
    (a deadlock the database broke) at most `RETRIES` times."""
    if first:
        job.attempts += 1
        return job.attempts <= RETRIES
    return True


def _integrity(
    backend: Backend, where: Location, secret: bytes | None, key_dir: Path | None, *, create: bool
) -> Integrity:
    """The store's integrity secret: `secret`, else the home's. A store at the current version
    already has its secret; only a new or an upgraded one may create it (a refused store is
    left exactly as it was). `NotFound` for no store where `create` is off."""
    version = backend.version_of(backend.writer)
    if version == 0 and not create:
        raise NotFound(f"there is no loopwarden store in {where}")
    if secret is not None:
        return Integrity(secret)
    assert key_dir is not None
    return Integrity(KeyStore(key_dir).load_secret(create=version != SCHEMA_VERSION))


def _close_quietly(backend: Backend) -> None:
    with suppress(Exception):  # closing after a failed open: the open's error is the one to report
        backend.writer.close()


@contextmanager
def snapshot(location: Path | str | Location) -> Iterator[Reader]:
    """A read-only, consistent snapshot of the store at `location` (for audits and exports).

    Opens its own connection, so it works while servers write. `NotFound` if there is no
    store; a schema this loopwarden cannot read and database failures are `StoreError`. A
    store of an older schema (not yet opened by this loopwarden) is read as a legacy reader does
    (`Reader`).
    """
    where = parse_location(location)
    backend = where.backend.load()
    try:
        with backend.snapshot(where.target) as conn:
            version = backend.version_of(conn)
            if version == 0:
                raise NotFound(f"there is no loopwarden store in {where}")
            if not LEGACY_SCHEMA <= version <= SCHEMA_VERSION:
                raise StoreError(
                    f"the database has schema version {version}; this loopwarden reads "
                    f"versions {LEGACY_SCHEMA} to {SCHEMA_VERSION}"
                )
            yield Reader(conn, legacy=version < SCHEMA_VERSION)
    except backend.errors as exc:
        raise StoreError(f"cannot read the database: {first_line(exc)}") from None


def _chain(chain_id: str) -> str:
    """A journal chain as a message names it: `loop L1`, or `pool team-a`."""
    return f"pool {chain_id[5:]}" if chain_id.startswith("pool:") else f"loop {chain_id}"


_SEALED = (
    "(SELECT loop_id, seq, digest FROM journal UNION ALL SELECT loop_id, seq, digest FROM pending)"
)
"""Every sealed receipt's place in its chain: integrated (the journal) or pending."""


def startup_check(reader: Reader) -> None:
    """Cheap consistency checks run at open: O(loops + log n), never a journal scan.

    Refuses (IntegrityError) if the journal, the Merkle frontier and the projection heads
    disagree, e.g. after a restored backup of one file or a hand edit. Receipts pending
    integration count in their chains, not in the tree.
    """
    problems: list[str] = []
    size, frontier = reader.log_state()
    count = reader.journal_count()
    if count != size:
        problems.append(f"the journal holds {count} receipts but the Merkle log has {size} leaves")
    elif size:
        last = reader.receipt_at(size - 1)
        try:
            if last is None or reader.node(0, size - 1) != merkle.leaf_hash(last.envelope):
                problems.append("the last Merkle leaf does not hash the last journal receipt")
            if merkle.frontier_at(size, reader.node) != frontier:
                problems.append("the stored Merkle frontier does not match the stored tree nodes")
        except LookupError as exc:
            problems.append(str(exc))
    heads = reader.conn.execute(  # every chain's stored head: loops, and budget pools
        "SELECT h.chain, h.head_seq, h.head_digest, j.seq, j.digest FROM ("
        "SELECT loop_id AS chain, head_seq, head_digest FROM loops UNION ALL "
        "SELECT 'pool:' || name, head_seq, head_digest FROM pools) h "
        f"LEFT JOIN (SELECT loop_id, max(seq) AS seq FROM {_SEALED} s GROUP BY loop_id) m "
        f"ON m.loop_id = h.chain LEFT JOIN {_SEALED} j ON j.loop_id = m.loop_id AND j.seq = m.seq"
    ).fetchall()
    for chain, head_seq, head_digest, seq, digest in heads:
        if head_seq != seq or head_digest != digest:
            problems.append(
                f"{_chain(chain)}: the projection head (seq {head_seq}) does not match the "
                f"journal head (seq {seq})"
            )
    orphans = reader.conn.execute(
        f"SELECT DISTINCT loop_id FROM {_SEALED} s WHERE loop_id NOT IN (SELECT loop_id FROM loops) "
        "AND loop_id NOT IN (SELECT 'pool:' || name FROM pools)"
    ).fetchall()
    for (loop_id,) in orphans:
        problems.append(f"{_chain(loop_id)} has receipts but no projection")
    if problems:
        raise IntegrityError(
            "refusing to serve a damaged store: "
            + "; ".join(problems[:5])
            + ("" if len(problems) <= 5 else f" (+{len(problems) - 5} more)")
            + ". Run `loopwarden verify` for a full audit."
        )
