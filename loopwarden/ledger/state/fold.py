"""The fold: a loop's state machine. `apply(view, body, digest)` moves a `LoopView` by one receipt.

It reads nothing but the view and the receipt, so replaying a loop's receipts in order always
rebuilds the same view; the store persists exactly what this fold produces and the audit
compares the two. It refuses impossible transitions (`FoldError`): a receipt out of the loop's
chain, a claim of a todo that is not open, a report on a closed turn, a decision on an approval
that is not pending, any change to a closed loop but a recorded refusal. The write path folds
through it too, so it can never commit such a receipt either. Whether a *possible* transition
was *allowed* by the policy is the judge's question (`judge.py`). Each kind's step is declared
in its spec (`registry.py`, `kinds/`).

A view may be *partial*: the write path loads only the rows a receipt touches (`touched`), folds,
and writes those rows back, so an append costs the same at 10 or 100,000 todos.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from loopwarden.ledger.state.events import ReceiptBody
from loopwarden.ledger.state.folding import FoldError
from loopwarden.ledger.state.registry import AFTER_CLOSE, KINDS
from loopwarden.ledger.state.rows import LoopView, Touched, replace

__all__ = ["ChainProblem", "FoldError", "apply", "chain_problem", "rebuild", "touched"]

ChainProblem = Literal["seq_gap", "prev_mismatch"]


def chain_problem(head_seq: int, head_digest: str | None, body: ReceiptBody) -> ChainProblem | None:
    """Whether `body` continues a loop whose last receipt was `head_seq` with `head_digest`
    (0 and None before the first). The one chain check: the fold, the audit and bundles use it."""
    if body.seq != head_seq + 1:
        return "seq_gap"
    if body.prev != (head_digest or None):
        return "prev_mismatch"
    return None


def touched(body: ReceiptBody) -> Touched:
    """The existing rows `body` reads or changes, so the write path loads only those."""
    return KINDS[body.kind].touches(body, body.data)


def apply(view: LoopView | None, body: ReceiptBody, digest: str) -> LoopView:
    """Fold one receipt (its validated body and envelope digest) into `view`; returns the view.

    `view` is None exactly for an opening kind (`loop.opened`). Mutates and returns the given
    view (rows are immutable and replaced). Raises `FoldError` if the receipt does not continue
    the loop's chain (seq, prev), refers to rows the view does not hold, or is impossible in
    that state.
    """
    spec = KINDS[body.kind]
    if spec.pool is not None:
        raise FoldError(f"{body.kind} belongs to a pool's chain, not to a loop")
    if spec.opens is not None:
        if view is not None:
            raise FoldError(f"loop {body.loop_id!r} is opened twice")
        view = spec.opens.view(body, body.data)
    else:
        if view is None:
            raise FoldError(f"receipt {body.seq} of unknown loop {body.loop_id!r}")
        problem = chain_problem(view.loop.head_seq, view.loop.head_digest, body)
        if problem == "seq_gap":
            raise FoldError(
                f"loop {body.loop_id!r}: receipt seq {body.seq} does not follow {view.loop.head_seq}"
            )
        if problem == "prev_mismatch":
            raise FoldError(
                f"loop {body.loop_id!r}: receipt {body.seq} does not chain to its predecessor"
            )
        if view.loop.status.closed and body.kind not in AFTER_CLOSE:
            raise FoldError(f"{body.kind} on a {view.loop.status} loop")
        assert spec.fold is not None  # the registry holds every spec to fold or opens
        spec.fold(view, body, body.data)
    view.loop = replace(view.loop, head_seq=body.seq, head_digest=digest, updated_at=body.at)
    return view


def rebuild(receipts: Iterable[tuple[ReceiptBody, str]]) -> dict[str, LoopView]:
    """Replay (body, digest) pairs in journal order into whole views, one per loop."""
    views: dict[str, LoopView] = {}
    for body, digest in receipts:
        if KINDS[body.kind].pool is None:  # a pool's receipts fold into its row (pools.py)
            views[body.loop_id] = apply(views.get(body.loop_id), body, digest)
    return views
