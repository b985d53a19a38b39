"""Budget pools: a named budget that spans loops, and the rule a claim is admitted by.

A pool has any of a loop's budget dimensions, counted over a *window*: `total` (never resets)
or a UTC calendar window, `1h` (each hour from :00) or `1d` (each day from 00:00 UTC). A window
is the calendar period an instant falls in, never a rolling span: a charge belongs to the
window of the receipt that made it, and a new window starts at zero. `max_concurrent_turns`
caps the open turns of its loops at any moment (not windowed).

A loop draws from the pools its policy names (`pools = ["team-a"]`) and from every pool that
binds the agent of the turn (`agents = ["builder"]`). Pure: the write path and the judging
audit both call `pool_reasons` on the facts they hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import Field, model_validator

from loopwarden.clock import format_time
from loopwarden.policy.budgets import Budgets, Totals, exhausted
from loopwarden.policy.decision import Reason, ReasonCode
from loopwarden.policy.model import AgentIds, _Section

POOL_CHAIN = "pool:"
"""A pool's receipts chain under `pool:<name>` (no loop id holds a colon)."""

Window = Literal["total", "1h", "1d"]
_LENGTH = {"1h": timedelta(hours=1), "1d": timedelta(days=1)}
_NAMES = {"total": "total", "1h": "hourly", "1d": "daily"}
TOTAL_WINDOW = ""
"""The window key of a `total` pool (its one window)."""


class PoolPolicy(_Section):
    """What a pool allows. Versioned by the digest of its normalized form, like a loop's."""

    budgets: Budgets = Budgets()
    window: Window = "total"
    max_concurrent_turns: int | None = Field(default=None, ge=1, le=100_000)
    agents: AgentIds = Field(
        default=(), description="Agents that draw from the pool in every loop."
    )

    @model_validator(mode="after")
    def _some_limit(self) -> PoolPolicy:
        if self.budgets.is_empty() and self.max_concurrent_turns is None:
            raise ValueError(
                "a pool needs at least one limit: a budget (max_cost_usd, max_turns, …) or "
                "max_concurrent_turns"
            )
        if "*" in self.agents:
            raise ValueError("a pool binds named agents; '*' is not allowed (name the loops)")
        return self


def _first_instant(window: Window, at: datetime) -> datetime:
    """The first instant of the hourly or daily window `at` falls in (UTC)."""
    start = at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return start.replace(hour=0) if window == "1d" else start


def window_start(window: Window, at: datetime) -> str:
    """The key of the window `at` falls in, as its usage row is stored: the window's first
    instant in `clock.format_time`'s text (`TOTAL_WINDOW` for a total pool, which has none)."""
    if window == "total":
        return TOTAL_WINDOW
    return format_time(_first_instant(window, at))


def window_end(window: Window, at: datetime) -> datetime | None:
    """When the window `at` falls in ends (None for a total pool)."""
    if window == "total":
        return None
    return _first_instant(window, at) + _LENGTH[window]


@dataclass(frozen=True)
class PoolFacts:
    """What a claim is decided on, per pool it draws from: the pool's policy and status, what
    its current window has used, and its open turns."""

    name: str
    policy: PoolPolicy
    paused: bool
    used: Totals
    active: int


def pool_reasons(pools: list[PoolFacts], now: datetime) -> list[Reason]:
    """Why a claim drawing from `pools` must be refused (empty: every pool has room)."""
    reasons = []
    for pool in pools:
        if pool.paused:
            reasons.append(Reason(ReasonCode.POOL_PAUSED, f"pool {pool.name!r} is paused"))
        policy = pool.policy
        end = window_end(policy.window, now)
        resets = f"; resets at {end:%Y-%m-%d %H:%M} UTC" if end is not None else ""
        for dimension in exhausted(policy.budgets, pool.used):
            reasons.append(
                Reason(
                    ReasonCode.POOL_EXHAUSTED,
                    f"pool {pool.name!r}: its {_NAMES[policy.window]} {dimension} budget is spent "
                    f"({pool.used.used(dimension)} of {policy.budgets.limit(dimension)}){resets}",
                )
            )
        limit = policy.max_concurrent_turns
        if limit is not None and pool.active >= limit:
            reasons.append(
                Reason(
                    ReasonCode.POOL_BUSY,
                    f"pool {pool.name!r} has {pool.active} open turns (max_concurrent_turns "
                    f"{limit})",
                )
            )
    return reasons
