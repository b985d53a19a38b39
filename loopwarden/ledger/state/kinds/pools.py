"""Budget pools' own receipts: defined (created, or its policy changed), paused and resumed —
each an operator's act, chained under `pool:<name>` (`ledger/state/pools.py`)."""

from __future__ import annotations

from loopwarden.ledger.state.events import PoolDefined, PoolStatusChanged, ReceiptKind
from loopwarden.ledger.state.pools import fold_pool, pool_problems
from loopwarden.ledger.state.spec import OPERATORS, KindSpec, PoolStep

_STEP = PoolStep(fold=fold_pool, judge=pool_problems)

SPECS = (
    KindSpec(ReceiptKind.POOL_DEFINED, PoolDefined, callers=OPERATORS, pool=_STEP),
    KindSpec(ReceiptKind.POOL_PAUSED, PoolStatusChanged, callers=OPERATORS, pool=_STEP),
    KindSpec(ReceiptKind.POOL_RESUMED, PoolStatusChanged, callers=OPERATORS, pool=_STEP),
)
