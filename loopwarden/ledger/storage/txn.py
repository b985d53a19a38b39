"""A write transaction: seal receipts, fold them, and keep every row's proof current.

`Txn.append` seals one receipt, chains it to the loop's previous one, extends the Merkle
frontier and folds it into the projection rows it touches. Reads go through the guard
(`guard.py`), so the rows a receipt is folded into are proved first; after the fold, the rows it
changed are written back with their new leaves in the loop's state tree, and the loop row with
the new root under its MAC. Everything runs inside the store's one write transaction: it
commits whole or not at all.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from loopwarden.canonical import canonical_bytes
from loopwarden.clock import format_time
from loopwarden.errors import Conflict, NotFound
from loopwarden.ledger.log import merkle
from loopwarden.ledger.log.checkpoints import sign_checkpoint
from loopwarden.ledger.log.integrity import LOG_MAC, LOOP_MAC, RECORD_MAC, TOKEN_MAC, Integrity
from loopwarden.ledger.log.keys import Signer
from loopwarden.ledger.log.receipts import Sealed, seal
from loopwarden.ledger.state.events import Fact, LoopOpened, ReceiptBody, ReceiptKind
from loopwarden.ledger.state.fold import apply, touched
from loopwarden.ledger.state.registry import make_body
from loopwarden.ledger.state.rows import LoopRow, LoopView
from loopwarden.ledger.storage.dialect import POSTGRESQL, SQLITE, Connection, Dialect, qmarks
from loopwarden.ledger.storage.guard import GuardedReader, loop_mac_values, row_leaf
from loopwarden.ledger.storage.reader import (
    LOOP_COLUMNS,
    ROW_SQL,
    TOKEN_COLUMNS,
    PolicyCache,
    TokenRow,
    loop_to_sql,
)
from loopwarden.ledger.storage.statetree import EMPTY, StateTree, node
from loopwarden.policy.decision import Decision
from loopwarden.principals import Principal


class Sealer(Protocol):
    """What a transaction needs of its store besides the connection (the `Store` is one)."""

    signer: Signer
    origin: str
    checkpoint_every: int


_ROW_KEYS = {"todos": "loop_id, todo_id", "turns": "turn_id", "approvals": "approval_id"}
"""Each row table's key: the rows an upsert replaces (`Dialect.upsert`)."""


class _Writes:
    """The upserts a transaction writes rows with, spelled once per backend at import."""

    def __init__(self, dialect: Dialect) -> None:
        self.rows = {
            table: dialect.upsert(table, columns, _ROW_KEYS[table])
            for table, (columns, _) in ROW_SQL.items()
        }
        self.loop = dialect.upsert("loops", f"{LOOP_COLUMNS}, state_root, mac", "loop_id")
        self.state_nodes = dialect.upsert(
            "state_nodes", "loop_id, level, idx, hashes", "loop_id, level, idx"
        )


_WRITES = {dialect.name: _Writes(dialect) for dialect in (SQLITE, POSTGRESQL)}


@dataclass(frozen=True)
class Appended:
    """A receipt made durable by its transaction: identity, position, and the folded view."""

    sealed: Sealed
    body: ReceiptBody
    leaf_index: int
    view: LoopView

    @property
    def receipt_id(self) -> str:
        return self.sealed.receipt_id

    @property
    def seq(self) -> int:
        return self.body.seq


class ProjectionWriter(GuardedReader):
    """Writes projection rows with their proofs: each changed row's leaf in its loop's state
    tree, the blobs it rewrote, and the loop row under the new root and its MAC."""

    def save(self, view: LoopView, old: dict[str, dict[str, Any]]) -> None:
        """Write the rows of `view` that are not in `old` (by identity), their leaves, and the
        loop row under its new root."""
        loop_id = view.loop.loop_id
        if loop_id not in self._trees:  # a new loop: nothing stored counts, its tree starts empty
            self._trees[loop_id] = StateTree(0, node(EMPTY), lambda level, idx: None)
        tree = self._trees[loop_id]
        tree.grow(view.loop.slots)
        changed: dict[str, list[Any]] = {
            table: [row for key, row in rows.items() if old.get(table, {}).get(key) is not row]
            for table, rows in (
                ("todos", view.todos),
                ("turns", view.turns),
                ("approvals", view.approvals),
            )
        }
        tree.fill({row.slot: row_leaf(t, row) for t, rows in changed.items() for row in rows})
        writes = _WRITES[self.dialect.name]
        for table, rows in changed.items():
            self.keep(table, rows)
            if rows:
                to_sql = ROW_SQL[table][1]
                self.conn.executemany(writes.rows[table], [to_sql(row) for row in rows])
        self.conn.executemany(
            writes.state_nodes,
            [(loop_id, level, idx, blob) for level, idx, blob in tree.blobs()],
        )
        tree.dirty.clear()
        self._save_loop(view.loop, tree.root)

    def _save_loop(self, loop: LoopRow, root: bytes) -> None:
        self._loops[loop.loop_id] = loop
        mac = self.integrity.mac(LOOP_MAC, loop_mac_values(loop, root))
        self.conn.execute(_WRITES[self.dialect.name].loop, (*loop_to_sql(loop), root, mac))


class Txn(ProjectionWriter):
    """An open write transaction. Reads see everything appended so far in the same transaction,
    and every row they return has been proved (see `guard.py`)."""

    def __init__(
        self,
        conn: Connection,
        policies: PolicyCache,
        integrity: Integrity,
        store: Sealer,
        now: datetime,
    ) -> None:
        super().__init__(conn, policies, integrity)
        self._store = store
        self.now_dt = now
        self.now = format_time(now)

    # --- receipts -----------------------------------------------------------------------------

    def append(
        self,
        loop_id: str,
        kind: ReceiptKind,
        principal: Principal,
        data: Fact,
        *,
        decision: Decision | None = None,
        policy_digest: str | None = None,
        turn_id: str | None = None,
        todo_id: str | None = None,
        approval_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Appended:
        """Seal one receipt and apply it: journal row, Merkle leaf, projection rows.

        `policy_digest` is required for `loop.opened` and otherwise taken from the loop. A
        receipt's time never goes back within its loop (another process's clock may lag: then
        it takes the loop's last time). Raises `SealError` if the receipt cannot be sealed,
        `FoldError` if it does not fit the loop's state and `IntegrityError` if a row it reads
        fails its proof; the caller's transaction then rolls back whole.
        """
        loop = self.loop_row(loop_id)
        at = self.now
        if kind == ReceiptKind.LOOP_OPENED:
            if loop is not None:
                raise Conflict(f"loop {loop_id!r} already exists")
            seq, prev = 1, None
        else:
            if loop is None:
                raise NotFound(f"loop {loop_id!r} does not exist")
            seq, prev, policy_digest = loop.head_seq + 1, loop.head_digest, loop.policy_digest
            at = max(at, loop.updated_at)
        body = make_body(
            kind,
            loop_id=loop_id,
            seq=seq,
            at=at,
            principal={"id": principal.id, "role": principal.role},
            turn_id=turn_id,
            todo_id=todo_id,
            approval_id=approval_id,
            decision=(decision or Decision("allow")).as_dict(),
            policy_digest=policy_digest,
            data=data,
            prev=prev,
            idempotency_key=idempotency_key,
        )
        sealed = seal(body.as_json(), self._store.signer)
        leaf_index = self._append_leaf(body, sealed)
        if isinstance(body.data, LoopOpened):
            self.conn.execute(
                self.dialect.insert_new("policies", "digest, document"),
                (policy_digest, canonical_bytes(body.data.policy).decode()),
            )
        return Appended(sealed, body, leaf_index, self._fold(body, sealed.digest))

    def _append_leaf(self, body: ReceiptBody, sealed: Sealed) -> int:
        size, frontier = self.log_state()
        self.conn.execute(
            "INSERT INTO journal (leaf_index, loop_id, seq, kind, receipt_id, digest, at, turn_id, "
            "envelope) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                size,
                body.loop_id,
                body.seq,
                body.kind,
                sealed.receipt_id,
                sealed.digest,
                body.at,
                body.turn_id,
                sealed.envelope,
            ),
        )
        frontier, nodes = merkle.append_leaf(frontier, size, merkle.leaf_hash(sealed.envelope))
        self.conn.executemany("INSERT INTO merkle_nodes (level, idx, hash) VALUES (?, ?, ?)", nodes)
        self._set_log(size + 1, frontier)
        every = self._store.checkpoint_every
        if every and (size + 1) % every == 0:
            self._write_checkpoint(size + 1, merkle.root_from_frontier(frontier))
        return size

    def _set_log(self, size: int, frontier: list[bytes]) -> None:
        joined = b"".join(frontier)
        mac = self.integrity.mac(LOG_MAC, [size, joined.hex()])
        self.conn.execute(
            "UPDATE log_state SET size = ?, frontier = ?, mac = ? WHERE id = 1", (size, joined, mac)
        )
        self._log = (size, frontier)

    def _fold(self, body: ReceiptBody, digest: str) -> LoopView:
        before = self.view(body.loop_id, touched(body))
        # The rows as loaded: the fold replaces the rows it changes, so identity tells which.
        old: dict[str, dict[str, Any]] = (
            {}
            if before is None
            else {
                "todos": dict(before.todos),
                "turns": dict(before.turns),
                "approvals": dict(before.approvals),
            }
        )
        after = apply(before, body, digest)
        self.save(after, old)
        return after

    # --- checkpoints --------------------------------------------------------------------------

    def _write_checkpoint(self, size: int, root: bytes) -> str:
        store = self._store
        note = sign_checkpoint(store.origin, size, root, store.signer)
        self.conn.execute(
            self.dialect.insert_new("checkpoints", "size, root, note, key_id, signed_at"),
            (size, root, note, store.signer.key_id, self.now),
        )
        return note

    def checkpoint(self) -> int:
        """Sign a checkpoint of the current tree unless one exists for this size; returns the size."""
        size, frontier = self.log_state()
        latest = self.latest_checkpoint()
        if size and (latest is None or latest.size < size):
            self._write_checkpoint(size, merkle.root_from_frontier(frontier))
        return size

    # --- operational records ------------------------------------------------------------------

    def remember(
        self, principal: str, key: str, operation: str, request_digest: str, text: str
    ) -> None:
        """Record the response (its JSON text) to an idempotent call (first write wins), under
        its MAC.

        Responses are kept forever (a replay after any delay must not act twice), so they are
        stored zlib-compressed: a full update result shrinks about fourfold.
        """
        mac = self.integrity.mac(RECORD_MAC, [principal, key, operation, request_digest, text])
        self.conn.execute(
            "INSERT INTO idempotency (principal, key, operation, request_digest, response, "
            "created_at, mac) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                principal,
                key,
                operation,
                request_digest,
                zlib.compress(text.encode(), 6),
                self.now,
                mac,
            ),
        )

    def add_token(
        self, token_hash: str, token_id: str, agent: str, role: str, expires_at: str | None = None
    ) -> None:
        values = TokenRow(
            token_hash, token_id, agent, role, self.now, None, expires_at
        ).mac_values()
        self.conn.execute(
            f"INSERT INTO tokens ({TOKEN_COLUMNS}) VALUES ({qmarks(TOKEN_COLUMNS)})",
            (*values, self.integrity.mac(TOKEN_MAC, values)),
        )

    def revoke_token(self, token_id: str) -> bool:
        token = next(
            (t for t in self.tokens() if t.token_id == token_id and t.revoked_at is None), None
        )
        if token is None:
            return False
        revoked = replace(token, revoked_at=self.now)
        # A row loopwarden did not write is revoked all the same, but keeps its failing MAC, so
        # that `verify` still reports it.
        genuine = self.integrity.valid(TOKEN_MAC, token.mac_values(), token.mac)
        mac = self.integrity.mac(TOKEN_MAC, revoked.mac_values()) if genuine else token.mac
        self.conn.execute(
            "UPDATE tokens SET revoked_at = ?, mac = ? WHERE token_hash = ?",
            (revoked.revoked_at, mac, token.token_hash),
        )
        return True

    def note_outsider_refusal(self, loop_id: str, seq: int, principal: str) -> None:
        """Mark receipt `seq` as a refusal sealed for an outsider (see operations/outsiders.py)."""
        self.conn.execute(
            "INSERT INTO outsider_refusals (loop_id, seq, principal, at, suppressed) "
            "VALUES (?, ?, ?, ?, 0)",
            (loop_id, seq, principal, self.now),
        )

    def count_suppressed_refusal(self, loop_id: str, seq: int) -> None:
        """Count one more refusal answered, not sealed, after the outsider's receipt `seq`."""
        self.conn.execute(
            "UPDATE outsider_refusals SET suppressed = suppressed + 1 WHERE loop_id = ? AND seq = ?",
            (loop_id, seq),
        )
