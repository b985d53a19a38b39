"""`heartbeat` (extend a lease) and `todo_add` (add work when the policy allows it)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from loopwarden.clock import format_time, parse_time
from loopwarden.errors import InvalidInput, NotFound
from loopwarden.ledger.events import (
    MAX_DEPENDENCIES,
    MAX_TITLE,
    LeaseRenewed,
    LoopId,
    RequestRefused,
    TodoAdded,
    TodoId,
    TodoSpec,
    TurnId,
)
from loopwarden.ledger.projection import TurnRow
from loopwarden.ledger.store import Txn
from loopwarden.policy import decision as codes
from loopwarden.policy.decision import Decision, Reason
from loopwarden.policy.evaluate import TodoAddFacts, evaluate_todo_add, turn_reasons
from loopwarden.principals import Principal
from loopwarden.tools.common import (
    IDEMPOTENCY_KEY_PATTERN,
    Model,
    ReasonOut,
    deny,
    once,
    reasons_out,
    require_loop,
)
from loopwarden.tools.kernel import Kernel
from loopwarden.tools.rules import expire_leases


def turn_problems(tx: Txn, who: Principal, turn: TurnRow, fence: int) -> list[Reason]:
    """Why `who` may not act on `turn` now (see `policy.evaluate.turn_reasons`)."""
    todo = tx.todo(turn.loop_id, turn.todo_id)
    loop = require_loop(tx, turn.loop_id)
    return turn_reasons(
        agent=who.id,
        loop_status=loop.status,
        turn_agent=turn.agent,
        turn_status=turn.status,
        turn_fence=turn.fence,
        todo_fence=todo.fence if todo else -1,
        given_fence=fence,
        lease_expires_at=parse_time(turn.lease_expires_at),
        now=tx.now_dt,
    )


def refuse_request(
    tx: Txn, who: Principal, loop_id: str, operation: str, reasons: list[Reason], **refs
) -> str:
    """Seal a `request.refused` receipt; returns its id."""
    sealed = tx.append(
        loop_id,
        "request.refused",
        who,
        RequestRefused(operation=operation),  # type: ignore[arg-type]
        decision=Decision("deny", tuple(reasons)),
        **refs,
    )
    return sealed.receipt_id


class HeartbeatRequest(Model):
    turn_id: TurnId
    fence: int = Field(ge=0, le=2**53)


class HeartbeatResult(Model):
    renewed: bool
    reasons: list[ReasonOut]
    turn_id: str
    lease_expires_at: str | None
    receipt_id: str


async def heartbeat(kernel: Kernel, who: Principal, req: HeartbeatRequest) -> HeartbeatResult:
    """Extend the caller's lease on an open turn by the policy's `lease_seconds` from now.

    Refused (sealed as `request.refused`) for another agent's turn, a closed turn, a stale fence
    or an already expired lease (which is then swept: `lease.expired`). `NotFound` for an
    unknown turn.
    """

    def write(tx: Txn) -> HeartbeatResult:
        turn = tx.turn(req.turn_id)
        if turn is None:
            raise NotFound(f"no turn with id {req.turn_id!r}")
        problems = turn_problems(tx, who, turn, req.fence)
        if problems:
            if any(p.code == codes.LEASE_EXPIRED for p in problems):
                expire_leases(tx, turn.loop_id, who)
            receipt_id = refuse_request(
                tx,
                who,
                turn.loop_id,
                "heartbeat",
                problems,
                turn_id=turn.turn_id,
                todo_id=turn.todo_id,
            )
            return HeartbeatResult(
                renewed=False,
                reasons=reasons_out(problems),
                turn_id=turn.turn_id,
                lease_expires_at=None,
                receipt_id=receipt_id,
            )
        loop = require_loop(tx, turn.loop_id)
        policy = tx.policy(loop.policy_digest)
        lease = format_time(tx.now_dt + timedelta(seconds=policy.claims.lease_seconds))
        sealed = tx.append(
            turn.loop_id,
            "lease.renewed",
            who,
            LeaseRenewed(turn_id=turn.turn_id, todo_id=turn.todo_id, lease_expires_at=lease),
            turn_id=turn.turn_id,
            todo_id=turn.todo_id,
        )
        return HeartbeatResult(
            renewed=True,
            reasons=[],
            turn_id=turn.turn_id,
            lease_expires_at=lease,
            receipt_id=sealed.receipt_id,
        )

    return await kernel.store.write(write)


class TodoAddRequest(Model):
    loop_id: LoopId
    title: str = Field(min_length=1, max_length=MAX_TITLE)
    todo_id: TodoId | None = Field(default=None, description="Id; default: the next free tN.")
    depends_on: list[TodoId] = Field(default_factory=list, max_length=MAX_DEPENDENCIES)
    order: int | None = Field(
        default=None, ge=0, le=10**9, description="Claim order; default: last."
    )
    idempotency_key: str | None = Field(
        default=None,
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="Optional key making a retried call return the original result.",
    )


class TodoAddResult(Model):
    added: bool
    reasons: list[ReasonOut]
    loop_id: str
    todo_id: str | None
    receipt_id: str


async def todo_add(kernel: Kernel, who: Principal, req: TodoAddRequest) -> TodoAddResult:
    """Add a todo. Operators always may (within `todos.max_todos`); agents only if the policy's
    `todos.agents_may_add` is true and they are among its agents. Dependencies must name existing
    todos (`InvalidInput`); a policy refusal is sealed as `request.refused`."""

    def write(tx: Txn) -> TodoAddResult:
        loop = require_loop(tx, req.loop_id)

        def refuse(decision: Decision) -> TodoAddResult:
            receipt_id = refuse_request(tx, who, loop.loop_id, "todo_add", list(decision.reasons))
            return TodoAddResult(
                added=False,
                reasons=reasons_out(decision.reasons),
                loop_id=loop.loop_id,
                todo_id=None,
                receipt_id=receipt_id,
            )

        def add() -> TodoAddResult:
            policy = tx.policy(loop.policy_digest)
            if not who.is_operator and not policy.admits_agent(who.id):
                # An outsider learns nothing (not even how many todos the loop has).
                return refuse(deny(codes.AGENT_NOT_ALLOWED, "you are not among the loop's agents"))
            decision = evaluate_todo_add(
                policy,
                TodoAddFacts(
                    agent=who.id,
                    is_operator=who.is_operator,
                    loop_status=loop.status,
                    todo_count=loop.todo_total,
                ),
                digest=loop.policy_digest,
            )
            if not decision.allowed:
                return refuse(decision)
            deps = tuple(dict.fromkeys(req.depends_on))
            missing = sorted(set(deps) - set(tx.todos(loop.loop_id, deps)))
            if missing:
                raise InvalidInput(f"depends_on names unknown todos: {', '.join(missing)}")
            todo_id = req.todo_id or _free_id(tx, loop.loop_id, loop.todo_total + 1)
            if tx.todo(loop.loop_id, todo_id) is not None:
                raise InvalidInput(f"loop {loop.loop_id!r} already has a todo {todo_id!r}")
            order = req.order if req.order is not None else tx.max_todo_order(loop.loop_id) + 1
            spec = TodoSpec(id=todo_id, title=req.title, order=order, depends_on=deps)
            sealed = tx.append(
                loop.loop_id,
                "todo.added",
                who,
                TodoAdded(todo=spec),
                decision=decision,
                todo_id=todo_id,
                idempotency_key=req.idempotency_key,
            )
            return TodoAddResult(
                added=True,
                reasons=[],
                loop_id=loop.loop_id,
                todo_id=todo_id,
                receipt_id=sealed.receipt_id,
            )

        return once(tx, who, "todo_add", req, TodoAddResult, add, refuse)

    return await kernel.store.write(write)


def _free_id(tx: Txn, loop_id: str, start: int) -> str:
    n = start
    while tx.todo(loop_id, f"t{n}") is not None:
        n += 1
    return f"t{n}"
