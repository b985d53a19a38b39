"""`claim`: atomically admit a turn on the next eligible todo, under a lease and a fence."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from loopwarden.errors import NotFound
from loopwarden.kernel.runner.operation import Call
from loopwarden.kernel.runner.results import BudgetOut, Model, ReasonOut, budgets_out, reasons_out
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import by_loop
from loopwarden.kernel.state.charges import claim_reasons, pool_refs
from loopwarden.kernel.state.events import (
    LoopId,
    OptionalKey,
    ReceiptKind,
    Timestamp,
    TodoId,
    new_id,
)
from loopwarden.kernel.state.rows import LoopRow, TodoRow
from loopwarden.kernel.store.store import Txn
from loopwarden.loops.stops import apply_stop_rules
from loopwarden.policy.decision import Decision, Reason, ReasonCode
from loopwarden.policy.evaluate import evaluate_claim
from loopwarden.policy.model import LoopPolicy
from loopwarden.statuses import LoopStatus, TodoStatus
from loopwarden.turns.admission import claim_facts, nothing_to_claim
from loopwarden.turns.leases import expire_leases, sweep_pools
from loopwarden.turns.turn_kinds import ClaimRefused, TurnClaimed


class ClaimRequest(Model):
    loop_id: LoopId
    todo_id: TodoId | None = Field(
        default=None, description="A specific todo to claim; omit for the next eligible one."
    )
    idempotency_key: OptionalKey = None


class ClaimResult(Model):
    granted: bool
    reasons: list[ReasonOut]
    loop_id: str
    status: LoopStatus | None = Field(description="The loop's status.")
    turn_id: str | None = None
    todo_id: str | None = None
    todo_title: str | None = None
    fence: int | None = None
    lease_expires_at: Timestamp | None = None
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


def _refuse(call: Call[Txn], req: ClaimRequest, decision: Decision) -> ClaimResult:
    """Seal `claim.refused` with every reason."""
    loop = call.loop
    sealed = call.tx.append(
        loop.loop_id,
        ReceiptKind.CLAIM_REFUSED,
        call.who,
        ClaimRefused(todo_id=req.todo_id),
        decision=decision,
        todo_id=req.todo_id,
        idempotency_key=req.idempotency_key,
    )
    return ClaimResult(
        granted=False,
        reasons=reasons_out(decision.reasons),
        loop_id=loop.loop_id,
        status=loop.status,
        budgets=budgets_out(call.tx.rows.policy(loop.policy_digest), loop),
        receipt_id=sealed.receipt_id,
    )


def _pick(tx: Txn, loop: LoopRow, req: ClaimRequest) -> TodoRow | Reason:
    """The requested todo if it is eligible, else the next eligible one; a reason if none."""
    if req.todo_id is None:
        todo = tx.rows.next_eligible_todo(loop.loop_id)
        if todo is None:
            return nothing_to_claim(loop)
        return todo
    todo = tx.rows.todo(loop.loop_id, req.todo_id)
    if todo is None:
        raise NotFound(f"loop {loop.loop_id!r} has no todo {req.todo_id!r}")
    if todo.status != TodoStatus.OPEN:
        return Reason(ReasonCode.TODO_NOT_ELIGIBLE, f"todo {todo.todo_id!r} is {todo.status}")
    if not tx.rows.dependencies_done(loop.loop_id, todo):
        why = f"todo {todo.todo_id!r} is open but its dependencies are not done"
        return Reason(ReasonCode.TODO_NOT_ELIGIBLE, why)
    return todo


def _nothing(call: Call[Txn], reason: Reason) -> ClaimResult:
    """Nothing to claim is not a policy decision: a plain result, no receipt, not remembered."""
    loop = call.loop
    return ClaimResult(
        granted=False,
        reasons=reasons_out([reason]),
        loop_id=loop.loop_id,
        status=loop.status,
        budgets=budgets_out(call.tx.rows.policy(loop.policy_digest), loop),
    )


@operation(
    access="write",
    scope=by_loop,
    refuse=_refuse,
    remember=lambda result: result.receipt_id is not None,
)
def claim(call: Call[Txn], req: ClaimRequest) -> ClaimResult:
    """Start a turn: claim the next eligible todo under a lease before doing any work.

    If `granted`, work only on `todo_id`, use only `allowed_tools` (and `approval_tools` with an
    approved approval), finish before `lease_expires_at` (or call heartbeat), then report with
    update using `turn_id` and `fence`. If not granted, `reasons` say why; do not retry in a
    tight loop.

    \f
    Admit one turn, or refuse it with every reason.

    In one transaction: sweep expired leases (`lease.expired`), apply stop rules, evaluate
    admission (loop active, agent allowed, budgets with open turns counted, rate, lease limits,
    and every budget pool it draws from: not paused, budget left in its window, a turn free),
    pick the todo (the requested one or the next eligible: open, dependencies done), then seal
    `turn.claimed` with a fresh turn id, fence = todo fence + 1 and the lease expiry. A policy
    refusal is sealed as `claim.refused`; having nothing to claim is a plain result with no
    receipt. `NotFound` for an unknown todo.
    """
    tx, who = call.tx, call.who
    loop_id = call.loop.loop_id
    expire_leases(tx, loop_id, who)
    apply_stop_rules(tx, loop_id, who)
    loop = call.loop
    policy = tx.rows.policy(loop.policy_digest)
    decision = evaluate_claim(
        policy, claim_facts(tx.rows, loop, policy, who.id, tx.now), digest=loop.policy_digest
    )
    sweep_pools(tx, policy, who)  # a full pool's turns whose leases ran out, in any loop
    pooled = claim_reasons(tx.rows, policy, who.id, tx.now)  # the pools it draws from have room?
    if pooled:
        decision = Decision("deny", (*decision.reasons, *pooled), decision.policy_digest)
    if not decision.allowed:
        return _refuse(call, req, decision)
    todo = _pick(tx, loop, req)
    if isinstance(todo, Reason):
        return _nothing(call, todo)
    return _grant(call, req, todo, policy, decision)


def _grant(
    call: Call[Txn], req: ClaimRequest, todo: TodoRow, policy: LoopPolicy, decision: Decision
) -> ClaimResult:
    """Seal `turn.claimed` on `todo`: a fresh turn id, the next fence, the lease."""
    tx, loop_id = call.tx, call.loop.loop_id
    turn_id = new_id("turn")
    lease = tx.now + timedelta(seconds=policy.claims.lease_seconds)
    claimed = TurnClaimed(
        turn_id=turn_id,
        todo_id=todo.todo_id,
        fence=todo.fence + 1,
        lease_expires_at=lease,
        allowed_tools=policy.tools.allow,
        approval_tools=policy.tools.approval,
        pools=pool_refs(tx.rows, policy, call.who.id),
    )
    sealed = tx.append(
        loop_id,
        ReceiptKind.TURN_CLAIMED,
        call.who,
        claimed,
        decision=decision,
        turn_id=turn_id,
        todo_id=todo.todo_id,
        idempotency_key=req.idempotency_key,
    )
    return ClaimResult(
        granted=True,
        reasons=[],
        loop_id=loop_id,
        status=LoopStatus.ACTIVE,
        turn_id=turn_id,
        todo_id=todo.todo_id,
        todo_title=todo.title,
        fence=claimed.fence,
        lease_expires_at=lease,
        allowed_tools=list(policy.tools.allow),
        approval_tools=list(policy.tools.approval),
        denied_tools=list(policy.tools.deny),
        budgets=budgets_out(policy, sealed.view.loop),
        receipt_id=sealed.receipt_id,
    )
