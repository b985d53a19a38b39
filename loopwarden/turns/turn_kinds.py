"""Turns: claimed (or a claim refused), leases renewed and expired, reports accepted or refused."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from loopwarden.kernel.state import facts as rules
from loopwarden.kernel.state.charges import pool_refs
from loopwarden.kernel.state.events import (
    Count,
    Fact,
    PoolRef,
    ReceiptBody,
    ReceiptKind,
    Timestamp,
    TodoId,
    TurnId,
    TurnRefused,
    TurnReport,
)
from loopwarden.kernel.state.fold import (
    FoldError,
    charge,
    charge_calls,
    close_turn,
    next_slot,
    open_turn,
    release,
    row_of,
    set_todo,
)
from loopwarden.kernel.state.legality import (
    Judging,
    Owed,
    Verdict,
    VerdictRule,
    approvals_as_found,
    calls_charged,
    charged,
    claim_facts,
    codes_of,
    model_observed,
    pool_codes,
    refusal_rule,
    report_codes,
    same,
    turn_problems,
    verdicts,
)
from loopwarden.kernel.state.rows import LoopView, TodoRow, Touched, TurnRow, replace
from loopwarden.kernel.state.spec import AGENTS, KindSpec, touching
from loopwarden.policy.budgets import Totals
from loopwarden.policy.decision import VIOLATIONS
from loopwarden.policy.evaluate import evaluate_claim, evaluate_stop
from loopwarden.statuses import ApprovalStatus, TodoStatus, TurnStatus


class TurnClaimed(Fact):
    turn_id: TurnId
    todo_id: TodoId
    fence: int = Field(ge=1)
    lease_expires_at: Timestamp
    allowed_tools: tuple[str, ...]
    approval_tools: tuple[str, ...]
    # The budget pools the turn draws from (absent when none, and before pools existed).
    pools: tuple[PoolRef, ...] | None = None


class ClaimRefused(Fact):
    todo_id: TodoId | None = None


class LeaseRenewed(Fact):
    turn_id: TurnId
    todo_id: TodoId
    lease_expires_at: Timestamp


class LeaseExpired(Fact):
    turn_id: TurnId
    todo_id: TodoId
    lease_expires_at: Timestamp
    # The calls the host observed in the turn beyond what it was charged (absent before 0.2.0).
    tool_calls_charged: Count | None = None


class TurnReported(TurnReport):
    pass


# --- turn.claimed ------------------------------------------------------------------------------


_touches_todo = touching(todos="todo_id")


def charges_refusal(view: LoopView, data: TurnRefused) -> bool:
    """Whether the owner's refused report is charged: always in receipts of 0.1.x; since
    0.2.0, unless its turn is settled (a report's usage already charged on the closed turn)."""
    turn = view.turns.get(data.turn_id)
    return data.tool_calls_before is None or turn is None or not turn.settled


def _claimed(view: LoopView, body: ReceiptBody, f: TurnClaimed) -> None:
    todo: TodoRow = row_of(view.todos, f.todo_id, "todo")
    if todo.status != TodoStatus.OPEN:
        raise FoldError(f"todo {f.todo_id!r} is {todo.status}, not open: it cannot be claimed")
    if f.fence != todo.fence + 1:
        raise FoldError(f"the claim's fence {f.fence} does not follow todo fence {todo.fence}")
    if f.turn_id in view.loop.open_turns:
        raise FoldError(f"turn {f.turn_id!r} is claimed twice")
    set_todo(view, todo, status=TodoStatus.CLAIMED, fence=f.fence, turn_id=f.turn_id)
    totals = view.loop.totals.plus(Totals(turns=1))
    view.turns[f.turn_id] = TurnRow(
        turn_id=f.turn_id,
        loop_id=view.loop.loop_id,
        todo_id=f.todo_id,
        agent=body.principal.id,
        fence=f.fence,
        status=TurnStatus.OPEN,
        claimed_at=body.at,
        lease_expires_at=f.lease_expires_at,
        closed_at=None,
        outcome=None,
        slot=next_slot(view),
        number=totals.turns,
        pools=tuple(ref.name for ref in f.pools or ()),
    )
    view.loop = replace(view.loop, totals=totals, open_turns=(*view.loop.open_turns, f.turn_id))


def _judge_pools(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: TurnClaimed
) -> list[Verdict]:
    """A grant its pools refuse, or one that records other pools than it drew from."""
    if ctx.pools is None:
        return []
    denied = pool_codes(ctx, view, body) or ()
    if denied:
        return verdicts(denied, "granted")
    if data.pools != pool_refs(ctx.pools, view.policy, body.principal.id):
        return [Verdict(VerdictRule.POOL_TERMS, "the grant records other pools than it drew from")]
    return []


def _judge_claimed(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: TurnClaimed
) -> list[Verdict]:
    policy, at = view.policy, body.at
    if body.decision.effect != "allow":
        return [Verdict(VerdictRule.EFFECT, "a grant records a deny")]
    if any(view.turns[t].lease_expires_at < at for t in view.loop.open_turns):
        return [
            Verdict(VerdictRule.LEASE_NOT_SWEPT, "granted while an expired lease was still held")
        ]
    due = evaluate_stop(policy, rules.stop_facts(view.loop, at))
    if due is not None:
        return [Verdict(VerdictRule.STOP_DUE, f"granted although {due.code} had fired")]
    denied = evaluate_claim(policy, claim_facts(ctx.record, view, body), digest="").codes
    if denied:
        return verdicts(denied, "granted")
    pooled = _judge_pools(ctx, view, body, data)
    if pooled:
        return pooled
    todo = view.todos[data.todo_id]
    if todo.status != TodoStatus.OPEN:
        return [
            Verdict(
                VerdictRule.TODO_NOT_ELIGIBLE, f"todo {todo.todo_id} claimed while {todo.status}"
            )
        ]
    undone = [d for d in todo.depends_on if view.todos[d].status != TodoStatus.DONE]
    if undone:
        return [
            Verdict(
                VerdictRule.TODO_NOT_ELIGIBLE,
                f"todo {todo.todo_id} claimed before {', '.join(undone)}",
            )
        ]
    lease = at + timedelta(seconds=policy.claims.lease_seconds)
    terms = (data.lease_expires_at, data.allowed_tools, data.approval_tools)
    if terms != (lease, policy.tools.allow, policy.tools.approval):
        return [
            Verdict(VerdictRule.GRANT_TERMS, "the lease or the tools granted are not the policy's")
        ]
    return []


def _remember_claim(ctx: Judging, view: LoopView, body: ReceiptBody, data: TurnClaimed) -> None:
    ctx.remember_claim(body.at)


# --- claim.refused -----------------------------------------------------------------------------


def _noop(view: LoopView, body: ReceiptBody, data: object) -> None:
    return None


@refusal_rule
def _judge_claim_refused(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: ClaimRefused, turn: TurnRow | None
) -> list[Verdict]:
    expected = evaluate_claim(view.policy, claim_facts(ctx.record, view, body), digest="").codes
    pooled = pool_codes(ctx, view, body)
    if pooled is None:  # pools not replayed: their reasons cannot be judged, the rest can
        recorded = codes_of(body)
        pooled = tuple(code for code in recorded if code.startswith("pool_"))
    return same(body, expected + pooled, "claim")


# --- leases ------------------------------------------------------------------------------------


_touches_turn = touching(todos="todo_id", turns="turn_id")


def _renewed(view: LoopView, body: ReceiptBody, f: LeaseRenewed) -> None:
    view.turns[f.turn_id] = replace(open_turn(view, f.turn_id), lease_expires_at=f.lease_expires_at)


def _judge_renewed(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: LeaseRenewed
) -> list[Verdict]:
    reasons = turn_problems(view, view.turns[data.turn_id], body)
    if reasons:
        return verdicts(tuple(r.code for r in reasons), "lease renewed")
    lease = body.at + timedelta(seconds=view.policy.claims.lease_seconds)
    return (
        []
        if data.lease_expires_at == lease
        else [Verdict(VerdictRule.GRANT_TERMS, "the renewed lease is not the policy's")]
    )


def _expired(view: LoopView, body: ReceiptBody, f: LeaseExpired) -> None:
    charge_calls(view, f.turn_id, f.tool_calls_charged or 0)
    close_turn(view, f.turn_id, TurnStatus.EXPIRED, body.at)
    release(view, f.todo_id, failed=True)


def _judge_expired(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: LeaseExpired
) -> list[Verdict]:
    turn = view.turns[data.turn_id]
    ctx.record.swept[data.turn_id] = turn  # the turn as a refusal right after may have seen it
    if turn.lease_expires_at >= body.at or data.lease_expires_at != turn.lease_expires_at:
        return [
            Verdict(VerdictRule.LEASE_LIVE, f"turn {turn.turn_id} was expired while its lease held")
        ]
    return calls_charged(turn, data.tool_calls_charged)


# --- reports -----------------------------------------------------------------------------------


def _touches_report(body: ReceiptBody, data: TurnReport) -> Touched:
    return Touched(
        todos=frozenset([data.todo_id]),
        turns=frozenset([data.turn_id]),
        approvals=frozenset((*data.approval_ids, *(data.approvals_found or ()))),
    )


def _consume(view: LoopView, approval_id: str, turn_id: str) -> None:
    approval = row_of(view.approvals, approval_id, "approval")
    if approval.status != ApprovalStatus.APPROVED or approval.turn_id != turn_id:
        raise FoldError(f"approval {approval_id} is {approval.status} and cannot cover this turn")
    view.approvals[approval_id] = replace(
        approval, status=ApprovalStatus.CONSUMED, consumed_by=turn_id
    )


def _reported(view: LoopView, body: ReceiptBody, f: TurnReported) -> None:
    todo: TodoRow = row_of(view.todos, f.todo_id, "todo")
    if todo.status != TodoStatus.CLAIMED or todo.turn_id != f.turn_id:
        raise FoldError(f"todo {f.todo_id!r} is not held by turn {f.turn_id}")
    charge(view, f)
    closed = close_turn(view, f.turn_id, TurnStatus.REPORTED, body.at, f.outcome)
    reported = {t.name: t.count for t in f.tools_used}
    view.turns[f.turn_id] = replace(closed, reported=reported, settled=True)
    if f.outcome == "completed":
        set_todo(view, todo, status=TodoStatus.DONE)
    elif f.outcome == "blocked":
        set_todo(view, todo, status=TodoStatus.BLOCKED)
    else:
        release(view, f.todo_id, failed=f.outcome == "failed")
    loop = view.loop
    if f.outcome == "failed" and f.failure_signature:
        streak = loop.failure_streak + 1 if loop.failure_signature == f.failure_signature else 1
        view.loop = replace(loop, failure_signature=f.failure_signature, failure_streak=streak)
    else:
        view.loop = replace(loop, failure_signature=None, failure_streak=0)
    for approval_id in (*f.approval_ids, *(f.approvals_found or ())):
        _consume(view, approval_id, f.turn_id)


def _judge_reported(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: TurnReported
) -> list[Verdict]:
    if body.decision.effect != "allow":
        return [Verdict(VerdictRule.EFFECT, "an accepted report records a deny")]
    found = report_codes(view, body, data, view.turns[data.turn_id])
    return (
        verdicts(found, "accepted")
        + charged(view, body, data)
        + approvals_as_found(view, body, data)
        + model_observed(view, body, data)
    )


def _refused(view: LoopView, body: ReceiptBody, f: TurnRefused) -> None:
    if f.charged:
        charge(view, f)
    if f.closes_turn:
        close_turn(view, f.turn_id, TurnStatus.REFUSED, body.at, f.outcome)
        release(view, f.todo_id, failed=True)
    turn = view.turns.get(f.turn_id)
    if f.charged and turn is not None and turn.status != TurnStatus.OPEN:
        view.turns[f.turn_id] = replace(turn, settled=True)  # its usage is charged: once


@refusal_rule
def _refusal_rules(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: TurnRefused, turn: TurnRow | None
) -> list[Verdict]:
    if turn is None:
        return [Verdict(VerdictRule.UNKNOWN_TURN, "a refused report names no turn of the loop")]
    uncharged = (
        []
        if data.charged == charges_refusal(view, data)
        else [
            Verdict(
                VerdictRule.CHARGED,
                "the owner's refused report was not charged"
                if data.charged
                else "a refused report on a settled turn was charged again",
            )
        ]
    )
    found = same(body, report_codes(view, body, data, turn), "report")
    return found + uncharged + approvals_as_found(view, body, data)


def _judge_refused(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: TurnRefused
) -> list[Verdict]:
    """The refusal's own rules, and in every case whether its charge is right."""
    return (
        _refusal_rules(ctx, view, body, data)
        + charged(view, body, data)
        + model_observed(view, body, data)
    )


def _remember_report(ctx: Judging, view: LoopView, body: ReceiptBody, data: TurnReport) -> None:
    """A report by the turn's owner owes the stop its violation or the stop rules call for."""
    if data.turn_id not in view.turns or body.principal.id != view.turns[body.turn_id or ""].agent:
        return
    violation = isinstance(data, TurnRefused) and bool(codes_of(body) & VIOLATIONS)
    stops = view.policy.stop.on_violation == "stop_loop" and not view.loop.status.closed
    ctx.record.owed = Owed("violation" if violation and stops else "stop_rules", body.at)


SPECS = (
    KindSpec(
        ReceiptKind.TURN_CLAIMED,
        TurnClaimed,
        callers=AGENTS,
        touches=_touches_todo,
        fold=_claimed,
        judge=_judge_claimed,
        remember=_remember_claim,
    ),
    KindSpec(
        ReceiptKind.CLAIM_REFUSED,
        ClaimRefused,
        callers=AGENTS,
        fold=_noop,
        judge=_judge_claim_refused,
        refusal=True,
    ),
    KindSpec(
        ReceiptKind.LEASE_RENEWED,
        LeaseRenewed,
        callers=AGENTS,
        touches=_touches_turn,
        fold=_renewed,
        judge=_judge_renewed,
    ),
    KindSpec(
        ReceiptKind.LEASE_EXPIRED,
        LeaseExpired,
        callers=AGENTS,
        touches=_touches_turn,
        fold=_expired,
        judge=_judge_expired,
        sweeps=True,
    ),
    KindSpec(
        ReceiptKind.TURN_REPORTED,
        TurnReported,
        callers=AGENTS,
        touches=_touches_report,
        fold=_reported,
        judge=_judge_reported,
        remember=_remember_report,
    ),
    KindSpec(
        ReceiptKind.TURN_REFUSED,
        TurnRefused,
        callers=AGENTS,
        touches=_touches_report,
        fold=_refused,
        judge=_judge_refused,
        remember=_remember_report,
        refusal=True,
    ),
)
