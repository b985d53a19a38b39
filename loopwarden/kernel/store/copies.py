"""Copying a whole store to another backend (`loopwarden store copy`), and proving the copy.

Every row is copied as it is stored — receipts byte for byte, Merkle nodes, checkpoints, the
projection with its state trees and MACs, tokens, idempotency records and the store's origin
(signed checkpoints name it) — into an empty store, in one write transaction of the
destination: it holds the whole copy or nothing. The MACs stay valid because both stores use
the home's one integrity secret. Then the copy is read back and compared with the source, table
by table and row by row, and its Merkle root recomputed from its receipts: a copy that differs
in any byte is reported, never passed.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from loopwarden.errors import Conflict, StoreError
from loopwarden.kernel.log import merkle
from loopwarden.kernel.sql.dialect import Connection
from loopwarden.kernel.sql.schema import IDEMPOTENCY, LOG_STATE, META, TABLES
from loopwarden.kernel.sql.table import Table
from loopwarden.kernel.store.reader import Reader

BATCH = 1000

COPIED: tuple[Table[Any], ...] = tuple(t for t in TABLES if t not in (META, LOG_STATE))
"""Everything a store holds but its meta rows (of which the origin is copied), its log state
(one row, updated in place) and the backend's own bookkeeping, each table in its row order."""
COPIED_META = ("origin",)
_RESPONSE = IDEMPOTENCY.names.index("response")


@dataclass
class CopyReport:
    """What was copied, and every difference the comparison found (none: a faithful copy)."""

    rows: dict[str, int] = field(default_factory=dict)
    size: int = 0
    root: str = ""
    differences: list[str] = field(default_factory=list)

    @property
    def faithful(self) -> bool:
        return not self.differences

    def as_dict(self) -> dict[str, Any]:
        return {
            "faithful": self.faithful,
            "receipts": self.size,
            "root": self.root,
            "rows": self.rows,
            "differences": self.differences,
        }


def _rows(reader: Reader, table: Table[Any]) -> Iterator[tuple[Any, ...]]:
    """Every row of `table`, every column, in row order, a batch at a time (the whole table is
    never held)."""
    columns, order = ", ".join(table.names), ", ".join(table.order)
    offset = 0
    while True:
        batch = reader.conn.execute(
            f"SELECT {columns} FROM {table.name} ORDER BY {order} LIMIT ? OFFSET ?",
            (BATCH, offset),
        ).fetchall()
        yield from (tuple(_plain(v) for v in row) for row in batch)
        if len(batch) < BATCH:
            return
        offset += len(batch)


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview | bytearray) else value


def _stored(table: Table[Any], row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row as the destination stores it: an idempotency response an old SQLite release kept
    as text is compressed, as every loopwarden since stores it (its MAC covers the text)."""
    i = _RESPONSE
    if table is IDEMPOTENCY and isinstance(row[i], str):
        return (*row[:i], zlib.compress(row[i].encode(), 6), *row[i + 1 :])
    return row


def copy_rows(source: Reader, destination: Connection) -> dict[str, int]:
    """Copy every row of `source` into the empty store behind the connection `destination`
    (inside the caller's write transaction). `Conflict` if the destination holds anything."""
    dest = Reader(destination)
    if dest.journal_count() or dest.tokens() or dest.loops():
        raise Conflict("the destination store is not empty; copy into a new, empty store")
    if source.legacy:
        raise StoreError("the source store has an old schema: open it once with loopwarden first")
    counts: dict[str, int] = {}
    for table in COPIED:
        insert = destination.dialect.insert(table)
        counts[table.name] = 0
        batch: list[tuple[Any, ...]] = []
        for row in _rows(source, table):
            batch.append(_stored(table, row))
            if len(batch) >= BATCH:
                destination.executemany(insert, batch)
                counts[table.name] += len(batch)
                batch = []
        if batch:
            destination.executemany(insert, batch)
            counts[table.name] += len(batch)
    size, frontier, mac = source.conn.execute(
        "SELECT size, frontier, mac FROM log_state WHERE id = 1"
    ).fetchone()
    destination.execute(
        "UPDATE log_state SET size = ?, frontier = ?, mac = ? WHERE id = 1",
        (size, _plain(frontier), _plain(mac)),
    )
    for key in COPIED_META:
        value = source.meta(key)
        if value is not None:
            destination.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key))
    return counts


def compare(source: Reader, copy: Reader, report: CopyReport) -> None:
    """Compare the copy with its source row for row, and its Merkle root with the one its
    receipts hash to; every difference goes into `report`."""
    for table in COPIED:
        name, theirs = table.name, _rows(copy, table)
        for index, mine in enumerate(_rows(source, table)):
            other = next(theirs, None)
            if other is None:
                report.differences.append(f"{name}: the copy lacks rows from row {index} on")
                break
            if _stored(table, mine) != other:
                report.differences.append(f"{name}: row {index} differs ({mine[0]!r})")
                break
        else:
            if next(theirs, None) is not None:
                report.differences.append(f"{name}: the copy has rows the source does not")
    if copy.log_state() != source.log_state():
        report.differences.append("the copy's Merkle log state differs")
    if source.meta("origin") != copy.meta("origin"):
        report.differences.append("the copy's origin (named in every checkpoint) differs")
    size, frontier = copy.log_state()
    leaves = [merkle.leaf_hash(row.envelope) for row in copy.iter_journal()]
    root = merkle.root_from_leaves(leaves)
    if len(leaves) != size or (size and merkle.root_from_frontier(frontier) != root):
        report.differences.append("the copy's Merkle root is not the root of its receipts")
    report.size, report.root = size, root.hex()
