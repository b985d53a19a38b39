"""Upgrading a database to the proof fields: re-derive the projection from the journal, once.

A database written before schema version 4 has projection rows without slots, state trees or
MACs. The upgrade folds every loop's receipts again (the same fold the write path and the audit
use) and writes the rows back with their proofs, and MACs the Merkle log, the tokens and the
idempotency records. It trusts the database only as far as it agrees with itself: if a stored
row of the old schema differs from what the journal folds to, the upgrade is refused whole (an
`IntegrityError`, nothing changed), because sealing proofs over an edited row would vouch for
the edit. `loopwarden verify` reads such a database as it is, and says what differs.
"""

from __future__ import annotations

from loopwarden.clock import parse_time
from loopwarden.errors import IntegrityError
from loopwarden.kernel.log.integrity import LOG_MAC, RECORD_MAC, TOKEN_MAC, Integrity
from loopwarden.kernel.log.seals import open_envelope
from loopwarden.kernel.sql.dialect import Connection
from loopwarden.kernel.sql.records import IdempotencyRecord
from loopwarden.kernel.sql.schema import (
    LEGACY_FIELDS,
    PROJECTION,
    STATE_NODES,
    unpack_response,
)
from loopwarden.kernel.state.fold import FoldError
from loopwarden.kernel.state.registry import Kinds
from loopwarden.kernel.state.rows import LoopView, diff_views
from loopwarden.kernel.store.guard import ProvedRows
from loopwarden.kernel.store.reader import PolicyCache, Reader


def _fold_journal(reader: Reader, kinds: Kinds) -> dict[str, LoopView]:
    views: dict[str, LoopView] = {}
    for row in reader.iter_journal():
        try:
            body = kinds.parse_body(open_envelope(row.envelope, None, canonical=False).body)
            if kinds[body.kind].pool is not None:
                continue  # a pool's rows are not the loops' projection: they stay as they are
            views[body.loop_id] = kinds.apply(views.get(body.loop_id), body, row.digest)
        except (FoldError, ValueError) as exc:
            raise IntegrityError(
                f"cannot upgrade: receipt {row.receipt_id} does not fold ({exc}). The database is "
                "unchanged; run `loopwarden verify` to see what is wrong."
            ) from None
    return views


def _check_agrees(legacy: Reader, views: dict[str, LoopView]) -> None:
    stored_ids = {loop.loop_id for loop in legacy.loops()}
    for loop_id in sorted(stored_ids | set(views)):
        stored = legacy.full_view(loop_id)
        rebuilt = views.get(loop_id)
        differences = (
            ["it is stored but has no receipts" if rebuilt is None else "it has no stored row"]
            if stored is None or rebuilt is None
            else diff_views(stored, rebuilt, ignore=LEGACY_FIELDS)
        )
        if differences:
            raise IntegrityError(
                f"cannot upgrade: the stored projection of loop {loop_id!r} differs from its "
                f"receipts ({differences[0]}). The database is unchanged; audit it with "
                "`loopwarden verify`."
            )


def rebuild_projection(conn: Connection, integrity: Integrity, kinds: Kinds) -> None:
    """Re-derive every projection row with its proof, and MAC the unsigned rows (inside the
    caller's transaction). `IntegrityError` if the stored projection disagrees with the journal."""
    views = _fold_journal(Reader(conn), kinds)
    _check_agrees(Reader(conn, legacy=True), views)
    for table in (*PROJECTION, STATE_NODES):
        conn.execute(f"DELETE FROM {table.name}")
    writer = ProvedRows(conn, PolicyCache(), integrity)
    for view in views.values():
        writer.save(view, {})
    size, frontier = conn.execute("SELECT size, frontier FROM log_state WHERE id = 1").fetchone()
    conn.execute(
        "UPDATE log_state SET mac = ? WHERE id = 1",
        (integrity.mac(LOG_MAC, [size, bytes(frontier).hex()]),),
    )
    for token in Reader(conn).tokens():
        conn.execute(
            "UPDATE tokens SET mac = ? WHERE token_hash = ?",
            (integrity.mac(TOKEN_MAC, token.mac_values()), token.token_hash),
        )
    for principal, key, operation, digest, response, at in conn.execute(
        "SELECT principal, key, operation, request_digest, response, created_at FROM idempotency"
    ).fetchall():
        text = unpack_response(response)
        record = IdempotencyRecord(principal, key, operation, digest, text, parse_time(at))
        conn.execute(
            "UPDATE idempotency SET mac = ? WHERE principal = ? AND key = ?",
            (integrity.mac(RECORD_MAC, record.mac_values()), principal, key),
        )
