"""The SQLite backend: one database file in WAL mode, shared safely by several processes.

Writes: one connection, owned by the store's writer thread (`worker.py`); a write transaction
is `BEGIN IMMEDIATE`, so writers in every process sharing the file take turns.

Reads: an aiosqlite connection. aiosqlite runs its sqlite3 connection on a thread of its own,
fed by a queue, which is what the async side wants; its public API is one await per statement.
A read here is one synchronous function over a consistent snapshot (`Reader` methods, shared
with the write path, which is what lets `quota` predict `claim` exactly by running the same
body), so the whole function runs on aiosqlite's connection thread in one hop: one queue
round trip per read operation, however many statements it makes, instead of one per
statement. `Connection._execute` is the method every aiosqlite call goes through.

Why the write transaction is not on aiosqlite: measured, a statement-per-await transaction
adds 1.7-10.5 ms per governed turn, and a cancelled await could leave a transaction half done.
On the writer thread no `await` can split one.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from loopwarden.errors import NotFound, StoreError
from loopwarden.ledger.log.integrity import LOG_MAC, Integrity
from loopwarden.ledger.storage.dialect import SQLITE
from loopwarden.ledger.storage.reader import LEGACY_SCHEMA
from loopwarden.ledger.storage.rebuild import rebuild_projection
from loopwarden.ledger.storage.schema import MIGRATIONS, REBUILT_AT, SCHEMA_VERSION

if TYPE_CHECKING:
    import aiosqlite

T = TypeVar("T")
Synchronous = Literal["full", "normal"]
BUSY_TIMEOUT_MS = 30_000
WAL_AUTOCHECKPOINT_PAGES = 4_000


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


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, integrity: Integrity) -> None:
    """Bring the schema to `SCHEMA_VERSION` in one transaction; refuse a database from a newer
    loopwarden. Upgrading an existing database past `REBUILT_AT` re-derives its projection
    from the journal, with proofs (`rebuild.py`), or refuses if the two disagree."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = schema_version(conn)
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


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


class SqliteBackend:
    """The file at `path`: the writer's connection and the aiosqlite reader."""

    name = "sqlite"
    dialect = SQLITE
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

    def __init__(self, path: Path, synchronous: Synchronous) -> None:
        self.path = path
        self.synchronous = synchronous
        path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = connect(path, synchronous=synchronous)
        self._reader: aiosqlite.Connection | None = None
        self._reader_conn: sqlite3.Connection | None = None

    @property
    def where(self) -> str:
        return str(self.path)

    def schema_version(self) -> int:
        return schema_version(self.writer)

    def migrate(self, integrity: Integrity) -> None:
        migrate(self.writer, integrity)

    # --- the write transaction (on the writer thread) ------------------------------------------

    def begin(self) -> None:
        self.writer.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.writer.execute("COMMIT")

    def rollback(self) -> None:
        _rollback(self.writer)

    # --- reads (aiosqlite) ----------------------------------------------------------------------

    async def start_reading(self) -> None:
        import aiosqlite  # here: a process that only writes (the hook command) never loads it

        def connector() -> sqlite3.Connection:
            self._reader_conn = connect(self.path, synchronous=self.synchronous)
            return self._reader_conn

        self._reader = aiosqlite.Connection(connector, iter_chunk_size=64)
        await self._reader

    async def read(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(connection)` on aiosqlite's thread inside one read transaction."""
        if self._reader is None:
            raise StoreError("the store is closed", code="store_unavailable")
        try:
            result: T = await self._reader._execute(self._snapshot, fn)
        except ValueError as exc:  # aiosqlite: the connection is closed
            raise StoreError(f"the store is closed ({exc})", code="store_unavailable") from None
        return result

    def _snapshot(self, fn: Callable[[Any], T]) -> T:
        conn = self._reader_conn
        assert conn is not None
        try:
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                _rollback(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc

    def close_now(self) -> None:
        self.writer.close()

    async def close(self) -> None:
        self.writer.close()
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await reader.close()


@contextmanager
def snapshot(path: Path) -> Iterator[tuple[sqlite3.Connection, bool]]:
    """A read-only connection to the database at `path` inside one read transaction, its schema
    version checked readable, and whether that is the legacy schema (reader.py). `NotFound` if
    there is no database."""
    if not Path(path).exists():
        raise NotFound(f"there is no loopwarden database in {Path(path).parent}")
    conn = connect(Path(path), readonly=True)
    try:
        conn.execute("BEGIN")  # one snapshot for the whole read
        version = schema_version(conn)
        if version > SCHEMA_VERSION or version < LEGACY_SCHEMA:
            raise StoreError(
                f"the database has schema version {version}; this loopwarden reads versions "
                f"{LEGACY_SCHEMA} to {SCHEMA_VERSION}"
            )
        yield conn, version < SCHEMA_VERSION
    except sqlite3.Error as exc:
        raise StoreError(f"cannot read the database: {exc}") from None
    finally:
        conn.close()
