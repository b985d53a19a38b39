"""Budget dimensions, declared once, and their arithmetic: limits, totals in exact integer units,
and the limit/used/remaining view.

A `Dimension` is one line of `DIMENSIONS`; everything else is derived from that list, in its
order (the display order): a policy's `max_<name>` limit (`Budgets`, with its bounds), the
`Totals` counter (its stored column in the loop and pool-window tables, from the schema version
the dimension arrived in), the usage field an agent reports and a receipt carries (`Usage`,
`kernel/state/events.py`), the reason code of a used-up budget (`budget_exhausted:<name>`,
`policy/decision.py`) and the fold's charge. Money and time arrive as floats; they are counted
in integer micro-units so that summing receipts in any process gives exactly the stored
counter. Adding a dimension is a line here and, for its columns, a schema version (`SCHEMA_VERSION`
in `kernel/sql/schema.py`): the upgrade that adds the columns is derived too.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

MICRO = 1_000_000


def to_micros(value: float) -> int:
    return round(value * MICRO)


@dataclass(frozen=True)
class Dimension:
    """One budget dimension. `name` is its key everywhere: the policy's `max_<name>`, the usage
    field, the reason code's suffix. `micro`: a float amount (dollars, seconds) counted in
    micro-units, in the column `column`. `reported`: an agent's report (`update.usage`) carries
    it (turns are counted when claimed, never reported). `floor`/`ceiling`: the bounds of a
    limit. `since`: the schema version its columns arrived in."""

    name: str
    what: str
    ceiling: int
    floor: int = 0
    micro: bool = False
    reported: bool = True
    column: str = ""
    since: int = 1

    @property
    def stored(self) -> str:
        """The `Totals` field and column that count it."""
        return self.column or self.name

    @property
    def limit_field(self) -> str:
        return f"max_{self.name}"


DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("turns", "claims admitted (open turns included)", floor=1, ceiling=10_000_000,
              reported=False),
    Dimension("model_calls", "calls to a model API", ceiling=10**12),
    Dimension("input_tokens", "model input tokens (uncached)", ceiling=10**15),
    Dimension("output_tokens", "model output tokens", ceiling=10**15),
    Dimension("tool_calls", "tool calls", ceiling=10**12),
    Dimension("cost_usd", "spend in US dollars", ceiling=10**9, micro=True, column="cost_micros"),
    Dimension("wall_seconds", "wall-clock seconds of turns", ceiling=10**9, micro=True,
              column="wall_micros"),
    # observed by the model gateway from the provider's answer; an agent cannot know them
    Dimension("cache_write_tokens", "model input tokens written to the provider's prompt cache",
              ceiling=10**15, reported=False, since=11),
    Dimension("cache_read_tokens", "model input tokens read from the provider's prompt cache",
              ceiling=10**15, reported=False, since=11),
)  # fmt: skip
"""Every budget dimension, in display order (new ones last)."""

BY_NAME: Mapping[str, Dimension] = {d.name: d for d in DIMENSIONS}
BUDGET_DIMENSIONS: tuple[str, ...] = tuple(d.name for d in DIMENSIONS)
"""The dimensions' names, in display order."""
BUDGET_EXHAUSTED = "budget_exhausted"
"""The prefix of every budget's reason code (`budget_exhausted:<dimension>`)."""
STORED: tuple[str, ...] = tuple(d.stored for d in DIMENSIONS)
"""The `Totals` fields (and the columns that hold them), in the dimensions' order."""
_INDEX = {name: i for i, name in enumerate(STORED)}
_UNIT_INDEX = {d.name: _INDEX[d.stored] for d in DIMENSIONS}
"""A dimension's place in `Totals` (by its name)."""
_LIMIT_FIELD = {d.name: d.limit_field for d in DIMENSIONS}


def dimension(name: str) -> Dimension:
    """The dimension called `name`; `ValueError` naming the known ones if there is none."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"unknown budget dimension {name!r} (known: {', '.join(BUDGET_DIMENSIONS)})"
        ) from None


# --- what was used ------------------------------------------------------------------------------


class Totals:
    """What a loop (or a pool's window) has used: one integer per dimension, in its unit
    (micro-units for money and time). Immutable; `Totals(turns=1)` names amounts by `Totals`
    field (`cost_micros`, not `cost_usd`), and a field left out is zero."""

    __slots__ = ("_units",)
    _units: tuple[int, ...]

    def __init__(self, **units: int) -> None:
        values = [0] * len(STORED)
        for name, value in units.items():
            try:
                values[_INDEX[name]] = value
            except KeyError:
                raise TypeError(f"Totals has no field {name!r}") from None
        object.__setattr__(self, "_units", tuple(values))

    @classmethod
    def of(cls, values: tuple[int, ...] | list[int]) -> Totals:
        """Totals from one value per field, in `STORED` order (a stored row's columns)."""
        if len(values) != len(STORED):
            raise ValueError(f"Totals takes {len(STORED)} values, not {len(values)}")
        totals = cls.__new__(cls)
        object.__setattr__(totals, "_units", tuple(values))
        return totals

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Totals is immutable")

    def __reduce__(self) -> tuple[Any, tuple[tuple[int, ...]]]:
        return (Totals.of, (self._units,))  # pickled by its values (an audit's workers)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Totals) and self._units == other._units

    def __hash__(self) -> int:
        return hash(self._units)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in zip(STORED, self._units, strict=True) if v)
        return f"Totals({shown})"

    @property
    def turns(self) -> int:
        return self._units[_INDEX["turns"]]

    @property
    def tool_calls(self) -> int:
        return self._units[_INDEX["tool_calls"]]

    def units(self, dimension: str) -> int:
        """Used amount of a dimension in its integer unit."""
        return self._units[_UNIT_INDEX[dimension]]

    def used(self, dimension: str) -> int | float:
        """Used amount in the policy's unit (dollars and seconds as floats)."""
        units = self.units(dimension)
        return units / MICRO if BY_NAME[dimension].micro else units

    def plus(self, other: Totals) -> Totals:
        return Totals.of([a + b for a, b in zip(self._units, other._units, strict=True)])

    def minus(self, other: Totals) -> Totals:
        """What `self` counts beyond `other`, per field (never below zero)."""
        return Totals.of([max(a - b, 0) for a, b in zip(self._units, other._units, strict=True)])

    def values(self) -> tuple[int, ...]:
        """One value per field, in `STORED` order."""
        return self._units

    def as_dict(self) -> dict[str, int]:
        return dict(zip(STORED, self._units, strict=True))

    def __iter__(self) -> Iterator[int]:
        return iter(self._units)


def charged(amounts: Mapping[str, int | float]) -> Totals:
    """What reported amounts charge (by dimension name, in the policy's unit), in exact units."""
    units: dict[str, int] = {}
    for name, amount in amounts.items():
        d = BY_NAME[name]
        units[d.stored] = to_micros(float(amount)) if d.micro else int(amount)
    return Totals(**units)


# --- limits ---------------------------------------------------------------------------------------


class Limits(BaseModel):
    """Limits per loop or pool. A missing key means no limit on that dimension."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_null_limits(cls, data: object) -> object:
        # `null` would read as "no limit": that must be said by leaving the key out, never
        # arrive by accident (a NaN turned into null on the wire, say).
        if isinstance(data, dict):
            for key, value in data.items():
                if value is None:
                    raise ValueError(
                        f"budgets.{key} is null; leave the key out for no limit on that dimension"
                    )
        return data

    def limit(self, dimension: str) -> float | int | None:
        limit: float | int | None = getattr(self, _LIMIT_FIELD[dimension])
        return limit

    def is_empty(self) -> bool:
        return all(self.limit(dim) is None for dim in BUDGET_DIMENSIONS)


def _limit_field(d: Dimension) -> tuple[Any, Any]:
    if d.micro:
        return float | None, Field(
            default=None, ge=d.floor, le=d.ceiling, allow_inf_nan=False, description=d.what
        )
    return int | None, Field(default=None, ge=d.floor, le=d.ceiling, description=d.what)


if TYPE_CHECKING:
    Budgets = Limits
else:
    Budgets = create_model(
        "Budgets",
        __base__=Limits,
        __module__=__name__,
        __doc__="Limits per loop. A missing key means no limit on that dimension.",
        **{d.limit_field: _limit_field(d) for d in DIMENSIONS},
    )
"""A policy's `[budgets]`: one optional `max_<dimension>` per dimension (read through
`Limits.limit`, so the type checker sees one method, not a field per dimension)."""


def exhausted(budgets: Limits, totals: Totals) -> list[str]:
    """Dimensions whose used amount has reached the limit, in display order."""
    units = totals.values()
    try:
        thresholds = _thresholds(budgets)
    except TypeError:  # limits that cannot be a cache key
        thresholds = _thresholds.__wrapped__(budgets)
    return [name for name, at, limit in thresholds if units[at] >= limit]


@functools.lru_cache(maxsize=1024)
def _thresholds(budgets: Limits) -> tuple[tuple[str, int, int], ...]:
    """Each limit `budgets` sets: its dimension, its place in `Totals` and the used units that
    reach it (worked out once per policy's limits: every decision and every replayed receipt
    asks)."""
    out = []
    for d in DIMENSIONS:
        limit = budgets.limit(d.name)
        if limit is not None:
            out.append((d.name, _UNIT_INDEX[d.name], to_micros(limit) if d.micro else int(limit)))
    return tuple(out)


@dataclass(frozen=True)
class BudgetLine:
    limit: int | float | None
    used: int | float
    remaining: int | float | None


def budget_lines(budgets: Limits, totals: Totals) -> dict[str, BudgetLine]:
    """Every dimension: limit (None = no limit), used, remaining (never negative)."""
    lines = {}
    for d in DIMENSIONS:
        limit = budgets.limit(d.name)
        units = totals.units(d.name)
        remaining: int | float | None = None
        if d.micro:
            used: int | float = units / MICRO
            if limit is not None:
                remaining = max(to_micros(limit) - units, 0) / MICRO
        else:
            used = units
            if limit is not None:
                remaining = max(int(limit) - units, 0)
        lines[d.name] = BudgetLine(limit=limit, used=used, remaining=remaining)
    return lines
