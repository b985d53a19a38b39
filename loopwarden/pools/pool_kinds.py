"""Budget pools' own receipts: defined (created, or its policy changed), paused and resumed —
each an operator's act, chained under `pool:<name>` (`kernel/state/charges.py`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from loopwarden.canonical import digest_of
from loopwarden.kernel.state.charges import pool_of
from loopwarden.kernel.state.events import MAX_SUMMARY, Fact, ReceiptBody, ReceiptKind
from loopwarden.kernel.state.fold import FoldError
from loopwarden.kernel.state.rows import PoolRow, replace
from loopwarden.kernel.state.spec import OPERATORS, KindSpec, PoolStep
from loopwarden.policy.pool_policy import PoolPolicy
from loopwarden.statuses import PoolStatus


class PoolDefined(Fact):
    """An operator created a budget pool, or changed its policy (`policy/pool_policy.py`); the
    body's `policy_digest` is this policy's."""

    policy: dict[str, Any]


class PoolStatusChanged(Fact):
    """An operator paused or resumed a pool: a paused pool admits no claim of its loops."""

    reason: str = Field(default="", max_length=MAX_SUMMARY)


def fold_pool(row: PoolRow | None, body: ReceiptBody, digest: str) -> PoolRow:
    """A pool's row after one of its receipts (raises `FoldError` if impossible)."""
    name = pool_of(body.loop_id) or ""
    data = body.data
    if isinstance(data, PoolDefined):
        policy = PoolPolicy.model_validate(data.policy)
        if row is None:
            row = PoolRow(
                name, policy, body.policy_digest, PoolStatus.ACTIVE, body.at, body.at, 0, ""
            )
        else:
            row = replace(row, policy=policy, policy_digest=body.policy_digest)
    elif row is None:
        raise FoldError(f"{body.kind} of pool {name!r}, which was never defined")
    elif isinstance(data, PoolStatusChanged):
        paused = body.kind == ReceiptKind.POOL_PAUSED
        wanted = PoolStatus.ACTIVE if paused else PoolStatus.PAUSED
        if row.status != wanted:
            raise FoldError(f"{body.kind} of pool {name!r}, which is {row.status}")
        row = replace(row, status=PoolStatus.PAUSED if paused else PoolStatus.ACTIVE)
    return replace(row, head_seq=body.seq, head_digest=digest, updated_at=body.at)


def pool_problems(body: ReceiptBody) -> list[str]:
    """What is wrong with a pool receipt's recorded decision (its caller is checked apart):
    a definition's policy must be valid and hash to the body's digest."""
    data = body.data
    if body.decision.effect != "allow":
        return ["a pool's receipt records a deny"]
    if isinstance(data, PoolDefined) and digest_of(data.policy) != body.policy_digest:
        return ["the pool policy it carries does not hash to its digest"]
    return []


_STEP = PoolStep(fold=fold_pool, judge=pool_problems)

SPECS = (
    KindSpec(ReceiptKind.POOL_DEFINED, PoolDefined, callers=OPERATORS, pool=_STEP),
    KindSpec(ReceiptKind.POOL_PAUSED, PoolStatusChanged, callers=OPERATORS, pool=_STEP),
    KindSpec(ReceiptKind.POOL_RESUMED, PoolStatusChanged, callers=OPERATORS, pool=_STEP),
)
