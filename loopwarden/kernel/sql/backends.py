"""The store's backends: what one must do (`Backend`), and the registry that picks one by the
store URL's scheme.

Each backend is one module (`sqlite.py`, `postgres.py`) that defines its dialect (with its type
map) and its class implementing `Backend`, named `BACKEND`; the registry names the module, which is
imported only when a store of its kind is opened (psycopg loads only for PostgreSQL). What is
common to every backend — creating and upgrading the schema, the snapshot's version check, the
write transaction's group commit — is written once over this interface (`migrations.py`,
`store.py`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from loopwarden.errors import StoreUnavailable
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.sql.dialect import Connection, Dialect
from loopwarden.kernel.sql.table import Table

T = TypeVar("T")
Synchronous = Literal["full", "normal"]
"""How durable a SQLite commit is before it returns (PostgreSQL's server decides its own)."""


def first_line(exc: BaseException) -> str:
    """A driver error's first line (PostgreSQL's go on with details and hints)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class StoreClosed(StoreUnavailable):
    """The store (or its read side) is closed: nothing more can be read or written through it."""

    def __init__(self, detail: str | None = None) -> None:
        super().__init__("the store is closed" + (f" ({detail})" if detail else ""))


class Backend(Protocol):
    """What the store needs of a backend. The write methods run on the writer thread only;
    `begin` makes this the only writer until `commit` or `rollback` (across every process or
    replica sharing the database)."""

    dialect: ClassVar[Dialect]
    errors: ClassVar[tuple[type[BaseException], ...]]
    """The driver's exceptions (the store turns them into `StoreError`)."""
    tables: ClassVar[tuple[Table[Any], ...]]
    """Every table a store of this backend has: the shared ones, and any of its own."""
    history: ClassVar[Mapping[int, Sequence[str]]]
    """The upgrade statements of schema versions older than every other backend's stores."""
    origin_prefix: ClassVar[str]
    """A new store's origin (named in its checkpoints) is this and random hex."""
    integrates_inline: ClassVar[bool]
    """True where one write lock orders every transaction (SQLite's `BEGIN IMMEDIATE`): each
    transaction then gives its own receipts their Merkle leaves before it commits. False where
    writers lock only the rows they decide on (PostgreSQL): an integrator does it after them, a
    batch at a time (`integrator.py`)."""
    contended: ClassVar[tuple[type[BaseException], ...]]
    """The driver's errors that mean "another transaction holds or wrote first what this one
    needs" (a lock not granted without waiting, a deadlock broken, a key another transaction
    committed meanwhile): the body is run again in the next transaction, nothing of it having
    been written, and decides on what it then reads."""

    @property
    def writer(self) -> Connection:
        """The write connection (the writer thread's alone)."""
        ...

    @classmethod
    def open(cls, target: str, *, synchronous: Synchronous) -> Backend:
        """Connect the writer to the store at `target` (creating an empty one if it is a file)."""
        ...

    @classmethod
    def snapshot(cls, target: str) -> AbstractContextManager[Connection]:
        """A read-only connection inside one consistent read transaction, for audits and
        exports; `NotFound` if there is no database at `target` (the store's `snapshot` checks
        that one holds a store it can read)."""
        ...

    @staticmethod
    def version_of(conn: Connection) -> int:
        """The schema version stored on `conn`'s database (0: no store there yet)."""
        ...

    def set_schema_version(self, version: int) -> None: ...
    def migrating(self) -> AbstractContextManager[None]:
        """One write transaction for the schema, taken by one process or replica at a time:
        committed if the body returns, rolled back if it raises."""
        ...

    def check_secret(self, integrity: Integrity) -> None:
        """Refuse an integrity secret that is not the one the store was made with, where other
        homes can open it (`StoreError`)."""
        ...

    def connect_integrator(self) -> Connection:
        """A connection of the integrator's own (only a backend that does not integrate inline
        is asked for one)."""
        ...

    def begin(self) -> None: ...
    def body(self) -> AbstractContextManager[object]:
        """Around each transaction body: its statements may be sent without waiting for each
        other's answers (PostgreSQL's pipeline mode; a read waits for what came before it), and
        every answer is in when it ends, so a body's database errors are raised in it and are
        its own."""
        ...

    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    async def start_reading(self) -> None: ...
    async def read(self, fn: Callable[[Connection], T], *, snapshot: bool = True) -> T:
        """`fn(connection)` on the read side, inside one read transaction (`snapshot`), or,
        for a read of one statement (consistent by itself), without one: two statements and
        their round trips fewer."""
        ...

    async def close(self) -> None: ...
    def close_now(self) -> None:
        """Close the write connection only (the read side never started)."""
        ...


@dataclass(frozen=True)
class BackendSpec:
    """One registered backend: its name and title (for messages), the URL schemes that name its
    stores (`sqlite:///` …), how a URL is written (for a refusal's hint), whether its stores are
    files (the URL's rest is a path, shown as itself; a server's URL is shown without its
    password), and the module that implements it."""

    name: str
    title: str
    schemes: tuple[str, ...]
    example: str
    files: bool
    module: str

    def load(self) -> type[Backend]:
        backend: type[Backend] = importlib.import_module(self.module).BACKEND
        return backend


BACKENDS: tuple[BackendSpec, ...] = (
    BackendSpec(
        "sqlite", "SQLite", ("sqlite:///",), "sqlite:///PATH", True,
        "loopwarden.kernel.sql.sqlite",
    ),
    BackendSpec(
        "postgresql", "PostgreSQL", ("postgresql://", "postgres://"), "postgresql://…", False,
        "loopwarden.kernel.sql.postgres",
    ),
)  # fmt: skip
"""Every backend. The first is the default: a plain path is one of its files."""
DEFAULT = BACKENDS[0]
