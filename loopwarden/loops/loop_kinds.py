"""Whole loops: opened, paused and resumed, given a new policy, and closed (stopped, completed,
cancelled)."""

from __future__ import annotations

from pydantic import Field

from loopwarden.canonical import digest_of
from loopwarden.kernel.state import facts as rules
from loopwarden.kernel.state.events import (
    MAX_SUMMARY,
    CarriesPolicy,
    Digest,
    Fact,
    LoopOpened,
    LoopStopped,
    ReceiptBody,
    ReceiptKind,
)
from loopwarden.kernel.state.facts import todo_graph_problem
from loopwarden.kernel.state.fold import FoldError, add_todo, close_turns
from loopwarden.kernel.state.legality import Judging, Verdict, VerdictRule, calls_charged
from loopwarden.kernel.state.rows import LoopRow, LoopView, Touched, replace
from loopwarden.kernel.state.spec import AGENTS, OPERATORS, KindSpec, Opening
from loopwarden.policy.budgets import Totals
from loopwarden.policy.decision import ReasonCode
from loopwarden.policy.evaluate import evaluate_stop
from loopwarden.policy.loader import policy_from_data
from loopwarden.policy.model import LoopPolicy
from loopwarden.statuses import TODO_STATUSES, LoopStatus


class LoopStatusChanged(Fact):
    """A pause or resume; `reason` is the operator's note."""

    reason: str = Field(default="", max_length=MAX_SUMMARY)


class LoopPolicyChanged(CarriesPolicy):
    """An operator replaced the loop's policy: the body's `policy_digest` is the new one's,
    `previous_digest` the one it replaced. Budgets already used carry over (the totals are the
    loop's); every receipt after it is decided and judged by the new policy."""

    previous_digest: Digest
    reason: str = Field(default="", max_length=MAX_SUMMARY)


# --- loop.opened -------------------------------------------------------------------------------


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
        todo_counts=(0,) * len(TODO_STATUSES),
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
        add_todo(view, spec, body.principal.id)
    return view


def _judge_opened(body: ReceiptBody, data: LoopOpened) -> list[Verdict]:
    """The policy it carries hashes to its digest, and its todos fit it."""
    verdicts = []
    if digest_of(data.policy) != body.policy_digest:
        verdicts.append(
            Verdict(VerdictRule.POLICY_DIGEST, "the policy it carries does not hash to its digest")
        )
    policy = LoopPolicy.model_validate(data.policy)
    if len(data.todos) > policy.todos.max_todos:
        verdicts.append(
            Verdict(VerdictRule.TODO_LIMIT, f"{len(data.todos)} todos over todos.max_todos")
        )
    return verdicts


# --- loop.policy_changed ------------------------------------------------------------------------


def _policy_changed(view: LoopView, body: ReceiptBody, data: LoopPolicyChanged) -> None:
    if data.previous_digest != view.loop.policy_digest:
        raise FoldError(
            f"loop.policy_changed replaces {data.previous_digest}, not the loop's policy "
            f"{view.loop.policy_digest}"
        )
    view.policy = policy_from_data(data.policy, "loop.policy_changed policy")
    view.loop = replace(view.loop, policy_digest=body.policy_digest)


def _judge_policy_changed(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: LoopPolicyChanged
) -> list[Verdict]:
    """An operator's act (who may is checked): it allows, and the policy it carries hashes to
    its digest."""
    verdicts = []
    if body.decision.effect != "allow":
        verdicts.append(Verdict(VerdictRule.EFFECT, "a policy change records a deny"))
    if digest_of(data.policy) != body.policy_digest:
        verdicts.append(
            Verdict(VerdictRule.POLICY_DIGEST, "the policy it carries does not hash to its digest")
        )
    return verdicts


# --- status changes and closes -----------------------------------------------------------------

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


def _transition(view: LoopView, body: ReceiptBody) -> LoopStatus:
    sources, target = _TRANSITIONS[body.kind]
    if view.loop.status not in sources:
        raise FoldError(f"{body.kind} does not apply to a {view.loop.status} loop")
    return target


def _status_changed(view: LoopView, body: ReceiptBody, data: LoopStatusChanged) -> None:
    view.loop = replace(view.loop, status=_transition(view, body))


def _closed(view: LoopView, body: ReceiptBody, data: LoopStopped) -> None:
    target = _transition(view, body)
    close_turns(view, data.closed_turns, body.at)
    if view.loop.open_turns:
        raise FoldError(f"{body.kind} leaves turns open: {', '.join(view.loop.open_turns)}")
    view.loop = replace(view.loop, status=target, stop_reason=data.reason)


def _touches_closed(body: ReceiptBody, data: LoopStopped) -> Touched:
    return Touched(
        todos=frozenset(c.todo_id for c in data.closed_turns),
        turns=frozenset(c.turn_id for c in data.closed_turns),
    )


def _operator_only(ctx: Judging, view: LoopView, body: ReceiptBody, data: object) -> list[Verdict]:
    """An operator's own decision (pause, resume): the policy has no say; who may is checked."""
    return []


def _for_violation(ctx: Judging, body: ReceiptBody, data: LoopStopped) -> list[Verdict] | None:
    """A close for a policy violation must follow the refusal that owed it (None: not one)."""
    if data.reason != ReasonCode.POLICY_VIOLATION:
        return None
    if ctx.violation_owed:
        return []
    return [Verdict(VerdictRule.STOP_REASON, "stopped for a violation no refusal recorded")]


def _close_charges(view: LoopView, data: LoopStopped) -> list[Verdict]:
    """Each turn a close ends is charged the calls observed in it beyond its charge."""
    return [
        v
        for c in data.closed_turns
        if c.turn_id in view.turns
        for v in calls_charged(view.turns[c.turn_id], c.tool_calls_charged)
    ]


def _judge_cancelled(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: LoopStopped
) -> list[Verdict]:
    violation = _for_violation(ctx, body, data)
    return (violation or []) + _close_charges(view, data)


def _judge_stopped(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: LoopStopped
) -> list[Verdict]:
    """A stop or completion that is not a violation's is a stop rule's, which must fire now."""
    violation = _for_violation(ctx, body, data)
    if violation is not None:
        return violation + _close_charges(view, data)
    due = evaluate_stop(view.policy, rules.stop_facts(view.loop, body.at))
    if due is None or due.code != data.reason:
        return [Verdict(VerdictRule.STOP_REASON, f"stopped for {data.reason}, which had not fired")]
    if (body.kind == ReceiptKind.LOOP_COMPLETED) != (data.reason == ReasonCode.ALL_TODOS_DONE):
        return [Verdict(VerdictRule.STOP_REASON, f"{body.kind} for {data.reason}")]
    return _close_charges(view, data)


SPECS = (
    KindSpec(
        ReceiptKind.LOOP_OPENED,
        LoopOpened,
        callers=OPERATORS,
        opens=Opening(view=_opened, judge=_judge_opened),
    ),
    KindSpec(
        ReceiptKind.LOOP_PAUSED,
        LoopStatusChanged,
        callers=OPERATORS,
        fold=_status_changed,
        judge=_operator_only,
    ),
    KindSpec(
        ReceiptKind.LOOP_RESUMED,
        LoopStatusChanged,
        callers=OPERATORS,
        fold=_status_changed,
        judge=_operator_only,
    ),
    KindSpec(
        ReceiptKind.LOOP_POLICY_CHANGED,
        LoopPolicyChanged,
        callers=OPERATORS,
        fold=_policy_changed,
        judge=_judge_policy_changed,
    ),
    KindSpec(
        ReceiptKind.LOOP_CANCELLED,
        LoopStopped,
        callers=OPERATORS,
        touches=_touches_closed,
        fold=_closed,
        judge=_judge_cancelled,
    ),
    KindSpec(
        ReceiptKind.LOOP_STOPPED,
        LoopStopped,
        callers=AGENTS,
        touches=_touches_closed,
        fold=_closed,
        judge=_judge_stopped,
    ),
    KindSpec(
        ReceiptKind.LOOP_COMPLETED,
        LoopStopped,
        callers=AGENTS,
        touches=_touches_closed,
        fold=_closed,
        judge=_judge_stopped,
    ),
)
