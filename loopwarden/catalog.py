"""Every operation of every feature, in the order clients list them, collected once.

The edges derive their surfaces from `OPERATIONS`: the MCP tools (those with `tool=True`), the
typed agent client and the admin CLI. A feature's receipt kinds are collected beside it, in
`loopwarden/kinds.py`."""

from __future__ import annotations

from typing import Any

from loopwarden.approvals.approval_ops import decide_approval, list_approvals, request_approval
from loopwarden.hosts.hook import hook
from loopwarden.journal.listing import journal
from loopwarden.journal.receipt import receipt
from loopwarden.kernel.runner.operation import Operation
from loopwarden.loops.lifecycle import (
    cancel_loop,
    open_loop,
    pause_loop,
    resume_loop,
    set_policy,
)
from loopwarden.mcp_gateway.gateway_ops import (
    gateway_attach,
    gateway_call,
    gateway_outcome,
    gateway_tool_changed,
)
from loopwarden.model_gateway.model_ops import model_admit, model_check, model_settle
from loopwarden.pools.pool_ops import pool_define, pool_pause, pool_resume, pools
from loopwarden.projection.loop_list import list_loops
from loopwarden.projection.projection import loop_policy, projection
from loopwarden.todos.todo_ops import todo_add, todo_cancel
from loopwarden.turns.claim import claim
from loopwarden.turns.leases import heartbeat
from loopwarden.turns.quota import quota
from loopwarden.turns.update import update

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
    set_policy,
    todo_cancel,
    pool_define,
    pool_pause,
    pool_resume,
    pools,
    hook,
    gateway_call,
    gateway_outcome,
    gateway_attach,
    gateway_tool_changed,
    model_check,
    model_admit,
    model_settle,
)
TOOLS: tuple[Operation[Any, Any], ...] = tuple(op for op in OPERATIONS if op.tool)
