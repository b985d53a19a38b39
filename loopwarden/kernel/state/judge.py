"""The judge: was each recorded decision allowed? Asked of every receipt an audit replays.

The fold (`fold.py`) refuses what is impossible; the judge refuses what the policy did not
admit. Before a receipt is folded, it rebuilds the facts that decision was made on from the
replayed state (with `rules.py`, the builders the write path uses), asks the same pure
evaluator the server asks, and compares: a grant the evaluator denies, a refusal it would have
granted (or refused for other reasons), an accepted report it refuses, a stop no rule fired,
a rule that fired without its stop, an action by a role that may not take it, a key that
acted twice. Each is a `Verdict` naming the rule; the audit reports it as `decision_illegal`.
Each kind's rule is in its spec (`registry.py`; each feature's `*_kinds.py`); a kind without one is judged
`unjudged`, never legal.

The policy is the one `loop.opened` carries, its digest re-computed, never a stored row.

Transactions leave a shape in the journal the judge relies on: a claim sweeps expired leases
and seals any due stop before it decides; an update decides, seals its report (a violation then
stops the loop), sweeps, and seals any due stop; a sweep's `lease.expired` comes before the
refusal decided on the unexpired turn.
"""

from __future__ import annotations

from typing import Any

from loopwarden.kernel.state.charges import PoolBook
from loopwarden.kernel.state.events import LoopStopped, ReceiptBody, ReceiptKind
from loopwarden.kernel.state.legality import (
    Judging,
    LoopRecord,
    Verdict,
    VerdictRule,
    codes_of,
    missing_stop,
    outsider,
)
from loopwarden.kernel.state.registry import Kinds
from loopwarden.kernel.state.rows import LoopView
from loopwarden.kernel.state.spec import KindSpec
from loopwarden.policy.decision import ReasonCode

__all__ = ["Judge", "Verdict"]


class Judge:
    """Judges receipts in journal order: `step(view, body)` before the receipt is folded into
    `view`, `after(view, body)` once it is, `end(views)` when the journal ends."""

    def __init__(
        self,
        kinds: Kinds,
        *,
        keys_known: bool = True,
        pools: PoolBook | None = None,
        keys: set[tuple[str, str]] | None = None,
    ) -> None:
        # keys_known: every receipt of the database is judged (not one bundle's loop), so a
        # refusal for a reused idempotency key must follow that key's first use. `pools`: the
        # budget pools as replayed so far, when the replay is the whole journal. `keys`: where
        # the keys used so far are kept (an audit's partition records which it looked up).
        self.kinds = kinds
        self.keys_known = keys_known
        self.pools = pools
        self._loops: dict[str, LoopRecord] = {}
        self._keys: set[tuple[str, str]] = set() if keys is None else keys

    def _context(self, body: ReceiptBody) -> Judging:
        record = self._loops.setdefault(body.loop_id, LoopRecord())
        return Judging(record, self._keys, self.keys_known, pools=self.pools)

    def step(self, view: LoopView | None, body: ReceiptBody) -> list[Verdict]:
        spec = self.kinds[body.kind]
        if spec.pool is not None:
            found = [Verdict(VerdictRule.POOL, problem) for problem in spec.pool.judge(body)]
            return _role(spec, body) + found + self._key(body)
        ctx = self._context(body)
        if view is None or spec.opens is not None:
            return self._opening(spec, body) + self._key(body)
        owed = ctx.record.owed
        ctx.violation_owed = owed is not None and owed.why == "violation"
        verdicts = self._owed(ctx, view, body)
        verdicts += _role(spec, body)
        if spec.judge is None:
            verdicts.append(Verdict(VerdictRule.UNJUDGED, f"no rule judges {body.kind} receipts"))
        else:
            verdicts += spec.judge(ctx, view, body, body.data)
        return verdicts + self._key(body)

    def _opening(self, spec: KindSpec[Any], body: ReceiptBody) -> list[Verdict]:
        if spec.opens is None:
            return [Verdict(VerdictRule.CHAIN, f"{body.kind} before its loop was opened")]
        return _role(spec, body) + spec.opens.judge(body, body.data)

    def after(self, view: LoopView, body: ReceiptBody) -> None:
        """Remember what later receipts are judged against (`view` now includes `body`)."""
        ctx = self._context(body)
        spec = self.kinds[body.kind]
        if not spec.sweeps:
            ctx.record.swept = {}
        if spec.remember is not None:
            spec.remember(ctx, view, body, body.data)

    def loop_ids(self) -> list[str]:
        """The loops judged so far, in the order they were first judged (`end`'s order)."""
        return list(self._loops)

    def loop_count(self) -> int:
        return len(self._loops)

    def end(self, views: dict[str, LoopView]) -> dict[str, list[Verdict]]:
        """Stops still owed when the journal ends, by loop."""
        out = {}
        for loop_id, record in self._loops.items():
            view = views.get(loop_id)
            missing = missing_stop(record.owed, view) if view is not None else None
            if missing is not None:
                out[loop_id] = [missing]
        return out

    def _owed(self, ctx: Judging, view: LoopView, body: ReceiptBody) -> list[Verdict]:
        """The stop an update owed: it must be this receipt (or follow the update's own sweep)."""
        owed = ctx.record.owed
        if owed is None:
            return []
        sweep = body.kind == ReceiptKind.LEASE_EXPIRED
        if sweep and body.at == owed.at and owed.why == "stop_rules":
            return []  # the update's own sweep comes before its stop rules
        ctx.record.owed = None
        reason = body.data.reason if isinstance(body.data, LoopStopped) else None
        stop = reason is not None and body.kind != ReceiptKind.LOOP_CANCELLED
        if stop and (owed.why != "violation" or reason == ReasonCode.POLICY_VIOLATION):
            return []  # the stop owed (a rule's stop is judged by its own rule)
        missing = missing_stop(owed, view)
        return [missing] if missing is not None else []

    def _key(self, body: ReceiptBody) -> list[Verdict]:
        """A key names one call: a later receipt under it can only be a conflict's refusal
        (a retry returns the stored result and seals nothing). An outsider's refusals are not
        remembered, so they may repeat."""
        if body.idempotency_key is None or outsider(codes_of(body)):
            return []
        key = (body.principal.id, body.idempotency_key)
        if key in self._keys and codes_of(body) != {ReasonCode.IDEMPOTENCY_CONFLICT}:
            return [Verdict(VerdictRule.IDEMPOTENCY, f"key {body.idempotency_key!r} acted twice")]
        self._keys.add(key)
        return []


def _role(spec: KindSpec[Any], body: ReceiptBody) -> list[Verdict]:
    if body.principal.role in spec.callers:
        return []
    return [Verdict(VerdictRule.ROLE, f"{body.kind} by a {body.principal.role}")]
