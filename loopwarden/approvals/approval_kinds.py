"""Approvals: requested by an agent for an approval-gated tool, decided by an operator."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, model_validator

from loopwarden.kernel.state.events import (
    MAX_SUMMARY,
    ApprovalId,
    Digest,
    Fact,
    ReceiptBody,
    ReceiptKind,
    Timestamp,
    TodoId,
    ToolName,
    TurnId,
)
from loopwarden.kernel.state.fold import FoldError, next_slot, open_turn, row_of
from loopwarden.kernel.state.legality import Judging, Verdict, VerdictRule, turn_problems, verdicts
from loopwarden.kernel.state.rows import ApprovalRow, LoopView, replace
from loopwarden.kernel.state.spec import AGENTS, OPERATORS, KindSpec, touching
from loopwarden.policy.decision import ReasonCode
from loopwarden.policy.evaluate import explain, tool_reasons
from loopwarden.statuses import ApprovalStatus


class ApprovalRequested(Fact):
    approval_id: ApprovalId
    turn_id: TurnId
    todo_id: TodoId
    tool: ToolName
    summary: str = Field(min_length=1, max_length=MAX_SUMMARY)
    artifact_digest: Digest | None = None


class ApprovalDecided(Fact):
    approval_id: ApprovalId
    approved: bool
    expires_at: Timestamp | None = None
    reason: str = Field(default="", max_length=MAX_SUMMARY)

    @model_validator(mode="after")
    def _expiry_exactly_when_approved(self) -> ApprovalDecided:
        if (self.expires_at is not None) != self.approved:
            raise ValueError("an approval has an expiry and a rejection has none")
        return self


MAX_APPROVAL = timedelta(days=30)


_touches_requested = touching(turns="turn_id")


def _requested(view: LoopView, body: ReceiptBody, f: ApprovalRequested) -> None:
    open_turn(view, f.turn_id)
    # The row is the request as sealed (its fields are the fact's, by name), pending.
    view.approvals[f.approval_id] = ApprovalRow(
        **dict(f),
        loop_id=view.loop.loop_id,
        status=ApprovalStatus.PENDING,
        requested_by=body.principal.id,
        requested_at=body.at,
        decided_by=None,
        decided_at=None,
        expires_at=None,
        reason=None,
        consumed_by=None,
        slot=next_slot(view),
    )


def _judge_requested(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: ApprovalRequested
) -> list[Verdict]:
    reasons = [r.code for r in turn_problems(view, view.turns[data.turn_id], body)]
    verdict = explain(view.policy, data.tool)
    if verdict.rule != "approval":
        tool = [r.code for r in tool_reasons(view.policy, [data.tool], frozenset())]
        reasons += tool or [ReasonCode.APPROVAL_NOT_NEEDED]
    return verdicts(tuple(reasons), "approval requested")


_touches_decided = touching(approvals="approval_id")


def _decided(view: LoopView, body: ReceiptBody, f: ApprovalDecided) -> None:
    approval: ApprovalRow = row_of(view.approvals, f.approval_id, "approval")
    if approval.status != ApprovalStatus.PENDING:
        raise FoldError(f"approval {f.approval_id!r} is already {approval.status}")
    view.approvals[f.approval_id] = replace(
        approval,
        status=ApprovalStatus.APPROVED if f.approved else ApprovalStatus.REJECTED,
        decided_by=body.principal.id,
        decided_at=body.at,
        expires_at=f.expires_at,
        reason=f.reason,
    )


def _judge_decided(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: ApprovalDecided
) -> list[Verdict]:
    """An operator's decision; an approval lasts from a second to 30 days."""
    if data.expires_at is None:
        return []
    at, expires = body.at, data.expires_at
    if not at < expires <= at + MAX_APPROVAL:
        return [
            Verdict(
                VerdictRule.APPROVAL_EXPIRY, "approved for less than a second or more than 30 days"
            )
        ]
    return []


SPECS = (
    KindSpec(
        ReceiptKind.APPROVAL_REQUESTED,
        ApprovalRequested,
        callers=AGENTS,
        touches=_touches_requested,
        fold=_requested,
        judge=_judge_requested,
    ),
    KindSpec(
        ReceiptKind.APPROVAL_DECIDED,
        ApprovalDecided,
        callers=OPERATORS,
        touches=_touches_decided,
        fold=_decided,
        judge=_judge_decided,
    ),
)
