"""The price table: what a model call costs, from the tokens the provider says it used.

Prices are data (`prices.toml`, shipped dated with its source), overridable by the operator with
a file of the same shape. A price is kept in integer micro-dollars per million tokens, and a
call's cost is rounded *up* to the micro-dollar, so that summing receipts in any process gives
exactly the stored counter and a call is never free. A model the table does not price is
refused, unless the operator configured a `[default]` price (then it is charged that).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from loopwarden.errors import InvalidInput
from loopwarden.policy.budgets import MICRO

PER_MILLION = 1_000_000


class PriceEntry(BaseModel):
    """One model's prices, US dollars per million tokens (the table's and a receipt's shape)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, le=10_000, allow_inf_nan=False)
    output: float = Field(ge=0, le=10_000, allow_inf_nan=False)
    cache_write: float | None = Field(default=None, ge=0, le=10_000, allow_inf_nan=False)
    cache_read: float | None = Field(default=None, ge=0, le=10_000, allow_inf_nan=False)
    max_output: int = Field(default=32_000, ge=1, le=10_000_000)
    long_above: int | None = Field(default=None, ge=1)
    long_input: float | None = Field(default=None, ge=0, le=10_000, allow_inf_nan=False)
    long_output: float | None = Field(default=None, ge=0, le=10_000, allow_inf_nan=False)
    long_cache_write: float | None = Field(default=None, ge=0, le=10_000, allow_inf_nan=False)
    long_cache_read: float | None = Field(default=None, ge=0, le=10_000, allow_inf_nan=False)


class PriceFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    as_of: str | None = None
    source: str | None = None
    replace: bool = False  # an operator's table in place of the shipped one, not over it
    models: dict[str, PriceEntry] = Field(default_factory=dict)
    default: PriceEntry | None = None


@dataclass(frozen=True)
class Rates:
    """Micro-dollars per million tokens of each sort."""

    input: int
    output: int
    cache_write: int
    cache_read: int

    @classmethod
    def of(cls, inp: float, out: float, write: float | None, read: float | None) -> Rates:
        def units(dollars: float) -> int:
            return round(dollars * MICRO)

        return cls(
            units(inp),
            units(out),
            units(write if write is not None else inp),
            units(read if read is not None else inp),
        )

    @property
    def dearest_input(self) -> int:
        return max(self.input, self.cache_write, self.cache_read)


@dataclass(frozen=True)
class Price:
    """The price a call is charged at: the table's entry (`key`: the entry's name, or
    `default`), its rates, and the most output one call may return."""

    key: str
    entry: PriceEntry

    @property
    def max_output(self) -> int:
        return self.entry.max_output

    def rates(self, prompt_tokens: int) -> Rates:
        """The rates for a call whose prompt (input and cache tokens) is `prompt_tokens` long."""
        e = self.entry
        if e.long_above is not None and prompt_tokens > e.long_above:
            return Rates.of(
                e.long_input if e.long_input is not None else e.input,
                e.long_output if e.long_output is not None else e.output,
                e.long_cache_write if e.long_cache_write is not None else e.cache_write,
                e.long_cache_read if e.long_cache_read is not None else e.cache_read,
            )
        return Rates.of(e.input, e.output, e.cache_write, e.cache_read)

    def cost_micros(self, inp: int, out: int, cache_write: int, cache_read: int) -> int:
        """The cost of a call's tokens in micro-dollars, rounded up (never free)."""
        r = self.rates(inp + cache_write + cache_read)
        total = inp * r.input + out * r.output + cache_write * r.cache_write
        total += cache_read * r.cache_read
        return -(-total // PER_MILLION)

    def worst_micros(self, prompt_tokens: int, out: int) -> int:
        """The most a call of at most `prompt_tokens` prompt and `out` output tokens costs: its
        prompt at the dearest input rate (a cache write), either tier's rates, the dearer."""
        tiers = [self.rates(0)]
        if self.entry.long_above is not None:
            tiers.append(self.rates(self.entry.long_above + 1))
        dearest_in = max(t.dearest_input for t in tiers)
        dearest_out = max(t.output for t in tiers)
        return -(-(prompt_tokens * dearest_in + out * dearest_out) // PER_MILLION)


class PriceTable:
    """Prices by model name: the shipped table, overridden entry by entry by the operator's."""

    def __init__(self, shipped: PriceFile, override: PriceFile | None = None) -> None:
        self.as_of = (override.as_of if override and override.as_of else None) or shipped.as_of
        self.source = shipped.source
        self.overridden = override is not None
        self.models = dict(shipped.models)
        self.default = shipped.default
        if override is not None:
            if override.replace:
                self.models, self.default = {}, None
                self.source = override.source or "the operator's table"
            self.models.update(override.models)
            self.default = override.default or self.default
        self._keys = sorted(self.models, key=len, reverse=True)

    def price(self, model: str) -> Price | None:
        """The price of `model`: its longest matching entry (`claude-sonnet-4-5` prices
        `claude-sonnet-4-5-20250929`), else the operator's default, else None (refused)."""
        name = model.removeprefix("models/")
        for key in self._keys:
            if name == key or (name.startswith(key) and name[len(key)] in "-@:"):
                return Price(key, self.models[key])
        return Price("default", self.default) if self.default is not None else None

    def rows(self) -> list[tuple[str, PriceEntry]]:
        return sorted(self.models.items())


def _parse(text: str, where: str) -> PriceFile:
    try:
        data: Any = tomllib.loads(text)
        return PriceFile.model_validate(data)
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise InvalidInput(f"the price table {where} is not valid: {exc}") from None


def shipped() -> PriceFile:
    text = resources.files(__package__).joinpath("prices.toml").read_text(encoding="utf-8")
    return _parse(text, "shipped with loopwarden")


def load_prices(override: Path | None = None) -> PriceTable:
    """The shipped table, overridden by the operator's file if given (`InvalidInput` if it is
    not a valid price table)."""
    extra = None
    if override is not None:
        try:
            text = override.read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidInput(f"cannot read the price table {override}: {exc.strerror}") from None
        extra = _parse(text, str(override))
    return PriceTable(shipped(), extra)


def cost_usd(micros: int) -> float:
    return micros / MICRO
