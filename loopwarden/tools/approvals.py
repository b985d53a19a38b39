"""Approvals: an agent asks to use an approval-gated tool; an operator decides."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from loopwarden.clock import format_time
from loopwarden.errors import Conflict, NotFound
from loopwarden.ledger.events import (
    MAX_SUMMARY,
    ApprovalDecided,
    ApprovalId,
    ApprovalRequested,
    Digest,
    ToolName,
    TurnId,
)
from loopwarden.ledger.store import Txn
from loopwarden.policy import decision as codes
from loopwarden.policy.decision import Decision, Reason
from loopwarden.policy.evaluate import explain, tool_reasons
from loopwarden.principals import Principal
from loopwarden.tools.common import (
    IDEMPOTENCY_KEY_PATTERN,
    Model,
    ReasonOut,
    once,
    reasons_out,
    require_loop,
)
from loopwarden.tools.kernel import Kernel
from loopwarden.tools.loops import require_operator
from loopwarden.tools.turns import refuse_request, turn_problems

MAX_APPROVAL_SECONDS = 30 * 86400


class ApprovalRequest(Model):
    turn_id: TurnId
    fence: int = Field(ge=0, le=2**53)
    tool: ToolName
    summary: str = Field(
        min_length=1, max_length=MAX_SUMMARY, description="What the tool will do and why."
    )
    artifact_digest: Digest | None = Field(
        default=None,
        description="Bind the approval to an artifact (sha256:…): the update must cite it as evidence.",
    )
    idempotency_key: str | None = Field(
        default=None,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="Optional key making a retried call return the original result.",
    )


class ApprovalRequestResult(Model):
    requested: bool
    reasons: list[ReasonOut]
    approval_id: str | None
    status: str | None = Field(description="pending while an operator decides.")
    receipt_id: str


async def request_approval(
    kernel: Kernel, who: Principal, req: ApprovalRequest
) -> ApprovalRequestResult:
    """Ask an operator to approve one approval-gated tool for the caller's open turn.

    Refused (sealed as `request.refused`) if the turn is not the caller's, not open, the fence
    is stale, or the tool is not approval-gated (`approval_not_needed` if it is simply allowed,
    `tool_denied` / `tool_not_allowed` otherwise). `NotFound` for an unknown turn.
    """

    def write(tx: Txn) -> ApprovalRequestResult:
        turn = tx.turn(req.turn_id)
        if turn is None:
            raise NotFound(f"no turn with id {req.turn_id!r}")
        loop = require_loop(tx, turn.loop_id)

        def refuse(decision: Decision) -> ApprovalRequestResult:
            receipt_id = refuse_request(
                tx,
                who,
                turn.loop_id,
                "request_approval",
                list(decision.reasons),
                turn_id=turn.turn_id,
                todo_id=turn.todo_id,
            )
            return ApprovalRequestResult(
                requested=False,
                reasons=reasons_out(decision.reasons),
                approval_id=None,
                status=None,
                receipt_id=receipt_id,
            )

        def ask() -> ApprovalRequestResult:
            problems = turn_problems(tx, who, turn, req.fence)
            if not problems:
                policy = tx.policy(loop.policy_digest)
                verdict = explain(policy, req.tool)
                if verdict.rule == "allow":
                    problems = [Reason(codes.APPROVAL_NOT_NEEDED, verdict.explain())]
                elif verdict.rule != "approval":  # denied, or allowed by nothing
                    problems = tool_reasons(policy, [req.tool], frozenset())
            if problems:
                return refuse(Decision("deny", tuple(problems)))
            approval_id = kernel.new_id("appr")
            sealed = tx.append(
                turn.loop_id,
                "approval.requested",
                who,
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
                status="pending",
                receipt_id=sealed.receipt_id,
            )

        return once(tx, who, "request_approval", req, ApprovalRequestResult, ask, refuse)

    return await kernel.store.write(write)


class DecideApprovalRequest(Model):
    approval_id: ApprovalId
    approve: bool = Field(description="true to approve, false to reject.")
    expires_in_seconds: int = Field(
        default=3600,
        ge=1,
        le=MAX_APPROVAL_SECONDS,
        description="Approval lifetime in seconds (approvals always expire; at most 30 days).",
    )
    reason: str = Field(default="", max_length=MAX_SUMMARY)


class DecideApprovalResult(Model):
    approval_id: str
    status: str
    expires_at: str | None
    receipt_id: str


async def decide_approval(
    kernel: Kernel, who: Principal, req: DecideApprovalRequest
) -> DecideApprovalResult:
    """Approve or reject a pending approval (operator only). `NotFound` for an unknown id,
    `Conflict` if it was already decided."""
    require_operator(who, "decide_approval")

    def write(tx: Txn) -> DecideApprovalResult:
        approval = tx.approval(req.approval_id)
        if approval is None:
            raise NotFound(f"no approval with id {req.approval_id!r}")
        if approval.status != "pending":
            raise Conflict(f"approval {req.approval_id} is already {approval.status}")
        expires = None
        if req.approve:
            expires = format_time(tx.now_dt + timedelta(seconds=req.expires_in_seconds))
        code = "approved" if req.approve else "rejected"
        sealed = tx.append(
            approval.loop_id,
            "approval.decided",
            who,
            ApprovalDecided(
                approval_id=approval.approval_id,
                approved=req.approve,
                expires_at=expires,
                reason=req.reason,
            ),
            decision=Decision(
                "allow" if req.approve else "deny",
                (Reason(code, req.reason or f"{code} by operator {who.id}"),),
            ),
            turn_id=approval.turn_id,
            todo_id=approval.todo_id,
            approval_id=approval.approval_id,
        )
        return DecideApprovalResult(
            approval_id=approval.approval_id,
            status=code,
            expires_at=expires,
            receipt_id=sealed.receipt_id,
        )

    return await kernel.store.write(write)
