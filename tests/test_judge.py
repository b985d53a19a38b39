"""The judging audit: every recorded decision re-asked of the policy and the replayed state.

- property: a journal that only the operations wrote draws no objection, and flipping any one
  decision the policy decided (a grant into a refusal, a refusal into a grant, an accepted report
  into a refused one and back, a renewal, a todo added, an approval asked — or dropping a stop a
  rule fired) in a forger's journal, re-chained as a key holder would re-sign it, draws one;
- table: the verdicts the judge gives for each rule, on journals edited by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import BUILDER, OPERATOR, REVIEWER
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support import EVIDENCE, make_policy, scale
from test_projection_fold import FUZZ_POLICY, OPERATIONS, WEIGHTED, World

from loopwarden.canonical import canonical_bytes
from loopwarden.clock import ManualClock, parse_time
from loopwarden.errors import LoopwardenError
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.log.seals import open_envelope
from loopwarden.kernel.runner.request_kinds import RequestRefused
from loopwarden.kernel.state.events import ReceiptBody, ReceiptKind, TurnRefused
from loopwarden.kernel.state.fold import FoldError
from loopwarden.kernel.state.judge import Judge
from loopwarden.kernel.store.store import Store
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.turns.claim import ClaimRequest, claim
from loopwarden.turns.turn_kinds import ClaimRefused, LeaseRenewed, TurnClaimed, TurnReported
from loopwarden.turns.update import UpdateRequest, update


def _chained(bodies: list[ReceiptBody]) -> list[tuple[ReceiptBody, str]]:
    """Each body with `prev` naming the one before it as given, and its digest: how a forger
    holding the key would re-sign an edited journal."""
    out, previous = [], None
    for body in bodies:
        body = body.model_copy(update={"prev": previous})
        previous = "sha256:" + hashlib.sha256(canonical_bytes(body.as_json())).hexdigest()
        out.append((body, previous))
    return out


def objections(bodies: list[ReceiptBody]) -> list[str]:
    """Replay `bodies` of one loop as an audit does, re-chained: the judge's verdicts (a
    receipt whose facts cannot even be rebuilt is one, as in `audit.judged`) and the fold's
    refusal, if any."""
    judge, view, out = Judge(KINDS, keys_known=False), None, []
    for body, digest in _chained(bodies):
        try:
            out += [f"{body.kind} #{body.seq}: {v.rule}" for v in judge.step(view, body)]
        except (LookupError, ValueError) as exc:
            out.append(f"{body.kind} #{body.seq}: unjudgeable ({type(exc).__name__})")
        try:
            view = KINDS.apply(view, body, digest)
        except FoldError as exc:
            return [*out, f"fold: {exc}"]
        judge.after(view, body)
    assert view is not None
    return out + [v.rule for v in judge.end({view.loop.loop_id: view}).get(view.loop.loop_id, [])]


def _recast(body: ReceiptBody, kind: ReceiptKind, data: Any, effect: str, code: str) -> ReceiptBody:
    fields = body.model_dump(by_alias=False, exclude={"kind", "data", "decision"})
    fields.pop("schema_", None)
    reasons = [{"code": code, "message": "forged"}] if effect == "deny" else []
    return KINDS.make_body(
        kind, **fields, data=data, decision={"effect": effect, "reasons": reasons}
    )


def flipped(bodies: list[ReceiptBody], i: int) -> list[ReceiptBody] | None:
    """The journal with receipt `i`'s decision turned into its opposite, or None if it records
    no decision the policy made."""
    body, data = bodies[i], bodies[i].data
    forged: ReceiptBody | None = None
    if isinstance(data, TurnClaimed):
        forged = _recast(body, ReceiptKind.CLAIM_REFUSED, ClaimRefused(), "deny", "lease_limit")
    elif isinstance(data, ClaimRefused) and _next_todo(bodies[:i]) is not None:
        todo_id, fence = _next_todo(bodies[:i])  # type: ignore[misc]
        grant = TurnClaimed(
            turn_id="turn-" + "f" * 20, todo_id=todo_id, fence=fence, lease_expires_at=body.at,
            allowed_tools=(), approval_tools=(),
        )  # fmt: skip
        forged = _recast(body, ReceiptKind.TURN_CLAIMED, grant, "allow", "")
        forged = forged.model_copy(update={"turn_id": grant.turn_id, "todo_id": todo_id})
    elif isinstance(data, TurnReported):
        refusal = TurnRefused(**dict(data), charged=True, closes_turn=False)
        forged = _recast(body, ReceiptKind.TURN_REFUSED, refusal, "deny", "evidence_required")
    elif isinstance(data, TurnRefused):
        report = {k: v for k, v in dict(data).items() if k not in ("charged", "closes_turn")}
        forged = _recast(body, ReceiptKind.TURN_REPORTED, TurnReported(**report), "allow", "")
    elif isinstance(data, LeaseRenewed):
        refusal = RequestRefused(operation="heartbeat")
        forged = _recast(body, ReceiptKind.REQUEST_REFUSED, refusal, "deny", "lease_expired")
    elif body.kind in (ReceiptKind.TODO_ADDED, ReceiptKind.APPROVAL_REQUESTED):
        operation = "todo_add" if body.kind == ReceiptKind.TODO_ADDED else "request_approval"
        refusal = RequestRefused(operation=operation)
        forged = _recast(body, ReceiptKind.REQUEST_REFUSED, refusal, "deny", "turn_closed")
    elif body.kind in (ReceiptKind.LOOP_STOPPED, ReceiptKind.LOOP_COMPLETED):
        return bodies[:i] + [b.model_copy(update={"seq": b.seq - 1}) for b in bodies[i + 1 :]]
    if forged is None:
        return None
    return [*bodies[:i], forged, *bodies[i + 1 :]]


def _next_todo(bodies: list[ReceiptBody]) -> tuple[str, int] | None:
    """An open todo of the loop as these receipts leave it, and its next fence."""
    view = None
    for body, digest in _chained(bodies):
        view = KINDS.apply(view, body, digest)
    assert view is not None
    for todo in view.todos.values():
        if todo.status == "open":
            return todo.todo_id, todo.fence + 1
    return None


async def _journal(data: st.DataObject) -> list[ReceiptBody]:
    """A loop worked by random operations (the fold test's driver); its receipts."""
    with tempfile.TemporaryDirectory() as tmp:
        home, clock = Path(tmp), ManualClock()
        keys = KeyStore(home)
        store = await Store.open(
            home / "loopwarden.db", keys.load_signer(), clock=clock, kinds=KINDS
        )
        try:
            todos = [
                TodoInput(id="a", title="a"),
                TodoInput(id="b", title="b"),
                TodoInput(id="c", title="c", depends_on=("a",)),
            ]
            request = OpenLoopRequest(
                objective="judge me", policy=FUZZ_POLICY, todos=todos, loop_id="L"
            )
            await open_loop(store, OPERATOR, request)
            world = World(store, clock)
            for _ in range(data.draw(st.integers(3, 25), label="steps")):
                # A refused call raises and leaves nothing behind (the fold test proves it).
                with contextlib.suppress(LoopwardenError):
                    await OPERATIONS[data.draw(st.sampled_from(WEIGHTED), label="operation")](
                        world, data
                    )
            rows = await store.read(lambda r: r.loop_journal("L"))
        finally:
            await store.close()
    return [KINDS.parse_body(open_envelope(r.envelope, None).body) for r in rows]


PROPERTY = settings(
    max_examples=scale(25),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


@PROPERTY
@given(data=st.data())
def test_flipping_any_one_decision_of_a_real_journal_draws_an_objection(data):
    bodies = anyio.run(_journal, data)
    assert objections(bodies) == [], "a journal only the operations wrote is legal"
    candidates = [i for i in range(1, len(bodies)) if flipped(bodies, i) is not None]
    assume(candidates)
    i = data.draw(st.sampled_from(candidates), label="flipped receipt")
    forged = flipped(bodies, i)
    assert forged is not None
    assert objections(forged), f"flipping #{bodies[i].seq} ({bodies[i].kind}) went unnoticed"


# --- the rules, one by one -------------------------------------------------------------------


async def _scripted(store: Store, clock: ManualClock, policy: dict[str, Any]) -> list[ReceiptBody]:
    await open_loop(
        store,
        OPERATOR,
        OpenLoopRequest(
            objective="o",
            policy=policy,
            todos=[{"title": "a"}, {"title": "b"}, {"title": "c"}],
            loop_id="L",
        ),
    )
    first = await claim(store, BUILDER, ClaimRequest(loop_id="L"))
    await update(
        store,
        BUILDER,
        UpdateRequest(
            turn_id=first.turn_id,
            fence=first.fence,
            outcome="completed",
            summary="s",
            evidence=EVIDENCE,
            idempotency_key="u1",
        ),
    )
    clock.advance(5)
    second = await claim(store, REVIEWER, ClaimRequest(loop_id="L"))
    await update(
        store,
        REVIEWER,
        UpdateRequest(
            turn_id=second.turn_id,
            fence=second.fence,
            outcome="progress",
            summary="s",
            idempotency_key="u2",
        ),
    )
    rows = await store.read(lambda r: r.loop_journal("L"))
    return [KINDS.parse_body(open_envelope(r.envelope, None).body) for r in rows]


@pytest.fixture
async def scripted(store, clock) -> list[ReceiptBody]:
    return await _scripted(store, clock, make_policy(budgets={"max_turns": 2}))


def _edit(body: ReceiptBody, **changes: Any) -> ReceiptBody:
    return body.model_copy(update=changes)


def _rules(bodies: list[ReceiptBody]) -> set[str]:
    """The rules the objections name ("kind #seq: rule", or a bare rule at the journal's end)."""
    return {o.rsplit(": ", 1)[-1].split(" (")[0] for o in objections(bodies)}


def _principal(body: ReceiptBody, **changes: str) -> ReceiptBody:
    return body.model_copy(update={"principal": body.principal.model_copy(update=changes)})


def _report_with(body: ReceiptBody, **changes: Any) -> ReceiptBody:
    assert isinstance(body.data, TurnReported)
    data = TurnReported.model_validate({**body.data.model_dump(), **changes})
    return body.model_copy(update={"data": data})


def _grant_with(body: ReceiptBody, **changes: Any) -> ReceiptBody:
    assert isinstance(body.data, TurnClaimed)
    return body.model_copy(update={"data": body.data.model_copy(update=changes)})


# The scripted journal: 0 loop.opened · 1 builder's claim · 2 its completed report ·
# 3 reviewer's claim · 4 its progress report · 5 loop.stopped (max_turns = 2 used up).
EDITS = {
    "the stop a rule owed, dropped": (lambda j: j[:5], "stop_missing"),
    "a third grant instead of the stop": (
        lambda j: [
            *j[:5],
            _grant_with(j[3], turn_id="turn-" + "e" * 20).model_copy(
                update={"seq": 6, "turn_id": "turn-" + "e" * 20}
            ),
        ],
        "stop_due",
    ),
    "a report on another agent's turn, accepted": (
        lambda j: [*j[:2], _principal(j[2], id="reviewer"), *j[3:]],
        "not_turn_owner",
    ),
    "an operator's act by an agent": (lambda j: [_principal(j[0], role="agent"), *j[1:]], "role"),
    "a denied tool in an accepted report": (
        lambda j: [
            *j[:2],
            _report_with(j[2], tools_used=[{"name": "git.push", "count": 1}]),
            *j[3:],
        ],
        "tool_denied",
    ),
    "a tool the policy does not allow, accepted": (
        lambda j: [
            *j[:2],
            _report_with(j[2], tools_used=[{"name": "shell.exec", "count": 1}]),
            *j[3:],
        ],
        "tool_not_allowed",
    ),
    "an approval-gated tool with no approval, accepted": (
        lambda j: [
            *j[:2],
            _report_with(j[2], tools_used=[{"name": "deploy.prod", "count": 1}]),
            *j[3:],
        ],
        "approval_required",
    ),
    "completed without the evidence the policy requires": (
        lambda j: [*j[:2], _report_with(j[2], evidence=[]), *j[3:]],
        "evidence_required",
    ),
    "a report that says its turn was charged before when it was not": (
        lambda j: [*j[:2], _report_with(j[2], tool_calls_before=5), *j[3:]],
        "charge",
    ),
    "a report charging less than it lists": (
        lambda j: [
            *j[:2],
            _report_with(j[2], tools_used=[{"name": "fs.read", "count": 2}], tool_calls_charged=1),
            *j[3:],
        ],
        "charge",
    ),
    "a report with a stale fence, accepted": (
        lambda j: [*j[:4], _report_with(j[4], fence=7), j[5]],
        "stale_fence",
    ),
    "a longer lease than the policy grants": (
        lambda j: [
            *j[:3],
            _grant_with(j[3], lease_expires_at=parse_time("2099-01-01T00:00:00.000000Z")),
            *j[4:],
        ],
        "grant_terms",
    ),
    "a stop for a rule that did not fire": (
        lambda j: [
            *j[:5],
            j[5].model_copy(update={"data": j[5].data.model_copy(update={"reason": "deadline"})}),
        ],
        "stop_reason",
    ),
}


@pytest.mark.anyio
@pytest.mark.backends
@pytest.mark.parametrize(("edit", "rule"), EDITS.values(), ids=list(EDITS))
async def test_each_rule_is_named_when_a_journal_breaks_it(store, clock, edit, rule):
    journal = await _scripted(store, clock, make_policy(budgets={"max_turns": 2}))
    assert [b.kind for b in journal] == [
        "loop.opened", "turn.claimed", "turn.reported", "turn.claimed", "turn.reported", "loop.stopped",
    ]  # fmt: skip
    assert objections(journal) == [], "the journal as the operations wrote it is legal"
    assert rule in _rules(edit(journal)), objections(edit(journal))
