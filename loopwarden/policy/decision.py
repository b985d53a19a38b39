"""Decisions are values (Cedar style): an effect, typed reasons, and the policy that decided."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from loopwarden.policy.budgets import BUDGET_EXHAUSTED, DIMENSIONS

Effect = Literal["allow", "deny"]


class ReasonCode(StrEnum):
    """Why a decision went as it did: a stable public vocabulary, defined once. A budget's
    reason names its dimension (`budget_exhausted:<dimension>`, `budget_code`); a stop rule's
    reason is the rule (`all_todos_done`, `max_turns`, …), and an operator's control its act."""

    LOOP_NOT_ACTIVE = "loop_not_active"
    AGENT_NOT_ALLOWED = "agent_not_allowed"
    RATE_LIMITED = "rate_limited"
    LEASE_LIMIT = "lease_limit"
    AGENT_LEASE_LIMIT = "agent_lease_limit"
    DEADLINE_PASSED = "deadline_passed"
    NO_ELIGIBLE_TODO = "no_eligible_todo"
    TODO_NOT_ELIGIBLE = "todo_not_eligible"
    TOOL_NOT_ALLOWED = "tool_not_allowed"
    TOOL_DENIED = "tool_denied"
    APPROVAL_REQUIRED = "approval_required"
    APPROVAL_INVALID = "approval_invalid"
    APPROVAL_NOT_NEEDED = "approval_not_needed"
    STALE_FENCE = "stale_fence"
    LEASE_EXPIRED = "lease_expired"
    TURN_CLOSED = "turn_closed"
    NOT_TURN_OWNER = "not_turn_owner"
    EVIDENCE_REQUIRED = "evidence_required"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    TODOS_NOT_ADDABLE = "todos_not_addable"
    TODO_LIMIT = "todo_limit"
    EVALUATION_ERROR = "evaluation_error"
    REFUSALS_SUPPRESSED = "refusals_suppressed"  # an outsider's refusals counted, not sealed
    NO_OPEN_TURN = "no_open_turn"
    COMMAND_DENIED = "command_denied"
    COMMAND_NOT_ALLOWED = "command_not_allowed"
    COMMAND_UNREADABLE = "command_unreadable"  # a doubt: something a rule depends on is not literal
    COMMAND_OPAQUE = "command_opaque"  # code loopwarden does not read (python -c, a pipe into sh)
    ARGUMENT_NOT_ALLOWED = "argument_not_allowed"  # a value an argument rule refuses
    ARGUMENT_UNREADABLE = "argument_unreadable"  # a doubt: an argument a rule cannot judge
    TOOL_CHANGED = "tool_changed"  # a downstream tool's description is not the pinned one
    TOOL_UNPINNED = "tool_unpinned"  # a downstream tool no operator pinned yet
    HOST_NOT_ATTACHED = "host_not_attached"
    UNREPORTED_TOOL_USE = (
        "unreported_tool_use"  # observed, not reported: a violation in enforce mode
    )
    TOOL_UNREPORTED = "tool_unreported"  # the same, as a warning (record mode)
    TOOL_UNOBSERVED = "tool_unobserved"  # reported, never observed: a warning
    # the model gateway (model_gateway/, policy/model_calls.py)
    MODEL_NOT_ALLOWED = "model_not_allowed"  # no [model] allow pattern names it, or a deny does
    MODEL_UNPRICED = "model_unpriced"  # the price table has no price for it (and no default)
    UNREPORTED_MODEL_USE = (
        "unreported_model_use"  # a report below what the gateway observed: a violation (enforce)
    )
    MODEL_USAGE_UNREPORTED = "model_usage_unreported"  # the same, as a warning (record mode)
    # a budget pool the claim draws from (policy/pool_policy.py) has no room
    POOL_PAUSED = "pool_paused"
    POOL_EXHAUSTED = "pool_exhausted"
    POOL_BUSY = "pool_busy"
    POOL_UNKNOWN = "pool_unknown"
    # a budget used up, one per dimension (`budget_exhausted:<dimension>`, derived from
    # `policy/budgets.DIMENSIONS`: the enum's documented `_ignore_`/`vars()` form)
    _ignore_ = "_members _d"
    _members = vars()
    for _d in DIMENSIONS:
        _members[f"BUDGET_EXHAUSTED_{_d.name.upper()}"] = f"{BUDGET_EXHAUSTED}:{_d.name}"
    # the stop rules that close a loop by themselves
    ALL_TODOS_DONE = "all_todos_done"
    MAX_TURNS = "max_turns"
    DEADLINE = "deadline"
    REPEATED_FAILURE = "repeated_failure"
    POLICY_VIOLATION = "policy_violation"
    # an operator's controls
    PAUSED = "paused"
    RESUMED = "resumed"
    CANCELLED = "cancelled"
    APPROVED = "approved"
    REJECTED = "rejected"


VIOLATIONS = frozenset(
    {
        ReasonCode.TOOL_NOT_ALLOWED,
        ReasonCode.TOOL_DENIED,
        ReasonCode.APPROVAL_REQUIRED,
        ReasonCode.APPROVAL_INVALID,
        ReasonCode.UNREPORTED_TOOL_USE,
        ReasonCode.UNREPORTED_MODEL_USE,
    }
)
"""Reasons that count as a policy violation (they trigger `stop.on_violation`)."""


def budget_code(dimension: str) -> ReasonCode:
    """The reason code of a used-up budget dimension (a `ValueError` for an unknown one)."""
    return ReasonCode(f"{BUDGET_EXHAUSTED}:{dimension}")


@dataclass(frozen=True)
class Reason:
    code: ReasonCode
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True)
class Decision:
    """`allow` with informational reasons, or `deny` with every reason that denied."""

    effect: Effect
    reasons: tuple[Reason, ...] = field(default=())
    policy_digest: str = ""

    @property
    def allowed(self) -> bool:
        return self.effect == "allow"

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple([reason.code for reason in self.reasons]) if self.reasons else ()

    def as_dict(self) -> dict[str, object]:
        return {"effect": self.effect, "reasons": [r.as_dict() for r in self.reasons]}

    @staticmethod
    def of(reasons: list[Reason], policy_digest: str) -> Decision:
        """Deny if there is any reason, else allow."""
        return Decision("deny" if reasons else "allow", tuple(reasons), policy_digest)
