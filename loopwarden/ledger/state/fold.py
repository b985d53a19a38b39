"""The fold: a loop's state machine. `apply(view, body, digest)` moves a `LoopView` by one receipt.

It reads nothing but the view and the receipt, so replaying a loop's receipts in order always
rebuilds the same view; the store persists exactly what this fold produces and the audit
compares the two. It refuses impossible transitions (`FoldError`): a receipt out of the loop's
chain, a claim of a todo that is not open, a report on a closed turn, a decision on an approval
that is not pending, any change to a closed loop but a recorded refusal. The write path folds
through it too, so it can never commit such a receipt either. Whether a *possible* transition
was *allowed* by the policy is the judge's question (`judge.py`).

A view may be *partial*: the write path loads only the rows a receipt touches (`touched`), folds,
and writes those rows back, so an append costs the same at 10 or 100,000 todos.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

from loopwarden.errors import LoopwardenError
from loopwarden.ledger.state.events import (
    ApprovalDecided,
    ApprovalRequested,
    ClosedTurn,
    HostAttached,
    LeaseExpired,
    LeaseRenewed,
    LoopOpened,
    LoopStatusChanged,
    LoopStopped,
    ReceiptBody,
    ReceiptKind,
    TodoAdded,
    TodoSpec,
    ToolAdmitted,
    ToolCall,
    ToolObserved,
    ToolRefused,
    TurnClaimed,
    TurnRefused,
    TurnReport,
    TurnReported,
    Usage,
)
from loopwarden.ledger.state.rows import (
    ApprovalRow,
    LoopRow,
    LoopView,
    TodoRow,
    Touched,
    TurnRow,
    replace,
)
from loopwarden.ledger.state.rules import todo_graph_problem
from loopwarden.policy.budgets import Totals, to_micros
from loopwarden.policy.loader import policy_from_data
from loopwarden.statuses import (
    TODO_STATUSES,
    ApprovalStatus,
    LoopStatus,
    TodoStatus,
    TurnStatus,
)

ChainProblem = Literal["seq_gap", "prev_mismatch"]
REFUSALS = frozenset(
    {
        ReceiptKind.CLAIM_REFUSED,
        ReceiptKind.REQUEST_REFUSED,
        ReceiptKind.TURN_REFUSED,
        ReceiptKind.TOOL_REFUSED,
    }
)
"""Kinds that record a refusal."""
AFTER_CLOSE = REFUSALS | {ReceiptKind.TOOL_OBSERVED}
"""The only receipts a closed loop still takes: refusals, and what a host saw run."""
HOST_KINDS = frozenset(
    {
        ReceiptKind.HOST_ATTACHED,
        ReceiptKind.TOOL_ADMITTED,
        ReceiptKind.TOOL_REFUSED,
        ReceiptKind.TOOL_OBSERVED,
    }
)
"""Kinds a host's hooks seal (their principal is the agent the hook speaks for)."""


class FoldError(LoopwardenError):
    """A receipt does not fit the state it is folded into (gap, broken chain, impossible move)."""

    code = "projection_mismatch"


def chain_problem(head_seq: int, head_digest: str | None, body: ReceiptBody) -> ChainProblem | None:
    """Whether `body` continues a loop whose last receipt was `head_seq` with `head_digest`
    (0 and None before the first). The one chain check: the fold, the audit and bundles use it."""
    if body.seq != head_seq + 1:
        return "seq_gap"
    if body.prev != (head_digest or None):
        return "prev_mismatch"
    return None


def touched(body: ReceiptBody) -> Touched:
    """The existing rows `body` reads or changes, so the write path loads only those."""
    f = body.data
    if isinstance(f, TurnClaimed):
        return Touched(todos=frozenset([f.todo_id]))
    if isinstance(f, TodoAdded):
        return Touched(todos=frozenset([f.todo.id, *f.todo.depends_on]))
    if isinstance(f, LeaseRenewed | LeaseExpired):
        return Touched(todos=frozenset([f.todo_id]), turns=frozenset([f.turn_id]))
    if isinstance(f, TurnReported | TurnRefused):
        return Touched(
            todos=frozenset([f.todo_id]),
            turns=frozenset([f.turn_id]),
            approvals=frozenset(f.approval_ids),
        )
    if isinstance(f, ApprovalRequested):
        return Touched(turns=frozenset([f.turn_id]))
    if isinstance(f, ApprovalDecided):
        return Touched(approvals=frozenset([f.approval_id]))
    if isinstance(f, LoopStopped):
        return Touched(
            todos=frozenset(c.todo_id for c in f.closed_turns),
            turns=frozenset(c.turn_id for c in f.closed_turns),
        )
    if body.turn_id is not None and body.kind in HOST_KINDS:
        return Touched(turns=frozenset([body.turn_id]))
    return Touched()


# --- helpers ---------------------------------------------------------------------------------


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


def _row(table: dict[str, Any], key: str, what: str) -> Any:
    try:
        return table[key]
    except KeyError:
        raise FoldError(f"receipt refers to unknown {what} {key!r}") from None


def _counted(view: LoopView, old: TodoStatus | None, new: TodoStatus) -> None:
    counts = list(view.loop.todo_counts)
    if old is not None:
        counts[TODO_STATUSES.index(old)] -= 1
    counts[TODO_STATUSES.index(new)] += 1
    view.loop = replace(view.loop, todo_counts=(counts[0], counts[1], counts[2], counts[3]))


def _set_todo(view: LoopView, todo: TodoRow, **changes: Any) -> TodoRow:
    new = replace(todo, **changes)
    if new.status != todo.status:
        _counted(view, todo.status, new.status)
    view.todos[new.todo_id] = new
    return new


def _slot(view: LoopView) -> int:
    """The next row's slot: rows are numbered in the order the receipts create them."""
    slot = view.loop.slots
    view.loop = replace(view.loop, slots=slot + 1)
    return slot


def _add_todo(view: LoopView, spec: TodoSpec, added_by: str) -> None:
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
        slot=_slot(view),
    )
    _counted(view, None, TodoStatus.OPEN)


def _release(view: LoopView, todo_id: str, *, failed: bool) -> None:
    """A claimed todo goes back to open; a failed attempt counts, and the last one blocks it."""
    todo = _row(view.todos, todo_id, "todo")
    if todo.status != TodoStatus.CLAIMED:
        return
    attempts = todo.attempts + (1 if failed else 0)
    blocked = failed and attempts >= view.policy.claims.max_attempts
    _set_todo(
        view, todo, status=TodoStatus.BLOCKED if blocked else TodoStatus.OPEN, attempts=attempts
    )


def _open_turn(view: LoopView, turn_id: str) -> TurnRow:
    turn: TurnRow = _row(view.turns, turn_id, "turn")
    if turn.status != TurnStatus.OPEN:
        raise FoldError(f"turn {turn_id!r} is already {turn.status}")
    return turn


def _close_turn(
    view: LoopView, turn_id: str, status: TurnStatus, at: str, outcome: str | None = None
) -> TurnRow:
    turn = _open_turn(view, turn_id)
    new = replace(turn, status=status, closed_at=at, outcome=outcome)
    view.turns[turn_id] = new
    still_open = tuple(t for t in view.loop.open_turns if t != turn_id)
    view.loop = replace(view.loop, open_turns=still_open)
    return new


def _close_turns(view: LoopView, closed: Iterable[ClosedTurn], at: str) -> None:
    for item in closed:
        _close_turn(view, item.turn_id, TurnStatus.CLOSED, at)
        _release(view, item.todo_id, failed=False)


# --- the fold --------------------------------------------------------------------------------


def _opened(body: ReceiptBody, facts: LoopOpened) -> LoopView:
    policy = policy_from_data(facts.policy, "loop.opened policy")
    loop = LoopRow(
        loop_id=body.loop_id,
        objective=facts.objective,
        status=LoopStatus.ACTIVE,
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
    problem = todo_graph_problem(
        [s.id for s in facts.todos], {s.id: s.depends_on for s in facts.todos}
    )
    if problem is not None:
        raise FoldError(f"loop.opened: {problem}")
    view = LoopView(loop=loop, policy=policy)
    for spec in facts.todos:
        _add_todo(view, spec, body.principal.id)
    return view


def _claimed(view: LoopView, body: ReceiptBody, f: TurnClaimed) -> None:
    todo: TodoRow = _row(view.todos, f.todo_id, "todo")
    if todo.status != TodoStatus.OPEN:
        raise FoldError(f"todo {f.todo_id!r} is {todo.status}, not open: it cannot be claimed")
    if f.fence != todo.fence + 1:
        raise FoldError(f"the claim's fence {f.fence} does not follow todo fence {todo.fence}")
    if f.turn_id in view.loop.open_turns:
        raise FoldError(f"turn {f.turn_id!r} is claimed twice")
    _set_todo(view, todo, status=TodoStatus.CLAIMED, fence=f.fence, turn_id=f.turn_id)
    totals = view.loop.totals.plus(Totals(turns=1))
    view.turns[f.turn_id] = TurnRow(
        turn_id=f.turn_id,
        loop_id=view.loop.loop_id,
        todo_id=f.todo_id,
        agent=body.principal.id,
        fence=f.fence,
        status=TurnStatus.OPEN,
        claimed_at=body.at,
        lease_expires_at=f.lease_expires_at,
        closed_at=None,
        outcome=None,
        slot=_slot(view),
        number=totals.turns,
    )
    view.loop = replace(view.loop, totals=totals, open_turns=(*view.loop.open_turns, f.turn_id))


def _renewed(view: LoopView, body: ReceiptBody, f: LeaseRenewed) -> None:
    view.turns[f.turn_id] = replace(
        _open_turn(view, f.turn_id), lease_expires_at=f.lease_expires_at
    )


def _expired(view: LoopView, body: ReceiptBody, f: LeaseExpired) -> None:
    _close_turn(view, f.turn_id, TurnStatus.EXPIRED, body.at)
    _release(view, f.todo_id, failed=True)


def _charge(view: LoopView, report: TurnReport) -> None:
    charged = usage_totals(report.usage, report.tool_calls)
    view.loop = replace(view.loop, totals=view.loop.totals.plus(charged))


def _consume(view: LoopView, approval_id: str, turn_id: str) -> None:
    approval: ApprovalRow = _row(view.approvals, approval_id, "approval")
    if approval.status != ApprovalStatus.APPROVED or approval.turn_id != turn_id:
        raise FoldError(f"approval {approval_id} is {approval.status} and cannot cover this turn")
    view.approvals[approval_id] = replace(
        approval, status=ApprovalStatus.CONSUMED, consumed_by=turn_id
    )


def _reported(view: LoopView, body: ReceiptBody, f: TurnReported) -> None:
    todo: TodoRow = _row(view.todos, f.todo_id, "todo")
    if todo.status != TodoStatus.CLAIMED or todo.turn_id != f.turn_id:
        raise FoldError(f"todo {f.todo_id!r} is not held by turn {f.turn_id}")
    _charge(view, f)
    closed = _close_turn(view, f.turn_id, TurnStatus.REPORTED, body.at, f.outcome)
    view.turns[f.turn_id] = replace(closed, reported={t.name: t.count for t in f.tools_used})
    if f.outcome == "completed":
        _set_todo(view, todo, status=TodoStatus.DONE)
    elif f.outcome == "blocked":
        _set_todo(view, todo, status=TodoStatus.BLOCKED)
    else:
        _release(view, f.todo_id, failed=f.outcome == "failed")
    loop = view.loop
    if f.outcome == "failed" and f.failure_signature:
        streak = loop.failure_streak + 1 if loop.failure_signature == f.failure_signature else 1
        view.loop = replace(loop, failure_signature=f.failure_signature, failure_streak=streak)
    else:
        view.loop = replace(loop, failure_signature=None, failure_streak=0)
    for approval_id in f.approval_ids:
        _consume(view, approval_id, f.turn_id)


def _refused(view: LoopView, body: ReceiptBody, f: TurnRefused) -> None:
    if f.charged:
        _charge(view, f)
    if f.closes_turn:
        _close_turn(view, f.turn_id, TurnStatus.REFUSED, body.at, f.outcome)
        _release(view, f.todo_id, failed=True)


def _approval_requested(view: LoopView, body: ReceiptBody, f: ApprovalRequested) -> None:
    _open_turn(view, f.turn_id)
    view.approvals[f.approval_id] = ApprovalRow(
        approval_id=f.approval_id,
        loop_id=view.loop.loop_id,
        turn_id=f.turn_id,
        todo_id=f.todo_id,
        tool=f.tool,
        summary=f.summary,
        artifact_digest=f.artifact_digest,
        status=ApprovalStatus.PENDING,
        requested_by=body.principal.id,
        requested_at=body.at,
        decided_by=None,
        decided_at=None,
        expires_at=None,
        reason=None,
        consumed_by=None,
        slot=_slot(view),
    )


def _approval_decided(view: LoopView, body: ReceiptBody, f: ApprovalDecided) -> None:
    approval: ApprovalRow = _row(view.approvals, f.approval_id, "approval")
    if approval.status != ApprovalStatus.PENDING:
        raise FoldError(f"approval {f.approval_id!r} is already {approval.status}")
    view.approvals[f.approval_id] = replace(
        approval,
        status=ApprovalStatus.APPROVED if f.approved else ApprovalStatus.REJECTED,
        decided_by=body.principal.id,
        decided_at=body.at,
        expires_at=f.expires_at,
        reason=f.reason,
    )


def _todo_added(view: LoopView, body: ReceiptBody, f: TodoAdded) -> None:
    unknown = [d for d in f.todo.depends_on if d not in view.todos]
    if unknown:
        raise FoldError(f"todo {f.todo.id!r} depends on unknown todos {', '.join(unknown)}")
    _add_todo(view, f.todo, body.principal.id)


_TRANSITIONS: dict[str, tuple[frozenset[LoopStatus], LoopStatus]] = {
    # kind: (statuses it applies to, resulting status)
    ReceiptKind.LOOP_PAUSED: (frozenset({LoopStatus.ACTIVE}), LoopStatus.PAUSED),
    ReceiptKind.LOOP_RESUMED: (frozenset({LoopStatus.PAUSED}), LoopStatus.ACTIVE),
    ReceiptKind.LOOP_CANCELLED: (
        frozenset({LoopStatus.ACTIVE, LoopStatus.PAUSED}),
        LoopStatus.CANCELLED,
    ),
    ReceiptKind.LOOP_STOPPED: (
        frozenset({LoopStatus.ACTIVE, LoopStatus.PAUSED}),
        LoopStatus.STOPPED,
    ),
    ReceiptKind.LOOP_COMPLETED: (
        frozenset({LoopStatus.ACTIVE, LoopStatus.PAUSED}),
        LoopStatus.COMPLETED,
    ),
}


def _status_changed(view: LoopView, body: ReceiptBody, f: LoopStatusChanged | LoopStopped) -> None:
    sources, target = _TRANSITIONS[body.kind]
    if view.loop.status not in sources:
        raise FoldError(f"{body.kind} does not apply to a {view.loop.status} loop")
    if isinstance(f, LoopStopped):
        _close_turns(view, f.closed_turns, body.at)
        if view.loop.open_turns:
            raise FoldError(f"{body.kind} leaves turns open: {', '.join(view.loop.open_turns)}")
        view.loop = replace(view.loop, status=target, stop_reason=f.reason)
    else:
        view.loop = replace(view.loop, status=target)


def _noop(view: LoopView, body: ReceiptBody, f: object) -> None:
    return None


def _host_seen(
    view: LoopView, body: ReceiptBody, f: HostAttached | ToolCall | ToolObserved
) -> None:
    """Every hook receipt records the host session the agent's hooks speak from."""
    hosts = {**view.loop.hosts, body.principal.id: (f.host, f.session_id, body.at)}
    view.loop = replace(view.loop, hosts=hosts)


def _hook_turn(view: LoopView, body: ReceiptBody) -> TurnRow | None:
    """The turn a hook receipt names: open, and the receipt's agent's."""
    if body.turn_id is None:
        return None
    turn: TurnRow = _open_turn(view, body.turn_id)
    if turn.agent != body.principal.id:
        raise FoldError(f"turn {body.turn_id!r} is not {body.principal.id}'s")
    return turn


def _tool_seen(view: LoopView, body: ReceiptBody, f: ToolCall | ToolObserved) -> None:
    """A hook's pre-tool admission, refusal, or post-tool observation: counted on the turn."""
    _host_seen(view, body, f)
    turn = _hook_turn(view, body)
    if turn is None:
        return
    if isinstance(f, ToolRefused):
        view.turns[turn.turn_id] = replace(turn, refusals=turn.refusals + 1)
        return
    admitted, ran = turn.observed.get(f.tool, (0, 0))
    seen = (admitted + 1, ran) if isinstance(f, ToolAdmitted) else (admitted, ran + 1)
    view.turns[turn.turn_id] = replace(turn, observed={**turn.observed, f.tool: seen})


_HANDLERS: dict[str, Callable[[LoopView, Any, Any], None]] = {
    ReceiptKind.TURN_CLAIMED: _claimed,
    ReceiptKind.CLAIM_REFUSED: _noop,
    ReceiptKind.REQUEST_REFUSED: _noop,
    ReceiptKind.LEASE_RENEWED: _renewed,
    ReceiptKind.LEASE_EXPIRED: _expired,
    ReceiptKind.TURN_REPORTED: _reported,
    ReceiptKind.TURN_REFUSED: _refused,
    ReceiptKind.APPROVAL_REQUESTED: _approval_requested,
    ReceiptKind.APPROVAL_DECIDED: _approval_decided,
    ReceiptKind.TODO_ADDED: _todo_added,
    ReceiptKind.HOST_ATTACHED: _host_seen,
    ReceiptKind.TOOL_ADMITTED: _tool_seen,
    ReceiptKind.TOOL_REFUSED: _tool_seen,
    ReceiptKind.TOOL_OBSERVED: _tool_seen,
    **{kind: _status_changed for kind in _TRANSITIONS},
}


def apply(view: LoopView | None, body: ReceiptBody, digest: str) -> LoopView:
    """Fold one receipt (its validated body and envelope digest) into `view`; returns the view.

    `view` is None exactly for `loop.opened`. Mutates and returns the given view (rows are
    immutable and replaced). Raises `FoldError` if the receipt does not continue the loop's
    chain (seq, prev), refers to rows the view does not hold, or is impossible in that state.
    """
    if isinstance(body.data, LoopOpened):
        if view is not None:
            raise FoldError(f"loop {body.loop_id!r} is opened twice")
        view = _opened(body, body.data)
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
        if view.loop.status.closed and body.kind not in AFTER_CLOSE:
            raise FoldError(f"{body.kind} on a {view.loop.status} loop")
        _HANDLERS[body.kind](view, body, body.data)
    view.loop = replace(view.loop, head_seq=body.seq, head_digest=digest, updated_at=body.at)
    return view


def rebuild(receipts: Iterable[tuple[ReceiptBody, str]]) -> dict[str, LoopView]:
    """Replay (body, digest) pairs in journal order into whole views, one per loop."""
    views: dict[str, LoopView] = {}
    for body, digest in receipts:
        views[body.loop_id] = apply(views.get(body.loop_id), body, digest)
    return views
