"""Every receipt kind of every feature, collected once into the registry the kernel is given.

The kernel imports no feature: a store (`Store.open(kinds=KINDS)`), the judge and the audit are
handed this registry, which each feature's `*_kinds.py` contributes its specs to. A process
that seals one receipt (a host's hook) imports this and the kinds' modules, never the
operations of `catalog.py`."""

from __future__ import annotations

from loopwarden.approvals import approval_kinds
from loopwarden.hosts import host_kinds
from loopwarden.kernel.runner import request_kinds
from loopwarden.kernel.state.registry import Kinds
from loopwarden.loops import loop_kinds
from loopwarden.mcp_gateway import gateway_kinds
from loopwarden.model_gateway import model_kinds
from loopwarden.pools import pool_kinds
from loopwarden.todos import todo_kinds
from loopwarden.turns import turn_kinds

KINDS = Kinds(
    loop_kinds.SPECS,
    turn_kinds.SPECS,
    approval_kinds.SPECS,
    todo_kinds.SPECS,
    request_kinds.SPECS,
    host_kinds.SPECS,
    pool_kinds.SPECS,
    model_kinds.SPECS,
    gateway_kinds.SPECS,
)
"""Every receipt kind's spec: what stores build and fold receipts by, and audits judge by."""
