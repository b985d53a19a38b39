"""Refused requests of operations that seal no kind of their own: a heartbeat, a todo_add, an
approval request or decision, a host hook's event from outside the loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import Field

from loopwarden.kernel.state.events import Fact, ReceiptBody, ReceiptKind, ToolName
from loopwarden.kernel.state.legality import (
    Judging,
    Verdict,
    VerdictRule,
    codes_of,
    refusal_rule,
    same,
    todo_facts,
    turn_problems,
)
from loopwarden.kernel.state.rows import LoopView, TurnRow
from loopwarden.kernel.state.spec import ANYONE, KindSpec
from loopwarden.policy.decision import ReasonCode
from loopwarden.policy.evaluate import evaluate_todo_add, explain, tool_reasons

RefusedOperation = Annotated[str, Field(pattern=r"^[a-z][a-z_]{0,39}$")]
"""The operation a `request.refused` names (each one the judge knows has a rule in
`kinds/requests.py`; one it does not know is judged `unjudged`)."""


class RequestRefused(Fact):
    """A refused request of an operation that seals no kind of its own (heartbeat, todo_add,
    request_approval, decide_approval, a hook's outsider; reasons in the decision). For a request about a turn, the fence it sent and the tool it named, so that the
    refusal can be judged (receipts before these fields have neither)."""

    operation: RefusedOperation
    fence: int | None = Field(default=None, ge=0)
    tool: ToolName | None = None


TOOL_CODES = frozenset(
    {ReasonCode.APPROVAL_NOT_NEEDED, ReasonCode.TOOL_DENIED, ReasonCode.TOOL_NOT_ALLOWED}
)

OperationRule = Callable[[LoopView, ReceiptBody, RequestRefused, TurnRow | None], list[Verdict]]


def _no_turn(data: RequestRefused) -> list[Verdict]:
    return [Verdict(VerdictRule.UNKNOWN_TURN, f"a refused {data.operation} names no turn")]


def _on_turn(
    view: LoopView, body: ReceiptBody, data: RequestRefused, turn: TurnRow | None
) -> list[Verdict]:
    """A refused heartbeat or approval request. With the fence and tool recorded, exactly the
    reasons the write path gives; without (older receipts), the reasons that do not depend
    on them, and for the rest only that they are of the kind those would give."""
    if turn is None:
        return _no_turn(data)
    expected = [r.code for r in turn_problems(view, turn, body, data.fence)]
    if data.operation == "request_approval" and not expected:
        if data.tool is not None:
            verdict = explain(view.policy, data.tool)
            tool = [r.code for r in tool_reasons(view.policy, [data.tool], frozenset())]
            expected = tool or ([ReasonCode.APPROVAL_NOT_NEEDED] if verdict.rule == "allow" else [])
        elif codes_of(body) and codes_of(body) <= TOOL_CODES:
            return []  # refused for a tool no receipt of the time recorded
    if data.fence is None and ReasonCode.STALE_FENCE in codes_of(body):
        expected = sorted({*expected, ReasonCode.STALE_FENCE})  # the fence sent was not recorded
    return same(body, tuple(expected), data.operation)


def _todo_add(
    view: LoopView, body: ReceiptBody, data: RequestRefused, turn: TurnRow | None
) -> list[Verdict]:
    expected = evaluate_todo_add(view.policy, todo_facts(view, body), digest="").codes
    return same(body, expected, "todo_add")


def _decide_approval(
    view: LoopView, body: ReceiptBody, data: RequestRefused, turn: TurnRow | None
) -> list[Verdict]:
    """An operator's decision refused (the approval was not pending): nothing the policy says."""
    return _no_turn(data) if turn is None else []


OPERATION_RULES: dict[str, OperationRule] = {
    "heartbeat": _on_turn,
    "request_approval": _on_turn,
    "hook": _on_turn,
    "todo_add": _todo_add,
    "decide_approval": _decide_approval,
}
"""The rule per refused operation; an operation without one is judged `unjudged`."""


@refusal_rule
def _judge_refused(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: RequestRefused, turn: TurnRow | None
) -> list[Verdict]:
    rule = OPERATION_RULES.get(data.operation)
    if rule is None:
        return [Verdict(VerdictRule.UNJUDGED, f"no rule judges a refused {data.operation!r}")]
    return rule(view, body, data, turn)


def _noop(view: LoopView, body: ReceiptBody, data: object) -> None:
    return None


SPECS = (
    KindSpec(
        ReceiptKind.REQUEST_REFUSED,
        RequestRefused,
        callers=ANYONE,
        fold=_noop,
        judge=_judge_refused,
        refusal=True,
    ),
)
