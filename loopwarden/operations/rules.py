"""Rules every mutating operation applies inside its transaction: lease expiry, stop rules,
claim admission facts, and the route an agent should take next."""

from __future__ import annotations

from datetime import datetime

from loopwarden.ledger.events import ClosedTurn, LeaseExpired, LoopStopped
from loopwarden.ledger.projection import LoopRow
from loopwarden.ledger.reader import Reader
from loopwarden.ledger.store import Appended, Txn
from loopwarden.policy import decision as codes
from loopwarden.policy.decision import Decision, Reason
from loopwarden.policy.evaluate import (
    ALL_TODOS_DONE,
    CLOSED_STATUSES,
    ClaimFacts,
    StopFacts,
    evaluate_claim,
    evaluate_stop,
)
from loopwarden.policy.model import LoopPolicy
from loopwarden.principals import Principal
from loopwarden.tools.common import Route, claims_in_window


def expire_leases(tx: Txn, loop_id: str, who: Principal) -> list[Appended]:
    """Seal `lease.expired` for every open turn of the loop whose lease has run out."""
    sealed = []
    for turn in tx.expired_turns(loop_id, tx.now):
        sealed.append(
            tx.append(
                loop_id,
                "lease.expired",
                who,
                LeaseExpired(
                    turn_id=turn.turn_id,
                    todo_id=turn.todo_id,
                    lease_expires_at=turn.lease_expires_at,
                ),
                decision=Decision(
                    "allow",
                    (
                        Reason(
                            codes.LEASE_EXPIRED, f"the lease of {turn.agent} ran out; todo released"
                        ),
                    ),
                ),
                turn_id=turn.turn_id,
                todo_id=turn.todo_id,
            )
        )
    return sealed


def close_loop(tx: Txn, loop_id: str, who: Principal, kind: str, reason: Reason) -> Appended:
    """Seal `loop.stopped` / `loop.completed` / `loop.cancelled`, closing every open turn."""
    closed = tuple(
        ClosedTurn(turn_id=t.turn_id, todo_id=t.todo_id) for t in tx.loop_turns(loop_id, "open")
    )
    effect = "allow" if reason.code == ALL_TODOS_DONE else "deny"
    return tx.append(
        loop_id,
        kind,
        who,
        LoopStopped(reason=reason.code, detail=reason.message, closed_turns=closed),
        decision=Decision(effect, (reason,)),
    )


def stop_facts(reader: Reader, loop: LoopRow, now: datetime) -> StopFacts:
    return StopFacts(
        status=loop.status,
        totals=loop.totals,
        open_turns=reader.count_open_turns(loop.loop_id),
        todos_total=loop.todo_total,
        todos_done=loop.count("done"),
        failure_streak=loop.failure_streak,
        now=now,
    )


def apply_stop_rules(tx: Txn, loop_id: str, who: Principal) -> Appended | None:
    """Evaluate the stop rules on the loop as it stands in this transaction; seal the stop."""
    loop = tx.loop_row(loop_id)
    if loop is None or loop.status in CLOSED_STATUSES:
        return None
    reason = evaluate_stop(tx.policy(loop.policy_digest), stop_facts(tx, loop, tx.now_dt))
    if reason is None:
        return None
    kind = "loop.completed" if reason.code == ALL_TODOS_DONE else "loop.stopped"
    return close_loop(tx, loop_id, who, kind, reason)


def claim_facts(
    reader: Reader, loop: LoopRow, policy: LoopPolicy, agent: str, now: datetime, now_text: str
) -> ClaimFacts:
    return ClaimFacts(
        agent=agent,
        status=loop.status,
        now=now,
        totals=loop.totals,
        active=reader.count_live_turns(loop.loop_id, now_text),
        active_for_agent=reader.count_live_turns(loop.loop_id, now_text, agent),
        claims_in_window=claims_in_window(policy, reader, loop.loop_id, now),
    )


def route_for(reader: Reader, loop_id: str, agent: str, now: datetime, now_text: str) -> Route:
    """What the agent should do next: continue (a claim would be granted now), wait (later),
    user_action_required (only a human can unblock the loop) or stop (the loop is closed)."""
    loop = reader.loop_row(loop_id)
    if loop is None or loop.status in CLOSED_STATUSES:
        return "stop"
    if loop.status == "paused":
        return "user_action_required"
    policy = reader.policy(loop.policy_digest)
    decision = evaluate_claim(
        policy, claim_facts(reader, loop, policy, agent, now, now_text), digest=loop.policy_digest
    )
    eligible = reader.next_eligible_todo(loop_id)
    if decision.allowed and eligible is not None:
        return "continue"
    hard = {codes.AGENT_NOT_ALLOWED, codes.DEADLINE_PASSED} | {
        c for c in decision.codes if c.startswith(codes.BUDGET_EXHAUSTED)
    }
    if hard & set(decision.codes):
        return "user_action_required"
    if eligible is None and reader.count_open_turns(loop_id) == 0 and loop.count("blocked"):
        return "user_action_required"
    return "wait"
