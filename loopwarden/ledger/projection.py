"""The projection: a loop's current state as a pure fold over its receipts.

`apply(view, body, digest)` folds one receipt into a `LoopView` and returns it. It reads nothing
but the view and the receipt, so replaying a loop's receipts in order always rebuilds the same
view; the store persists exactly what this fold produces and the audit compares the two.

A view may be *partial*: the write path loads only the rows a receipt touches (`touched`), folds,
and writes those rows back, so an append costs the same at 10 or 100,000 todos.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from loopwarden.errors import LoopwardenError
from loopwarden.ledger.events import (
    ApprovalDecided,
    ApprovalRequested,
    ClosedTurn,
    Fact,
    LeaseExpired,
    LeaseRenewed,
    LoopOpened,
    LoopStatusChanged,
    LoopStopped,
    ReceiptBody,
    TodoAdded,
    TodoSpec,
    TurnClaimed,
    TurnRefused,
    TurnReported,
    Usage,
)
from loopwarden.policy.budgets import Totals, to_micros
from loopwarden.policy.loader import policy_from_data
from loopwarden.policy.model import LoopPolicy

TODO_STATUSES = ("open", "claimed", "done", "blocked")
R = TypeVar("R")


class ProjectionError(LoopwardenError):
    """A receipt does not fit the state it is folded into (gap, broken chain, missing row)."""

    code = "projection_mismatch"


@dataclass(frozen=True)
class LoopRow:
    loop_id: str
    objective: str
    status: str
    stop_reason: str | None
    policy_digest: str
    opened_at: str
    opened_by: str
    totals: Totals
    todo_counts: tuple[int, int, int, int]  # open, claimed, done, blocked
    failure_signature: str | None
    failure_streak: int
    head_seq: int
    head_digest: str
    updated_at: str

    def count(self, status: str) -> int:
        return self.todo_counts[TODO_STATUSES.index(status)]

    @property
    def todo_total(self) -> int:
        return sum(self.todo_counts)


@dataclass(frozen=True)
class TodoRow:
    loop_id: str
    todo_id: str
    title: str
    ord: int
    depends_on: tuple[str, ...]
    status: str
    attempts: int
    fence: int
    added_by: str
    turn_id: str | None


@dataclass(frozen=True)
class TurnRow:
    turn_id: str
    loop_id: str
    todo_id: str
    agent: str
    fence: int
    status: str  # open | reported | refused | expired | closed
    claimed_at: str
    lease_expires_at: str
    closed_at: str | None
    outcome: str | None


@dataclass(frozen=True)
class ApprovalRow:
    approval_id: str
    loop_id: str
    turn_id: str
    todo_id: str
    tool: str
    summary: str
    artifact_digest: str | None
    status: str  # pending | approved | rejected | consumed
    requested_by: str
    requested_at: str
    decided_by: str | None
    decided_at: str | None
    expires_at: str | None
    reason: str | None
    consumed_by: str | None


@dataclass
class LoopView:
    """One loop's projection, whole (rebuilt) or partial (the rows one receipt touches)."""

    loop: LoopRow
    policy: LoopPolicy
    todos: dict[str, TodoRow] = field(default_factory=dict)
    turns: dict[str, TurnRow] = field(default_factory=dict)
    approvals: dict[str, ApprovalRow] = field(default_factory=dict)


@dataclass(frozen=True)
class Touched:
    """Existing rows a receipt reads or changes (new rows are created, not loaded)."""

    todos: frozenset[str] = frozenset()
    turns: frozenset[str] = frozenset()
    approvals: frozenset[str] = frozenset()


def touched(body: ReceiptBody) -> Touched:
    data = body.data
    kind = body.kind
    if kind == "turn.claimed":
        return Touched(todos=frozenset([data["todo_id"]]))
    if kind == "todo.added":
        return Touched(todos=frozenset([data["todo"]["id"]]))
    if kind in ("lease.renewed", "lease.expired"):
        return Touched(todos=frozenset([data["todo_id"]]), turns=frozenset([data["turn_id"]]))
    if kind in ("turn.reported", "turn.refused"):
        return Touched(
            todos=frozenset([data["todo_id"]]),
            turns=frozenset([data["turn_id"]]),
            approvals=frozenset(data.get("approval_ids", ())),
        )
    if kind == "approval.decided":
        return Touched(approvals=frozenset([data["approval_id"]]))
    if kind in ("loop.stopped", "loop.completed", "loop.cancelled"):
        closed = data.get("closed_turns", ())
        return Touched(
            todos=frozenset(c["todo_id"] for c in closed),
            turns=frozenset(c["turn_id"] for c in closed),
        )
    return Touched()


# --- helpers ---------------------------------------------------------------------------------


def replace(row: R, **changes: object) -> R:
    """`dataclasses.replace` for the projection's plain frozen rows, without re-running
    `__init__` (the fold calls this several times per receipt; it is the audit's hot path).
    Rows have no `__post_init__`, so copying the field dict is the whole construction."""
    new = object.__new__(type(row))
    new.__dict__.update(row.__dict__, **changes)
    return new


def usage_totals(usage: Usage) -> Totals:
    """What one report charges, in exact units (turns are charged at claim time)."""
    return Totals(
        model_calls=usage.model_calls,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        tool_calls=usage.tool_calls,
        cost_micros=to_micros(usage.cost_usd),
        wall_micros=to_micros(usage.wall_seconds),
    )


def _row(table: dict, key: str, what: str):
    try:
        return table[key]
    except KeyError:
        raise ProjectionError(f"receipt refers to unknown {what} {key!r}") from None


def _set_todo(view: LoopView, todo: TodoRow, **changes) -> TodoRow:
    new = replace(todo, **changes)
    if new.status != todo.status:
        counts = list(view.loop.todo_counts)
        counts[TODO_STATUSES.index(todo.status)] -= 1
        counts[TODO_STATUSES.index(new.status)] += 1
        view.loop = replace(view.loop, todo_counts=tuple(counts))  # type: ignore[arg-type]
    view.todos[new.todo_id] = new
    return new


def _add_todo(view: LoopView, spec: TodoSpec, added_by: str) -> None:
    if spec.id in view.todos:
        raise ProjectionError(f"todo {spec.id!r} already exists")
    view.todos[spec.id] = TodoRow(
        loop_id=view.loop.loop_id,
        todo_id=spec.id,
        title=spec.title,
        ord=spec.order,
        depends_on=spec.depends_on,
        status="open",
        attempts=0,
        fence=0,
        added_by=added_by,
        turn_id=None,
    )
    counts = list(view.loop.todo_counts)
    counts[0] += 1
    view.loop = replace(view.loop, todo_counts=tuple(counts))  # type: ignore[arg-type]


def _release(view: LoopView, todo_id: str, *, failed: bool) -> None:
    """A claimed todo goes back to open; a failed attempt counts, and the last one blocks it."""
    todo = _row(view.todos, todo_id, "todo")
    if todo.status != "claimed":
        return
    attempts = todo.attempts + (1 if failed else 0)
    blocked = failed and attempts >= view.policy.claims.max_attempts
    _set_todo(view, todo, status="blocked" if blocked else "open", attempts=attempts)


def _close_turn(
    view: LoopView, turn_id: str, status: str, at: str, outcome: str | None = None
) -> TurnRow:
    turn = _row(view.turns, turn_id, "turn")
    if turn.status != "open":
        raise ProjectionError(f"turn {turn_id!r} is already {turn.status}")
    new = replace(turn, status=status, closed_at=at, outcome=outcome)
    view.turns[turn_id] = new
    return new


def _close_turns(view: LoopView, closed: Iterable[ClosedTurn], at: str) -> None:
    for item in closed:
        _close_turn(view, item.turn_id, "closed", at)
        _release(view, item.todo_id, failed=False)


# --- the fold --------------------------------------------------------------------------------


def _opened(body: ReceiptBody, facts: LoopOpened, digest: str) -> LoopView:
    policy = policy_from_data(facts.policy, "loop.opened policy")
    loop = LoopRow(
        loop_id=body.loop_id,
        objective=facts.objective,
        status="active",
        stop_reason=None,
        policy_digest=body.policy_digest,
        opened_at=body.at,
        opened_by=body.principal.id,
        totals=Totals(),
        todo_counts=(0, 0, 0, 0),
        failure_signature=None,
        failure_streak=0,
        head_seq=0,
        head_digest="",
        updated_at=body.at,
    )
    view = LoopView(loop=loop, policy=policy)
    for spec in facts.todos:
        _add_todo(view, spec, body.principal.id)
    return view


def _claimed(view: LoopView, body: ReceiptBody, f: TurnClaimed) -> None:
    todo = _row(view.todos, f.todo_id, "todo")
    _set_todo(view, todo, status="claimed", fence=f.fence, turn_id=f.turn_id)
    view.turns[f.turn_id] = TurnRow(
        turn_id=f.turn_id,
        loop_id=view.loop.loop_id,
        todo_id=f.todo_id,
        agent=body.principal.id,
        fence=f.fence,
        status="open",
        claimed_at=body.at,
        lease_expires_at=f.lease_expires_at,
        closed_at=None,
        outcome=None,
    )
    view.loop = replace(view.loop, totals=view.loop.totals.plus(Totals(turns=1)))


def _renewed(view: LoopView, body: ReceiptBody, f: LeaseRenewed) -> None:
    turn = _row(view.turns, f.turn_id, "turn")
    view.turns[f.turn_id] = replace(turn, lease_expires_at=f.lease_expires_at)


def _expired(view: LoopView, body: ReceiptBody, f: LeaseExpired) -> None:
    _close_turn(view, f.turn_id, "expired", body.at)
    _release(view, f.todo_id, failed=True)


def _charge(view: LoopView, usage: Usage) -> None:
    view.loop = replace(view.loop, totals=view.loop.totals.plus(usage_totals(usage)))


def _reported(view: LoopView, body: ReceiptBody, f: TurnReported) -> None:
    _charge(view, f.usage)
    _close_turn(view, f.turn_id, "reported", body.at, f.outcome)
    todo = _row(view.todos, f.todo_id, "todo")
    if f.outcome == "completed":
        _set_todo(view, todo, status="done")
    elif f.outcome == "blocked":
        _set_todo(view, todo, status="blocked")
    else:
        _release(view, f.todo_id, failed=f.outcome == "failed")
    loop = view.loop
    if f.outcome == "failed" and f.failure_signature:
        streak = loop.failure_streak + 1 if loop.failure_signature == f.failure_signature else 1
        view.loop = replace(loop, failure_signature=f.failure_signature, failure_streak=streak)
    else:
        view.loop = replace(loop, failure_signature=None, failure_streak=0)
    for approval_id in f.approval_ids:
        approval = _row(view.approvals, approval_id, "approval")
        view.approvals[approval_id] = replace(approval, status="consumed", consumed_by=f.turn_id)


def _refused(view: LoopView, body: ReceiptBody, f: TurnRefused) -> None:
    if f.charged:
        _charge(view, f.usage)
    if f.closes_turn:
        _close_turn(view, f.turn_id, "refused", body.at, f.outcome)
        _release(view, f.todo_id, failed=True)


def _approval_requested(view: LoopView, body: ReceiptBody, f: ApprovalRequested) -> None:
    view.approvals[f.approval_id] = ApprovalRow(
        approval_id=f.approval_id,
        loop_id=view.loop.loop_id,
        turn_id=f.turn_id,
        todo_id=f.todo_id,
        tool=f.tool,
        summary=f.summary,
        artifact_digest=f.artifact_digest,
        status="pending",
        requested_by=body.principal.id,
        requested_at=body.at,
        decided_by=None,
        decided_at=None,
        expires_at=None,
        reason=None,
        consumed_by=None,
    )


def _approval_decided(view: LoopView, body: ReceiptBody, f: ApprovalDecided) -> None:
    approval = _row(view.approvals, f.approval_id, "approval")
    if approval.status != "pending":
        raise ProjectionError(f"approval {f.approval_id!r} is already {approval.status}")
    view.approvals[f.approval_id] = replace(
        approval,
        status="approved" if f.approved else "rejected",
        decided_by=body.principal.id,
        decided_at=body.at,
        expires_at=f.expires_at,
        reason=f.reason,
    )


def _todo_added(view: LoopView, body: ReceiptBody, f: TodoAdded) -> None:
    _add_todo(view, f.todo, body.principal.id)


def _status(status: str):
    def handler(view: LoopView, body: ReceiptBody, f: LoopStatusChanged | LoopStopped) -> None:
        if isinstance(f, LoopStopped):
            _close_turns(view, f.closed_turns, body.at)
            view.loop = replace(view.loop, status=status, stop_reason=f.reason)
        else:
            view.loop = replace(view.loop, status=status)

    return handler


def _noop(view: LoopView, body: ReceiptBody, f: object) -> None:
    return None


_HANDLERS = {
    "turn.claimed": _claimed,
    "claim.refused": _noop,
    "request.refused": _noop,
    "lease.renewed": _renewed,
    "lease.expired": _expired,
    "turn.reported": _reported,
    "turn.refused": _refused,
    "approval.requested": _approval_requested,
    "approval.decided": _approval_decided,
    "todo.added": _todo_added,
    "loop.paused": _status("paused"),
    "loop.resumed": _status("active"),
    "loop.cancelled": _status("cancelled"),
    "loop.stopped": _status("stopped"),
    "loop.completed": _status("completed"),
}


def apply(
    view: LoopView | None, body: ReceiptBody, digest: str, facts: Fact | None = None
) -> LoopView:
    """Fold one receipt (its validated body and envelope digest) into `view`; returns the view.

    `view` is None exactly for `loop.opened`. Mutates and returns the given view (rows are
    immutable and replaced). `facts` is the body's typed data when the caller already has it
    (the write path); otherwise it is parsed from the body. Raises `ProjectionError` if the
    receipt does not continue the loop's chain (seq, prev) or refers to rows the view does not
    hold.
    """
    facts = facts if facts is not None else body.facts()
    if body.kind == "loop.opened":
        if view is not None:
            raise ProjectionError(f"loop {body.loop_id!r} is opened twice")
        view = _opened(body, facts, digest)  # type: ignore[arg-type]
    else:
        if view is None:
            raise ProjectionError(f"receipt {body.seq} of unknown loop {body.loop_id!r}")
        if body.seq != view.loop.head_seq + 1:
            raise ProjectionError(
                f"loop {body.loop_id!r}: receipt seq {body.seq} does not follow {view.loop.head_seq}"
            )
        if body.prev != view.loop.head_digest:
            raise ProjectionError(
                f"loop {body.loop_id!r}: receipt {body.seq} does not chain to its predecessor"
            )
        _HANDLERS[body.kind](view, body, facts)
    view.loop = replace(view.loop, head_seq=body.seq, head_digest=digest, updated_at=body.at)
    return view


def rebuild(receipts: Iterable[tuple[ReceiptBody, str]]) -> dict[str, LoopView]:
    """Replay (body, digest) pairs in journal order into whole views, one per loop."""
    views: dict[str, LoopView] = {}
    for body, digest in receipts:
        views[body.loop_id] = apply(views.get(body.loop_id), body, digest)
    return views
