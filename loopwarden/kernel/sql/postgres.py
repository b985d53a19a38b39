"""The PostgreSQL backend: the same store contract, for many server replicas on one database.

Writes run on the store's writer thread with a synchronous psycopg connection, exactly as on
SQLite: the transaction body is one synchronous function no `await` can split.

Order and exclusion across replicas: **row locks, not SERIALIZABLE, and two orders.** A write
transaction locks the rows it decides on as it reads them (`guard.py`): its loop's row (`SELECT
… FOR UPDATE`, in a statement of its own, so that the reads after it see what the last holder
committed), and every budget pool's row, in name order, when it reads the pools — always after
its loop's. Holding them, no other writer on any replica can change what it decides on — a
lease's holder, a fence, an approval's single use, a loop's and a pool's budgets, the loop's
next `seq` — so its READ COMMITTED reads are the state it decides on, with no retry loop.
Rows of another kind are kept by keys: an idempotency key, a loop id, a pool's name or a sink's
cursor written by two transactions at once is a unique violation for the second, whose body is
then run again from the start (`Store._commit_group`) and finds the first's row: a repeated
idempotent call gets the original result, a second `loop open` of one id is refused as a
conflict, rather than either hearing a database error. Writes
to different loops never wait for each other: the receipt is sealed into its loop's chain and
left pending, and the integrator (`integrator.py`) gives pending receipts their Merkle leaves
a batch at a time, under the one lock on the log's row (`log_state`) that writes no longer take.

Group commit (several callers' bodies in one transaction, one savepoint each) amortizes the
commit over the whole group. Only the group's first body waits for a lock; a later body asks
for its locks `NOWAIT` and, if one is held, is rolled back to its savepoint and runs again first
in the next transaction (`Store._commit_group`), so two groups never wait for each other in a
circle. Each body runs in psycopg's pipeline mode (`body`): its writes go out without waiting
for each other's answers, a read waits only for what came before it, and the pipeline is
synced when the body ends, so a body's errors stay its own.

An ambiguous commit — the connection lost after COMMIT was sent — is resolved by reading
back, never by writing again: each transaction inserts a marker row (`commits`); the writer
waits until the old server session is gone (then its transaction has committed or aborted for
good), reconnects and looks for its marker. Found: the callers get their results. Not found:
nothing was written, and they get a `store_unavailable` error. Unreadable: `commit_unknown`,
and a retry with the same idempotency key returns the original result if there was one.

Reads run on a few reader threads, each with its own connection, in a REPEATABLE READ READ ONLY
transaction (one consistent snapshot per read), as aiosqlite does it for SQLite (sqlite.py).
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import psycopg

from loopwarden.clock import format_time
from loopwarden.errors import CommitUnknown, SecretMismatch, StoreError, StoreUnavailable
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.sql.backends import Backend, StoreClosed, Synchronous, first_line
from loopwarden.kernel.sql.dialect import Connection, Dialect
from loopwarden.kernel.sql.location import redact
from loopwarden.kernel.sql.schema import META, TABLES
from loopwarden.kernel.sql.table import Column, SqlType, Table
from loopwarden.kernel.sql.worker import Worker

T = TypeVar("T")
READERS = 2  # reader threads (connections) per store
CONNECT_TIMEOUT = 10  # seconds
SETTLE_SECONDS = 15.0  # how long to wait for a lost session to end before reading back
IDLE_IN_TRANSACTION_MS = 60_000  # a replica stuck inside a transaction lets the lock go
MIGRATION_LOCK = 0x6C77_0001  # advisory lock: replicas starting together migrate one at a time
PRUNE_EVERY = 1024  # commits between prunings of old commit markers
MARKER_AGE = timedelta(hours=1)


@functools.lru_cache(maxsize=1024)
def to_pyformat(sql: str) -> str:
    """`?` placeholders → psycopg's `%s` (a literal `%` doubled). No statement in ledger/ has a
    `?` or `%` inside a string literal, so a plain replacement is exact."""
    return sql.replace("%", "%%").replace("?", "%s")


class PostgresDialect(Dialect):
    """PostgreSQL's spelling. Text is compared and sorted byte-wise (`COLLATE "C"`), as SQLite
    does, so every query orders rows the same way on both; integers are 64-bit, as SQLite's
    are. Placeholders are psycopg's `%s`."""

    name = "postgresql"
    types: ClassVar[Mapping[SqlType, str]] = {
        SqlType.TEXT: 'TEXT COLLATE "C"',
        SqlType.DOCUMENT: "TEXT",
        SqlType.INTEGER: "BIGINT",
        SqlType.SMALL_INTEGER: "INTEGER",
        SqlType.BYTES: "BYTEA",
        SqlType.COMPRESSED: "BYTEA",
        SqlType.TICKET: "BIGINT GENERATED BY DEFAULT AS IDENTITY",
    }

    def prepare(self, sql: str) -> str:
        return to_pyformat(sql)

    def json_values(self, column: str, alias: str) -> str:
        return f"jsonb_array_elements_text({column}::jsonb) AS {alias}(value)"


POSTGRESQL = PostgresDialect()


class PgConnection:
    """A psycopg connection that speaks the statements of `ledger/` (`?` placeholders).

    `execute` returns psycopg's cursor (iterable, `fetchone`, `fetchall`), as `sqlite3` does;
    `executemany` sends its rows in one pipeline. Bytea comes back as `bytes`, bigint as `int`.
    """

    dialect: Dialect = POSTGRESQL

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.raw = conn

    def execute(self, sql: str, params: Sequence[Any] | None = (), /) -> Any:
        if not params:  # no placeholders, and psycopg reads a `%` literally without parameters
            return self.raw.execute(sql)
        return self.raw.execute(to_pyformat(sql), tuple(params))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> None:
        rows = list(rows)
        if rows:
            with self.raw.cursor() as cursor:
                cursor.executemany(to_pyformat(sql), rows)

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return bool(self.raw.info.transaction_status != TransactionStatus.IDLE)

    @property
    def lost(self) -> bool:
        """The connection is closed or broken (the server ended its session's transaction)."""
        return bool(self.raw.closed or self.raw.broken)

    def close(self) -> None:
        self.raw.close()

    @contextmanager
    def pipeline(self) -> Iterator[object]:
        """psycopg's pipeline mode: statements go out without a round trip each, a fetch waits
        for what came before it, and the pipeline is synced when the block ends, so their errors
        are raised in it. A block that fails leaves no prepared statement behind that the server
        does not have (`forget_prepared`)."""
        try:
            with self.raw.pipeline() as pipeline:
                yield pipeline
        except BaseException:
            forget_prepared(self.raw)
            raise


def connect(url: str, *, application: str = "loopwarden") -> PgConnection:
    """An autocommit connection (transactions are explicit `BEGIN`/`COMMIT`, as on SQLite)."""
    try:
        raw = psycopg.connect(
            url, autocommit=True, connect_timeout=CONNECT_TIMEOUT, application_name=application
        )
    except psycopg.Error as exc:
        raise StoreError(f"cannot open the database {redact(url)}: {first_line(exc)}") from None
    return PgConnection(raw)


def forget_prepared(raw: psycopg.Connection[Any]) -> None:
    """Forget every statement psycopg prepared on `raw`: its cache is cleared, and DEALLOCATE
    ALL goes out with the connection's next statement (a `ROLLBACK`, which the failed body's
    transaction or savepoint needs anyway).

    Why: psycopg (3.3) records a statement as prepared when it queues the PREPARE in a
    pipeline. When the pipeline is aborted before the PREPARE runs (an earlier statement of the
    body failed: a lock not granted, a deadlock broken, a key written first by another replica,
    each now an everyday event that runs the body again), the name stays cached though the
    server never made it, and the statement's next use fails with 'prepared statement "_pg3_N"
    does not exist'. Without psycopg's cache manager to clear (another version), the connection
    stops preparing statements instead."""
    manager = getattr(raw, "_prepared", None)
    if manager is not None and callable(getattr(manager, "clear", None)):
        manager.clear()
    else:
        raw.prepare_threshold = None


COMMITS: Table[Any] = Table(
    "commits",
    None,
    (Column("id", SqlType.TEXT), Column("at", SqlType.TEXT)),
    key=("id",),
)
"""One row per committed write transaction, written inside it: after a connection is lost
during COMMIT, finding the row is how a replica learns that its transaction committed
(`PostgresBackend.commit`). Rows older than an hour are pruned; an answer is read back in
seconds."""


def check_secret(conn: PgConnection, integrity: Integrity) -> None:
    """Every replica must MAC with the same integrity secret: the first one to open the store
    records a MAC of a constant under its secret, and any other replica whose secret does not
    reproduce it is refused before it writes (its MACs would not verify)."""
    expected = integrity.mac("loopwarden.secret-check/v1", []).hex()
    conn.execute(POSTGRESQL.insert_new(META), ("secret_check", expected))
    stored = conn.execute("SELECT value FROM meta WHERE key = 'secret_check'").fetchone()
    if stored is None or stored[0] != expected:
        raise SecretMismatch(
            "this replica's integrity secret (keys/integrity.key) is not the one the database "
            "was opened with: every replica needs the same secret. Copy keys/integrity.key from "
            "the first replica's home."
        )


class PostgresBackend:
    """The database at `url`: the writer's connection and the reader threads."""

    dialect: ClassVar[Dialect] = POSTGRESQL
    errors: ClassVar[tuple[type[BaseException], ...]] = (psycopg.Error,)
    tables: ClassVar[tuple[Table[Any], ...]] = (*TABLES, COMMITS)
    history: ClassVar[Mapping[int, Sequence[str]]] = MappingProxyType({})  # stores began at 5
    origin_prefix: ClassVar[str] = "loopwarden.pg"
    integrates_inline: ClassVar[bool] = False
    contended: ClassVar[tuple[type[BaseException], ...]] = (
        psycopg.errors.LockNotAvailable,
        psycopg.errors.DeadlockDetected,
        psycopg.errors.UniqueViolation,
    )

    def __init__(self, url: str, *, readers: int = READERS) -> None:
        self.url = url
        self.writer = self._connect_writer()
        self._readers = readers
        self._reading: Worker | None = None
        self._local = threading.local()
        self._connections: list[PgConnection] = []
        self._commits = 0

    @classmethod
    def open(cls, target: str, *, synchronous: Synchronous) -> PostgresBackend:
        """`synchronous` is SQLite's: the server's `synchronous_commit` decides here."""
        return cls(target)

    def _connect_writer(self) -> PgConnection:
        conn = connect(self.url, application="loopwarden writer")
        conn.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")
        self._writer_pid = conn.raw.info.backend_pid
        return conn

    # --- the schema -----------------------------------------------------------------------------

    @staticmethod
    def version_of(conn: Connection) -> int:
        """The version in `meta` ('schema_version'); 0 while there is no `meta` table."""
        r = conn.execute("SELECT to_regclass('meta') IS NOT NULL").fetchone()
        if not r or not r[0]:
            return 0
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0

    def set_schema_version(self, version: int) -> None:
        self.writer.execute(POSTGRESQL.upsert(META), ("schema_version", str(version)))

    @contextmanager
    def migrating(self) -> Iterator[None]:
        """Replicas starting together take turns on an advisory lock, taken before the
        transaction begins so that the version it reads includes the previous holder's work."""
        conn = self.writer
        conn.execute("SELECT pg_advisory_lock(?)", (MIGRATION_LOCK,))
        try:
            conn.execute("BEGIN")
            try:
                yield
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            conn.execute("SELECT pg_advisory_unlock(?)", (MIGRATION_LOCK,))

    def check_secret(self, integrity: Integrity) -> None:
        check_secret(self.writer, integrity)

    # --- the write transaction (on the writer thread) ------------------------------------------

    def connect_integrator(self) -> Connection:
        conn = connect(self.url, application="loopwarden integrator")
        conn.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")
        return conn

    def begin(self) -> None:
        """BEGIN: the body locks the rows it decides on as it reads them (`guard.py`)."""
        if self.writer.lost:
            self.writer = self._connect_writer()
        self.writer.execute("BEGIN")
        self._commits += 1
        if self._commits % PRUNE_EVERY == 0:
            old = format_time(datetime.now(UTC) - MARKER_AGE)
            self.writer.execute("DELETE FROM commits WHERE at < ?", (old,))

    def body(self) -> AbstractContextManager[object]:
        """The writer's pipeline (`PgConnection.pipeline`): a body's errors are raised in it,
        before its savepoint is released, and are never another body's."""
        return self.writer.pipeline()

    def commit(self) -> None:
        """COMMIT, with its marker in one round trip; if the connection is lost on the way, find
        out whether it committed (the marker is there only if it did)."""
        marker = secrets.token_hex(16)
        at = format_time(datetime.now(UTC))
        try:
            with self.writer.pipeline():
                self.writer.execute("INSERT INTO commits (id, at) VALUES (?, ?)", (marker, at))
                self.writer.execute("COMMIT")
        except psycopg.OperationalError as exc:
            if not self.writer.lost:
                raise  # the server answered: it refused the commit, nothing was written
            self._read_back(marker, exc)

    def _read_back(self, marker: str, lost: BaseException) -> None:
        pid = self._writer_pid
        try:
            self.writer = self._connect_writer()
            self._settle(pid)
            found = self.writer.execute("SELECT 1 FROM commits WHERE id = ?", (marker,)).fetchone()
        except (psycopg.Error, StoreError):
            raise CommitUnknown(
                "the database connection was lost while committing, and whether the write "
                "committed could not be read back; retry with the same idempotency key (a "
                "repeat returns the original result if it did)"
            ) from lost
        if found is None:
            raise StoreUnavailable(
                f"the database connection was lost before the write committed; nothing was "
                f"written ({first_line(lost)})"
            ) from lost

    def _settle(self, pid: int) -> None:
        """Wait until the server session `pid` has ended (ending it if it lingers): only then is
        its transaction's outcome final."""
        deadline = time.monotonic() + SETTLE_SECONDS
        asked = False
        while self.writer.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = ?", (pid,)
        ).fetchone():
            if time.monotonic() > deadline:
                raise CommitUnknown("the lost session did not end")
            if not asked:
                self.writer.execute("SELECT pg_terminate_backend(?)", (pid,))
                asked = True
            time.sleep(0.02)

    def rollback(self) -> None:
        conn = self.writer
        if conn.lost:
            return  # the server rolls back a lost session's transaction by itself
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except psycopg.OperationalError:
            pass  # lost now: the same

    # --- reads ----------------------------------------------------------------------------------

    async def start_reading(self) -> None:
        self._reading = Worker("loopwarden-pg-reader", threads=self._readers)
        self._reading.start()

    async def read(self, fn: Callable[[Connection], T], *, snapshot: bool = True) -> T:
        """Run `fn(connection)` on a reader thread inside one read-only snapshot (or, not
        `snapshot`, one statement on its own: autocommit)."""
        if self._reading is None:
            raise StoreClosed()
        run = self._snapshot if snapshot else self._plain
        result: T = await self._reading.call(lambda: run(fn))
        return result

    def _reader_conn(self) -> PgConnection:
        conn: PgConnection | None = getattr(self._local, "conn", None)
        if conn is None or conn.lost:
            conn = connect(self.url, application="loopwarden reader")
            self._local.conn = conn
            self._connections.append(conn)
        return conn

    def _snapshot(self, fn: Callable[[Connection], T]) -> T:
        def within(conn: PgConnection) -> T:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                return fn(conn)
            finally:
                if not conn.lost and conn.in_transaction:
                    conn.execute("ROLLBACK")

        return self._plain(within)

    def _plain(self, fn: Callable[[PgConnection], T]) -> T:
        try:
            return fn(self._reader_conn())
        except psycopg.Error as exc:
            raise StoreError(f"database error: {first_line(exc)}") from exc

    def close_now(self) -> None:
        if not self.writer.raw.closed:
            self.writer.close()

    async def close(self) -> None:
        if self._reading is not None:
            reading, self._reading = self._reading, None
            await reading.stop()
        for conn in [self.writer, *self._connections]:
            if not conn.raw.closed:
                conn.close()

    @classmethod
    @contextmanager
    def snapshot(cls, target: str) -> Iterator[Connection]:
        """A connection inside one REPEATABLE READ READ ONLY transaction (for audits and
        exports)."""
        conn = connect(target, application="loopwarden audit")
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn
        finally:
            conn.close()


BACKEND: type[Backend] = PostgresBackend
