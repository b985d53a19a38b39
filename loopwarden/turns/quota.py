"""`quota`: may the caller run a turn now? Read-only."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from loopwarden.kernel.runner.operation import Call
from loopwarden.kernel.runner.results import (
    BudgetOut,
    Model,
    RateOut,
    ReasonOut,
    budgets_out,
    rate_out,
    reasons_out,
)
from loopwarden.kernel.runner.runner import NeedsPrediction, operation
from loopwarden.kernel.runner.visibility import by_loop
from loopwarden.kernel.state.charges import claim_reasons
from loopwarden.kernel.state.events import LoopId
from loopwarden.kernel.state.rows import LoopRow
from loopwarden.kernel.store.reader import Reader, Rows
from loopwarden.kernel.store.store import Txn
from loopwarden.loops.stops import apply_stop_rules, due_stop
from loopwarden.policy.evaluate import evaluate_claim
from loopwarden.pools.pool_ops import PoolLine, drawn_lines
from loopwarden.principals import Principal
from loopwarden.statuses import LoopStatus
from loopwarden.turns.admission import claim_facts, nothing_to_claim
from loopwarden.turns.leases import expire_leases, pool_sweeps_due, sweep_pools


class QuotaRequest(Model):
    loop_id: LoopId


class QuotaResult(Model):
    loop_id: str
    allowed: bool = Field(description="True if a claim made now would be granted.")
    reasons: list[ReasonOut] = Field(description="Every reason a claim would be refused.")
    status: LoopStatus
    budgets: dict[str, BudgetOut]
    rate: RateOut
    active_leases: int
    policy_digest: str
    pools: list[PoolLine] = Field(
        default_factory=list, description="The budget pools a claim would draw from."
    )


@operation(access="read", scope=by_loop)
def quota(call: Call[Reader], req: QuotaRequest) -> QuotaResult:
    """Check whether you may run a turn in this loop now, before claiming.

    Returns `allowed`, every reason a claim would be refused, the loop status, each budget's
    limit / used / remaining and the rate window. Changes nothing.

    \f
    Predict `claim` exactly, without changing anything.

    A claim first sweeps expired leases and applies the stop rules; when either would change
    the loop, quota plays those steps in a transaction that is rolled back (`NeedsPrediction`),
    so its answer is the claim's.
    """
    loop = call.loop
    if isinstance(call.tx, Txn) and call.predicting:
        expire_leases(call.tx, loop.loop_id, call.who)
        apply_stop_rules(call.tx, loop.loop_id, call.who)
        sweep_pools(call.tx, call.tx.rows.policy(loop.policy_digest), call.who)
    elif _changes(call.rows, call.who, loop, call.now):
        raise NeedsPrediction
    return _answer(call.rows, call.who, loop.loop_id, call.now)


def _changes(reader: Rows, who: Principal, loop: LoopRow, now: datetime) -> bool:
    """Whether a claim would seal something before it decides (sweeps, a due stop)."""
    if reader.expired_turns(loop.loop_id, now) or due_stop(reader, loop, now):
        return True
    return bool(pool_sweeps_due(reader, reader.policy(loop.policy_digest), who.id, now))


def _answer(reader: Rows, who: Principal, loop_id: str, now: datetime) -> QuotaResult:
    loop = reader.loop_row(loop_id)
    assert loop is not None
    policy = reader.policy(loop.policy_digest)
    facts = claim_facts(reader, loop, policy, who.id, now)
    reasons = list(evaluate_claim(policy, facts, digest=loop.policy_digest).reasons)
    reasons += claim_reasons(reader, policy, who.id, now)  # as claim decides: pools too
    if not reasons and reader.next_eligible_todo(loop.loop_id) is None:
        reasons.append(nothing_to_claim(loop))
    return QuotaResult(
        loop_id=loop.loop_id,
        allowed=not reasons,
        reasons=reasons_out(reasons),
        status=loop.status,
        budgets=budgets_out(policy, loop),
        rate=rate_out(policy, facts.claims_in_window),
        active_leases=facts.active,
        policy_digest=loop.policy_digest,
        pools=drawn_lines(reader, policy, who.id, now),
    )
