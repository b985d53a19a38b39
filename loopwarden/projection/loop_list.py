"""The loops a caller may see, one line each: counters, budgets and who must act next."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from loopwarden.kernel.runner.operation import Call
from loopwarden.kernel.runner.results import BudgetOut, Model, budgets_out, from_row
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import visible
from loopwarden.kernel.state.charges import claim_reasons
from loopwarden.kernel.state.events import Timestamp
from loopwarden.kernel.state.rows import LoopRow
from loopwarden.kernel.store.reader import Reader
from loopwarden.loops.stops import due_stop
from loopwarden.projection.projection import Attention, attention_for
from loopwarden.statuses import ApprovalStatus, LoopStatus, TurnStatus


class LoopsRequest(Model):
    status: LoopStatus | None = Field(default=None, description="Only loops in this status.")


class LoopSummary(Model):
    loop_id: str
    objective: str
    status: LoopStatus
    stop_reason: str | None
    opened_at: Timestamp
    updated_at: Timestamp = Field(description="When the loop's last receipt was sealed.")
    head_seq: int
    turns: int
    todos: dict[str, int]
    budgets: dict[str, BudgetOut]
    attention: Attention = Field(description="Who must act next, and why (as in projection).")
    pending_approvals: int
    open_turns: int = Field(description="Turns holding a live (unexpired) lease.")


class LoopList(Model):
    loops: list[LoopSummary]


def loop_summary(reader: Reader, loop: LoopRow, now: datetime) -> LoopSummary:
    """One loop's line: its counters, budgets and who must act next, from one snapshot."""
    live = [
        t for t in reader.loop_turns(loop.loop_id, TurnStatus.OPEN) if t.lease_expires_at >= now
    ]
    pending = reader.loop_approvals(loop.loop_id, ApprovalStatus.PENDING)
    eligible = reader.next_eligible_todo(loop.loop_id) if loop.status == LoopStatus.ACTIVE else None
    policy = reader.policy(loop.policy_digest)
    blocked = claim_reasons(reader, policy, "", now) if eligible is not None else []  # its pools
    attention, _ = attention_for(
        loop, pending, live, eligible, due_stop(reader, loop, now), next(iter(blocked), None)
    )
    return from_row(
        LoopSummary,
        loop,
        turns=loop.totals.turns,
        todos=loop.counts_by_status(),
        budgets=budgets_out(policy, loop),
        attention=attention,
        pending_approvals=len(pending),
        open_turns=len(live),
    )


@operation(access="read", tool=False)
def list_loops(call: Call[Reader], req: LoopsRequest) -> LoopList:
    """The loops you may see, oldest first.
    \f
    Every loop for an operator; for an agent, the loops whose policy admits it. Each line
    carries its budgets and attention (who must act next), computed as `projection` does."""
    return LoopList(
        loops=[
            loop_summary(call.tx, loop, call.now)
            for loop in call.tx.loops()
            if visible(call.tx, call.who, loop) and req.status in (None, loop.status)
        ]
    )
