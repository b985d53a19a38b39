"""Read-only queries over the database, shared by the write path, the tools and the audit.

Everything here runs synchronously on a connection owned by the caller (the store's worker
thread, or a read-only audit connection). Rows come back as the projection's dataclasses.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from loopwarden.canonical import digest_of
from loopwarden.errors import IntegrityError
from loopwarden.ledger.state.rows import ApprovalRow, LoopRow, LoopView, TodoRow, Touched, TurnRow
from loopwarden.ledger.storage.dialect import Connection, dialect_of
from loopwarden.policy.budgets import Totals
from loopwarden.policy.loader import policy_from_data
from loopwarden.policy.model import LoopPolicy
from loopwarden.statuses import ApprovalStatus, LoopStatus, TodoStatus, TurnStatus

LOOP_COLUMNS = (
    "loop_id, objective, status, stop_reason, policy_digest, opened_at, opened_by, turns, "
    "model_calls, input_tokens, output_tokens, tool_calls, cost_micros, wall_micros, todos_open, "
    "todos_claimed, todos_done, todos_blocked, failure_signature, failure_streak, head_seq, "
    "head_digest, updated_at, open_turns, slots, hosts"
)
TODO_COLUMNS = (
    "loop_id, todo_id, title, ord, depends_on, status, attempts, fence, added_by, turn_id, slot"
)
TURN_COLUMNS = (
    "turn_id, loop_id, todo_id, agent, fence, status, claimed_at, lease_expires_at, closed_at, "
    "outcome, slot, number, observed, reported, refusals"
)
APPROVAL_COLUMNS = (
    "approval_id, loop_id, turn_id, todo_id, tool, summary, artifact_digest, status, requested_by, "
    "requested_at, decided_by, decided_at, expires_at, reason, consumed_by, slot"
)
TOKEN_COLUMNS = "token_hash, token_id, agent, role, created_at, revoked_at, expires_at, mac"
JOURNAL_COLUMNS = "leaf_index, loop_id, seq, kind, receipt_id, digest, at, turn_id, envelope"

LEGACY_SCHEMA = 3
"""The last schema without the proof fields (loopwarden 0.1.0): still readable by an audit."""
LEGACY_FIELDS = frozenset(
    {"open_turns", "slots", "slot", "number", "hosts", "observed", "reported", "refusals"}
)
"""Row fields that schema did not store (read back as their defaults, and not compared)."""
_LEGACY_COLUMNS = {
    "loops": LOOP_COLUMNS.replace(", open_turns, slots, hosts", ", '[]', 0, '{}'"),
    "todos": TODO_COLUMNS.replace(", slot", ", 0"),
    "turns": TURN_COLUMNS.replace(
        ", slot, number, observed, reported, refusals", ", 0, 0, '{}', '{}', 0"
    ),
    "approvals": APPROVAL_COLUMNS.replace(", slot", ", 0"),
    "tokens": TOKEN_COLUMNS.replace(", expires_at, mac", ", NULL, NULL"),
}


def loop_from_sql(r: tuple) -> LoopRow:
    return LoopRow(
        loop_id=r[0],
        objective=r[1],
        status=LoopStatus(r[2]),
        stop_reason=r[3],
        policy_digest=r[4],
        opened_at=r[5],
        opened_by=r[6],
        totals=Totals(*r[7:14]),
        todo_counts=(r[14], r[15], r[16], r[17]),
        failure_signature=r[18],
        failure_streak=r[19],
        head_seq=r[20],
        head_digest=r[21],
        updated_at=r[22],
        open_turns=tuple(json.loads(r[23])),
        slots=r[24],
        hosts={agent: tuple(seen) for agent, seen in json.loads(r[25]).items()},
    )


def loop_to_sql(row: LoopRow) -> tuple:
    t = row.totals
    return (
        row.loop_id,
        row.objective,
        row.status,
        row.stop_reason,
        row.policy_digest,
        row.opened_at,
        row.opened_by,
        t.turns,
        t.model_calls,
        t.input_tokens,
        t.output_tokens,
        t.tool_calls,
        t.cost_micros,
        t.wall_micros,
        *row.todo_counts,
        row.failure_signature,
        row.failure_streak,
        row.head_seq,
        row.head_digest,
        row.updated_at,
        json.dumps(list(row.open_turns)),
        row.slots,
        _json_object(row.hosts),
    )


def _json_object(value: dict[str, Any]) -> str:
    """A dict column as JSON text, keys sorted (a row's bytes, MACs and leaves are stable)."""
    return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in sorted(value.items())})


def todo_from_sql(r: tuple) -> TodoRow:
    deps = tuple(json.loads(r[4]))
    return TodoRow(r[0], r[1], r[2], r[3], deps, TodoStatus(r[5]), r[6], r[7], r[8], r[9], r[10])


def todo_to_sql(row: TodoRow) -> tuple:
    return (
        row.loop_id,
        row.todo_id,
        row.title,
        row.ord,
        json.dumps(list(row.depends_on)),
        row.status,
        row.attempts,
        row.fence,
        row.added_by,
        row.turn_id,
        row.slot,
    )


def turn_from_sql(r: tuple) -> TurnRow:
    status = TurnStatus(r[5])
    observed = {tool: (seen[0], seen[1]) for tool, seen in json.loads(r[12]).items()}
    return TurnRow(
        turn_id=r[0],
        loop_id=r[1],
        todo_id=r[2],
        agent=r[3],
        fence=r[4],
        status=status,
        claimed_at=r[6],
        lease_expires_at=r[7],
        closed_at=r[8],
        outcome=r[9],
        slot=r[10],
        number=r[11],
        observed=observed,
        reported=json.loads(r[13]),
        refusals=r[14],
    )


def turn_to_sql(row: TurnRow) -> tuple:
    return (
        row.turn_id,
        row.loop_id,
        row.todo_id,
        row.agent,
        row.fence,
        row.status,
        row.claimed_at,
        row.lease_expires_at,
        row.closed_at,
        row.outcome,
        row.slot,
        row.number,
        _json_object(row.observed),
        _json_object(row.reported),
        row.refusals,
    )


_APPROVAL_FIELDS = tuple(f.name for f in fields(ApprovalRow))


def approval_from_sql(r: tuple) -> ApprovalRow:
    values = dict(zip(_APPROVAL_FIELDS, r, strict=True))
    values["status"] = ApprovalStatus(values["status"])
    return ApprovalRow(**values)


def approval_to_sql(row: ApprovalRow) -> tuple:
    return tuple(row.__dict__.values())


ROW_SQL: dict[str, tuple[str, Callable[[Any], tuple[Any, ...]]]] = {
    "todos": (TODO_COLUMNS, todo_to_sql),
    "turns": (TURN_COLUMNS, turn_to_sql),
    "approvals": (APPROVAL_COLUMNS, approval_to_sql),
}
"""Per row table: its columns and how a row becomes their values (what the state tree hashes)."""


@dataclass(frozen=True)
class JournalRow:
    leaf_index: int
    loop_id: str
    seq: int
    kind: str
    receipt_id: str
    digest: str
    at: str
    turn_id: str | None
    envelope: bytes


def journal_from_sql(r: tuple) -> JournalRow:
    # A hand-edited envelope may come back as TEXT; the audit must see bytes either way.
    envelope = r[8]
    if not isinstance(envelope, bytes):
        envelope = str(envelope).encode("utf-8", "surrogatepass")
    return JournalRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], envelope)


@dataclass(frozen=True)
class CheckpointRow:
    size: int
    root: bytes
    note: str
    key_id: str
    signed_at: str


@dataclass(frozen=True)
class TokenRow:
    token_hash: str
    token_id: str
    agent: str
    role: str
    created_at: str
    revoked_at: str | None
    expires_at: str | None = None
    mac: bytes | None = None

    def live_at(self, now: str) -> bool:
        """Neither revoked nor expired at `now` (a `format_time` string)."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def mac_values(self) -> list[object]:
        """What the row's MAC covers: every column but the MAC."""
        return [
            self.token_hash,
            self.token_id,
            self.agent,
            self.role,
            self.created_at,
            self.revoked_at,
            self.expires_at,
        ]


@dataclass(frozen=True)
class OutsiderRefusal:
    """The last refusal sealed for one outsider in one loop, and how many were answered since
    without being sealed."""

    seq: int
    at: str
    suppressed: int


def unpack_response(stored: bytes | str) -> str:
    """An idempotency record's response JSON as stored (zlib-compressed, see `Txn.remember`);
    bytes that do not decompress are an `IntegrityError`: loopwarden did not write them."""
    if not isinstance(stored, bytes):
        return str(stored)
    try:
        return zlib.decompress(stored).decode()
    except (zlib.error, UnicodeDecodeError):
        raise IntegrityError(
            "an idempotency record's response was changed outside loopwarden"
        ) from None


def _placeholders(values: Iterable[object]) -> str:
    return ",".join("?" for _ in values)


class PolicyCache:
    """Policies by digest. Content-addressed, hence immutable and safe to share across threads."""

    def __init__(self) -> None:
        self._policies: dict[str, LoopPolicy] = {}

    def get(self, digest: str) -> LoopPolicy | None:
        return self._policies.get(digest)

    def put(self, digest: str, policy: LoopPolicy) -> None:
        self._policies[digest] = policy


class Reader:
    """Synchronous read queries on one connection.

    `legacy`: the database has schema version 3 (an audit reading it before any loopwarden
    upgraded it): the proof fields read back as their defaults."""

    def __init__(
        self, conn: Connection, policies: PolicyCache | None = None, *, legacy: bool = False
    ) -> None:
        self.conn = conn
        self.dialect = dialect_of(conn)
        self.policies = policies or PolicyCache()
        self.legacy = legacy
        columns = _LEGACY_COLUMNS if legacy else {}
        self._loop_columns = columns.get("loops", LOOP_COLUMNS)
        self._todo_columns = columns.get("todos", TODO_COLUMNS)
        self._turn_columns = columns.get("turns", TURN_COLUMNS)
        self._approval_columns = columns.get("approvals", APPROVAL_COLUMNS)
        self._token_columns = columns.get("tokens", TOKEN_COLUMNS)

    def _one(self, sql: str, params: tuple = ()) -> tuple | None:
        return self.conn.execute(sql, params).fetchone()

    # --- loops and policies -------------------------------------------------------------------

    def loop_row(self, loop_id: str) -> LoopRow | None:
        r = self._one(f"SELECT {self._loop_columns} FROM loops WHERE loop_id = ?", (loop_id,))
        return loop_from_sql(r) if r else None

    def loops(self) -> list[LoopRow]:
        rows = self.conn.execute(
            f"SELECT {self._loop_columns} FROM loops ORDER BY opened_at, loop_id"
        )
        return [loop_from_sql(r) for r in rows]

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

    def policy_document(self, digest: str) -> dict | None:
        """The stored policy document, or None; `IntegrityError` if it does not hash to its
        digest (someone edited it in the database)."""
        r = self._one("SELECT document FROM policies WHERE digest = ?", (digest,))
        if r is None:
            return None
        document = json.loads(r[0])
        if digest_of(document) != digest:
            raise IntegrityError(
                f"the stored policy {digest} does not hash to its digest: it was edited outside "
                "loopwarden. Run `loopwarden verify`."
            )
        return document

    # --- todos, turns, approvals --------------------------------------------------------------

    def todos(self, loop_id: str, ids: Iterable[str]) -> dict[str, TodoRow]:
        ids = list(ids)
        if not ids:
            return {}
        rows = self.conn.execute(
            f"SELECT {self._todo_columns} FROM todos WHERE loop_id = ? AND todo_id IN ({_placeholders(ids)})",
            (loop_id, *ids),
        )
        return {r[1]: todo_from_sql(r) for r in rows}

    def todo(self, loop_id: str, todo_id: str) -> TodoRow | None:
        return self.todos(loop_id, [todo_id]).get(todo_id)

    def all_todos(self, loop_id: str, limit: int | None = None) -> list[TodoRow]:
        """The loop's todos in claim order (all of them, or the first `limit`)."""
        sql = f"SELECT {self._todo_columns} FROM todos WHERE loop_id = ? ORDER BY ord, todo_id"
        if limit is None:
            return [todo_from_sql(r) for r in self.conn.execute(sql, (loop_id,))]
        return [todo_from_sql(r) for r in self.conn.execute(sql + " LIMIT ?", (loop_id, limit))]

    def max_todo_order(self, loop_id: str) -> int:
        r = self._one("SELECT max(ord) FROM todos WHERE loop_id = ?", (loop_id,))
        return r[0] if r and r[0] is not None else 0

    def turns(self, ids: Iterable[str]) -> dict[str, TurnRow]:
        ids = list(ids)
        if not ids:
            return {}
        rows = self.conn.execute(
            f"SELECT {self._turn_columns} FROM turns WHERE turn_id IN ({_placeholders(ids)})", ids
        )
        return {r[0]: turn_from_sql(r) for r in rows}

    def turn(self, turn_id: str) -> TurnRow | None:
        return self.turns([turn_id]).get(turn_id)

    def _loop_turns(self, loop_id: str, tail: str, *params: object) -> list[TurnRow]:
        """The loop's turns matching `tail` (`AND …` conditions, then `ORDER BY …`)."""
        sql = f"SELECT {self._turn_columns} FROM turns WHERE loop_id = ? {tail}"
        return [turn_from_sql(r) for r in self.conn.execute(sql, (loop_id, *params))]

    def loop_turns(self, loop_id: str, status: TurnStatus | None = None) -> list[TurnRow]:
        if status is None:
            return self._loop_turns(loop_id, "ORDER BY claimed_at, turn_id")
        return self._loop_turns(loop_id, "AND status = ? ORDER BY claimed_at, turn_id", status)

    def open_turns(self, loop_id: str) -> list[TurnRow]:
        """The loop's open turns, in claim order (the ids its loop row lists)."""
        loop = self.loop_row(loop_id)
        found = self.turns(loop.open_turns) if loop is not None else {}
        return [found[t] for t in (loop.open_turns if loop else ()) if t in found]

    def expired_turns(self, loop_id: str, now: str) -> list[TurnRow]:
        tail = "AND status = 'open' AND lease_expires_at < ? ORDER BY lease_expires_at, turn_id"
        return self._loop_turns(loop_id, tail, now)

    def count_open_turns(
        self, loop_id: str, agent: str | None = None, *, live_at: str | None = None
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
            params.append(live_at)
        r = self._one(sql, tuple(params))
        return r[0] if r else 0

    def claims_since(self, loop_id: str, since: str) -> int:
        r = self._one(
            "SELECT count(*) FROM turns WHERE loop_id = ? AND claimed_at > ?", (loop_id, since)
        )
        return r[0] if r else 0

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
        return todo_from_sql(r) if r else None

    def approvals(self, ids: Iterable[str]) -> dict[str, ApprovalRow]:
        ids = list(ids)
        if not ids:
            return {}
        rows = self.conn.execute(
            f"SELECT {self._approval_columns} FROM approvals WHERE approval_id IN ({_placeholders(ids)})",
            ids,
        )
        return {r[0]: approval_from_sql(r) for r in rows}

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
        return [approval_from_sql(r) for r in rows]

    # --- views --------------------------------------------------------------------------------

    def view(self, loop_id: str, touch: Touched | None) -> LoopView | None:
        """The loop row plus the rows one receipt touches (a partial view, for the write path),
        or with `touch=None` every row of the loop (the whole projection, for an audit)."""
        loop = self.loop_row(loop_id)
        if loop is None:
            return None
        view = LoopView(loop=loop, policy=self.policy(loop.policy_digest))
        if touch is None:
            view.todos = {t.todo_id: t for t in self.all_todos(loop_id)}
            view.turns = {t.turn_id: t for t in self.loop_turns(loop_id)}
            view.approvals = {a.approval_id: a for a in self.loop_approvals(loop_id)}
        else:
            view.todos = self.todos(loop_id, touch.todos)
            view.turns = self.turns(touch.turns)
            view.approvals = self.approvals(touch.approvals)
        return view

    def full_view(self, loop_id: str) -> LoopView | None:
        return self.view(loop_id, None)

    # --- journal and Merkle log ---------------------------------------------------------------

    def _journal(self, where: str, params: tuple) -> JournalRow | None:
        r = self._one(f"SELECT {JOURNAL_COLUMNS} FROM journal WHERE {where}", params)
        return journal_from_sql(r) if r else None

    def receipt_by_id(self, receipt_id: str) -> JournalRow | None:
        return self._journal("receipt_id = ?", (receipt_id,))

    def receipt_by_seq(self, loop_id: str, seq: int) -> JournalRow | None:
        return self._journal("loop_id = ? AND seq = ?", (loop_id, seq))

    def receipt_at(self, leaf_index: int) -> JournalRow | None:
        return self._journal("leaf_index = ?", (leaf_index,))

    def loop_journal(
        self, loop_id: str, *, after_seq: int = 0, limit: int | None = None, kind: str | None = None
    ) -> list[JournalRow]:
        sql = f"SELECT {JOURNAL_COLUMNS} FROM journal WHERE loop_id = ? AND seq > ?"
        params: list[object] = [loop_id, after_seq]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [journal_from_sql(r) for r in self.conn.execute(sql, params)]

    def recent_receipts(self, loop_id: str, limit: int) -> list[JournalRow]:
        """The loop's own latest receipts: outsiders' refusals (`outsider_refusals`) left out,
        so no one outside the loop can push its activity out of view."""
        rows = self.conn.execute(
            f"SELECT {JOURNAL_COLUMNS} FROM journal WHERE loop_id = ? AND seq NOT IN "
            "(SELECT seq FROM outsider_refusals WHERE loop_id = ?) ORDER BY seq DESC LIMIT ?",
            (loop_id, loop_id, limit),
        )
        return [journal_from_sql(r) for r in rows]

    def last_outsider_refusal(self, loop_id: str, principal: str) -> OutsiderRefusal | None:
        r = self._one(
            "SELECT seq, at, suppressed FROM outsider_refusals WHERE loop_id = ? AND principal = ? "
            "ORDER BY seq DESC LIMIT 1",
            (loop_id, principal),
        )
        return OutsiderRefusal(*r) if r else None

    def outsider_refusals(self, loop_id: str) -> tuple[int, int]:
        """(refusals of outsiders sealed in the loop's journal, refusals answered but not sealed)."""
        r = self._one(
            "SELECT count(*), CAST(coalesce(sum(suppressed), 0) AS BIGINT) FROM outsider_refusals "
            "WHERE loop_id = ?",
            (loop_id,),
        )
        return (r[0], r[1]) if r else (0, 0)

    def iter_journal(self, batch: int = 2048) -> Iterator[JournalRow]:
        """Every receipt in leaf order, streamed in batches."""
        after = -1
        while True:
            rows = self.conn.execute(
                f"SELECT {JOURNAL_COLUMNS} FROM journal WHERE leaf_index > ? ORDER BY leaf_index LIMIT ?",
                (after, batch),
            ).fetchall()
            if not rows:
                return
            for r in rows:
                yield journal_from_sql(r)
            after = rows[-1][0]

    def journal_count(self) -> int:
        r = self._one("SELECT count(*) FROM journal")
        return r[0] if r else 0

    def log_state(self) -> tuple[int, list[bytes]]:
        r = self._one("SELECT size, frontier FROM log_state WHERE id = 1")
        if r is None:
            return 0, []
        frontier = bytes(r[1])
        return r[0], [frontier[i : i + 32] for i in range(0, len(frontier), 32)]

    def node(self, level: int, index: int) -> bytes:
        r = self._one("SELECT hash FROM merkle_nodes WHERE level = ? AND idx = ?", (level, index))
        if r is None:
            raise LookupError(f"Merkle node ({level}, {index}) is not stored")
        return bytes(r[0])

    def checkpoints(self) -> list[CheckpointRow]:
        rows = self.conn.execute(
            "SELECT size, root, note, key_id, signed_at FROM checkpoints ORDER BY size"
        )
        return [CheckpointRow(r[0], bytes(r[1]), r[2], r[3], r[4]) for r in rows]

    def latest_checkpoint(self) -> CheckpointRow | None:
        r = self._one(
            "SELECT size, root, note, key_id, signed_at FROM checkpoints ORDER BY size DESC LIMIT 1"
        )
        return CheckpointRow(r[0], bytes(r[1]), r[2], r[3], r[4]) if r else None

    def meta(self, key: str) -> str | None:
        r = self._one("SELECT value FROM meta WHERE key = ?", (key,))
        return r[0] if r else None

    # --- idempotency, tokens, keys ------------------------------------------------------------

    def idempotency(self, principal: str, key: str) -> tuple[str, str, str] | None:
        """(operation, request digest, response JSON) recorded for this principal and key."""
        r = self._one(
            "SELECT operation, request_digest, response FROM idempotency WHERE principal = ? AND key = ?",
            (principal, key),
        )
        if r is None:
            return None
        return (r[0], r[1], unpack_response(r[2]))

    def token(self, token_hash: str) -> TokenRow | None:
        r = self._one(
            f"SELECT {self._token_columns} FROM tokens WHERE token_hash = ?", (token_hash,)
        )
        return TokenRow(*r) if r else None

    def tokens(self) -> list[TokenRow]:
        rows = self.conn.execute(
            f"SELECT {self._token_columns} FROM tokens ORDER BY created_at, token_id"
        )
        return [TokenRow(*r) for r in rows]
