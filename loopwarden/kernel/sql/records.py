"""The stored records that are not projection rows: receipts in the journal, checkpoints,
tokens, idempotency records, outsiders' refusals, the Merkle log's state and the export sinks'
cursors.

The projection's rows (loops, todos, turns, approvals) are in `kernel/state/rows.py`, where the
fold makes them; the table each record is stored in is described in `schema.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from loopwarden.clock import format_optional, format_time


@dataclass(frozen=True)
class SealedRow:
    """A sealed receipt's columns, the same in the journal and in the pending table."""

    loop_id: str
    seq: int
    kind: str
    receipt_id: str
    digest: str
    at: datetime
    turn_id: str | None
    envelope: bytes


@dataclass(frozen=True)
class JournalRow(SealedRow):
    """A sealed receipt: `leaf_index` is its place in the Merkle tree, None while it is pending
    integration (then only a loop's own reads return it: `Reader.loop_journal` and its kin)."""

    leaf_index: int | None

    @property
    def leaf(self) -> int:
        """The leaf index of an integrated receipt (what the leaf-order reads return)."""
        if self.leaf_index is None:
            raise LookupError(f"receipt {self.receipt_id} is pending integration")
        return self.leaf_index


@dataclass(frozen=True)
class PendingRow(SealedRow):
    """A receipt sealed into its loop's chain and not yet given its place in the Merkle tree:
    `ticket` orders the pending receipts (the database numbers them as they are inserted), and
    `leaf_hash` is the leaf its envelope will be."""

    ticket: int | None
    leaf_hash: bytes

    def integrated(self, leaf_index: int | None) -> JournalRow:
        return JournalRow(
            self.loop_id, self.seq, self.kind, self.receipt_id, self.digest, self.at,
            self.turn_id, self.envelope, leaf_index,
        )  # fmt: skip


@dataclass(frozen=True)
class CheckpointRow:
    size: int
    root: bytes
    note: str
    key_id: str
    signed_at: datetime


@dataclass(frozen=True)
class TokenRow:
    token_hash: str
    token_id: str
    agent: str
    role: str
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None = None
    mac: bytes | None = None
    loop_id: str | None = None  # a model gateway token's one loop (none: any the role allows)

    def live_at(self, now: datetime) -> bool:
        """Neither revoked nor expired at `now`."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def mac_values(self) -> list[object]:
        """What the row's MAC covers: every column but the MAC, in column order."""
        return [
            self.token_hash,
            self.token_id,
            self.agent,
            self.role,
            format_time(self.created_at),
            format_optional(self.revoked_at),
            format_optional(self.expires_at),
            *([self.loop_id] if self.loop_id is not None else []),
        ]


@dataclass(frozen=True)
class IdempotencyRecord:
    """The response recorded for a principal's idempotency key (`response`: its JSON text)."""

    principal: str
    key: str
    operation: str
    request_digest: str
    response: str
    created_at: datetime
    mac: bytes | None = None

    def mac_values(self) -> list[object]:
        """What the record's MAC covers: who, which key, the call and its response text."""
        return [self.principal, self.key, self.operation, self.request_digest, self.response]


@dataclass(frozen=True)
class OutsiderRefusal:
    """A refusal sealed for an outsider (receipt `seq` of the loop), and how many were answered
    after it without being sealed."""

    loop_id: str
    seq: int
    principal: str
    at: datetime
    suppressed: int


class OutsiderCounts(NamedTuple):
    """A loop's refusals of outsiders: sealed in its journal, and answered but not sealed."""

    sealed: int
    suppressed: int


class LogState(NamedTuple):
    """The Merkle log as stored: its size (leaves) and its frontier (the perfect subtrees' roots,
    largest first)."""

    size: int
    frontier: list[bytes]


@dataclass(frozen=True)
class ExportCursor:
    """Where one export sink (`serve --export-webhook`) stands: operational state, not a
    receipt. `exported` is the last leaf index a receiver acknowledged (-1: none yet); the
    sink's lease (`holder`, until `lease_expires_at`) says which server process sends, so only
    one replica does at a time. `target` is the receiver's origin (scheme, host and port only:
    never a path, a query or credentials); `error` a short, secret-free description of the last
    failure ("HTTP 500", "connection failed"), cleared by the next success."""

    sink: str
    exported: int
    target: str
    holder: str | None
    lease_expires_at: datetime | None
    succeeded_at: datetime | None
    failed_at: datetime | None
    error: str | None
    sent: int  # receipts acknowledged by the receiver, duplicates after a takeover included


@dataclass(frozen=True)
class CosignatureRow:
    """A witness's cosignature of the checkpoint of `size` (`loopwarden/witnesses/`): the
    signed-note signature line exactly as the witness returned it (`line`, ending in a
    newline), the witness's key name and the line's key hash (hex), and when it came. The line
    vouches for itself (an auditor checks it against the witness's key); the row is not proof."""

    size: int
    witness: str
    key_hash: str
    line: str
    received_at: datetime


@dataclass(frozen=True)
class WitnessRow:
    """Where one witness stands for this log, as the witness client last heard (operational
    state, `loopwarden/witnesses/submitter.py`). `vkey` names the witness (its verifier key,
    the row's key); `cosigned` is the tree size the witness last said it holds for this log
    (0: none); `conflict` a description of a view the witness holds that this log's does not
    extend (an alarm: `verify` reports it), kept until an operator clears it; `error` the last
    failure, cleared by the next success."""

    vkey: str
    url: str
    cosigned: int
    succeeded_at: datetime | None
    failed_at: datetime | None
    error: str | None
    conflict: str | None
    conflict_at: datetime | None
    failures: int
