"""What a model call may spend and what it is charged: its reservation before it goes
upstream, and its charge once it has ended, however it ended (`model_kinds.Source`)."""

from __future__ import annotations

from dataclasses import dataclass

from loopwarden.kernel.state.events import ModelSpend
from loopwarden.model_gateway.credentials import Bearer
from loopwarden.model_gateway.model_kinds import ModelPrice, Outcome, Source
from loopwarden.model_gateway.prices import Price
from loopwarden.model_gateway.providers import Provider, Route, Shape
from loopwarden.model_gateway.usage import Counts
from loopwarden.policy.budgets import MICRO

BYTES_PER_TOKEN = 4
"""Output tokens an answer cut before its final usage is charged per this many bytes streamed
beyond what it had reported (an estimate; never less than the provider reported)."""


@dataclass
class Call:
    """One model call in flight: who, what, and what it holds."""

    bearer: Bearer
    provider: Provider
    route: Route
    shape: Shape
    price: Price | None
    reserve: ModelSpend
    call_id: str
    started: float
    digest: str


def reservation(shape: Shape, price: Price | None) -> ModelSpend:
    """The most a call may spend: one call, its prompt's bound on every input-side budget, its
    output limit (the model's maximum if the request sets none) times the answers it asks for,
    and the worst cost of those (the prompt at the dearest input rate)."""
    bound = shape.prompt_bound()
    most = (shape.max_output or (price.max_output if price else 0)) * shape.answers
    if price is not None and shape.max_output is not None:
        most = min(shape.max_output, price.max_output) * shape.answers
    cost = price.worst_micros(bound, most) if price is not None else 0
    return ModelSpend(
        model_calls=1, input_tokens=bound, output_tokens=most, cache_write_tokens=bound,
        cache_read_tokens=bound, cost_usd=cost / MICRO,
    )  # fmt: skip


def charge_for(
    call: Call, counts: Counts, status: int, outcome: Outcome, streamed: int
) -> tuple[ModelSpend, Source, ModelPrice]:
    """What an ended call is charged, where that comes from, and at what rates (see
    `model_kinds.Source`)."""
    price = call.price
    assert price is not None
    rates = price.rates(counts.prompt_tokens if counts.seen else call.reserve.input_tokens)
    priced = ModelPrice(
        key=price.key, input=rates.input / MICRO, output=rates.output / MICRO,
        cache_write=rates.cache_write / MICRO, cache_read=rates.cache_read / MICRO,
    )  # fmt: skip
    answered = 1 if status else 0
    if counts.seen:
        out = counts.output_tokens
        if not counts.complete and status < 400:  # cut before its final figures
            estimate = min(-(-streamed // BYTES_PER_TOKEN), call.reserve.output_tokens)
            out = max(out, estimate)
        spend = ModelSpend(
            model_calls=answered, input_tokens=counts.input_tokens, output_tokens=out,
            cache_write_tokens=counts.cache_write_tokens, cache_read_tokens=counts.cache_read_tokens,
        )  # fmt: skip
        source: Source = "provider"
    elif status and status < 400:  # an answer that never said what it used: its worst case
        spend = ModelSpend(
            model_calls=1, input_tokens=call.reserve.input_tokens,
            output_tokens=call.reserve.output_tokens,
        )  # fmt: skip
        source = "reserved"
    else:
        spend, source = ModelSpend(model_calls=answered), "none"
    cost = priced.cost_micros(spend)
    return spend.model_copy(update={"cost_usd": cost / MICRO}), source, priced
