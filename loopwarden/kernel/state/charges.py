"""Budget pools in the ledger: a pool's own chain, and what each loop receipt charges it.

A pool's receipts (`pool.defined`, `pool.paused`, `pool.resumed`) chain under `pool:<name>`
and fold into its `PoolRow` (`pools/pool_kinds.py`). Every loop receipt charges pools with what it added
to its loop (`charges`): a turn's share goes to the pools its claim was admitted under (kept on
the turn row), anything outside a turn to the pools the loop and the acting agent draw from.
The write path and the judging audit keep a `PoolBook` each — rows proved in one transaction,
or state replayed from the journal — and call the same functions on it (`claim_reasons`,
`pool_refs`, `charge`), so a grant is judged on exactly what it was decided on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from loopwarden.kernel.state.events import PoolRef, ReceiptBody
from loopwarden.kernel.state.rows import LoopRow, LoopView, PoolRow, PoolUsage, TurnRow, replace
from loopwarden.policy.budgets import Totals
from loopwarden.policy.decision import Reason, ReasonCode
from loopwarden.policy.model import LoopPolicy
from loopwarden.policy.pool_policy import (
    POOL_CHAIN,
    PoolFacts,
    pool_reasons,
    window_start,
)
from loopwarden.statuses import PoolStatus


def chain_of(name: str) -> str:
    """The chain id a pool's receipts carry in their `loop_id`."""
    return POOL_CHAIN + name


def pool_of(chain_id: str) -> str | None:
    """The pool a chain id names (None for a loop's)."""
    return chain_id[len(POOL_CHAIN) :] if chain_id.startswith(POOL_CHAIN) else None


class PoolReads(Protocol):
    """What a claim's pools are decided on: every pool, and what a window of one used."""

    def pools(self) -> dict[str, PoolRow]:
        """Every pool, by name (the caller does not change the dict)."""
        ...

    def usage(self, pool: str, window_start: str) -> Totals: ...

    def hold(self, names: Iterable[str]) -> None:
        """Make the pools `names` this caller's to decide on until it ends (a write locks
        their rows; a replay or a snapshot has nothing to lock)."""
        ...


class PoolBook(PoolReads, Protocol):
    """Where pool state is kept and charged: the rows of one write transaction, or an audit's
    replay."""

    def put_pool(self, row: PoolRow) -> None: ...
    def put_usage(self, usage: PoolUsage) -> None: ...


# --- what a loop's claim draws from ------------------------------------------------------------


def drawn(pools: dict[str, PoolRow], policy: LoopPolicy, agent: str) -> list[str]:
    """The pools a loop with `policy` draws from for `agent`: those it names, and those that
    bind the agent, by name."""
    names = set(policy.pools or ())
    names.update(name for name, row in pools.items() if agent in row.policy.agents)
    return sorted(names)


def claim_reasons(book: PoolReads, policy: LoopPolicy, agent: str, now: datetime) -> list[Reason]:
    """Why a claim by `agent` in a loop with `policy` is refused by its pools (none: room)."""
    pools = book.pools()
    names = drawn(pools, policy, agent)
    book.hold(names)
    facts, reasons = [], []
    for name in names:
        row = pools.get(name)
        if row is None:
            why = f"the loop draws from pool {name!r}, which does not exist"
            reasons.append(Reason(ReasonCode.POOL_UNKNOWN, why))
            continue
        used = book.usage(name, window_start(row.policy.window, now))
        facts.append(
            PoolFacts(name, row.policy, row.status == PoolStatus.PAUSED, used, row.active_turns)
        )
    return reasons + pool_reasons(facts, now)


def pool_refs(book: PoolReads, policy: LoopPolicy, agent: str) -> tuple[PoolRef, ...] | None:
    """The pools a granted claim draws from, as its receipt records them (None: none)."""
    pools = book.pools()
    refs = tuple(
        PoolRef(name=name, policy_digest=pools[name].policy_digest)
        for name in drawn(pools, policy, agent)
        if name in pools
    )
    return refs or None


# --- what a loop receipt charges ---------------------------------------------------------------


@dataclass(frozen=True)
class Before:
    """The rows a loop receipt may change, as they were before it was folded."""

    loop: LoopRow
    turns: dict[str, TurnRow | None]


def before(view: LoopView | None, turn_ids: Iterable[str]) -> Before | None:
    """Snapshot `view` ahead of a fold (None for a loop not opened yet: nothing to charge)."""
    if view is None:
        return None
    return Before(view.loop, {t: view.turns.get(t) for t in turn_ids})


@dataclass(frozen=True)
class Charge:
    pools: tuple[str, ...]
    totals: Totals
    active: int  # open turns added (negative when turns closed)


def charges(
    prior: Before | None, after: LoopView, body: ReceiptBody, book: PoolBook
) -> list[Charge]:
    """What one folded loop receipt charges, and to which pools."""
    if prior is None or not book.pools():
        return []
    out, spent = [], Totals()
    was_open, now_open = set(prior.loop.open_turns), set(after.loop.open_turns)
    for turn_id in sorted(set(prior.turns) - {body.turn_id}):  # its own turn takes the rest
        row = after.turns.get(turn_id)
        if row is None or not row.pools:
            continue
        old = prior.turns.get(turn_id)
        calls = row.tool_calls_charged - (old.tool_calls_charged if old is not None else 0)
        active = (turn_id in now_open) - (turn_id in was_open)
        spent = spent.plus(Totals(tool_calls=calls))
        out.append(Charge(row.pools, Totals(tool_calls=calls), active))
    rest = after.loop.totals.minus(prior.loop.totals).minus(spent)
    own = after.turns.get(body.turn_id) if body.turn_id else None
    if own is not None:
        active = (own.turn_id in now_open) - (own.turn_id in was_open)
        out.append(Charge(own.pools, rest, active))
    elif rest != Totals():
        names = drawn(book.pools(), after.policy, body.principal.id)
        out.append(Charge(tuple(names), rest, 0))
    return out


def charge(book: PoolBook, charged: list[Charge], when: datetime) -> None:
    """Apply `charged` to the pools it names (a pool not defined is not charged: a claim
    drawing from it was refused)."""
    book.hold(name for item in charged for name in item.pools)  # the write held them (a no-op)
    for item in charged:
        for name in item.pools:
            row = book.pools().get(name)
            if row is None:
                continue
            if item.totals != Totals():
                window = window_start(row.policy.window, when)
                used = book.usage(name, window).plus(item.totals)
                book.put_usage(PoolUsage(name, window, used))
            if item.active:
                book.put_pool(replace(row, active_turns=max(row.active_turns + item.active, 0)))


class PoolLedger:
    """Pool state replayed from the journal (the audit's `PoolBook`)."""

    def __init__(self) -> None:
        self.rows: dict[str, PoolRow] = {}
        self.used: dict[tuple[str, str], Totals] = {}

    def pools(self) -> dict[str, PoolRow]:
        return self.rows

    def hold(self, names: Iterable[str]) -> None:
        """Nothing to lock: a replay is alone."""

    def usage(self, pool: str, window_start: str) -> Totals:
        return self.used.get((pool, window_start), Totals())

    def put_pool(self, row: PoolRow) -> None:
        self.rows[row.name] = row

    def put_usage(self, usage: PoolUsage) -> None:
        self.used[(usage.pool, usage.window_start)] = usage.totals
