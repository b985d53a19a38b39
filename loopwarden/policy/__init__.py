"""Loop policies: the declarative rules of one loop and the pure evaluator that decides by them (no I/O)."""

from loopwarden.policy.decision import Decision, Reason
from loopwarden.policy.digest import policy_digest
from loopwarden.policy.loader import parse_policy, policy_schema
from loopwarden.policy.model import BUDGET_DIMENSIONS, LoopPolicy

__all__ = [
    "BUDGET_DIMENSIONS",
    "Decision",
    "LoopPolicy",
    "Reason",
    "parse_policy",
    "policy_digest",
    "policy_schema",
]
