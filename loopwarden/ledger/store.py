"""The store: the only writer. One SQLite file (WAL), shared safely by several processes.

One write path. `Store.write(fn)` runs `fn(tx)` inside a `BEGIN IMMEDIATE` transaction on a
worker thread: `fn` reads current state and decides, and each `tx.append(...)` seals a receipt,
chains it to the loop's previous one, extends the Merkle frontier and folds it into the
projection tables. Either everything `fn` did commits, or nothing does. Concurrent writes are
group-committed: one transaction, one savepoint per body, one durable COMMIT for all.

Why a sync transaction body on a worker thread (and not a statement-per-await async driver such
as aiosqlite): no `await` can split a transaction, so a cancelled caller can never leave one
half done, and a whole governed step costs one thread hop instead of one per statement.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import anyio.to_thread

from loopwarden.clock import Clock, system_clock
from loopwarden.errors import IntegrityError, NotFound, StoreError
from loopwarden.ledger import merkle
from loopwarden.ledger.integrity import LOG_MAC, Integrity
from loopwarden.ledger.keys import Keyring, KeyStore, Signer
from loopwarden.ledger.reader import LEGACY_SCHEMA, PolicyCache, Reader
from loopwarden.ledger.rebuild import rebuild_projection
from loopwarden.ledger.schema import MIGRATIONS, REBUILT_AT, SCHEMA_VERSION
from loopwarden.ledger.txn import Appended, Txn

__all__ = ["Appended", "Store", "Txn", "connect", "migrate", "snapshot", "startup_check"]

T = TypeVar("T")
Synchronous = Literal["full", "normal"]
BUSY_TIMEOUT_MS = 30_000
WAL_AUTOCHECKPOINT_PAGES = 4_000


def _qmarks(columns: str) -> str:
    return ",".join("?" for _ in columns.split(","))


def connect(
    path: Path, *, synchronous: Synchronous = "full", readonly: bool = False
) -> sqlite3.Connection:
    """Open a connection with loopwarden's pragmas (WAL, busy timeout, durability)."""
    try:
        if readonly:
            conn = sqlite3.connect(
                f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
            )
        else:
            make_private(path)
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if not readonly:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
            # Checkpoint the WAL every ~16 MB instead of SQLite's 4 MB: fewer, larger copies
            # back into the database file, paid by fewer commits.
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn
    except (sqlite3.Error, OSError) as exc:
        raise StoreError(f"cannot open the database: {exc}") from None


def make_private(path: Path) -> None:
    """Create the database file 0600 before SQLite does (SQLite gives its WAL and shared-memory
    files the database file's mode), and tighten an existing one, WAL included, left looser.

    An existing file is never opened here: closing any descriptor of a file drops every POSIX
    lock this process holds on it, including those of SQLite connections already open."""
    if not path.exists():
        with suppress(FileExistsError):
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with suppress(FileNotFoundError):
            if file.stat().st_mode & 0o077:
                os.chmod(file, 0o600)


def migrate(conn: sqlite3.Connection, integrity: Integrity) -> None:
    """Bring the schema to `SCHEMA_VERSION` in one transaction; refuse a database from a newer
    loopwarden. Upgrading an existing database past `REBUILT_AT` re-derives its projection
    from the journal, with proofs (`rebuild.py`), or refuses if the two disagree."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the database has schema version {version}; this loopwarden knows {SCHEMA_VERSION}. "
                "Upgrade loopwarden."
            )
        for number in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[number]:
                conn.execute(statement)
        if version == 0:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('origin', ?)",
                (f"loopwarden.local/{secrets.token_hex(8)}",),
            )
            conn.execute(
                "INSERT INTO log_state (id, size, frontier, mac) VALUES (1, 0, x'', ?)",
                (integrity.mac(LOG_MAC, [0, ""]),),
            )
        elif version < REBUILT_AT:
            rebuild_projection(conn, integrity)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class _Pending:
    """One caller's transaction body waiting for the next group commit."""

    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[Txn], Any]) -> None:
        self.fn = fn
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class Store:
    """The embedded SQLite store. Open with `await Store.open(...)`; close with `await store.close()`.

    Two connections: one writer, used by one group commit at a time, and one reader for
    snapshots (WAL lets it read while a write is in progress).
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        reader_conn: sqlite3.Connection,
        path: Path,
        signer: Signer,
        keyring: Keyring,
        integrity: Integrity,
        clock: Clock,
        checkpoint_every: int,
    ) -> None:
        self._conn = conn
        self._reader_conn = reader_conn
        self.path = path
        self.signer = signer
        self.keyring = keyring
        self.integrity = integrity
        self.clock = clock
        self.checkpoint_every = checkpoint_every
        self.policies = PolicyCache()
        self._write_lock = anyio.Lock()
        self._read_limiter = anyio.CapacityLimiter(1)
        self._queue: list[_Pending] = []
        self.origin = Reader(conn).meta("origin") or "loopwarden.local/unknown"

    @classmethod
    async def open(
        cls,
        path: Path | str,
        signer: Signer,
        *,
        keyring: Keyring | None = None,
        secret: bytes | None = None,
        clock: Clock = system_clock,
        checkpoint_every: int = 256,
        synchronous: Synchronous = "full",
        check: bool = True,
    ) -> Store:
        """Open (creating and migrating if needed) the database at `path`.

        `keyring` is the trusted public keys receipts are verified against (default: the
        signer's own); `secret` the integrity secret (default: the one in the key directory
        beside the database, created on first use). With `check` (the default) the store refuses to serve a database whose
        journal head, Merkle frontier and projection disagree: `IntegrityError`, and
        `loopwarden verify` explains what is wrong.
        """

        def _open() -> Store:
            return cls.open_now(
                path,
                signer,
                keyring=keyring,
                secret=secret,
                clock=clock,
                checkpoint_every=checkpoint_every,
                synchronous=synchronous,
                check=check,
            )

        return await anyio.to_thread.run_sync(_open)

    @classmethod
    def open_now(
        cls,
        path: Path | str,
        signer: Signer,
        *,
        keyring: Keyring | None = None,
        secret: bytes | None = None,
        clock: Clock = system_clock,
        checkpoint_every: int = 256,
        synchronous: Synchronous = "full",
        check: bool = True,
    ) -> Store:
        """`open`, on the calling thread: for a process that makes one call and exits (a host
        hook), which need not start an event loop for it."""
        path = Path(path)
        trusted = keyring if keyring is not None else Keyring({signer.key_id: signer.public_key})
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = connect(path, synchronous=synchronous)
        reader_conn = None
        try:
            # A store at the current version already has its secret; only a new or an
            # upgraded one may create it (a refused store is left exactly as it was).
            current = conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
            key = secret or KeyStore(path.parent).load_secret(create=not current)
            integrity = Integrity(key)
            migrate(conn, integrity)
            reader_conn = connect(path, synchronous=synchronous)
            store = cls(
                conn, reader_conn, path, signer, trusted, integrity, clock, checkpoint_every
            )
            if check:
                startup_check(Reader(conn))
            return store
        except BaseException as exc:
            conn.close()
            if reader_conn is not None:
                reader_conn.close()
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"cannot open the database: {exc}") from None
            raise

    def close_now(self) -> None:
        """`close`, on the calling thread (the store must not be in use elsewhere)."""
        self._conn.close()
        self._reader_conn.close()

    def write_now(self, fn: Callable[[Txn], T]) -> T:
        """`write` for one caller on the calling thread (no group commit, no event loop): the
        same transaction, committed whole or not at all."""
        item = _Pending(fn)
        self._commit_group([item])
        if item.error is not None:
            raise item.error
        return item.result

    async def close(self) -> None:
        async with self._write_lock:
            await anyio.to_thread.run_sync(self._conn.close)
        await anyio.to_thread.run_sync(self._reader_conn.close, limiter=self._read_limiter)

    def _txn(self) -> Txn:
        return Txn(self._conn, self.policies, self.integrity, self, self.clock())

    async def write(self, fn: Callable[[Txn], T]) -> T:
        """Run `fn(tx)` atomically: it commits whole if it returns, and leaves nothing if it raises.

        Calls that arrive while a commit is in progress are grouped into the next one: a single
        `BEGIN IMMEDIATE` transaction in which each body runs in its own savepoint (so one
        failure rolls back only itself) and one `COMMIT` makes them all durable before any
        caller returns. Runs to completion even if the awaiting task is cancelled, so nothing
        is ever cut in half. `sqlite3` failures become `StoreError`; `LoopwardenError`s pass
        through.
        """
        item = _Pending(fn)
        self._queue.append(item)
        try:
            async with self._write_lock:
                if not item.done:
                    batch, self._queue = self._queue, []
                    await anyio.to_thread.run_sync(self._commit_group, batch)
        except anyio.get_cancelled_exc_class():
            # Cancelled while still queued: withdraw the body so no later group runs it. (Once a
            # group has taken it, it runs to its end; a retry with the idempotency key finds it.)
            if not item.done and item in self._queue:
                self._queue.remove(item)
            raise
        if item.error is not None:
            raise item.error
        return item.result

    def _commit_group(self, batch: list[_Pending]) -> None:
        conn = self._conn
        grouped = len(batch) > 1
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            busy = StoreError(f"the database is unavailable: {exc}", code="store_busy")
            self._finish(batch, busy)
            return
        try:
            for item in batch:
                if grouped:
                    conn.execute("SAVEPOINT body")
                try:
                    item.result = item.fn(self._txn())
                except BaseException as exc:
                    if not grouped:
                        raise
                    conn.execute("ROLLBACK TO body")
                    item.error = _as_store_error(exc)
                if grouped:
                    conn.execute("RELEASE body")
            conn.execute("COMMIT")
        except BaseException as exc:
            self._rollback(conn)
            self._finish(batch, _as_store_error(exc))
            return
        self._finish(batch, None)

    @staticmethod
    def _finish(batch: list[_Pending], error: BaseException | None) -> None:
        """Deliver results; a failed commit fails every body in the group (none was durable)."""
        for item in batch:
            if error is not None:
                item.error, item.result = error, None
            item.done = True

    async def simulate(self, fn: Callable[[Txn], T]) -> T:
        """Run `fn(tx)` in a write transaction that is always rolled back: what would happen
        now, with nothing persisted (used to predict a claim exactly)."""
        async with self._write_lock:
            return await anyio.to_thread.run_sync(self._simulate, fn)

    def _simulate(self, fn: Callable[[Txn], T]) -> T:
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                return fn(self._txn())
            finally:
                self._rollback(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    async def read(self, fn: Callable[[Reader], T]) -> T:
        """Run `fn(reader)` on a consistent snapshot of committed state (one read transaction)."""
        return await anyio.to_thread.run_sync(self._read, fn, limiter=self._read_limiter)

    def _read(self, fn: Callable[[Reader], T]) -> T:
        conn = self._reader_conn
        try:
            conn.execute("BEGIN")
            try:
                return fn(Reader(conn, self.policies))
            finally:
                self._rollback(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc


def _as_store_error(exc: BaseException) -> BaseException:
    """`sqlite3` errors become `StoreError`; everything else is delivered as raised."""
    if isinstance(exc, sqlite3.Error):
        error = StoreError(f"database error: {exc}")
        error.__cause__ = exc
        return error
    return exc


@contextmanager
def snapshot(path: Path) -> Iterator[Reader]:
    """A read-only, consistent snapshot of the database at `path` (for audits and exports).

    Opens its own read-only connection, so it works while servers write. `NotFound` if there
    is no database; `sqlite3` failures become `StoreError`.
    """
    if not Path(path).exists():
        raise NotFound(f"there is no loopwarden database in {Path(path).parent}")
    conn = connect(Path(path), readonly=True)
    try:
        conn.execute("BEGIN")  # one snapshot for the whole read
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION or version < LEGACY_SCHEMA:
            raise StoreError(
                f"the database has schema version {version}; this loopwarden reads versions "
                f"{LEGACY_SCHEMA} to {SCHEMA_VERSION}"
            )
        yield Reader(conn, legacy=version < SCHEMA_VERSION)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read the database: {exc}") from None
    finally:
        conn.close()


def startup_check(reader: Reader) -> None:
    """Cheap consistency checks run at open: O(loops + log n), never a journal scan.

    Refuses (IntegrityError) if the journal, the Merkle frontier and the projection heads
    disagree, e.g. after a restored backup of one file or a hand edit.
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
    rows = reader.conn.execute(
        "SELECT l.loop_id, l.head_seq, l.head_digest, j.seq, j.digest FROM loops l "
        "LEFT JOIN (SELECT loop_id, max(seq) AS seq FROM journal GROUP BY loop_id) m "
        "ON m.loop_id = l.loop_id LEFT JOIN journal j ON j.loop_id = m.loop_id AND j.seq = m.seq"
    ).fetchall()
    for loop_id, head_seq, head_digest, seq, digest in rows:
        if head_seq != seq or head_digest != digest:
            problems.append(
                f"loop {loop_id}: the projection head (seq {head_seq}) does not match the journal "
                f"head (seq {seq})"
            )
    orphans = reader.conn.execute(
        "SELECT DISTINCT loop_id FROM journal WHERE loop_id NOT IN (SELECT loop_id FROM loops)"
    ).fetchall()
    for (loop_id,) in orphans:
        problems.append(f"loop {loop_id} has receipts but no projection")
    if problems:
        raise IntegrityError(
            "refusing to serve a damaged store: "
            + "; ".join(problems[:5])
            + ("" if len(problems) <= 5 else f" (+{len(problems) - 5} more)")
            + ". Run `loopwarden verify` for a full audit."
        )
