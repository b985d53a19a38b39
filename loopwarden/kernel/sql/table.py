"""What a table is, as data (the idea of sqlite-utils, which treats a schema as data).

A `Table` lists its columns in their stored order, each with its SQL type (`SqlType`, which
each backend's dialect spells through its type map), whether it may be NULL, its default, the
schema version that added it and its codec (how a row field's value is stored); then its key,
its other unique column sets, its indexes and the row type its rows decode to. From one
description come both dialects' DDL (`dialect.py`), the readers' column lists and decoders, the
write path's upserts and row keys, the copies and the reads of an older schema.

A row's *stored values* are its row columns (the columns that hold a field of its row type) in
column order: what its state-tree leaf and its MAC hash. That order is part of every proof in
every existing database, so an existing column never moves and a new one is added last.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from functools import cached_property
from operator import itemgetter
from typing import Any, Generic, TypeVar

R = TypeVar("R")


class SqlType(StrEnum):
    """What a column holds; each dialect's type map says how it is declared."""

    TEXT = "text"  # compared and ordered byte-wise: ids, names, statuses, times, digests
    DOCUMENT = "document"  # free text or JSON, stored as given, never compared or ordered
    INTEGER = "integer"  # 64-bit
    SMALL_INTEGER = "small integer"  # tree levels, the one-row tables' constant id
    BYTES = "bytes"
    COMPRESSED = "compressed"  # zlib-compressed text (`Txn.remember`)
    TICKET = "ticket"  # an increasing integer the database assigns to each new row


@dataclass(frozen=True)
class Codec:
    """How a row field's value is stored: `encode` makes the stored value, `decode` reads it
    back; None for a side that keeps the value as it is (an enum is stored as its string)."""

    encode: Callable[[Any], Any] | None
    decode: Callable[[Any], Any] | None


@dataclass(frozen=True)
class Group:
    """A row field stored in several columns (a loop's `totals`): `build(*values)` makes the
    field from its columns' values in column order, `split(value)` gives them back."""

    build: Callable[..., Any]
    split: Callable[[Any], Sequence[Any]]


@dataclass(frozen=True)
class Column:
    """One column. `default` is a SQL literal's value (text or integer): the value an added
    column gives existing rows, and what a read of a schema older than `since` returns for it.
    `field`: the row field the column holds, when not its own name (the columns of a `Group`).
    `mac_when_set`: the column counts in its row's MAC only while it holds other than its
    default, so the rows written before it existed keep their MACs (a budget dimension added
    later, `policy/budgets.py`: a row it never charged is MACed as it was)."""

    name: str
    type: SqlType
    null: bool = False
    default: str | int | None = None
    codec: Codec | None = None
    since: int = 1
    field: str | None = None
    mac_when_set: bool = False

    @property
    def holds(self) -> str:
        return self.field or self.name

    @property
    def default_sql(self) -> str:
        """The default as a SQL literal (NULL if none)."""
        if self.default is None:
            return "NULL"
        if isinstance(self.default, int):
            return str(self.default)
        return "'" + self.default.replace("'", "''") + "'"


@dataclass(frozen=True)
class Index:
    name: str
    columns: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Table(Generic[R]):
    """One table. `key`: the columns that identify a row (the primary key, unless `rowid` is
    one); `rowid`: an integer column that numbers the rows where a backend numbers them (SQLite's
    rowid; elsewhere it is one more unique column); `clustered`: rows are stored in key order
    where a backend can do that (SQLite's WITHOUT ROWID); `check`: a condition on every row.
    `row`: the record its rows decode to (None for a table read column by column)."""

    name: str
    row: type[R] | None
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    unique: tuple[tuple[str, ...], ...] = ()
    indexes: tuple[Index, ...] = ()
    rowid: str | None = None
    clustered: bool = False
    check: str | None = None
    groups: Mapping[str, Group] = field(default_factory=dict)
    decode: Callable[[Sequence[Any]], R] = field(init=False, repr=False)
    """A row from its stored values (as `selected` lists them)."""
    encode: Callable[[R], tuple[Any, ...]] = field(init=False, repr=False)
    """A row's stored values, in column order: what its leaf and MAC cover."""

    def __post_init__(self) -> None:
        names = self.names
        assert len(set(names)) == len(names), f"{self.name}: a column is named twice"
        for part in (self.key, *self.unique, *(i.columns for i in self.indexes)):
            assert set(part) <= set(names), f"{self.name}: {part} names no column"
        if self.row is not None:
            wanted = {f.name for f in fields(self.row)}  # type: ignore[arg-type]
            held = {c.holds for c in self.columns}
            assert wanted <= held, f"{self.name}: no column holds {wanted - held}"
            plan = _RowPlan(self)
            object.__setattr__(self, "decode", plan.decode)
            object.__setattr__(self, "encode", plan.encode)
        else:
            object.__setattr__(self, "decode", self._no_row)
            object.__setattr__(self, "encode", self._no_row)

    def _no_row(self, _: object) -> Any:
        raise TypeError(f"the {self.name} table has no row type: read it column by column")

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @cached_property
    def order(self) -> tuple[str, ...]:
        """The columns rows are listed in (a copy, a comparison): the rowid, else the key."""
        return (self.rowid,) if self.rowid else self.key

    @cached_property
    def row_columns(self) -> tuple[Column, ...]:
        """The columns that hold the row type's fields, in column order (the stored values)."""
        if self.row is None:
            return self.columns
        wanted = {f.name for f in fields(self.row)}  # type: ignore[arg-type]
        return tuple(c for c in self.columns if c.holds in wanted)

    @cached_property
    def row_names(self) -> str:
        """The row columns as a SQL column list."""
        return ", ".join(c.name for c in self.row_columns)

    def selected(self, as_of: int | None = None) -> str:
        """The row columns as a SELECT list; with `as_of`, a schema version, those added after
        it read as their defaults (what that schema's rows mean)."""
        if as_of is None:
            return self.row_names
        return ", ".join(c.name if c.since <= as_of else c.default_sql for c in self.row_columns)

    def as_of(self, version: int) -> Table[Any]:
        """The table as schema `version` made it: its columns of that version or older (a
        description with no row type, for the DDL of an upgrade step that must never change)."""
        columns = tuple(c for c in self.columns if c.since <= version)
        kept = {c.name for c in columns}
        return Table(
            self.name,
            None,
            columns,
            self.key,
            unique=tuple(u for u in self.unique if set(u) <= kept),
            indexes=tuple(i for i in self.indexes if set(i.columns) <= kept),
            rowid=self.rowid,
            clustered=self.clustered,
            check=self.check,
        )

    @cached_property
    def _unset_in_mac(self) -> tuple[tuple[int, object], ...]:
        return tuple((i, c.default) for i, c in enumerate(self.row_columns) if c.mac_when_set)

    def mac_values(self, values: Sequence[Any]) -> list[Any]:
        """What a row's MAC covers of its stored values (in `row_columns` order): every value,
        but a `mac_when_set` column's while it holds its default."""
        if not self._unset_in_mac:
            return list(values)
        left_out = {i for i, default in self._unset_in_mac if values[i] == default}
        return [v for i, v in enumerate(values) if i not in left_out]

    def column(self, name: str) -> Column:
        """The column called `name` (`KeyError` if there is none)."""
        return next(c for c in self.columns if c.name == name)

    def fields_since(self, version: int) -> frozenset[str]:
        """The row fields held by columns added after `version`."""
        return frozenset(c.holds for c in self.row_columns if c.since > version)


class _RowPlan:
    """A table's decoder and encoder, worked out once from its description.

    Decoding: rows are plain frozen dataclasses without `__post_init__`, so a row is made by
    filling its field dict by name (as `rows.replace` does), each value through its column's
    codec. Encoding is on every write's hot path (each changed row's leaf, its upsert, a loop's
    MAC), so the encoder is compiled from the description once, the way `dataclasses` compiles
    an `__init__`: one tuple of the row's fields in column order, each through its codec, a
    group's field spread over its columns — what a hand-written encoder would be."""

    def __init__(self, table: Table[Any]) -> None:
        assert table.row is not None, f"{table.name} has no row type"
        self.row = table.row
        self.order = [f.name for f in fields(self.row)]
        plain: list[tuple[str, int]] = []
        self.decoded: list[tuple[str, int, Callable[[Any], Any]]] = []
        runs: dict[str, list[tuple[int, int]]] = {}  # a group's columns, in runs side by side
        held: list[str] = []  # the fields, in column order (a group's once)
        parts: list[str] = []  # the encoder's expression for each run of columns
        env: dict[str, Any] = {}
        columns, i = table.row_columns, 0
        while i < len(columns):
            name = columns[i].holds
            if name in table.groups:
                end = i
                while end < len(columns) and columns[end].holds == name:
                    end += 1
                done = sum(b - a for a, b in runs.get(name, ()))  # a column added later sits last
                runs.setdefault(name, []).append((i, end))
                env[f"split_{name}"] = table.groups[name].split
                parts.append(f"*g_{name}[{done}:{done + end - i}]")
                i = end
            else:
                codec = columns[i].codec
                if codec is not None and codec.decode is not None:
                    self.decoded.append((name, i, codec.decode))
                else:
                    plain.append((name, i))
                if codec is not None and codec.encode is not None:
                    env[f"encode_{name}"] = codec.encode
                    parts.append(f"encode_{name}(row.{name})")
                else:
                    parts.append(f"row.{name}")
                i += 1
            if name not in held:
                held.append(name)
        self.built: list[tuple[str, list[tuple[int, int]], Callable[..., Any]]] = [
            (name, spans, table.groups[name].build) for name, spans in runs.items()
        ]
        assert len(plain) > 1, f"{table.name}: a row of one plain column is read otherwise"
        self.plain_names = [name for name, _ in plain]
        self.plain_values = itemgetter(*(i for _, i in plain))
        # Most tables hold their row's fields one column each, in field order: read by zipping.
        in_order = not self.built and held == self.order
        self.decode: Callable[[Sequence[Any]], Any] = self._in_order if in_order else self._by_field
        split = "".join(f"    g_{name} = split_{name}(row.{name})\n" for name in runs)
        exec(f"def encode(row):\n{split}    return ({', '.join(parts)},)\n", env)
        self.encode: Callable[[Any], tuple[Any, ...]] = env["encode"]

    def _in_order(self, values: Sequence[Any]) -> Any:
        if self.decoded:
            values = list(values)
            for _, i, decode in self.decoded:
                values[i] = decode(values[i])
        row = object.__new__(self.row)
        row.__dict__.update(zip(self.order, values, strict=True))
        return row

    def _by_field(self, values: Sequence[Any]) -> Any:
        found = dict.fromkeys(self.order)
        found.update(zip(self.plain_names, self.plain_values(values), strict=True))
        for name, i, decode in self.decoded:
            found[name] = decode(values[i])
        for name, spans, build in self.built:
            found[name] = build(*(v for start, end in spans for v in values[start:end]))
        row = object.__new__(self.row)
        row.__dict__.update(found)
        return row
