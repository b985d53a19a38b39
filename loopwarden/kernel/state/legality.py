"""The judge's shared ground: verdicts, what it keeps of each loop, and the checks several kinds
make (a refusal's special cases, the same reasons as the policy's, a turn's liveness).

Each kind's judge rule (`kinds/`) is written with these; the driver that walks a journal and
asks each kind's rule is `judge.py`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TypeVar

from loopwarden.kernel.state import facts as rules
from loopwarden.kernel.state.charges import PoolBook, claim_reasons
from loopwarden.kernel.state.events import ModelSpend, ReceiptBody, TurnRefused, TurnReport
from loopwarden.kernel.state.rows import LoopView, TurnRow
from loopwarden.policy.budgets import Totals
from loopwarden.policy.decision import Reason, ReasonCode
from loopwarden.policy.evaluate import (
    ClaimFacts,
    TodoAddFacts,
    evaluate_report,
    evaluate_stop,
    turn_reasons,
)
from loopwarden.policy.model import LoopPolicy

D = TypeVar("D")

SPECIAL = (
    {ReasonCode.NOT_TURN_OWNER},
    {ReasonCode.AGENT_NOT_ALLOWED},
    {ReasonCode.IDEMPOTENCY_CONFLICT},
)
"""Refusals decided before the policy is read: another agent's turn, an outsider, a reused key."""


class VerdictRule(StrEnum):
    """The rules the judge names besides the policy's own reason codes (a grant the policy
    denies is named by the code that denies it)."""

    APPROVAL_EXPIRY = "approval_expiry"
    CHAIN = "chain"
    CHARGE = "charge"
    CHARGED = "charged"
    EFFECT = "effect"
    APPROVALS_FOUND = "approvals_found"
    ENFORCED = "enforced"
    GRANT_TERMS = "grant_terms"
    HOOK_TURN = "hook_turn"
    MODEL_OBSERVED = "model_observed"
    MODEL_PRICE = "model_price"
    IDEMPOTENCY = "idempotency"
    LEASE_LIVE = "lease_live"
    LEASE_NOT_SWEPT = "lease_not_swept"
    NOT_TURN_OWNER = "not_turn_owner"
    OBSERVE_OFF = "observe_off"
    OUTSIDER = "outsider"
    POLICY_DIGEST = "policy_digest"
    POOL = "pool"
    POOL_TERMS = "pool_terms"
    ROLE = "role"
    STOP_DUE = "stop_due"
    STOP_MISSING = "stop_missing"
    STOP_REASON = "stop_reason"
    TODO_LIMIT = "todo_limit"
    TODO_NOT_ELIGIBLE = "todo_not_eligible"
    TOOL_NAME = "tool_name"
    TOOL_REFUSED = "tool_refused"
    UNJUDGEABLE = "unjudgeable"
    UNJUDGED = "unjudged"
    UNKNOWN_TURN = "unknown_turn"
    # a refusal the policy did not give (`<what>_refused`) or gave for other reasons (`<what>_reasons`)
    CLAIM_REFUSED = "claim_refused"
    CLAIM_REASONS = "claim_reasons"
    REPORT_REFUSED = "report_refused"
    REPORT_REASONS = "report_reasons"
    TODO_ADD_REFUSED = "todo_add_refused"
    TODO_ADD_REASONS = "todo_add_reasons"
    HEARTBEAT_REFUSED = "heartbeat_refused"
    HEARTBEAT_REASONS = "heartbeat_reasons"
    REQUEST_APPROVAL_REFUSED = "request_approval_refused"
    REQUEST_APPROVAL_REASONS = "request_approval_reasons"
    HOOK_REFUSED = "hook_refused"
    HOOK_REASONS = "hook_reasons"
    DECIDE_APPROVAL_REFUSED = "decide_approval_refused"
    DECIDE_APPROVAL_REASONS = "decide_approval_reasons"
    MODEL_REFUSED = "model_refused"
    MODEL_REASONS = "model_reasons"


@dataclass(frozen=True)
class Verdict:
    rule: VerdictRule | ReasonCode
    message: str


@dataclass(frozen=True)
class Owed:
    """A stop an update owes: for a violation (`on_violation = "stop_loop"`) or for whatever
    stop rule fires after its report, judged at the update's time."""

    why: str  # "violation" | "stop_rules"
    at: datetime


@dataclass
class LoopRecord:
    """What the judge keeps of one loop beside its replayed view."""

    claims: list[datetime] = field(default_factory=list)  # every claim time, sorted
    owed: Owed | None = None
    swept: dict[str, TurnRow] = field(default_factory=dict)  # turns as they were before a sweep


@dataclass
class Judging:
    """One receipt being judged: the loop's record, the keys used so far in the journal, and
    whether the stop for a violation was owed when the receipt came."""

    record: LoopRecord
    keys: set[tuple[str, str]]
    keys_known: bool
    violation_owed: bool = False
    # The budget pools replayed so far (None when the replay is not the whole journal, as for
    # one loop's bundle: then what pools decided cannot be judged).
    pools: PoolBook | None = None

    def remember_claim(self, at: datetime) -> None:
        bisect.insort(self.record.claims, at)


# --- facts -----------------------------------------------------------------------------------


def codes_of(body: ReceiptBody) -> set[str]:
    return {r.code for r in body.decision.reasons}


def outsider(found: set[str]) -> bool:
    """An outsider's refusal: not admitted, perhaps with the count of those left unsealed."""
    return found - {ReasonCode.REFUSALS_SUPPRESSED} == {ReasonCode.AGENT_NOT_ALLOWED}


def _window(record: LoopRecord, policy: LoopPolicy, at: datetime) -> int:
    if policy.rate.window_seconds is None:
        return 0
    since = at - timedelta(seconds=policy.rate.window_seconds)
    return len(record.claims) - bisect.bisect_right(record.claims, since)


def claim_facts(record: LoopRecord, view: LoopView, body: ReceiptBody) -> ClaimFacts:
    open_turns = [view.turns[t] for t in view.loop.open_turns]
    window = _window(record, view.policy, body.at)
    return rules.claim_facts(
        view.loop,
        open_turns,
        window,
        body.principal.id,
        body.at,
        view.policy.claims.lease_seconds,
    )


def pool_codes(ctx: Judging, view: LoopView, body: ReceiptBody) -> tuple[str, ...] | None:
    """The reasons the claim's pools give against it (None when pools are not replayed)."""
    if ctx.pools is None:
        return None
    reasons = claim_reasons(ctx.pools, view.policy, body.principal.id, body.at)
    return tuple(reason.code for reason in reasons)


def todo_facts(view: LoopView, body: ReceiptBody) -> TodoAddFacts:
    is_operator = body.principal.role == "operator"
    return TodoAddFacts(body.principal.id, is_operator, view.loop.status, view.loop.todo_total)


def report_codes(
    view: LoopView, body: ReceiptBody, data: TurnReport, turn: TurnRow
) -> tuple[str, ...]:
    """The reasons the policy gives against a report on `turn` (none if it admits it)."""
    facts = rules.report_facts(
        body.principal.id, view.loop, turn, view.todos.get(turn.todo_id), view.approvals,
        data, body.at, data.approvals_found or (),
    )  # fmt: skip
    decision = evaluate_report(view.policy, facts, digest="")
    return () if decision.allowed else decision.codes  # an allow's reasons are warnings


def approvals_as_found(view: LoopView, body: ReceiptBody, data: TurnReport) -> list[Verdict]:
    """A report's uncited approvals are exactly those the rules find for it (none more, none
    fewer: an approval is not consumed by a report whose tools did not need it)."""
    turn = view.turns.get(data.turn_id)
    if turn is None or body.principal.id != turn.agent:
        return []
    if ReasonCode.IDEMPOTENCY_CONFLICT in codes_of(body):  # refused before the report was read
        return []
    expected = rules.approvals_found(view.policy, data, turn, view.approvals.values(), body.at)
    if tuple(data.approvals_found or ()) == expected:
        return []
    return [
        Verdict(
            VerdictRule.APPROVALS_FOUND,
            f"names {list(data.approvals_found or ())} as its uncited approvals where the rules "
            f"find {list(expected)}",
        )
    ]


def charged(view: LoopView, body: ReceiptBody, data: TurnReport) -> list[Verdict]:
    """A report that records its tool-call charge must charge what the rules say, from what
    its turn was charged before (receipts of 0.1.0 record no charge and charged
    usage.tool_calls, which the fold repeats; those of 0.1.x record no `tool_calls_before`)."""
    turn = view.turns.get(data.turn_id)
    if data.tool_calls_charged is None or turn is None or body.principal.id != turn.agent:
        return []
    if data.tool_calls_before is None:
        expected = rules.legacy_tool_calls_charged(data, int(data.usage.amount("tool_calls")), turn)
    elif data.tool_calls_before != turn.tool_calls_charged:
        return [
            Verdict(
                VerdictRule.CHARGE,
                f"says the turn had {data.tool_calls_before} tool calls charged where it had "
                f"{turn.tool_calls_charged}",
            )
        ]
    elif isinstance(data, TurnRefused) and not data.charged:
        expected = 0
    else:
        expected = rules.tool_calls_due(data, int(data.usage.amount("tool_calls")), turn)
    if data.tool_calls_charged == expected:
        return []
    return [
        Verdict(
            VerdictRule.CHARGE,
            f"charged {data.tool_calls_charged} tool calls where the rules say {expected}",
        )
    ]


def model_observed(view: LoopView, body: ReceiptBody, data: TurnReport) -> list[Verdict]:
    """A charged report by the turn's owner records what the model gateway observed in the
    turn (and so charges none of its own model usage); any other report records nothing."""
    turn = view.turns.get(data.turn_id)
    charging = not isinstance(data, TurnRefused) or data.charged
    expected = None
    if turn is not None and body.principal.id == turn.agent and charging:
        expected = ModelSpend.of(turn.model) if turn.model != Totals() else None
    if data.model_observed == expected:
        return []
    return [
        Verdict(
            VerdictRule.MODEL_OBSERVED,
            f"records model usage observed as {data.model_observed} where the gateway's "
            f"receipts say {expected}",
        )
    ]


def calls_charged(turn: TurnRow, recorded: int | None) -> list[Verdict]:
    """A lease's expiry or a loop's close charges the calls observed in the turn beyond what
    it was charged (receipts before 0.2.0 record no charge, and charged none)."""
    expected = rules.unsettled_calls(turn)
    if recorded is None or recorded == expected:
        return []
    return [
        Verdict(
            VerdictRule.CHARGE,
            f"closing turn {turn.turn_id} charged {recorded} observed tool calls where the "
            f"rules say {expected}",
        )
    ]


def turn_problems(
    view: LoopView, turn: TurnRow, body: ReceiptBody, fence: int | None = None
) -> list[Reason]:
    """Why the caller could not act on `turn` at the receipt's time, with the fence it sent
    (the turn's own, when the receipt does not record one)."""
    given = turn.fence if fence is None else fence
    todo = view.todos[turn.todo_id]
    return turn_reasons(rules.turn_facts(body.principal.id, view.loop, turn, todo, given, body.at))


def verdicts(found: tuple[str, ...], what: str) -> list[Verdict]:
    """A verdict per reason code the policy gives against what was recorded."""
    return [Verdict(ReasonCode(code), f"{what} against {code}") for code in found]


def same(body: ReceiptBody, expected: tuple[str, ...], what: str) -> list[Verdict]:
    """A refusal must be the one the policy gives, for the same reasons."""
    if not expected:
        return [
            Verdict(
                VerdictRule(f"{what}_refused"),
                f"the policy admitted this {what}, but it was refused",
            )
        ]
    if set(expected) != codes_of(body):
        found, due = ", ".join(sorted(codes_of(body))), ", ".join(sorted(expected))
        return [
            Verdict(VerdictRule(f"{what}_reasons"), f"refused for {found}; the policy says {due}")
        ]
    return []


def missing_stop(owed: Owed | None, view: LoopView) -> Verdict | None:
    """The stop an update owed and the journal lacks, judged on the state right before the
    receipt that should have been it (or at the end of the journal)."""
    if owed is None or view.loop.status.closed:
        return None
    if owed.why == "violation":
        return Verdict(
            VerdictRule.STOP_MISSING, "a policy violation was refused without the stop it requires"
        )
    due = evaluate_stop(view.policy, rules.stop_facts(view.loop, owed.at))
    if due is None:
        return None
    return Verdict(
        VerdictRule.STOP_MISSING, f"{due.code} fired after the report and no stop was sealed"
    )


# --- refusals --------------------------------------------------------------------------------


def refused_turn(ctx: Judging, view: LoopView, body: ReceiptBody) -> TurnRow | None:
    """The turn a refusal is about, as it was when the refusal was decided: a refusal for an
    expired lease was decided before the sweep that released it (and comes right after it)."""
    turn_id = body.turn_id or ""
    if ReasonCode.LEASE_EXPIRED in codes_of(body) and turn_id in ctx.record.swept:
        return ctx.record.swept[turn_id]
    return view.turns.get(turn_id)


def refusal_first(
    ctx: Judging, view: LoopView, body: ReceiptBody, turn: TurnRow | None
) -> list[Verdict] | None:
    """What every refusal is judged on before its own rule: it records a deny, and if it was
    decided before the policy was read (an outsider, another agent's turn, a reused key), that
    it is one of those. None when the refusal's own rule decides."""
    if body.decision.effect != "deny":
        return [Verdict(VerdictRule.EFFECT, f"{body.kind} records an allow")]
    found = codes_of(body)
    owner = turn is None or body.principal.id == turn.agent
    was_charged = isinstance(body.data, TurnRefused) and body.data.charged
    if not owner and found not in SPECIAL and not outsider(found):
        return [
            Verdict(
                VerdictRule.NOT_TURN_OWNER, "another agent's turn was refused for other reasons"
            )
        ]
    if outsider(found) and body.principal.role != "operator":
        admitted = view.policy.admits_agent(body.principal.id)
        return (
            [Verdict(VerdictRule.OUTSIDER, "an admitted agent was refused as an outsider")]
            if admitted
            else []
        )
    if found == {ReasonCode.IDEMPOTENCY_CONFLICT}:
        used = (body.principal.id, body.idempotency_key or "") in ctx.keys
        return (
            [Verdict(VerdictRule.IDEMPOTENCY, "refused for a key never used")]
            if ctx.keys_known and not used
            else []
        )
    if found == {ReasonCode.NOT_TURN_OWNER} or not owner:
        if owner:
            return [
                Verdict(VerdictRule.NOT_TURN_OWNER, "the turn's owner was refused as another agent")
            ]
        return (
            [Verdict(VerdictRule.CHARGED, "another agent's refused report was charged")]
            if was_charged
            else []
        )
    return None


OwnRefusalRule = Callable[[Judging, LoopView, ReceiptBody, D, TurnRow | None], list[Verdict]]
"""A refusal kind's own rule, given the turn the refusal is about (see `refusal_rule`)."""


def refusal_rule(
    own: OwnRefusalRule[D],
) -> Callable[[Judging, LoopView, ReceiptBody, D], list[Verdict]]:
    """A refusal kind's judge rule: what every refusal is judged on (`refusal_first`), and when
    that does not decide, `own`, given the turn the refusal is about (`refused_turn`)."""

    def judge(ctx: Judging, view: LoopView, body: ReceiptBody, data: D) -> list[Verdict]:
        turn = refused_turn(ctx, view, body)
        first = refusal_first(ctx, view, body, turn)
        return first if first is not None else own(ctx, view, body, data, turn)

    return judge
