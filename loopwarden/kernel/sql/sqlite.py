"""The SQLite backend: one database file in WAL mode, shared safely by several processes.

Writes: one connection, owned by the store's writer thread (`worker.py`); a write transaction
is `BEGIN IMMEDIATE`, so writers in every process sharing the file take turns — fairly: SQLite's
own busy handler sleeps ever longer between tries (up to 100 ms), so a process whose queue is
never empty (group commit) takes the lock back the moment it commits and can starve the others
for as long as it runs. Here a writer that finds the lock taken says so in a *waiting room* (a
shared `flock` on a file beside the database) and tries again every fraction of a millisecond;
a writer that commits while someone waits steps aside for a moment before its next `BEGIN`.
Uncontended, that is one non-blocking `flock` per commit.

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
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from loopwarden.errors import NotFound, StoreError
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.sql.backends import Backend, StoreClosed, Synchronous
from loopwarden.kernel.sql.dialect import Connection, Dialect
from loopwarden.kernel.sql.schema import TABLES
from loopwarden.kernel.sql.table import SqlType, Table
from loopwarden.kernel.sql.upgrades import SQLITE_UPGRADES

if TYPE_CHECKING:
    import aiosqlite

T = TypeVar("T")
BUSY_TIMEOUT_MS = 30_000
WAL_AUTOCHECKPOINT_PAGES = 4_000
RETRY_SECONDS = (0.0002, 0.001)  # a waiting writer tries `BEGIN IMMEDIATE` again after this
STEP_ASIDE_SECONDS = 0.002  # a committing writer pauses this long when another one waits


class WaitingRoom:
    """Writers of other processes waiting for the file's write lock: a shared `flock` on
    `<database>-waiting` held while waiting; a free exclusive one means nobody waits. Where
    there is no `flock` (Windows) nobody is ever seen waiting: SQLite's own order applies."""

    def __init__(self, database: Path) -> None:
        self._fd: int | None = None
        try:
            import fcntl

            self._flock = fcntl.flock
            self._shared, self._exclusive = fcntl.LOCK_SH, fcntl.LOCK_EX | fcntl.LOCK_NB
            self._unlock = fcntl.LOCK_UN
            path = database.with_name(database.name + "-waiting")
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except (ImportError, OSError):
            self._fd = None

    @contextmanager
    def waiting(self) -> Iterator[None]:
        if self._fd is None:
            yield
            return
        self._flock(self._fd, self._shared)
        try:
            yield
        finally:
            self._flock(self._fd, self._unlock)

    def anyone_waiting(self) -> bool:
        if self._fd is None:
            return False
        try:
            self._flock(self._fd, self._exclusive)
        except BlockingIOError:
            return True
        self._flock(self._fd, self._unlock)
        return False

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


def _busy(exc: sqlite3.OperationalError) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def begin_immediate(conn: sqlite3.Connection, room: WaitingRoom) -> None:
    """`BEGIN IMMEDIATE`, waiting in `room` for at most `BUSY_TIMEOUT_MS` (the connection's own
    busy timeout is 0: the waiting is done here, trying often)."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        return
    except sqlite3.OperationalError as exc:
        if not _busy(exc):
            raise
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    with room.waiting():
        while True:
            time.sleep(random.uniform(*RETRY_SECONDS))
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() > deadline:
                    raise


class SqliteDialect(Dialect):
    name = "sqlite"
    types: ClassVar[Mapping[SqlType, str]] = {
        SqlType.TEXT: "TEXT",
        SqlType.DOCUMENT: "TEXT",
        SqlType.INTEGER: "INTEGER",
        SqlType.SMALL_INTEGER: "INTEGER",
        SqlType.BYTES: "BLOB",
        SqlType.COMPRESSED: "TEXT",  # as version 1 declared it; the values are BLOBs
        SqlType.TICKET: "INTEGER",  # the rowid: a row inserted without one gets the next
    }

    def primary_key(self, table: Table[Any]) -> tuple[str, ...]:
        # A rowid column is the table's INTEGER PRIMARY KEY: the rowid itself, rows in its order.
        return (table.rowid,) if table.rowid else table.key

    def table_options(self, table: Table[Any]) -> str:
        return " WITHOUT ROWID" if table.clustered else ""

    def _upsert(self, table: Table[Any], names: tuple[str, ...]) -> str:
        return self._values(table, names).replace("INSERT", "INSERT OR REPLACE", 1)

    def lock(self, *, wait: bool = True, shared: bool = False) -> str:
        return ""  # `BEGIN IMMEDIATE` holds the whole file for the transaction

    def _insert_new(self, table: Table[Any], names: tuple[str, ...]) -> str:
        return self._values(table, names).replace("INSERT", "INSERT OR IGNORE", 1)

    def json_values(self, column: str, alias: str) -> str:
        return f"json_each({column}) {alias}"


SQLITE = SqliteDialect()


class SqliteConnection(sqlite3.Connection):
    """A sqlite3 connection that says it speaks SQLite (`Connection.dialect`)."""

    dialect: Dialect = SQLITE

    def pipeline(self) -> AbstractContextManager[object]:
        return nullcontext()  # each statement runs in process: nothing to wait for


def connect(
    path: Path, *, synchronous: Synchronous = "full", readonly: bool = False
) -> SqliteConnection:
    """Open a connection with loopwarden's pragmas (WAL, busy timeout, durability)."""
    try:
        if readonly:
            conn = sqlite3.connect(
                f"file:{path}?mode=ro",
                uri=True,
                isolation_level=None,
                check_same_thread=False,
                factory=SqliteConnection,
            )
        else:
            make_private(path)
            conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, factory=SqliteConnection
            )
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


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


class SqliteBackend:
    """The file at `path`: the writer's connection and the aiosqlite reader."""

    dialect: ClassVar[Dialect] = SQLITE
    errors: ClassVar[tuple[type[BaseException], ...]] = (sqlite3.Error,)
    tables: ClassVar[tuple[Table[Any], ...]] = TABLES
    history: ClassVar[Mapping[int, Sequence[str]]] = SQLITE_UPGRADES
    origin_prefix: ClassVar[str] = "loopwarden.local"
    integrates_inline: ClassVar[bool] = True
    contended: ClassVar[tuple[type[BaseException], ...]] = ()

    def __init__(self, path: Path, synchronous: Synchronous) -> None:
        self.path = path
        self.synchronous = synchronous
        path.parent.mkdir(parents=True, exist_ok=True)
        self.writer: SqliteConnection = connect(path, synchronous=synchronous)
        self.writer.execute("PRAGMA busy_timeout = 0")  # the write lock is waited for in `begin`
        self._room = WaitingRoom(path)
        self._reader: aiosqlite.Connection | None = None
        self._reader_conn: sqlite3.Connection | None = None

    @classmethod
    def open(cls, target: str, *, synchronous: Synchronous) -> SqliteBackend:
        return cls(Path(target), synchronous)

    # --- the schema -----------------------------------------------------------------------------

    @staticmethod
    def version_of(conn: Connection) -> int:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def set_schema_version(self, version: int) -> None:
        self.writer.execute(f"PRAGMA user_version = {int(version)}")

    @contextmanager
    def migrating(self) -> Iterator[None]:
        """`BEGIN IMMEDIATE`: the file's one writer, in every process, until COMMIT."""
        begin_immediate(self.writer, self._room)
        try:
            yield
            self.writer.execute("COMMIT")
        except BaseException:
            self.writer.execute("ROLLBACK")
            raise

    def check_secret(self, integrity: Integrity) -> None:
        """Nothing to check: a file is used with its home's secret (a row MACed under another
        fails its proof when it is read, and `verify` reports it)."""

    # --- the write transaction (on the writer thread) ------------------------------------------

    def connect_integrator(self) -> Connection:
        raise StoreError("a SQLite store gives its receipts their leaves as it writes them")

    def begin(self) -> None:
        begin_immediate(self.writer, self._room)

    def body(self) -> AbstractContextManager[object]:
        return self.writer.pipeline()

    def commit(self) -> None:
        self.writer.execute("COMMIT")
        if self._room.anyone_waiting():  # let the writer that waits have its turn
            time.sleep(STEP_ASIDE_SECONDS)

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

    async def read(self, fn: Callable[[Connection], T], *, snapshot: bool = True) -> T:
        """Run `fn(connection)` on aiosqlite's thread inside one read transaction (or, not
        `snapshot`, one statement on its own)."""
        if self._reader is None:
            raise StoreClosed()
        try:
            run = cast(Callable[..., Awaitable[T]], self._reader._execute)
            result = await run(self._snapshot if snapshot else self._plain, fn)
        except ValueError as exc:  # aiosqlite: the connection is closed
            raise StoreClosed(str(exc)) from None
        return result

    def _snapshot(self, fn: Callable[[Connection], T]) -> T:
        def within(conn: SqliteConnection) -> T:
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                _rollback(conn)

        return self._plain(within)

    def _plain(self, fn: Callable[[SqliteConnection], T]) -> T:
        conn = self._reader_conn
        assert isinstance(conn, SqliteConnection)
        try:
            return fn(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"database error: {exc}") from exc

    def close_now(self) -> None:
        self.writer.close()
        self._room.close()

    async def close(self) -> None:
        self.writer.close()
        self._room.close()
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await reader.close()

    @classmethod
    @contextmanager
    def snapshot(cls, target: str) -> Iterator[Connection]:
        """A read-only connection to the file inside one read transaction. `NotFound` if there
        is no such file."""
        path = Path(target)
        if not path.exists():
            raise NotFound(f"there is no loopwarden database in {path.parent}")
        conn = connect(path, readonly=True)
        try:
            conn.execute("BEGIN")  # one snapshot for the whole read
            yield conn
        finally:
            conn.close()


BACKEND: type[Backend] = SqliteBackend
