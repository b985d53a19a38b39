"""Result pieces several operations return: reasons, budget lines, the rate window."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from loopwarden.kernel.state.rows import LoopRow
from loopwarden.policy.budgets import Budgets, Totals, budget_lines
from loopwarden.policy.decision import Reason
from loopwarden.policy.model import LoopPolicy


class Model(BaseModel):
    """Requests and results: unknown fields are refused, never ignored."""

    model_config = ConfigDict(extra="forbid")


M = TypeVar("M", bound=BaseModel)


def from_row(model: type[M], row: object, **values: Any) -> M:
    """`model` filled from the row's attributes of the same names (and `values` for the rest).
    Rows are already valid, so nothing is re-validated."""
    fields = {
        name: values[name] if name in values else getattr(row, name) for name in model.model_fields
    }
    return model.model_construct(**fields)


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


# Result pieces are validated like any model: on these small models pydantic-core's validation
# is about twice as fast as `model_construct` (which runs in Python).


def reasons_out(reasons: Iterable[Reason]) -> list[ReasonOut]:
    return [ReasonOut(code=r.code, message=r.message) for r in reasons]


def budgets_out(policy: LoopPolicy, loop: LoopRow) -> dict[str, BudgetOut]:
    return {
        dim: BudgetOut(limit=line.limit, used=line.used, remaining=line.remaining)
        for dim, line in budget_lines(policy.budgets, loop.totals).items()
    }


def budgets_out_of(budgets: Budgets, totals: Totals | None) -> dict[str, BudgetOut]:
    """A pool's budget lines: the dimensions it limits, with what its window used."""
    return {
        dim: BudgetOut(limit=line.limit, used=line.used, remaining=line.remaining)
        for dim, line in budget_lines(budgets, totals or Totals()).items()
        if line.limit is not None
    }


def rate_out(policy: LoopPolicy, used: int) -> RateOut:
    rate = policy.rate
    remaining = None if rate.turns_per_window is None else max(rate.turns_per_window - used, 0)
    return RateOut(
        turns_per_window=rate.turns_per_window,
        window_seconds=rate.window_seconds,
        used=used,
        remaining=remaining,
    )
