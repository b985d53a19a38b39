"""What the model gateway seals: a call to a model that went upstream and what it spent
(`model.called`), or one refused before it went (`model.refused`). Never a prompt or an answer:
the request's digest, the model, the usage the provider reported, its price and cost."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from loopwarden.kernel.state import facts as rules
from loopwarden.kernel.state.events import (
    Amount,
    Digest,
    Fact,
    ModelSpend,
    ReceiptBody,
    ReceiptKind,
)
from loopwarden.kernel.state.fold import FoldError, open_turn
from loopwarden.kernel.state.legality import (
    Judging,
    Verdict,
    VerdictRule,
    refusal_rule,
    same,
    verdicts,
)
from loopwarden.kernel.state.rows import LoopView, Touched, TurnRow, replace
from loopwarden.kernel.state.spec import OBSERVERS, KindSpec
from loopwarden.model_gateway.prices import PER_MILLION, Rates
from loopwarden.policy.budgets import MICRO
from loopwarden.policy.model_calls import ModelCallFacts, model_allowed, model_call_reasons

Provider = Literal["anthropic", "openai", "gemini"]
Api = Literal["messages", "responses", "chat", "generate"]
ModelName = Annotated[str, Field(min_length=1, max_length=128)]
Outcome = Literal["ok", "upstream_error", "client_gone", "upstream_cut", "timeout", "unreachable"]
"""How a call ended: answered whole (`ok`, whatever its status), answered with an error status
(`upstream_error`), the client went away mid-answer, the upstream cut its answer, stalled past
the gateway's timeout, or could not be reached."""
Source = Literal["provider", "reserved", "none"]
"""Where the charged usage comes from: the provider's answer; the call's reservation (an answer
cut before it said what it used: charged its worst case, never free); nothing was spent (no
answer, or an error answer without usage)."""


class ModelPrice(Fact):
    """The rates a call was charged at (US dollars per million tokens) and the price table's
    entry they come from (`default`: the operator's default price)."""

    key: ModelName
    input: Amount
    output: Amount
    cache_write: Amount
    cache_read: Amount

    def rates(self) -> Rates:
        return Rates.of(self.input, self.output, self.cache_write, self.cache_read)

    def cost_micros(self, spend: ModelSpend) -> int:
        """What `spend`'s tokens cost at these rates, in micro-dollars, rounded up."""
        r = self.rates()
        total = spend.input_tokens * r.input + spend.output_tokens * r.output
        total += spend.cache_write_tokens * r.cache_write + spend.cache_read_tokens * r.cache_read
        return -(-total // PER_MILLION)


class ModelCall(Fact):
    """A call to a model, as the gateway saw its request: never its content, only its digest."""

    provider: Provider
    api: Api
    model: ModelName
    stream: bool
    request_digest: Digest


class ModelCalled(ModelCall):
    """A call that was admitted and went upstream, with what it spent (charged to the loop, and
    to the agent's open turn if it held one when the call ended)."""

    status: int = Field(ge=0, le=999)  # the upstream's HTTP status (0: none came)
    outcome: Outcome
    usage: ModelSpend
    source: Source
    price: ModelPrice
    duration_ms: Amount


class ModelRefused(ModelCall):
    """A call refused before it went upstream: what it would have reserved, and what calls in
    flight held in its loop when it was decided."""

    reserve: ModelSpend
    in_flight: ModelSpend
    priced: bool


def _touches(body: ReceiptBody, data: object) -> Touched:
    return Touched(turns=frozenset([body.turn_id])) if body.turn_id is not None else Touched()


# --- the fold ------------------------------------------------------------------------------------


def _called(view: LoopView, body: ReceiptBody, f: ModelCalled) -> None:
    """Charge the call's usage to its loop, and to the agent's open turn it names."""
    spent = f.usage.charge()
    view.loop = replace(view.loop, totals=view.loop.totals.plus(spent))
    if body.turn_id is None:
        return
    turn: TurnRow = open_turn(view, body.turn_id)
    if turn.agent != body.principal.id:
        raise FoldError(f"turn {body.turn_id!r} is not {body.principal.id}'s")
    view.turns[turn.turn_id] = replace(turn, model=turn.model.plus(spent))


def _refused(view: LoopView, body: ReceiptBody, f: ModelRefused) -> None:
    return None


# --- the judge -----------------------------------------------------------------------------------


def _turn_due(view: LoopView, body: ReceiptBody) -> list[Verdict]:
    """A model receipt names the agent's open turn (its latest), or none if it held none."""
    open_turns = [view.turns[t] for t in view.loop.open_turns]
    turn = rules.agent_turn(open_turns, body.principal.id)
    due = turn.turn_id if turn is not None else None
    if body.turn_id != due:
        return [Verdict(VerdictRule.HOOK_TURN, "it does not name the agent's open turn")]
    return []


def _judge_called(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: ModelCalled
) -> list[Verdict]:
    found: list[Verdict] = []
    if body.decision.effect != "allow":
        found.append(Verdict(VerdictRule.EFFECT, "a model call records a deny"))
    if not view.policy.admits_agent(body.principal.id):
        found.append(Verdict(VerdictRule.OUTSIDER, "a model call for an agent the loop admits not"))
    refused = model_allowed(view.policy, data.model)
    if refused is not None:
        found += verdicts((refused.code,), "model called")
    found += _turn_due(view, body)
    usage, cost = data.usage, data.price.cost_micros(data.usage)
    if round(usage.cost_usd * MICRO) != cost:
        found.append(
            Verdict(
                VerdictRule.CHARGE,
                f"charged ${usage.cost_usd} where its usage at its price costs ${cost / MICRO}",
            )
        )
    tokens = (
        usage.input_tokens + usage.output_tokens + usage.cache_write_tokens
        + usage.cache_read_tokens
    )  # fmt: skip
    if data.source == "none" and tokens:
        found.append(Verdict(VerdictRule.CHARGE, "charged tokens it says nothing spent"))
    if usage.model_calls != (1 if data.status else 0):
        found.append(
            Verdict(VerdictRule.CHARGE, "a call is charged once exactly when the upstream answered")
        )
    return found


@refusal_rule
def _judge_refused(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: ModelRefused, turn: TurnRow | None
) -> list[Verdict]:
    """The loop's own reasons are replayed (its state, the recorded reservations); a pool's are
    taken as recorded (what calls in flight held in a pool is not in the loop's receipts)."""
    facts = ModelCallFacts(
        loop_id=view.loop.loop_id,
        loop_status=view.loop.status,
        model=data.model,
        priced=data.priced,
        used=view.loop.totals,
        in_flight=data.in_flight.charge(),
        reserve=data.reserve.charge(),
    )
    expected = tuple(r.code for r in model_call_reasons(view.policy, facts))
    pooled = tuple(
        code for code in (r.code for r in body.decision.reasons) if code.startswith("pool_")
    )
    return _turn_due(view, body) + same(body, expected + pooled, "model")


SPECS = (
    KindSpec(
        ReceiptKind.MODEL_CALLED,
        ModelCalled,
        callers=OBSERVERS,
        touches=_touches,
        fold=_called,
        judge=_judge_called,
        after_close=True,  # a call admitted before its loop closed ends after
    ),
    KindSpec(
        ReceiptKind.MODEL_REFUSED,
        ModelRefused,
        callers=OBSERVERS,
        touches=_touches,
        fold=_refused,
        judge=_judge_refused,
        refusal=True,
    ),
)
