"""The SQL the two backends spell differently, kept at one seam so that no query is forked.

Every query in `ledger/` is written once, in SQLite's spelling with `?` placeholders. What
PostgreSQL spells otherwise comes from the connection's `Dialect`: an upsert, an insert that
keeps an existing row, the rows of a JSON array. The PostgreSQL connection (`PgConnection`)
rewrites the placeholders to psycopg's `%s` as it executes (once per distinct statement), so
the readers, the transaction and the audit run unchanged on either backend.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

DialectName = Literal["sqlite", "postgresql"]


class Connection(Protocol):
    """What `ledger/` asks of a connection: `sqlite3.Connection` and `PgConnection` both are."""

    def execute(self, sql: str, params: Any = ..., /) -> Any: ...
    def executemany(self, sql: str, rows: Any, /) -> Any: ...
    def close(self) -> None: ...


def qmarks(columns: str) -> str:
    """`?, ?, …`, one per name in a comma-separated column list."""
    return ",".join("?" for _ in columns.split(","))


@dataclass(frozen=True)
class Dialect:
    """How one backend spells the few statements that differ."""

    name: DialectName

    def upsert(self, table: str, columns: str, key: str) -> str:
        """Insert a row, or replace every column of the row with the same `key` columns."""
        values = f"VALUES ({qmarks(columns)})"
        if self.name == "sqlite":
            return f"INSERT OR REPLACE INTO {table} ({columns}) {values}"
        keys = {k.strip() for k in key.split(",")}
        updates = ", ".join(
            f"{c} = EXCLUDED.{c}" for c in (c.strip() for c in columns.split(",")) if c not in keys
        )
        return (
            f"INSERT INTO {table} ({columns}) {values} ON CONFLICT ({key}) DO UPDATE SET {updates}"
        )

    def insert_new(self, table: str, columns: str) -> str:
        """Insert a row unless one with the same key exists (that one is kept as it is)."""
        if self.name == "sqlite":
            return f"INSERT OR IGNORE INTO {table} ({columns}) VALUES ({qmarks(columns)})"
        return f"INSERT INTO {table} ({columns}) VALUES ({qmarks(columns)}) ON CONFLICT DO NOTHING"

    def json_values(self, column: str, alias: str) -> str:
        """A FROM item listing the strings of the JSON array in `column` as `alias.value`."""
        if self.name == "sqlite":
            return f"json_each({column}) {alias}"
        return f"jsonb_array_elements_text({column}::jsonb) AS {alias}(value)"


SQLITE = Dialect("sqlite")
POSTGRESQL = Dialect("postgresql")


def dialect_of(conn: Any) -> Dialect:
    """The dialect of a connection: a `PgConnection` says so; anything else is `sqlite3`."""
    return getattr(conn, "dialect", SQLITE)


@functools.lru_cache(maxsize=1024)
def to_pyformat(sql: str) -> str:
    """`?` placeholders → psycopg's `%s` (a literal `%` doubled). No statement in ledger/ has a
    `?` or `%` inside a string literal, so a plain replacement is exact."""
    return sql.replace("%", "%%").replace("?", "%s")


class PgConnection:
    """A psycopg connection that speaks the statements of `ledger/` (`?` placeholders).

    `execute` returns psycopg's cursor (iterable, `fetchone`, `fetchall`), as `sqlite3` does;
    `executemany` sends its rows in one pipeline. Bytea comes back as `bytes`, bigint as `int`.
    """

    dialect = POSTGRESQL

    def __init__(self, conn: Any) -> None:
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

    def close(self) -> None:
        self.raw.close()
