"""The projection's rows: a loop's state as plain frozen values, and a view of one loop.

`LoopView` holds a loop row and its todo, turn and approval rows, whole (an audit's replay) or
partial (the rows one receipt touches, on the write path). The fold (`fold.py`) produces them;
the store persists exactly those values; the read side returns them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from loopwarden.kernel.state.events import Timestamp
from loopwarden.policy.budgets import Totals
from loopwarden.policy.model import LoopPolicy
from loopwarden.policy.pool_policy import PoolPolicy
from loopwarden.statuses import (
    TODO_STATUSES,
    ApprovalStatus,
    LoopStatus,
    PoolStatus,
    TodoStatus,
    TurnStatus,
)

R = TypeVar("R")


class HostSeen(NamedTuple):
    """The host session an agent's hooks last spoke from, and when."""

    host: str
    session_id: str
    at: datetime


class Observed(NamedTuple):
    """What a host's hooks saw of one policy tool in a turn: calls admitted before they ran,
    calls seen after they ran."""

    admitted: int
    ran: int


@dataclass(frozen=True)
class LoopRow:
    loop_id: str
    objective: str
    status: LoopStatus
    stop_reason: str | None
    policy_digest: str
    opened_at: datetime
    opened_by: str
    totals: Totals
    todo_counts: tuple[int, ...]  # by TODO_STATUSES: open, claimed, done, blocked, cancelled
    failure_signature: str | None
    failure_streak: int
    head_seq: int
    head_digest: str
    updated_at: datetime
    open_turns: tuple[str, ...] = ()  # ids of the open turns, in claim order (≤ claims.max_active)
    slots: int = 0  # rows created so far; each todo, turn and approval has its own slot
    # Per agent, the host session its hooks last spoke from.
    hosts: dict[str, HostSeen] = field(default_factory=dict)

    def count(self, status: TodoStatus) -> int:
        return self.todo_counts[TODO_STATUSES.index(status)]

    @property
    def todo_total(self) -> int:
        return sum(self.todo_counts)

    def counts_by_status(self) -> dict[str, int]:
        return {str(s): n for s, n in zip(TODO_STATUSES, self.todo_counts, strict=True)}


@dataclass(frozen=True)
class TodoRow:
    loop_id: str
    todo_id: str
    title: str
    ord: int
    depends_on: tuple[str, ...]
    status: TodoStatus
    attempts: int
    fence: int
    added_by: str
    turn_id: str | None
    slot: int = 0


@dataclass(frozen=True)
class TurnRow:
    turn_id: str
    loop_id: str
    todo_id: str
    agent: str
    fence: int
    status: TurnStatus
    claimed_at: datetime
    lease_expires_at: datetime
    closed_at: datetime | None
    outcome: str | None
    slot: int = 0
    number: int = 0  # 1 for the loop's first claim, and so on (claims are numbered in time order)
    # What the host's hooks saw in this turn, per policy tool name; `refusals`: tool calls
    # refused before they ran.
    observed: dict[str, Observed] = field(default_factory=dict)
    reported: dict[str, int] = field(default_factory=dict)  # the accepted report's tools_used
    refusals: int = 0
    # Tool calls charged against max_tool_calls for this turn so far (by its reports, its lease's
    # expiry or its loop's close): a later charge is only what goes beyond it.
    tool_calls_charged: int = 0
    # A report's usage has been charged on the closed turn (the report that closed it, or the
    # first late one after an expiry or a close): later reports on it are not charged again.
    settled: bool = False
    pools: tuple[str, ...] = ()  # the budget pools its claim was admitted under (charged with it)
    # What the model gateway observed (and charged) in this turn: the model dimensions' units.
    model: Totals = field(default_factory=Totals)

    def observed_calls(self, tool: str) -> int:
        """Calls of `tool` the host saw: admitted or ran, whichever hook saw more."""
        seen = self.observed.get(tool, Observed(0, 0))
        return max(seen.admitted, seen.ran)

    def observed_admitted(self, tool: str) -> int:
        """Calls of `tool` admitted before they ran in this turn."""
        return self.observed.get(tool, Observed(0, 0)).admitted

    @property
    def observed_total(self) -> int:
        return sum(self.observed_calls(tool) for tool in self.observed)


@dataclass(frozen=True)
class Approval:
    """An approval as published: its row without the store's `slot`. The operations' result
    (`ApprovalOut`) takes its fields from here."""

    approval_id: str
    loop_id: str
    turn_id: str
    todo_id: str
    tool: str
    summary: str
    artifact_digest: str | None
    status: ApprovalStatus
    requested_by: str
    requested_at: Timestamp  # a datetime; Timestamp says how ApprovalOut's JSON writes it
    decided_by: str | None
    decided_at: Timestamp | None
    expires_at: Timestamp | None
    reason: str | None
    consumed_by: str | None


@dataclass(frozen=True)
class ApprovalRow(Approval):
    slot: int = 0


@dataclass(frozen=True)
class PoolRow:
    """A budget pool (its chain `pool:<name>`): its policy, status, and open turns now."""

    name: str
    policy: PoolPolicy
    policy_digest: str
    status: PoolStatus
    created_at: datetime
    updated_at: datetime
    head_seq: int
    head_digest: str
    active_turns: int = 0  # open turns of the loops and agents drawing from it


@dataclass(frozen=True)
class PoolUsage:
    """What one window of a pool has used (`window_start`: its first instant; "" for a total pool)."""

    pool: str
    window_start: str
    totals: Totals


@dataclass
class LoopView:
    """One loop's projection, whole (rebuilt) or partial (the rows one receipt touches)."""

    loop: LoopRow
    policy: LoopPolicy
    todos: dict[str, TodoRow] = field(default_factory=dict)
    turns: dict[str, TurnRow] = field(default_factory=dict)
    approvals: dict[str, ApprovalRow] = field(default_factory=dict)


@dataclass(frozen=True)
class Touched:
    """Existing rows a receipt reads or changes (new rows are created, not loaded)."""

    todos: frozenset[str] = frozenset()
    turns: frozenset[str] = frozenset()
    approvals: frozenset[str] = frozenset()


def replace(row: R, **changes: object) -> R:
    """`dataclasses.replace` for these plain frozen rows, without re-running `__init__` (the fold
    calls this several times per receipt; it is the audit's hot path). Rows have no
    `__post_init__`, so copying the field dict is the whole construction."""
    new = object.__new__(type(row))
    new.__dict__.update(row.__dict__, **changes)
    return new


def _differing(a: Any, b: Any, ignore: frozenset[str]) -> list[str]:
    """The fields of two rows of one dataclass that differ (leaving out `ignore`)."""
    if not ignore and a == b:  # the common case, compared whole
        return []
    return [
        f.name
        for f in fields(a)
        if f.name not in ignore and getattr(a, f.name) != getattr(b, f.name)
    ]


def diff_views(
    stored: LoopView, rebuilt: LoopView, ignore: frozenset[str] = frozenset()
) -> list[str]:
    """Human-readable differences between two views of one loop (empty if equal), leaving out
    the row fields named in `ignore` (those an older schema did not store)."""
    out = []
    for name in _differing(stored.loop, rebuilt.loop, ignore):
        a, b = getattr(stored.loop, name), getattr(rebuilt.loop, name)
        out.append(f"loop.{name}: stored {a!r}, receipts say {b!r}")
    if stored.policy != rebuilt.policy:
        out.append("the stored policy differs from the one the loop was opened with")
    for table in ("todos", "turns", "approvals"):
        mine, theirs = getattr(stored, table), getattr(rebuilt, table)
        for key in sorted(set(mine) | set(theirs)):
            if key not in theirs:
                out.append(f"{table}[{key}] is stored but no receipt creates it")
            elif key not in mine:
                out.append(f"{table}[{key}] is missing from the stored projection")
            elif changed := _differing(mine[key], theirs[key], ignore):
                out.append(f"{table}[{key}] differs in {', '.join(changed)}")
    return out
