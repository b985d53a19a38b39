"""The journal as operators read it: one line per receipt, with its signature checked."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from loopwarden.kernel.log.seals import open_envelope
from loopwarden.kernel.runner.operation import Call
from loopwarden.kernel.runner.results import Model
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import by_loop
from loopwarden.kernel.state.events import LoopId, ReceiptBody, ReceiptKind, Timestamp
from loopwarden.kernel.store.reader import JournalRow, Reader
from loopwarden.kernel.store.store import Store

MAX_LINES = 10_000


class ReceiptSummary(Model):
    seq: int
    receipt_id: str
    kind: str
    at: Timestamp
    principal: str
    effect: str
    reasons: list[str]
    subagent: str | None = Field(
        default=None,
        description="A host receipt's subagent, as the host names it: 'TYPE ID' (agent_type, "
        "agent_id), for calls a subagent made.",
    )


class ReceiptLine(ReceiptSummary):
    turn_id: str | None
    digest: str = Field(description="The digest of the receipt's envelope (what `prev` names).")
    verified: bool = Field(description="The signature holds under a trusted key.")
    messages: list[str] = Field(
        default_factory=list, description="Each reason's message, in the order of `reasons`."
    )


def receipt_summary(store: Store, row: JournalRow) -> ReceiptSummary:
    """One line about a receipt, for display, from its typed body (`Store.body_of`, decoded
    once per store and not verified here: `receipt` and `journal` verify)."""
    return _summary(row, store.body_of(row))


def _summary(row: JournalRow, body: ReceiptBody | None) -> ReceiptSummary:
    """A line from a typed body; a body that is not one of this application's reads as `?`."""
    if body is None:
        return ReceiptSummary(
            seq=row.seq, receipt_id=row.receipt_id, kind=row.kind, at=row.at,
            principal="?", effect="?", reasons=[],
        )  # fmt: skip
    return ReceiptSummary(
        seq=row.seq,
        receipt_id=row.receipt_id,
        kind=row.kind,
        at=row.at,
        principal=body.principal.id,
        effect=body.decision.effect,
        reasons=[r.code for r in body.decision.reasons],
        subagent=subagent_of(body),
    )


def subagent_of(body: ReceiptBody) -> str | None:
    """A host receipt's subagent as the host names it ('TYPE ID'), if a subagent made the call."""
    named = [getattr(body.data, k, None) for k in ("agent_type", "agent_id")]
    return " ".join(str(n) for n in named if n) or None


class JournalRequest(Model):
    loop_id: LoopId
    kind: ReceiptKind | None = Field(default=None, description="Only receipts of this kind.")
    after_seq: int = Field(default=0, ge=0, le=2**53, description="Only receipts after this seq.")
    limit: int = Field(default=MAX_LINES, ge=1, le=MAX_LINES)
    with_data: bool = Field(
        default=False, description="Include each receipt's `data` (whatever its kind)."
    )
    with_bodies: bool = Field(
        default=False, description="Include each receipt's whole body as signed."
    )


class JournalResult(Model):
    loop_id: str
    receipts: list[ReceiptLine]
    closed: bool = Field(description="The loop is closed: no receipt but refusals will follow.")
    data: list[dict[str, Any]] | None = Field(
        default=None,
        description="With `with_data`: each receipt's kind-specific `data` as signed, in order.",
    )
    bodies: list[dict[str, Any]] | None = Field(
        default=None, description="With `with_bodies`: each receipt's body as signed, in order."
    )


@operation(access="read", scope=by_loop, tool=False)
def journal(call: Call[Reader], req: JournalRequest) -> JournalResult:
    """A loop's receipts in order, each with its signature checked.

    \f
    The loop's receipts after `after_seq` (of one kind), each verified against the store's
    trusted keys. With `with_data`, `data` holds each body's `data` as signed, for any kind
    (kinds this version does not know included), so readers can show what they do not model.
    """
    rows = call.tx.loop_journal(
        req.loop_id, after_seq=req.after_seq, limit=req.limit, kind=req.kind
    )
    lines, data, bodies = [], [], []
    for row in rows:
        # The signature binds the stored bytes, and seal signs only canonical bytes, so the
        # RFC 8785 re-serialization (a third of the cost per line) is left to `receipt`.
        opened = open_envelope(row.envelope, call.store.keyring, canonical=False)
        body = call.store.body_of(row)
        lines.append(
            ReceiptLine(
                **dict(_summary(row, body)),
                turn_id=row.turn_id,
                digest=row.digest,
                verified=opened.verified,
                messages=[r.message for r in body.decision.reasons] if body is not None else [],
            )
        )
        data.append(opened.body.get("data") or {})  # as signed, for kinds this version lacks
        bodies.append(opened.body)
    return JournalResult(
        loop_id=req.loop_id,
        receipts=lines,
        closed=call.loop.status.closed,
        data=data if req.with_data else None,
        bodies=bodies if req.with_bodies else None,
    )
