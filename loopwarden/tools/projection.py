"""`projection`: a loop's state for agents and operators — and who must act next."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Literal

from pydantic import Field

from loopwarden.clock import format_time
from loopwarden.ledger.events import LoopId
from loopwarden.ledger.projection import ApprovalRow, LoopRow, TodoRow, TurnRow
from loopwarden.ledger.reader import JournalRow, Reader
from loopwarden.ledger.receipts import Opened, open_envelope
from loopwarden.policy.budgets import budget_lines
from loopwarden.policy.decision import Reason
from loopwarden.policy.evaluate import evaluate_stop
from loopwarden.principals import Principal
from loopwarden.tools.common import (
    BudgetOut,
    Model,
    RateOut,
    Status,
    budgets_out,
    rate_out,
    require_loop,
    require_visible,
)
from loopwarden.tools.kernel import Kernel
from loopwarden.tools.rules import stop_facts

TODO_PAGE = 200
RECENT = 10
WARN_FRACTION = 0.8
LEASE_WARNING_SECONDS = 60


class ProjectionRequest(Model):
    loop_id: LoopId


class TodoOut(Model):
    todo_id: str
    title: str
    status: str
    attempts: int
    fence: int
    order: int
    depends_on: list[str]


class TurnOut(Model):
    turn_id: str
    todo_id: str
    agent: str
    status: str
    fence: int
    claimed_at: str
    lease_expires_at: str
    closed_at: str | None
    outcome: str | None


class ApprovalOut(Model):
    approval_id: str
    turn_id: str
    todo_id: str
    tool: str
    status: str
    summary: str
    requested_by: str
    artifact_digest: str | None
    expires_at: str | None


class ReceiptSummary(Model):
    seq: int
    receipt_id: str
    kind: str
    at: str
    principal: str
    effect: str
    reasons: list[str]


class Attention(Model):
    who: Literal["agent", "human", "none"]
    why: str


class Head(Model):
    seq: int
    digest: str


class ProjectionResult(Model):
    loop_id: str
    objective: str
    status: Status
    stop_reason: str | None
    policy_digest: str
    budgets: dict[str, BudgetOut]
    rate: RateOut
    todo_counts: dict[str, int]
    todos: list[TodoOut] = Field(description=f"The first {TODO_PAGE} todos in claim order.")
    todos_truncated: bool
    active_leases: list[TurnOut]
    turns: list[TurnOut] = Field(description=f"The {RECENT} most recent turns.")
    approvals: list[ApprovalOut] = Field(description="Pending and unconsumed approved approvals.")
    recent_receipts: list[ReceiptSummary]
    attention: Attention
    next_action: str
    warnings: list[str]
    head: Head


def todo_out(t: TodoRow) -> TodoOut:
    return TodoOut(
        todo_id=t.todo_id,
        title=t.title,
        status=t.status,
        attempts=t.attempts,
        fence=t.fence,
        order=t.ord,
        depends_on=list(t.depends_on),
    )


def turn_out(t: TurnRow) -> TurnOut:
    return TurnOut(
        turn_id=t.turn_id,
        todo_id=t.todo_id,
        agent=t.agent,
        status=t.status,
        fence=t.fence,
        claimed_at=t.claimed_at,
        lease_expires_at=t.lease_expires_at,
        closed_at=t.closed_at,
        outcome=t.outcome,
    )


def approval_out(a: ApprovalRow) -> ApprovalOut:
    return ApprovalOut(
        approval_id=a.approval_id,
        turn_id=a.turn_id,
        todo_id=a.todo_id,
        tool=a.tool,
        status=a.status,
        summary=a.summary,
        requested_by=a.requested_by,
        artifact_digest=a.artifact_digest,
        expires_at=a.expires_at,
    )


def receipt_summary(row: JournalRow, opened: Opened | None = None) -> ReceiptSummary:
    """One line about a receipt, for display. Decoded here without verification (`receipt`
    verifies) unless the caller passes the envelope it already opened."""
    opened = opened or open_envelope(row.envelope, None, canonical=False)
    body = opened.body or {}
    decision = body.get("decision", {})
    return ReceiptSummary(
        seq=row.seq,
        receipt_id=row.receipt_id,
        kind=row.kind,
        at=row.at,
        principal=body.get("principal", {}).get("id", "?"),
        effect=decision.get("effect", "?"),
        reasons=[r.get("code", "?") for r in decision.get("reasons", [])],
    )


def attention_for(
    loop: LoopRow,
    pending: list[ApprovalRow],
    live: list[TurnRow],
    eligible: TodoRow | None,
    stop_due: Reason | None = None,
) -> tuple[Attention, str]:
    """Who must act next, and the next action in one line.

    `stop_due` is a stop rule that fires now but is not sealed yet (the next claim or report
    seals it): then nobody should start work, whatever todos are open."""
    if stop_due is not None and loop.status not in ("completed", "stopped", "cancelled"):
        return (
            Attention(who="none", why=f"the loop is due to stop: {stop_due.message}"),
            f"nothing: the next call seals loop.stopped ({stop_due.code})",
        )
    if loop.status == "completed":
        return Attention(who="none", why="the loop is completed"), "nothing: all todos are done"
    if loop.status == "cancelled":
        return Attention(who="none", why="the loop was cancelled"), "nothing: the loop is closed"
    if loop.status == "stopped":
        return (
            Attention(who="human", why=f"the loop stopped: {loop.stop_reason}"),
            "operator: review the receipts (loopwarden receipts) and open a new loop if needed",
        )
    if pending:
        ids = ", ".join(a.approval_id for a in pending[:3])
        return (
            Attention(who="human", why=f"{len(pending)} approval(s) await a decision"),
            f"operator: approve or reject {ids}",
        )
    if loop.status == "paused":
        return Attention(who="human", why="the loop is paused"), "operator: resume the loop"
    if eligible is not None:
        return (
            Attention(who="agent", why=f"todo {eligible.todo_id} is ready"),
            f"agent: claim todo {eligible.todo_id} ({eligible.title})",
        )
    if live:
        return (
            Attention(who="agent", why=f"{len(live)} turn(s) in progress"),
            "agent: finish the open turns and report with update",
        )
    if loop.count("blocked"):
        return (
            Attention(who="human", why=f"{loop.count('blocked')} todo(s) are blocked"),
            "operator: unblock or cancel the loop",
        )
    return Attention(who="none", why="nothing is claimable right now"), "wait"


async def projection(kernel: Kernel, who: Principal, req: ProjectionRequest) -> ProjectionResult:
    """The loop's current state: status, budgets, todos, leases, approvals, recent receipts,
    attention (who must act next and why), the next action, warnings and the journal head.
    Read-only; `NotFound` for an unknown loop, `Forbidden` for an agent the loop does not admit."""
    now = kernel.store.clock()
    now_text = format_time(now)
    soon = format_time(now + timedelta(seconds=LEASE_WARNING_SECONDS))

    def read(reader: Reader) -> ProjectionResult:
        loop = require_loop(reader, req.loop_id)
        require_visible(reader, loop, who)
        policy = reader.policy(loop.policy_digest)
        todos = reader.all_todos(loop.loop_id, TODO_PAGE + 1)
        open_turns = reader.loop_turns(loop.loop_id, "open")
        live = [t for t in open_turns if t.lease_expires_at >= now_text]
        approvals = [
            a
            for a in reader.loop_approvals(loop.loop_id)
            if a.status == "pending"
            or (a.status == "approved" and (a.expires_at or "~") > now_text)
        ]
        pending = [a for a in approvals if a.status == "pending"]
        eligible = reader.next_eligible_todo(loop.loop_id) if loop.status == "active" else None
        stop_due = evaluate_stop(policy, stop_facts(reader, loop, now))
        attention, next_action = attention_for(loop, pending, live, eligible, stop_due)
        warnings = []
        for dim, line in budget_lines(policy, loop.totals).items():
            if line.limit and line.used >= WARN_FRACTION * line.limit and line.used < line.limit:
                warnings.append(f"{dim}: {line.used} of {line.limit} used")
        for t in open_turns:
            if t.lease_expires_at < now_text:
                warnings.append(f"turn {t.turn_id}: lease expired; the next claim releases it")
            elif t.lease_expires_at < soon:
                warnings.append(f"turn {t.turn_id}: lease expires at {t.lease_expires_at}")
        if loop.failure_streak:
            warnings.append(
                f"the same failure {loop.failure_signature!r} was reported {loop.failure_streak} "
                f"time(s) in a row (stop at {policy.stop.repeated_failure_limit})"
            )
        if loop.count("blocked"):
            warnings.append(f"{loop.count('blocked')} todo(s) blocked")
        return ProjectionResult(
            loop_id=loop.loop_id,
            objective=loop.objective,
            status=loop.status,  # type: ignore[arg-type]
            stop_reason=loop.stop_reason,
            policy_digest=loop.policy_digest,
            budgets=budgets_out(policy, loop),
            rate=rate_out(policy, reader, loop.loop_id, now),
            todo_counts=dict(
                zip(("open", "claimed", "done", "blocked"), loop.todo_counts, strict=True)
            ),
            todos=[todo_out(t) for t in todos[:TODO_PAGE]],
            todos_truncated=len(todos) > TODO_PAGE,
            active_leases=[turn_out(t) for t in live],
            turns=[turn_out(t) for t in reader.recent_turns(loop.loop_id, RECENT)],
            approvals=[approval_out(a) for a in approvals],
            recent_receipts=[
                receipt_summary(r) for r in reader.recent_receipts(loop.loop_id, RECENT)
            ],
            attention=attention,
            next_action=next_action,
            warnings=warnings,
            head=Head(seq=loop.head_seq, digest=loop.head_digest),
        )

    return await kernel.store.read(read)


def policy_json(reader: Reader, loop_id: str, who: Principal) -> str:
    """The loop's normalized policy document as JSON (for the policy resource)."""
    loop = require_loop(reader, loop_id)
    require_visible(reader, loop, who)
    return json.dumps(reader.policy_document(loop.policy_digest), indent=2, sort_keys=True)
