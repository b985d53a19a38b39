"""Every operation, in the order clients list them. The edges derive their surfaces from this:
the MCP tools (those with `tool=True`), the typed agent client and the admin CLI."""

from __future__ import annotations

from typing import Any

from loopwarden.operations.approvals import decide_approval, list_approvals, request_approval
from loopwarden.operations.claim import claim
from loopwarden.operations.hooks import hook
from loopwarden.operations.journal import journal
from loopwarden.operations.leases import heartbeat
from loopwarden.operations.loops import cancel_loop, list_loops, open_loop, pause_loop, resume_loop
from loopwarden.operations.operation import Operation
from loopwarden.operations.pools import pool_define, pool_pause, pool_resume, pools
from loopwarden.operations.projection import loop_policy, projection
from loopwarden.operations.quota import quota
from loopwarden.operations.receipt import receipt
from loopwarden.operations.todos import todo_add, todo_cancel
from loopwarden.operations.update import update

OPERATIONS: tuple[Operation[Any, Any], ...] = (
    quota,
    claim,
    update,
    receipt,
    projection,
    heartbeat,
    todo_add,
    request_approval,
    open_loop,
    decide_approval,
    list_loops,
    list_approvals,
    journal,
    loop_policy,
    pause_loop,
    resume_loop,
    cancel_loop,
    todo_cancel,
    pool_define,
    pool_pause,
    pool_resume,
    pools,
    hook,
)
TOOLS: tuple[Operation[Any, Any], ...] = tuple(op for op in OPERATIONS if op.tool)
