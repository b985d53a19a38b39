"""What the templates show, computed from operation results and a loop's history (pure).

Nothing here reads the store or renders HTML: the templates escape every value they print.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from loopwarden.dashboard.charts import Chart, budget_chart
from loopwarden.dashboard.history import Line, LoopHistory, TurnTools
from loopwarden.kernel.runner.results import BudgetOut
from loopwarden.kernel.store.reader import JournalRow
from loopwarden.kinds import KINDS
from loopwarden.policy.decision import ReasonCode
from loopwarden.policy.model import LoopPolicy
from loopwarden.pools.pool_ops import PoolOut
from loopwarden.projection.loop_list import LoopSummary
from loopwarden.projection.projection import TodoOut
from loopwarden.statuses import TODO_STATUSES

PAGE_LINES = 200  # journal lines per page
RECENT_LINES = 25
RECENT_TURNS = 20
# Reason codes a page marks as violations (a refusal that breaks the policy, not a wait).
VIOLATIONS = frozenset(
    {
        ReasonCode.TOOL_DENIED,
        ReasonCode.TOOL_NOT_ALLOWED,
        ReasonCode.APPROVAL_REQUIRED,
        ReasonCode.APPROVAL_INVALID,
        ReasonCode.STALE_FENCE,
        ReasonCode.NOT_TURN_OWNER,
        ReasonCode.AGENT_NOT_ALLOWED,
        ReasonCode.EVALUATION_ERROR,
        ReasonCode.POLICY_VIOLATION,
    }
)


@dataclass(frozen=True)
class Meter:
    dimension: str
    used: float
    limit: float | None
    fraction: float  # 0..1 of the limit used (0 without a limit)

    @property
    def state(self) -> str:
        if self.limit is None:
            return "unlimited"
        if self.fraction >= 1:
            return "exhausted"
        return "high" if self.fraction >= 0.8 else "ok"


def meters(budgets: dict[str, BudgetOut], *, limited_only: bool = False) -> list[Meter]:
    """One bar per budget (those with a limit first; with `limited_only`, only those)."""
    out = []
    for dim, line in budgets.items():
        limit = None if line.limit is None else float(line.limit)
        if limited_only and limit is None:
            continue
        fraction = min(float(line.used) / limit, 1.0) if limit else 0.0
        out.append(Meter(dim, float(line.used), limit, fraction))
    return sorted(out, key=lambda m: m.limit is None)


@dataclass(frozen=True)
class Card:
    todo: TodoOut
    deps: list[tuple[str, str]]  # (todo id, its status, or "?" if not on this page)


def board(todos: list[TodoOut]) -> dict[str, list[Card]]:
    """The todos as columns by status, each card with its dependencies' statuses."""
    status_of = {t.todo_id: str(t.status) for t in todos}
    columns: dict[str, list[Card]] = {str(s): [] for s in TODO_STATUSES}
    for todo in todos:
        deps = [(dep, status_of.get(dep, "?")) for dep in todo.depends_on]
        columns[str(todo.status)].append(Card(todo, deps))
    return columns


def charts(history: LoopHistory, budgets: dict[str, BudgetOut], now: datetime) -> list[Chart]:
    """A chart for every budget that has been used: an unused one would be a flat line at 0
    (its meter above already says `0 / limit`), and seven of them filled the page."""
    out = []
    for dim, line in budgets.items():
        limit = None if line.limit is None else float(line.limit)
        points = history.series.get(dim, [])
        if not any(value for _, _, value in points):
            continue
        chart = budget_chart(dim, points, limit, now)
        if chart is not None:
            out.append(chart)
    return out


def unused(budgets: dict[str, BudgetOut], shown: list[Chart]) -> list[str]:
    """The budgets no chart is drawn for (nothing used yet)."""
    drawn = {chart.dimension for chart in shown}
    return [dim for dim in budgets if dim not in drawn]


def totals_disagree(history: LoopHistory, budgets: dict[str, BudgetOut]) -> list[str]:
    """Budgets whose use summed from the receipts differs from the stored projection's."""
    if history.head == 0:
        return []
    return [
        dim
        for dim, line in budgets.items()
        if abs(history.totals.used(dim) - float(line.used)) > 1e-6
    ]


def is_violation(line: Line) -> bool:
    return line.refused and any(code.split(":")[0] in VIOLATIONS for code in line.reasons)


def recent_turns(history: LoopHistory, most: int = RECENT_TURNS) -> list[TurnTools]:
    return list(reversed(list(history.turns.values())[-most:]))


@dataclass(frozen=True)
class JournalPage:
    lines: list[Line]  # newest first
    matched: int
    page: int
    pages: int
    kinds: list[str]
    principals: list[str]


def journal_page(
    history: LoopHistory, kind: str, principal: str, effect: str, page: int
) -> JournalPage:
    """The history's lines that match every filter given (an empty filter matches all)."""
    matched = [
        line
        for line in reversed(history.lines)
        if (not kind or line.kind == kind)
        and (not principal or line.principal == principal)
        and (not effect or line.effect == effect)
    ]
    pages = max(1, -(-len(matched) // PAGE_LINES))
    page = min(max(page, 1), pages)
    start = (page - 1) * PAGE_LINES
    return JournalPage(
        lines=matched[start : start + PAGE_LINES],
        matched=len(matched),
        page=page,
        pages=pages,
        kinds=sorted({line.kind for line in history.lines}),
        principals=sorted({line.principal for line in history.lines}),
    )


# --- the loops page: who must act first, fresh refusals flagged ------------------------------

ATTENTION_ORDER = {"human": 0, "agent": 1, "none": 2}
FRESH = timedelta(hours=1)  # a refusal this recent is flagged on the loops page
RECENT_RECEIPTS = 50  # receipts per loop looked at for fresh refusals (the newest)


@dataclass(frozen=True)
class Fresh:
    """A loop's refusals within `FRESH` of now (at most `RECENT_RECEIPTS` looked at)."""

    count: int
    latest: datetime  # when the newest was sealed

    @property
    def more(self) -> bool:
        return self.count >= RECENT_RECEIPTS


def fresh_refusals(rows: list[JournalRow], now: datetime) -> Fresh | None:
    """The refusals among a loop's newest receipts sealed since `now - FRESH`, or None."""
    since = now - FRESH
    recent = [row for row in rows if row.kind in KINDS.refusals and row.at >= since]
    return Fresh(len(recent), max(row.at for row in recent)) if recent else None


def by_attention(loops: list[LoopSummary], fresh: dict[str, Fresh]) -> list[LoopSummary]:
    """Who must act first (a human, then an agent, then no one); within each, loops with fresh
    refusals first, then the most recently active."""
    newest_first = sorted(loops, key=lambda lp: lp.updated_at, reverse=True)
    return sorted(
        newest_first,
        key=lambda lp: (ATTENTION_ORDER.get(lp.attention.who, 3), lp.loop_id not in fresh),
    )


# --- budget pools: their bars, whether they are spent, which a loop draws from ---------------

OPEN_TURNS = "open turns"  # the meter of a pool's open turns against max_concurrent_turns


@dataclass(frozen=True)
class PoolView:
    """A pool as a page shows it: a bar per limited budget and for its open turns (when capped),
    the budgets its window has spent, and (on a loop's page) the agent that binds it there."""

    pool: PoolOut
    meters: list[Meter]
    spent: list[str]  # budget dimensions used up in the current window
    busy: bool  # as many open turns as max_concurrent_turns
    via: str | None = None  # the agent binding the pool to a loop that does not name it

    @property
    def fullest(self) -> Meter | None:
        """The bar nearest its limit (a loop page shows only this one)."""
        return max(self.meters, key=lambda m: m.fraction, default=None)


def pool_view(pool: PoolOut, via: str | None = None) -> PoolView:
    bars = meters(pool.budgets, limited_only=True)
    cap = pool.max_concurrent_turns
    if cap is not None:
        used = float(pool.active_turns)
        bars.append(Meter(OPEN_TURNS, used, float(cap), min(used / cap, 1.0)))
    spent = [m.dimension for m in bars if m.dimension != OPEN_TURNS and m.state == "exhausted"]
    busy = cap is not None and pool.active_turns >= cap
    return PoolView(pool, bars, spent, busy, via)


def loop_pools(pools: list[PoolOut], policy: LoopPolicy) -> list[PoolView]:
    """The pools a loop draws from: those its policy names, then those binding an agent its
    policy admits (any bound agent when it admits `*`), each with the agent that binds it."""
    named = set(policy.pools or ())
    bound = []
    for pool in pools:
        binding = [a for a in pool.agents if pool.name not in named and policy.admits_agent(a)]
        if binding:
            bound.append(pool_view(pool, via=", ".join(binding)))
    return [pool_view(pool) for pool in pools if pool.name in named] + bound


STOP_REASONS = {
    "policy_violation": "a report named a tool the policy forbids",
    "max_turns": "every turn of its budget was used",
    "deadline": "its deadline passed",
    "repeated_failure": "the same failure repeated too often",
    "all_todos_done": "every todo is done",
    "cancelled": "an operator cancelled it",
}
"""Why a loop closed, in words (`stop_reason` is the code the receipt carries)."""


def stop_reason_text(code: str | None) -> str:
    """A person's words for a loop's stop reason code (the code itself if it is a new one)."""
    if not code:
        return ""
    if code.startswith("budget_exhausted:"):
        return f"its {code.split(':', 1)[1].replace('_', ' ')} budget is used up"
    return STOP_REASONS.get(code, code.replace("_", " "))
