"""Whole loops: opened by an operator, paused, resumed and cancelled (the loop list, whose lines
carry who must act next, is a read view: `projection/loop_list.py`)."""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import Field

from loopwarden.errors import Conflict, PolicyError
from loopwarden.kernel.runner.operation import OPERATOR_CALLERS, Call, Operation
from loopwarden.kernel.runner.results import Model
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import by_loop
from loopwarden.kernel.state.events import (
    MAX_DEPENDENCIES,
    MAX_OBJECTIVE,
    MAX_TITLE,
    LoopId,
    LoopOpened,
    ReceiptKind,
    TodoId,
    TodoSpec,
)
from loopwarden.kernel.state.facts import check_todo_graph
from loopwarden.kernel.store.store import Txn
from loopwarden.loops.loop_kinds import LoopPolicyChanged, LoopStatusChanged
from loopwarden.loops.stops import close_loop
from loopwarden.policy.decision import Decision, Reason, ReasonCode
from loopwarden.policy.digest import policy_digest, policy_document
from loopwarden.policy.loader import policy_from_data
from loopwarden.policy.model import MAX_TODOS_CEILING, LoopPolicy
from loopwarden.statuses import LoopStatus


class TodoInput(Model):
    title: str = Field(min_length=1, max_length=MAX_TITLE, description="What the todo is.")
    id: TodoId | None = Field(default=None, description="Id; defaults to t1, t2, … by position.")
    depends_on: tuple[TodoId, ...] = Field(
        default=(), max_length=MAX_DEPENDENCIES, description="Ids of todos that must be done first."
    )
    order: int | None = Field(
        default=None, ge=0, le=10**9, description="Claim order; defaults to position."
    )


class OpenLoopRequest(Model):
    objective: str = Field(
        min_length=1, max_length=MAX_OBJECTIVE, description="What the loop is for."
    )
    policy: dict[str, Any] = Field(description="The policy document (same keys as a policy file).")
    todos: list[TodoInput] = Field(
        default_factory=list,
        max_length=MAX_TODOS_CEILING,
        description="Initial todos, in claim order.",
    )
    loop_id: LoopId | None = Field(default=None, description="Optional id for the loop.")


class OpenLoopResult(Model):
    loop_id: str
    policy_digest: str
    todos: int
    receipt_id: str
    status: LoopStatus


def _todo_specs(todos: list[TodoInput]) -> tuple[TodoSpec, ...]:
    specs = tuple(
        TodoSpec(
            id=item.id or f"t{index}",
            title=item.title,
            order=index if item.order is None else item.order,
            depends_on=tuple(dict.fromkeys(item.depends_on)),
        )
        for index, item in enumerate(todos, start=1)
    )
    check_todo_graph([s.id for s in specs], {s.id: s.depends_on for s in specs})
    return specs


@operation(access="write", callers=OPERATOR_CALLERS)
def open_loop(call: Call[Txn], req: OpenLoopRequest) -> OpenLoopResult:
    """Operator only: open a governed loop with an objective, a policy and initial todos.
    \f
    Validates the policy and the todo graph, then seals `loop.opened`. An invalid policy is a `PolicyError` naming the field; duplicate ids, unknown dependencies
    or cycles are `InvalidInput`; an existing loop id is `Conflict`.
    """
    policy = policy_from_data(req.policy, "policy")
    specs = _todo_specs(req.todos)
    if len(specs) > policy.todos.max_todos:
        raise PolicyError(
            f"{len(specs)} todos exceed the policy's todos.max_todos ({policy.todos.max_todos})"
        )
    _check_pools(call.tx, policy)
    digest = policy_digest(policy)
    loop_id = req.loop_id or f"loop-{secrets.token_hex(4)}"
    if call.tx.rows.loop_row(loop_id) is not None:
        raise Conflict(f"a loop with id {loop_id!r} already exists")
    facts = LoopOpened(objective=req.objective, policy=policy_document(policy), todos=specs)
    sealed = call.tx.append(loop_id, ReceiptKind.LOOP_OPENED, call.who, facts, policy_digest=digest)
    return OpenLoopResult(
        loop_id=loop_id,
        policy_digest=digest,
        todos=len(specs),
        receipt_id=sealed.receipt_id,
        status=LoopStatus.ACTIVE,
    )


def _check_pools(tx: Txn, policy: LoopPolicy) -> None:
    """`PolicyError` unless every pool the policy names exists."""
    unknown = [name for name in policy.pools or () if name not in tx.rows.pools()]
    if unknown:
        raise PolicyError(
            f"pools: no pool named {', '.join(map(repr, unknown))}; create it first "
            "(`loopwarden pool create NAME …`)"
        )


class SetPolicyRequest(Model):
    loop_id: LoopId
    policy: dict[str, Any] = Field(description="The new policy document (a policy file's keys).")
    reason: str = Field(default="", max_length=MAX_OBJECTIVE, description="Why (recorded).")


class SetPolicyResult(Model):
    loop_id: str
    policy_digest: str = Field(description="The loop's policy now.")
    previous_digest: str = Field(description="The policy it replaced (the same if unchanged).")
    changed: bool = Field(description="False if the loop already had exactly this policy.")
    receipt_id: str | None = Field(description="The `loop.policy_changed` receipt, if sealed.")


@operation(access="write", scope=by_loop, callers=OPERATOR_CALLERS, tool=False)
def set_policy(call: Call[Txn], req: SetPolicyRequest) -> SetPolicyResult:
    """Operator only: replace a loop's policy. Budgets already used carry over.

    Validates the policy as `open_loop` does (pools it names must exist) and seals
    `loop.policy_changed` with both digests; every later receipt is decided and judged by the
    new policy. The loop must not be closed (`Conflict`). The same policy again changes
    nothing and seals nothing."""
    loop = call.loop
    if loop.status.closed:
        raise Conflict(f"loop {loop.loop_id!r} is {loop.status}: its policy no longer matters")
    policy = policy_from_data(req.policy, "policy")
    _check_pools(call.tx, policy)
    digest = policy_digest(policy)
    if digest == loop.policy_digest:
        return SetPolicyResult(loop_id=loop.loop_id, policy_digest=digest,
                               previous_digest=digest, changed=False, receipt_id=None)  # fmt: skip
    facts = LoopPolicyChanged(
        policy=policy_document(policy), previous_digest=loop.policy_digest, reason=req.reason
    )
    sealed = call.tx.append(
        loop.loop_id, ReceiptKind.LOOP_POLICY_CHANGED, call.who, facts, policy_digest=digest
    )
    return SetPolicyResult(
        loop_id=loop.loop_id,
        policy_digest=digest,
        previous_digest=loop.policy_digest,
        changed=True,
        receipt_id=sealed.receipt_id,
    )


class LoopControlRequest(Model):
    loop_id: LoopId
    reason: str = Field(default="", max_length=MAX_OBJECTIVE, description="Why (recorded).")


class LoopControlResult(Model):
    loop_id: str
    status: LoopStatus
    receipt_id: str


def _control(
    kind: ReceiptKind, action: str, sources: set[LoopStatus], target: LoopStatus
) -> Operation[Any, Any]:
    """Pause, resume and cancel differ only in the transition they seal."""

    def body(call: Call[Txn], req: LoopControlRequest) -> LoopControlResult:
        loop = call.loop
        if loop.status not in sources:
            raise Conflict(f"cannot {action} loop {req.loop_id!r}: it is {loop.status}")
        reason = Reason(target_code, req.reason or f"{action} by operator {call.who.id}")
        if kind == ReceiptKind.LOOP_CANCELLED:
            sealed = close_loop(call.tx, req.loop_id, call.who, kind, reason)
        else:
            sealed = call.tx.append(
                req.loop_id,
                kind,
                call.who,
                LoopStatusChanged(reason=req.reason),
                decision=Decision("allow", (reason,)),
            )
        return LoopControlResult(loop_id=req.loop_id, status=target, receipt_id=sealed.receipt_id)

    target_code = {
        "pause": ReasonCode.PAUSED,
        "resume": ReasonCode.RESUMED,
        "cancel": ReasonCode.CANCELLED,
    }[action]
    body.__doc__ = f"Operator only: {action} a loop (seals `{kind}`)."
    declare = operation(
        name=f"{action}_loop", access="write", scope=by_loop, callers=OPERATOR_CALLERS, tool=False
    )
    return declare(body)


pause_loop = _control(ReceiptKind.LOOP_PAUSED, "pause", {LoopStatus.ACTIVE}, LoopStatus.PAUSED)
resume_loop = _control(ReceiptKind.LOOP_RESUMED, "resume", {LoopStatus.PAUSED}, LoopStatus.ACTIVE)
cancel_loop = _control(
    ReceiptKind.LOOP_CANCELLED,
    "cancel",
    {LoopStatus.ACTIVE, LoopStatus.PAUSED},
    LoopStatus.CANCELLED,
)
CONTROLS: dict[str, Operation[Any, Any]] = {
    "pause": pause_loop,
    "resume": resume_loop,
    "cancel": cancel_loop,
}
"""The operator's loop controls by action name."""
