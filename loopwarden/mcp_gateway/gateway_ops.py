"""The gateway's decisions: each downstream call decided, sealed before it is forwarded, and what
it came to sealed after, with the hook path's evaluator and receipts.

The caller is the agent's observer (`Principal(id=<agent>, role="observer")`): the gateway
speaks for the agent whose session it serves, as a host's hooks do. A call of downstream tool `T`
of server `S` is the host tool `mcp__S__T` of host `mcp-gateway`, policy name `mcp.S.T`: the
name a hook of Claude Code gives the same tool, so one policy governs it either way. By the
loop's `[observe] mode`:

- `off`: the gateway serves no downstream tool for the loop (nothing sealed, nothing forwarded:
  a gateway that let calls through unseen would govern nothing);
- `record`: decided and sealed (`tool.admitted`, or `tool.refused` with `enforced: false`) and
  forwarded either way; the outcome sealed (`tool.observed`);
- `enforce`: the same, and a refusal binds: the call is not forwarded.

The decision is `evaluate_tool_call`'s, on `tool_call_facts` with `once` (an approval covers
one call: a tool is covered while the turn holds more approvals of it than calls of it were
admitted) and the call's arguments (for argument rules; never stored, only their digest).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any, Literal

from pydantic import Field

from loopwarden.hostnames import GATEWAY
from loopwarden.hosts.host_kinds import (
    HostAttached,
    HostSession,
    HostToolName,
    ToolAdmitted,
    ToolObserved,
    ToolRefused,
)
from loopwarden.hosts.tool_names import policy_tool
from loopwarden.kernel.runner.operation import OBSERVER_CALLERS, Call
from loopwarden.kernel.runner.refusals import refuse_request
from loopwarden.kernel.runner.results import Model, ReasonOut, reasons_out
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import by_loop
from loopwarden.kernel.state.events import Amount, Count, Digest, LoopId, ReceiptKind
from loopwarden.kernel.state.facts import agent_turn, tool_call_facts
from loopwarden.kernel.store.store import Txn
from loopwarden.mcp_gateway.gateway_kinds import ToolChanged
from loopwarden.policy.decision import Decision, Reason, ReasonCode
from loopwarden.policy.evaluate import evaluate_tool_call

CallId = str


def host_tool(server: str, tool: str) -> str:
    """The gateway's host tool name of a downstream tool (Claude Code's spelling)."""
    return f"mcp__{server}__{tool}"


def gateway_policy_name(server: str, tool: str) -> str:
    """The policy name of downstream tool `tool` of `server`: `mcp.<server>.<tool>`."""
    return policy_tool(GATEWAY, host_tool(server, tool))


class GatewayCall(Model):
    """One downstream call, before it is forwarded."""

    loop_id: LoopId
    session_id: HostSession
    call_id: str = Field(min_length=1, max_length=200)
    server: str = Field(min_length=1, max_length=64)
    tool: str = Field(min_length=1, max_length=150, description="As the downstream names it.")
    input_digest: Digest
    tool_digest: Digest = Field(description="The digest of the pinned tool description.")
    arguments: dict[str, Any] | None = Field(
        default=None, description="For argument rules: decided on, never stored."
    )


class GatewayVerdict(Model):
    decision: Literal["allow", "deny"]
    forward: bool = Field(description="Whether the gateway forwards the call.")
    binding: bool = Field(description="The loop enforces the decision ([observe] mode).")
    reasons: list[ReasonOut]
    message: str
    tool: str = Field(description="The call's policy name.")
    turn_id: str | None
    fence: int | None
    receipt_id: str | None


def _outsider(call: Call[Txn], req: Any, decision: Decision) -> GatewayVerdict:
    """A caller outside the loop's agents: recorded (bounded, `outsiders.py`), not forwarded."""
    receipt = refuse_request(call, "hook", decision)
    message = "; ".join(r.message for r in decision.reasons)
    tool = gateway_policy_name(req.server, req.tool) if hasattr(req, "tool") else ""
    return GatewayVerdict(
        decision="deny", forward=False, binding=True, reasons=reasons_out(decision.reasons),
        message=message, tool=tool or "mcp", turn_id=None, fence=None, receipt_id=receipt,
    )  # fmt: skip


OFF = Reason(
    ReasonCode.LOOP_NOT_ACTIVE,
    "this loop's policy does not observe tool calls ([observe] mode is off): the MCP gateway "
    "serves downstream tools only to a loop whose policy sets [observe] mode = record or enforce",
)


@operation(access="write", scope=by_loop, callers=OBSERVER_CALLERS, refuse=_outsider, tool=False)
def gateway_call(call: Call[Txn], req: GatewayCall) -> GatewayVerdict:
    """Decide and seal one downstream MCP call through the gateway.

    \f
    See the module docstring. The agent's open turn (its latest), the pure evaluator of the hook
    path; sealed `tool.admitted` or `tool.refused` with `host` `mcp-gateway`, the call's id,
    the input's digest and the pinned tool's digest. `forward`: admitted, or refused in `record`
    mode. In `off` mode nothing is sealed and nothing forwarded.
    """
    tx, who, loop = call.tx, call.who, call.loop
    policy = tx.rows.policy(loop.policy_digest)
    name = host_tool(req.server, req.tool)
    tool = policy_tool(GATEWAY, name)
    if policy.observe_mode == "off":
        return GatewayVerdict(
            decision="deny", forward=False, binding=True, reasons=reasons_out([OFF]),
            message=OFF.message, tool=tool, turn_id=None, fence=None, receipt_id=None,
        )  # fmt: skip
    if not loop.status.closed:
        attach(call, req.session_id)
    open_turns = tx.rows.open_turns(loop.loop_id)
    turn = agent_turn(open_turns, who.id)
    approved = tx.rows.approved_for_turn(loop.loop_id, turn.turn_id) if turn else {}
    facts = tool_call_facts(
        loop, open_turns, approved.values(), who.id, (name, tool, None), tx.now, once=True
    )
    facts = dataclasses.replace(facts, arguments=req.arguments)
    decision = evaluate_tool_call(policy, facts, digest=loop.policy_digest)
    binding = policy.observe_mode == "enforce"
    fields = {
        "host": GATEWAY, "session_id": req.session_id, "tool_use_id": req.call_id,
        "host_tool": name, "tool": tool, "input_digest": req.input_digest,
        "tool_digest": req.tool_digest,
    }  # fmt: skip
    data: ToolAdmitted | ToolRefused
    if decision.allowed:
        data, kind = ToolAdmitted(**fields), ReceiptKind.TOOL_ADMITTED
    else:
        data, kind = ToolRefused(**fields, enforced=binding), ReceiptKind.TOOL_REFUSED
    sealed = tx.append(
        loop.loop_id, kind, who, data, decision=decision,
        turn_id=turn.turn_id if turn else None, todo_id=turn.todo_id if turn else None,
    )  # fmt: skip
    return GatewayVerdict(
        decision=decision.effect,
        forward=decision.allowed or not binding,
        binding=binding,
        reasons=reasons_out(decision.reasons),
        message="; ".join(r.message for r in decision.reasons),
        tool=tool,
        turn_id=turn.turn_id if turn else None,
        fence=turn.fence if turn else None,
        receipt_id=sealed.receipt_id,
    )


def attach(call: Call[Txn], session_id: str) -> None:
    """Seal `host.attached` for the gateway's session unless the loop saw it from this agent
    within half a lease (a claim in `enforce` mode needs the agent's host seen in a lease)."""
    seen = call.loop.hosts.get(call.who.id)
    policy = call.tx.rows.policy(call.loop.policy_digest)
    recent = call.tx.now - timedelta(seconds=policy.claims.lease_seconds / 2)
    same = seen is not None and (seen.host, seen.session_id) == (GATEWAY, session_id)
    if same and seen is not None and seen.at >= recent:
        return
    call.tx.append(
        call.loop.loop_id,
        ReceiptKind.HOST_ATTACHED,
        call.who,
        HostAttached(host=GATEWAY, session_id=session_id),
    )


class GatewaySession(Model):
    loop_id: LoopId
    session_id: HostSession


class GatewayAttached(Model):
    attached: bool = Field(description="The loop observes tool calls and saw this session.")


@operation(access="write", scope=by_loop, callers=OBSERVER_CALLERS, refuse=None, tool=False)
def gateway_attach(call: Call[Txn], req: GatewaySession) -> GatewayAttached:
    """Announce the gateway's session for the agent (before its claim passes through).

    \f
    Seals `host.attached` (host `mcp-gateway`) unless the loop saw this session within half a
    lease; nothing in `off` mode or for a closed loop.
    """
    policy = call.tx.rows.policy(call.loop.policy_digest)
    if policy.observe_mode == "off" or call.loop.status.closed:
        return GatewayAttached(attached=False)
    attach(call, req.session_id)
    return GatewayAttached(attached=True)


class GatewayOutcome(Model):
    """What a forwarded call came to: digests and sizes, never the result."""

    loop_id: LoopId
    session_id: HostSession
    call_id: str = Field(min_length=1, max_length=200)
    server: str = Field(min_length=1, max_length=64)
    tool: str = Field(min_length=1, max_length=150)
    response_digest: Digest
    response_bytes: Count
    errored: bool
    duration_ms: Amount


class GatewayObserved(Model):
    receipt_id: str | None


@operation(access="write", scope=by_loop, callers=OBSERVER_CALLERS, refuse=None, tool=False)
def gateway_outcome(call: Call[Txn], req: GatewayOutcome) -> GatewayObserved:
    """Seal what a forwarded downstream call came to.

    \f
    `tool.observed` (host `mcp-gateway`) on the agent's open turn, or outside any turn charged
    against `max_tool_calls` (`charged`), as a hook's post-tool event; nothing for a loop that
    closed meanwhile or does not observe.
    """
    tx, who, loop = call.tx, call.who, call.loop
    policy = tx.rows.policy(loop.policy_digest)
    if policy.observe_mode == "off" or loop.status.closed:
        return GatewayObserved(receipt_id=None)
    turn = agent_turn(tx.rows.open_turns(loop.loop_id), who.id)
    name = host_tool(req.server, req.tool)
    data = ToolObserved(
        host=GATEWAY, session_id=req.session_id, tool_use_id=req.call_id, host_tool=name,
        tool=policy_tool(GATEWAY, name), response_digest=req.response_digest,
        response_bytes=req.response_bytes, errored=req.errored, duration_ms=req.duration_ms,
        charged=turn is None,
    )  # fmt: skip
    sealed = tx.append(
        loop.loop_id, ReceiptKind.TOOL_OBSERVED, who, data,
        turn_id=turn.turn_id if turn else None, todo_id=turn.todo_id if turn else None,
    )  # fmt: skip
    return GatewayObserved(receipt_id=sealed.receipt_id)


class GatewayChange(Model):
    loop_id: LoopId
    session_id: HostSession
    server: str = Field(min_length=1, max_length=64)
    tool: HostToolName = Field(description="As the downstream names it.")
    pinned_digest: Digest
    seen_digest: Digest


@operation(access="write", scope=by_loop, callers=OBSERVER_CALLERS, refuse=None, tool=False)
def gateway_tool_changed(call: Call[Txn], req: GatewayChange) -> GatewayObserved:
    """Seal a downstream tool whose description is not the pinned one.

    \f
    `mcp.tool_changed` with both digests, a refusal of no turn; nothing in `off` mode (the
    gateway serves such a loop nothing).
    """
    policy = call.tx.rows.policy(call.loop.policy_digest)
    if policy.observe_mode == "off":
        return GatewayObserved(receipt_id=None)
    name = host_tool(req.server, req.tool)
    reason = Reason(
        ReasonCode.TOOL_CHANGED,
        f"{name}: its description or input schema changed since it was pinned; hidden and "
        "refused until an operator pins it again (loopwarden gateway pin)",
    )
    data = ToolChanged(
        server=req.server, host_tool=name, tool=policy_tool(GATEWAY, name),
        pinned_digest=req.pinned_digest, seen_digest=req.seen_digest, session_id=req.session_id,
    )  # fmt: skip
    sealed = call.tx.append(
        call.loop.loop_id,
        ReceiptKind.MCP_TOOL_CHANGED,
        call.who,
        data,
        decision=Decision("deny", (reason,)),
    )
    return GatewayObserved(receipt_id=sealed.receipt_id)
