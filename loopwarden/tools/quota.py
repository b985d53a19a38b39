"""`quota`: may the caller run a turn now? Read-only."""

from __future__ import annotations

from pydantic import Field

from loopwarden.clock import format_time
from loopwarden.ledger.events import LoopId
from loopwarden.ledger.reader import Reader
from loopwarden.policy import decision as codes
from loopwarden.policy.decision import Reason
from loopwarden.policy.evaluate import claim_reasons
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
)
from loopwarden.tools.kernel import Kernel
from loopwarden.tools.rules import claim_facts


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
    """Predict `claim` without changing anything: the same admission rules, evaluated now.

    Expired leases are counted as released (a claim would sweep them first). `NotFound` for an
    unknown loop.
    """
    now = kernel.store.clock()
    now_text = format_time(now)

    def read(reader: Reader) -> QuotaResult:
        loop = require_loop(reader, req.loop_id)
        policy = reader.policy(loop.policy_digest)
        facts = claim_facts(reader, loop, policy, who.id, now, now_text)
        reasons: list[Reason] = claim_reasons(policy, facts)
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

    return await kernel.store.read(read)
