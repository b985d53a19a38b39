"""The PostgreSQL backend: the same store contract, for many server replicas on one database.

Writes run on the store's writer thread with a synchronous psycopg connection, exactly as on
SQLite: the transaction body is one synchronous function no `await` can split.

Order and exclusion across replicas: **row locks, not SERIALIZABLE.** Every write transaction
first locks the one sequencer row (`log_state`, `SELECT … FOR UPDATE`), then reads, decides
and appends. Holding it, no other writer on any replica can change anything until this one
commits, so the transaction's READ COMMITTED reads are the state it decides on: the same total
order `BEGIN IMMEDIATE` gives on SQLite, and with it every check the write path makes — a
lease's holder, a fence, an idempotency key, an approval's single use, budgets and the per-loop
`seq` (the journal's key is `(loop_id, seq)`, and the next `seq` is proved against the journal's
head) — holds across replicas with no retry loop. The Merkle leaf order is the order in which
the lock was held, never a `bigserial`'s (which can commit out of order). SERIALIZABLE would buy
nothing here: every write moves the Merkle frontier, so any two writes conflict on that row,
and each 40001 retry would re-sign its receipts. Group commit (several callers' bodies in one
transaction, one savepoint each) amortizes the lock and the commit over the whole group.

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

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg

from loopwarden.clock import format_time
from loopwarden.errors import NotFound, StoreError
from loopwarden.ledger.log.integrity import LOG_MAC, Integrity
from loopwarden.ledger.storage.dialect import POSTGRESQL, PgConnection
from loopwarden.ledger.storage.location import redact
from loopwarden.ledger.storage.rebuild import rebuild_projection
from loopwarden.ledger.storage.schema import (
    PG_FIRST_VERSION,
    PG_MIGRATIONS,
    REBUILT_AT,
    SCHEMA_VERSION,
)
from loopwarden.ledger.storage.worker import Worker

T = TypeVar("T")
READERS = 2  # reader threads (connections) per store
CONNECT_TIMEOUT = 10  # seconds
SETTLE_SECONDS = 15.0  # how long to wait for a lost session to end before reading back
IDLE_IN_TRANSACTION_MS = 60_000  # a replica stuck inside a transaction lets the lock go
MIGRATION_LOCK = 0x6C77_0001  # advisory lock: replicas starting together migrate one at a time
PRUNE_EVERY = 1024  # commits between prunings of old commit markers
MARKER_AGE = timedelta(hours=1)


def connect(url: str, *, application: str = "loopwarden") -> PgConnection:
    """An autocommit connection (transactions are explicit `BEGIN`/`COMMIT`, as on SQLite)."""
    try:
        raw = psycopg.connect(
            url, autocommit=True, connect_timeout=CONNECT_TIMEOUT, application_name=application
        )
    except psycopg.Error as exc:
        raise StoreError(f"cannot open the database {redact(url)}: {_first_line(exc)}") from None
    return PgConnection(raw)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def schema_version(conn: PgConnection) -> int:
    r = conn.execute("SELECT to_regclass('meta') IS NOT NULL").fetchone()
    if not r or not r[0]:
        return 0
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: PgConnection, integrity: Integrity) -> None:
    """Bring the schema to `SCHEMA_VERSION` in one transaction; refuse a database from a newer
    loopwarden. Upgrading an existing database past `REBUILT_AT` re-derives its projection
    from the journal, with proofs (`rebuild.py`), as on SQLite. Replicas starting together
    take turns on an advisory lock, taken before the transaction begins so that the version it
    reads includes the previous holder's work."""
    conn.execute("SELECT pg_advisory_lock(?)", (MIGRATION_LOCK,))
    try:
        conn.execute("BEGIN")
        try:
            _migrate(conn, integrity)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.execute("SELECT pg_advisory_unlock(?)", (MIGRATION_LOCK,))


def _migrate(conn: PgConnection, integrity: Integrity) -> None:
    version = schema_version(conn)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"the database has schema version {version}; this loopwarden knows {SCHEMA_VERSION}. "
            "Upgrade loopwarden."
        )
    for number in range(max(version + 1, PG_FIRST_VERSION), SCHEMA_VERSION + 1):
        for statement in PG_MIGRATIONS[number]:
            conn.execute(statement)
    if version == 0:
        initialize(conn, integrity)
    elif version < SCHEMA_VERSION:
        if version < REBUILT_AT:  # the rows' proofs cover columns this upgrade added
            rebuild_projection(conn, integrity)
        conn.execute(
            "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
        )


def initialize(conn: PgConnection, integrity: Integrity) -> None:
    """The rows a new store begins with, in its tables just made (inside the caller's
    transaction): its origin, the empty Merkle log under its MAC, the schema version."""
    conn.execute(
        "INSERT INTO meta (key, value) VALUES ('origin', ?)",
        (f"loopwarden.pg/{secrets.token_hex(8)}",),
    )
    conn.execute(
        "INSERT INTO log_state (id, size, frontier, mac) VALUES (1, 0, ?, ?)",
        (b"", integrity.mac(LOG_MAC, [0, ""])),
    )
    conn.execute(
        "INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
    )


def check_secret(conn: PgConnection, integrity: Integrity) -> None:
    """Every replica must MAC with the same integrity secret: the first one to open the store
    records a MAC of a constant under its secret, and any other replica whose secret does not
    reproduce it is refused before it writes (its MACs would not verify)."""
    expected = integrity.mac("loopwarden.secret-check/v1", []).hex()
    conn.execute(
        "INSERT INTO meta (key, value) VALUES ('secret_check', ?) ON CONFLICT DO NOTHING",
        (expected,),
    )
    stored = conn.execute("SELECT value FROM meta WHERE key = 'secret_check'").fetchone()
    if stored is None or stored[0] != expected:
        raise StoreError(
            "this replica's integrity secret (keys/integrity.key) is not the one the database "
            "was opened with: every replica needs the same secret. Copy keys/integrity.key from "
            "the first replica's home.",
            code="integrity_secret_mismatch",
        )


class PostgresBackend:
    """The database at `url`: the writer's connection and the reader threads."""

    name = "postgresql"
    dialect = POSTGRESQL
    errors: tuple[type[BaseException], ...] = (psycopg.Error,)

    def __init__(self, url: str, *, readers: int = READERS) -> None:
        self.url = url
        self.writer = self._connect_writer()
        self._readers = readers
        self._reading: Worker | None = None
        self._local = threading.local()
        self._connections: list[PgConnection] = []
        self._commits = 0

    @property
    def where(self) -> str:
        return redact(self.url)

    def _connect_writer(self) -> PgConnection:
        conn = connect(self.url, application="loopwarden writer")
        conn.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")
        self._writer_pid = conn.raw.info.backend_pid
        return conn

    def schema_version(self) -> int:
        return schema_version(self.writer)

    def migrate(self, integrity: Integrity) -> None:
        migrate(self.writer, integrity)
        check_secret(self.writer, integrity)

    # --- the write transaction (on the writer thread) ------------------------------------------

    def begin(self) -> None:
        """BEGIN and take the sequencer lock: from here to COMMIT this is the only writer."""
        if self.writer.raw.closed or self.writer.raw.broken:
            self.writer = self._connect_writer()
        # One round trip: no parameters, so both statements go as one simple query.
        self.writer.execute("BEGIN; SELECT 1 FROM log_state WHERE id = 1 FOR UPDATE")
        self._commits += 1
        if self._commits % PRUNE_EVERY == 0:
            old = format_time(datetime.now(UTC) - MARKER_AGE)
            self.writer.execute("DELETE FROM commits WHERE at < ?", (old,))

    def commit(self) -> None:
        """COMMIT; if the connection is lost on the way, find out whether it committed."""
        marker = secrets.token_hex(16)
        self.writer.execute(
            "INSERT INTO commits (id, at) VALUES (?, ?)", (marker, format_time(datetime.now(UTC)))
        )
        try:
            self.writer.execute("COMMIT")
        except psycopg.OperationalError as exc:
            if not (self.writer.raw.closed or self.writer.raw.broken):
                raise  # the server answered: it refused the commit, nothing was written
            self._read_back(marker, exc)

    def _read_back(self, marker: str, lost: BaseException) -> None:
        pid = self._writer_pid
        try:
            self.writer = self._connect_writer()
            self._settle(pid)
            found = self.writer.execute("SELECT 1 FROM commits WHERE id = ?", (marker,)).fetchone()
        except (psycopg.Error, StoreError):
            raise StoreError(
                "the database connection was lost while committing, and whether the write "
                "committed could not be read back; retry with the same idempotency key (a "
                "repeat returns the original result if it did)",
                code="commit_unknown",
            ) from lost
        if found is None:
            raise StoreError(
                f"the database connection was lost before the write committed; nothing was "
                f"written ({_first_line(lost)})",
                code="store_unavailable",
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
                raise StoreError("the lost session did not end", code="commit_unknown")
            if not asked:
                self.writer.execute("SELECT pg_terminate_backend(?)", (pid,))
                asked = True
            time.sleep(0.02)

    def rollback(self) -> None:
        conn = self.writer
        if conn.raw.closed or conn.raw.broken:
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

    async def read(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(connection)` on a reader thread inside one read-only snapshot."""
        if self._reading is None:
            raise StoreError("the store is closed", code="store_unavailable")
        result: T = await self._reading.call(lambda: self._snapshot(fn))
        return result

    def _reader_conn(self) -> PgConnection:
        conn: PgConnection | None = getattr(self._local, "conn", None)
        if conn is None or conn.raw.closed or conn.raw.broken:
            conn = connect(self.url, application="loopwarden reader")
            self._local.conn = conn
            self._connections.append(conn)
        return conn

    def _snapshot(self, fn: Callable[[Any], T]) -> T:
        try:
            conn = self._reader_conn()
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                return fn(conn)
            finally:
                if not (conn.raw.closed or conn.raw.broken) and conn.in_transaction:
                    conn.execute("ROLLBACK")
        except psycopg.Error as exc:
            raise StoreError(f"database error: {_first_line(exc)}") from exc

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


@contextmanager
def snapshot(url: str) -> Iterator[PgConnection]:
    """A connection inside one REPEATABLE READ READ ONLY transaction, its schema checked
    readable (for audits and exports)."""
    conn = connect(url, application="loopwarden audit")
    try:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        version = schema_version(conn)
        if version == 0:
            raise NotFound(f"there is no loopwarden store in {redact(url)}")
        if version > SCHEMA_VERSION or version < PG_FIRST_VERSION:
            raise StoreError(
                f"the database has schema version {version}; this loopwarden reads versions "
                f"{PG_FIRST_VERSION} to {SCHEMA_VERSION}"
            )
        yield conn
    except psycopg.Error as exc:
        raise StoreError(f"cannot read the database: {_first_line(exc)}") from None
    finally:
        conn.close()
