"""How a store comes to the current schema: a new one is made from the table descriptions
(`schema.py`) at `SCHEMA_VERSION`; an older one is upgraded one version at a time by the steps
each version added, which are never edited (every upgraded store must end where a new one
begins; the test of the live schemas holds both to the descriptions).

Versions 2 to 5 are older than every backend but SQLite (a PostgreSQL store began at version 5,
made whole), so they are SQLite's statements (`SQLITE_UPGRADES`, the SQLite backend's
`history`). From version 6 on, a version is written once, as steps each backend's dialect
spells (`UPGRADES`), and runs on every backend. `migrate` (`kernel/store/migrations.py`) is the one procedure for all of them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from loopwarden.errors import StoreError
from loopwarden.kernel.log.integrity import LOG_MAC, Integrity
from loopwarden.kernel.sql.backends import Backend
from loopwarden.kernel.sql.dialect import Connection, Dialect
from loopwarden.kernel.sql.envelopes import packed, unpacked
from loopwarden.kernel.sql.schema import (
    COSIGNATURES,
    EXPORT_CURSORS,
    LATE_DIMENSIONS,
    LOG_STATE,
    LOOPS,
    MAC_WHEN_SET_AFTER,
    META,
    PENDING,
    POOL_USAGE,
    POOLS,
    SCHEMA_VERSION,
    TOKENS,
    TURNS,
    WITNESSES,
)
from loopwarden.kernel.sql.table import Column, SqlType, Table

Statement = str | Callable[[Connection], None]
"""What an upgrade runs: a SQL statement, or a change of stored values written in Python (run
inside the same transaction, on the backend's connection)."""
BATCH = 1000


@dataclass(frozen=True)
class AddColumn:
    """Add a column to a table; its default fills the rows already there."""

    table: str
    column: Column

    def statements(self, dialect: Dialect) -> list[Statement]:
        return [dialect.add_column(self.table, self.column)]

    def reverted(self) -> str:
        """The statement that takes the step back (how tests remake an older store)."""
        return f"ALTER TABLE {self.table} DROP COLUMN {self.column.name}"


@dataclass(frozen=True)
class CreateTable:
    """Create a table, with its indexes, as the schema `version` describes it: the columns a
    later version adds to it are that version's own steps, so this one never changes."""

    table: Table[Any]
    version: int

    def statements(self, dialect: Dialect) -> list[Statement]:
        return list(dialect.create(self.table.as_of(self.version)))

    def reverted(self) -> str:
        """The statement that takes the step back (how tests remake an older store)."""
        return f"DROP TABLE {self.table.name}"


@dataclass(frozen=True)
class PackEnvelopes:
    """Store every journal envelope as its parts (`envelopes.py`), a batch of rows at a time:
    an envelope its parts build back byte for byte loses its text; any other is kept whole."""

    def statements(self, dialect: Dialect) -> list[Statement]:
        return [self.run]

    def run(self, conn: Connection) -> None:
        after = -1
        select = "SELECT leaf_index, envelope FROM journal WHERE leaf_index > ? "
        select += "AND payload IS NULL ORDER BY leaf_index LIMIT ?"
        update = "UPDATE journal SET envelope = ?, payload = ?, key_id = ?, signature = ? "
        update += "WHERE leaf_index = ?"
        while rows := conn.execute(select, (after, BATCH)).fetchall():
            parts = [(packed(envelope), leaf) for leaf, envelope in rows]
            changed = [(*stored, leaf) for stored, leaf in parts if not stored.envelope]
            if changed:
                conn.executemany(update, changed)
            after = rows[-1][0]

    def reverted(self) -> Callable[[Any], None]:
        """What takes the step back (how tests remake an older store): each envelope whole
        again, on a DB-API connection of either backend."""
        return _join_envelopes


def _join_envelopes(conn: Any) -> None:
    mark = "%s" if type(conn).__module__.startswith("psycopg") else "?"
    rows = conn.execute(
        "SELECT leaf_index, envelope, payload, key_id, signature FROM journal"
    ).fetchall()
    for leaf, *stored in rows:
        conn.execute(
            f"UPDATE journal SET envelope = {mark} WHERE leaf_index = {mark}",
            (unpacked(*stored), leaf),
        )


Step = AddColumn | CreateTable | PackEnvelopes
"""One schema change a dialect spells, or one a backend runs (more kinds join as versions
need them)."""

DOCUMENT, INTEGER, TEXT = SqlType.DOCUMENT, SqlType.INTEGER, SqlType.TEXT
BYTES = SqlType.BYTES

UPGRADES: dict[int, tuple[Step, ...]] = {
    # version 6: host hooks (hosts/hook.py). Each turn row keeps what the host saw in it
    # (calls admitted and run, per policy tool name), the tools its accepted report named, and
    # the calls refused before they ran; each loop row, the host session each agent's hooks
    # last spoke from. The rows' proofs cover the new columns, so the projection is re-derived.
    6: (
        AddColumn("turns", Column("observed", DOCUMENT, default="{}")),
        AddColumn("turns", Column("reported", DOCUMENT, default="{}")),
        AddColumn("turns", Column("refusals", INTEGER, default=0)),
        AddColumn("loops", Column("hosts", DOCUMENT, default="{}")),
    ),
    # version 7: charges that hold (turns/update.py, leases.py). Each turn row keeps the
    # tool calls charged for it so far and whether a report's usage was charged once it
    # closed; each loop row counts its cancelled todos (todo_cancel).
    7: (
        AddColumn("loops", Column("todos_cancelled", INTEGER, default=0)),
        AddColumn("turns", Column("tool_calls_charged", INTEGER, default=0)),
        AddColumn("turns", Column("settled", INTEGER, default=0)),
    ),
    # version 8: budget pools (kernel/state/charges.py) and export sinks (exports/sink.py). Each
    # pool and what each window of it used; each turn row keeps the pools its claim was admitted
    # under. Each sink's cursor (the last leaf index its receiver acknowledged), its lease (which
    # process sends), and its last success and error: operational state, nothing to re-derive.
    8: (
        AddColumn("turns", Column("pools", DOCUMENT, default="[]")),
        CreateTable(POOLS, 8),
        CreateTable(POOL_USAGE, 8),
        CreateTable(EXPORT_CURSORS, 8),
    ),
    # version 9: receipts stored as their parts (envelopes.py). Each journal row keeps its
    # envelope's payload (deflated), key id and signature in binary instead of the base64 text
    # of the whole envelope, which every read builds back byte for byte; the rows already
    # there are packed in place. Nothing a proof covers changes (the Merkle tree hashes the
    # envelope bytes, which are the same).
    9: (
        AddColumn("journal", Column("payload", BYTES, null=True)),
        AddColumn("journal", Column("key_id", TEXT, null=True)),
        AddColumn("journal", Column("signature", BYTES, null=True)),
        PackEnvelopes(),
    ),
    # version 10: two orders (integrator.py). A write seals its receipt into its loop's chain
    # and leaves it pending; the integrator gives pending receipts their Merkle leaves in
    # batches. On SQLite the integrator runs in the write transaction itself, so a committed
    # store never holds a pending receipt.
    10: (CreateTable(PENDING, 10),),
    # version 12: the model gateway (model_gateway/). A turn keeps what the gateway observed
    # in it (`model`), a token may be bound to one loop (a gateway token). Both hold their
    # default on every row already there and count in no proof until they are set.
    12: (
        AddColumn("turns", TURNS.column("model")),
        AddColumn("tokens", TOKENS.column("loop_id")),
    ),
    # version 13: witnesses (loopwarden/witnesses/). The cosignatures witnesses returned for
    # the checkpoints, each line as it came, and where each witness stands for this log as the
    # witness client last heard. Nothing to re-derive.
    13: (CreateTable(COSIGNATURES, 13), CreateTable(WITNESSES, 13)),
}
# From version 11 on, a budget dimension (`policy/budgets.py`) arrives with its `since` version:
# its columns, added to the loops and to the pools' windows, are that version's steps. Zero
# for every row already there, they count in no row's MAC until they hold a charge
# (`Column.mac_when_set`), so no row is re-proved.
for _dimension in LATE_DIMENSIONS:
    if _dimension.since > MAC_WHEN_SET_AFTER:
        UPGRADES[_dimension.since] = (
            *UPGRADES.get(_dimension.since, ()),
            *(
                AddColumn(table.name, table.column(_dimension.stored))
                for table in (LOOPS, POOL_USAGE)
            ),
        )
assert max(UPGRADES) == SCHEMA_VERSION, "a new schema version needs its upgrade here"


# --- SQLite's history before version 6 ------------------------------------------------------

# How version 1 made a new file. A new store is made from the descriptions now; these
# statements are what versions 2 on were written against (the tests build a version-1 file
# with them).
SQLITE_VERSION_1: tuple[str, ...] = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # The journal: every receipt envelope, in Merkle leaf order.
    """CREATE TABLE journal (
        leaf_index INTEGER PRIMARY KEY,
        loop_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        receipt_id TEXT NOT NULL UNIQUE,
        digest TEXT NOT NULL,
        at TEXT NOT NULL,
        turn_id TEXT,
        envelope BLOB NOT NULL,
        UNIQUE (loop_id, seq)
    )""",
    "CREATE INDEX journal_turn ON journal (turn_id) WHERE turn_id IS NOT NULL",
    # The Merkle log: frontier (one row) + every completed perfect-subtree node.
    """CREATE TABLE log_state (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        size INTEGER NOT NULL,
        frontier BLOB NOT NULL
    )""",
    """CREATE TABLE merkle_nodes (
        level INTEGER NOT NULL,
        idx INTEGER NOT NULL,
        hash BLOB NOT NULL,
        PRIMARY KEY (level, idx)
    ) WITHOUT ROWID""",
    """CREATE TABLE checkpoints (
        size INTEGER PRIMARY KEY,
        root BLOB NOT NULL,
        note TEXT NOT NULL,
        key_id TEXT NOT NULL,
        signed_at TEXT NOT NULL
    )""",
    "CREATE TABLE policies (digest TEXT PRIMARY KEY, document TEXT NOT NULL)",
    # Projection tables: exactly what the fold (kernel/state/fold.py) produces.
    """CREATE TABLE loops (
        loop_id TEXT PRIMARY KEY,
        objective TEXT NOT NULL,
        status TEXT NOT NULL,
        stop_reason TEXT,
        policy_digest TEXT NOT NULL,
        opened_at TEXT NOT NULL,
        opened_by TEXT NOT NULL,
        turns INTEGER NOT NULL,
        model_calls INTEGER NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        tool_calls INTEGER NOT NULL,
        cost_micros INTEGER NOT NULL,
        wall_micros INTEGER NOT NULL,
        todos_open INTEGER NOT NULL,
        todos_claimed INTEGER NOT NULL,
        todos_done INTEGER NOT NULL,
        todos_blocked INTEGER NOT NULL,
        failure_signature TEXT,
        failure_streak INTEGER NOT NULL,
        head_seq INTEGER NOT NULL,
        head_digest TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    """CREATE TABLE todos (
        loop_id TEXT NOT NULL,
        todo_id TEXT NOT NULL,
        title TEXT NOT NULL,
        ord INTEGER NOT NULL,
        depends_on TEXT NOT NULL,
        status TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        fence INTEGER NOT NULL,
        added_by TEXT NOT NULL,
        turn_id TEXT,
        PRIMARY KEY (loop_id, todo_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX todos_by_status ON todos (loop_id, status, ord, todo_id)",
    """CREATE TABLE turns (
        turn_id TEXT PRIMARY KEY,
        loop_id TEXT NOT NULL,
        todo_id TEXT NOT NULL,
        agent TEXT NOT NULL,
        fence INTEGER NOT NULL,
        status TEXT NOT NULL,
        claimed_at TEXT NOT NULL,
        lease_expires_at TEXT NOT NULL,
        closed_at TEXT,
        outcome TEXT
    )""",
    "CREATE INDEX turns_by_status ON turns (loop_id, status, lease_expires_at)",
    "CREATE INDEX turns_by_agent ON turns (loop_id, agent, status)",
    "CREATE INDEX turns_by_claim_time ON turns (loop_id, claimed_at)",
    """CREATE TABLE approvals (
        approval_id TEXT PRIMARY KEY,
        loop_id TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        todo_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        summary TEXT NOT NULL,
        artifact_digest TEXT,
        status TEXT NOT NULL,
        requested_by TEXT NOT NULL,
        requested_at TEXT NOT NULL,
        decided_by TEXT,
        decided_at TEXT,
        expires_at TEXT,
        reason TEXT,
        consumed_by TEXT
    )""",
    "CREATE INDEX approvals_by_status ON approvals (loop_id, status)",
    # Operational records (not part of the projection).
    """CREATE TABLE idempotency (
        principal TEXT NOT NULL,
        key TEXT NOT NULL,
        operation TEXT NOT NULL,
        request_digest TEXT NOT NULL,
        response TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (principal, key)
    ) WITHOUT ROWID""",
    """CREATE TABLE tokens (
        token_hash TEXT PRIMARY KEY,
        token_id TEXT NOT NULL UNIQUE,
        agent TEXT NOT NULL,
        role TEXT NOT NULL,
        created_at TEXT NOT NULL,
        revoked_at TEXT
    )""",
    """CREATE TABLE keys (
        key_id TEXT PRIMARY KEY,
        public_key TEXT NOT NULL,
        first_used_at TEXT NOT NULL
    )""",
)

SQLITE_UPGRADES: dict[int, tuple[str, ...]] = {
    # version 2: fewer B-trees per write (every one a page in each commit) and indexes that
    # keep the projection's reads flat as a loop grows. `loops` and `turns` become WITHOUT
    # ROWID tables keyed by their ids; open turns (at most `claims.max_active` per loop) are
    # found through one index in claim order, so the per-agent and lease indexes go; the todo
    # page is read in claim order without sorting every todo.
    2: (
        """CREATE TABLE loops_v2 (
            loop_id TEXT PRIMARY KEY,
            objective TEXT NOT NULL,
            status TEXT NOT NULL,
            stop_reason TEXT,
            policy_digest TEXT NOT NULL,
            opened_at TEXT NOT NULL,
            opened_by TEXT NOT NULL,
            turns INTEGER NOT NULL,
            model_calls INTEGER NOT NULL,
            input_tokens INTEGER NOT NULL,
            output_tokens INTEGER NOT NULL,
            tool_calls INTEGER NOT NULL,
            cost_micros INTEGER NOT NULL,
            wall_micros INTEGER NOT NULL,
            todos_open INTEGER NOT NULL,
            todos_claimed INTEGER NOT NULL,
            todos_done INTEGER NOT NULL,
            todos_blocked INTEGER NOT NULL,
            failure_signature TEXT,
            failure_streak INTEGER NOT NULL,
            head_seq INTEGER NOT NULL,
            head_digest TEXT NOT NULL,
            updated_at TEXT NOT NULL
        ) WITHOUT ROWID""",
        "INSERT INTO loops_v2 SELECT * FROM loops",
        "DROP TABLE loops",
        "ALTER TABLE loops_v2 RENAME TO loops",
        """CREATE TABLE turns_v2 (
            turn_id TEXT PRIMARY KEY,
            loop_id TEXT NOT NULL,
            todo_id TEXT NOT NULL,
            agent TEXT NOT NULL,
            fence INTEGER NOT NULL,
            status TEXT NOT NULL,
            claimed_at TEXT NOT NULL,
            lease_expires_at TEXT NOT NULL,
            closed_at TEXT,
            outcome TEXT
        ) WITHOUT ROWID""",
        "INSERT INTO turns_v2 SELECT * FROM turns",
        "DROP TABLE turns",
        "ALTER TABLE turns_v2 RENAME TO turns",
        "CREATE INDEX turns_by_claim_time ON turns (loop_id, claimed_at, turn_id)",
        "CREATE INDEX turns_by_status_and_claim ON turns (loop_id, status, claimed_at, turn_id)",
        "DROP INDEX journal_turn",
        "CREATE INDEX todos_by_order ON todos (loop_id, ord, todo_id)",
    ),
    # version 3: the `keys` table goes. The audit trusts only the key directory (a key the
    # database vouches for proves nothing), and bundles carry their own public keys, so the
    # table was written on every open and never read.
    3: ("DROP TABLE keys",),
    # version 4: what lets the write path prove the rows it acts on instead of trusting them
    # (kernel/store/guard.py). Each loop row gains the ids of its open turns, its slot count, the
    # root of its state tree and a MAC; every todo, turn and approval row its slot (turns also
    # their claim number); the state tree's blobs get a table; tokens, idempotency records and
    # the Merkle log state a MAC. Upgrading from an older version re-derives the projection
    # from the journal (kernel/store/rebuild.py), once.
    4: (
        "ALTER TABLE loops ADD COLUMN open_turns TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE loops ADD COLUMN slots INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE loops ADD COLUMN state_root BLOB",
        "ALTER TABLE loops ADD COLUMN mac BLOB",
        "ALTER TABLE todos ADD COLUMN slot INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE turns ADD COLUMN slot INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE turns ADD COLUMN number INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE approvals ADD COLUMN slot INTEGER NOT NULL DEFAULT 0",
        "CREATE INDEX turns_by_number ON turns (loop_id, number)",
        """CREATE TABLE state_nodes (
            loop_id TEXT NOT NULL,
            level INTEGER NOT NULL,
            idx INTEGER NOT NULL,
            hashes BLOB NOT NULL,
            PRIMARY KEY (loop_id, level, idx)
        ) WITHOUT ROWID""",
        "ALTER TABLE tokens ADD COLUMN mac BLOB",
        "ALTER TABLE idempotency ADD COLUMN mac BLOB",
        "ALTER TABLE log_state ADD COLUMN mac BLOB",
    ),
    # version 5: hostile clients. A token may carry an expiry. A principal a loop's policy does
    # not admit (an outsider) gets at most one sealed refusal per loop per window; the refusals
    # answered after it are counted on its row, and the next sealed one carries the count. The
    # rows also mark those receipts, so the projection's recent view leaves them out.
    5: (
        "ALTER TABLE tokens ADD COLUMN expires_at TEXT",
        """CREATE TABLE outsider_refusals (
            loop_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            principal TEXT NOT NULL,
            at TEXT NOT NULL,
            suppressed INTEGER NOT NULL,
            PRIMARY KEY (loop_id, seq)
        ) WITHOUT ROWID""",
        "CREATE INDEX outsider_refusals_by_principal ON outsider_refusals (loop_id, principal, seq)",
    ),
}


# --- the one procedure ------------------------------------------------------------------------


def upgrade(backend: Backend, version: int) -> Iterator[Statement]:
    """The statements that take a store of `version` to `SCHEMA_VERSION`, in order: each
    version's from the backend's own history if it has them, else the shared steps.
    `StoreError` if the backend has no way from `version` (no store of it was ever there)."""
    for number in range(version + 1, SCHEMA_VERSION + 1):
        if number in backend.history:
            yield from backend.history[number]
        elif number in UPGRADES:
            for step in UPGRADES[number]:
                yield from step.statements(backend.dialect)
        else:
            raise StoreError(f"a store of schema version {version} cannot be upgraded here")


def initialize(conn: Connection, integrity: Integrity, origin_prefix: str) -> None:
    """The rows a new store begins with, in its tables just made (inside the caller's
    transaction): its origin and the empty Merkle log under its MAC."""
    dialect = conn.dialect
    conn.execute(dialect.insert(META), ("origin", f"{origin_prefix}/{secrets.token_hex(8)}"))
    conn.execute(dialect.insert(LOG_STATE), (1, 0, b"", integrity.mac(LOG_MAC, [0, ""])))
