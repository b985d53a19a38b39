"""What an agent's host saw through its hooks: a session attached, a tool call admitted or
refused before it ran, and the call observed after it ran (docs/hooks.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Literal, TypeVar

from pydantic import Field

from loopwarden import hostnames
from loopwarden.hosts.tool_names import is_internal, policy_tool
from loopwarden.kernel.state import facts as rules
from loopwarden.kernel.state.events import (
    Amount,
    Count,
    Digest,
    Fact,
    ReceiptBody,
    ReceiptKind,
    ToolName,
)
from loopwarden.kernel.state.fold import FoldError, open_turn
from loopwarden.kernel.state.legality import Judging, Verdict, VerdictRule, codes_of, verdicts
from loopwarden.kernel.state.rows import HostSeen, LoopView, Observed, Touched, TurnRow, replace
from loopwarden.kernel.state.spec import OBSERVERS, D, Fold, KindSpec, Rule
from loopwarden.policy.arguments import ARGUMENT_CODES, covering
from loopwarden.policy.budgets import Totals
from loopwarden.policy.decision import ReasonCode
from loopwarden.policy.evaluate import evaluate_tool_call
from loopwarden.policy.patterns import SHELL

if TYPE_CHECKING:
    Host = str
    HookHost = str
else:
    Host = Literal[hostnames.RECORDED]  # a hook host, or the MCP gateway (`hostnames.GATEWAY`)
    HookHost = Literal[hostnames.NAMES]  # one per host module (loopwarden/hosts)


HostSession = Annotated[str, Field(min_length=1, max_length=200)]


HostToolName = Annotated[str, Field(min_length=1, max_length=200)]


HostAgent = Annotated[str, Field(min_length=1, max_length=200)]
"""A subagent's id or type, as the host names it (Claude Code, Codex: `agent_id`, `agent_type`)."""


class HostAttached(Fact):
    """An agent's host session announced itself (its SessionStart, or its first hook event)."""

    host: Host
    session_id: HostSession


class ToolCall(Fact):
    """One tool call as the host's hook showed it (or the MCP gateway, `host` `mcp-gateway`),
    before it ran. The input itself is never recorded (it may hold secrets): only the digest of
    its RFC 8785 bytes."""

    host: Host
    session_id: HostSession
    tool_use_id: str | None = Field(default=None, max_length=200)
    host_tool: HostToolName
    tool: ToolName
    input_digest: Digest
    agent_id: HostAgent | None = None  # the subagent that made the call, if one did
    agent_type: HostAgent | None = None
    # The MCP gateway's: the digest of the downstream tool's pinned description (name,
    # description, input schema) the call was decided under. Absent from hook receipts.
    tool_digest: Digest | None = None


class ToolAdmitted(ToolCall):
    pass


class ToolRefused(ToolCall):
    """`enforced`: the host was told to block the call (`[observe] mode = "enforce"`); in
    `record` mode the refusal is recorded and the call let through."""

    enforced: bool


class ToolObserved(Fact):
    """A tool call the host ran (its post-tool hook): what came back, digested."""

    host: Host
    session_id: HostSession
    tool_use_id: str | None = Field(default=None, max_length=200)
    host_tool: HostToolName
    tool: ToolName
    response_digest: Digest
    errored: bool = False
    duration_ms: Amount | None = None
    # A call the host ran outside any turn of the agent (`record` mode lets it run) is charged
    # against max_tool_calls when it is observed; in a turn, the report charges it. Absent in
    # receipts before this field, which charged nothing outside turns.
    charged: bool | None = None
    agent_id: HostAgent | None = None
    agent_type: HostAgent | None = None
    # The MCP gateway's: the size in bytes of the result's RFC 8785 form (never the result).
    response_bytes: Count | None = None


COMMAND_CODES = frozenset(
    {
        ReasonCode.COMMAND_DENIED,
        ReasonCode.COMMAND_NOT_ALLOWED,
        ReasonCode.COMMAND_UNREADABLE,
        ReasonCode.COMMAND_OPAQUE,
    }
)
"""Reasons decided on a command line, which receipts do not carry (only the input's digest)."""

C = TypeVar("C", bound=ToolCall)


def _touches(body: ReceiptBody, data: object) -> Touched:
    return Touched(turns=frozenset([body.turn_id])) if body.turn_id is not None else Touched()


# --- the fold ----------------------------------------------------------------------------------


def _host_seen(
    view: LoopView, body: ReceiptBody, f: HostAttached | ToolCall | ToolObserved
) -> None:
    """Every hook receipt records the host session the agent's hooks speak from."""
    hosts = {**view.loop.hosts, body.principal.id: HostSeen(f.host, f.session_id, body.at)}
    view.loop = replace(view.loop, hosts=hosts)


def _hook_turn(view: LoopView, body: ReceiptBody) -> TurnRow | None:
    """The turn a hook receipt names: open, and the receipt's agent's."""
    if body.turn_id is None:
        return None
    turn: TurnRow = open_turn(view, body.turn_id)
    if turn.agent != body.principal.id:
        raise FoldError(f"turn {body.turn_id!r} is not {body.principal.id}'s")
    return turn


def _tool_seen(view: LoopView, body: ReceiptBody, f: ToolCall | ToolObserved) -> None:
    """A hook's pre-tool admission, refusal, or post-tool observation: counted on the turn, or
    for a call that ran outside any turn, charged to the loop when it is observed."""
    _host_seen(view, body, f)
    turn = _hook_turn(view, body)
    if turn is None:
        if isinstance(f, ToolObserved) and f.charged:
            view.loop = replace(view.loop, totals=view.loop.totals.plus(Totals(tool_calls=1)))
        return
    if isinstance(f, ToolRefused):
        view.turns[turn.turn_id] = replace(turn, refusals=turn.refusals + 1)
        return
    admitted, ran = turn.observed.get(f.tool, Observed(0, 0))
    seen = (
        Observed(admitted + 1, ran) if isinstance(f, ToolAdmitted) else Observed(admitted, ran + 1)
    )
    view.turns[turn.turn_id] = replace(turn, observed={**turn.observed, f.tool: seen})


# --- the judge ---------------------------------------------------------------------------------


def _observing(view: LoopView, body: ReceiptBody) -> list[Verdict]:
    """Every hook receipt: in a loop that observes; a tool receipt naming the agent's open turn
    (or none if it held none), an attachment naming none (a session is not a turn's)."""
    if view.policy.observe_mode == "off":
        return [Verdict(VerdictRule.OBSERVE_OFF, f"{body.kind} in a loop that observes no host")]
    if body.kind == ReceiptKind.HOST_ATTACHED:
        due = None
    else:
        open_turns = [view.turns[t] for t in view.loop.open_turns]
        turn = rules.agent_turn(open_turns, body.principal.id)
        due = turn.turn_id if turn is not None else None
    if body.turn_id != due:
        return [Verdict(VerdictRule.HOOK_TURN, "it does not name the agent's open turn")]
    return []


def _named(view: LoopView, data: ToolCall | ToolObserved) -> list[Verdict]:
    """The tool is named by the host's mapping (the policy's overrides first)."""
    overrides = view.policy.observe.names.get(data.host) if view.policy.observe else None
    if data.tool != policy_tool(data.host, data.host_tool, overrides):
        return [
            Verdict(VerdictRule.TOOL_NAME, f"{data.host_tool} is not {data.tool} on {data.host}")
        ]
    return []


def _rulings(view: LoopView, body: ReceiptBody, data: ToolCall) -> list[frozenset[str]]:
    """The reasons the rules give against the call now (command and argument rules aside: the
    line and the arguments are not kept, only their digest), the rule in force first. A host-internal tool has a second: the
    rule for any tool, which decided it before the class existed (receipts of release 0.1.0
    refused `ToolSearch` without a turn)."""
    open_turns = [view.turns[t] for t in view.loop.open_turns]
    internal = is_internal(data.host, data.host_tool)
    rulings = []
    for as_internal in (True, False) if internal else (False,):
        facts = rules.tool_call_facts(
            view.loop, open_turns, view.approvals.values(), body.principal.id,
            (data.host_tool, data.tool, None), body.at, internal=as_internal,
            once=data.host == hostnames.GATEWAY,
        )  # fmt: skip
        given = evaluate_tool_call(view.policy, facts, digest="").codes
        rulings.append(frozenset(given) - COMMAND_CODES - ARGUMENT_CODES)
    return rulings


def _judge_attached(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: HostAttached
) -> list[Verdict]:
    return _observing(view, body)


def _judge_observed(
    ctx: Judging, view: LoopView, body: ReceiptBody, data: ToolCall | ToolObserved
) -> list[Verdict]:
    found = _observing(view, body)
    if found and found[0].rule == "observe_off":
        return found
    found += _named(view, data)
    charged = data.charged if isinstance(data, ToolObserved) else None
    if charged is not None and charged != (body.turn_id is None):
        found.append(
            Verdict(VerdictRule.CHARGE, "a call observed outside a turn is charged, in one not")
        )
    return found


def _observed_first(
    own: Callable[[LoopView, ReceiptBody, C], list[Verdict]],
) -> Callable[[Judging, LoopView, ReceiptBody, C], list[Verdict]]:
    """A tool decision's judge rule: what every observed call is judged on (`_judge_observed`),
    then `own`'s verdicts, unless the loop does not observe (the first verdict says so)."""

    def judge(ctx: Judging, view: LoopView, body: ReceiptBody, data: C) -> list[Verdict]:
        found = _judge_observed(ctx, view, body, data)
        if found and found[0].rule == "observe_off":
            return found
        return found + own(view, body, data)

    return judge


@_observed_first
def _judge_admitted(view: LoopView, body: ReceiptBody, data: ToolAdmitted) -> list[Verdict]:
    found: list[Verdict] = []
    if body.decision.effect != "allow":
        found.append(Verdict(VerdictRule.EFFECT, "an admission records a deny"))
    rulings = _rulings(view, body, data)
    legal = frozenset() if frozenset() in rulings else rulings[0]
    return found + verdicts(tuple(sorted(legal)), "tool admitted")


@_observed_first
def _judge_refused(view: LoopView, body: ReceiptBody, data: ToolRefused) -> list[Verdict]:
    found: list[Verdict] = []
    mode = view.policy.observe_mode
    if body.decision.effect != "deny":
        found.append(Verdict(VerdictRule.EFFECT, "a tool refusal records an allow"))
    if data.enforced != (mode == "enforce"):
        found.append(Verdict(VerdictRule.ENFORCED, f"enforced={data.enforced} under mode {mode}"))
    recorded, rulings = codes_of(body), _rulings(view, body, data)
    commands = recorded & COMMAND_CODES
    rules_commands = data.tool == SHELL and view.policy.tools.commands is not None
    arguments = recorded & ARGUMENT_CODES
    rules_arguments = bool(covering(view.policy.tools.arguments, data.tool))
    unruled = (commands and not rules_commands) or (arguments and not rules_arguments)
    if (recorded - COMMAND_CODES - ARGUMENT_CODES) not in rulings or unruled:
        expected = sorted(rulings[0])
        found.append(
            Verdict(
                VerdictRule.TOOL_REFUSED,
                f"refused for {sorted(recorded)}; the rules give {expected}",
            )
        )
    return found


def _host_spec(
    kind: ReceiptKind,
    data: type[D],
    *,
    fold: Fold[D],
    judge: Rule[D],
    refusal: bool = False,
    after_close: bool = False,
) -> KindSpec[D]:
    """A kind a host's hooks seal (through an observer) about the turn they saw."""
    return KindSpec(
        kind,
        data,
        callers=OBSERVERS,
        touches=_touches,
        fold=fold,
        judge=judge,
        refusal=refusal,
        after_close=after_close,
        host=True,
    )


SPECS = (
    _host_spec(ReceiptKind.HOST_ATTACHED, HostAttached, fold=_host_seen, judge=_judge_attached),
    _host_spec(ReceiptKind.TOOL_ADMITTED, ToolAdmitted, fold=_tool_seen, judge=_judge_admitted),
    _host_spec(
        ReceiptKind.TOOL_REFUSED,
        ToolRefused,
        fold=_tool_seen,
        judge=_judge_refused,
        refusal=True,
    ),
    _host_spec(
        ReceiptKind.TOOL_OBSERVED,
        ToolObserved,
        fold=_tool_seen,
        judge=_judge_observed,
        after_close=True,
    ),
)
