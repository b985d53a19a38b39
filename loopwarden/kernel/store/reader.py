"""Read-only queries over the database, shared by the write path, the tools and the audit.

Everything here runs synchronously on a connection owned by the caller (the store's worker
thread, or a read-only audit connection). Rows come back as the projection's dataclasses.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any, Protocol

from loopwarden.canonical import digest_of
from loopwarden.clock import format_time
from loopwarden.errors import IntegrityError
from loopwarden.kernel.sql.dialect import Connection
from loopwarden.kernel.sql.records import (
    CheckpointRow,
    CosignatureRow,
    ExportCursor,
    IdempotencyRecord,
    JournalRow,
    LogState,
    OutsiderCounts,
    OutsiderRefusal,
    PendingRow,
    TokenRow,
    WitnessRow,
)
from loopwarden.kernel.sql.schema import (
    APPROVALS,
    CHECKPOINTS,
    COSIGNATURES,
    EXPORT_CURSORS,
    IDEMPOTENCY,
    JOURNAL,
    KEY_ANCHOR,
    LEGACY_FIELDS,
    LEGACY_SCHEMA,
    LOOPS,
    OUTSIDER_REFUSALS,
    PENDING,
    POOL_USAGE,
    POOLS,
    TODOS,
    TOKENS,
    TURNS,
    WITNESSES,
    unpack_response,
)
from loopwarden.kernel.state.rows import (
    ApprovalRow,
    LoopRow,
    LoopView,
    PoolRow,
    PoolUsage,
    TodoRow,
    Touched,
    TurnRow,
)
from loopwarden.policy.budgets import Totals
from loopwarden.policy.loader import policy_from_data
from loopwarden.policy.model import LoopPolicy
from loopwarden.statuses import ApprovalStatus, TurnStatus

__all__ = [
    "LEGACY_FIELDS",
    "LEGACY_SCHEMA",
    "CheckpointRow",
    "ExportCursor",
    "IdempotencyRecord",
    "JournalRow",
    "LogState",
    "OutsiderCounts",
    "OutsiderRefusal",
    "PolicyCache",
    "Reader",
    "Rows",
    "TokenRow",
    "frontier_of",
    "unpack_response",
]

Row = tuple[Any, ...]


def _placeholders(values: Iterable[object]) -> str:
    return ",".join("?" for _ in values)


_SELECTED = {
    legacy: tuple(
        table.selected(LEGACY_SCHEMA if legacy else None)
        for table in (LOOPS, TODOS, TURNS, APPROVALS, TOKENS, IDEMPOTENCY, JOURNAL)
    )
    for legacy in (False, True)
}
"""The columns a reader selects of the tables whose schema changed, as the current schema and
the legacy one store them."""


def frontier_of(stored: bytes) -> list[bytes]:
    """A stored Merkle frontier: its 32-byte hashes."""
    return [stored[i : i + 32] for i in range(0, len(stored), 32)]


class PolicyCache:
    """Policies by digest. Content-addressed, hence immutable and safe to share across threads."""

    def __init__(self) -> None:
        self._policies: dict[str, LoopPolicy] = {}

    def get(self, digest: str) -> LoopPolicy | None:
        return self._policies.get(digest)

    def put(self, digest: str, policy: LoopPolicy) -> None:
        self._policies[digest] = policy


def _as_sealed(pending: PendingRow | None) -> JournalRow | None:
    return pending.integrated(None) if pending is not None else None


class Rows(Protocol):
    """What a decision reads of a loop's rows, whichever side it runs on: a read snapshot
    (`Reader`, whose rows are one consistent state) or a write transaction's proved rows
    (`ProvedRows`, `guard.py`, each row proved before it is returned). A function that decides
    takes `Rows`, so it reads the same way on both sides and, in a write, only proved rows."""

    def loop_row(self, loop_id: str) -> LoopRow | None: ...
    def policy(self, digest: str) -> LoopPolicy: ...
    def todos(self, loop_id: str, ids: Iterable[str]) -> dict[str, TodoRow]: ...
    def todo(self, loop_id: str, todo_id: str) -> TodoRow | None: ...
    def all_todos(self, loop_id: str) -> list[TodoRow]: ...
    def max_todo_order(self, loop_id: str) -> int: ...
    def turns(self, ids: Iterable[str]) -> dict[str, TurnRow]: ...
    def turn(self, turn_id: str) -> TurnRow | None: ...
    def loop_turns(self, loop_id: str, status: TurnStatus | None = None) -> list[TurnRow]: ...
    def open_turns(self, loop_id: str) -> list[TurnRow]: ...
    def expired_turns(self, loop_id: str, now: datetime) -> list[TurnRow]: ...
    def count_open_turns(
        self, loop_id: str, agent: str | None = None, *, live_at: datetime | None = None
    ) -> int: ...
    def claims_since(self, loop_id: str, since: datetime) -> int: ...
    def dependencies_done(self, loop_id: str, todo: TodoRow) -> bool: ...
    def next_eligible_todo(self, loop_id: str) -> TodoRow | None: ...
    def approvals(self, ids: Iterable[str]) -> dict[str, ApprovalRow]: ...
    def approval(self, approval_id: str) -> ApprovalRow | None: ...
    def approved_for_turn(self, loop_id: str, turn_id: str) -> dict[str, ApprovalRow]: ...
    def loop_approvals(
        self, loop_id: str, status: ApprovalStatus | None = None
    ) -> list[ApprovalRow]: ...
    def view(self, loop_id: str, touch: Touched | None) -> LoopView | None: ...
    def pools(self) -> dict[str, PoolRow]: ...
    def hold(self, names: Iterable[str]) -> None: ...
    def usage(self, pool: str, window_start: str) -> Totals: ...
    def idempotency(self, principal: str, key: str) -> IdempotencyRecord | None: ...
    def loops_with_expired_turns_in(self, pool: str, now: datetime) -> list[str]: ...


def loop_view(rows: Rows, loop_id: str, touch: Touched | None) -> LoopView | None:
    """The loop row plus the rows one receipt touches, read through `rows` (proved or not), or
    with `touch=None` every row of the loop; None if there is no such loop."""
    loop = rows.loop_row(loop_id)
    if loop is None:
        return None
    view = LoopView(loop=loop, policy=rows.policy(loop.policy_digest))
    if touch is None:
        view.todos = {t.todo_id: t for t in rows.all_todos(loop_id)}
        view.turns = {t.turn_id: t for t in rows.loop_turns(loop_id)}
        view.approvals = {a.approval_id: a for a in rows.loop_approvals(loop_id)}
    else:
        view.todos = rows.todos(loop_id, touch.todos)
        view.turns = rows.turns(touch.turns)
        view.approvals = rows.approvals(touch.approvals)
    return view


class Reader:
    """Synchronous read queries on one connection.

    `legacy`: the database has schema version 3 (an audit reading it before any loopwarden
    upgraded it): the proof fields read back as their defaults."""

    def __init__(
        self, conn: Connection, policies: PolicyCache | None = None, *, legacy: bool = False
    ) -> None:
        self.conn = conn
        self.dialect = conn.dialect
        self.policies = policies or PolicyCache()
        self.legacy = legacy
        (
            self._loop_columns,
            self._todo_columns,
            self._turn_columns,
            self._approval_columns,
            self._token_columns,
            self._idempotency_columns,
            self._journal_columns,
        ) = _SELECTED[legacy]

    @property
    def rows(self) -> Reader:
        """What decisions read (`Rows`): on a snapshot, the reader itself."""
        return self

    def _one(self, sql: str, params: Row = ()) -> Row | None:
        row: Row | None = self.conn.execute(sql, params).fetchone()
        return row

    # --- loops and policies -------------------------------------------------------------------

    def loop_row(self, loop_id: str) -> LoopRow | None:
        r = self._one(f"SELECT {self._loop_columns} FROM loops WHERE loop_id = ?", (loop_id,))
        return LOOPS.decode(r) if r else None

    def loops(self) -> list[LoopRow]:
        rows = self.conn.execute(
            f"SELECT {self._loop_columns} FROM loops ORDER BY opened_at, loop_id"
        )
        return [LOOPS.decode(r) for r in rows]

    def policy(self, digest: str) -> LoopPolicy:
        """The policy with this digest: its stored document, re-hashed against the digest first
        (content-addressed, so it is cached once proved)."""
        cached = self.policies.get(digest)
        if cached is not None:
            return cached
        document = self.policy_document(digest)
        if document is None:
            raise LookupError(f"policy {digest} is not stored")
        policy = policy_from_data(document, f"stored policy {digest}")
        self.policies.put(digest, policy)
        return policy

    def policy_document(self, digest: str) -> dict[str, Any] | None:
        """The stored policy document, or None; `IntegrityError` if it does not hash to its
        digest (someone edited it in the database)."""
        r = self._one("SELECT document FROM policies WHERE digest = ?", (digest,))
        if r is None:
            return None
        document: dict[str, Any] = json.loads(r[0])
        if digest_of(document) != digest:
            raise IntegrityError(
                f"the stored policy {digest} does not hash to its digest: it was edited outside "
                "loopwarden. Run `loopwarden verify`."
            )
        return document

    # --- todos, turns, approvals --------------------------------------------------------------

    def todos(self, loop_id: str, ids: Iterable[str]) -> dict[str, TodoRow]:
        return {t.todo_id: t for t in map(TODOS.decode, self.todo_values(loop_id, list(ids)))}

    def todo_values(self, loop_id: str, ids: list[str]) -> Iterable[Row]:
        """The stored values of the loop's todos `ids` that exist (`todos`, not decoded)."""
        if not ids:
            return ()
        return self.conn.execute(  # type: ignore[no-any-return]
            f"SELECT {self._todo_columns} FROM todos WHERE loop_id = ? AND todo_id IN ({_placeholders(ids)})",
            (loop_id, *ids),
        )

    def todo(self, loop_id: str, todo_id: str) -> TodoRow | None:
        return self.todos(loop_id, [todo_id]).get(todo_id)

    def all_todos(self, loop_id: str, limit: int | None = None) -> list[TodoRow]:
        """The loop's todos in claim order (all of them, or the first `limit`)."""
        sql = f"SELECT {self._todo_columns} FROM todos WHERE loop_id = ? ORDER BY ord, todo_id"
        if limit is None:
            return [TODOS.decode(r) for r in self.conn.execute(sql, (loop_id,))]
        return [TODOS.decode(r) for r in self.conn.execute(sql + " LIMIT ?", (loop_id, limit))]

    def max_todo_order(self, loop_id: str) -> int:
        r = self._one("SELECT max(ord) FROM todos WHERE loop_id = ?", (loop_id,))
        return int(r[0]) if r and r[0] is not None else 0

    def turns(self, ids: Iterable[str]) -> dict[str, TurnRow]:
        return {t.turn_id: t for t in map(TURNS.decode, self.turn_values(list(ids)))}

    def turn_values(self, ids: list[str]) -> Iterable[Row]:
        """The stored values of the turns `ids` that exist (`turns`, not decoded)."""
        if not ids:
            return ()
        return self.conn.execute(  # type: ignore[no-any-return]
            f"SELECT {self._turn_columns} FROM turns WHERE turn_id IN ({_placeholders(ids)})", ids
        )

    def turn(self, turn_id: str) -> TurnRow | None:
        return self.turns([turn_id]).get(turn_id)

    def _loop_turns(self, loop_id: str, tail: str, *params: object) -> list[TurnRow]:
        """The loop's turns matching `tail` (`AND …` conditions, then `ORDER BY …`)."""
        sql = f"SELECT {self._turn_columns} FROM turns WHERE loop_id = ? {tail}"
        return [TURNS.decode(r) for r in self.conn.execute(sql, (loop_id, *params))]

    def loop_turns(self, loop_id: str, status: TurnStatus | None = None) -> list[TurnRow]:
        if status is None:
            return self._loop_turns(loop_id, "ORDER BY claimed_at, turn_id")
        return self._loop_turns(loop_id, "AND status = ? ORDER BY claimed_at, turn_id", status)

    def open_turns(self, loop_id: str) -> list[TurnRow]:
        """The loop's open turns, in claim order (the ids its loop row lists)."""
        loop = self.loop_row(loop_id)
        found = self.turns(loop.open_turns) if loop is not None else {}
        return [found[t] for t in (loop.open_turns if loop else ()) if t in found]

    def expired_turns(self, loop_id: str, now: datetime) -> list[TurnRow]:
        tail = "AND status = 'open' AND lease_expires_at < ? ORDER BY lease_expires_at, turn_id"
        return self._loop_turns(loop_id, tail, format_time(now))

    def count_open_turns(
        self, loop_id: str, agent: str | None = None, *, live_at: datetime | None = None
    ) -> int:
        """Open turns of the loop (of one agent); with `live_at`, only those whose lease has
        not expired at that time (expired ones are swept on claim)."""
        sql = "SELECT count(*) FROM turns WHERE loop_id = ? AND status = 'open'"
        params: list[object] = [loop_id]
        if agent is not None:
            sql += " AND agent = ?"
            params.append(agent)
        if live_at is not None:
            sql += " AND lease_expires_at >= ?"
            params.append(format_time(live_at))
        r = self._one(sql, tuple(params))
        return int(r[0]) if r else 0

    def claims_since(self, loop_id: str, since: datetime) -> int:
        r = self._one(
            "SELECT count(*) FROM turns WHERE loop_id = ? AND claimed_at > ?",
            (loop_id, format_time(since)),
        )
        return int(r[0]) if r else 0

    def recent_turns(self, loop_id: str, limit: int) -> list[TurnRow]:
        return self._loop_turns(loop_id, "ORDER BY claimed_at DESC, turn_id DESC LIMIT ?", limit)

    def dependencies_done(self, loop_id: str, todo: TodoRow) -> bool:
        if not todo.depends_on:
            return True
        deps = list(todo.depends_on)
        r = self._one(
            f"SELECT count(*) FROM todos WHERE loop_id = ? AND status = 'done' "
            f"AND todo_id IN ({_placeholders(deps)})",
            (loop_id, *deps),
        )
        return r is not None and r[0] == len(set(deps))

    def next_eligible_todo(self, loop_id: str) -> TodoRow | None:
        """The first open todo (by order, then id) whose dependencies are all done: one query,
        however many open todos wait on unfinished ones."""
        r = self._one(
            f"SELECT {self._todo_columns} FROM todos t WHERE t.loop_id = ? AND t.status = 'open' "
            f"AND NOT EXISTS (SELECT 1 FROM {self.dialect.json_values('t.depends_on', 'd')} "
            "LEFT JOIN todos u ON u.loop_id = t.loop_id AND u.todo_id = d.value "
            "WHERE coalesce(u.status, '') <> 'done') "
            "ORDER BY t.ord, t.todo_id LIMIT 1",
            (loop_id,),
        )
        return TODOS.decode(r) if r else None

    def approvals(self, ids: Iterable[str]) -> dict[str, ApprovalRow]:
        return {a.approval_id: a for a in map(APPROVALS.decode, self.approval_values(list(ids)))}

    def approval_values(self, ids: list[str]) -> Iterable[Row]:
        """The stored values of the approvals `ids` that exist (`approvals`, not decoded)."""
        if not ids:
            return ()
        return self.conn.execute(  # type: ignore[no-any-return]
            f"SELECT {self._approval_columns} FROM approvals WHERE approval_id IN ({_placeholders(ids)})",
            ids,
        )

    def approved_for_turn(self, loop_id: str, turn_id: str) -> dict[str, ApprovalRow]:
        """The approved approvals requested in `turn_id` (expired or not)."""
        ids = [
            r[0]
            for r in self.conn.execute(
                "SELECT approval_id FROM approvals "
                "WHERE loop_id = ? AND status = 'approved' AND turn_id = ?",
                (loop_id, turn_id),
            )
        ]
        return self.approvals(ids)

    def approval(self, approval_id: str) -> ApprovalRow | None:
        return self.approvals([approval_id]).get(approval_id)

    def loop_approvals(
        self, loop_id: str | None = None, status: ApprovalStatus | None = None
    ) -> list[ApprovalRow]:
        clauses: list[str] = []
        params: list[object] = []
        if loop_id is not None:
            clauses.append("loop_id = ?")
            params.append(loop_id)
        if status is not None:
            clauses.append("status = ?")
            params.append(status)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self.conn.execute(
            f"SELECT {self._approval_columns} FROM approvals {where} ORDER BY requested_at, approval_id",
            params,
        )
        return [APPROVALS.decode(r) for r in rows]

    # --- views --------------------------------------------------------------------------------

    def view(self, loop_id: str, touch: Touched | None) -> LoopView | None:
        """The loop row plus the rows one receipt touches (a partial view, for the write path),
        or with `touch=None` every row of the loop (the whole projection, for an audit)."""
        return loop_view(self, loop_id, touch)

    def full_view(self, loop_id: str) -> LoopView | None:
        return self.view(loop_id, None)

    # --- journal and Merkle log ---------------------------------------------------------------

    def _journal(self, where: str, params: Row) -> JournalRow | None:
        r = self._one(f"SELECT {self._journal_columns} FROM journal WHERE {where}", params)
        return JOURNAL.decode(r) if r else None

    def receipt_by_id(self, receipt_id: str) -> JournalRow | None:
        """A receipt by id, integrated or pending (`leaf_index` None)."""
        found = self._journal("receipt_id = ?", (receipt_id,))
        return found or _as_sealed(self.pending_by_id(receipt_id))

    def receipt_by_seq(self, loop_id: str, seq: int) -> JournalRow | None:
        found = self._journal("loop_id = ? AND seq = ?", (loop_id, seq))
        return found or _as_sealed(self.pending_by_seq(loop_id, seq))

    def receipt_at(self, leaf_index: int) -> JournalRow | None:
        return self._journal("leaf_index = ?", (leaf_index,))

    def loop_journal(
        self,
        loop_id: str,
        *,
        after_seq: int = 0,
        limit: int | None = None,
        kind: str | None = None,
        integrated: bool = False,
    ) -> list[JournalRow]:
        """The loop's chain in `seq` order: its integrated receipts, then (unless `integrated`)
        those still pending, which always come after them."""
        sql = f"SELECT {self._journal_columns} FROM journal WHERE loop_id = ? AND seq > ?"
        params: list[object] = [loop_id, after_seq]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        rows = [JOURNAL.decode(r) for r in self.conn.execute(sql, params)]
        if not integrated and (limit is None or len(rows) < limit):
            rows += [
                p.integrated(None)
                for p in self.pending_receipts(loop_id)
                if p.seq > after_seq and kind in (None, p.kind)
            ][: None if limit is None else limit - len(rows)]
        return rows

    def recent_receipts(self, loop_id: str, limit: int) -> list[JournalRow]:
        """The loop's own latest receipts, pending or integrated: outsiders' refusals
        (`outsider_refusals`) left out, so no one outside the loop can push its activity out of
        view."""
        outsiders = "(SELECT seq FROM outsider_refusals WHERE loop_id = ?)"
        pending = [] if self.legacy else self._pending(f"loop_id = ? AND seq NOT IN {outsiders}",
                                                       (loop_id, loop_id))  # fmt: skip
        rows = [p.integrated(None) for p in reversed(pending)][:limit]
        if len(rows) < limit:
            found = self.conn.execute(
                f"SELECT {self._journal_columns} FROM journal WHERE loop_id = ? AND seq NOT IN "
                f"{outsiders} ORDER BY seq DESC LIMIT ?",
                (loop_id, loop_id, limit - len(rows)),
            )
            rows += [JOURNAL.decode(r) for r in found]
        return rows

    def last_outsider_refusal(self, loop_id: str, principal: str) -> OutsiderRefusal | None:
        r = self._one(
            f"SELECT {OUTSIDER_REFUSALS.row_names} FROM outsider_refusals "
            "WHERE loop_id = ? AND principal = ? ORDER BY seq DESC LIMIT 1",
            (loop_id, principal),
        )
        return OUTSIDER_REFUSALS.decode(r) if r else None

    def outsider_refusals(self, loop_id: str) -> OutsiderCounts:
        """The loop's refusals of outsiders sealed in its journal, and those answered but not
        sealed."""
        r = self._one(
            "SELECT count(*), CAST(coalesce(sum(suppressed), 0) AS BIGINT) FROM outsider_refusals "
            "WHERE loop_id = ?",
            (loop_id,),
        )
        return OutsiderCounts(sealed=r[0], suppressed=r[1]) if r else OutsiderCounts(0, 0)

    def journal_page(self, after: int, limit: int) -> list[JournalRow]:
        """Up to `limit` receipts in leaf order, from the leaf after `after` (-1: the first)."""
        rows = self.conn.execute(
            f"SELECT {self._journal_columns} FROM journal WHERE leaf_index > ? "
            "ORDER BY leaf_index LIMIT ?",
            (after, limit),
        ).fetchall()
        return [JOURNAL.decode(r) for r in rows]

    def iter_journal(self, batch: int = 2048) -> Iterator[JournalRow]:
        """Every receipt in leaf order, streamed in batches."""
        after = -1
        while receipts := self.journal_page(after, batch):
            yield from receipts
            after = receipts[-1].leaf

    def journal_count(self) -> int:
        r = self._one("SELECT count(*) FROM journal")
        return int(r[0]) if r else 0

    # --- receipts pending integration (integrator.py) -----------------------------------------

    def _pending(self, where: str, params: Row, limit: int | None = None) -> list[PendingRow]:
        if self.legacy:  # a store older than two orders has none
            return []
        sql = f"SELECT {PENDING.row_names} FROM pending WHERE {where} ORDER BY ticket"
        rows = self.conn.execute(sql + (f" LIMIT {int(limit)}" if limit else ""), params)
        return [PENDING.decode(r) for r in rows]

    def pending_by_id(self, receipt_id: str) -> PendingRow | None:
        return next(iter(self._pending("receipt_id = ?", (receipt_id,))), None)

    def pending_by_seq(self, loop_id: str, seq: int) -> PendingRow | None:
        return next(iter(self._pending("loop_id = ? AND seq = ?", (loop_id, seq))), None)

    def pending_receipts(self, loop_id: str | None = None) -> list[PendingRow]:
        """Receipts sealed into their chains and not yet integrated, in ticket order (the order
        they will be given leaves in)."""
        if loop_id is None:
            return self._pending("1 = 1", ())
        return self._pending("loop_id = ?", (loop_id,))

    def pending_count(self) -> int:
        if self.legacy:
            return 0
        r = self._one("SELECT count(*) FROM pending")
        return int(r[0]) if r else 0

    def sealed_count(self) -> int:
        """Receipts sealed into their chains: those with leaves and those pending theirs."""
        return self.journal_count() + self.pending_count()

    def log_state(self) -> LogState:
        r = self._one("SELECT size, frontier FROM log_state WHERE id = 1")
        if r is None:
            return LogState(0, [])
        return LogState(r[0], frontier_of(bytes(r[1])))

    def node(self, level: int, index: int) -> bytes:
        r = self._one("SELECT hash FROM merkle_nodes WHERE level = ? AND idx = ?", (level, index))
        if r is None:
            raise LookupError(f"Merkle node ({level}, {index}) is not stored")
        return bytes(r[0])

    def checkpoints(
        self, unreadable: Callable[[int, IntegrityError], None] | None = None
    ) -> list[CheckpointRow]:
        """The stored checkpoints by size. A row that does not decode (a time written outside
        loopwarden) raises, or with `unreadable` is passed to it (its size) and left out."""
        rows = self.conn.execute(f"SELECT {CHECKPOINTS.row_names} FROM checkpoints ORDER BY size")
        found = []
        for r in rows:
            try:
                found.append(CHECKPOINTS.decode(r))
            except IntegrityError as exc:
                if unreadable is None:
                    raise
                unreadable(int(r[0]), exc)
        return found

    def latest_checkpoint(self) -> CheckpointRow | None:
        r = self._one(f"SELECT {CHECKPOINTS.row_names} FROM checkpoints ORDER BY size DESC LIMIT 1")
        return CHECKPOINTS.decode(r) if r else None

    def checkpoint_of(self, size: int) -> CheckpointRow | None:
        """The checkpoint of tree size `size`, if one was signed."""
        r = self._one(f"SELECT {CHECKPOINTS.row_names} FROM checkpoints WHERE size = ?", (size,))
        return CHECKPOINTS.decode(r) if r else None

    def cosignatures(self, size: int | None = None) -> list[CosignatureRow]:
        """The witnesses' cosignatures stored for the checkpoint of `size` (all, by size, if
        None), in the order they came."""
        if self.legacy:  # a store older than the witnesses has none
            return []
        where, args = ("WHERE size = ? ", (size,)) if size is not None else ("", ())
        rows = self.conn.execute(
            f"SELECT {COSIGNATURES.row_names} FROM cosignatures {where}"
            "ORDER BY size, received_at, witness",
            args,
        )
        return [COSIGNATURES.decode(r) for r in rows]

    def witness_rows(self) -> list[WitnessRow]:
        """Where each witness stands for this log, as the witness client last heard."""
        if self.legacy:
            return []
        rows = self.conn.execute(f"SELECT {WITNESSES.row_names} FROM witnesses ORDER BY vkey")
        return [WITNESSES.decode(r) for r in rows]

    def meta(self, key: str) -> str | None:
        r = self._one("SELECT value FROM meta WHERE key = ?", (key,))
        return str(r[0]) if r else None

    def key_anchor(self) -> str | None:
        """The genesis statement of the key history the store was first opened with, or None
        for a store no home with a history has opened (`migrations.anchor_key_history`)."""
        return self.meta(KEY_ANCHOR)

    # --- idempotency, tokens, keys ------------------------------------------------------------

    def idempotency(self, principal: str, key: str) -> IdempotencyRecord | None:
        """The record of this principal's key (its response as JSON text), or None.
        `IntegrityError` if the stored response is not one loopwarden wrote."""
        r = self._one(
            f"SELECT {self._idempotency_columns} FROM idempotency WHERE principal = ? AND key = ?",
            (principal, key),
        )
        return IDEMPOTENCY.decode(r) if r else None

    # --- budget pools -------------------------------------------------------------------------

    def pools(self) -> dict[str, PoolRow]:
        """Every budget pool, by name (none in a store older than pools)."""
        if self.legacy:
            return {}
        rows = self.conn.execute(f"SELECT {POOLS.row_names} FROM pools ORDER BY name")
        return {row.name: row for row in map(POOLS.decode, rows)}

    def hold(self, names: Iterable[str]) -> None:
        """Nothing to hold: a read answers from one snapshot (the write path's guard locks
        the pools it decides on)."""

    def pool_usage(self, pool: str, window_start: str | None = None) -> list[PoolUsage]:
        """What the windows of `pool` used, oldest first (only `window_start`'s if given)."""
        if self.legacy:
            return []
        sql = f"SELECT {POOL_USAGE.row_names} FROM pool_usage WHERE pool = ?"
        params: tuple[str, ...] = (pool,)
        if window_start is not None:
            sql, params = sql + " AND window_start = ?", (pool, window_start)
        rows = self.conn.execute(sql + " ORDER BY window_start", params)
        return [POOL_USAGE.decode(r) for r in rows]

    def loops_with_expired_turns_in(self, pool: str, now: datetime) -> list[str]:
        """The loops holding an open turn admitted under `pool` whose lease ran out before
        `now` (candidates only: the write path sweeps each through its proved rows)."""
        if self.legacy:
            return []
        named = '%"' + pool.replace("_", "!_") + '"%'  # a name's `_` is no wildcard
        rows = self.conn.execute(
            "SELECT DISTINCT loop_id FROM turns WHERE status = 'open' AND lease_expires_at < ? "
            "AND pools LIKE ? ESCAPE '!' ORDER BY loop_id",
            (format_time(now), named),
        )
        return [loop_id for (loop_id,) in rows]

    def usage(self, pool: str, window_start: str) -> Totals:
        """What one window of `pool` used (zero for a window not begun)."""
        used = self.pool_usage(pool, window_start)
        return used[0].totals if used else Totals()

    def token(self, token_hash: str) -> TokenRow | None:
        r = self._one(
            f"SELECT {self._token_columns} FROM tokens WHERE token_hash = ?", (token_hash,)
        )
        return TOKENS.decode(r) if r else None

    def tokens_version(self) -> tuple[int, int, str]:
        """What changes whenever a token is minted or revoked, by any writer: the number of
        tokens, of revoked ones, and the last revocation's time (the server's verified-token
        cache is checked against it on every request)."""
        r = self._one("SELECT COUNT(*), COUNT(revoked_at), MAX(revoked_at) FROM tokens")
        assert r is not None
        return int(r[0]), int(r[1]), str(r[2] or "")

    def tokens(self) -> list[TokenRow]:
        rows = self.conn.execute(
            f"SELECT {self._token_columns} FROM tokens ORDER BY created_at, token_id"
        )
        return [TOKENS.decode(r) for r in rows]

    # --- export sinks -------------------------------------------------------------------------

    def export_cursor(self, sink: str) -> ExportCursor | None:
        """The cursor of the export sink named `sink`, or None if it never ran."""
        if self.legacy:  # a store older than the export sinks has none
            return None
        r = self._one(
            f"SELECT {EXPORT_CURSORS.row_names} FROM export_cursors WHERE sink = ?", (sink,)
        )
        return EXPORT_CURSORS.decode(r) if r else None

    def export_cursors(self) -> list[ExportCursor]:
        """Every export sink's cursor, by name."""
        if self.legacy:
            return []
        rows = self.conn.execute(
            f"SELECT {EXPORT_CURSORS.row_names} FROM export_cursors ORDER BY sink"
        )
        return [EXPORT_CURSORS.decode(r) for r in rows]
