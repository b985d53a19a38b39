"""`quota`: may the caller run a turn now? Read-only."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from loopwarden.clock import format_time
from loopwarden.ledger.events import LoopId
from loopwarden.ledger.reader import Reader
from loopwarden.ledger.store import Txn
from loopwarden.policy import decision as codes
from loopwarden.policy.decision import Reason
from loopwarden.policy.evaluate import evaluate_claim, evaluate_stop
from loopwarden.principals import Principal
from loopwarden.tools.common import (
    BudgetOut,
    Model,
    RateOut,
    ReasonOut,
    Status,
    budgets_out,
    rate_out,
    reasons_out,
    require_loop,
    require_visible,
)
from loopwarden.tools.kernel import Kernel
from loopwarden.tools.rules import apply_stop_rules, claim_facts, expire_leases, stop_facts


class QuotaRequest(Model):
    loop_id: LoopId


class QuotaResult(Model):
    loop_id: str
    allowed: bool = Field(description="True if a claim made now would be granted.")
    reasons: list[ReasonOut] = Field(description="Every reason a claim would be refused.")
    status: Status
    budgets: dict[str, BudgetOut]
    rate: RateOut
    active_leases: int
    policy_digest: str


async def quota(kernel: Kernel, who: Principal, req: QuotaRequest) -> QuotaResult:
    """Predict `claim` exactly, without changing anything.

    A claim first sweeps expired leases and applies the stop rules; when either would change
    the loop, quota plays those steps in a transaction that is rolled back, so its answer is
    the claim's. `NotFound` for an unknown loop; `Forbidden` for an agent the loop does not
    admit (it learns nothing about the loop's budgets).
    """
    now = kernel.store.clock()

    def read(reader: Reader) -> QuotaResult | None:
        loop = require_loop(reader, req.loop_id)
        require_visible(reader, loop, who)
        stale = bool(reader.expired_turns(loop.loop_id, format_time(now))) or (
            evaluate_stop(reader.policy(loop.policy_digest), stop_facts(reader, loop, now))
            is not None
        )
        return None if stale else _answer(reader, who, req, now)

    answer = await kernel.store.read(read)
    if answer is not None:
        return answer

    def predict(tx: Txn) -> QuotaResult:
        expire_leases(tx, req.loop_id, who)
        apply_stop_rules(tx, req.loop_id, who)
        return _answer(tx, who, req, tx.now_dt)

    return await kernel.store.simulate(predict)


def _answer(reader: Reader, who: Principal, req: QuotaRequest, now: datetime) -> QuotaResult:
    now_text = format_time(now)
    loop = require_loop(reader, req.loop_id)
    policy = reader.policy(loop.policy_digest)
    facts = claim_facts(reader, loop, policy, who.id, now, now_text)
    reasons = list(evaluate_claim(policy, facts, digest=loop.policy_digest).reasons)
    if not reasons and reader.next_eligible_todo(loop.loop_id) is None:
        reasons.append(Reason(codes.NO_ELIGIBLE_TODO, "no open todo has its dependencies done"))
    return QuotaResult(
        loop_id=loop.loop_id,
        allowed=not reasons,
        reasons=reasons_out(reasons),
        status=loop.status,  # type: ignore[arg-type]
        budgets=budgets_out(policy, loop),
        rate=rate_out(policy, reader, loop.loop_id, now),
        active_leases=facts.active,
        policy_digest=loop.policy_digest,
    )
