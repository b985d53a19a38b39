"""The one procedure that brings a store to the current schema: a new one made from the table
descriptions, an older one upgraded by the steps each version added (`kernel/sql/upgrades.py`),
and, from before the proof fields, its projection re-derived from the journal (`rebuild.py`)."""

from __future__ import annotations

from loopwarden.errors import StoreError
from loopwarden.kernel.log.integrity import Integrity
from loopwarden.kernel.sql.backends import Backend
from loopwarden.kernel.sql.schema import KEY_ANCHOR, META, REBUILT_AT, SCHEMA_VERSION
from loopwarden.kernel.sql.upgrades import initialize, upgrade
from loopwarden.kernel.state.registry import Kinds
from loopwarden.kernel.store.rebuild import rebuild_projection


def migrate(backend: Backend, integrity: Integrity, kinds: Kinds) -> None:
    """Bring the store to `SCHEMA_VERSION` in one transaction (one process or replica at a
    time); refuse a store from a newer loopwarden. A new store is made from the descriptions,
    with the rows it begins with; an older one is upgraded, and from before `REBUILT_AT` its
    projection re-derived from the journal with proofs (`rebuild.py`), or refused whole if the
    two disagree."""
    with backend.migrating():
        version = backend.version_of(backend.writer)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the database has schema version {version}; this loopwarden knows "
                f"{SCHEMA_VERSION}. Upgrade loopwarden."
            )
        if version == SCHEMA_VERSION:
            return
        conn = backend.writer
        if version == 0:
            for table in backend.tables:
                for ddl in backend.dialect.create(table):
                    conn.execute(ddl)
            initialize(conn, integrity, backend.origin_prefix)
        else:
            for statement in upgrade(backend, version):
                if callable(statement):
                    statement(conn)
                else:
                    conn.execute(statement)
            if version < REBUILT_AT:  # the rows' proofs cover columns this upgrade added
                rebuild_projection(conn, integrity, kinds)
        backend.set_schema_version(SCHEMA_VERSION)


def anchor_key_history(backend: Backend, genesis: str) -> None:
    """Record `genesis` (a key history's genesis statement) as the store's anchor unless it
    has one: the first home to open a store names its genesis key for every later audit
    (`rotations.directory_trust`). Written once, in a short transaction of its own; a store
    that already anchors a history is left as it is (nothing is written, nothing locked)."""
    conn = backend.writer
    if conn.execute("SELECT 1 FROM meta WHERE key = ?", (KEY_ANCHOR,)).fetchone() is not None:
        return
    with backend.migrating():
        conn.execute(backend.dialect.insert_new(META), (KEY_ANCHOR, genesis))
