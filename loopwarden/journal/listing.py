"""The journal as operators read it: one line per receipt, with its signature checked."""

from __future__ import annotations

import hashlib
import threading
from datetime import datetime
from typing import Any

from pydantic import Field

from loopwarden.kernel.log.seals import Opened, open_envelope
from loopwarden.kernel.runner.operation import Call
from loopwarden.kernel.runner.results import Model
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import by_loop
from loopwarden.kernel.state.events import LoopId, ReceiptKind, Timestamp
from loopwarden.kernel.store.reader import JournalRow, Reader

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
    verified: bool = Field(description="The signature holds under a trusted key.")
    messages: list[str] = Field(
        default_factory=list, description="Each reason's message, in the order of `reasons`."
    )


def receipt_summary(row: JournalRow, opened: Opened | None = None) -> ReceiptSummary:
    """One line about a receipt, for display. Decoded here without verification (`receipt`
    verifies) unless the caller passes the envelope it already opened."""
    if opened is not None:
        return _summary(row, opened.body or {})
    # Memoized by the row's columns and its envelope's hash: a projection shows the same recent
    # receipts call after call, and a loop's opening receipt can carry 10⁵ todos (~30 ms to
    # decode). The cache holds summaries only (no envelope), at most _SUMMARIES_KEPT of them.
    key = (row.seq, row.receipt_id, row.kind, row.at, hashlib.sha256(row.envelope).digest())
    with _summaries_lock:
        found = _summaries.get(key)
    if found is None:
        found = _summary(row, open_envelope(row.envelope, None, canonical=False).body or {})
        with _summaries_lock:
            if len(_summaries) >= _SUMMARIES_KEPT:
                del _summaries[next(iter(_summaries))]  # the oldest
            _summaries[key] = found
    return found


_SUMMARIES_KEPT = 1024
_summaries: dict[tuple[int, str, str, datetime, bytes], ReceiptSummary] = {}
_summaries_lock = threading.Lock()


def _summary(row: JournalRow, body: dict[str, Any]) -> ReceiptSummary:
    decision = body.get("decision", {})
    data = body.get("data")
    found = data if isinstance(data, dict) else {}
    agent = " ".join(str(found[k]) for k in ("agent_type", "agent_id") if found.get(k)) or None
    return ReceiptSummary(
        seq=row.seq,
        receipt_id=row.receipt_id,
        kind=row.kind,
        at=row.at,
        principal=body.get("principal", {}).get("id", "?"),
        effect=decision.get("effect", "?"),
        reasons=[r.get("code", "?") for r in decision.get("reasons", [])],
        subagent=agent,
    )


class JournalRequest(Model):
    loop_id: LoopId
    kind: ReceiptKind | None = Field(default=None, description="Only receipts of this kind.")
    after_seq: int = Field(default=0, ge=0, le=2**53, description="Only receipts after this seq.")
    limit: int = Field(default=MAX_LINES, ge=1, le=MAX_LINES)
    with_data: bool = Field(
        default=False, description="Include each receipt's `data` (whatever its kind)."
    )


class JournalResult(Model):
    loop_id: str
    receipts: list[ReceiptLine]
    closed: bool = Field(description="The loop is closed: no receipt but refusals will follow.")
    data: list[dict[str, Any]] | None = Field(
        default=None,
        description="With `with_data`: each receipt's kind-specific `data` as signed, in order.",
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
    lines, data = [], []
    for row in rows:
        # The signature binds the stored bytes, and seal signs only canonical bytes, so the
        # RFC 8785 re-serialization (a third of the cost per line) is left to `receipt`.
        opened = open_envelope(row.envelope, call.store.keyring, canonical=False)
        summary = receipt_summary(row, opened)
        reasons = opened.body.get("decision", {}).get("reasons", [])
        lines.append(
            ReceiptLine(
                **dict(summary),
                turn_id=opened.body.get("turn_id"),
                verified=opened.verified,
                messages=[str(r.get("message", "")) for r in reasons],
            )
        )
        data.append(opened.body.get("data") or {})
    return JournalResult(
        loop_id=req.loop_id,
        receipts=lines,
        closed=call.loop.status.closed,
        data=data if req.with_data else None,
    )
