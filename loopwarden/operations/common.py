"""Result pieces and helpers shared by several operations."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from loopwarden.canonical import sha256_digest
from loopwarden.clock import format_time
from loopwarden.errors import Forbidden, InvalidInput, NotFound
from loopwarden.ledger.projection import LoopRow
from loopwarden.ledger.reader import Reader
from loopwarden.ledger.store import Txn
from loopwarden.policy import decision as codes
from loopwarden.policy.budgets import budget_lines
from loopwarden.policy.decision import Decision, Reason
from loopwarden.policy.model import LoopPolicy
from loopwarden.principals import Principal

Status = Literal["active", "paused", "completed", "stopped", "cancelled"]
Route = Literal["continue", "wait", "user_action_required", "stop"]
IDEMPOTENCY_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"

M = TypeVar("M", bound=BaseModel)


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReasonOut(Model):
    code: str = Field(
        description="Stable reason code, e.g. tool_denied or budget_exhausted:cost_usd."
    )
    message: str = Field(description="Human-readable explanation.")


class BudgetOut(Model):
    limit: int | float | None = Field(description="The policy's limit; null means no limit.")
    used: int | float
    remaining: int | float | None = Field(
        description="limit - used, never negative; null if no limit."
    )


class RateOut(Model):
    turns_per_window: int | None
    window_seconds: int | None
    used: int = Field(description="Turns claimed in the current window.")
    remaining: int | None


# Result pieces built from already-validated internal values skip re-validation (hot path).


def reasons_out(reasons: tuple[Reason, ...] | list[Reason]) -> list[ReasonOut]:
    return [ReasonOut.model_construct(code=r.code, message=r.message) for r in reasons]


def budgets_out(policy: LoopPolicy, loop: LoopRow) -> dict[str, BudgetOut]:
    return {
        dim: BudgetOut.model_construct(limit=line.limit, used=line.used, remaining=line.remaining)
        for dim, line in budget_lines(policy, loop.totals).items()
    }


def rate_out(policy: LoopPolicy, reader: Reader, loop_id: str, now: datetime) -> RateOut:
    rate = policy.rate
    used = claims_in_window(policy, reader, loop_id, now)
    remaining = None if rate.turns_per_window is None else max(rate.turns_per_window - used, 0)
    return RateOut(
        turns_per_window=rate.turns_per_window,
        window_seconds=rate.window_seconds,
        used=used,
        remaining=remaining,
    )


def claims_in_window(policy: LoopPolicy, reader: Reader, loop_id: str, now: datetime) -> int:
    if policy.rate.window_seconds is None:
        return 0
    since = format_time(now - timedelta(seconds=policy.rate.window_seconds))
    return reader.claims_since(loop_id, since)


def require_loop(reader: Reader, loop_id: str) -> LoopRow:
    loop = reader.loop_row(loop_id)
    if loop is None:
        raise NotFound(f"no loop with id {loop_id!r}")
    return loop


def require_visible(reader: Reader, loop: LoopRow, who: Principal) -> None:
    """Operators see every loop; an agent sees only loops whose policy admits it."""
    if not who.is_operator and not reader.policy(loop.policy_digest).admits_agent(who.id):
        raise Forbidden(f"agent {who.id!r} is not among loop {loop.loop_id!r}'s agents")


def request_digest(operation: str, request: BaseModel) -> str:
    """What an idempotency key is bound to: the operation and every argument but the key.

    Not a signed artifact, only compared with itself: pydantic's JSON (fields in declaration
    order, deterministic) is enough, and several times cheaper than RFC 8785 on the hot path.
    """
    text = request.model_dump_json(exclude={"idempotency_key"})
    return sha256_digest(f"{operation}\n{text}".encode())


def replay(
    reader: Reader,
    principal: str,
    key: str | None,
    operation: str,
    digest: str,
    result_type: type[M],
) -> M | Literal["conflict"] | None:
    """The stored result for a repeated idempotent call, `"conflict"` if the key was used with
    other arguments (or for another operation), or None if the key is new."""
    if key is None:
        return None
    prior = reader.idempotency(principal, key)
    if prior is None:
        return None
    stored_operation, stored_digest, response = prior
    if stored_operation != operation or stored_digest != digest:
        return "conflict"
    return result_type.model_validate_json(response)


def once(
    tx: Txn,
    who: Principal,
    operation: str,
    request: BaseModel,
    result_type: type[M],
    run: Callable[[], M],
    refuse: Callable[[Decision], M],
) -> M:
    """Run `run()` once per principal and `request.idempotency_key` (if the request has one).

    A repeat with the same arguments returns the stored result; the same key with other
    arguments is answered by `refuse(decision)` (which seals the refusal)."""
    key = getattr(request, "idempotency_key", None)
    digest = request_digest(operation, request)
    prior = replay(tx, who.id, key, operation, digest, result_type)
    if prior == "conflict":
        return refuse(
            deny(codes.IDEMPOTENCY_CONFLICT, "this idempotency key was used with other arguments")
        )
    if prior is not None:
        return prior
    result = run()
    if key is not None:
        tx.remember(who.id, key, operation, digest, dump(result))
    return result


def dump(result: BaseModel) -> dict[str, Any]:
    return result.model_dump(mode="json")


def deny(code: str, message: str, digest: str = "") -> Decision:
    return Decision("deny", (Reason(code, message),), digest)


def check_todo_graph(ids: list[str], deps: dict[str, tuple[str, ...]]) -> None:
    """Todo ids are unique, dependencies name known todos, and there is no cycle."""
    seen: set[str] = set()
    for todo_id in ids:
        if todo_id in seen:
            raise InvalidInput(f"todo id {todo_id!r} is used twice")
        seen.add(todo_id)
    for todo_id, needs in deps.items():
        for dep in needs:
            if dep == todo_id:
                raise InvalidInput(f"todo {todo_id!r} depends on itself")
            if dep not in seen:
                raise InvalidInput(f"todo {todo_id!r} depends on unknown todo {dep!r}")
    # Kahn's algorithm: anything left over sits on a cycle.
    indegree = {t: sum(1 for d in deps.get(t, ()) if d in seen) for t in ids}
    dependents: dict[str, list[str]] = {t: [] for t in ids}
    for t in ids:
        for d in deps.get(t, ()):
            if d in dependents:
                dependents[d].append(t)
    ready = [t for t, n in indegree.items() if n == 0]
    done = 0
    while ready:
        current = ready.pop()
        done += 1
        for nxt in dependents[current]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    if done != len(ids):
        stuck = sorted(t for t, n in indegree.items() if n > 0)
        raise InvalidInput(f"todo dependencies form a cycle among {', '.join(stuck[:5])}")
