"""`claim`: atomically admit a turn on the next eligible todo, under a lease and a fence."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from loopwarden.clock import format_time
from loopwarden.errors import NotFound
from loopwarden.ledger.events import ClaimRefused, LoopId, TodoId, TurnClaimed
from loopwarden.ledger.store import Txn
from loopwarden.policy import decision as codes
from loopwarden.policy.decision import Decision, Reason
from loopwarden.policy.evaluate import evaluate_claim
from loopwarden.principals import Principal
from loopwarden.tools.common import (
    IDEMPOTENCY_KEY_PATTERN,
    BudgetOut,
    Model,
    ReasonOut,
    Status,
    budgets_out,
    deny,
    dump,
    reasons_out,
    replay,
    request_digest,
    require_loop,
)
from loopwarden.tools.kernel import Kernel
from loopwarden.tools.rules import apply_stop_rules, claim_facts, expire_leases


class ClaimRequest(Model):
    loop_id: LoopId
    todo_id: TodoId | None = Field(
        default=None, description="A specific todo; default: the next eligible."
    )
    idempotency_key: str | None = Field(default=None, pattern=IDEMPOTENCY_KEY_PATTERN)


class ClaimResult(Model):
    granted: bool
    reasons: list[ReasonOut]
    loop_id: str
    status: Status | None = Field(
        description="The loop's status (null for an agent it does not admit)."
    )
    turn_id: str | None = None
    todo_id: str | None = None
    todo_title: str | None = None
    fence: int | None = None
    lease_expires_at: str | None = None
    allowed_tools: list[str] = Field(
        default_factory=list, description="Tool patterns usable this turn."
    )
    approval_tools: list[str] = Field(
        default_factory=list, description="Tool patterns usable only with an approved approval."
    )
    denied_tools: list[str] = Field(default_factory=list, description="Tool patterns never usable.")
    budgets: dict[str, BudgetOut] = Field(default_factory=dict)
    receipt_id: str | None = Field(
        default=None, description="The turn.claimed or claim.refused receipt."
    )


async def claim(kernel: Kernel, who: Principal, req: ClaimRequest) -> ClaimResult:
    """Admit one turn, or refuse it with every reason.

    In one transaction: sweep expired leases (`lease.expired`), apply stop rules, evaluate
    admission (loop active, agent allowed, budgets with open turns counted, rate, lease limits),
    pick the todo (the requested one or the next eligible: open, dependencies done), then seal
    `turn.claimed` with a fresh turn id, fence = todo fence + 1 and the lease expiry. A policy
    refusal is sealed as `claim.refused`; having nothing to claim is a plain result with no
    receipt. `NotFound` for an unknown loop or todo.
    """
    digest = request_digest("claim", req)

    def write(tx: Txn) -> ClaimResult:
        prior = replay(tx, who.id, req.idempotency_key, "claim", digest, ClaimResult)
        loop = require_loop(tx, req.loop_id)
        if prior == "conflict":
            return _refuse(
                tx,
                who,
                req,
                deny(
                    codes.IDEMPOTENCY_CONFLICT, "this idempotency key was used with other arguments"
                ),
            )
        if prior is not None:
            return prior
        if not tx.policy(loop.policy_digest).admits_agent(who.id):
            # An outsider learns nothing about the loop and changes nothing but the journal.
            decision = deny(
                codes.AGENT_NOT_ALLOWED, f"agent {who.id!r} is not in the policy's agents"
            )
            return _remember(tx, who, req, digest, _refuse(tx, who, req, decision, reveal=False))
        expire_leases(tx, loop.loop_id, who)
        apply_stop_rules(tx, loop.loop_id, who)
        loop = require_loop(tx, req.loop_id)
        policy = tx.policy(loop.policy_digest)
        facts = claim_facts(tx, loop, policy, who.id, tx.now_dt, tx.now)
        decision = evaluate_claim(policy, facts, digest=loop.policy_digest)
        if not decision.allowed:
            return _remember(tx, who, req, digest, _refuse(tx, who, req, decision))
        if req.todo_id is not None:
            todo = tx.todo(loop.loop_id, req.todo_id)
            if todo is None:
                raise NotFound(f"loop {loop.loop_id!r} has no todo {req.todo_id!r}")
            if todo.status != "open" or not tx.dependencies_done(loop.loop_id, todo):
                why = f"todo {todo.todo_id!r} is {todo.status}" + (
                    "" if todo.status != "open" else " but its dependencies are not done"
                )
                return _nothing(tx, req, Reason(codes.TODO_NOT_ELIGIBLE, why))
        else:
            todo = tx.next_eligible_todo(loop.loop_id)
            if todo is None:
                return _nothing(
                    tx,
                    req,
                    Reason(codes.NO_ELIGIBLE_TODO, "no open todo has its dependencies done"),
                )
        turn_id = kernel.new_id("turn")
        lease = format_time(tx.now_dt + timedelta(seconds=policy.claims.lease_seconds))
        facts_claimed = TurnClaimed(
            turn_id=turn_id,
            todo_id=todo.todo_id,
            fence=todo.fence + 1,
            lease_expires_at=lease,
            allowed_tools=policy.tools.allow,
            approval_tools=policy.tools.approval,
        )
        sealed = tx.append(
            loop.loop_id,
            "turn.claimed",
            who,
            facts_claimed,
            decision=decision,
            turn_id=turn_id,
            todo_id=todo.todo_id,
            idempotency_key=req.idempotency_key,
        )
        result = ClaimResult(
            granted=True,
            reasons=[],
            loop_id=loop.loop_id,
            status="active",
            turn_id=turn_id,
            todo_id=todo.todo_id,
            todo_title=todo.title,
            fence=facts_claimed.fence,
            lease_expires_at=lease,
            allowed_tools=list(policy.tools.allow),
            approval_tools=list(policy.tools.approval),
            denied_tools=list(policy.tools.deny),
            budgets=budgets_out(policy, sealed.view.loop),
            receipt_id=sealed.receipt_id,
        )
        return _remember(tx, who, req, digest, result)

    return await kernel.store.write(write)


def _refuse(
    tx: Txn, who: Principal, req: ClaimRequest, decision: Decision, *, reveal: bool = True
) -> ClaimResult:
    """Seal `claim.refused`; `reveal=False` (an outsider) leaves the loop's state out."""
    loop = require_loop(tx, req.loop_id)
    sealed = tx.append(
        loop.loop_id,
        "claim.refused",
        who,
        ClaimRefused(todo_id=req.todo_id),
        decision=decision,
        todo_id=req.todo_id,
        idempotency_key=req.idempotency_key,
    )
    return ClaimResult(
        granted=False,
        reasons=reasons_out(decision.reasons),
        loop_id=loop.loop_id,
        status=loop.status if reveal else None,  # type: ignore[arg-type]
        budgets=budgets_out(tx.policy(loop.policy_digest), loop) if reveal else {},
        receipt_id=sealed.receipt_id,
    )


def _nothing(tx: Txn, req: ClaimRequest, reason: Reason) -> ClaimResult:
    """Nothing to claim is not a policy decision: a plain result, no receipt, not remembered."""
    loop = require_loop(tx, req.loop_id)
    return ClaimResult(
        granted=False,
        reasons=reasons_out([reason]),
        loop_id=loop.loop_id,
        status=loop.status,  # type: ignore[arg-type]
        budgets=budgets_out(tx.policy(loop.policy_digest), loop),
    )


def _remember(
    tx: Txn, who: Principal, req: ClaimRequest, digest: str, result: ClaimResult
) -> ClaimResult:
    if req.idempotency_key is not None:
        tx.remember(who.id, req.idempotency_key, "claim", digest, dump(result))
    return result
