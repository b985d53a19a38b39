"""The fold: a loop's state machine. `apply(view, body, digest)` moves a `LoopView` by one receipt.

It reads nothing but the view and the receipt, so replaying a loop's receipts in order always
rebuilds the same view; the store persists exactly what this fold produces and the audit
compares the two. It refuses impossible transitions (`FoldError`): a receipt out of the loop's
chain, a claim of a todo that is not open, a report on a closed turn, a decision on an approval
that is not pending, any change to a closed loop but a recorded refusal. The write path folds
through it too, so it can never commit such a receipt either. Whether a *possible* transition
was *allowed* by the policy is the judge's question (`judge.py`). Each kind's step is declared
in its spec (each feature's `*_kinds.py`); the moves every kind makes the same way (a todo's
status count, a row's slot, a turn's close, a budget's charge) are the functions below.

A view may be *partial*: the write path loads only the rows a receipt touches (`touched`), folds,
and writes those rows back, so an append costs the same at 10 or 100,000 todos.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

from loopwarden.errors import LoopwardenError
from loopwarden.kernel.state.events import (
    ClosedTurn,
    ReceiptBody,
    TodoSpec,
    TurnReport,
    Usage,
    model_part,
)
from loopwarden.kernel.state.rows import LoopView, TodoRow, TurnRow, replace
from loopwarden.policy.budgets import Totals
from loopwarden.statuses import TODO_STATUSES, TodoStatus, TurnStatus

TYPE_CHECKING = False
if TYPE_CHECKING:
    from loopwarden.kernel.state.spec import KindSpec

ChainProblem = Literal["seq_gap", "prev_mismatch"]


class FoldError(LoopwardenError):
    """A receipt does not fit the state it is folded into (gap, broken chain, impossible move)."""

    code = "projection_mismatch"


def usage_totals(usage: Usage, tool_calls: int | None = None) -> Totals:
    """What one report charges, in exact units (turns are charged at claim time); `tool_calls`
    if given (`TurnReport.tool_calls`), else the reported usage's."""
    totals = usage.charge()
    if tool_calls is None:
        return totals
    return totals.minus(Totals(tool_calls=totals.tool_calls)).plus(Totals(tool_calls=tool_calls))


def row_of(table: dict[str, Any], key: str, what: str) -> Any:
    """The row `key` of a view's table; `FoldError` if the view does not hold it."""
    try:
        return table[key]
    except KeyError:
        raise FoldError(f"receipt refers to unknown {what} {key!r}") from None


def _counted(view: LoopView, old: TodoStatus | None, new: TodoStatus) -> None:
    counts = list(view.loop.todo_counts)
    if old is not None:
        counts[TODO_STATUSES.index(old)] -= 1
    counts[TODO_STATUSES.index(new)] += 1
    view.loop = replace(view.loop, todo_counts=tuple(counts))


def set_todo(view: LoopView, todo: TodoRow, **changes: Any) -> TodoRow:
    """Replace `todo` with `changes`, keeping the loop's counts by status."""
    new = replace(todo, **changes)
    if new.status != todo.status:
        _counted(view, todo.status, new.status)
    view.todos[new.todo_id] = new
    return new


def next_slot(view: LoopView) -> int:
    """The next row's slot: rows are numbered in the order the receipts create them."""
    slot = view.loop.slots
    view.loop = replace(view.loop, slots=slot + 1)
    return slot


def add_todo(view: LoopView, spec: TodoSpec, added_by: str) -> None:
    if spec.id in view.todos:
        raise FoldError(f"todo {spec.id!r} already exists")
    view.todos[spec.id] = TodoRow(
        loop_id=view.loop.loop_id,
        todo_id=spec.id,
        title=spec.title,
        ord=spec.order,
        depends_on=spec.depends_on,
        status=TodoStatus.OPEN,
        attempts=0,
        fence=0,
        added_by=added_by,
        turn_id=None,
        slot=next_slot(view),
    )
    _counted(view, None, TodoStatus.OPEN)


def release(view: LoopView, todo_id: str, *, failed: bool) -> None:
    """A claimed todo goes back to open; a failed attempt counts, and the last one blocks it."""
    todo = row_of(view.todos, todo_id, "todo")
    if todo.status != TodoStatus.CLAIMED:
        return
    attempts = todo.attempts + (1 if failed else 0)
    blocked = failed and attempts >= view.policy.claims.max_attempts
    set_todo(
        view, todo, status=TodoStatus.BLOCKED if blocked else TodoStatus.OPEN, attempts=attempts
    )


def open_turn(view: LoopView, turn_id: str) -> TurnRow:
    """The view's turn `turn_id`, which must be open."""
    turn: TurnRow = row_of(view.turns, turn_id, "turn")
    if turn.status != TurnStatus.OPEN:
        raise FoldError(f"turn {turn_id!r} is already {turn.status}")
    return turn


def close_turn(
    view: LoopView, turn_id: str, status: TurnStatus, at: datetime, outcome: str | None = None
) -> TurnRow:
    turn = open_turn(view, turn_id)
    new = replace(turn, status=status, closed_at=at, outcome=outcome)
    view.turns[turn_id] = new
    still_open = tuple(t for t in view.loop.open_turns if t != turn_id)
    view.loop = replace(view.loop, open_turns=still_open)
    return new


def close_turns(view: LoopView, closed: Iterable[ClosedTurn], at: datetime) -> None:
    for item in closed:
        charge_calls(view, item.turn_id, item.tool_calls_charged or 0)
        close_turn(view, item.turn_id, TurnStatus.CLOSED, at)
        release(view, item.todo_id, failed=False)


def charge(view: LoopView, report: TurnReport) -> None:
    """Charge a report's usage to its loop, and its tool calls to its turn's running charge."""
    charged = usage_totals(report.usage, report.tool_calls)
    if report.model_observed is not None:  # charged call by call as the gateway saw them
        charged = charged.minus(model_part(charged))
    view.loop = replace(view.loop, totals=view.loop.totals.plus(charged))
    _turn_charged(view, report.turn_id, report.tool_calls)


def charge_calls(view: LoopView, turn_id: str, calls: int) -> None:
    """Charge `calls` observed tool calls of a turn (its lease's expiry, its loop's close)."""
    view.loop = replace(view.loop, totals=view.loop.totals.plus(Totals(tool_calls=calls)))
    _turn_charged(view, turn_id, calls)


def _turn_charged(view: LoopView, turn_id: str, calls: int) -> None:
    turn = view.turns.get(turn_id)
    if turn is not None and calls:
        view.turns[turn_id] = replace(turn, tool_calls_charged=turn.tool_calls_charged + calls)


def chain_problem(head_seq: int, head_digest: str | None, body: ReceiptBody) -> ChainProblem | None:
    """Whether `body` continues a loop whose last receipt was `head_seq` with `head_digest`
    (0 and None before the first). The one chain check: the fold, the audit and bundles use it."""
    if body.seq != head_seq + 1:
        return "seq_gap"
    if body.prev != (head_digest or None):
        return "prev_mismatch"
    return None


def apply(spec: KindSpec[Any], view: LoopView | None, body: ReceiptBody, digest: str) -> LoopView:
    """Fold one receipt (its validated body and envelope digest) into `view` by its kind's
    `spec`; returns the view.

    `view` is None exactly for an opening kind (`loop.opened`). Mutates and returns the given
    view (rows are immutable and replaced). Raises `FoldError` if the receipt does not continue
    the loop's chain (seq, prev), refers to rows the view does not hold, or is impossible in
    that state.
    """
    if spec.pool is not None:
        raise FoldError(f"{body.kind} belongs to a pool's chain, not to a loop")
    if spec.opens is not None:
        if view is not None:
            raise FoldError(f"loop {body.loop_id!r} is opened twice")
        view = spec.opens.view(body, body.data)
    else:
        if view is None:
            raise FoldError(f"receipt {body.seq} of unknown loop {body.loop_id!r}")
        problem = chain_problem(view.loop.head_seq, view.loop.head_digest, body)
        if problem == "seq_gap":
            raise FoldError(
                f"loop {body.loop_id!r}: receipt seq {body.seq} does not follow {view.loop.head_seq}"
            )
        if problem == "prev_mismatch":
            raise FoldError(
                f"loop {body.loop_id!r}: receipt {body.seq} does not chain to its predecessor"
            )
        if view.loop.status.closed and not (spec.refusal or spec.after_close):
            raise FoldError(f"{body.kind} on a {view.loop.status} loop")
        assert spec.fold is not None  # the registry holds every spec to fold or opens
        spec.fold(view, body, body.data)
    view.loop = replace(view.loop, head_seq=body.seq, head_digest=digest, updated_at=body.at)
    return view
