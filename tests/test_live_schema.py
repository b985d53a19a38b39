"""Every backend's live schema is the described one (`kernel/sql/schema.py`): read from the
database's own catalog (SQLite's `pragma table_info` / `index_list` / `table_list`,
PostgreSQL's `information_schema` and `pg_indexes`) — for a new store, and for stores upgraded
from every older version that exists (a version-1 SQLite file, the 0.1.0 release's file at
version 3, a version-5 PostgreSQL store): their columns in order with type, nullability and
default, their key and unique column sets, their indexes, their row order and checks, and no
table or index more.

And the upgrade steps are the statements each version shipped with: a version's history is
never edited.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import BASIC_POLICY, BUILDER, OPERATOR
from support import run_statement

from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.sql.backends import Backend
from loopwarden.kernel.sql.dialect import Dialect
from loopwarden.kernel.sql.schema import SCHEMA_VERSION
from loopwarden.kernel.sql.table import Table
from loopwarden.kernel.sql.upgrades import SQLITE_VERSION_1, UPGRADES
from loopwarden.kernel.store.migrations import migrate
from loopwarden.kernel.store.store import Store
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import OpenLoopRequest, open_loop
from loopwarden.turns.claim import ClaimRequest, claim

RELEASE_0_1_0 = Path(__file__).parent / "fixtures" / "release-0.1.0"

pytestmark = pytest.mark.anyio


@dataclass(frozen=True)
class Shape:
    """One table as a catalog shows it, in terms both backends share."""

    columns: tuple[tuple[str, str, bool, str | None], ...]  # name, declared type, null, default
    primary: tuple[str, ...]
    unique: frozenset[tuple[str, ...]]  # every unique column set, the primary key's included
    indexes: dict[str, tuple[str, ...]]  # the other indexes
    clustered: bool | None  # rows kept in key order (None: the backend cannot say)
    checks: tuple[str, ...]


def revert(conn, step) -> None:
    """Take one upgrade step back on a DB-API connection (how these tests remake an older
    store)."""
    run_statement(conn, step.reverted())


def described(
    table: Table[Any], dialect: Dialect, primary: tuple[str, ...], *, orders_rows: bool
) -> Shape:
    """What the description says the catalog must show (`primary`: the backend's choice among
    the described unique sets; `orders_rows`: whether its catalog says if rows are kept in key
    order)."""
    unique = {table.key, *table.unique, *([(table.rowid,)] if table.rowid else [])}
    return Shape(
        columns=tuple(
            (c.name, dialect.types[c.type], c.null, None if c.default is None else c.default_sql)
            for c in table.columns
        ),
        primary=primary,
        unique=frozenset(unique),
        indexes={i.name: i.columns for i in table.indexes},
        clustered=table.clustered if orders_rows else None,
        checks=(table.check,) if table.check else (),
    )


# --- SQLite's catalog ---------------------------------------------------------------------------


def sqlite_shapes(conn: sqlite3.Connection) -> dict[str, Shape]:
    names = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    ]
    return {name: _sqlite_shape(conn, name) for name in names}


def _sqlite_shape(conn: sqlite3.Connection, name: str) -> Shape:
    info = conn.execute(f"PRAGMA table_info({name})").fetchall()  # cid name type notnull dflt pk
    # A primary key column is NOT NULL for this comparison (SQLite reports it as declared).
    columns = tuple((r[1], r[2], not (r[3] or r[5]), r[4]) for r in info)
    primary = tuple(r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5]))
    unique, indexes = {primary}, {}
    for _, index, is_unique, origin, _ in conn.execute(f"PRAGMA index_list({name})"):
        cols = tuple(r[2] for r in conn.execute(f"PRAGMA index_info({index})"))
        if origin == "c":
            assert not is_unique
            indexes[index] = cols
        else:
            unique.add(cols)
    (wr,) = conn.execute("SELECT wr FROM pragma_table_list WHERE name = ?", (name,)).fetchone()
    (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
    checks = tuple(re.findall(r"CHECK \((.*?)\)", sql))
    return Shape(columns, primary, frozenset(unique), indexes, bool(wr), checks)


def sqlite_expected(backend: type[Backend]) -> dict[str, Shape]:
    return {
        t.name: described(t, backend.dialect, (t.rowid,) if t.rowid else t.key, orders_rows=True)
        for t in backend.tables
    }


def assert_sqlite_schema(path: Path) -> None:
    from loopwarden.kernel.sql.sqlite import SqliteBackend

    conn = sqlite3.connect(path)
    try:
        live = sqlite_shapes(conn)
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()
    assert version == SCHEMA_VERSION
    assert_same(live, sqlite_expected(SqliteBackend))


def assert_same(live: dict[str, Shape], expected: dict[str, Shape]) -> None:
    assert sorted(live) == sorted(expected), "the tables"
    for name, shape in expected.items():
        got = live[name]
        for part in ("columns", "primary", "unique", "indexes", "clustered", "checks"):
            assert getattr(got, part) == getattr(shape, part), f"{name}: {part}"


# --- PostgreSQL's catalog -------------------------------------------------------------------------

PG_TYPES = {  # how information_schema shows each declared type: (data_type, collation)
    'TEXT COLLATE "C"': ("text", "C"),
    "TEXT": ("text", None),
    "BIGINT": ("bigint", None),
    "INTEGER": ("integer", None),
    "BYTEA": ("bytea", None),
}


def pg_shapes(conn: Any) -> dict[str, Shape]:
    names = [
        r[0]
        for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
    ]
    return {name: _pg_shape(conn, name) for name in names}


def _pg_shape(conn: Any, name: str) -> Shape:
    declared = {v: k for k, v in PG_TYPES.items()}
    identity = {"YES": " GENERATED {} AS IDENTITY", "NO": ""}
    columns = tuple(
        (
            column,
            declared[(kind, collation)] + identity[generated].format(generation),
            nullable == "YES",
            _pg_default(default),
        )
        for column, kind, collation, nullable, default, generated, generation in conn.execute(
            "SELECT column_name, data_type, collation_name, is_nullable, column_default, "
            "is_identity, identity_generation "
            "FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = %s ORDER BY ordinal_position",
            (name,),
        )
    )
    constraints: dict[str, tuple[str, list[str]]] = {}
    for constraint, kind, column in conn.execute(
        "SELECT c.constraint_name, c.constraint_type, k.column_name "
        "FROM information_schema.table_constraints c JOIN information_schema.key_column_usage k "
        "ON k.constraint_name = c.constraint_name AND k.table_schema = c.table_schema "
        "WHERE c.table_schema = current_schema() AND c.table_name = %s "
        "ORDER BY c.constraint_name, k.ordinal_position",
        (name,),
    ):
        constraints.setdefault(constraint, (kind, []))[1].append(column)
    primary = next(tuple(cols) for kind, cols in constraints.values() if kind == "PRIMARY KEY")
    unique = frozenset(tuple(cols) for _, cols in constraints.values())
    indexes = {
        index: tuple(c.strip() for c in re.search(r"\((.*)\)", text).group(1).split(","))  # type: ignore[union-attr]
        for index, text in conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = %s",
            (name,),
        )
        if index not in constraints
    }
    checks = tuple(
        re.sub(r"^CHECK \(\((.*)\)\)$", r"\1", definition)
        for (definition,) in conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE contype = 'c' AND conrelid = to_regclass(%s)",
            (name,),
        )
    )
    return Shape(columns, primary, unique, indexes, None, checks)


def _pg_default(default: str | None) -> str | None:
    return None if default is None else re.sub(r"::\w+$", "", default)


def assert_pg_schema(url: str) -> None:
    import psycopg

    from loopwarden.kernel.sql.postgres import PostgresBackend

    with psycopg.connect(url, autocommit=True) as conn:
        live = pg_shapes(conn)
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert int(version) == SCHEMA_VERSION
    dialect = PostgresBackend.dialect
    expected = {
        t.name: described(t, dialect, t.key, orders_rows=False) for t in PostgresBackend.tables
    }
    assert_same(live, expected)


# --- the stores ---------------------------------------------------------------------------------


async def _used(home: Path, url: str) -> None:
    """Open the store at `url` (making or upgrading it) and write through it."""
    keys = KeyStore(home)
    store = await Store.open(
        url, keys.load_signer(), keyring=keys.keyring(), key_dir=home, kinds=KINDS
    )
    try:
        opened = await open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(objective="o", policy=BASIC_POLICY, todos=[{"title": "a"}]),
        )
        assert (await claim(store, BUILDER, ClaimRequest(loop_id=opened.loop_id))).granted
    finally:
        await store.close()


async def test_a_new_sqlite_store_has_exactly_the_described_schema(home):
    await _used(home, str(home / "loopwarden.db"))
    assert_sqlite_schema(home / "loopwarden.db")


async def test_a_version_1_sqlite_file_upgraded_has_exactly_the_described_schema(home):
    home.mkdir(parents=True)
    conn = sqlite3.connect(home / "loopwarden.db", isolation_level=None)
    for statement in SQLITE_VERSION_1:
        conn.execute(statement)
    conn.execute("INSERT INTO meta (key, value) VALUES ('origin', 'loopwarden.local/old')")
    conn.execute("INSERT INTO log_state (id, size, frontier) VALUES (1, 0, x'')")
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    await _used(home, str(home / "loopwarden.db"))
    assert_sqlite_schema(home / "loopwarden.db")


async def test_the_0_1_0_release_file_upgraded_has_exactly_the_described_schema(tmp_path):
    home = tmp_path / "release"
    shutil.copytree(RELEASE_0_1_0, home)
    for key in (home / "keys").glob("*.key"):
        key.chmod(0o600)
    assert sqlite3.connect(home / "loopwarden.db").execute("PRAGMA user_version").fetchone()[0] == 3
    await _used(home, str(home / "loopwarden.db"))
    assert_sqlite_schema(home / "loopwarden.db")


async def test_a_new_postgresql_store_has_exactly_the_described_schema(home, pg_url):
    await _used(home, pg_url)
    assert_pg_schema(pg_url)


async def test_a_version_5_postgresql_store_upgraded_has_exactly_the_described_schema(home, pg_url):
    import psycopg

    await _used(home, pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to what version 5 made
        for version in sorted(UPGRADES, reverse=True):
            for step in reversed(UPGRADES[version]):
                revert(conn, step)
        conn.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    await _used(home, pg_url)
    assert_pg_schema(pg_url)


def test_the_catalog_comparison_sees_a_changed_column(tmp_path):
    """The comparison fails when the live schema differs from the description (here a column
    whose default was changed outside loopwarden): it can fail."""
    from loopwarden.kernel.sql.sqlite import SqliteBackend

    backend = SqliteBackend(tmp_path / "x.db", "normal")
    try:
        migrate(backend, Integrity(bytes(32)), KINDS)
        backend.writer.execute("ALTER TABLE turns ADD COLUMN extra TEXT")
    finally:
        backend.close_now()
    with pytest.raises(AssertionError, match="turns: columns"):
        assert_sqlite_schema(tmp_path / "x.db")


def test_the_shared_upgrade_steps_are_the_statements_their_versions_shipped_with():
    from loopwarden.kernel.sql.postgres import POSTGRESQL
    from loopwarden.kernel.sql.sqlite import SQLITE

    def spelled(dialect: Dialect) -> list[str]:
        return [s for step in UPGRADES[6] for s in step.statements(dialect)]

    assert spelled(SQLITE) == [
        "ALTER TABLE turns ADD COLUMN observed TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE turns ADD COLUMN reported TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE turns ADD COLUMN refusals INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE loops ADD COLUMN hosts TEXT NOT NULL DEFAULT '{}'",
    ]
    assert spelled(POSTGRESQL) == [
        "ALTER TABLE turns ADD COLUMN observed TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE turns ADD COLUMN reported TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE turns ADD COLUMN refusals BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE loops ADD COLUMN hosts TEXT NOT NULL DEFAULT '{}'",
    ]


def test_version_8_creates_the_export_cursors_table_as_version_8_described_it():
    from loopwarden.kernel.sql.sqlite import SQLITE

    step = UPGRADES[8][-1]  # version 8's budget pools come first
    assert step.statements(SQLITE) == [
        "CREATE TABLE export_cursors (\n    sink TEXT PRIMARY KEY,\n    exported INTEGER NOT NULL,"
        "\n    target TEXT NOT NULL,\n    holder TEXT,\n    lease_expires_at TEXT,"
        "\n    succeeded_at TEXT,\n    failed_at TEXT,\n    error TEXT,"
        "\n    sent INTEGER NOT NULL DEFAULT 0\n)"
    ]


async def test_a_version_7_sqlite_file_upgraded_gains_the_export_cursors_and_keeps_its_receipts(
    home,
):
    await _used(home, str(home / "loopwarden.db"))
    conn = sqlite3.connect(home / "loopwarden.db", isolation_level=None)
    for version in sorted((v for v in UPGRADES if v > 7), reverse=True):  # back to version 7
        for step in reversed(UPGRADES[version]):
            revert(conn, step)
    conn.execute("PRAGMA user_version = 7")
    (before,) = conn.execute("SELECT count(*) FROM journal").fetchone()
    conn.close()
    await _used(home, str(home / "loopwarden.db"))
    assert_sqlite_schema(home / "loopwarden.db")
    conn = sqlite3.connect(home / "loopwarden.db")
    assert conn.execute("SELECT count(*) FROM journal").fetchone()[0] == 2 * before
    conn.close()
