"""`update`: the agent's self-report that closes a turn — checked, charged, sealed, routed."""

from __future__ import annotations

from pydantic import Field, field_validator

from loopwarden.kernel.runner.operation import IDEMPOTENT_WRITE, Call
from loopwarden.kernel.runner.results import BudgetOut, Model, ReasonOut, budgets_out, reasons_out
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import by_turn
from loopwarden.kernel.state.events import (
    MAX_EVIDENCE_ITEMS,
    MAX_SUMMARY,
    MAX_TOOLS_USED,
    ApprovalId,
    Evidence,
    Fence,
    IdempotencyKey,
    ModelSpend,
    Outcome,
    ReceiptKind,
    ToolUse,
    TurnId,
    TurnRefused,
    TurnReport,
    Usage,
    check_evidence_size,
)
from loopwarden.kernel.state.facts import approvals_found, report_facts, tool_calls_due
from loopwarden.kernel.state.rows import TurnRow
from loopwarden.kernel.store.store import Appended, Txn
from loopwarden.loops.stops import apply_stop_rules, close_loop
from loopwarden.policy.budgets import Totals
from loopwarden.policy.decision import VIOLATIONS, Decision, Reason, ReasonCode
from loopwarden.policy.evaluate import evaluate_report
from loopwarden.statuses import LoopStatus, TodoStatus, TurnStatus
from loopwarden.turns.admission import Route, route_for
from loopwarden.turns.leases import expire_leases
from loopwarden.turns.turn_kinds import TurnReported


class UpdateRequest(Model):
    turn_id: TurnId
    fence: Fence
    outcome: Outcome = Field(
        description="progress (more to do), completed (todo done), failed, or blocked (needs a human)."
    )
    tools_used: list[ToolUse] = Field(
        default_factory=list,
        max_length=MAX_TOOLS_USED,
        description="Every tool you called this turn, with its call count.",
    )
    usage: Usage = Field(default_factory=Usage, description="What the turn consumed.")
    evidence: list[Evidence] = Field(
        default_factory=list,
        max_length=MAX_EVIDENCE_ITEMS,
        description="Evidence of the work: test results, diffs, logs, URLs.",
    )
    summary: str = Field(max_length=MAX_SUMMARY, description="What you did this turn.")
    failure_signature: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="For failed turns: a stable short signature of the failure.",
    )
    approval_ids: list[ApprovalId] = Field(
        default_factory=list,
        max_length=MAX_TOOLS_USED,
        description="Approved approvals covering approval-gated tools you used.",
    )
    idempotency_key: IdempotencyKey

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
    status: LoopStatus | None = Field(
        description="The loop's status (null if the turn is not yours)."
    )
    stop_reason: str | None
    loop_id: str
    turn_id: str
    todo_status: TodoStatus | None = Field(description="The todo's status after this update.")
    turn_status: TurnStatus | None = Field(
        default=None,
        description="The turn's status after this update: open means you may correct the "
        "report and send it again (with the usage since); any other status means the turn is "
        "over (claim again).",
    )
    receipt_id: str
    seq: int
    digest: str
    budgets: dict[str, BudgetOut] = Field(
        description="Every budget after this update (empty if the turn is not yours)."
    )


def _report(req: UpdateRequest, turn: TurnRow, *, owner: bool, charged: bool) -> TurnReport:
    """The report as sealed. The owner's records what the turn was charged before it and what
    it charges now (nothing, when it is not charged); another agent's records neither."""
    before = turn.tool_calls_charged if owner else None
    due = tool_calls_due(req, int(req.usage.amount("tool_calls")), turn) if owner and charged else 0
    return TurnReport(
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
        tool_calls_charged=due if owner else None,
        tool_calls_before=before,
        model_observed=(
            ModelSpend.of(turn.model) if owner and charged and turn.model != Totals() else None
        ),
    )


def _seal(
    call: Call[Txn],
    req: UpdateRequest,
    decision: Decision,
    *,
    accepted: bool,
    charged: bool = True,
    closes: bool = False,
    found: tuple[str, ...] = (),
) -> Appended:
    turn = call.tx.rows.turn(call.turn.turn_id) or call.turn  # as it is now (a sweep may close it)
    owner = call.who.id == turn.agent
    report = dict(_report(req, turn, owner=owner, charged=charged))  # validated, as they are
    report["approvals_found"] = found or None
    data: TurnReported | TurnRefused
    if accepted:
        kind, data = ReceiptKind.TURN_REPORTED, TurnReported(**report)
    else:
        kind = ReceiptKind.TURN_REFUSED
        data = TurnRefused(**report, charged=charged, closes_turn=closes)
    return call.tx.append(
        turn.loop_id,
        kind,
        call.who,
        data,
        decision=decision,
        turn_id=turn.turn_id,
        todo_id=turn.todo_id,
        idempotency_key=req.idempotency_key,
    )


def _foreign(call: Call[Txn], req: UpdateRequest, decision: Decision) -> UpdateResult:
    """A refusal sealed for someone who does not hold the turn: nothing charged, nothing swept,
    and nothing about the loop in the answer."""
    sealed = _seal(call, req, decision, accepted=False, charged=False)
    return UpdateResult(
        accepted=False,
        reasons=reasons_out(decision.reasons),
        route="stop",
        status=None,
        stop_reason=None,
        loop_id=call.turn.loop_id,
        turn_id=call.turn.turn_id,
        todo_status=None,
        turn_status=None,
        receipt_id=sealed.receipt_id,
        seq=sealed.seq,
        digest=sealed.sealed.digest,
        budgets={},
    )


def _refuse(call: Call[Txn], req: UpdateRequest, decision: Decision) -> UpdateResult:
    """A refusal decided before the report is read (a reused key, an outsider): charged if the
    caller holds the turn (the work happened), otherwise a foreign refusal."""
    if call.turn.agent != call.who.id:
        return _foreign(call, req, decision)
    sealed = _seal(call, req, decision, accepted=False, charged=not call.turn.settled)
    return _result(call, False, decision, sealed)


def _decide(call: Call[Txn], req: UpdateRequest) -> tuple[Decision, tuple[str, ...]]:
    """The decision on the owner's report, and the approvals it did not cite that count for it
    (an operator's approval of this turn's tool need not be cited: `approvals_found`)."""
    tx, turn = call.tx, call.turn
    loop = call.loop
    policy = tx.rows.policy(loop.policy_digest)
    todo = tx.rows.todo(loop.loop_id, turn.todo_id)
    approvals = {**tx.rows.approvals(req.approval_ids),
                 **tx.rows.approved_for_turn(loop.loop_id, turn.turn_id)}  # fmt: skip
    found = approvals_found(policy, req, turn, approvals.values(), tx.now)
    facts = report_facts(call.who.id, loop, turn, todo, approvals, req, tx.now, found)
    return evaluate_report(policy, facts, digest=loop.policy_digest), found


@operation(access="write", scope=by_turn, hints=IDEMPOTENT_WRITE, refuse=_refuse)
def update(call: Call[Txn], req: UpdateRequest) -> UpdateResult:
    """Close your turn with an honest report: outcome, tools used, usage, evidence, summary.

    Every turn you claim must end with exactly one accepted update. Budgets are charged from
    `usage` (tool calls: the largest of usage.tool_calls, the sum of tools_used counts and what
    your host's hooks observed, less what the turn was already charged); tools are checked against the loop's policy (a forbidden tool
    is refused and may stop the loop). If the loop observes your host, list every tool it ran
    under the name the refusal or warning gives (e.g. shell.run for Bash). If your model calls
    go through loopwarden's model gateway, their usage is charged as the gateway observed it:
    leave usage's model fields out (or report at least what was observed). Completing a todo
    may require evidence. Then follow `route`: continue (claim again), wait,
    user_action_required (stop and tell the user), or stop.

    \f
    Close a turn with the agent's report.

    Idempotent: the same principal, key and arguments return the original result; the same key
    with other arguments is refused (`idempotency_conflict`, charged on the caller's own turn).
    Otherwise, in one transaction:
    - the caller must own the turn (`not_turn_owner`: refused and sealed, nothing charged, and
      the answer says nothing about the loop);
    - every other refusal is charged: the usage in a report happened, whatever is wrong with
      the report, so budgets always hold. A corrected report for a turn that stays open
      carries only the usage since the refused one; a closed turn's usage is charged once (by
      the report that closed it, or the first one after its lease expired or its loop
      closed), so later reports on it are refused uncharged. The answer's `turn_status` says
      whether the turn is still open;
    - a tool violation (a denied or not-allowed tool, or an approval-gated tool without a valid
      cited approval) closes the turn if it is still open, releases its todo, and with
      `on_violation = "stop_loop"` stops the loop (`policy_violation`) — whatever else is
      wrong with the report (a stale fence does not hide a violation);
    - a closed turn, a stale fence or an expired lease (`turn_closed`, `stale_fence`,
      `lease_expired`; an expired lease is released first), or completing without required
      evidence (`evidence_required`), is refused; the turn, if still open, stays open;
    - else `turn.reported`: usage charged, the todo moves per outcome, approvals consumed.
    Then the stop rules run, and the result carries the route for the next turn.
    """
    if call.turn.agent != call.who.id:
        reason = Reason(ReasonCode.NOT_TURN_OWNER, "this turn belongs to another agent")
        return _foreign(call, req, Decision("deny", (reason,)))
    decision, found = _decide(call, req)
    if decision.allowed:
        sealed = _seal(call, req, decision, accepted=True, found=found)
        return _result(call, True, decision, sealed)
    return _refused(call, req, decision, found)


def _refused(
    call: Call[Txn], req: UpdateRequest, decision: Decision, approvals: tuple[str, ...] = ()
) -> UpdateResult:
    """Every refusal of the owner's report is charged unless its turn is settled; a violation
    also closes the turn (if still open) and applies `on_violation`. `approvals`: those found
    for it uncited (recorded, so the judge decides on what the server decided on)."""
    tx, turn = call.tx, call.turn
    found = set(decision.codes)
    if ReasonCode.LEASE_EXPIRED in found:
        expire_leases(tx, turn.loop_id, call.who)  # releases this turn (and any other stale one)
    now = tx.rows.turn(turn.turn_id) or turn
    still_open = now.status == TurnStatus.OPEN
    violation = bool(found & VIOLATIONS)
    closes = violation and still_open
    sealed = _seal(
        call, req, decision, accepted=False, charged=not now.settled, closes=closes,
        found=approvals,
    )  # fmt: skip
    policy = tx.rows.policy(call.loop.policy_digest)
    if violation and policy.stop.on_violation == "stop_loop" and not call.loop.status.closed:
        reason = Reason(ReasonCode.POLICY_VIOLATION, "; ".join(r.message for r in decision.reasons))
        close_loop(tx, turn.loop_id, call.who, ReceiptKind.LOOP_STOPPED, reason)
    return _result(call, False, decision, sealed)


def _result(call: Call[Txn], accepted: bool, decision: Decision, sealed: Appended) -> UpdateResult:
    """After the report's receipt: the stop rules (usage may have been charged), then the
    answer. Other agents' stale leases are released first, so the route sees what a claim
    would see."""
    tx, turn, who = call.tx, call.turn, call.who
    expire_leases(tx, turn.loop_id, who)
    apply_stop_rules(tx, turn.loop_id, who)
    loop = call.loop
    todo = tx.rows.todo(turn.loop_id, turn.todo_id)
    return UpdateResult(
        accepted=accepted,
        reasons=reasons_out(decision.reasons),
        route=route_for(tx.rows, turn.loop_id, who.id, tx.now),
        status=loop.status,
        stop_reason=loop.stop_reason,
        loop_id=turn.loop_id,
        turn_id=turn.turn_id,
        todo_status=todo.status if todo else None,
        turn_status=(tx.rows.turn(turn.turn_id) or turn).status,
        receipt_id=sealed.receipt_id,
        seq=sealed.seq,
        digest=sealed.sealed.digest,
        budgets=budgets_out(tx.rows.policy(loop.policy_digest), loop),
    )
