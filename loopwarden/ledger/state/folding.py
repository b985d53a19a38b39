"""The fold's shared moves: rows created, replaced and counted the same way by every kind.

Each kind's fold step (`kinds/`) is written with these, so a todo's status count, a row's slot,
a turn's close or a budget's charge is done in one place. Rows are immutable and replaced
(`rows.replace`); the view is mutated.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from loopwarden.errors import LoopwardenError
from loopwarden.ledger.state.events import ClosedTurn, TodoSpec, TurnReport, Usage
from loopwarden.ledger.state.rows import LoopView, TodoRow, TurnRow, replace
from loopwarden.policy.budgets import Totals, to_micros
from loopwarden.statuses import TODO_STATUSES, TodoStatus, TurnStatus


class FoldError(LoopwardenError):
    """A receipt does not fit the state it is folded into (gap, broken chain, impossible move)."""

    code = "projection_mismatch"


def usage_totals(usage: Usage, tool_calls: int | None = None) -> Totals:
    """What one report charges, in exact units (turns are charged at claim time); `tool_calls`
    if given (`TurnReport.tool_calls`), else the reported usage's."""
    return Totals(
        model_calls=usage.model_calls,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        tool_calls=usage.tool_calls if tool_calls is None else tool_calls,
        cost_micros=to_micros(usage.cost_usd),
        wall_micros=to_micros(usage.wall_seconds),
    )


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
