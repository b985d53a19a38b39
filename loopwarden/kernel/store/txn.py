"""A write transaction: seal receipts, fold them, and keep every row's proof current.

`Txn.append` seals one receipt, chains it to the loop's previous one, leaves it pending
integration and folds it into the projection rows it touches; `Txn.integrate` gives pending
receipts their Merkle leaves, in ticket order (in the same transaction on SQLite, after it on
PostgreSQL: `integrator.py`). Reads go through the guard
(`guard.py`), so the rows a receipt is folded into are proved first; after the fold, the rows it
changed are written back with their new leaves in the loop's state tree, and the loop row with
the new root under its MAC. Everything runs inside the store's one write transaction: it
commits whole or not at all.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol, TypedDict, Unpack

from loopwarden.canonical import canonical_bytes
from loopwarden.clock import parse_time
from loopwarden.errors import Conflict, NotFound
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.checkpoints import sign_checkpoint
from loopwarden.kernel.log.integrity import (
    LOG_MAC,
    RECORD_MAC,
    TOKEN_MAC,
    Integrity,
)
from loopwarden.kernel.log.keys import Signer
from loopwarden.kernel.log.seals import Sealed, seal
from loopwarden.kernel.sql.dialect import Connection
from loopwarden.kernel.sql.records import (
    CheckpointRow,
    IdempotencyRecord,
    LogState,
    OutsiderRefusal,
    PendingRow,
    TokenRow,
)
from loopwarden.kernel.sql.schema import (
    CHECKPOINTS,
    IDEMPOTENCY,
    MERKLE_NODES,
    OUTSIDER_REFUSALS,
    PENDING,
    POLICIES,
    TOKENS,
)
from loopwarden.kernel.state import charges as pool_state
from loopwarden.kernel.state.charges import chain_of, drawn, pool_of
from loopwarden.kernel.state.events import CarriesPolicy, Fact, ReceiptBody, ReceiptKind
from loopwarden.kernel.state.registry import Kinds
from loopwarden.kernel.state.rows import LoopView, PoolRow
from loopwarden.kernel.state.rows import replace as with_fields
from loopwarden.kernel.store.cosigns import WitnessRecords
from loopwarden.kernel.store.cursors import ExportCursors
from loopwarden.kernel.store.guard import ProvedRows
from loopwarden.kernel.store.reader import PolicyCache, Reader
from loopwarden.kernel.store.written import Written
from loopwarden.policy.decision import Decision
from loopwarden.principals import Principal


class Refs(TypedDict, total=False):
    """What a receipt names besides its loop (each absent or None if it names none): the turn,
    todo and approval it is about, and the idempotency key of the call that made it."""

    turn_id: str | None
    todo_id: str | None
    approval_id: str | None
    idempotency_key: str | None


class Sealer(Protocol):
    """What a transaction needs of its store besides the connection (the `Store` is one)."""

    origin: str
    checkpoint_every: int
    kinds: Kinds

    def signer_at(self, at: datetime) -> Signer: ...


_SEALED = PENDING.names[1:]
"""A pending receipt's columns but its ticket, which the database gives it."""
_INTEGRATE = (
    f"INSERT INTO journal (leaf_index, {', '.join(_SEALED[:-1])}) "
    f"SELECT ?, {', '.join(_SEALED[:-1])} FROM pending WHERE ticket = ?"
)


@dataclass(frozen=True)
class _Durable:
    """A receipt made durable by its transaction: its envelope as sealed, and its body."""

    sealed: Sealed
    body: ReceiptBody

    @property
    def receipt_id(self) -> str:
        return self.sealed.receipt_id


@dataclass(frozen=True)
class PoolAppended(_Durable):
    """A pool's receipt made durable by its transaction, and the pool's row after it."""

    pool: PoolRow


@dataclass(frozen=True)
class Appended(_Durable):
    """A receipt made durable by its transaction: identity, position, and the folded view."""

    view: LoopView

    @property
    def seq(self) -> int:
        return self.body.seq


class Txn:
    """An open write transaction, made of parts it holds rather than inherits: the rows it acts
    on (`rows`, every one proved, `guard.py`), the reader nothing vouches for (`unproved`, named
    so that a write that decides on an unproved row shows in the code), the export sinks'
    cursors (`cursors`, `cursors.py`), the witnesses' cosignatures and state (`witnesses`,
    `cosigns.py`), and its writes: receipts sealed and folded, the Merkle
    log, checkpoints and operational records. Reads see everything appended so far."""

    def __init__(
        self,
        conn: Connection,
        policies: PolicyCache,
        integrity: Integrity,
        store: Sealer,
        clock: Callable[[], datetime],
        *,
        wait: bool = True,
        written: Written | None = None,
    ) -> None:
        self.conn = conn
        self.dialect = conn.dialect
        self.integrity = integrity
        self.rows = ProvedRows(conn, policies, integrity, wait=wait, written=written)
        self.unproved = Reader(conn, policies)
        self.cursors = ExportCursors(conn, self.rows.lock_clause, lambda: self.now)
        self.witnesses = WitnessRecords(conn, lambda: self.now)
        self._store = store
        self._clock = clock
        self._now: datetime | None = None
        self.sealed_kinds: list[ReceiptKind] = []  # what it sealed, in order (observers)

    # --- the transaction's time ---------------------------------------------------------------

    @property
    def now(self) -> datetime:
        """The transaction's instant: the clock read when first asked for, so that a body that
        locks its loop's row first (every scoped operation does: `runner._write`) reads it
        after the last holder of that row committed. Its receipts' times then never run behind
        the loop's, and a lease granted from it is the one the judge recomputes from the
        receipt's time."""
        if self._now is None:
            self._now = self._clock()
        return self._now

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
        **refs: Unpack[Refs],
    ) -> Appended:
        """Seal one receipt and apply it: its place in its loop's chain (pending its Merkle
        leaf), projection rows.

        `policy_digest` is required for a receipt that carries a policy (`loop.opened`, an
        operator's `loop.policy_changed`: that policy's digest) and otherwise taken from the
        loop; `refs`
        are what else the receipt names. A receipt's time never goes back within its loop
        (another process's clock may lag: then it takes the loop's last time). Raises
        `SealError` if the receipt cannot be sealed, `FoldError` if it does not fit the loop's
        state and `IntegrityError` if a row it reads fails its proof; the caller's transaction
        then rolls back whole.
        """
        loop = self.rows.loop_row(loop_id)
        at = self.now
        if kind == ReceiptKind.LOOP_OPENED:
            if loop is not None:
                raise Conflict(f"loop {loop_id!r} already exists")
            seq, prev = 1, None
        else:
            if loop is None:
                raise NotFound(f"loop {loop_id!r} does not exist")
            seq, prev = loop.head_seq + 1, loop.head_digest
            if not isinstance(data, CarriesPolicy):
                policy_digest = loop.policy_digest
            at = max(at, loop.updated_at)
        body, sealed = self._seal(
            loop_id, kind, seq, prev, at, principal, data,
            decision=decision, policy_digest=policy_digest, **refs,
        )  # fmt: skip
        if isinstance(body.data, CarriesPolicy):
            self.conn.execute(
                self.dialect.insert_new(POLICIES),
                (policy_digest, canonical_bytes(body.data.policy).decode()),
            )
        appended = Appended(sealed, body, self._fold(body, sealed.digest))
        self.sealed_kinds.append(kind)
        return appended

    def _seal(
        self,
        chain: str,
        kind: ReceiptKind,
        seq: int,
        prev: str | None,
        at: datetime,
        principal: Principal,
        data: Fact,
        *,
        decision: Decision | None,
        policy_digest: str | None,
        **refs: Unpack[Refs],
    ) -> tuple[ReceiptBody, Sealed]:
        """Make, sign and keep one receipt of `chain` (a loop, or a pool's `pool:<name>`),
        pending its Merkle leaf."""
        body = self._store.kinds.make_body(
            kind,
            loop_id=chain,
            seq=seq,
            at=at,
            principal={"id": principal.id, "role": principal.role},
            decision=(decision or Decision("allow")).as_dict(),
            policy_digest=policy_digest,
            data=data,
            prev=prev,
            **refs,
        )
        sealed = seal(body.as_json(), self._store.signer_at(at))
        # The pools' rows before the ticket: of two writes to a pool, the later's tickets then
        # come after the earlier's, so the tree replays pools in the order they were decided
        # (integrator.py). Writes to other pools do not wait.
        self.rows.hold(self._pools_touched(body))
        pending = PendingRow(
            body.loop_id, body.seq, body.kind, sealed.receipt_id, sealed.digest, body.at,
            body.turn_id, sealed.envelope, ticket=None, leaf_hash=merkle.leaf_hash(sealed.envelope),
        )  # fmt: skip
        self.conn.execute(self.dialect.insert(PENDING, _SEALED), PENDING.encode(pending)[1:])
        return body, sealed

    def _pools_touched(self, body: ReceiptBody) -> list[str]:
        """The pools `body` may charge or change: its own pool's (a pool's receipt), or those
        the turns it touches were admitted under and those its loop draws from for its
        principal."""
        name = pool_of(body.loop_id)
        if name is not None:
            return [name]
        view = (
            self.rows.view(body.loop_id, self._store.kinds.touched(body))
            if self.rows.pools()
            else None
        )
        if view is None:
            return []
        names = set(drawn(self.rows.pools(), view.policy, body.principal.id))
        for turn in view.turns.values():
            names.update(turn.pools if turn is not None and turn.pools else ())
        return sorted(names)

    def append_pool(
        self,
        name: str,
        kind: ReceiptKind,
        principal: Principal,
        data: Fact,
        policy_digest: str,
        *,
        decision: Decision | None = None,
    ) -> PoolAppended:
        """Seal one receipt of a budget pool's chain and fold it into the pool's row (a new
        pool for its first `pool.defined`). `FoldError` if it does not fit the pool's state."""
        self.rows.hold([name])
        row = self.rows.pools().get(name)
        seq, prev, at = 1, None, self.now
        if row is not None:
            seq, prev, at = row.head_seq + 1, row.head_digest, max(self.now, row.updated_at)
        body, sealed = self._seal(
            chain_of(name), kind, seq, prev, at, principal, data,
            decision=decision, policy_digest=policy_digest,
        )  # fmt: skip
        step = self._store.kinds[kind].pool
        if step is None:
            raise TypeError(f"{kind} is not a pool's kind")
        row = step.fold(row, body, sealed.digest)
        self.rows.put_pool(row)
        self.sealed_kinds.append(kind)
        return PoolAppended(sealed, body, row)

    # --- the Merkle log -----------------------------------------------------------------------

    def integrate(
        self, limit: int | None = None, *, held: Callable[[], bool] | None = None
    ) -> list[datetime] | None:
        """Give up to `limit` pending receipts (all, by default) the next Merkle leaves, in
        ticket order, and sign a checkpoint at every `checkpoint_every` leaves; returns their
        times (`at`, in leaf order). The caller holds the log's row (SQLite's write lock, or the
        integrator's lock on PostgreSQL), so the leaves it gives are the next ones and no one
        else gives them.

        `held`: the caller has asked for the log's row without waiting and not yet read the
        answer; this asks for the pending receipts and the log's state behind it (in a
        pipeline, one round trip answers all three), then `held()` says whether the row was
        granted. If not, nothing is written and None is returned. The reads ran after the lock
        in the same transaction, so when it was granted they saw the log as its holder."""
        sql = "SELECT ticket, leaf_hash, at FROM pending ORDER BY ticket"
        # The cursor is closed whatever happens (a damaged log raises before it is read), so
        # that no statement is left open on SQLite's connection.
        with closing(self.conn.execute(sql + (f" LIMIT {int(limit)}" if limit else ""))) as pending:
            if held is not None:
                self.rows.log_state(asked=True)  # its answer comes with the lock's: one round trip
                if not held():
                    return None
            rows = pending.fetchall()
        if not rows:
            return []
        size, frontier = self.rows.log_state()  # as read above, for the integrator's batch
        nodes: list[tuple[int, int, bytes]] = []
        every = self._store.checkpoint_every
        for index, (_, leaf, _) in enumerate(rows, start=size):
            frontier, made = merkle.append_leaf(frontier, index, bytes(leaf))
            nodes.extend(made)
            if every and (index + 1) % every == 0:
                self._write_checkpoint(index + 1, merkle.root_from_frontier(frontier))
        tickets = [(ticket,) for ticket, _, _ in rows]
        self.conn.executemany(_INTEGRATE, [(size + i, t) for i, (t,) in enumerate(tickets)])
        self.conn.executemany("DELETE FROM pending WHERE ticket = ?", tickets)
        self.conn.executemany(self.dialect.insert(MERKLE_NODES), nodes)
        self._set_log(size + len(rows), frontier)
        return [parse_time(at) for _, _, at in rows]

    def _set_log(self, size: int, frontier: list[bytes]) -> None:
        joined = b"".join(frontier)
        mac = self.integrity.mac(LOG_MAC, [size, joined.hex()])
        self.conn.execute(
            "UPDATE log_state SET size = ?, frontier = ?, mac = ? WHERE id = 1", (size, joined, mac)
        )
        self.rows.wrote_log(size, joined, mac, LogState(size, frontier))

    def _fold(self, body: ReceiptBody, digest: str) -> LoopView:
        kinds = self._store.kinds
        touch = kinds.touched(body)
        before = self.rows.view(body.loop_id, touch)
        prior = pool_state.before(before, touch.turns) if self.rows.pools() else None
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
        after = kinds.apply(before, body, digest)
        self.rows.save(after, old)
        if prior is not None:  # what it added to the loop, charged to the pools it draws from
            pool_state.charge(self.rows, pool_state.charges(prior, after, body, self.rows), body.at)
        return after

    # --- checkpoints --------------------------------------------------------------------------

    def _write_checkpoint(self, size: int, root: bytes) -> str:
        store = self._store
        signer = store.signer_at(self.now)
        note = sign_checkpoint(store.origin, size, root, signer)
        checkpoint = CheckpointRow(size, root, note, signer.key_id, self.now)
        self.conn.execute(self.dialect.insert_new(CHECKPOINTS), CHECKPOINTS.encode(checkpoint))
        return note

    def checkpoint(self) -> int:
        """Sign a checkpoint of the current tree unless one exists for this size; returns the size."""
        size, frontier = self.rows.log_state()
        latest = self.unproved.latest_checkpoint()
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
        record = IdempotencyRecord(principal, key, operation, request_digest, text, self.now)
        record = with_fields(record, mac=self.integrity.mac(RECORD_MAC, record.mac_values()))
        self.conn.execute(self.dialect.insert(IDEMPOTENCY), IDEMPOTENCY.encode(record))

    def add_token(
        self,
        token_hash: str,
        token_id: str,
        agent: str,
        role: str,
        expires_at: datetime | None = None,
        loop_id: str | None = None,
    ) -> None:
        token = TokenRow(
            token_hash, token_id, agent, role, self.now, None, expires_at, loop_id=loop_id
        )
        token = with_fields(token, mac=self.integrity.mac(TOKEN_MAC, token.mac_values()))
        self.conn.execute(self.dialect.insert(TOKENS), TOKENS.encode(token))

    def revoke_token(self, token_id: str) -> bool:
        token = next(
            (t for t in self.unproved.tokens() if t.token_id == token_id and t.revoked_at is None),
            None,
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
        """Mark receipt `seq` as a refusal sealed for an outsider (see kernel/runner/outsiders.py)."""
        refusal = OutsiderRefusal(loop_id, seq, principal, self.now, suppressed=0)
        self.conn.execute(self.dialect.insert(OUTSIDER_REFUSALS), OUTSIDER_REFUSALS.encode(refusal))

    def count_suppressed_refusal(self, loop_id: str, seq: int) -> None:
        """Count one more refusal answered, not sealed, after the outsider's receipt `seq`."""
        self.conn.execute(
            "UPDATE outsider_refusals SET suppressed = suppressed + 1 WHERE loop_id = ? AND seq = ?",
            (loop_id, seq),
        )
