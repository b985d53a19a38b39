"""Stop rules: when a loop closes by itself, and how any close is sealed."""

from __future__ import annotations

from datetime import datetime

from loopwarden.kernel.state.events import ClosedTurn, LoopStopped, ReceiptKind
from loopwarden.kernel.state.facts import stop_facts, unsettled_calls
from loopwarden.kernel.state.rows import LoopRow
from loopwarden.kernel.store.reader import Rows
from loopwarden.kernel.store.store import Appended, Txn
from loopwarden.policy.decision import Decision, Reason, ReasonCode
from loopwarden.policy.evaluate import evaluate_stop
from loopwarden.principals import Principal
from loopwarden.statuses import TurnStatus


def close_loop(
    tx: Txn, loop_id: str, who: Principal, kind: ReceiptKind, reason: Reason
) -> Appended:
    """Seal `loop.stopped` / `loop.completed` / `loop.cancelled`, closing every open turn."""
    closed = tuple(
        ClosedTurn(turn_id=t.turn_id, todo_id=t.todo_id, tool_calls_charged=unsettled_calls(t))
        for t in tx.rows.loop_turns(loop_id, TurnStatus.OPEN)
    )
    decision = Decision("allow" if reason.code == ReasonCode.ALL_TODOS_DONE else "deny", (reason,))
    return tx.append(
        loop_id,
        kind,
        who,
        LoopStopped(reason=reason.code, detail=reason.message, closed_turns=closed),
        decision=decision,
    )


def due_stop(reader: Rows, loop: LoopRow, now: datetime) -> Reason | None:
    """The stop rule that fires for `loop` now, if any (closed loops never stop again)."""
    if loop.status.closed:
        return None
    return evaluate_stop(reader.policy(loop.policy_digest), stop_facts(loop, now))


def apply_stop_rules(tx: Txn, loop_id: str, who: Principal) -> Appended | None:
    """Evaluate the stop rules on the loop as it stands in this transaction; seal the stop."""
    loop = tx.rows.loop_row(loop_id)
    reason = due_stop(tx.rows, loop, tx.now) if loop is not None else None
    if reason is None:
        return None
    kind = (
        ReceiptKind.LOOP_COMPLETED
        if reason.code == ReasonCode.ALL_TODOS_DONE
        else ReceiptKind.LOOP_STOPPED
    )
    return close_loop(tx, loop_id, who, kind, reason)
