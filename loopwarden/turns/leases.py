"""Leases and fences: who may act on a turn now, expiry of stale leases, and `heartbeat`."""

from __future__ import annotations

from datetime import datetime, timedelta

from loopwarden.kernel.runner.operation import Call
from loopwarden.kernel.runner.refusals import refuse_on_turn
from loopwarden.kernel.runner.results import Model, ReasonOut, reasons_out
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import by_turn
from loopwarden.kernel.state.charges import drawn
from loopwarden.kernel.state.events import Fence, ReceiptKind, Timestamp, TurnId
from loopwarden.kernel.state.facts import turn_facts, unsettled_calls
from loopwarden.kernel.state.rows import TurnRow
from loopwarden.kernel.store.reader import Rows
from loopwarden.kernel.store.store import Appended, Txn
from loopwarden.policy.decision import Decision, Reason, ReasonCode
from loopwarden.policy.evaluate import turn_reasons
from loopwarden.policy.model import LoopPolicy
from loopwarden.principals import Principal
from loopwarden.turns.turn_kinds import LeaseExpired, LeaseRenewed


def expire_leases(tx: Txn, loop_id: str, who: Principal) -> list[Appended]:
    """Seal `lease.expired` for every open turn of the loop whose lease has run out."""
    sealed = []
    for turn in tx.rows.expired_turns(loop_id, tx.now):
        reason = Reason(
            ReasonCode.LEASE_EXPIRED, f"the lease of {turn.agent} ran out; todo released"
        )
        sealed.append(
            tx.append(
                loop_id,
                ReceiptKind.LEASE_EXPIRED,
                who,
                LeaseExpired(
                    turn_id=turn.turn_id,
                    todo_id=turn.todo_id,
                    lease_expires_at=turn.lease_expires_at,
                    tool_calls_charged=unsettled_calls(turn),
                ),
                decision=Decision("allow", (reason,)),
                turn_id=turn.turn_id,
                todo_id=turn.todo_id,
            )
        )
    return sealed


def pool_sweeps_due(tx: Rows, policy: LoopPolicy, agent: str, now: datetime) -> list[str]:
    """The loops whose expired leases hold a turn of a full pool this claim draws from: an
    open turn counts against its pools until its lease is swept, in whichever loop it is."""
    pools, loops = tx.pools(), set()
    names = drawn(pools, policy, agent)
    tx.hold(names)  # their open turns are what is decided on
    for name in names:
        row = pools.get(name)
        limit = row.policy.max_concurrent_turns if row is not None else None
        if row is not None and limit is not None and row.active_turns >= limit:
            loops.update(tx.loops_with_expired_turns_in(name, now))
    return sorted(loops)


def sweep_pools(tx: Txn, policy: LoopPolicy, who: Principal) -> None:
    """Before a claim decides on its pools, free the turns of theirs whose leases ran out."""
    for loop_id in pool_sweeps_due(tx.rows, policy, who.id, tx.now):
        expire_leases(tx, loop_id, who)


def turn_problems(tx: Txn, who: Principal, turn: TurnRow, fence: int) -> list[Reason]:
    """Why `who` may not act on `turn` now (see `policy.evaluate.turn_reasons`)."""
    todo = tx.rows.todo(turn.loop_id, turn.todo_id)
    loop = tx.rows.loop_row(turn.loop_id)
    assert loop is not None
    return turn_reasons(turn_facts(who.id, loop, turn, todo, fence, tx.now))


class HeartbeatRequest(Model):
    turn_id: TurnId
    fence: Fence


class HeartbeatResult(Model):
    renewed: bool
    reasons: list[ReasonOut]
    turn_id: str
    lease_expires_at: Timestamp | None
    receipt_id: str


def _refuse_heartbeat(
    call: Call[Txn], req: HeartbeatRequest, decision: Decision
) -> HeartbeatResult:
    turn = call.turn
    if any(r.code == ReasonCode.LEASE_EXPIRED for r in decision.reasons):
        expire_leases(call.tx, turn.loop_id, call.who)
    return HeartbeatResult(
        renewed=False,
        reasons=reasons_out(decision.reasons),
        turn_id=turn.turn_id,
        lease_expires_at=None,
        receipt_id=refuse_on_turn(call, "heartbeat", decision, req.fence),
    )


@operation(access="write", scope=by_turn, refuse=_refuse_heartbeat)
def heartbeat(call: Call[Txn], req: HeartbeatRequest) -> HeartbeatResult:
    """Extend your lease on an open turn when the work takes longer than the lease.

    \f
    Extend the caller's lease on an open turn by the policy's `lease_seconds` from now.

    Refused (sealed as `request.refused`) for another agent's turn, a closed turn, a stale fence
    or an already expired lease (which is then swept: `lease.expired`).
    """
    tx, turn = call.tx, call.turn
    problems = turn_problems(tx, call.who, turn, req.fence)
    if problems:
        return _refuse_heartbeat(call, req, Decision("deny", tuple(problems)))
    policy = tx.rows.policy(call.loop.policy_digest)
    lease = tx.now + timedelta(seconds=policy.claims.lease_seconds)
    sealed = tx.append(
        turn.loop_id,
        ReceiptKind.LEASE_RENEWED,
        call.who,
        LeaseRenewed(turn_id=turn.turn_id, todo_id=turn.todo_id, lease_expires_at=lease),
        turn_id=turn.turn_id,
        todo_id=turn.todo_id,
    )
    return HeartbeatResult(
        renewed=True,
        reasons=[],
        turn_id=turn.turn_id,
        lease_expires_at=lease,
        receipt_id=sealed.receipt_id,
    )
