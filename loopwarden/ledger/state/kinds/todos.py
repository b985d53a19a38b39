"""Todos: added to a loop after it opened (by an operator, or an agent the policy lets)."""

from __future__ import annotations

from loopwarden.ledger.state.events import ReceiptBody, ReceiptKind, TodoAdded
from loopwarden.ledger.state.folding import FoldError, add_todo
from loopwarden.ledger.state.judging import Judging, Verdict, todo_facts, verdicts
from loopwarden.ledger.state.rows import LoopView, Touched
from loopwarden.ledger.state.spec import AGENTS, KindSpec
from loopwarden.policy.evaluate import evaluate_todo_add


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


SPECS = (
    KindSpec(
        ReceiptKind.TODO_ADDED,
        TodoAdded,
        callers=AGENTS,
        touches=_touches_added,
        fold=_added,
        judge=_judge_added,
    ),
)
