"""Family 11 — budget pools: what drawing from pools costs a governed turn.

Two loops on one store, the same policy but for `pools`: one draws from none, the other from
three (a total pool, a daily pool and one bound to the agent, so that every claim checks three
windows and every receipt charges three). Paired rounds, interleaved and alternating which
loop goes first: each round times a batch of governed turns (claim + update) in each loop;
the ratio of the medians is the cost of pools per turn, judged on figures from the same run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from bench import harness as h
from bench.report import Section, Table, Target
from loopwarden.loops import lifecycle as loops_op
from loopwarden.pools.pool_ops import PoolDefineRequest, pool_define
from loopwarden.principals import Principal

NAME = "pools"
POOLS = {
    "team": {"budgets": {"max_cost_usd": 1e6, "max_turns": 10_000_000}},
    "daily": {"budgets": {"max_model_calls": 10**9}, "window": "1d", "max_concurrent_turns": 64},
    "agent": {"budgets": {"max_turns": 10_000_000}, "agents": ["pooled-agent"]},
}
POOLED_AGENT = Principal(id="pooled-agent", role="agent")  # the plain loop's agent is unbound
GOAL = 0.15  # pools may add at most this share to a governed turn


@dataclass(frozen=True)
class Config:
    rounds: int
    batch: int  # governed turns per loop per round


QUICK = Config(rounds=6, batch=15)
FULL = Config(rounds=16, batch=40)


async def _prepare(store, todos: int) -> None:
    for name, policy in POOLS.items():
        await pool_define(store, h.OPERATOR, PoolDefineRequest(name=name, policy=policy))
    for loop_id, pools in (("plain", None), ("pooled", ["team", "daily"])):
        policy = {**h.POLICY, **({"pools": pools} if pools else {})}
        request = loops_op.OpenLoopRequest(
            objective="benchmark loop", policy=policy, todos=h.todo_specs(todos), loop_id=loop_id
        )
        await loops_op.open_loop(store, h.OPERATOR, request)


async def _batch(store, loop_id: str, turns: int) -> float:
    """Seconds per governed turn over `turns` turns in `loop_id`."""
    who = POOLED_AGENT if loop_id == "pooled" else h.AGENT
    t0 = time.perf_counter()
    for _ in range(turns):
        await h.governed_turn(store, who, loop_id)
    return (time.perf_counter() - t0) / turns


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    deadline = h.Deadline(budget)
    section = Section(
        family=NAME,
        number=11,
        title="Budget pools",
        how=(
            "one store (SQLite, synchronous=full), two loops with the same policy; `pooled` "
            "draws from three pools (a total one, a daily one with max_concurrent_turns, one "
            f"bound to its agent), `plain` from none (its agent is bound to no pool). {cfg.rounds} paired rounds of "
            f"{cfg.batch} governed turns (claim + update) per loop, interleaved, alternating "
            "which loop goes first; the medians of the per-turn times are compared."
        ),
    )
    plain: list[float] = []
    pooled: list[float] = []
    with h.temp_home(NAME) as home:
        async with h.open_store(home) as store:
            await _prepare(store, 2 * cfg.rounds * cfg.batch + 10)
            await _batch(store, "plain", 5)  # warm both paths
            await _batch(store, "pooled", 5)
            for n in range(cfg.rounds):
                if deadline.expired:
                    break
                order = ("plain", "pooled") if n % 2 == 0 else ("pooled", "plain")
                for loop_id in order:
                    seconds = await _batch(store, loop_id, cfg.batch)
                    (plain if loop_id == "plain" else pooled).append(seconds)
                h.progress(NAME, f"round {n + 1}/{cfg.rounds}")
    a, b = statistics.median(plain), statistics.median(pooled)
    ratio = b / a
    section.tables.append(
        Table(
            ["loop", "rounds", "ms per governed turn (median)", "min", "max"],
            [
                ["no pools", str(len(plain)), h.ms(a), h.ms(min(plain)), h.ms(max(plain))],
                ["three pools", str(len(pooled)), h.ms(b), h.ms(min(pooled)), h.ms(max(pooled))],
            ],
        )
    )
    section.targets.append(
        Target(
            f"three pools add ≤ {GOAL:.0%} to a governed turn",
            f"{h.ratio(ratio)} ({h.us(b - a)} µs per turn, two receipts)",
            ratio <= 1 + GOAL,
            "",
        )
    )
    section.notes.append(
        "per turn the pools cost one read of every pool row (once per transaction), one read "
        "and one write of each drawn pool's window row per charging receipt, and one pool row "
        "write when a turn opens or closes"
    )
    return section
