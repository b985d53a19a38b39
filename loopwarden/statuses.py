"""The lifecycle statuses of loops, pools, todos, turns and approvals: closed sets, defined once.

They live here, below every package, because the pure policy evaluator needs loop and turn
statuses and sits below the ledger that stores them. Each is a `StrEnum`: it compares equal to
its value, is stored and serialized as that string, and an unknown string is a `ValueError`
(never a fallback).
"""

from __future__ import annotations

from enum import StrEnum


class LoopStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"
    STOPPED = "stopped"
    CANCELLED = "cancelled"

    @property
    def closed(self) -> bool:
        """A closed loop never changes again: no claims, reports or stops."""
        return self in CLOSED_LOOP_STATUSES


CLOSED_LOOP_STATUSES = frozenset({LoopStatus.COMPLETED, LoopStatus.STOPPED, LoopStatus.CANCELLED})


class PoolStatus(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"  # by an operator: its loops' claims are refused until it is resumed


class TodoStatus(StrEnum):
    OPEN = "open"
    CLAIMED = "claimed"
    DONE = "done"
    BLOCKED = "blocked"
    CANCELLED = "cancelled"  # by an operator; never claimed again, and no longer owed


TODO_STATUSES: tuple[TodoStatus, ...] = tuple(TodoStatus)
"""In display order; a loop's `todo_counts` follow it."""


class TurnStatus(StrEnum):
    OPEN = "open"
    REPORTED = "reported"
    REFUSED = "refused"
    EXPIRED = "expired"
    CLOSED = "closed"


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    CONSUMED = "consumed"
