"""Whether a claim would be admitted now, and the route an agent should take next."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from loopwarden.kernel.state import facts as rules
from loopwarden.kernel.state.rows import LoopRow
from loopwarden.kernel.store.reader import Rows
from loopwarden.policy.budgets import BUDGET_EXHAUSTED
from loopwarden.policy.decision import Reason, ReasonCode
from loopwarden.policy.evaluate import ClaimFacts, evaluate_claim
from loopwarden.policy.model import LoopPolicy
from loopwarden.statuses import LoopStatus, TodoStatus

Route = Literal["continue", "wait", "user_action_required", "stop"]


def claims_in_window(policy: LoopPolicy, reader: Rows, loop_id: str, now: datetime) -> int:
    """Turns claimed in the policy's rate window ending now (0 without a rate limit)."""
    if policy.rate.window_seconds is None:
        return 0
    since = now - timedelta(seconds=policy.rate.window_seconds)
    return reader.claims_since(loop_id, since)


def nothing_to_claim(loop: LoopRow) -> Reason:
    """Why no todo can be claimed now (`no_eligible_todo`); a loop with no todos says so."""
    if loop.todo_total == 0:
        return Reason(
            ReasonCode.NO_ELIGIBLE_TODO,
            "this loop has no todos: nothing can be claimed until one is added (todo_add)",
        )
    return Reason(ReasonCode.NO_ELIGIBLE_TODO, "no open todo has its dependencies done")


def claim_facts(
    reader: Rows, loop: LoopRow, policy: LoopPolicy, agent: str, now: datetime
) -> ClaimFacts:
    """What the evaluator needs to decide a claim by `agent` now (leases already swept)."""
    window = claims_in_window(policy, reader, loop.loop_id, now)
    return rules.claim_facts(
        loop,
        reader.open_turns(loop.loop_id),
        window,
        agent,
        now,
        policy.claims.lease_seconds,
    )


def route_for(reader: Rows, loop_id: str, agent: str, now: datetime) -> Route:
    """What the agent should do next: continue (a claim would be granted now), wait (later),
    user_action_required (only a human can unblock the loop) or stop (the loop is closed)."""
    loop = reader.loop_row(loop_id)
    if loop is None or loop.status.closed:
        return "stop"
    if loop.status == LoopStatus.PAUSED:
        return "user_action_required"
    policy = reader.policy(loop.policy_digest)
    decision = evaluate_claim(
        policy, claim_facts(reader, loop, policy, agent, now), digest=loop.policy_digest
    )
    eligible = reader.next_eligible_todo(loop_id)
    if decision.allowed and eligible is not None:
        return "continue"
    hard = {ReasonCode.AGENT_NOT_ALLOWED, ReasonCode.DEADLINE_PASSED} | {
        c for c in decision.codes if c.startswith(BUDGET_EXHAUSTED)
    }
    if hard & set(decision.codes):
        return "user_action_required"
    if (
        eligible is None
        and reader.count_open_turns(loop_id) == 0
        and loop.count(TodoStatus.BLOCKED)
    ):
        return "user_action_required"
    return "wait"
