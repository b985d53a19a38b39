"""Todos: the work items of a loop — the dependency graph rules, `todo_add` and `todo_cancel`."""

from __future__ import annotations

from pydantic import Field

from loopwarden.errors import Conflict, InvalidInput, NotFound
from loopwarden.kernel.runner.operation import OPERATOR_CALLERS, Call
from loopwarden.kernel.runner.refusals import refuse_request
from loopwarden.kernel.runner.results import Model, ReasonOut, reasons_out
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import by_loop
from loopwarden.kernel.state.events import (
    MAX_DEPENDENCIES,
    MAX_SUMMARY,
    MAX_TITLE,
    LoopId,
    OptionalKey,
    ReceiptKind,
    TodoId,
    TodoSpec,
)
from loopwarden.kernel.state.facts import cancel_problem
from loopwarden.kernel.store.store import Txn
from loopwarden.loops.stops import apply_stop_rules
from loopwarden.policy.decision import Decision, Reason, ReasonCode
from loopwarden.policy.evaluate import TodoAddFacts, evaluate_todo_add
from loopwarden.statuses import LoopStatus, TodoStatus
from loopwarden.todos.todo_kinds import TodoAdded, TodoCancelled


class TodoAddRequest(Model):
    loop_id: LoopId
    title: str = Field(min_length=1, max_length=MAX_TITLE, description="What the new todo is.")
    todo_id: TodoId | None = Field(default=None, description="Id; default: the next free tN.")
    depends_on: list[TodoId] = Field(
        default_factory=list,
        max_length=MAX_DEPENDENCIES,
        description="Ids of todos that must be done first.",
    )
    order: int | None = Field(
        default=None, ge=0, le=10**9, description="Claim order; default: last."
    )
    idempotency_key: OptionalKey = None


class TodoAddResult(Model):
    added: bool
    reasons: list[ReasonOut]
    loop_id: str
    todo_id: str | None
    receipt_id: str


def _refuse(call: Call[Txn], req: TodoAddRequest, decision: Decision) -> TodoAddResult:
    receipt_id = refuse_request(call, "todo_add", decision)
    return TodoAddResult(
        added=False,
        reasons=reasons_out(decision.reasons),
        loop_id=call.loop.loop_id,
        todo_id=None,
        receipt_id=receipt_id,
    )


def _spec(tx: Txn, loop_id: str, todo_total: int, req: TodoAddRequest) -> TodoSpec:
    deps = tuple(dict.fromkeys(req.depends_on))
    missing = sorted(set(deps) - set(tx.rows.todos(loop_id, deps)))
    if missing:
        raise InvalidInput(f"depends_on names unknown todos: {', '.join(missing)}")
    todo_id = req.todo_id or _free_id(tx, loop_id, todo_total + 1)
    if tx.rows.todo(loop_id, todo_id) is not None:
        raise InvalidInput(f"loop {loop_id!r} already has a todo {todo_id!r}")
    order = req.order if req.order is not None else tx.rows.max_todo_order(loop_id) + 1
    return TodoSpec(id=todo_id, title=req.title, order=order, depends_on=deps)


def _free_id(tx: Txn, loop_id: str, start: int) -> str:
    n = start
    while tx.rows.todo(loop_id, f"t{n}") is not None:
        n += 1
    return f"t{n}"


@operation(access="write", scope=by_loop, refuse=_refuse)
def todo_add(call: Call[Txn], req: TodoAddRequest) -> TodoAddResult:
    """Add a todo you discovered, if the loop's policy lets agents add work.

    \f
    Add a todo. Operators always may (within `todos.max_todos`); agents only if the policy's
    `todos.agents_may_add` is true. Dependencies must name existing todos (`InvalidInput`); a
    policy refusal is sealed as `request.refused`.
    """
    tx, loop = call.tx, call.loop
    decision = evaluate_todo_add(
        tx.rows.policy(loop.policy_digest),
        TodoAddFacts(
            agent=call.who.id,
            is_operator=call.who.is_operator,
            loop_status=loop.status,
            todo_count=loop.todo_total,
        ),
        digest=loop.policy_digest,
    )
    if not decision.allowed:
        return _refuse(call, req, decision)
    spec = _spec(tx, loop.loop_id, loop.todo_total, req)
    sealed = tx.append(
        loop.loop_id,
        ReceiptKind.TODO_ADDED,
        call.who,
        TodoAdded(todo=spec),
        decision=decision,
        todo_id=spec.id,
        idempotency_key=req.idempotency_key,
    )
    return TodoAddResult(
        added=True, reasons=[], loop_id=loop.loop_id, todo_id=spec.id, receipt_id=sealed.receipt_id
    )


class TodoCancelRequest(Model):
    loop_id: LoopId
    todo_id: TodoId
    reason: str = Field(default="", max_length=MAX_SUMMARY, description="Why it is cancelled.")


class TodoCancelResult(Model):
    loop_id: str
    todo_id: str
    todo_status: TodoStatus
    status: LoopStatus = Field(
        description="The loop's status after it (cancelling the last owed todo completes the loop)."
    )
    receipt_id: str


@operation(access="write", scope=by_loop, callers=OPERATOR_CALLERS, tool=False)
def todo_cancel(call: Call[Txn], req: TodoCancelRequest) -> TodoCancelResult:
    """Operator only: cancel an open or blocked todo (seals `todo.cancelled`).

    A cancelled todo is never claimed again and no longer owed: the stop rule counts it with
    the done ones, so cancelling the last owed todo completes the loop. A claimed, done or
    cancelled todo, a closed loop, or a todo another unfinished todo depends on (cancel that
    one first) is a `Conflict`; an unknown todo is `NotFound`.
    """
    tx, loop = call.tx, call.loop
    if loop.status.closed:
        raise Conflict(f"loop {loop.loop_id!r} is {loop.status}: its todos are final")
    todo = tx.rows.todo(loop.loop_id, req.todo_id)
    if todo is None:
        raise NotFound(f"loop {loop.loop_id!r} has no todo {req.todo_id!r}")
    problem = cancel_problem(todo, tx.rows.all_todos(loop.loop_id))
    if problem is not None:
        raise Conflict(problem)
    reason = Reason(ReasonCode.CANCELLED, req.reason or f"cancelled by operator {call.who.id}")
    sealed = tx.append(
        loop.loop_id,
        ReceiptKind.TODO_CANCELLED,
        call.who,
        TodoCancelled(todo_id=todo.todo_id, reason=req.reason),
        decision=Decision("allow", (reason,)),
        todo_id=todo.todo_id,
    )
    apply_stop_rules(tx, loop.loop_id, call.who)
    return TodoCancelResult(
        loop_id=loop.loop_id,
        todo_id=todo.todo_id,
        todo_status=TodoStatus.CANCELLED,
        status=call.loop.status,
        receipt_id=sealed.receipt_id,
    )
