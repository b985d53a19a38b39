"""Who sees which loop, and how each request names its loop.

Operators see every loop; an agent (or an observer speaking for one) sees only the loops whose
policy admits it. Outside its loops a caller is told the same thing whether a loop, turn,
approval or receipt exists or not: the scope's `missing` message.
"""

from __future__ import annotations

from typing import Any

from loopwarden.ledger.state.rows import LoopRow
from loopwarden.ledger.storage.reader import Reader
from loopwarden.operations.operation import Located, Scope
from loopwarden.principals import Principal


def visible(reader: Reader, who: Principal, loop: LoopRow) -> bool:
    return who.is_operator or reader.policy(loop.policy_digest).admits_agent(who.id)


def _loop(reader: Reader, req: Any) -> Located | None:
    loop = reader.loop_row(req.loop_id)
    return Located(loop) if loop is not None else None


def _turn(reader: Reader, req: Any) -> Located | None:
    turn = reader.turn(req.turn_id)
    loop = reader.loop_row(turn.loop_id) if turn is not None else None
    return Located(loop, turn=turn) if loop is not None else None


def _approval(reader: Reader, req: Any) -> Located | None:
    approval = reader.approval(req.approval_id)
    loop = reader.loop_row(approval.loop_id) if approval is not None else None
    return Located(loop, approval=approval) if loop is not None else None


def _receipt(reader: Reader, req: Any) -> Located | None:
    if req.receipt_id is not None:
        row = reader.receipt_by_id(req.receipt_id)
    else:
        row = reader.receipt_by_seq(req.loop_id, req.seq)
    loop = reader.loop_row(row.loop_id) if row is not None else None
    return Located(loop, receipt=row) if loop is not None else None


def _receipt_missing(req: Any) -> str:
    return f"no receipt {req.receipt_id or f'{req.loop_id} #{req.seq}'}"


by_loop = Scope(_loop, lambda req: f"no loop with id {req.loop_id!r}")
by_turn = Scope(_turn, lambda req: f"no turn with id {req.turn_id!r}")
by_approval = Scope(_approval, lambda req: f"no approval with id {req.approval_id!r}")
by_receipt = Scope(_receipt, _receipt_missing)
