"""Budget arithmetic: usage totals in exact integer units and the limit/used/remaining view.

Money and wall time arrive as floats; they are charged in integer micro-units so that summing a
loop's receipts in any process gives exactly the stored counter.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from loopwarden.policy.model import BUDGET_DIMENSIONS, Budgets, LoopPolicy

MICRO = 1_000_000
_MICRO_DIMENSIONS = {"cost_usd": "cost_micros", "wall_seconds": "wall_micros"}


def to_micros(value: float) -> int:
    return round(value * MICRO)


@dataclass(frozen=True)
class Totals:
    """What a loop has used. `turns` counts admitted claims, open turns included."""

    turns: int = 0
    model_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0
    cost_micros: int = 0
    wall_micros: int = 0

    def units(self, dimension: str) -> int:
        """Used amount of a dimension in its integer unit."""
        units: int = getattr(self, _MICRO_DIMENSIONS.get(dimension, dimension))
        return units

    def used(self, dimension: str) -> int | float:
        """Used amount in the policy's unit (dollars and seconds as floats)."""
        units = self.units(dimension)
        return units / MICRO if dimension in _MICRO_DIMENSIONS else units

    def plus(self, other: Totals) -> Totals:
        return Totals(
            self.turns + other.turns,
            self.model_calls + other.model_calls,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.tool_calls + other.tool_calls,
            self.cost_micros + other.cost_micros,
            self.wall_micros + other.wall_micros,
        )

    def minus(self, other: Totals) -> Totals:
        """What `self` counts beyond `other`, per field (never below zero)."""
        return Totals(*(max(a - b, 0) for a, b in zip(self.values(), other.values(), strict=True)))

    def values(self) -> tuple[int, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_DIMENSIONS = tuple(
    (dim, f"max_{dim}", _MICRO_DIMENSIONS.get(dim, dim), dim in _MICRO_DIMENSIONS)
    for dim in BUDGET_DIMENSIONS
)
"""Per dimension, in display order: its name, the policy's limit field, the `Totals` field it is
counted in, and whether that count is in micro-units (asked several times a turn)."""


def exhausted(budgets: Budgets, totals: Totals) -> list[str]:
    """Dimensions whose used amount has reached the limit, in display order."""
    out = []
    for dimension, limit_field, units_field, micro in _DIMENSIONS:
        limit = getattr(budgets, limit_field)
        if limit is None:
            continue
        if getattr(totals, units_field) >= (to_micros(limit) if micro else int(limit)):
            out.append(dimension)
    return out


@dataclass(frozen=True)
class BudgetLine:
    limit: int | float | None
    used: int | float
    remaining: int | float | None


def budget_lines(policy: LoopPolicy | Budgets, totals: Totals) -> dict[str, BudgetLine]:
    """Every dimension: limit (None = no limit), used, remaining (never negative)."""
    budgets = policy.budgets if isinstance(policy, LoopPolicy) else policy
    lines = {}
    for dimension, limit_field, units_field, micro in _DIMENSIONS:
        limit = getattr(budgets, limit_field)
        units = getattr(totals, units_field)
        remaining: int | float | None = None
        if micro:
            used: int | float = units / MICRO
            if limit is not None:
                remaining = max(to_micros(limit) - units, 0) / MICRO
        else:
            used = units
            if limit is not None:
                remaining = max(int(limit) - units, 0)
        lines[dimension] = BudgetLine(limit=limit, used=used, remaining=remaining)
    return lines
