"""Refused requests: a heartbeat, todo_add or request_approval the policy does not admit is
sealed as a `request.refused` receipt (a refusal is recorded, never silent)."""

from __future__ import annotations

from loopwarden.ledger.state.events import ReceiptKind, RefusedOperation, RequestRefused
from loopwarden.ledger.storage.store import Txn
from loopwarden.operations.operation import Call
from loopwarden.policy.decision import Decision
from loopwarden.principals import Principal


def refuse_request(
    tx: Txn,
    who: Principal,
    loop_id: str,
    operation: RefusedOperation,
    decision: Decision,
    *,
    turn_id: str | None = None,
    todo_id: str | None = None,
    fence: int | None = None,
    tool: str | None = None,
) -> str:
    """Seal a `request.refused` receipt with every reason (and, for a request about a turn,
    the fence and tool it sent); returns its id."""
    sealed = tx.append(
        loop_id,
        ReceiptKind.REQUEST_REFUSED,
        who,
        RequestRefused(operation=operation, fence=fence, tool=tool),
        decision=Decision("deny", decision.reasons),
        turn_id=turn_id,
        todo_id=todo_id,
    )
    return sealed.receipt_id


def refuse_on_turn(
    call: Call[Txn],
    operation: RefusedOperation,
    decision: Decision,
    fence: int,
    tool: str | None = None,
) -> str:
    """`refuse_request` for a request about the call's turn (heartbeat, request_approval)."""
    turn = call.turn
    return refuse_request(
        call.tx, call.who, turn.loop_id, operation, decision,
        turn_id=turn.turn_id, todo_id=turn.todo_id, fence=fence, tool=tool,
    )  # fmt: skip
