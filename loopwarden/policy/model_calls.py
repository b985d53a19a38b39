"""May this call to a model go upstream now? The model gateway's pure decision.

A call is decided before it is forwarded, on the loop's state and the call's *reservation*:
what it may spend at most (one call, its output limit in output tokens, its prompt's upper
bound in input tokens, and their worst cost). It is admitted only if, on every budget the
loop's policy limits, what the loop has used plus what calls in flight hold plus this call's
reservation stays within the limit; when the call ends, its reservation is released and the
loop is charged what the provider's answer says it used (`docs/model-gateway.md`).
"""

from __future__ import annotations

from dataclasses import dataclass

from loopwarden.policy.budgets import BY_NAME, MICRO, Limits, Totals, to_micros
from loopwarden.policy.decision import Decision, Reason, ReasonCode, budget_code
from loopwarden.policy.model import LoopPolicy
from loopwarden.policy.patterns import first_match
from loopwarden.statuses import LoopStatus

MODEL_BUDGETS = (
    "model_calls",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "cache_write_tokens",
    "cache_read_tokens",
)
"""The budgets a model call spends, in the order a refusal lists them."""


@dataclass(frozen=True)
class ModelCallFacts:
    """One model call, against its loop: `used` what the loop has been charged, `in_flight`
    what the calls admitted and not yet ended hold, `reserve` this call's reservation."""

    loop_id: str
    loop_status: LoopStatus
    model: str
    priced: bool
    used: Totals
    in_flight: Totals
    reserve: Totals


def model_allowed(policy: LoopPolicy, model: str) -> Reason | None:
    """Why `model` may not be called under `policy` (None: allowed). Deny wins; a model no
    allow pattern names is refused, as is every model of a loop without `[model]`."""
    rules = policy.model
    name = model.removeprefix("models/")
    if rules is None:
        return Reason(
            ReasonCode.MODEL_NOT_ALLOWED,
            "this loop's policy has no [model] section, so no model may be called through the "
            'gateway: an operator adds e.g. [model] allow = ["claude-*"] to a new loop\'s policy',
        )
    denied = first_match(rules.deny, name)
    if denied is not None:
        return Reason(
            ReasonCode.MODEL_NOT_ALLOWED, f"model {name!r} is denied by [model] deny {denied!r}"
        )
    if first_match(rules.allow, name) is None:
        allowed = ", ".join(rules.allow) or "none"
        return Reason(
            ReasonCode.MODEL_NOT_ALLOWED,
            f"model {name!r} is not in this loop's [model] allow ({allowed})",
        )
    return None


def _shown(dimension: str, units: int) -> str:
    if BY_NAME[dimension].micro:
        return f"${units / MICRO:,.6f}".rstrip("0").rstrip(".")
    return f"{units:,}"


def budget_reasons(
    budgets: Limits, used: Totals, in_flight: Totals, reserve: Totals, where: str, remedy: str
) -> list[Reason]:
    """The budgets of `budgets` that `reserve` does not fit in, beside `used` and `in_flight`:
    each reason says which, used/limit, what is held by calls in flight, and `remedy`."""
    reasons = []
    for name in MODEL_BUDGETS:
        limit = budgets.limit(name)
        if limit is None:
            continue
        cap = to_micros(limit) if BY_NAME[name].micro else int(limit)
        spent, held, wanted = used.units(name), in_flight.units(name), reserve.units(name)
        if spent + held + wanted <= cap:
            continue
        flight = f", {_shown(name, held)} held by calls in flight" if held else ""
        reasons.append(
            Reason(
                budget_code(name),
                f"{where}: the {name} budget has {_shown(name, spent)} used of "
                f"{_shown(name, cap)}{flight}, and this call may take up to "
                f"{_shown(name, wanted)}; {remedy}",
            )
        )
    return reasons


def model_call_reasons(policy: LoopPolicy, facts: ModelCallFacts) -> list[Reason]:
    """Why a model call may not go upstream now (empty: it may). See the module docstring."""
    where = f"loop {facts.loop_id}"
    if facts.loop_status != LoopStatus.ACTIVE:
        return [
            Reason(
                ReasonCode.LOOP_NOT_ACTIVE,
                f"{where} is {facts.loop_status}: no model call is made for it now",
            )
        ]
    reasons = []
    refused = model_allowed(policy, facts.model)
    if refused is not None:
        reasons.append(refused)
    elif not facts.priced:
        reasons.append(
            Reason(
                ReasonCode.MODEL_UNPRICED,
                f"model {facts.model!r} has no price in the gateway's price table: an operator "
                "adds it (or a [default] price) with --model-prices FILE",
            )
        )
    remedy = (
        f"an operator raises it with loopwarden loop set-policy {facts.loop_id} --policy FILE, "
        "or waits for calls in flight to end"
    )
    reasons.extend(
        budget_reasons(policy.budgets, facts.used, facts.in_flight, facts.reserve, where, remedy)
    )
    return reasons


def evaluate_model_call(policy: LoopPolicy, facts: ModelCallFacts, *, digest: str) -> Decision:
    """May this model call go upstream now? Fails closed (an error is a deny that says so)."""
    try:
        return Decision.of(model_call_reasons(policy, facts), digest)
    except Exception as exc:
        why = f"the model call could not be evaluated ({type(exc).__name__})"
        return Decision("deny", (Reason(ReasonCode.EVALUATION_ERROR, why),), digest)
