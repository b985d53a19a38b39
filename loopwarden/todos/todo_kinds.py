"""Todos: added to a loop after it opened (by an operator, or an agent the policy lets), and
cancelled by an operator."""

from __future__ import annotations

from pydantic import Field

from loopwarden.kernel.state.events import (
    MAX_SUMMARY,
    Fact,
    ReceiptBody,
    ReceiptKind,
    TodoId,
    TodoSpec,
)
from loopwarden.kernel.state.facts import cancel_problem
from loopwarden.kernel.state.fold import FoldError, add_todo, row_of, set_todo
from loopwarden.kernel.state.legality import Judging, Verdict, todo_facts, verdicts
from loopwarden.kernel.state.rows import LoopView, Touched
from loopwarden.kernel.state.spec import AGENTS, OPERATORS, KindSpec, touching
from loopwarden.policy.evaluate import evaluate_todo_add
from loopwarden.statuses import TodoStatus


class TodoAdded(Fact):
    todo: TodoSpec


class TodoCancelled(Fact):
    """An operator cancelled an open or blocked todo no unfinished todo depends on: it is never
    claimed again and no longer owed (the stop rule counts it as settled)."""

    todo_id: TodoId
    reason: str = Field(default="", max_length=MAX_SUMMARY)


def _touches_added(body: ReceiptBody, data: TodoAdded) -> Touched:
    return Touched(todos=frozenset([data.todo.id, *data.todo.depends_on]))


def _added(view: LoopView, body: ReceiptBody, f: TodoAdded) -> None:
    unknown = [d for d in f.todo.depends_on if d not in view.todos]
    if unknown:
        raise FoldError(f"todo {f.todo.id!r} depends on unknown todos {', '.join(unknown)}")
    add_todo(view, f.todo, body.principal.id)


def _judge_added(ctx: Judging, view: LoopView, body: ReceiptBody, data: TodoAdded) -> list[Verdict]:
    found = evaluate_todo_add(view.policy, todo_facts(view, body), digest="").codes
    return verdicts(found, "todo added")


_touches_cancelled = touching(todos="todo_id")


def _cancelled(view: LoopView, body: ReceiptBody, f: TodoCancelled) -> None:
    todo = row_of(view.todos, f.todo_id, "todo")
    problem = cancel_problem(todo, view.todos.values())
    if problem is not None:
        raise FoldError(problem)
    set_todo(view, todo, status=TodoStatus.CANCELLED)


def _judge_cancelled(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: TodoCancelled
) -> list[Verdict]:
    """An operator's act (who may is checked by the registry); the fold holds its terms."""
    return []


SPECS = (
    KindSpec(
        ReceiptKind.TODO_ADDED,
        TodoAdded,
        callers=AGENTS,
        touches=_touches_added,
        fold=_added,
        judge=_judge_added,
    ),
    KindSpec(
        ReceiptKind.TODO_CANCELLED,
        TodoCancelled,
        callers=OPERATORS,
        touches=_touches_cancelled,
        fold=_cancelled,
        judge=_judge_cancelled,
    ),
)
