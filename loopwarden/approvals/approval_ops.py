"""Approvals: an agent asks to use an approval-gated tool for its turn; an operator decides; a
report cites the approval, which then covers that tool once."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from loopwarden.approvals.approval_kinds import ApprovalDecided, ApprovalRequested
from loopwarden.errors import Conflict
from loopwarden.kernel.runner.operation import OPERATOR_CALLERS, Call
from loopwarden.kernel.runner.refusals import refuse_on_turn
from loopwarden.kernel.runner.results import Model, ReasonOut, from_row, reasons_out
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import by_approval, by_turn
from loopwarden.kernel.state.events import (
    MAX_SUMMARY,
    ApprovalId,
    Digest,
    Fence,
    LoopId,
    OptionalKey,
    ReceiptKind,
    Timestamp,
    ToolName,
    TurnId,
    new_id,
)
from loopwarden.kernel.state.rows import Approval
from loopwarden.kernel.store.reader import Reader
from loopwarden.kernel.store.store import Txn
from loopwarden.policy.decision import Decision, Reason, ReasonCode
from loopwarden.policy.evaluate import explain, tool_reasons
from loopwarden.statuses import ApprovalStatus
from loopwarden.turns.leases import turn_problems

MAX_APPROVAL_SECONDS = 30 * 86400


# --- request_approval ------------------------------------------------------------------------


class ApprovalOut(Model, Approval):  # its fields: the ledger's `Approval`, read by pydantic
    """An approval as published (its row, without the store's `slot`)."""


class ApprovalRequest(Model):
    turn_id: TurnId
    fence: Fence
    tool: ToolName = Field(description="The approval-gated tool, e.g. deploy.prod.")
    summary: str = Field(
        min_length=1, max_length=MAX_SUMMARY, description="What the tool will do and why."
    )
    artifact_digest: Digest | None = Field(
        default=None,
        description="Bind the approval to an artifact (sha256:…): the update must cite it as evidence.",
    )
    idempotency_key: OptionalKey = None


class ApprovalRequestResult(Model):
    requested: bool
    reasons: list[ReasonOut]
    approval_id: str | None
    status: ApprovalStatus | None = Field(description="pending while an operator decides.")
    receipt_id: str


def _refuse_request(
    call: Call[Txn], req: ApprovalRequest, decision: Decision
) -> ApprovalRequestResult:
    return ApprovalRequestResult(
        requested=False,
        reasons=reasons_out(decision.reasons),
        approval_id=None,
        status=None,
        receipt_id=refuse_on_turn(call, "request_approval", decision, req.fence, req.tool),
    )


def _request_problems(call: Call[Txn], req: ApprovalRequest) -> list[Reason]:
    problems = turn_problems(call.tx, call.who, call.turn, req.fence)
    if problems:
        return problems
    policy = call.tx.rows.policy(call.loop.policy_digest)
    verdict = explain(policy, req.tool)
    if verdict.rule == "allow":
        return [Reason(ReasonCode.APPROVAL_NOT_NEEDED, verdict.explain())]
    if verdict.rule != "approval":  # denied, or allowed by nothing
        return tool_reasons(policy, [req.tool], frozenset())
    return []


@operation(access="write", scope=by_turn, refuse=_refuse_request)
def request_approval(call: Call[Txn], req: ApprovalRequest) -> ApprovalRequestResult:
    """Ask a human operator to approve one approval-gated tool for your open turn.

    Do not use the tool until projection or the operator shows the approval as approved; then
    cite its `approval_id` in your update.
    \f
    Refused (sealed as `request.refused`) if the turn is not the caller's, not open, the fence
    is stale, or the tool is not approval-gated (`approval_not_needed` if it is simply allowed,
    `tool_denied` / `tool_not_allowed` otherwise).
    """
    problems = _request_problems(call, req)
    if problems:
        return _refuse_request(call, req, Decision("deny", tuple(problems)))
    turn = call.turn
    approval_id = new_id("appr")
    sealed = call.tx.append(
        turn.loop_id,
        ReceiptKind.APPROVAL_REQUESTED,
        call.who,
        ApprovalRequested(
            approval_id=approval_id,
            turn_id=turn.turn_id,
            todo_id=turn.todo_id,
            tool=req.tool,
            summary=req.summary,
            artifact_digest=req.artifact_digest,
        ),
        turn_id=turn.turn_id,
        todo_id=turn.todo_id,
        approval_id=approval_id,
        idempotency_key=req.idempotency_key,
    )
    return ApprovalRequestResult(
        requested=True,
        reasons=[],
        approval_id=approval_id,
        status=ApprovalStatus.PENDING,
        receipt_id=sealed.receipt_id,
    )


# --- decide_approval -------------------------------------------------------------------------


class DecideApprovalRequest(Model):
    approval_id: ApprovalId
    approve: bool = Field(description="true to approve, false to reject.")
    expires_in_seconds: int = Field(
        default=3600,
        ge=1,
        le=MAX_APPROVAL_SECONDS,
        description="How long an approval stays usable, in seconds (approvals always expire; at most 30 days).",
    )
    reason: str = Field(default="", max_length=MAX_SUMMARY, description="Why.")


class DecideApprovalResult(Model):
    approval_id: str
    status: ApprovalStatus
    expires_at: Timestamp | None
    receipt_id: str


@operation(access="write", scope=by_approval, callers=OPERATOR_CALLERS)
def decide_approval(call: Call[Txn], req: DecideApprovalRequest) -> DecideApprovalResult:
    """Operator only: approve or reject a pending approval request.
    \f
    `Conflict` if it was already decided."""
    tx = call.tx
    approval = tx.rows.approval(req.approval_id)
    assert approval is not None  # located by the scope in this transaction
    if approval.status != ApprovalStatus.PENDING:
        raise Conflict(f"approval {req.approval_id} is already {approval.status}")
    expires = None
    if req.approve:
        expires = tx.now + timedelta(seconds=req.expires_in_seconds)
    status = ApprovalStatus.APPROVED if req.approve else ApprovalStatus.REJECTED
    sealed = tx.append(
        approval.loop_id,
        ReceiptKind.APPROVAL_DECIDED,
        call.who,
        ApprovalDecided(
            approval_id=approval.approval_id,
            approved=req.approve,
            expires_at=expires,
            reason=req.reason,
        ),
        decision=Decision(
            "allow" if req.approve else "deny",
            (Reason(ReasonCode(status), req.reason or f"{status} by operator {call.who.id}"),),
        ),
        turn_id=approval.turn_id,
        todo_id=approval.todo_id,
        approval_id=approval.approval_id,
    )
    return DecideApprovalResult(
        approval_id=approval.approval_id,
        status=status,
        expires_at=expires,
        receipt_id=sealed.receipt_id,
    )


# --- list_approvals --------------------------------------------------------------------------


class ApprovalsRequest(Model):
    loop_id: LoopId | None = Field(default=None, description="Only this loop's approvals.")
    status: ApprovalStatus | None = Field(
        default=None, description="Only approvals in this status."
    )


class ApprovalsResult(Model):
    approvals: list[ApprovalOut]


@operation(access="read", callers=OPERATOR_CALLERS, tool=False)
def list_approvals(call: Call[Reader], req: ApprovalsRequest) -> ApprovalsResult:
    """Operator only: approval requests (of one loop, in one status), oldest first."""
    rows = call.tx.rows.loop_approvals(req.loop_id, req.status)
    return ApprovalsResult(approvals=[from_row(ApprovalOut, a) for a in rows])
