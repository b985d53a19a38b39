"""`update`: the agent's self-report that closes a turn — checked, charged, sealed, routed."""

from __future__ import annotations

from pydantic import Field, field_validator

from loopwarden.clock import parse_time
from loopwarden.errors import NotFound
from loopwarden.ledger.events import (
    MAX_EVIDENCE_ITEMS,
    MAX_SUMMARY,
    MAX_TOOLS_USED,
    ApprovalId,
    Evidence,
    Outcome,
    ToolUse,
    TurnId,
    TurnRefused,
    TurnReported,
    Usage,
    check_evidence_size,
)
from loopwarden.ledger.projection import ApprovalRow, TurnRow
from loopwarden.ledger.store import Appended, Txn
from loopwarden.policy import decision as codes
from loopwarden.policy.decision import Decision, Reason
from loopwarden.policy.evaluate import POLICY_VIOLATION, ReportFacts, evaluate_report
from loopwarden.principals import Principal
from loopwarden.tools.common import (
    IDEMPOTENCY_KEY_PATTERN,
    BudgetOut,
    Model,
    ReasonOut,
    Route,
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
from loopwarden.tools.rules import apply_stop_rules, close_loop, expire_leases, route_for


class UpdateRequest(Model):
    turn_id: TurnId
    fence: int = Field(ge=0, le=2**53, description="The fence returned by claim.")
    outcome: Outcome
    tools_used: list[ToolUse] = Field(default_factory=list, max_length=MAX_TOOLS_USED)
    usage: Usage = Field(default_factory=Usage)
    evidence: list[Evidence] = Field(default_factory=list, max_length=MAX_EVIDENCE_ITEMS)
    summary: str = Field(max_length=MAX_SUMMARY)
    failure_signature: str | None = Field(default=None, min_length=1, max_length=200)
    approval_ids: list[ApprovalId] = Field(default_factory=list, max_length=MAX_TOOLS_USED)
    idempotency_key: str = Field(pattern=IDEMPOTENCY_KEY_PATTERN)

    @field_validator("evidence")
    @classmethod
    def _evidence_size(cls, value: list[Evidence]) -> list[Evidence]:
        check_evidence_size(value)
        return value

    @field_validator("tools_used")
    @classmethod
    def _distinct_tools(cls, value: list[ToolUse]) -> list[ToolUse]:
        names = [t.name for t in value]
        if len(set(names)) != len(names):
            raise ValueError("list each tool once, with its count")
        return value


class UpdateResult(Model):
    accepted: bool
    reasons: list[ReasonOut]
    route: Route = Field(description="continue | wait | user_action_required | stop")
    status: Status | None = Field(description="The loop's status (null if the turn is not yours).")
    stop_reason: str | None
    loop_id: str
    turn_id: str
    todo_status: str | None = Field(description="The todo's status after this update.")
    receipt_id: str
    seq: int
    digest: str
    budgets: dict[str, BudgetOut] = Field(
        description="Every budget after this update (empty if the turn is not yours)."
    )


def _report(req: UpdateRequest, turn: TurnRow) -> dict:
    return dict(
        turn_id=turn.turn_id,
        todo_id=turn.todo_id,
        fence=req.fence,
        outcome=req.outcome,
        tools_used=tuple(req.tools_used),
        usage=req.usage,
        evidence=tuple(req.evidence),
        summary=req.summary,
        failure_signature=req.failure_signature,
        approval_ids=tuple(dict.fromkeys(req.approval_ids)),
    )


def _check_approvals(
    req: UpdateRequest, turn: TurnRow, approvals: dict[str, ApprovalRow], now: str
) -> tuple[frozenset[str], tuple[Reason, ...]]:
    """Tools covered by the cited approvals, and what is wrong with any cited approval.

    An approval covers its tool for the turn that requested it, once: it must be approved, not
    expired, not consumed, and if it is bound to an artifact digest, the report's evidence must
    carry that digest.
    """
    covered, problems = set(), []
    digests = {e.digest for e in req.evidence if e.digest}
    for approval_id in dict.fromkeys(req.approval_ids):
        approval = approvals.get(approval_id)
        problem = None
        if approval is None or approval.turn_id != turn.turn_id:
            problem = "does not exist for this turn"
        elif approval.status != "approved":
            problem = f"is {approval.status}"
        elif approval.expires_at is not None and now >= approval.expires_at:
            problem = f"expired at {approval.expires_at}"
        elif approval.artifact_digest and approval.artifact_digest not in digests:
            problem = (
                f"is bound to artifact {approval.artifact_digest}, which no evidence item carries"
            )
        if problem:
            problems.append(Reason(codes.APPROVAL_INVALID, f"approval {approval_id} {problem}"))
        else:
            covered.add(approval.tool)  # type: ignore[union-attr]
    return frozenset(covered), tuple(problems)


async def update(kernel: Kernel, who: Principal, req: UpdateRequest) -> UpdateResult:
    """Close a turn with the agent's report.

    Idempotent: the same principal, key and arguments return the original result; the same key
    with other arguments is refused (`idempotency_conflict`, nothing charged). Otherwise, in
    one transaction:
    - the caller must own the turn (`not_turn_owner`: refused and sealed, nothing charged, and
      the answer says nothing about the loop);
    - every other refusal is charged: the usage in a report happened, whatever is wrong with
      the report, so budgets always hold. A corrected report for a turn that stays open
      carries only the usage since the refused one;
    - a tool violation (a denied or not-allowed tool, or an approval-gated tool without a valid
      cited approval) closes the turn if it is still open, releases its todo, and with
      `on_violation = "stop_loop"` stops the loop (`policy_violation`) — whatever else is
      wrong with the report (a stale fence does not hide a violation);
    - a closed turn, a stale fence or an expired lease (`turn_closed`, `stale_fence`,
      `lease_expired`; an expired lease is released first), or completing without required
      evidence (`evidence_required`), is refused; the turn, if still open, stays open;
    - else `turn.reported`: usage charged, the todo moves per outcome, approvals consumed.
    Then the stop rules run, and the result carries the route for the next turn.
    `NotFound` for an unknown turn.
    """
    digest = request_digest("update", req)

    def write(tx: Txn) -> UpdateResult:
        turn = tx.turn(req.turn_id)
        if turn is None:
            raise NotFound(f"no turn with id {req.turn_id!r}")
        prior = replay(tx, who.id, req.idempotency_key, "update", digest, UpdateResult)
        if prior == "conflict":
            decision = deny(
                codes.IDEMPOTENCY_CONFLICT, "this idempotency key was used with other arguments"
            )
            return _refused(tx, who, req, turn, decision, charged=False, closes=False)
        if prior is not None:
            return prior
        if turn.agent != who.id:
            result = _foreign(tx, who, req, turn)
            tx.remember(who.id, req.idempotency_key, "update", digest, dump(result))
            return result
        loop = require_loop(tx, turn.loop_id)
        policy = tx.policy(loop.policy_digest)
        todo = tx.todo(loop.loop_id, turn.todo_id)
        approvals = tx.approvals(req.approval_ids)
        covered, problems = _check_approvals(req, turn, approvals, tx.now)
        decision = evaluate_report(
            policy,
            ReportFacts(
                agent=who.id,
                loop_status=loop.status,
                turn_agent=turn.agent,
                turn_status=turn.status,
                turn_fence=turn.fence,
                todo_fence=todo.fence if todo else -1,
                given_fence=req.fence,
                lease_expires_at=parse_time(turn.lease_expires_at),
                now=tx.now_dt,
                outcome=req.outcome,
                has_evidence=bool(req.evidence),
                tools=tuple(t.name for t in req.tools_used),
                approved_tools=covered,
                approval_problems=problems,
            ),
            digest=loop.policy_digest,
        )
        if decision.allowed:
            result = _accepted(tx, who, req, turn, decision)
        else:
            result = _handle_refusal(tx, who, req, turn, decision, policy.stop.on_violation)
        tx.remember(who.id, req.idempotency_key, "update", digest, dump(result))
        return result

    return await kernel.store.write(write)


def _handle_refusal(
    tx: Txn,
    who: Principal,
    req: UpdateRequest,
    turn: TurnRow,
    decision: Decision,
    on_violation: str,
) -> UpdateResult:
    """Every refusal of the owner's report is charged; a violation also closes the turn (if
    still open) and applies `on_violation`."""
    found = set(decision.codes)
    if codes.LEASE_EXPIRED in found:
        expire_leases(tx, turn.loop_id, who)  # releases this turn (and any other stale one)
    still_open = (tx.turn(turn.turn_id) or turn).status == "open"
    violation = bool(found & codes.VIOLATIONS)
    sealed = _seal_refusal(
        tx, who, req, turn, decision, charged=True, closes=violation and still_open
    )
    if violation and on_violation == "stop_loop":
        loop = require_loop(tx, turn.loop_id)
        if loop.status not in ("stopped", "completed", "cancelled"):
            reason = Reason(POLICY_VIOLATION, "; ".join(r.message for r in decision.reasons))
            close_loop(tx, turn.loop_id, who, "loop.stopped", reason)
    return _result(tx, who, turn, False, decision, sealed)


def _foreign(tx: Txn, who: Principal, req: UpdateRequest, turn: TurnRow) -> UpdateResult:
    """A report on another agent's turn: sealed as a refusal, nothing charged, nothing swept,
    and nothing about the loop in the answer (the caller may not even be admitted to it)."""
    decision = deny(codes.NOT_TURN_OWNER, "this turn belongs to another agent")
    sealed = _seal_refusal(tx, who, req, turn, decision, charged=False, closes=False)
    return UpdateResult(
        accepted=False,
        reasons=reasons_out(decision.reasons),
        route="stop",
        status=None,
        stop_reason=None,
        loop_id=turn.loop_id,
        turn_id=turn.turn_id,
        todo_status=None,
        receipt_id=sealed.receipt_id,
        seq=sealed.seq,
        digest=sealed.sealed.digest,
        budgets={},
    )


def _seal_refusal(
    tx: Txn,
    who: Principal,
    req: UpdateRequest,
    turn: TurnRow,
    decision: Decision,
    *,
    charged: bool,
    closes: bool,
) -> Appended:
    return tx.append(
        turn.loop_id,
        "turn.refused",
        who,
        TurnRefused(**_report(req, turn), charged=charged, closes_turn=closes),
        decision=decision,
        turn_id=turn.turn_id,
        todo_id=turn.todo_id,
        idempotency_key=req.idempotency_key,
    )


def _refused(
    tx: Txn,
    who: Principal,
    req: UpdateRequest,
    turn: TurnRow,
    decision: Decision,
    *,
    charged: bool,
    closes: bool,
) -> UpdateResult:
    sealed = _seal_refusal(tx, who, req, turn, decision, charged=charged, closes=closes)
    return _result(tx, who, turn, False, decision, sealed)


def _accepted(
    tx: Txn, who: Principal, req: UpdateRequest, turn: TurnRow, decision: Decision
) -> UpdateResult:
    sealed = tx.append(
        turn.loop_id,
        "turn.reported",
        who,
        TurnReported(**_report(req, turn)),
        decision=decision,
        turn_id=turn.turn_id,
        todo_id=turn.todo_id,
        idempotency_key=req.idempotency_key,
    )
    return _result(tx, who, turn, True, decision, sealed)


def _result(
    tx: Txn, who: Principal, turn: TurnRow, accepted: bool, decision: Decision, sealed: Appended
) -> UpdateResult:
    """After the report's receipt: the stop rules (usage may have been charged), then the
    answer. Other agents' stale leases are released first, so the route sees what a claim
    would see."""
    expire_leases(tx, turn.loop_id, who)
    apply_stop_rules(tx, turn.loop_id, who)
    loop = require_loop(tx, turn.loop_id)
    todo = tx.todo(turn.loop_id, turn.todo_id)
    return UpdateResult(
        accepted=accepted,
        reasons=reasons_out(decision.reasons),
        route=route_for(tx, turn.loop_id, who.id, tx.now_dt, tx.now),
        status=loop.status,  # type: ignore[arg-type]
        stop_reason=loop.stop_reason,
        loop_id=turn.loop_id,
        turn_id=turn.turn_id,
        todo_status=todo.status if todo else None,
        receipt_id=sealed.receipt_id,
        seq=sealed.seq,
        digest=sealed.sealed.digest,
        budgets=budgets_out(tx.policy(loop.policy_digest), loop),
    )
