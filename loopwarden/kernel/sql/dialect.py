"""How a backend spells SQL: its type map, its DDL, and the few statements that differ.

Every query in `ledger/` is written once, in SQLite's spelling with `?` placeholders. What a
backend spells otherwise comes from its connection's `Dialect`: the DDL of a table description
(`table.py`) through the backend's type map, an upsert, an insert that keeps an existing row,
the rows of a JSON array, and the placeholders its driver takes (`prepare`). Each backend
module (`sqlite.py`, `postgres.py`) defines its dialect; the base class spells what standard
SQL spells.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Protocol

from loopwarden.kernel.sql.table import Column, SqlType, Table


class Connection(Protocol):
    """What `ledger/` asks of a connection: the backends' connections all are one, and each
    says which dialect it speaks."""

    @property
    def dialect(self) -> Dialect: ...
    def execute(self, sql: str, params: Any = ..., /) -> Any: ...
    def executemany(self, sql: str, rows: Any, /) -> Any: ...
    def close(self) -> None: ...
    def pipeline(self) -> AbstractContextManager[object]:
        """Around statements that may be sent without waiting for each other's answers
        (PostgreSQL's pipeline mode; a read waits for what came before it); every answer is in
        when it ends, so their database errors are raised in it."""
        ...


def qmarks(count: int) -> str:
    """`?, ?, …`: `count` placeholders."""
    return ", ".join("?" * count)


class Dialect:
    """One backend's spelling. `types` is its type map (every `SqlType` must be in it)."""

    name: ClassVar[str]
    types: ClassVar[Mapping[SqlType, str]]

    def __init__(self) -> None:
        missing = set(SqlType) - set(self.types)
        assert not missing, f"the {self.name} type map lacks {sorted(missing)}"
        self._cache: dict[tuple[str, Table[Any], tuple[str, ...] | None], str] = {}

    def prepare(self, sql: str) -> str:
        """A statement in `?` form as the driver takes it."""
        return sql

    # --- DDL ----------------------------------------------------------------------------------

    def create(self, table: Table[Any]) -> list[str]:
        """The statements that make `table` and its indexes."""
        inline = self._inline_key(table)
        lines = [self.column(c, primary=c.name == inline, table=table) for c in table.columns]
        if inline is None:
            lines.append(f"PRIMARY KEY ({', '.join(self.primary_key(table))})")
        lines.extend(f"UNIQUE ({', '.join(u)})" for u in self._uniques(table) if len(u) > 1)
        if table.check is not None:
            lines.append(f"CHECK ({table.check})")
        body = ",\n    ".join(lines)
        statements = [f"CREATE TABLE {table.name} (\n    {body}\n){self.table_options(table)}"]
        statements.extend(
            f"CREATE INDEX {i.name} ON {table.name} ({', '.join(i.columns)})" for i in table.indexes
        )
        return statements

    def primary_key(self, table: Table[Any]) -> tuple[str, ...]:
        """The columns this backend makes the primary key (the key; SQLite: the rowid)."""
        return table.key

    def _inline_key(self, table: Table[Any]) -> str | None:
        key = self.primary_key(table)
        return key[0] if len(key) == 1 else None

    def _uniques(self, table: Table[Any]) -> list[tuple[str, ...]]:
        """Every unique column set but the primary key: the key when the rowid is not it."""
        key = self.primary_key(table)
        sets = [table.key, *table.unique]
        if table.rowid:
            sets.append((table.rowid,))
        return [s for s in dict.fromkeys(sets) if s != key]

    def column(self, column: Column, *, primary: bool = False, table: Table[Any]) -> str:
        """One column's definition: name, type, NOT NULL, default, inline constraints."""
        parts = [column.name, self.types[column.type]]
        if primary:
            parts.append("PRIMARY KEY")
        elif not column.null:
            parts.append("NOT NULL")
        if column.default is not None:
            parts.append(f"DEFAULT {column.default_sql}")
        if not primary and (column.name,) in self._uniques(table):
            parts.append("UNIQUE")
        return " ".join(parts)

    def table_options(self, table: Table[Any]) -> str:
        return ""

    def add_column(self, table: str, column: Column) -> str:
        """Add `column` to `table` (its default fills the rows already there)."""
        parts = [column.name, self.types[column.type]]
        if not column.null:
            parts.append("NOT NULL")
        if column.default is not None:
            parts.append(f"DEFAULT {column.default_sql}")
        return f"ALTER TABLE {table} ADD COLUMN {' '.join(parts)}"

    # --- rows ---------------------------------------------------------------------------------

    def insert(self, table: Table[Any], columns: tuple[str, ...] | None = None) -> str:
        """Insert a row's `columns` (default: every column)."""
        sql = self._cache.get(("insert", table, columns))
        return sql or self._spell("insert", table, columns, self._insert)

    def upsert(self, table: Table[Any], columns: tuple[str, ...] | None = None) -> str:
        """Insert a row's `columns` (default: every column), or replace them in the row with
        its key."""
        sql = self._cache.get(("upsert", table, columns))
        return sql or self._spell("upsert", table, columns, self._upsert)

    def insert_new(self, table: Table[Any], columns: tuple[str, ...] | None = None) -> str:
        """Insert a row unless one with the same key exists (that one is kept as it is)."""
        sql = self._cache.get(("insert_new", table, columns))
        return sql or self._spell("insert_new", table, columns, self._insert_new)

    def _spell(
        self,
        what: str,
        table: Table[Any],
        columns: tuple[str, ...] | None,
        make: Callable[[Table[Any], tuple[str, ...]], str],
    ) -> str:
        """Spell a statement once (then it is cached)."""
        sql = self._cache[(what, table, columns)] = make(table, columns or table.names)
        return sql

    @staticmethod
    def _values(table: Table[Any], names: tuple[str, ...]) -> str:
        return f"INSERT INTO {table.name} ({', '.join(names)}) VALUES ({qmarks(len(names))})"

    def _insert(self, table: Table[Any], names: tuple[str, ...]) -> str:
        return self._values(table, names)

    def _upsert(self, table: Table[Any], names: tuple[str, ...]) -> str:
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in names if c not in table.key)
        conflict = f"ON CONFLICT ({', '.join(table.key)}) DO UPDATE SET {updates}"
        return f"{self._values(table, names)} {conflict}"

    def _insert_new(self, table: Table[Any], names: tuple[str, ...]) -> str:
        return f"{self._values(table, names)} ON CONFLICT DO NOTHING"

    def lock(self, *, wait: bool = True, shared: bool = False) -> str:
        """What ends a SELECT that locks the rows it reads until the transaction ends (empty
        where the transaction's one write lock already covers every row); without `wait`, a
        row another transaction holds fails the statement at once instead of waiting. A
        `shared` lock keeps the rows from changing without keeping other shared holders out."""
        mode = " FOR SHARE" if shared else " FOR UPDATE"
        return mode if wait else f"{mode} NOWAIT"

    def json_values(self, column: str, alias: str) -> str:
        """A FROM item listing the strings of the JSON array in `column` as `alias.value`."""
        raise NotImplementedError(f"{self.name} has no JSON array rows")
