"""The database schema: every table loopwarden stores, described once, at `SCHEMA_VERSION`.

A new store is made from these descriptions (each backend's dialect spells the DDL); an older
one is upgraded to them by the explicit steps of `migrations.py`, and a test compares each
backend's live schema, read from the database's own catalog, with them. A column's `since` is
the version that added it: a store of an older schema reads it as its default.

Column order is stored order, and a row's stored values in that order are what its proofs
hash: an existing column never moves, a new one goes last.
"""

from __future__ import annotations

import functools
import json
import zlib
from datetime import datetime
from typing import Any

from loopwarden.clock import format_optional, format_time, parse_time
from loopwarden.errors import IntegrityError
from loopwarden.kernel.sql.envelopes import packed, unpacked
from loopwarden.kernel.sql.records import (
    CheckpointRow,
    CosignatureRow,
    ExportCursor,
    IdempotencyRecord,
    JournalRow,
    OutsiderRefusal,
    PendingRow,
    TokenRow,
    WitnessRow,
)
from loopwarden.kernel.sql.table import Codec, Column, Group, Index, SqlType, Table
from loopwarden.kernel.state.rows import (
    ApprovalRow,
    HostSeen,
    LoopRow,
    Observed,
    PoolRow,
    PoolUsage,
    TodoRow,
    TurnRow,
)
from loopwarden.policy.budgets import DIMENSIONS, STORED, Dimension, Totals
from loopwarden.policy.pool_policy import PoolPolicy
from loopwarden.statuses import ApprovalStatus, LoopStatus, PoolStatus, TodoStatus, TurnStatus

SCHEMA_VERSION = 13
LEGACY_SCHEMA = 3
"""The last schema without the proof fields (loopwarden 0.1.0): still readable by an audit."""
REBUILT_AT = 8
"""Upgrading an existing database to this version or past it re-derives its projection (and
its proofs) from the journal: the rows' columns changed at 4, 6, 7 and 8."""

TEXT, DOCUMENT, INTEGER = SqlType.TEXT, SqlType.DOCUMENT, SqlType.INTEGER
SMALL_INTEGER, BYTES, COMPRESSED = SqlType.SMALL_INTEGER, SqlType.BYTES, SqlType.COMPRESSED


# --- codecs ------------------------------------------------------------------------------------


def _json_object(value: dict[str, Any]) -> str:
    """A dict column as JSON text, keys sorted (a row's bytes, MACs and leaves are stable)."""
    return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in sorted(value.items())})


def unpack_response(stored: bytes | str) -> str:
    """An idempotency record's response JSON as stored (zlib-compressed, see `Txn.remember`);
    bytes that do not decompress are an `IntegrityError`: loopwarden did not write them. (An
    old SQLite release stored the text itself.)"""
    if not isinstance(stored, bytes):
        return str(stored)
    try:
        return zlib.decompress(stored).decode()
    except (zlib.error, UnicodeDecodeError):
        raise IntegrityError(
            "an idempotency record's response was changed outside loopwarden"
        ) from None


def _enum(kind: type) -> Codec:
    return Codec(None, kind)  # a StrEnum is stored as its string


def _stored_time(text: str) -> datetime:
    """A stored time read back: loopwarden writes `format_time`'s text, so anything else was
    written outside it (an `IntegrityError`, never a guess)."""
    try:
        return parse_time(text)
    except (TypeError, ValueError):
        raise IntegrityError(
            f"a stored time was changed outside loopwarden: {text!r:.40}"
        ) from None


TIME = Codec(format_time, _stored_time)
"""An instant: an aware datetime in a row, its fixed-width UTC text in the database (`clock`)."""
MAYBE_TIME = Codec(format_optional, lambda text: None if text is None else _stored_time(text))
STRINGS = Codec(lambda v: json.dumps(list(v)), lambda s: tuple(json.loads(s)))
"""A tuple of strings as a JSON array."""
HOSTS = Codec(
    lambda hosts: _json_object({a: (h, s, format_time(at)) for a, (h, s, at) in hosts.items()}),
    lambda text: {
        a: HostSeen(h, s, _stored_time(at)) for a, (h, s, at) in json.loads(text).items()
    },
)
"""Each agent's last host session (`HostSeen`), a JSON object."""
OBSERVED = Codec(_json_object, lambda s: {t: Observed(*seen) for t, seen in json.loads(s).items()})
COUNTS = Codec(_json_object, json.loads)
TURN_MODEL = Codec(
    lambda totals: json.dumps({k: v for k, v in totals.as_dict().items() if v}, sort_keys=True),
    lambda text: Totals(**json.loads(text)),
)
"""What the model gateway observed in a turn (`TurnRow.model`): its nonzero `Totals` fields."""
BLOB = Codec(None, bytes)
FLAG = Codec(int, bool)


@functools.lru_cache(maxsize=1024)  # a frozen model: its text never changes
def _pool_policy_text(policy: PoolPolicy) -> str:
    return json.dumps(policy.model_dump(mode="json", exclude_none=True), sort_keys=True)


POOL_POLICY = Codec(
    _pool_policy_text, functools.lru_cache(maxsize=1024)(PoolPolicy.model_validate_json)
)
RESPONSE = Codec(lambda text: zlib.compress(text.encode(), 6), unpack_response)

TOTALS = STORED
"""A loop's and a pool window's totals columns: one per budget dimension (`policy/budgets.py`),
in the dimensions' order. Those of the first schema stand among a loop's first columns; a
dimension added later has its columns added last (`AddDimension`, `upgrades.py`), from its
`since` version, and they count in a row's MAC only once they hold a charge."""
FIRST = 1
MAC_WHEN_SET_AFTER = 10
"""Dimensions added after this version count in a row's MAC only once they hold a charge."""
LATE_DIMENSIONS = tuple(d for d in DIMENSIONS if d.since > FIRST)
assert all(d.since == FIRST for d in DIMENSIONS[: len(DIMENSIONS) - len(LATE_DIMENSIONS)]), (
    "a dimension added later is declared after every first one (its columns come last)"
)
TOTALS_GROUP = Group(lambda *values: Totals.of(values), Totals.values)


def _dimension_column(d: Dimension, since: int) -> Column:
    return _int(
        d.stored, default=0, since=since, field="totals", mac_when_set=since > MAC_WHEN_SET_AFTER
    )


TODO_COUNTS = ("todos_open", "todos_claimed", "todos_done", "todos_blocked")  # TODO_STATUSES order
# ... and `todos_cancelled`, added at version 7 (last, as every added column).


def _text(name: str, **kw: Any) -> Column:
    return Column(name, TEXT, **kw)


def _null(name: str, **kw: Any) -> Column:
    return Column(name, TEXT, null=True, **kw)


def _int(name: str, **kw: Any) -> Column:
    return Column(name, INTEGER, **kw)


def _slot(since: int = 4) -> Column:
    return Column("slot", INTEGER, default=0, since=since)


def _mac(since: int = 4) -> Column:
    return Column("mac", BYTES, null=True, since=since)


# --- the log ------------------------------------------------------------------------------------

META: Table[Any] = Table("meta", None, (_text("key"), Column("value", DOCUMENT)), key=("key",))
KEY_ANCHOR = "key_genesis"
"""The `meta` row holding the genesis statement of the key history a store was first opened
with (`migrations.anchor_key_history`)."""
JOURNAL = Table(
    "journal",
    JournalRow,
    (
        _int("leaf_index"),
        _text("loop_id"),
        _int("seq"),
        _text("kind"),
        _text("receipt_id"),
        _text("digest"),
        _text("at", codec=TIME),
        _null("turn_id"),
        # A receipt's envelope, stored as its parts (`envelopes.py`): the envelope itself only
        # when its parts do not build it back, else empty; the payload deflated, the key id,
        # the signature.
        Column("envelope", BYTES),
        Column("payload", BYTES, null=True, since=9, field="envelope"),
        Column("key_id", TEXT, null=True, since=9, field="envelope"),
        Column("signature", BYTES, null=True, since=9, field="envelope"),
    ),
    key=("loop_id", "seq"),  # one receipt per place in a loop's chain
    rowid="leaf_index",  # its place in the one Merkle tree
    unique=(("receipt_id",),),
    groups={"envelope": Group(unpacked, packed)},
)
"""Every receipt envelope, in Merkle leaf order."""
PENDING = Table(
    "pending",
    PendingRow,
    (
        Column("ticket", SqlType.TICKET, since=10),
        *(
            Column(c.name, c.type, null=c.null, codec=c.codec, since=10, field=c.field)
            for c in JOURNAL.columns[1:]
        ),
        Column("leaf_hash", BYTES, since=10, codec=BLOB),
    ),
    key=("loop_id", "seq"),
    rowid="ticket",  # the order the integrator gives them their leaves in
    unique=(("receipt_id",),),
    groups={"envelope": Group(unpacked, packed)},
)
"""Receipts sealed into their loops' chains and not yet in the Merkle tree (the integrator,
`integrator.py`, moves them to the journal in ticket order, a batch at a time)."""
LOG_STATE: Table[Any] = Table(
    "log_state",
    None,
    (Column("id", SMALL_INTEGER), _int("size"), Column("frontier", BYTES), _mac()),
    key=("id",),
    rowid="id",
    check="id = 1",
)
"""The Merkle log's frontier (one row); the integrator holds it while it gives leaves."""
MERKLE_NODES: Table[Any] = Table(
    "merkle_nodes",
    None,
    (Column("level", SMALL_INTEGER), _int("idx"), Column("hash", BYTES)),
    key=("level", "idx"),
    clustered=True,
)
"""Every completed perfect subtree's node of the Merkle tree."""
CHECKPOINTS = Table(
    "checkpoints",
    CheckpointRow,
    (
        _int("size"),
        Column("root", BYTES, codec=BLOB),
        Column("note", DOCUMENT),
        _text("key_id"),
        _text("signed_at", codec=TIME),
    ),
    key=("size",),
    rowid="size",
)
POLICIES: Table[Any] = Table(
    "policies", None, (_text("digest"), Column("document", DOCUMENT)), key=("digest",)
)

# --- the projection: exactly the rows the fold (kernel/state/fold.py) produces ------------------

LOOPS = Table(
    "loops",
    LoopRow,
    (
        _text("loop_id"),
        Column("objective", DOCUMENT),
        _text("status", codec=_enum(LoopStatus)),
        _null("stop_reason"),
        _text("policy_digest"),
        _text("opened_at", codec=TIME),
        _text("opened_by"),
        *(_int(d.stored, field="totals") for d in DIMENSIONS if d.since == FIRST),
        *(_int(name, field="todo_counts") for name in TODO_COUNTS),
        _null("failure_signature"),
        _int("failure_streak"),
        _int("head_seq"),
        _text("head_digest"),
        _text("updated_at", codec=TIME),
        Column("open_turns", DOCUMENT, default="[]", since=4, codec=STRINGS),
        _int("slots", default=0, since=4),
        # The loop row's proofs, outside the row: its state tree's root, and its MAC over the
        # row's stored values and that root.
        Column("state_root", BYTES, null=True, since=4),
        _mac(),
        Column("hosts", DOCUMENT, default="{}", since=6, codec=HOSTS),
        _int("todos_cancelled", default=0, since=7, field="todo_counts"),
        *(_dimension_column(d, d.since) for d in LATE_DIMENSIONS),
    ),
    key=("loop_id",),
    clustered=True,
    groups={
        "totals": TOTALS_GROUP,
        "todo_counts": Group(lambda *counts: counts, tuple),
    },
)
TODOS = Table(
    "todos",
    TodoRow,
    (
        _text("loop_id"),
        _text("todo_id"),
        Column("title", DOCUMENT),
        _int("ord"),
        Column("depends_on", DOCUMENT, codec=STRINGS),
        _text("status", codec=_enum(TodoStatus)),
        _int("attempts"),
        _int("fence"),
        _text("added_by"),
        _null("turn_id"),
        _slot(),
    ),
    key=("loop_id", "todo_id"),
    clustered=True,
    indexes=(
        Index("todos_by_status", ("loop_id", "status", "ord", "todo_id")),
        Index("todos_by_order", ("loop_id", "ord", "todo_id")),
    ),
)
TURNS = Table(
    "turns",
    TurnRow,
    (
        _text("turn_id"),
        _text("loop_id"),
        _text("todo_id"),
        _text("agent"),
        _int("fence"),
        _text("status", codec=_enum(TurnStatus)),
        _text("claimed_at", codec=TIME),
        _text("lease_expires_at", codec=TIME),
        _null("closed_at", codec=MAYBE_TIME),
        _null("outcome"),
        _slot(),
        _int("number", default=0, since=4),
        Column("observed", DOCUMENT, default="{}", since=6, codec=OBSERVED),
        Column("reported", DOCUMENT, default="{}", since=6, codec=COUNTS),
        _int("refusals", default=0, since=6),
        _int("tool_calls_charged", default=0, since=7),
        _int("settled", default=0, since=7, codec=FLAG),
        Column("pools", DOCUMENT, default="[]", since=8, codec=STRINGS),
        Column("model", DOCUMENT, default="{}", since=12, codec=TURN_MODEL, mac_when_set=True),
    ),
    key=("turn_id",),
    clustered=True,
    indexes=(
        Index("turns_by_claim_time", ("loop_id", "claimed_at", "turn_id")),
        Index("turns_by_status_and_claim", ("loop_id", "status", "claimed_at", "turn_id")),
        Index("turns_by_number", ("loop_id", "number")),
    ),
)
APPROVALS = Table(
    "approvals",
    ApprovalRow,
    (
        _text("approval_id"),
        _text("loop_id"),
        _text("turn_id"),
        _text("todo_id"),
        _text("tool"),
        Column("summary", DOCUMENT),
        _null("artifact_digest"),
        _text("status", codec=_enum(ApprovalStatus)),
        _text("requested_by"),
        _text("requested_at", codec=TIME),
        _null("decided_by"),
        _null("decided_at", codec=MAYBE_TIME),
        _null("expires_at", codec=MAYBE_TIME),
        Column("reason", DOCUMENT, null=True),
        _null("consumed_by"),
        _slot(),
    ),
    key=("approval_id",),
    indexes=(Index("approvals_by_status", ("loop_id", "status")),),
)
STATE_NODES: Table[Any] = Table(
    "state_nodes",
    None,
    (_text("loop_id"), Column("level", SMALL_INTEGER), _int("idx"), Column("hashes", BYTES)),
    key=("loop_id", "level", "idx"),
    clustered=True,
)
"""The blobs of every loop's state tree (statetree.py)."""

POOLS = Table(
    "pools",
    PoolRow,
    (
        _text("name", since=8),
        Column("policy", DOCUMENT, codec=POOL_POLICY, since=8),
        _text("policy_digest", since=8),
        _text("status", codec=_enum(PoolStatus), since=8),
        _text("created_at", codec=TIME, since=8),
        _text("updated_at", codec=TIME, since=8),
        _int("head_seq", since=8),
        _text("head_digest", since=8),
        _int("active_turns", since=8),
        _mac(since=8),
    ),
    key=("name",),
    clustered=True,
)
"""Every budget pool (kernel/state/charges.py), each under its MAC; its receipts chain under
`pool:<name>` in the journal."""
POOL_USAGE = Table(
    "pool_usage",
    PoolUsage,
    (
        _text("pool", since=8),
        _text("window_start", since=8),
        *(_dimension_column(d, 8) for d in DIMENSIONS if d.since == FIRST),
        _mac(since=8),
        *(_dimension_column(d, d.since) for d in LATE_DIMENSIONS),
    ),
    key=("pool", "window_start"),
    clustered=True,
    groups={"totals": TOTALS_GROUP},
)
"""What each window of each pool has used, under its MAC."""

ROW_TABLES: dict[str, Table[Any]] = {"todos": TODOS, "turns": TURNS, "approvals": APPROVALS}
"""The tables of a loop's rows, by the name a `LoopView` keeps them under."""
PROJECTION = (LOOPS, TODOS, TURNS, APPROVALS)
LEGACY_FIELDS = frozenset().union(*(t.fields_since(LEGACY_SCHEMA) for t in PROJECTION))
"""Row fields the legacy schema did not store (read back as their defaults, and not compared)."""

# --- operational records (not part of the projection) -------------------------------------------

IDEMPOTENCY = Table(
    "idempotency",
    IdempotencyRecord,
    (
        _text("principal"),
        _text("key"),
        _text("operation"),
        _text("request_digest"),
        Column("response", COMPRESSED, codec=RESPONSE),
        _text("created_at", codec=TIME),
        _mac(),
    ),
    key=("principal", "key"),
    clustered=True,
)
TOKENS = Table(
    "tokens",
    TokenRow,
    (
        _text("token_hash"),
        _text("token_id"),
        _text("agent"),
        _text("role"),
        _text("created_at", codec=TIME),
        _null("revoked_at", codec=MAYBE_TIME),
        _mac(),
        _null("expires_at", codec=MAYBE_TIME, since=5),
        _null("loop_id", since=12, mac_when_set=True),  # a model gateway token's one loop
    ),
    key=("token_hash",),
    unique=(("token_id",),),
)
OUTSIDER_REFUSALS = Table(
    "outsider_refusals",
    OutsiderRefusal,
    (
        _text("loop_id"),
        _int("seq"),
        _text("principal"),
        _text("at", codec=TIME),
        _int("suppressed"),
    ),
    key=("loop_id", "seq"),
    clustered=True,
    indexes=(Index("outsider_refusals_by_principal", ("loop_id", "principal", "seq")),),
)
"""The receipts that are refusals of outsiders (kernel/runner/outsiders.py), and the refusals
answered after each without being sealed."""
EXPORT_CURSORS = Table(
    "export_cursors",
    ExportCursor,
    (
        _text("sink", since=8),
        _int("exported", since=8),
        _text("target", since=8),
        _null("holder", since=8),
        _null("lease_expires_at", codec=MAYBE_TIME, since=8),
        _null("succeeded_at", codec=MAYBE_TIME, since=8),
        _null("failed_at", codec=MAYBE_TIME, since=8),
        _null("error", since=8),
        _int("sent", default=0, since=8),
    ),
    key=("sink",),
)
"""Each export sink's cursor and lease (`serve --export-webhook`, `exports/sink.py`): operational
state beside the journal, never part of a proof (the audit and the start-up check ignore it)."""

COSIGNATURES = Table(
    "cosignatures",
    CosignatureRow,
    (
        _int("size", since=13),
        _text("witness", since=13),
        _text("key_hash", since=13),
        Column("line", DOCUMENT, since=13),
        _text("received_at", codec=TIME, since=13),
    ),
    key=("size", "witness", "key_hash"),
)
"""Witnesses' cosignatures of the checkpoints (`loopwarden/witnesses/`), each the signature line
as the witness returned it: it vouches for itself, so the audit checks it, not the row."""
WITNESSES = Table(
    "witnesses",
    WitnessRow,
    (
        _text("vkey", since=13),
        _text("url", since=13),
        _int("cosigned", since=13),
        _null("succeeded_at", codec=MAYBE_TIME, since=13),
        _null("failed_at", codec=MAYBE_TIME, since=13),
        _null("error", since=13),
        _null("conflict", since=13),
        _null("conflict_at", codec=MAYBE_TIME, since=13),
        _int("failures", since=13),
    ),
    key=("vkey",),
)
"""Where each witness stands for this log, as the witness client last heard: operational state
beside the journal (a conflict in it is an alarm the audit reports)."""

TABLES: tuple[Table[Any], ...] = (
    META,
    JOURNAL,
    PENDING,
    LOG_STATE,
    MERKLE_NODES,
    CHECKPOINTS,
    POLICIES,
    LOOPS,
    TODOS,
    TURNS,
    APPROVALS,
    STATE_NODES,
    IDEMPOTENCY,
    TOKENS,
    OUTSIDER_REFUSALS,
    POOLS,
    POOL_USAGE,
    EXPORT_CURSORS,
    COSIGNATURES,
    WITNESSES,
)
"""Every table of every backend (a backend may keep tables of its own besides)."""
