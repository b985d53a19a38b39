"""The guard: the reads a write acts on, each checked against what vouches for it.

A write transaction (`Txn`) holds its rows as `ProvedRows`: every row it returns is proved, or
the write is refused with `IntegrityError` before anything is sealed. It is no `Reader`: a read a
write decides on goes through here or, where a write truly needs one that nothing vouches for
(a listing, a hint), through the transaction's explicitly named `unproved` reader, so an
unproved read in a write shows in the code (`tests/test_row_proofs.py` holds every reading
method here to return proved rows):

- a loop row by its MAC (over every column and its state-tree root) and by the journal's head
  for the loop (so an older row, MAC and all, cannot come back);
- a todo, turn or approval row by its path to that loop's root (`state.py`): an edited,
  swapped or rolled-back row is a leaf the root does not hold;
- sets the write decides on by what the loop row commits to: its open turns are the ids the
  loop row lists (each row then proved), the turns claimed in a rate window are found by claim
  number between proved rows, a todo's dependencies are proved rows, and all of a loop's todos
  are as many proved rows as its row counts;
- any other set (a loop's approvals of a turn, its turns of a status) is found by a query and
  each row it names proved;
- the Merkle frontier by its MAC and by the journal's last leaf; idempotency records by MAC;
  a policy document by re-hashing it against its digest (every reader does that).

What it cannot see is stated in docs/reliability.md: a row deleted outright reads as "no such
row" (the audit reports it), and which open todo comes first is the database's answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from operator import attrgetter
from typing import Any

from loopwarden.errors import IntegrityError
from loopwarden.kernel.log.integrity import (
    LOG_MAC,
    LOOP_MAC,
    POOL_MAC,
    POOL_USAGE_MAC,
    RECORD_MAC,
    Integrity,
)
from loopwarden.kernel.sql.dialect import Connection
from loopwarden.kernel.sql.records import IdempotencyRecord, LogState
from loopwarden.kernel.sql.schema import LOOPS, POOL_USAGE, POOLS, ROW_TABLES, STATE_NODES
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
from loopwarden.kernel.store import statetree as state
from loopwarden.kernel.store.reader import PolicyCache, Reader, Row, frontier_of, loop_view
from loopwarden.kernel.store.written import Written
from loopwarden.policy.budgets import Totals
from loopwarden.policy.model import LoopPolicy
from loopwarden.statuses import ApprovalStatus, TodoStatus, TurnStatus

_HEAD = (
    "(SELECT max(seq) FROM pending WHERE loop_id = ?), "
    "(SELECT digest FROM pending WHERE loop_id = ? ORDER BY seq DESC LIMIT 1), "
    "(SELECT max(seq) FROM journal WHERE loop_id = ?), "
    "(SELECT digest FROM journal WHERE loop_id = ? ORDER BY seq DESC LIMIT 1)"
)
"""A chain's last receipt: pending if it has any (they come after its integrated ones), else in
the journal."""

POOL_CATALOG = "SELECT 1 FROM meta WHERE key = 'schema_version'"
"""The pool catalog's lock (a row every store has): a write that reads the pools holds it
shared, one that creates or changes a pool holds it alone. Lock order: a loop's row, then the
catalog, then pool rows by name."""


_LOOP_WRITE = (*(c.name for c in LOOPS.row_columns), "state_root", "mac")
"""A loop row's upsert: its stored values, then its proofs."""
_POOL_WRITE = (*(c.name for c in POOLS.row_columns), "mac")
_USAGE_WRITE = (*(c.name for c in POOL_USAGE.row_columns), "mac")


def loop_mac_values(loop: LoopRow, root: bytes) -> list[object]:
    """What a loop row's MAC covers: its stored values, then its state tree's root."""
    return [*LOOPS.mac_values(LOOPS.encode(loop)), root.hex()]


RowKey = tuple[str, str] | str
"""A row's key in a transaction's rows: its table's key ((loop id, todo id) for a todo, whose
id is per loop; a turn's or an approval's id)."""
_KEY = {name: attrgetter(*table.key) for name, table in ROW_TABLES.items()}
_ID = {name: attrgetter(table.key[-1]) for name, table in ROW_TABLES.items()}
"""A row's id among its loop's rows (what `Reader.todos`/`turns`/`approvals` key by)."""
_PER_LOOP = {name: len(table.key) == 2 for name, table in ROW_TABLES.items()}
"""Tables whose rows are keyed by loop and id (their ids are per loop)."""


def row_leaf(table: str, row: TodoRow | TurnRow | ApprovalRow) -> bytes:
    """The leaf of a loop's row in its state tree: its table and its stored values."""
    described = ROW_TABLES[table]
    return state.leaf(table, described.mac_values(described.encode(row)))


class ProvedRows:
    """The rows a write acts on, each proved (see the module docstring), and written back with
    their proofs (`save`). One per write transaction: it caches what it proved and wrote."""

    def __init__(
        self,
        conn: Connection,
        policies: PolicyCache,
        integrity: Integrity,
        *,
        wait: bool = True,
        written: Written | None = None,
    ) -> None:
        self.conn = conn
        # What this process wrote last (its store's, across transactions): a stored row equal
        # to it is not decoded and MAC-checked again (`written.py`); None: always prove.
        self._written = written
        self.dialect = conn.dialect
        self._raw = Reader(conn, policies)  # the queries; every row they return is proved here
        self.integrity = integrity
        # How this transaction body takes the row locks it decides on (where the backend locks
        # rows, PostgreSQL): waiting for them, or failing at once (`Backend.contended`) when
        # another transaction holds one. Only the first body of a group commit waits, so two
        # groups never wait for each other (see `Store._commit_group`).
        self._lock = self.dialect.lock(wait=wait)
        self.lock_clause = self._lock  # what a read appends to take its row (empty on SQLite)
        self._share = self.dialect.lock(wait=wait, shared=True)
        # Rows this transaction has read or written; only it can change them (it holds the
        # write lock), so repeated reads are served from here.
        self._loops: dict[str, LoopRow | None] = {}
        self._trees: dict[str, state.StateTree] = {}
        self._log: LogState | None = None
        # Todo, turn and approval rows read (proved) or written, by table and `RowKey`; None for
        # a row that does not exist.
        self._rows: dict[str, dict[RowKey, Any]] = {t: {} for t in ROW_TABLES}
        # The rows `_decoded` took from what this process wrote, with their leaves, by table and
        # key: from the load that found them to the `_prove` that proves them (which clears
        # them). A leaf is used for the very row object it was kept with.
        self._leaves: dict[tuple[str, RowKey], tuple[Any, bytes]] = {}
        self._pools: dict[str, PoolRow] | None = None  # every pool, once read
        self._held: set[str] = set()  # pools whose rows this transaction holds (`hold`)
        self._usage: dict[tuple[str, str], Totals] = {}  # pool windows read or written

    def carry_log(self, log: LogState | None) -> None:
        """Start from the Merkle log's state as the previous body of the same transaction left
        it (proved or written by this process, under the same write lock), instead of reading
        and proving it again. None: read it."""
        self._log = log

    @property
    def log_carried(self) -> LogState | None:
        """The log's state as this body leaves it, if it read or changed it."""
        return self._log

    # --- loops --------------------------------------------------------------------------------

    def loop_row(self, loop_id: str) -> LoopRow | None:
        if loop_id not in self._loops:
            self._loops[loop_id] = self._proved_loop(loop_id)
        return self._loops[loop_id]

    def _proved_loop(self, loop_id: str) -> LoopRow | None:
        if self._lock:  # its own statement: the next one reads what the last holder committed
            self.conn.execute(f"SELECT 1 FROM loops WHERE loop_id = ?{self._lock}", (loop_id,))
        r = self._raw._one(
            f"SELECT {LOOPS.row_names}, state_root, mac, {_HEAD} FROM loops WHERE loop_id = ?",
            (loop_id,) * 5,  # `?` each (PostgreSQL's driver has no `?1`)
        )
        if r is None:
            return None
        *values, stored_root, mac, sealed_seq, sealed_digest, head_seq, head_digest = r
        if sealed_seq is not None:  # the chain's last receipts are still pending integration
            head_seq, head_digest = sealed_seq, sealed_digest
        root = bytes(stored_root or b"")
        what = f"the stored state of loop {loop_id!r}"
        known = None
        if self._written is not None and isinstance(mac, bytes):
            known = self._written.loop(loop_id, (tuple(values), root, mac))
        if known is not None:  # the bytes this process wrote and MACed: the MAC holds
            loop, blobs = known
        else:
            loop, blobs = LOOPS.decode(values), None
            self.integrity.check(LOOP_MAC, loop_mac_values(loop, root), mac, what)
        if (head_seq, head_digest) != (loop.head_seq, loop.head_digest):
            raise IntegrityError(
                f"{what} is not the state after its last receipt (an older copy was put back, or "
                "receipts were removed); nothing was sealed. Run `loopwarden verify`."
            )
        self._trees[loop_id] = state.StateTree(loop.slots, root, self._blob_source(loop_id), blobs)
        return loop

    def _blob_source(self, loop_id: str) -> state.BlobSource:
        def blob(level: int, idx: int) -> bytes | None:
            r = self._raw._one(
                "SELECT hashes FROM state_nodes WHERE loop_id = ? AND level = ? AND idx = ?",
                (loop_id, level, idx),
            )
            return bytes(r[0]) if r else None

        return blob

    def tree(self, loop_id: str) -> state.StateTree:
        if loop_id not in self._trees and self.loop_row(loop_id) is None:
            raise IntegrityError(f"loop {loop_id!r} has rows but no stored state")
        return self._trees[loop_id]

    def _decoded(self, table: str, stored: Iterable[Row]) -> dict[str, Any]:
        """Rows by id, from their stored values: values this process wrote are the row it
        wrote (`written.py`), and their leaf is kept for `_prove`; others are decoded."""
        description, id_of, key_of, rows = ROW_TABLES[table], _ID[table], _KEY[table], {}
        for values in stored:
            kept = self._written.row(table, tuple(values)) if self._written is not None else None
            row = description.decode(values) if kept is None else kept[0]
            if kept is not None:
                self._leaves[(table, key_of(row))] = kept
            rows[id_of(row)] = row
        return rows

    def _prove(self, table: str, rows: dict[str, Any]) -> dict[str, Any]:
        """`rows` (id → row, as read from the database), each proved once per transaction: a
        row read again must equal the one proved (or written) before, and is that object (the
        fold tells the rows it changed by identity)."""
        known, key_of = self._rows[table], _KEY[table]
        try:
            for key, row in rows.items():
                row_key = key_of(row)
                held = known.get(row_key)
                if held is not None and held == row:
                    rows[key] = held
                elif held is None and self.tree(row.loop_id).holds(
                    row.slot, self._leaf(table, row)
                ):
                    known[row_key] = row
                else:
                    raise IntegrityError(
                        f"the stored {table[:-1]} {key!r} of loop {row.loop_id!r} is not the one "
                        "its receipts made (edited, swapped or rolled back outside loopwarden); "
                        "nothing was sealed. Run `loopwarden verify`."
                    )
        finally:
            self._leaves.clear()
        return rows

    def _cached(
        self,
        table: str,
        loop_id: str | None,
        ids: Iterable[str],
        load: Callable[[list[str]], dict[str, Any]],
    ) -> dict[str, Any]:
        """The rows of `ids` that exist: those this transaction has read or written already,
        and the others loaded with `load(their ids)` and proved."""
        known = self._rows[table]
        keys: dict[str, RowKey]
        if _PER_LOOP[table]:
            assert loop_id is not None, f"{table} rows are found by loop and id"
            keys = {i: (loop_id, i) for i in ids}
        else:
            keys = {i: i for i in ids}
        missing = [i for i, key in keys.items() if key not in known]
        if missing:
            if loop_id is not None:
                self.loop_row(loop_id)  # its row held (where rows are locked) before its rows read
            loaded = load(missing)
            unheld = sorted({row.loop_id for row in loaded.values()} - self._loops.keys())
            if self._lock and unheld:
                # Found by id before their loops' rows were held: another writer of those loops
                # may have committed since. Held now, the rows read again are the ones to prove.
                for other in unheld:
                    self.loop_row(other)
                loaded = load(missing)
            self._prove(table, loaded)
            for i in missing:
                known.setdefault(keys[i], None)  # no such row (until this transaction adds it)
        return {i: row for i, key in keys.items() if (row := known[key]) is not None}

    def _leaf(self, table: str, row: Any) -> bytes:
        kept = self._leaves.get((table, _KEY[table](row)))
        return kept[1] if kept is not None and kept[0] is row else row_leaf(table, row)

    def keep(self, table: str, rows: Iterable[Any]) -> None:
        """Rows this transaction has written: what its later reads return."""
        known, key_of = self._rows[table], _KEY[table]
        for row in rows:
            known[key_of(row)] = row

    # --- writing rows back with their proofs --------------------------------------------------

    def save(self, view: LoopView, old: dict[str, dict[str, Any]]) -> None:
        """Write the rows of `view` that are not in `old` (by identity), their leaves, and the
        loop row under its new root."""
        loop_id = view.loop.loop_id
        if loop_id not in self._trees:  # a new loop: nothing stored counts, its tree starts empty
            self._trees[loop_id] = state.StateTree(
                0, state.node(state.EMPTY), lambda level, idx: None
            )
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
        leaves: dict[int, bytes] = {}
        for table, rows in changed.items():
            self.keep(table, rows)
            if rows:
                description = ROW_TABLES[table]
                stored = [description.encode(row) for row in rows]  # once: its leaf and its upsert
                for row, values in zip(rows, stored, strict=True):
                    leaf = state.leaf(table, description.mac_values(values))
                    leaves[row.slot] = leaf
                    if self._written is not None:
                        self._written.put_row(table, values, row, leaf)
                self.conn.executemany(self.dialect.upsert(description), stored)
        tree.fill(leaves)
        rewritten = tree.blobs()
        self.conn.executemany(
            self.dialect.upsert(STATE_NODES),
            [(loop_id, level, idx, blob) for level, idx, blob in rewritten],
        )
        committed = tree.committed_blobs(rewritten) if self._written is not None else {}
        tree.dirty.clear()
        self._save_loop(view.loop, tree.root, committed)

    def _save_loop(self, loop: LoopRow, root: bytes, blobs: state.Blobs) -> None:
        self._loops[loop.loop_id] = loop
        values = LOOPS.encode(loop)  # once: the MAC covers the values the row stores
        mac = self.integrity.mac(LOOP_MAC, [*LOOPS.mac_values(values), root.hex()])
        self.conn.execute(self.dialect.upsert(LOOPS, _LOOP_WRITE), (*values, root, mac))
        if self._written is not None:
            self._written.put_loop((values, root, mac), loop, blobs)

    # --- rows ---------------------------------------------------------------------------------

    def todos(self, loop_id: str, ids: Iterable[str]) -> dict[str, TodoRow]:
        read, decoded = self._raw.todo_values, self._decoded
        return self._cached(
            "todos", loop_id, ids, lambda missing: decoded("todos", read(loop_id, missing))
        )

    def turns(self, ids: Iterable[str]) -> dict[str, TurnRow]:
        read, decoded = self._raw.turn_values, self._decoded
        return self._cached("turns", None, ids, lambda missing: decoded("turns", read(missing)))

    def approvals(self, ids: Iterable[str]) -> dict[str, ApprovalRow]:
        read, decoded = self._raw.approval_values, self._decoded
        return self._cached(
            "approvals", None, ids, lambda missing: decoded("approvals", read(missing))
        )

    def open_turns(self, loop_id: str) -> list[TurnRow]:
        """The loop's open turns: exactly the ids its loop row lists, each row proved."""
        loop = self.loop_row(loop_id)
        if loop is None:
            return []
        found = self.turns(loop.open_turns)
        if set(found) != set(loop.open_turns) or any(
            t.status != TurnStatus.OPEN for t in found.values()
        ):
            raise IntegrityError(
                f"the open turns of loop {loop_id!r} were changed outside loopwarden"
            )
        return [found[turn_id] for turn_id in loop.open_turns]

    def loop_turns(self, loop_id: str, status: TurnStatus | None = None) -> list[TurnRow]:
        """The loop's turns (of `status`), in claim order: the open ones those its row lists,
        any other found by a query and each proved."""
        if status == TurnStatus.OPEN:
            return self.open_turns(loop_id)
        found = self.turns(t.turn_id for t in self._raw.loop_turns(loop_id, status))
        return sorted(found.values(), key=lambda t: (t.claimed_at, t.turn_id))

    def expired_turns(self, loop_id: str, now: datetime) -> list[TurnRow]:
        stale = [t for t in self.open_turns(loop_id) if t.lease_expires_at < now]
        return sorted(stale, key=lambda t: (t.lease_expires_at, t.turn_id))

    def count_open_turns(
        self, loop_id: str, agent: str | None = None, *, live_at: datetime | None = None
    ) -> int:
        return sum(
            1
            for t in self.open_turns(loop_id)
            if (agent is None or t.agent == agent)
            and (live_at is None or t.lease_expires_at >= live_at)
        )

    def claims_since(self, loop_id: str, since: datetime) -> int:
        """Turns claimed after `since`: claims are numbered in time order, so the first claim in
        the window is found by binary search over proved rows."""
        loop = self.loop_row(loop_id)
        total = loop.totals.turns if loop is not None else 0
        low, high = 1, total + 1  # the first number claimed after `since` is in [low, high]
        while low < high:
            middle = (low + high) // 2
            if self._turn_number(loop_id, middle).claimed_at > since:
                high = middle
            else:
                low = middle + 1
        return total + 1 - low

    def _turn_number(self, loop_id: str, number: int) -> TurnRow:
        ids = self.conn.execute(
            "SELECT turn_id FROM turns WHERE loop_id = ? AND number = ?", (loop_id, number)
        ).fetchall()
        found = self.turns([r[0] for r in ids])
        if len(found) != 1:
            raise IntegrityError(f"claim {number} of loop {loop_id!r} is missing or doubled")
        return next(iter(found.values()))

    def todo(self, loop_id: str, todo_id: str) -> TodoRow | None:
        return self.todos(loop_id, [todo_id]).get(todo_id)

    def turn(self, turn_id: str) -> TurnRow | None:
        return self.turns([turn_id]).get(turn_id)

    def approval(self, approval_id: str) -> ApprovalRow | None:
        return self.approvals([approval_id]).get(approval_id)

    def all_todos(self, loop_id: str) -> list[TodoRow]:
        """Every todo of the loop in claim order, each proved, and as many as its row counts
        (a row added or removed outside loopwarden is `IntegrityError`)."""
        loop = self.loop_row(loop_id)
        if loop is None:
            return []
        ids = [r[0] for r in self.conn.execute("SELECT todo_id FROM todos WHERE loop_id = ?",
                                                (loop_id,))]  # fmt: skip
        found = self.todos(loop_id, ids)
        if len(found) != sum(loop.todo_counts):
            raise IntegrityError(
                f"loop {loop_id!r} holds {len(found)} todos where its receipts made "
                f"{sum(loop.todo_counts)}: changed outside loopwarden; nothing was sealed. Run "
                "`loopwarden verify`."
            )
        return sorted(found.values(), key=lambda t: (t.ord, t.todo_id))

    def max_todo_order(self, loop_id: str) -> int:
        """The largest claim order among the loop's todos (0 for none), read from the proved
        todo that holds it."""
        r = self._raw._one(
            "SELECT todo_id FROM todos WHERE loop_id = ? ORDER BY ord DESC, todo_id DESC LIMIT 1",
            (loop_id,),
        )
        last = self.todo(loop_id, r[0]) if r else None
        return last.ord if last is not None else 0

    def approved_for_turn(self, loop_id: str, turn_id: str) -> dict[str, ApprovalRow]:
        """The approved approvals requested in `turn_id` (expired or not), each proved."""
        return self.approvals(self._raw.approved_for_turn(loop_id, turn_id))

    def loop_approvals(
        self, loop_id: str, status: ApprovalStatus | None = None
    ) -> list[ApprovalRow]:
        """The loop's approvals (of `status`) in request order, each proved."""
        found = self.approvals(a.approval_id for a in self._raw.loop_approvals(loop_id, status))
        return sorted(found.values(), key=lambda a: (a.requested_at, a.approval_id))

    def policy(self, digest: str) -> LoopPolicy:
        """The policy with this digest, re-hashed against it (every reader proves a policy
        so, `Reader.policy`)."""
        return self._raw.policy(digest)

    def view(self, loop_id: str, touch: Touched | None) -> LoopView | None:
        """The loop row plus the proved rows one receipt touches (a partial view), or with
        `touch=None` every row of the loop."""
        return loop_view(self, loop_id, touch)

    def loops_with_expired_turns_in(self, pool: str, now: datetime) -> list[str]:
        """The loops that may hold an expired turn admitted under `pool`: candidates by id
        (each is swept through its proved rows, which decide)."""
        return self._raw.loops_with_expired_turns_in(pool, now)

    def dependencies_done(self, loop_id: str, todo: TodoRow) -> bool:
        deps = self.todos(loop_id, todo.depends_on)
        return len(deps) == len(set(todo.depends_on)) and all(
            d.status == TodoStatus.DONE for d in deps.values()
        )

    def next_eligible_todo(self, loop_id: str) -> TodoRow | None:
        self.loop_row(loop_id)  # the loop's row held first (row locks): its todos stand still
        todo = self._raw.next_eligible_todo(loop_id)
        if todo is None:
            return None
        todo = self._prove("todos", {todo.todo_id: todo})[todo.todo_id]
        assert isinstance(todo, TodoRow)
        if todo.status != TodoStatus.OPEN or not self.dependencies_done(loop_id, todo):
            raise IntegrityError(f"the todos of loop {loop_id!r} were changed outside loopwarden")
        return todo

    # --- the Merkle log and idempotency records -----------------------------------------------

    def log_state(self, *, asked: bool = False) -> LogState:
        """The Merkle log's size and frontier, proved (MAC, and the journal ends at its last
        leaf). Reading it takes its row (the integrator's), unless the caller `asked` for the
        row already in this transaction."""
        if self._log is None:
            if self._lock and not asked:  # the integrator's row: a write that reads it takes it
                self.conn.execute(f"SELECT 1 FROM log_state WHERE id = 1{self._lock}")
            r = self._raw._one(
                "SELECT size, frontier, mac, (SELECT max(leaf_index) FROM journal) "
                "FROM log_state WHERE id = 1"
            )
            size, frontier, mac, last = (
                (r[0], bytes(r[1]), r[2], r[3]) if r else (0, b"", None, None)
            )
            known = None
            if self._written is not None and isinstance(mac, bytes):
                known = self._written.log((size, frontier, mac))
            if known is None:
                self.integrity.check(LOG_MAC, [size, frontier.hex()], mac, "the stored Merkle log")
            if (last if last is not None else -1) != size - 1:
                raise IntegrityError(
                    "the stored Merkle log does not end at the journal's last receipt"
                )
            self._log = known or LogState(size, frontier_of(frontier))
        return self._log

    def wrote_log(self, size: int, joined: bytes, mac: bytes, log: LogState) -> None:
        """The log's state as this transaction wrote it (with `joined` frontier and `mac`)."""
        self._log = log
        if self._written is not None:
            self._written.put_log((size, joined, mac), log)

    # --- budget pools (the write path's `PoolBook`, with `Txn`'s writes) ----------------------

    def pools(self) -> dict[str, PoolRow]:
        """Every pool, each proved by its MAC and by its chain's last receipt in the journal.

        What defines the pools (which exist, their policies, the agents they bind) stays as
        read for the rest of the transaction: the pool catalog's lock is taken, shared, first
        (`POOL_CATALOG`). What a write decides on or charges (a pool's open turns, its
        windows' usage) is its own only once it holds the pool's row (`hold`)."""
        if self._pools is None:
            if self._lock:
                self.conn.execute(POOL_CATALOG + self._share)
            self._pools = self._proved_pools()
        return self._pools

    def own_pool_catalog(self) -> None:
        """Take the pool catalog's lock alone, before a pool is created or changed: every
        write that read the pools has ended, and none reads them until this one ends."""
        if self._lock:
            self.conn.execute(POOL_CATALOG + self._lock)
            self._pools = None  # read again under the lock

    def hold(self, names: Iterable[str]) -> None:
        """Lock the rows of the pools `names` (in name order) and read them again: a write
        holds every pool it decides on or charges before it draws its ticket, so two writes to
        one pool take turns and are integrated in that order, and writes to other pools do
        not wait for it."""
        if not self._lock:
            return
        pools = self.pools()
        wanted = sorted(set(names) - self._held)
        for name in wanted:
            self.conn.execute(f"SELECT 1 FROM pools WHERE name = ?{self._lock}", (name,))
        if wanted:
            self._held.update(wanted)
            pools.update(self._proved_pools(wanted))
            for key in [key for key in self._usage if key[0] in wanted]:
                del self._usage[key]  # read before the row was held

    def _proved_pools(self, names: list[str] | None = None) -> dict[str, PoolRow]:
        where = "" if names is None else f" WHERE name IN ({', '.join('?' * len(names))})"
        rows = self.conn.execute(
            f"SELECT {POOLS.row_names}, mac, coalesce("
            "(SELECT max(seq) FROM pending WHERE loop_id = 'pool:' || name), "
            "(SELECT max(seq) FROM journal WHERE loop_id = 'pool:' || name)) "
            f"FROM pools{where} ORDER BY name",
            tuple(names or ()),
        )
        proved = {}
        for *values, mac, head_seq in rows:
            pool = POOLS.decode(values)
            what = f"the stored state of pool {pool.name!r}"
            self.integrity.check(POOL_MAC, values, mac, what)  # the stored values, as MACed
            if head_seq != pool.head_seq:
                raise IntegrityError(f"{what} is not the state after its last receipt")
            proved[pool.name] = pool
        return proved

    def usage(self, pool: str, window_start: str) -> Totals:
        """What one window of `pool` used, proved by its MAC (zero for a window not begun)."""
        key = (pool, window_start)
        if key not in self._usage:
            r = self._raw._one(
                f"SELECT {POOL_USAGE.row_names}, mac FROM pool_usage "
                "WHERE pool = ? AND window_start = ?",
                key,
            )
            totals = Totals()
            if r is not None:
                *values, mac = r
                what = f"the stored usage of pool {pool!r}"
                self.integrity.check(POOL_USAGE_MAC, POOL_USAGE.mac_values(values), mac, what)
                totals = POOL_USAGE.decode(values).totals
            self._usage[key] = totals
        return self._usage[key]

    def put_pool(self, row: PoolRow) -> None:
        """Write a pool's row under its MAC."""
        values = POOLS.encode(row)
        mac = self.integrity.mac(POOL_MAC, list(values))
        self.conn.execute(self.dialect.upsert(POOLS, _POOL_WRITE), (*values, mac))
        self.pools()[row.name] = row

    def put_usage(self, usage: PoolUsage) -> None:
        """Write what one window of a pool used, under its MAC."""
        values = POOL_USAGE.encode(usage)
        mac = self.integrity.mac(POOL_USAGE_MAC, POOL_USAGE.mac_values(values))
        self.conn.execute(self.dialect.upsert(POOL_USAGE, _USAGE_WRITE), (*values, mac))
        self._usage[(usage.pool, usage.window_start)] = usage.totals

    def idempotency(self, principal: str, key: str) -> IdempotencyRecord | None:
        record = self._raw.idempotency(principal, key)
        if record is not None:
            what = "an idempotency record"
            self.integrity.check(RECORD_MAC, record.mac_values(), record.mac, what)
        return record
