"""Who sees which loop, and how each request names its loop.

Operators see every loop; an agent (or an observer speaking for one) sees only the loops whose
policy admits it. Outside its loops a caller is told the same thing whether a loop, turn,
approval or receipt exists or not: the scope's `missing` message. A mistyped loop id gets the
nearest loop ids the caller may see ("did you mean"), never one it may not.
"""

from __future__ import annotations

import difflib
from typing import Any

from loopwarden.kernel.runner.operation import Located, Scope
from loopwarden.kernel.state.rows import LoopRow
from loopwarden.kernel.store.reader import Reader, Rows
from loopwarden.principals import Principal


def visible(reader: Rows, who: Principal, loop: LoopRow) -> bool:
    return who.is_operator or reader.policy(loop.policy_digest).admits_agent(who.id)


def nearest_visible(reader: Reader, who: Principal, loop_id: str, limit: int = 3) -> list[str]:
    """The ids of the loops `who` may see that look most like `loop_id` (a typo's likely
    meaning), closest first, at most `limit`. Chosen among visible loops only, so the answer
    is the same whether a loop `who` may not see exists under `loop_id` or not."""
    seen = [row.loop_id for row in reader.loops() if visible(reader, who, row)]
    return difflib.get_close_matches(loop_id, seen, n=limit, cutoff=0.6)


def did_you_mean(names: list[str]) -> str:
    """`; did you mean 'a' or 'b'?` for a `missing` message, or nothing without names."""
    if not names:
        return ""
    quoted = [repr(name) for name in names]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f"; did you mean {listed}?"


def no_loop(loop_id: str) -> str:
    return f"no loop with id {loop_id!r}"


def missing_loop(reader: Reader, who: Principal, loop_id: str) -> str:
    """The whole message for a loop id `who` cannot find, its hint included."""
    return no_loop(loop_id) + _loop_hint(reader, who, loop_id)


def _loop_hint(reader: Reader, who: Principal, loop_id: str) -> str:
    seen = [row.loop_id for row in reader.loops() if visible(reader, who, row)]
    if not seen and who.is_operator:  # an operator sees every loop: this store has none
        return (
            "; this server's store holds no loop at all (is its --home or LOOPWARDEN_HOME the "
            "one that holds your loops?)"
        )
    return did_you_mean(difflib.get_close_matches(loop_id, seen, n=3, cutoff=0.6))


def _loop(reader: Rows, req: Any) -> Located | None:
    loop = reader.loop_row(req.loop_id)
    return Located(loop) if loop is not None else None


def _turn(reader: Rows, req: Any) -> Located | None:
    turn = reader.turn(req.turn_id)
    loop = reader.loop_row(turn.loop_id) if turn is not None else None
    return Located(loop, turn=turn) if loop is not None else None


def _approval(reader: Rows, req: Any) -> Located | None:
    approval = reader.approval(req.approval_id)
    loop = reader.loop_row(approval.loop_id) if approval is not None else None
    return Located(loop, approval=approval) if loop is not None else None


def _receipt(reader: Rows, req: Any) -> Located | None:
    assert isinstance(reader, Reader), "a receipt is located by a read, never in a write"
    if req.receipt_id is not None:
        row = reader.receipt_by_id(req.receipt_id)
    else:
        row = reader.receipt_by_seq(req.loop_id, req.seq)
    loop = reader.loop_row(row.loop_id) if row is not None else None
    return Located(loop, receipt=row) if loop is not None else None


def _receipt_missing(req: Any) -> str:
    return f"no receipt {req.receipt_id or f'{req.loop_id} #{req.seq}'}"


by_loop = Scope(
    _loop, lambda req: no_loop(req.loop_id), lambda r, who, req: _loop_hint(r, who, req.loop_id)
)
by_turn = Scope(_turn, lambda req: f"no turn with id {req.turn_id!r}")
by_approval = Scope(_approval, lambda req: f"no approval with id {req.approval_id!r}")
by_receipt = Scope(_receipt, _receipt_missing)
