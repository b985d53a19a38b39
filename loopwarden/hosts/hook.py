"""`hook`: one event from an agent host's hooks — decided, sealed, answered (docs/hooks.md).

The caller is an `observer` bound to one agent (the command hook's `--agent`, or an observer
token over HTTP), never anything the event says. By the loop's `[observe] mode`:

- `off`: the loop does not use host evidence; every event is let through and nothing is sealed;
- `record`: a tool call is decided and sealed (`tool.admitted`, or `tool.refused` with
  `enforced: false`) and let through; what ran is sealed (`tool.observed`); `update` compares;
- `enforce`: the same, and a refusal binds: the host is told to block the call.

A host session announces itself with `host.attached` (its SessionStart, or the first event of a
session loopwarden has not seen). loopwarden's own MCP tools (`OWN_TOOLS`, under the server
names the hook was installed with) are always let through unrecorded: the agent must be able to
claim and report, and those calls seal their own receipts. So are the host's internal tools the
policy does not deny or gate (`policy/evaluate.admits_internal`): they act on nothing outside
the host. The Stop event seals nothing: it asks the agent, once, to report a turn whose observed
work is unreported. Events from a subagent name it (`agent_id`, `agent_type`) in the receipts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import Field, model_validator

from loopwarden.hosts.host import Phase
from loopwarden.hosts.host_kinds import (
    HookHost,
    HostAgent,
    HostAttached,
    HostSession,
    HostToolName,
    ToolAdmitted,
    ToolObserved,
    ToolRefused,
)
from loopwarden.hosts.tool_names import is_internal, is_own_tool, mcp_parts, policy_tool
from loopwarden.kernel.runner.operation import OBSERVER_CALLERS, Call
from loopwarden.kernel.runner.refusals import refuse_request
from loopwarden.kernel.runner.results import Model, ReasonOut, reasons_out
from loopwarden.kernel.runner.runner import operation
from loopwarden.kernel.runner.visibility import by_loop
from loopwarden.kernel.state.events import Amount, Digest, LoopId, ReceiptKind
from loopwarden.kernel.state.facts import agent_turn, tool_call_facts
from loopwarden.kernel.state.rows import TurnRow
from loopwarden.kernel.store.store import Txn
from loopwarden.policy.commands import MAX_COMMAND
from loopwarden.policy.decision import Decision
from loopwarden.policy.evaluate import admits_internal, evaluate_tool_call
from loopwarden.policy.model import LoopPolicy

OWN_TOOLS = frozenset(
    {"quota", "claim", "update", "receipt", "projection", "heartbeat", "todo_add",
     "request_approval", "open_loop", "decide_approval"}
)  # fmt: skip
"""loopwarden's MCP tools (`operations/catalog.TOOLS`, which a test holds equal to this): a copy,
because the hook process must not import every operation to answer a tool call."""


class HookEvent(Model):
    """One host hook event, as the host adapter (`loopwarden/hooks`) read it."""

    loop_id: LoopId
    host: HookHost
    phase: Phase
    session_id: HostSession
    tool_use_id: str | None = Field(default=None, max_length=200)
    host_tool: HostToolName | None = None
    input_digest: Digest | None = Field(
        default=None, description="sha256 of the RFC 8785 bytes of the tool input."
    )
    command: str | None = Field(
        default=None,
        max_length=MAX_COMMAND,
        description="The command line of a shell tool: decided on, never stored.",
    )
    shell: Literal["bash", "powershell"] = Field(
        default="bash", description="The shell language of `command`."
    )
    arguments: dict[str, Any] | None = Field(
        default=None,
        description="An MCP tool's arguments, for argument rules: decided on, never stored.",
    )
    response_digest: Digest | None = None
    errored: bool = False
    duration_ms: Amount | None = None
    stop_active: bool = Field(
        default=False, description="The host already blocked this stop once (Stop hooks)."
    )
    agent_id: HostAgent | None = Field(
        default=None, description="The subagent that made the tool call, as the host names it."
    )
    agent_type: HostAgent | None = None
    servers: list[str] = Field(
        default_factory=lambda: ["loopwarden"],
        max_length=16,
        description="The names loopwarden's MCP server has in the host's configuration.",
    )

    @model_validator(mode="after")
    def _tool_events_name_their_tool(self) -> HookEvent:
        if self.phase in ("pre", "post") and (self.host_tool is None or self.input_digest is None):
            raise ValueError("a tool event needs host_tool and input_digest")
        if self.phase == "post" and self.response_digest is None:
            raise ValueError("a post-tool event needs response_digest")
        return self


class HookAnswer(Model):
    block: bool = Field(description="Whether the host is told to block (the call, or the stop).")
    decision: Literal["allow", "deny"] = Field(description="What the rules decided.")
    binding: bool = Field(description="The loop enforces hook decisions ([observe] mode).")
    reasons: list[ReasonOut]
    message: str = Field(description="For the model: why, and what to do next.")
    tool: str | None = Field(description="The policy name of the host tool, if any.")
    turn_id: str | None
    receipt_id: str | None = Field(description="The receipt sealed for this event, if one was.")


def _own_elsewhere(req: HookEvent) -> str | None:
    """The server name a call of one of loopwarden's own tools came under, when the hooks were
    not installed for that name (`mcp__lw__claim` with hooks for `loopwarden`): the refusal
    then says so, instead of telling the model to call the tool it was just refused."""
    parts = mcp_parts(req.host_tool) if req.host_tool else None
    if parts is None or parts[1] not in OWN_TOOLS or parts[0] in req.servers:
        return None
    return parts[0]


def _answer(
    decision: Decision,
    *,
    block: bool,
    binding: bool,
    message: str = "",
    tool: str | None = None,
    turn: TurnRow | None = None,
    receipt_id: str | None = None,
) -> HookAnswer:
    if not message and decision.reasons:
        message = "; ".join(r.message for r in decision.reasons)
    return HookAnswer(
        block=block,
        decision=decision.effect,
        binding=binding,
        reasons=reasons_out(decision.reasons),
        message=message,
        tool=tool,
        turn_id=turn.turn_id if turn is not None else None,
        receipt_id=receipt_id,
    )


ALLOW = Decision("allow")


def _refuse(call: Call[Txn], req: HookEvent, decision: Decision) -> HookAnswer:
    """An event from outside the loop's agents: recorded (bounded, `outsiders.py`), blocked."""
    receipt = refuse_request(call, "hook", decision)
    return _answer(decision, block=req.phase == "pre", binding=True, receipt_id=receipt)


@operation(access="write", scope=by_loop, callers=OBSERVER_CALLERS, refuse=_refuse, tool=False)
def hook(call: Call[Txn], req: HookEvent) -> HookAnswer:
    """Decide and record one host hook event for the observer's agent.

    \f
    See the module docstring. Pre-tool: the agent's open turn (its latest), the host tool's
    policy name (`hosts/tool_names.py`, the policy's `[observe.names]` first), and the same pure
    evaluator `update` uses (`evaluate_tool_call`): loop active, a turn held, tool allowed and
    not denied, approval-gated tools covered by an approved unexpired approval of the turn,
    shell commands by `[tools.commands]`, observed tool calls under `max_tool_calls`.
    """
    tx, who, loop = call.tx, call.who, call.loop
    policy = tx.rows.policy(loop.policy_digest)
    mode = policy.observe_mode
    if mode == "off":
        why = "this loop's policy does not observe hosts ([observe] mode is off): not recorded"
        return _answer(ALLOW, block=False, binding=False, message=why)
    if req.phase == "stop":
        return _stop(call, req, policy)
    own = req.host_tool is not None and is_own_tool(req.host_tool, req.servers, OWN_TOOLS)
    binding = mode == "enforce"
    if loop.status.closed and req.phase != "pre":
        return _answer(ALLOW, block=False, binding=binding)  # nothing left to record
    if not loop.status.closed:
        _attach(call, req)
    if req.phase == "session" or own or req.host_tool is None:
        return _answer(ALLOW, block=False, binding=binding)
    overrides = policy.observe.names.get(req.host, {}) if policy.observe else {}
    tool = policy_tool(req.host, req.host_tool, overrides)
    internal = is_internal(req.host, req.host_tool)
    open_turns = tx.rows.open_turns(loop.loop_id)
    turn = agent_turn(open_turns, who.id)
    if req.phase == "post":
        if internal and admits_internal(policy, tool):
            return _answer(ALLOW, block=False, binding=binding, tool=tool, turn=turn)
        return _observed(call, req, tool, turn)
    return _decided(call, req, policy, tool, (open_turns, turn), binding)


def _decided(
    call: Call[Txn],
    req: HookEvent,
    policy: LoopPolicy,
    tool: str,
    turns: tuple[list[TurnRow], TurnRow | None],
    binding: bool,
) -> HookAnswer:
    """A tool about to run: decided by the pure evaluator, sealed admitted or refused."""
    assert req.host_tool is not None
    tx, who, loop = call.tx, call.who, call.loop
    open_turns, turn = turns
    approved = tx.rows.approved_for_turn(loop.loop_id, turn.turn_id) if turn else {}
    facts = tool_call_facts(
        loop, open_turns, approved.values(), who.id, (req.host_tool, tool, req.command), tx.now,
        internal=is_internal(req.host, req.host_tool),
    )  # fmt: skip
    facts = dataclasses.replace(
        facts, dialect=req.shell, arguments=req.arguments, own_elsewhere=_own_elsewhere(req)
    )
    decision = evaluate_tool_call(policy, facts, digest=loop.policy_digest)
    if facts.internal and decision.allowed:  # the host's own bookkeeping: not recorded
        return _answer(decision, block=False, binding=binding, tool=tool, turn=turn)
    fields = {**_tool_fields(req, tool), "input_digest": req.input_digest}
    if decision.allowed:
        data: ToolAdmitted | ToolRefused = ToolAdmitted(**fields)
        kind = ReceiptKind.TOOL_ADMITTED
    else:
        data, kind = ToolRefused(**fields, enforced=binding), ReceiptKind.TOOL_REFUSED
    receipt_id = _seal(call, kind, data, turn, decision)
    block = binding and not decision.allowed
    return _answer(
        decision, block=block, binding=binding, tool=tool, turn=turn, receipt_id=receipt_id
    )


def _tool_fields(req: HookEvent, tool: str) -> dict[str, Any]:
    """What every tool receipt of a hook names: the host's session and call, and the tool."""
    return {
        "host": req.host,
        "session_id": req.session_id,
        "tool_use_id": req.tool_use_id,
        "host_tool": req.host_tool,
        "tool": tool,
        "agent_id": req.agent_id,
        "agent_type": req.agent_type,
    }


def _seal(
    call: Call[Txn],
    kind: ReceiptKind,
    data: ToolAdmitted | ToolRefused | ToolObserved,
    turn: TurnRow | None,
    decision: Decision | None = None,
) -> str:
    """Seal one tool receipt, on the agent's turn if it holds one; its receipt id."""
    sealed = call.tx.append(
        call.loop.loop_id,
        kind,
        call.who,
        data,
        decision=decision,
        turn_id=turn.turn_id if turn else None,
        todo_id=turn.todo_id if turn else None,
    )
    return sealed.receipt_id


def _attach(call: Call[Txn], req: HookEvent) -> None:
    """Seal `host.attached` for a session the loop has not seen from this agent."""
    seen = call.loop.hosts.get(call.who.id)
    if seen is not None and (seen.host, seen.session_id) == (req.host, req.session_id):
        return
    call.tx.append(
        call.loop.loop_id,
        ReceiptKind.HOST_ATTACHED,
        call.who,
        HostAttached(host=req.host, session_id=req.session_id),
    )


def _observed(call: Call[Txn], req: HookEvent, tool: str, turn: TurnRow | None) -> HookAnswer:
    assert req.host_tool is not None
    data = ToolObserved(
        **_tool_fields(req, tool),
        response_digest=req.response_digest,
        errored=req.errored,
        duration_ms=req.duration_ms,
        charged=turn is None,
    )
    receipt_id = _seal(call, ReceiptKind.TOOL_OBSERVED, data, turn)
    return _answer(ALLOW, block=False, binding=False, tool=tool, turn=turn, receipt_id=receipt_id)


def _stop(call: Call[Txn], req: HookEvent, policy: LoopPolicy) -> HookAnswer:
    """Block a host's stop once while the agent holds a turn with observed work unreported."""
    turn = agent_turn(call.tx.rows.open_turns(call.loop.loop_id), call.who.id)
    binding = policy.observe_mode == "enforce"
    if turn is None or not turn.observed or req.stop_active:
        return _answer(ALLOW, block=False, binding=binding, turn=turn)
    seen = ", ".join(f"{tool} ×{turn.observed_calls(tool)}" for tool in sorted(turn.observed))
    message = (
        f"you still hold turn {turn.turn_id} (todo {turn.todo_id}) and the host saw work in it "
        f"({seen}): call loopwarden's update tool with an honest report before you stop"
    )
    return _answer(ALLOW, block=True, binding=binding, message=message, turn=turn)
