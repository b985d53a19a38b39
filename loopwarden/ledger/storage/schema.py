"""The database schema, by version. `store.py` applies it; nothing else runs DDL.

Migrations are append-only: version N's statements take a version N-1 database to N, on both
backends (SQLite's `MIGRATIONS`, PostgreSQL's `PG_MIGRATIONS`). The version lives in SQLite's
`PRAGMA user_version` and in PostgreSQL's `meta` row 'schema_version'.
"""

from __future__ import annotations

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # version 1
    (
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
        # Projection tables: exactly what the fold in projection.py produces.
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
    ),
    # version 2: fewer B-trees per write (every one a page in each commit) and indexes that
    # keep the projection's reads flat as a loop grows. `loops` and `turns` become WITHOUT
    # ROWID tables keyed by their ids; open turns (at most `claims.max_active` per loop) are
    # found through one index in claim order, so the per-agent and lease indexes go; the todo
    # page is read in claim order without sorting every todo.
    (
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
    ("DROP TABLE keys",),
    # version 4: what lets the write path prove the rows it acts on instead of trusting them
    # (ledger/storage/guard.py). Each loop row gains the ids of its open turns, its slot count, the
    # root of its state tree and a MAC; every todo, turn and approval row its slot (turns also
    # their claim number); the state tree's blobs get a table; tokens, idempotency records and
    # the Merkle log state a MAC. Upgrading from an older version re-derives the projection
    # from the journal (ledger/storage/rebuild.py), once.
    (
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
    (
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
    # version 6: host hooks (operations/hooks.py). Each turn row keeps what the host saw in it
    # (calls admitted and run, per policy tool name), the tools its accepted report named, and
    # the calls refused before they ran; each loop row, the host session each agent's hooks
    # last spoke from. The rows' proofs cover the new columns, so the projection is re-derived.
    (
        "ALTER TABLE turns ADD COLUMN observed TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE turns ADD COLUMN reported TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE turns ADD COLUMN refusals INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE loops ADD COLUMN hosts TEXT NOT NULL DEFAULT '{}'",
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)
REBUILT_AT = 6
"""Upgrading an existing database to this version or past it re-derives its projection (and
its proofs) from the journal: the rows' columns changed at 4 and 6."""


# PostgreSQL. A PostgreSQL store begins at version 5, the schema above as it stands there, so
# its first migration creates that schema whole; each later version appends a migration here
# and one above, and both backends report the same `SCHEMA_VERSION`. Text is compared and sorted
# byte-wise (`COLLATE "C"`), as SQLite does, so every query orders rows the same way on both;
# integers are 64-bit, as SQLite's are. The version lives in `meta` ('schema_version').
_T = 'TEXT COLLATE "C"'
PG_FIRST_VERSION = 5
PG_MIGRATIONS: dict[int, tuple[str, ...]] = {
    5: (
        f"CREATE TABLE meta (key {_T} PRIMARY KEY, value TEXT NOT NULL)",
        # The journal: (loop_id, seq) is the key (one receipt per place in a loop's chain);
        # leaf_index is the receipt's place in the one Merkle tree, unique across replicas.
        f"""CREATE TABLE journal (
            leaf_index BIGINT NOT NULL UNIQUE,
            loop_id {_T} NOT NULL,
            seq BIGINT NOT NULL,
            kind {_T} NOT NULL,
            receipt_id {_T} NOT NULL UNIQUE,
            digest {_T} NOT NULL,
            at {_T} NOT NULL,
            turn_id {_T},
            envelope BYTEA NOT NULL,
            PRIMARY KEY (loop_id, seq)
        )""",
        # The Merkle log state, and the sequencer: every write transaction locks this one row
        # first (`SELECT … FOR UPDATE`), so leaves are appended in one order across replicas.
        """CREATE TABLE log_state (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            size BIGINT NOT NULL,
            frontier BYTEA NOT NULL,
            mac BYTEA
        )""",
        """CREATE TABLE merkle_nodes (
            level INTEGER NOT NULL,
            idx BIGINT NOT NULL,
            hash BYTEA NOT NULL,
            PRIMARY KEY (level, idx)
        )""",
        f"""CREATE TABLE checkpoints (
            size BIGINT PRIMARY KEY,
            root BYTEA NOT NULL,
            note TEXT NOT NULL,
            key_id {_T} NOT NULL,
            signed_at {_T} NOT NULL
        )""",
        f"CREATE TABLE policies (digest {_T} PRIMARY KEY, document TEXT NOT NULL)",
        f"""CREATE TABLE loops (
            loop_id {_T} PRIMARY KEY,
            objective TEXT NOT NULL,
            status {_T} NOT NULL,
            stop_reason {_T},
            policy_digest {_T} NOT NULL,
            opened_at {_T} NOT NULL,
            opened_by {_T} NOT NULL,
            turns BIGINT NOT NULL,
            model_calls BIGINT NOT NULL,
            input_tokens BIGINT NOT NULL,
            output_tokens BIGINT NOT NULL,
            tool_calls BIGINT NOT NULL,
            cost_micros BIGINT NOT NULL,
            wall_micros BIGINT NOT NULL,
            todos_open BIGINT NOT NULL,
            todos_claimed BIGINT NOT NULL,
            todos_done BIGINT NOT NULL,
            todos_blocked BIGINT NOT NULL,
            failure_signature {_T},
            failure_streak BIGINT NOT NULL,
            head_seq BIGINT NOT NULL,
            head_digest {_T} NOT NULL,
            updated_at {_T} NOT NULL,
            open_turns TEXT NOT NULL DEFAULT '[]',
            slots BIGINT NOT NULL DEFAULT 0,
            state_root BYTEA,
            mac BYTEA
        )""",
        f"""CREATE TABLE todos (
            loop_id {_T} NOT NULL,
            todo_id {_T} NOT NULL,
            title TEXT NOT NULL,
            ord BIGINT NOT NULL,
            depends_on TEXT NOT NULL,
            status {_T} NOT NULL,
            attempts BIGINT NOT NULL,
            fence BIGINT NOT NULL,
            added_by {_T} NOT NULL,
            turn_id {_T},
            slot BIGINT NOT NULL DEFAULT 0,
            PRIMARY KEY (loop_id, todo_id)
        )""",
        "CREATE INDEX todos_by_status ON todos (loop_id, status, ord, todo_id)",
        "CREATE INDEX todos_by_order ON todos (loop_id, ord, todo_id)",
        f"""CREATE TABLE turns (
            turn_id {_T} PRIMARY KEY,
            loop_id {_T} NOT NULL,
            todo_id {_T} NOT NULL,
            agent {_T} NOT NULL,
            fence BIGINT NOT NULL,
            status {_T} NOT NULL,
            claimed_at {_T} NOT NULL,
            lease_expires_at {_T} NOT NULL,
            closed_at {_T},
            outcome {_T},
            slot BIGINT NOT NULL DEFAULT 0,
            number BIGINT NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX turns_by_claim_time ON turns (loop_id, claimed_at, turn_id)",
        "CREATE INDEX turns_by_status_and_claim ON turns (loop_id, status, claimed_at, turn_id)",
        "CREATE INDEX turns_by_number ON turns (loop_id, number)",
        f"""CREATE TABLE approvals (
            approval_id {_T} PRIMARY KEY,
            loop_id {_T} NOT NULL,
            turn_id {_T} NOT NULL,
            todo_id {_T} NOT NULL,
            tool {_T} NOT NULL,
            summary TEXT NOT NULL,
            artifact_digest {_T},
            status {_T} NOT NULL,
            requested_by {_T} NOT NULL,
            requested_at {_T} NOT NULL,
            decided_by {_T},
            decided_at {_T},
            expires_at {_T},
            reason TEXT,
            consumed_by {_T},
            slot BIGINT NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX approvals_by_status ON approvals (loop_id, status)",
        f"""CREATE TABLE idempotency (
            principal {_T} NOT NULL,
            key {_T} NOT NULL,
            operation {_T} NOT NULL,
            request_digest {_T} NOT NULL,
            response BYTEA NOT NULL,
            created_at {_T} NOT NULL,
            mac BYTEA,
            PRIMARY KEY (principal, key)
        )""",
        f"""CREATE TABLE tokens (
            token_hash {_T} PRIMARY KEY,
            token_id {_T} NOT NULL UNIQUE,
            agent {_T} NOT NULL,
            role {_T} NOT NULL,
            created_at {_T} NOT NULL,
            revoked_at {_T},
            mac BYTEA,
            expires_at {_T}
        )""",
        f"""CREATE TABLE state_nodes (
            loop_id {_T} NOT NULL,
            level INTEGER NOT NULL,
            idx BIGINT NOT NULL,
            hashes BYTEA NOT NULL,
            PRIMARY KEY (loop_id, level, idx)
        )""",
        f"""CREATE TABLE outsider_refusals (
            loop_id {_T} NOT NULL,
            seq BIGINT NOT NULL,
            principal {_T} NOT NULL,
            at {_T} NOT NULL,
            suppressed BIGINT NOT NULL,
            PRIMARY KEY (loop_id, seq)
        )""",
        "CREATE INDEX outsider_refusals_by_principal ON outsider_refusals (loop_id, principal, seq)",
        # One row per committed write transaction, written inside it: after a connection is lost
        # during COMMIT, finding the row is how a replica learns that its transaction committed
        # (postgres.py). Rows older than an hour are pruned; an answer is read back in seconds.
        f"CREATE TABLE commits (id {_T} PRIMARY KEY, at {_T} NOT NULL)",
    ),
    # version 6: host hooks, as above.
    6: (
        "ALTER TABLE turns ADD COLUMN observed TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE turns ADD COLUMN reported TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE turns ADD COLUMN refusals BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE loops ADD COLUMN hosts TEXT NOT NULL DEFAULT '{}'",
    ),
}
assert sorted(PG_MIGRATIONS) == list(range(PG_FIRST_VERSION, SCHEMA_VERSION + 1)), (
    "every new schema version needs a PostgreSQL migration"
)
