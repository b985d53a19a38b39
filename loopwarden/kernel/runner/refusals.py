"""Refused requests: a heartbeat, todo_add or request_approval the policy does not admit is
sealed as a `request.refused` receipt (a refusal is recorded, never silent)."""

from __future__ import annotations

from loopwarden.kernel.runner.operation import Call
from loopwarden.kernel.runner.request_kinds import RefusedOperation, RequestRefused
from loopwarden.kernel.state.events import ReceiptKind
from loopwarden.kernel.state.rows import TurnRow
from loopwarden.kernel.store.store import Txn
from loopwarden.policy.decision import Decision


def refuse_request(call: Call[Txn], operation: RefusedOperation, decision: Decision) -> str:
    """Seal a `request.refused` receipt on the call's loop with every reason; returns its id."""
    return _seal(call, RequestRefused(operation=operation), decision)


def refuse_on_turn(
    call: Call[Txn],
    operation: RefusedOperation,
    decision: Decision,
    fence: int,
    tool: str | None = None,
) -> str:
    """`refuse_request` for a request about the call's turn (heartbeat, request_approval): the
    receipt names the turn and carries the fence and tool the request sent."""
    refused = RequestRefused(operation=operation, fence=fence, tool=tool)
    return _seal(call, refused, decision, call.turn)


def _seal(
    call: Call[Txn], refused: RequestRefused, decision: Decision, turn: TurnRow | None = None
) -> str:
    sealed = call.tx.append(
        call.loop.loop_id,
        ReceiptKind.REQUEST_REFUSED,
        call.who,
        refused,
        decision=Decision("deny", decision.reasons),
        turn_id=None if turn is None else turn.turn_id,
        todo_id=None if turn is None else turn.todo_id,
    )
    return sealed.receipt_id
