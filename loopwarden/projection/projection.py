"""`projection`: a loop's state for agents and operators — and who must act next."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field

from loopwarden.approvals.approval_ops import ApprovalOut
from loopwarden.clock import format_time
from loopwarden.journal.listing import ReceiptSummary, receipt_summary
from loopwarden.kernel.runner.operation import Call
from loopwarden.kernel.runner.results import (
    BudgetOut,
    Model,
    RateOut,
    budgets_out,
    from_row,
    rate_out,
)
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import by_loop
from loopwarden.kernel.state.charges import claim_reasons
from loopwarden.kernel.state.events import LoopId, Timestamp
from loopwarden.kernel.state.facts import observed_counts
from loopwarden.kernel.state.rows import ApprovalRow, LoopRow, TodoRow, TurnRow
from loopwarden.kernel.store.reader import Reader
from loopwarden.loops.stops import due_stop
from loopwarden.policy.budgets import budget_lines
from loopwarden.policy.decision import Reason
from loopwarden.policy.evaluate import observation_reasons
from loopwarden.policy.model import LoopPolicy
from loopwarden.statuses import ApprovalStatus, LoopStatus, TodoStatus, TurnStatus
from loopwarden.turns.admission import claims_in_window

TODO_PAGE = 200
RECENT = 10
WARN_FRACTION = 0.8
LEASE_WARNING_SECONDS = 60


class ProjectionRequest(Model):
    loop_id: LoopId


class TodoOut(Model):
    todo_id: str
    title: str
    status: TodoStatus
    attempts: int
    fence: int
    order: int
    depends_on: list[str]


class TurnOut(Model):
    turn_id: str
    todo_id: str
    agent: str
    status: TurnStatus
    fence: int
    claimed_at: Timestamp
    lease_expires_at: Timestamp
    closed_at: Timestamp | None
    outcome: str | None
    observed: dict[str, int] = Field(
        description="Tool calls the host's hooks saw in this turn, by policy tool name."
    )
    reported: dict[str, int] = Field(description="The accepted report's tools_used.")
    tool_refusals: int = Field(description="Tool calls refused before they ran.")


def turn_out(t: TurnRow) -> TurnOut:
    observed = {tool: t.observed_calls(tool) for tool in sorted(t.observed)}
    return from_row(
        TurnOut, t, observed=observed, reported=dict(t.reported), tool_refusals=t.refusals
    )


class Attention(Model):
    who: Literal["agent", "human", "none"]
    why: str


class Head(Model):
    seq: int
    digest: str


class ProjectionResult(Model):
    loop_id: str
    objective: str
    status: LoopStatus
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
    return from_row(TodoOut, t, order=t.ord, depends_on=list(t.depends_on))


def attention_for(
    loop: LoopRow,
    pending: list[ApprovalRow],
    live: list[TurnRow],
    eligible: TodoRow | None,
    stop_due: Reason | None = None,
    pool_block: Reason | None = None,
) -> tuple[Attention, str]:
    """Who must act next, and the next action in one line.

    `stop_due` is a stop rule that fires now but is not sealed yet (the next claim or report
    seals it): then nobody should start work, whatever todos are open. `pool_block`: why a
    budget pool the loop draws from refuses claims now."""
    if stop_due is not None and not loop.status.closed:
        return (
            Attention(who="none", why=f"the loop is due to stop: {stop_due.message}"),
            f"nothing: the next call seals loop.stopped ({stop_due.code})",
        )
    closed = _closed_attention(loop)
    if closed is not None:
        return closed
    if loop.status == LoopStatus.PAUSED:  # before approvals: nothing runs until it resumes
        waiting = f" (and {_awaiting(len(pending))})" if pending else ""
        return Attention(
            who="human", why="the loop is paused"
        ), f"operator: resume the loop{waiting}"
    if pending:
        ids = ", ".join(a.approval_id for a in pending[:3])
        return (
            Attention(who="human", why=_awaiting(len(pending))),
            f"operator: approve or reject {ids}",
        )
    if eligible is not None and pool_block is not None:
        return (
            Attention(who="human", why=pool_block.message),
            "operator: wait for the pool's window to reset, or raise its limit or resume it "
            "(`loopwarden pool set` / `pool resume`)",
        )
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
    if loop.todo_total == 0:
        return (
            Attention(who="human", why="the loop has no todos"),
            "operator: add a todo (todo_add); until then nothing can be claimed",
        )
    blocked = loop.count(TodoStatus.BLOCKED)
    if blocked:
        return (
            Attention(who="human", why=f"{blocked} todo(s) are blocked"),
            "operator: cancel the blocked todo(s) (`loopwarden loop cancel-todo`) or the loop",
        )
    return Attention(who="none", why="nothing is claimable right now"), "wait"


def _awaiting(n: int) -> str:
    return "1 approval awaits a decision" if n == 1 else f"{n} approvals await a decision"


def _closed_attention(loop: LoopRow) -> tuple[Attention, str] | None:
    if loop.status == LoopStatus.COMPLETED:
        return Attention(who="none", why="the loop is completed"), "nothing: all todos are done"
    if loop.status == LoopStatus.CANCELLED:
        return Attention(who="none", why="the loop was cancelled"), "nothing: the loop is closed"
    if loop.status == LoopStatus.STOPPED:
        return (
            Attention(who="human", why=f"the loop stopped: {loop.stop_reason}"),
            "operator: review the receipts (loopwarden receipts) and open a new loop if needed",
        )
    return None


def _warnings(
    policy: LoopPolicy, loop: LoopRow, open_turns: list[TurnRow], now: datetime
) -> list[str]:
    soon = now + timedelta(seconds=LEASE_WARNING_SECONDS)
    warnings = []
    for dim, line in budget_lines(policy.budgets, loop.totals).items():
        if line.limit and WARN_FRACTION * line.limit <= line.used < line.limit:
            warnings.append(f"{dim}: {line.used} of {line.limit} used")
    for t in open_turns:
        if t.lease_expires_at < now:
            warnings.append(f"turn {t.turn_id}: lease expired; the next claim releases it")
        elif t.lease_expires_at < soon:
            warnings.append(f"turn {t.turn_id}: lease expires at {format_time(t.lease_expires_at)}")
    if loop.failure_streak:
        warnings.append(
            f"the same failure {loop.failure_signature!r} was reported {loop.failure_streak} "
            f"time(s) in a row (stop at {policy.stop.repeated_failure_limit})"
        )
    blocked = loop.count(TodoStatus.BLOCKED)
    if blocked:
        warnings.append(f"{blocked} todo(s) blocked")
    return warnings


def _observation_warnings(policy: LoopPolicy, turns: list[TurnRow]) -> list[str]:
    """Reported turns whose report and the host's observations disagree (record mode keeps
    such reports; enforce mode refuses them, so there they show as refusals)."""
    out: list[str] = []
    for t in turns:
        if t.status != TurnStatus.REPORTED:
            continue
        reported = tuple(t.reported.items())
        violations, warnings = observation_reasons(policy, reported, observed_counts(t))
        out.extend(f"turn {t.turn_id}: {r.message}" for r in violations + warnings)
    return out


def _outsider_warnings(reader: Reader, loop_id: str) -> list[str]:
    """Refusals of principals the policy does not admit: counted here, left out of the recent
    receipts (kernel/runner/outsiders.py)."""
    sealed, suppressed = reader.outsider_refusals(loop_id)
    if not sealed:
        return []
    return [
        f"{sealed + suppressed} refusal(s) of agents outside the policy ({sealed} sealed in the "
        "journal; not among the recent receipts)"
    ]


def _shown_approvals(reader: Reader, loop_id: str, now: datetime) -> list[ApprovalRow]:
    """Pending approvals, and approved ones not yet expired or consumed."""
    return [
        a
        for a in reader.loop_approvals(loop_id)
        if a.status == ApprovalStatus.PENDING
        or (a.status == ApprovalStatus.APPROVED and (a.expires_at is None or a.expires_at > now))
    ]


@operation(access="read", scope=by_loop)
def projection(call: Call[Reader], req: ProjectionRequest) -> ProjectionResult:
    """Read the loop's current state: status, budgets, todos, leases, approvals, recent
    receipts, who must act next (attention) and the next action. Call it to orient yourself.
    \f
    Also the warnings (budgets near their limit, leases about to expire, a failure streak)
    and the journal head. Reads one snapshot; changes nothing."""
    reader, loop, now = call.tx, call.loop, call.now
    policy = reader.policy(loop.policy_digest)
    todos = reader.all_todos(loop.loop_id, TODO_PAGE + 1)
    open_turns = reader.loop_turns(loop.loop_id, TurnStatus.OPEN)
    live = [t for t in open_turns if t.lease_expires_at >= now]
    approvals = _shown_approvals(reader, loop.loop_id, now)
    pending = [a for a in approvals if a.status == ApprovalStatus.PENDING]
    eligible = reader.next_eligible_todo(loop.loop_id) if loop.status == LoopStatus.ACTIVE else None
    blocked = claim_reasons(reader, policy, call.who.id, now) if eligible is not None else []
    attention, next_action = attention_for(
        loop, pending, live, eligible, due_stop(reader, loop, now), next(iter(blocked), None)
    )
    recent = reader.recent_turns(loop.loop_id, RECENT)
    return from_row(
        ProjectionResult,
        loop,
        budgets=budgets_out(policy, loop),
        rate=rate_out(policy, claims_in_window(policy, reader, loop.loop_id, now)),
        todo_counts=loop.counts_by_status(),
        todos=[todo_out(t) for t in todos[:TODO_PAGE]],
        todos_truncated=len(todos) > TODO_PAGE,
        active_leases=[turn_out(t) for t in live],
        turns=[turn_out(t) for t in recent],
        approvals=[from_row(ApprovalOut, a) for a in approvals],
        recent_receipts=[
            receipt_summary(call.store, r) for r in reader.recent_receipts(loop.loop_id, RECENT)
        ],
        attention=attention,
        next_action=next_action,
        warnings=_warnings(policy, loop, open_turns, now)
        + _observation_warnings(policy, recent)
        + _outsider_warnings(reader, loop.loop_id),
        head=Head(seq=loop.head_seq, digest=loop.head_digest),
    )


class PolicyRequest(Model):
    loop_id: LoopId


class PolicyDocument(Model):
    loop_id: str
    policy_digest: str
    document: dict[str, object]


@operation(access="read", scope=by_loop, tool=False)
def loop_policy(call: Call[Reader], req: PolicyRequest) -> PolicyDocument:
    """The loop's normalized policy document (the policy resource reads it)."""
    loop = call.loop
    return PolicyDocument(
        loop_id=loop.loop_id,
        policy_digest=loop.policy_digest,
        document=call.tx.policy_document(loop.policy_digest) or {},
    )


def policy_json(document: PolicyDocument) -> str:
    return json.dumps(document.document, indent=2, sort_keys=True)
