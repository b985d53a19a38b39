"""The judge: was each recorded decision allowed? Asked of every receipt an audit replays.

The fold (`fold.py`) refuses what is impossible; the judge refuses what the policy did not
admit. Before a receipt is folded, it rebuilds the facts that decision was made on from the
replayed state (with `rules.py`, the builders the write path uses), asks the same pure
evaluator the server asks, and compares: a grant the evaluator denies, a refusal it would have
granted (or refused for other reasons), an accepted report it refuses, a stop no rule fired,
a rule that fired without its stop, an action by a role that may not take it, a key that
acted twice. Each is a `Verdict` naming the rule; the audit reports it as `decision_illegal`.

The policy is the one `loop.opened` carries, its digest re-computed, never a stored row.

Transactions leave a shape in the journal the judge relies on: a claim sweeps expired leases
and seals any due stop before it decides; an update decides, seals its report (a violation then
stops the loop), sweeps, and seals any due stop; a sweep's `lease.expired` comes before the
refusal decided on the unexpired turn.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import timedelta

from loopwarden.canonical import digest_of
from loopwarden.clock import format_time, parse_time
from loopwarden.ledger.state import rules
from loopwarden.ledger.state.events import (
    ApprovalDecided,
    ApprovalRequested,
    ClaimRefused,
    LeaseExpired,
    LeaseRenewed,
    LoopOpened,
    LoopStopped,
    ReceiptBody,
    ReceiptKind,
    RequestRefused,
    TodoAdded,
    ToolAdmitted,
    ToolObserved,
    ToolRefused,
    TurnClaimed,
    TurnRefused,
    TurnReported,
)
from loopwarden.ledger.state.fold import HOST_KINDS
from loopwarden.ledger.state.rows import LoopView, TurnRow
from loopwarden.policy import decision as codes
from loopwarden.policy.decision import Reason
from loopwarden.policy.evaluate import (
    ALL_TODOS_DONE,
    POLICY_VIOLATION,
    ClaimFacts,
    TodoAddFacts,
    evaluate_claim,
    evaluate_report,
    evaluate_stop,
    evaluate_todo_add,
    evaluate_tool_call,
    explain,
    tool_reasons,
    turn_reasons,
)
from loopwarden.policy.hosts import SHELL, policy_tool
from loopwarden.policy.model import LoopPolicy
from loopwarden.statuses import TodoStatus

MAX_APPROVAL = timedelta(days=30)
OPERATOR_ONLY = frozenset(
    {
        ReceiptKind.LOOP_OPENED,
        ReceiptKind.APPROVAL_DECIDED,
        ReceiptKind.LOOP_PAUSED,
        ReceiptKind.LOOP_RESUMED,
        ReceiptKind.LOOP_CANCELLED,
    }
)
SPECIAL = ({codes.NOT_TURN_OWNER}, {codes.AGENT_NOT_ALLOWED}, {codes.IDEMPOTENCY_CONFLICT})


@dataclass(frozen=True)
class Verdict:
    rule: str
    message: str


@dataclass
class _Loop:
    """What the judge keeps of one loop beside its replayed view."""

    claims: list[str] = field(default_factory=list)  # every claim time, sorted
    owed: tuple[str, str] | None = None  # ("violation" | "stop_rules", the update's time)
    swept: dict[str, TurnRow] = field(default_factory=dict)  # turns as they were before a sweep


class Judge:
    """Judges receipts in journal order: `step(view, body)` before the receipt is folded into
    `view`, `after(view, body)` once it is, `end(views)` when the journal ends."""

    def __init__(self, *, keys_known: bool = True) -> None:
        # keys_known: every receipt of the database is judged (not one bundle's loop), so a
        # refusal for a reused idempotency key must follow that key's first use.
        self.keys_known = keys_known
        self._loops: dict[str, _Loop] = {}
        self._keys: set[tuple[str, str]] = set()

    def step(self, view: LoopView | None, body: ReceiptBody) -> list[Verdict]:
        state = self._loops.setdefault(body.loop_id, _Loop())
        if view is None or isinstance(body.data, LoopOpened):
            return _opened(body) + self._key(body)
        violation_owed = state.owed is not None and state.owed[0] == "violation"
        verdicts = self._owed(state, view, body)
        if body.kind in OPERATOR_ONLY and body.principal.role != "operator":
            verdicts.append(Verdict("role", f"{body.kind} by a {body.principal.role}"))
        if isinstance(body.data, LoopStopped) and body.data.reason == POLICY_VIOLATION:
            if not violation_owed:
                verdicts.append(
                    Verdict("stop_reason", "stopped for a violation no refusal recorded")
                )
        else:
            verdicts += self._decision(state, view, body)
        verdicts += self._key(body)
        if isinstance(body.data, LeaseExpired):
            state.swept[body.data.turn_id] = view.turns[body.data.turn_id]
        return verdicts

    def after(self, view: LoopView, body: ReceiptBody) -> None:
        """Remember what later receipts are judged against (`view` now includes `body`)."""
        state = self._loops.setdefault(body.loop_id, _Loop())
        data = body.data
        if isinstance(data, TurnClaimed):
            bisect.insort(state.claims, body.at)
        if not isinstance(data, LeaseExpired):
            state.swept = {}
        reported = isinstance(data, TurnReported | TurnRefused) and data.turn_id in view.turns
        if reported and body.principal.id == view.turns[body.turn_id or ""].agent:
            violation = isinstance(data, TurnRefused) and bool(_codes(body) & codes.VIOLATIONS)
            stops = view.policy.stop.on_violation == "stop_loop" and not view.loop.status.closed
            state.owed = ("violation" if violation and stops else "stop_rules", body.at)

    def end(self, views: dict[str, LoopView]) -> dict[str, list[Verdict]]:
        """Stops still owed when the journal ends, by loop."""
        out = {}
        for loop_id, state in self._loops.items():
            view = views.get(loop_id)
            missing = _missing_stop(state.owed, view) if view is not None else None
            if missing is not None:
                out[loop_id] = [missing]
        return out

    # --- stops owed by an update ------------------------------------------------------------

    def _owed(self, state: _Loop, view: LoopView, body: ReceiptBody) -> list[Verdict]:
        if state.owed is None:
            return []
        if (
            isinstance(body.data, LeaseExpired)
            and body.at == state.owed[1]
            and state.owed[0] == "stop_rules"
        ):
            return []  # the update's own sweep comes before its stop rules
        owed, state.owed = state.owed, None
        reason = body.data.reason if isinstance(body.data, LoopStopped) else None
        stop = reason is not None and body.kind != ReceiptKind.LOOP_CANCELLED
        if stop and (owed[0] != "violation" or reason == POLICY_VIOLATION):
            return []  # the stop owed (a rule's stop is judged by `_stopped`)
        missing = _missing_stop(owed, view)
        return [missing] if missing is not None else []

    # --- the decision each receipt records --------------------------------------------------

    def _decision(self, state: _Loop, view: LoopView, body: ReceiptBody) -> list[Verdict]:
        data = body.data
        if isinstance(data, TurnClaimed):
            return _claimed(state, view, body, data)
        if isinstance(data, TurnReported):
            return _reported(view, body, data)
        if isinstance(data, ClaimRefused | TurnRefused | RequestRefused):
            charged = _charged(view, body, data) if isinstance(data, TurnRefused) else []
            return self._refused(state, view, body, data) + charged
        if isinstance(data, LeaseExpired):
            return _expired(view, body, data)
        if isinstance(data, LeaseRenewed):
            return _renewed(view, body, data)
        if isinstance(data, LoopStopped) and body.kind != ReceiptKind.LOOP_CANCELLED:
            return _stopped(view, body, data)
        if isinstance(data, ApprovalRequested):
            return _approval_requested(view, body, data)
        if isinstance(data, ApprovalDecided):
            return _approval_decided(body, data)
        if isinstance(data, TodoAdded):
            return _verdicts(
                evaluate_todo_add(view.policy, _todo_facts(view, body), digest="").codes,
                "todo added",
            )
        if body.kind in HOST_KINDS:
            return _hook(view, body)
        return []

    def _refused(
        self,
        state: _Loop,
        view: LoopView,
        body: ReceiptBody,
        data: ClaimRefused | TurnRefused | RequestRefused,
    ) -> list[Verdict]:
        if body.decision.effect != "deny":
            return [Verdict("effect", f"{body.kind} records an allow")]
        turn = self._turn(state, view, body)
        special = self._special(view, body, turn)
        if special is not None:
            return special
        if isinstance(data, TurnRefused):
            if turn is None:
                return [Verdict("unknown_turn", "a refused report names no turn of the loop")]
            expected = _report(view, body, data, turn)
            charged = (
                []
                if data.charged
                else [Verdict("charged", "the owner's refused report was not charged")]
            )
            return _same(body, expected, "report") + charged
        if isinstance(data, ClaimRefused):
            return _same(
                body,
                evaluate_claim(view.policy, _claim_facts(state, view, body), digest="").codes,
                "claim",
            )
        if data.operation == "todo_add":
            return _same(
                body,
                evaluate_todo_add(view.policy, _todo_facts(view, body), digest="").codes,
                "todo_add",
            )
        if turn is None or data.operation == "decide_approval":
            return (
                [Verdict("unknown_turn", f"a refused {data.operation} names no turn")]
                if turn is None
                else []
            )
        return _same_on_turn(view, body, data, turn)

    def _turn(self, state: _Loop, view: LoopView, body: ReceiptBody) -> TurnRow | None:
        """The turn a refusal is about, as it was when the refusal was decided: a refusal for an
        expired lease was decided before the sweep that released it (and comes right after it)."""
        turn_id = body.turn_id or ""
        if codes.LEASE_EXPIRED in _codes(body) and turn_id in state.swept:
            return state.swept[turn_id]
        return view.turns.get(turn_id)

    def _special(
        self, view: LoopView, body: ReceiptBody, turn: TurnRow | None
    ) -> list[Verdict] | None:
        """Refusals decided before the policy is read: an outsider, another agent's turn, a
        reused key. None if the refusal is none of these."""
        found = _codes(body)
        owner = turn is None or body.principal.id == turn.agent
        charged = isinstance(body.data, TurnRefused) and body.data.charged
        if not owner and found not in SPECIAL and not _outsider(found):
            return [Verdict("not_turn_owner", "another agent's turn was refused for other reasons")]
        if _outsider(found) and body.principal.role != "operator":
            admitted = view.policy.admits_agent(body.principal.id)
            return (
                [Verdict("outsider", "an admitted agent was refused as an outsider")]
                if admitted
                else []
            )
        if found == {codes.IDEMPOTENCY_CONFLICT}:
            used = (body.principal.id, body.idempotency_key or "") in self._keys
            return (
                [Verdict("idempotency", "refused for a key never used")]
                if self.keys_known and not used
                else []
            )
        if found == {codes.NOT_TURN_OWNER} or not owner:
            if owner:
                return [Verdict("not_turn_owner", "the turn's owner was refused as another agent")]
            return (
                [Verdict("charged", "another agent's refused report was charged")]
                if charged
                else []
            )
        return None

    def _key(self, body: ReceiptBody) -> list[Verdict]:
        """A key names one call: a later receipt under it can only be a conflict's refusal
        (a retry returns the stored result and seals nothing). An outsider's refusals are not
        remembered, so they may repeat."""
        if body.idempotency_key is None or _outsider(_codes(body)):
            return []
        key = (body.principal.id, body.idempotency_key)
        if key in self._keys and _codes(body) != {codes.IDEMPOTENCY_CONFLICT}:
            return [Verdict("idempotency", f"key {body.idempotency_key!r} acted twice")]
        self._keys.add(key)
        return []


# --- facts -----------------------------------------------------------------------------------


def _codes(body: ReceiptBody) -> set[str]:
    return {r.code for r in body.decision.reasons}


def _outsider(found: set[str]) -> bool:
    """An outsider's refusal: not admitted, perhaps with the count of those left unsealed."""
    return found - {codes.REFUSALS_SUPPRESSED} == {codes.AGENT_NOT_ALLOWED}


def _window(state: _Loop, policy: LoopPolicy, at: str) -> int:
    if policy.rate.window_seconds is None:
        return 0
    since = format_time(parse_time(at) - timedelta(seconds=policy.rate.window_seconds))
    return len(state.claims) - bisect.bisect_right(state.claims, since)


def _claim_facts(state: _Loop, view: LoopView, body: ReceiptBody) -> ClaimFacts:
    open_turns = [view.turns[t] for t in view.loop.open_turns]
    window = _window(state, view.policy, body.at)
    return rules.claim_facts(
        view.loop,
        open_turns,
        window,
        body.principal.id,
        parse_time(body.at),
        body.at,
        view.policy.claims.lease_seconds,
    )


def _todo_facts(view: LoopView, body: ReceiptBody) -> TodoAddFacts:
    is_operator = body.principal.role == "operator"
    return TodoAddFacts(body.principal.id, is_operator, view.loop.status, view.loop.todo_total)


def _report(
    view: LoopView, body: ReceiptBody, data: TurnReported | TurnRefused, turn: TurnRow
) -> tuple[str, ...]:
    facts = rules.report_facts(
        body.principal.id, view.loop, turn, view.todos.get(turn.todo_id), view.approvals,
        data, parse_time(body.at), body.at,
    )  # fmt: skip
    decision = evaluate_report(view.policy, facts, digest="")
    return () if decision.allowed else decision.codes  # an allow's reasons are warnings


def _charged(view: LoopView, body: ReceiptBody, data: TurnReported | TurnRefused) -> list[Verdict]:
    """A report that records its tool-call charge must charge what the rules say (receipts of
    0.1.0 record none and charged usage.tool_calls, which the fold repeats)."""
    turn = view.turns.get(data.turn_id)
    if data.tool_calls_charged is None or turn is None or body.principal.id != turn.agent:
        return []
    expected = rules.tool_calls_charged(data, data.usage.tool_calls, turn)
    if data.tool_calls_charged == expected:
        return []
    return [
        Verdict(
            "charge", f"charged {data.tool_calls_charged} tool calls where the rules say {expected}"
        )
    ]


COMMAND_CODES = frozenset(
    {codes.COMMAND_DENIED, codes.COMMAND_NOT_ALLOWED, codes.COMMAND_UNREADABLE}
)
"""Reasons decided on a command line, which receipts do not carry (only the input's digest)."""


def _hook(view: LoopView, body: ReceiptBody) -> list[Verdict]:
    """A host hook's receipt: sealed by the agent's observer, in a loop that observes, naming
    the agent's open turn (or none if it held none), the tool by the host's mapping, and for a
    pre-tool decision, the decision the rules give (command rules aside: the line is not kept)."""
    data = body.data
    verdicts = []
    if body.principal.role != "observer":
        verdicts.append(Verdict("role", f"{body.kind} by a {body.principal.role}"))
    mode = view.policy.observe_mode
    if mode == "off":
        return [*verdicts, Verdict("observe_off", f"{body.kind} in a loop that observes no host")]
    open_turns = [view.turns[t] for t in view.loop.open_turns]
    turn = rules.agent_turn(open_turns, body.principal.id)
    if body.turn_id != (turn.turn_id if turn is not None else None):
        verdicts.append(Verdict("hook_turn", "it does not name the agent's open turn"))
    if not isinstance(data, ToolAdmitted | ToolRefused | ToolObserved):
        return verdicts  # host.attached
    overrides = view.policy.observe.names.get(data.host) if view.policy.observe else None
    if data.tool != policy_tool(data.host, data.host_tool, overrides):
        verdicts.append(Verdict("tool_name", f"{data.host_tool} is not {data.tool} on {data.host}"))
    if isinstance(data, ToolObserved):
        return verdicts
    facts = rules.tool_call_facts(
        view.loop, open_turns, view.approvals.values(), body.principal.id,
        (data.host_tool, data.tool, None), body.at,
    )  # fmt: skip
    expected = set(evaluate_tool_call(view.policy, facts, digest="").codes) - COMMAND_CODES
    if isinstance(data, ToolAdmitted):
        if body.decision.effect != "allow":
            verdicts.append(Verdict("effect", "an admission records a deny"))
        return verdicts + _verdicts(tuple(sorted(expected)), "tool admitted")
    if body.decision.effect != "deny":
        verdicts.append(Verdict("effect", "a tool refusal records an allow"))
    if isinstance(data, ToolRefused) and data.enforced != (mode == "enforce"):
        verdicts.append(Verdict("enforced", f"enforced={data.enforced} under mode {mode}"))
    recorded = _codes(body)
    commands = recorded & COMMAND_CODES
    rules_commands = data.tool == SHELL and view.policy.tools.commands is not None
    if (recorded - COMMAND_CODES) != expected or (commands and not rules_commands):
        verdicts.append(
            Verdict(
                "tool_refused", f"refused for {sorted(recorded)}; the rules give {sorted(expected)}"
            )
        )
    return verdicts


def _turn_reasons(
    view: LoopView, turn: TurnRow, body: ReceiptBody, fence: int | None = None
) -> list[Reason]:
    """Why the caller could not act on `turn` at the receipt's time, with the fence it sent
    (the turn's own, when the receipt does not record one)."""
    return turn_reasons(
        agent=body.principal.id, loop_status=view.loop.status, turn_agent=turn.agent,
        turn_status=turn.status, turn_fence=turn.fence, todo_fence=view.todos[turn.todo_id].fence,
        given_fence=turn.fence if fence is None else fence,
        lease_expires_at=parse_time(turn.lease_expires_at), now=parse_time(body.at),
    )  # fmt: skip


TOOL_CODES = frozenset({codes.APPROVAL_NOT_NEEDED, codes.TOOL_DENIED, codes.TOOL_NOT_ALLOWED})


def _same_on_turn(
    view: LoopView, body: ReceiptBody, data: RequestRefused, turn: TurnRow
) -> list[Verdict]:
    """A refused heartbeat or approval request. With the fence and tool recorded, exactly the
    reasons the write path gives; without (older receipts), the reasons that do not depend
    on them, and for the rest only that they are of the kind those would give."""
    expected = [r.code for r in _turn_reasons(view, turn, body, data.fence)]
    if data.operation == "request_approval" and not expected:
        if data.tool is not None:
            verdict = explain(view.policy, data.tool)
            tool = [r.code for r in tool_reasons(view.policy, [data.tool], frozenset())]
            expected = tool or ([codes.APPROVAL_NOT_NEEDED] if verdict.rule == "allow" else [])
        elif _codes(body) and _codes(body) <= TOOL_CODES:
            return []  # refused for a tool no receipt of the time recorded
    if data.fence is None and codes.STALE_FENCE in _codes(body):
        expected = sorted({*expected, codes.STALE_FENCE})  # the fence sent was not recorded
    return _same(body, tuple(expected), data.operation)


def _verdicts(found: tuple[str, ...], what: str) -> list[Verdict]:
    return [Verdict(code, f"{what} against {code}") for code in found]


def _same(body: ReceiptBody, expected: tuple[str, ...], what: str) -> list[Verdict]:
    """A refusal must be the one the policy gives, for the same reasons."""
    if not expected:
        return [Verdict(f"{what}_refused", f"the policy admitted this {what}, but it was refused")]
    if set(expected) != _codes(body):
        found, due = ", ".join(sorted(_codes(body))), ", ".join(sorted(expected))
        return [Verdict(f"{what}_reasons", f"refused for {found}; the policy says {due}")]
    return []


# --- per kind --------------------------------------------------------------------------------


def _opened(body: ReceiptBody) -> list[Verdict]:
    if not isinstance(body.data, LoopOpened):
        return [Verdict("chain", f"{body.kind} before its loop was opened")]
    verdicts = []
    if body.principal.role != "operator":
        verdicts.append(Verdict("role", f"loop.opened by a {body.principal.role}"))
    if digest_of(body.data.policy) != body.policy_digest:
        verdicts.append(
            Verdict("policy_digest", "the policy it carries does not hash to its digest")
        )
    policy = LoopPolicy.model_validate(body.data.policy)
    if len(body.data.todos) > policy.todos.max_todos:
        verdicts.append(Verdict("todo_limit", f"{len(body.data.todos)} todos over todos.max_todos"))
    return verdicts


def _claimed(state: _Loop, view: LoopView, body: ReceiptBody, data: TurnClaimed) -> list[Verdict]:
    policy, at = view.policy, body.at
    if body.decision.effect != "allow":
        return [Verdict("effect", "a grant records a deny")]
    if any(view.turns[t].lease_expires_at < at for t in view.loop.open_turns):
        return [Verdict("lease_not_swept", "granted while an expired lease was still held")]
    due = evaluate_stop(policy, rules.stop_facts(view.loop, parse_time(at)))
    if due is not None:
        return [Verdict("stop_due", f"granted although {due.code} had fired")]
    denied = evaluate_claim(policy, _claim_facts(state, view, body), digest="").codes
    if denied:
        return _verdicts(denied, "granted")
    todo = view.todos[data.todo_id]
    if todo.status != TodoStatus.OPEN:
        return [Verdict("todo_not_eligible", f"todo {todo.todo_id} claimed while {todo.status}")]
    undone = [d for d in todo.depends_on if view.todos[d].status != TodoStatus.DONE]
    if undone:
        return [
            Verdict("todo_not_eligible", f"todo {todo.todo_id} claimed before {', '.join(undone)}")
        ]
    lease = format_time(parse_time(at) + timedelta(seconds=policy.claims.lease_seconds))
    terms = (data.lease_expires_at, data.allowed_tools, data.approval_tools)
    if terms != (lease, policy.tools.allow, policy.tools.approval):
        return [Verdict("grant_terms", "the lease or the tools granted are not the policy's")]
    return []


def _reported(view: LoopView, body: ReceiptBody, data: TurnReported) -> list[Verdict]:
    if body.decision.effect != "allow":
        return [Verdict("effect", "an accepted report records a deny")]
    found = _report(view, body, data, view.turns[data.turn_id])
    return _verdicts(found, "accepted") + _charged(view, body, data)


def _expired(view: LoopView, body: ReceiptBody, data: LeaseExpired) -> list[Verdict]:
    turn = view.turns[data.turn_id]
    if turn.lease_expires_at >= body.at or data.lease_expires_at != turn.lease_expires_at:
        return [Verdict("lease_live", f"turn {turn.turn_id} was expired while its lease held")]
    return []


def _renewed(view: LoopView, body: ReceiptBody, data: LeaseRenewed) -> list[Verdict]:
    reasons = _turn_reasons(view, view.turns[data.turn_id], body)
    if reasons:
        return _verdicts(tuple(r.code for r in reasons), "lease renewed")
    lease = format_time(parse_time(body.at) + timedelta(seconds=view.policy.claims.lease_seconds))
    return (
        []
        if data.lease_expires_at == lease
        else [Verdict("grant_terms", "the renewed lease is not the policy's")]
    )


def _stopped(view: LoopView, body: ReceiptBody, data: LoopStopped) -> list[Verdict]:
    """A stop or completion that is not a violation's (`Judge.step` checks those) is a stop
    rule's, which must fire now."""
    due = evaluate_stop(view.policy, rules.stop_facts(view.loop, parse_time(body.at)))
    if due is None or due.code != data.reason:
        return [Verdict("stop_reason", f"stopped for {data.reason}, which had not fired")]
    if (body.kind == ReceiptKind.LOOP_COMPLETED) != (data.reason == ALL_TODOS_DONE):
        return [Verdict("stop_reason", f"{body.kind} for {data.reason}")]
    return []


def _approval_requested(
    view: LoopView, body: ReceiptBody, data: ApprovalRequested
) -> list[Verdict]:
    reasons = [r.code for r in _turn_reasons(view, view.turns[data.turn_id], body)]
    verdict = explain(view.policy, data.tool)
    if verdict.rule != "approval":
        tool = [r.code for r in tool_reasons(view.policy, [data.tool], frozenset())]
        reasons += tool or [codes.APPROVAL_NOT_NEEDED]
    return _verdicts(tuple(reasons), "approval requested")


def _approval_decided(body: ReceiptBody, data: ApprovalDecided) -> list[Verdict]:
    if data.expires_at is None:
        return []
    at, expires = parse_time(body.at), parse_time(data.expires_at)
    if not at < expires <= at + MAX_APPROVAL:
        return [Verdict("approval_expiry", "approved for less than a second or more than 30 days")]
    return []


def _missing_stop(owed: tuple[str, str] | None, view: LoopView) -> Verdict | None:
    """The stop an update owed and the journal lacks, judged on the state right before the
    receipt that should have been it (or at the end of the journal)."""
    if owed is None or view.loop.status.closed:
        return None
    if owed[0] == "violation":
        return Verdict(
            "stop_missing", "a policy violation was refused without the stop it requires"
        )
    due = evaluate_stop(view.policy, rules.stop_facts(view.loop, parse_time(owed[1])))
    if due is None:
        return None
    return Verdict("stop_missing", f"{due.code} fired after the report and no stop was sealed")
