"""The pure evaluator: facts in, `Decision` out. No I/O, no clock, no exceptions.

Every function collects *all* reasons that deny (so a refusal explains itself fully) and fails
closed: an unexpected error while evaluating is a deny whose reason names the error.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, ParamSpec

from loopwarden.policy.arguments import argument_reasons
from loopwarden.policy.budgets import Totals, exhausted
from loopwarden.policy.decision import Decision, Reason, ReasonCode, budget_code
from loopwarden.policy.model import CommandRules, LoopPolicy
from loopwarden.policy.patterns import SHELL, first_match
from loopwarden.statuses import CLOSED_LOOP_STATUSES, LoopStatus, TurnStatus

if TYPE_CHECKING:
    from loopwarden.policy.commands.runs import Dialect
    from loopwarden.policy.commands.verdicts import Judged, RuleSet

P = ParamSpec("P")


def _fail_closed(fn: Callable[P, Decision]) -> Callable[P, Decision]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Decision:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # an evaluation error is a deny, never a crash or an allow
            # Only the error's type reaches the (signed) reason: its text could carry anything.
            reason = Reason(
                ReasonCode.EVALUATION_ERROR, f"policy evaluation failed ({type(exc).__name__})"
            )
            digest = kwargs.get("digest", "")
            return Decision("deny", (reason,), digest if isinstance(digest, str) else "")

    return wrapper


# --- tools -----------------------------------------------------------------------------------

Rule = Literal["deny", "approval", "allow", "default"]


@dataclass(frozen=True)
class ToolVerdict:
    """How a policy treats one tool, and which pattern decided (None for the default deny)."""

    tool: str
    rule: Rule
    pattern: str | None

    @property
    def effect(self) -> Literal["allow", "deny", "approval"]:
        if self.rule == "allow":
            return "allow"
        if self.rule == "approval":
            return "approval"
        return "deny"

    def explain(self) -> str:
        if self.rule == "default":
            return f"{self.tool}: denied (no allow pattern matches; default deny)"
        verb = {"deny": "denied", "approval": "needs approval", "allow": "allowed"}[self.rule]
        return f"{self.tool}: {verb} by tools.{self.rule} pattern {self.pattern!r}"


def explain(policy: LoopPolicy, tool: str) -> ToolVerdict:
    """Classify `tool`: deny beats approval beats allow beats the default deny."""
    tools = policy.tools
    return _explain(tools.deny, tools.approval, tools.allow, tool)


@functools.lru_cache(maxsize=4096)
def _explain(
    deny: tuple[str, ...], approval: tuple[str, ...], allow: tuple[str, ...], tool: str
) -> ToolVerdict:
    # Memoized (a pure function of its arguments; the verdict is immutable): every report and
    # every audited one classifies its tools against the same few patterns.
    rules: tuple[tuple[Rule, tuple[str, ...]], ...] = (
        ("deny", deny),
        ("approval", approval),
        ("allow", allow),
    )
    for rule, patterns in rules:
        pattern = first_match(patterns, tool)
        if pattern is not None:
            return ToolVerdict(tool, rule, pattern)
    return ToolVerdict(tool, "default", None)


def tool_reasons(
    policy: LoopPolicy, tools: Iterable[str], approved: frozenset[str]
) -> list[Reason]:
    """Reasons the use of `tools` is not admitted; `approved` are tools covered by approvals."""
    reasons = []
    for tool in tools:
        verdict = explain(policy, tool)
        if verdict.rule == "deny":
            reasons.append(Reason(ReasonCode.TOOL_DENIED, verdict.explain()))
        elif verdict.rule == "default":
            reasons.append(Reason(ReasonCode.TOOL_NOT_ALLOWED, verdict.explain()))
        elif verdict.rule == "approval" and tool not in approved:
            reasons.append(
                Reason(
                    ReasonCode.APPROVAL_REQUIRED,
                    f"{verdict.explain()}; it needs an approval asked for in this turn "
                    "(request_approval) and approved by an operator before it is used",
                )
            )
    return reasons


@_fail_closed
def evaluate_tools(
    policy: LoopPolicy, tools: Iterable[str], approved: frozenset[str] = frozenset(), *, digest: str
) -> Decision:
    return Decision.of(tool_reasons(policy, tools, approved), digest)


# --- claims ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimFacts:
    """What the store knows at the moment of a claim (leases already expired)."""

    agent: str
    status: LoopStatus
    now: datetime
    totals: Totals
    active: int
    active_for_agent: int
    claims_in_window: int
    host_attached: bool = False  # the agent's host spoke within the lease window (enforce mode)


def claim_reasons(policy: LoopPolicy, facts: ClaimFacts) -> list[Reason]:
    reasons = []
    if facts.status != LoopStatus.ACTIVE:
        reasons.append(Reason(ReasonCode.LOOP_NOT_ACTIVE, f"the loop is {facts.status}"))
    deadline = policy.stop.deadline
    if deadline is not None and facts.now >= deadline:
        reasons.append(
            Reason(ReasonCode.DEADLINE_PASSED, f"the loop's deadline {deadline} has passed")
        )
    if not policy.admits_agent(facts.agent):
        reasons.append(
            Reason(
                ReasonCode.AGENT_NOT_ALLOWED, f"agent {facts.agent!r} is not in the policy's agents"
            )
        )
    for dimension in exhausted(policy.budgets, facts.totals):
        reasons.append(
            Reason(
                budget_code(dimension),
                f"the {dimension} budget is used up ({facts.totals.used(dimension)} of "
                f"{policy.budgets.limit(dimension)})",
            )
        )
    rate = policy.rate
    if rate.turns_per_window is not None and facts.claims_in_window >= rate.turns_per_window:
        reasons.append(
            Reason(
                ReasonCode.RATE_LIMITED,
                f"{facts.claims_in_window} turns in the last {rate.window_seconds}s "
                f"(limit {rate.turns_per_window})",
            )
        )
    if facts.active >= policy.claims.max_active:
        reasons.append(
            Reason(
                ReasonCode.LEASE_LIMIT,
                f"{facts.active} active leases (max {policy.claims.max_active})",
            )
        )
    if facts.active_for_agent >= policy.claims.max_active_per_agent:
        reasons.append(
            Reason(
                ReasonCode.AGENT_LEASE_LIMIT,
                f"agent {facts.agent!r} holds {facts.active_for_agent} active leases "
                f"(max {policy.claims.max_active_per_agent})",
            )
        )
    if policy.observe_mode == "enforce" and not facts.host_attached:
        reasons.append(
            Reason(
                ReasonCode.HOST_NOT_ATTACHED,
                "this loop requires host hooks ([observe] mode = enforce) and none of "
                f"{facts.agent!r}'s hooks has spoken in the last {policy.claims.lease_seconds} s; "
                "start the agent in a host with `loopwarden hook install` done",
            )
        )
    return reasons


@_fail_closed
def evaluate_claim(policy: LoopPolicy, facts: ClaimFacts, *, digest: str) -> Decision:
    """May `facts.agent` open a turn now? Todo eligibility is decided separately (not policy)."""
    return Decision.of(claim_reasons(policy, facts), digest)


# --- reports (update) ------------------------------------------------------------------------


@dataclass(frozen=True)
class TurnFacts:
    """Who acts on a turn, with which fence, against the turn and its todo as stored, at `now`:
    what every act on a turn (report, heartbeat, approval request) is decided on first."""

    agent: str
    loop_status: LoopStatus
    turn_agent: str
    turn_status: TurnStatus
    turn_fence: int
    todo_fence: int
    given_fence: int
    lease_expires_at: datetime
    now: datetime


@dataclass(frozen=True)
class ReportFacts(TurnFacts):
    """A turn report against the turn and todo as stored."""

    outcome: str
    has_evidence: bool
    tools: tuple[str, ...]
    approved_tools: frozenset[str]
    approval_problems: tuple[Reason, ...] = ()
    reported: tuple[tuple[str, int], ...] = ()  # tools_used: (name, count)
    observed: tuple[tuple[str, int], ...] = ()  # what the host's hooks saw in the turn
    # The model usage the report gives and what the model gateway observed in the turn, per
    # budget dimension, in its integer unit (micro-dollars for cost_usd)
    model_reported: tuple[tuple[str, int], ...] = ()
    model_observed: tuple[tuple[str, int], ...] = ()


def turn_reasons(facts: TurnFacts) -> list[Reason]:
    """Why `facts.agent` may not act on a turn now (report, heartbeat, approval request).

    Ownership is checked first and alone: a caller acting on someone else's turn learns nothing
    more about it. Then liveness: the loop closed, the turn closed, a stale fence (the given
    one, or the todo re-claimed since), the lease run out.
    """
    if facts.agent != facts.turn_agent:
        return [Reason(ReasonCode.NOT_TURN_OWNER, "this turn belongs to another agent")]
    reasons = []
    if facts.loop_status in CLOSED_LOOP_STATUSES:
        reasons.append(Reason(ReasonCode.LOOP_NOT_ACTIVE, f"the loop is {facts.loop_status}"))
    if facts.turn_status != TurnStatus.OPEN:
        reasons.append(Reason(ReasonCode.TURN_CLOSED, f"the turn is already {facts.turn_status}"))
    if facts.given_fence != facts.turn_fence or facts.turn_fence != facts.todo_fence:
        reasons.append(
            Reason(
                ReasonCode.STALE_FENCE,
                f"fence {facts.given_fence} is not current (the todo's fence is "
                f"{facts.todo_fence})",
            )
        )
    if facts.turn_status == TurnStatus.OPEN and facts.now > facts.lease_expires_at:
        reasons.append(Reason(ReasonCode.LEASE_EXPIRED, "the turn's lease has expired"))
    return reasons


@_fail_closed
def evaluate_report(policy: LoopPolicy, facts: ReportFacts, *, digest: str) -> Decision:
    """Is this turn report admissible?

    The turn's owner and liveness first (`turn_reasons`), then tool use and approvals
    (violations), then evidence rules.
    """
    reasons = turn_reasons(facts)
    if any(r.code == ReasonCode.NOT_TURN_OWNER for r in reasons):
        return Decision.of(reasons, digest)
    reasons.extend(facts.approval_problems)
    reasons.extend(tool_reasons(policy, facts.tools, facts.approved_tools))
    if (
        facts.outcome == "completed"
        and policy.stop.require_evidence_for_completion
        and not facts.has_evidence
    ):
        reasons.append(
            Reason(
                ReasonCode.EVIDENCE_REQUIRED, "completing a todo needs at least one evidence item"
            )
        )
    violations, warnings = observation_reasons(policy, facts.reported, facts.observed)
    late, noted = model_usage_reasons(policy, facts.model_reported, facts.model_observed)
    violations, warnings = violations + late, warnings + noted
    reasons.extend(violations)
    if reasons:
        return Decision("deny", tuple(reasons), digest)
    return Decision("allow", tuple(warnings), digest)


def observation_reasons(
    policy: LoopPolicy,
    reported: tuple[tuple[str, int], ...],
    observed: tuple[tuple[str, int], ...],
) -> tuple[list[Reason], list[Reason]]:
    """A report against what the host's hooks saw in the turn: (violations, warnings).

    A tool the host ran more often than the report says is `unreported_tool_use` (a violation)
    in `enforce` mode and `tool_unreported` (a warning) in `record` mode; a reported tool the
    host never saw is `tool_unobserved` (a warning). Mode `off` compares nothing."""
    mode = policy.observe_mode
    if mode == "off":
        return [], []
    said = dict(reported)
    violations, warnings = [], []
    for tool, calls in observed:
        if said.get(tool, 0) < calls:
            message = (
                f"the host ran {tool} {calls}× this turn; the report says {said.get(tool, 0)}. "
                f"Report it in tools_used as {{name: {tool!r}, count: {calls}}}"
            )
            if mode == "enforce":
                violations.append(Reason(ReasonCode.UNREPORTED_TOOL_USE, message))
            else:
                warnings.append(Reason(ReasonCode.TOOL_UNREPORTED, message))
    seen = {tool for tool, calls in observed if calls}
    for tool, count in reported:
        if tool not in seen:
            warnings.append(
                Reason(
                    ReasonCode.TOOL_UNOBSERVED,
                    f"the report names {tool} ×{count}, which the host's hooks never saw run",
                )
            )
    return violations, warnings


def model_usage_reasons(
    policy: LoopPolicy,
    reported: tuple[tuple[str, int], ...],
    observed: tuple[tuple[str, int], ...],
) -> tuple[list[Reason], list[Reason]]:
    """A report's model usage against what the model gateway observed in the turn:
    (violations, warnings). A dimension the report gives (non-zero) below what was observed is
    `unreported_model_use` (a violation) in `enforce` mode and `model_usage_unreported` (a
    warning) in `record` mode; a dimension left out (zero) claims nothing and is not compared:
    a model cannot know its own token counts, and the gateway's figures are charged anyway.
    Mode `off` compares nothing."""
    mode = policy.observe_mode
    if mode == "off" or not observed:
        return [], []
    said = dict(reported)
    violations, warnings = [], []
    for name, seen in observed:
        given = said.get(name, 0)
        if not given or given >= seen:
            continue
        shown = (given / 1_000_000, seen / 1_000_000) if name == "cost_usd" else (given, seen)
        message = (
            f"the report gives {name} {shown[0]} where loopwarden's model gateway observed "
            f"{shown[1]} in this turn: leave it out, or report at least what was observed"
        )
        if mode == "enforce":
            violations.append(Reason(ReasonCode.UNREPORTED_MODEL_USE, message))
        else:
            warnings.append(Reason(ReasonCode.MODEL_USAGE_UNREPORTED, message))
    return violations, warnings


# --- tool calls, before they run (host hooks) ------------------------------------------------


@dataclass(frozen=True)
class ToolCallFacts:
    """One tool call a host's hook asks about, against the agent's state in the loop."""

    agent: str
    loop_id: str
    loop_status: LoopStatus
    turn_id: str | None  # the agent's open turn in the loop, if any
    tool: str  # the policy name the host tool maps to
    host_tool: str
    command: str | None  # the command line, for shell.run
    approved: frozenset[str]  # tools covered by the turn's approved, unexpired approvals
    tool_calls: int  # tool calls charged in the loop plus those observed in its open turns
    lease_expired: bool = False  # the turn's lease has run out (not yet swept by a claim)
    internal: bool = False  # a host-internal tool (`policy/hosts.is_internal`)
    dialect: str = "bash"  # the shell language of `command`: "bash" or "powershell"
    # The call's arguments, for argument rules (`[[tools.arguments]]`): decided on, never
    # stored. None: not seen (a rule covering the tool then doubts, and denies).
    arguments: Mapping[str, Any] | None = None
    # The MCP server name a call of one of loopwarden's own tools came under, when the hooks
    # do not let loopwarden's tools through under that name (decided on, never stored).
    own_elsewhere: str | None = None


def admits_internal(policy: LoopPolicy, tool: str) -> bool:
    """Whether the class of host-internal tools admits `tool` (its policy name) as it is: at
    any time, with or without a turn, unrecorded and uncharged, unless a `[tools] deny` or
    `approval` pattern names it (then it is decided like any tool, deny winning)."""
    return explain(policy, tool).rule in ("allow", "default")


def tool_call_reasons(policy: LoopPolicy, facts: ToolCallFacts) -> list[Reason]:
    """Why a tool call may not run now, each worded for the model: what to do instead.

    A host-internal tool acts on nothing outside the host (its todo list, plan mode, loading
    deferred tools): admitted as it is (`admits_internal`), refused by a deny pattern whatever
    the loop's state or the agent's turn."""
    if facts.internal:
        verdict = explain(policy, facts.tool)
        if verdict.rule == "deny":
            return [Reason(ReasonCode.TOOL_DENIED, verdict.explain())]
        if admits_internal(policy, facts.tool):
            return []
    gate = _gate(facts)
    return [gate] if gate is not None else _call_reasons(policy, facts)


def _gate(facts: ToolCallFacts) -> Reason | None:
    """Why no tool may run now whatever it is: the loop not active, no turn, a lease run out."""
    if facts.loop_status != LoopStatus.ACTIVE:
        return Reason(
            ReasonCode.LOOP_NOT_ACTIVE,
            f"loop {facts.loop_id} is {facts.loop_status}: no tool may run for it now",
        )
    if facts.turn_id is None and facts.own_elsewhere is not None:
        return Reason(
            ReasonCode.NO_OPEN_TURN,
            f"{facts.host_tool} is loopwarden's own tool under the MCP server name "
            f"{facts.own_elsewhere!r}, which these hooks were not installed for, so they "
            "decide it as any other tool: no call can start a turn. Stop and tell the user: "
            f"the hooks must be installed again with --server-name {facts.own_elsewhere} "
            "(`loopwarden hook install … --server-name "
            f"{facts.own_elsewhere}`; `loopwarden hook doctor` shows it)",
        )
    if facts.turn_id is None:
        return Reason(
            ReasonCode.NO_OPEN_TURN,
            f"claim a turn first: call loopwarden's claim tool for loop {facts.loop_id}, "
            f"then retry {facts.host_tool}",
        )
    if facts.lease_expired:
        return Reason(
            ReasonCode.LEASE_EXPIRED,
            f"your lease on turn {facts.turn_id} has run out: no tool may run on it; call "
            f"loopwarden's claim tool for loop {facts.loop_id} to start a new turn",
        )
    return None


def _call_reasons(policy: LoopPolicy, facts: ToolCallFacts) -> list[Reason]:
    """Why this tool, with these arguments, may not run in the agent's open turn."""
    reasons = []
    for reason in tool_reasons(policy, [facts.tool], facts.approved):
        if reason.code == ReasonCode.APPROVAL_REQUIRED:
            reason = Reason(
                ReasonCode.APPROVAL_REQUIRED,
                f"{facts.tool} needs an operator's approval for this turn: call loopwarden's "
                f"request_approval tool (turn_id {facts.turn_id}, tool {facts.tool!r}), wait "
                "until it is approved, then retry",
            )
        reasons.append(reason)
    if facts.tool == SHELL and policy.tools.commands is not None:
        reasons.extend(command_reasons(policy.tools.commands, facts.command, facts.dialect))
    if policy.tools.arguments is not None:
        reasons.extend(argument_reasons(policy.tools.arguments, facts.tool, facts.arguments))
    limit = policy.budgets.limit("tool_calls")
    if limit is not None and facts.tool_calls >= limit:
        reasons.append(
            Reason(
                budget_code("tool_calls"),
                f"the tool_calls budget is used up ({facts.tool_calls} of {limit}, counting the "
                "calls the host saw in open turns): report your turn with update",
            )
        )
    return reasons


def command_reasons(rules: CommandRules, line: str | None, dialect: str = "bash") -> list[Reason]:
    """Why a shell command line may not run under `[tools.commands]` (`commands/verdicts.py`):
    every command it runs judged, each refusal worded for the model, never quoting the line."""
    if line is None:
        return [Reason(ReasonCode.COMMAND_UNREADABLE, "the shell call carries no command line")]
    judge, reasons = _judging()
    ruleset = rule_set(rules)
    return reasons(
        judge(ruleset, line, "powershell" if dialect == "powershell" else "bash"), ruleset
    )


@functools.cache
def _judging() -> tuple[
    Callable[[RuleSet, str, Dialect], Judged], Callable[[Judged, RuleSet], list[Reason]]
]:
    """The command rules' judge, imported on first use (an import statement in the hot path
    costs a microsecond on every call)."""
    from loopwarden.policy.commands.verdicts import judge, reasons

    return judge, reasons


def rule_set(rules: CommandRules) -> RuleSet:
    """The rules of `[tools.commands]`, read once per policy (kept by their texts: hashing
    three tuples of strings is cheaper per call than hashing the model)."""
    return _rule_set(rules.deny, rules.allow, rules.opaque or ())


@functools.lru_cache(maxsize=256)
def _rule_set(deny: tuple[str, ...], allow: tuple[str, ...], opaque: tuple[str, ...]) -> RuleSet:
    from loopwarden.policy.commands.verdicts import RuleSet

    return RuleSet.of(deny, allow, opaque)


@_fail_closed
def evaluate_tool_call(policy: LoopPolicy, facts: ToolCallFacts, *, digest: str) -> Decision:
    """May this tool call run now? The question a host's pre-tool hook asks, and the MCP
    gateway before it forwards a call (`mcp_gateway/`): one function for both paths."""
    return Decision.of(tool_call_reasons(policy, facts), digest)


# --- todos -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TodoAddFacts:
    agent: str
    is_operator: bool
    loop_status: LoopStatus
    todo_count: int
    adding: int = 1


@_fail_closed
def evaluate_todo_add(policy: LoopPolicy, facts: TodoAddFacts, *, digest: str) -> Decision:
    reasons = []
    if facts.loop_status in CLOSED_LOOP_STATUSES:
        reasons.append(Reason(ReasonCode.LOOP_NOT_ACTIVE, f"the loop is {facts.loop_status}"))
    if not facts.is_operator:
        if not policy.admits_agent(facts.agent):
            reasons.append(
                Reason(
                    ReasonCode.AGENT_NOT_ALLOWED,
                    f"agent {facts.agent!r} is not in the policy's agents",
                )
            )
        if not policy.todos.agents_may_add:
            reasons.append(
                Reason(ReasonCode.TODOS_NOT_ADDABLE, "the policy does not let agents add todos")
            )
    if facts.todo_count + facts.adding > policy.todos.max_todos:
        reasons.append(
            Reason(
                ReasonCode.TODO_LIMIT,
                f"the loop has {facts.todo_count} todos (max {policy.todos.max_todos})",
            )
        )
    return Decision.of(reasons, digest)


# --- stop rules ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StopFacts:
    status: LoopStatus
    totals: Totals
    open_turns: int
    todos_total: int
    todos_done: int  # done, or cancelled by an operator: no longer owed
    failure_streak: int
    now: datetime


def evaluate_stop(policy: LoopPolicy, facts: StopFacts) -> Reason | None:
    """The stop rule that fires now, if any, in precedence order.

    Completion first (all todos done), then a budget dimension used up, then `max_turns` once
    no turn is open, then the deadline, then the same failure `repeated_failure_limit` times in
    a row. Rules apply to active and paused loops; a closed loop never stops twice. Fails
    closed: if the rules cannot be evaluated, the loop stops with `evaluation_error`.
    """
    try:
        return _stop_reason(policy, facts)
    except Exception as exc:
        return Reason(
            ReasonCode.EVALUATION_ERROR, f"stop rules could not be evaluated ({type(exc).__name__})"
        )


def _stop_reason(policy: LoopPolicy, facts: StopFacts) -> Reason | None:
    if facts.status in CLOSED_LOOP_STATUSES:
        return None
    if facts.todos_total and facts.todos_done == facts.todos_total:
        return Reason(ReasonCode.ALL_TODOS_DONE, f"all {facts.todos_total} todos are done")
    for dimension in exhausted(policy.budgets, facts.totals):
        if dimension != "turns":
            return Reason(
                budget_code(dimension),
                f"the {dimension} budget is used up ({facts.totals.used(dimension)} of "
                f"{policy.budgets.limit(dimension)})",
            )
    max_turns = policy.budgets.limit("turns")
    if max_turns is not None and facts.totals.turns >= max_turns and facts.open_turns == 0:
        return Reason(ReasonCode.MAX_TURNS, f"all {max_turns} turns of the budget are used")
    deadline = policy.stop.deadline
    if deadline is not None and facts.now >= deadline:
        return Reason(ReasonCode.DEADLINE, f"the deadline {deadline} has passed")
    if facts.failure_streak >= policy.stop.repeated_failure_limit:
        return Reason(
            ReasonCode.REPEATED_FAILURE,
            f"the same failure was reported {facts.failure_streak} times in a row",
        )
    return None
