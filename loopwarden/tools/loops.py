"""Operator operations on whole loops: open, pause, resume, cancel."""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from pydantic import Field

from loopwarden.errors import Conflict, Forbidden, InvalidInput, PolicyError
from loopwarden.ledger.events import (
    MAX_DEPENDENCIES,
    MAX_OBJECTIVE,
    MAX_TITLE,
    LoopId,
    LoopOpened,
    LoopStatusChanged,
    TodoId,
    TodoSpec,
)
from loopwarden.ledger.reader import Reader
from loopwarden.ledger.store import Txn
from loopwarden.policy.decision import Decision, Reason
from loopwarden.policy.digest import policy_digest, policy_document
from loopwarden.policy.loader import policy_from_data
from loopwarden.policy.model import MAX_TODOS_CEILING, LoopPolicy
from loopwarden.principals import Principal
from loopwarden.tools.common import Model, Status, check_todo_graph, require_loop
from loopwarden.tools.kernel import Kernel
from loopwarden.tools.rules import close_loop


def require_operator(who: Principal, operation: str) -> None:
    if not who.is_operator:
        raise Forbidden(f"{operation} is an operator operation; {who.id!r} is an agent")


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
    objective: str = Field(min_length=1, max_length=MAX_OBJECTIVE)
    policy: dict[str, Any] = Field(
        description="The policy document (same keys as the policy file)."
    )
    todos: list[TodoInput] = Field(default_factory=list, max_length=MAX_TODOS_CEILING)
    loop_id: LoopId | None = None


class OpenLoopResult(Model):
    loop_id: str
    policy_digest: str
    todos: int
    receipt_id: str
    status: Status


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


async def open_loop(kernel: Kernel, who: Principal, req: OpenLoopRequest) -> OpenLoopResult:
    """Open a governed loop: validate the policy and the todo graph, seal `loop.opened`.

    Operator only (`Forbidden`). An invalid policy is a `PolicyError` naming the field; duplicate
    ids, unknown dependencies or cycles are `InvalidInput`; an existing loop id is `Conflict`.
    """
    require_operator(who, "open_loop")
    policy: LoopPolicy = policy_from_data(req.policy, "policy")
    specs = _todo_specs(req.todos)
    if len(specs) > policy.todos.max_todos:
        raise PolicyError(
            f"{len(specs)} todos exceed the policy's todos.max_todos ({policy.todos.max_todos})"
        )
    digest = policy_digest(policy)
    loop_id = req.loop_id or f"loop-{secrets.token_hex(4)}"
    facts = LoopOpened(objective=req.objective, policy=policy_document(policy), todos=specs)

    def write(tx: Txn) -> OpenLoopResult:
        if tx.loop_row(loop_id) is not None:
            raise Conflict(f"a loop with id {loop_id!r} already exists")
        sealed = tx.append(loop_id, "loop.opened", who, facts, policy_digest=digest)
        return OpenLoopResult(
            loop_id=loop_id,
            policy_digest=digest,
            todos=len(specs),
            receipt_id=sealed.receipt_id,
            status="active",
        )

    return await kernel.store.write(write)


class LoopSummary(Model):
    loop_id: str
    objective: str
    status: Status
    stop_reason: str | None
    head_seq: int


class LoopList(Model):
    loops: list[LoopSummary]


async def list_loops(kernel: Kernel, who: Principal) -> LoopList:
    """The loops `who` may see: every loop for an operator, the loops whose policy admits it for
    an agent. Read-only."""

    def read(reader: Reader) -> LoopList:
        return LoopList(
            loops=[
                LoopSummary(
                    loop_id=loop.loop_id,
                    objective=loop.objective,
                    status=loop.status,  # type: ignore[arg-type]
                    stop_reason=loop.stop_reason,
                    head_seq=loop.head_seq,
                )
                for loop in reader.loops()
                if who.is_operator or reader.policy(loop.policy_digest).admits_agent(who.id)
            ]
        )

    return await kernel.store.read(read)


class LoopControlRequest(Model):
    loop_id: LoopId
    reason: Annotated[str, Field(max_length=MAX_OBJECTIVE)] = ""


class LoopControlResult(Model):
    loop_id: str
    status: Status
    receipt_id: str


_TRANSITIONS = {  # action: (receipt kind, statuses it applies to, resulting status, reason code)
    "pause": ("loop.paused", {"active"}, "paused", "paused"),
    "resume": ("loop.resumed", {"paused"}, "active", "resumed"),
    "cancel": ("loop.cancelled", {"active", "paused"}, "cancelled", "cancelled"),
}


async def control_loop(
    kernel: Kernel, who: Principal, action: str, req: LoopControlRequest
) -> LoopControlResult:
    """Pause, resume or cancel a loop (operator only).

    Pausing stops new claims; open turns may still report. Cancelling closes every open turn.
    A transition from the wrong status (say, resuming an active loop) is a `Conflict`.
    """
    require_operator(who, action)
    if action not in _TRANSITIONS:
        raise InvalidInput(f"unknown loop action {action!r}")
    kind, sources, target, code = _TRANSITIONS[action]

    def write(tx: Txn) -> LoopControlResult:
        loop = require_loop(tx, req.loop_id)
        if loop.status not in sources:
            raise Conflict(f"cannot {action} loop {req.loop_id!r}: it is {loop.status}")
        reason = Reason(code, req.reason or f"{action} by operator {who.id}")
        if action == "cancel":
            sealed = close_loop(tx, req.loop_id, who, kind, reason)
        else:
            sealed = tx.append(
                req.loop_id,
                kind,
                who,
                LoopStatusChanged(reason=req.reason),
                decision=Decision("allow", (reason,)),
            )
        return LoopControlResult(loop_id=req.loop_id, status=target, receipt_id=sealed.receipt_id)  # type: ignore[arg-type]

    return await kernel.store.write(write)
