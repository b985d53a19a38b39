"""The governance operations, one test per rule of issue 2's tools section.

Each test drives the plain async operations (`open_loop`, `claim`, `update`, ...) against a real
store and checks both the result and what was (or was not) sealed in the journal.
"""

from __future__ import annotations

import base64
import itertools
from collections import Counter
from typing import Any

import pytest
from conftest import BASIC_POLICY, BUILDER, OPERATOR, REVIEWER, STRANGER
from support import codes, control_loop, make_policy

from loopwarden.approvals.approval_ops import (
    ApprovalRequest,
    DecideApprovalRequest,
    decide_approval,
    request_approval,
)
from loopwarden.audit.database import audit
from loopwarden.canonical import canonical_bytes
from loopwarden.clock import parse_time
from loopwarden.errors import Conflict, Forbidden, InvalidInput, NotFound, PolicyError
from loopwarden.journal.receipt import ReceiptRequest, receipt
from loopwarden.kernel.log import merkle
from loopwarden.kernel.log.checkpoints import open_checkpoint
from loopwarden.kernel.log.seals import open_envelope
from loopwarden.kernel.runner.outsiders import WINDOW as OUTSIDER_WINDOW
from loopwarden.kernel.state.events import Evidence, ToolUse, Usage
from loopwarden.kernel.state.rows import LoopView
from loopwarden.kernel.store.store import Store
from loopwarden.loops.lifecycle import (
    LoopControlRequest,
    OpenLoopRequest,
    TodoInput,
    open_loop,
)
from loopwarden.principals import Principal
from loopwarden.projection.projection import ProjectionRequest, projection
from loopwarden.todos.todo_ops import TodoAddRequest, todo_add
from loopwarden.turns.claim import ClaimRequest, ClaimResult, claim
from loopwarden.turns.leases import HeartbeatRequest, heartbeat
from loopwarden.turns.quota import QuotaRequest, quota
from loopwarden.turns.update import UpdateRequest, UpdateResult, update

pytestmark = [pytest.mark.anyio, pytest.mark.backends]

CAROL = Principal(id="carol", role="agent")
EVIDENCE = [Evidence(kind="test", summary="the tests pass")]
ARTIFACT = "sha256:" + "ab" * 32
OTHER_ARTIFACT = "sha256:" + "cd" * 32
_keys = itertools.count(1)


# --- helpers ---------------------------------------------------------------------------------


async def open_test_loop(
    store: Store,
    policy: dict[str, Any] | None = None,
    todos: list[str] | list[TodoInput] = ("a", "b", "c"),  # type: ignore[assignment]
    loop_id: str = "L1",
) -> str:
    items = [TodoInput(id=t, title=f"todo {t}") if isinstance(t, str) else t for t in todos]
    result = await open_loop(
        store,
        OPERATOR,
        OpenLoopRequest(
            objective="ship it", policy=policy or BASIC_POLICY, todos=items, loop_id=loop_id
        ),
    )
    return result.loop_id


async def claim_as(
    store: Store, who: Principal, loop_id: str = "L1", todo_id: str | None = None
) -> ClaimResult:
    return await claim(store, who, ClaimRequest(loop_id=loop_id, todo_id=todo_id))


async def report(
    store: Store,
    who: Principal,
    granted: ClaimResult,
    outcome: str = "completed",
    *,
    tools: dict[str, int] | None = None,
    usage: Usage | None = None,
    evidence: list[Evidence] | None = None,
    approvals: list[str] = (),  # type: ignore[assignment]
    failure_signature: str | None = None,
    key: str | None = None,
    fence: int | None = None,
) -> UpdateResult:
    if evidence is None:
        evidence = EVIDENCE if outcome == "completed" else []
    assert granted.turn_id is not None and granted.fence is not None
    return await update(
        store,
        who,
        UpdateRequest(
            turn_id=granted.turn_id,
            fence=granted.fence if fence is None else fence,
            outcome=outcome,  # type: ignore[arg-type]
            tools_used=[ToolUse(name=n, count=c) for n, c in (tools or {}).items()],
            usage=usage or Usage(),
            evidence=evidence,
            summary=f"{outcome} by {who.id}",
            failure_signature=failure_signature,
            approval_ids=list(approvals),
            idempotency_key=key or f"k{next(_keys)}",
        ),
    )


async def journal_count(store: Store) -> int:
    """Receipts sealed: in the tree, and pending integration (PostgreSQL's integrator)."""
    return await store.read(lambda r: r.sealed_count())


async def loop_kinds(store: Store, loop_id: str = "L1") -> list[str]:
    rows = await store.read(lambda r: r.loop_journal(loop_id))
    return [row.kind for row in rows]


async def view(store: Store, loop_id: str = "L1") -> LoopView:
    result = await store.read(lambda r: r.full_view(loop_id))
    assert result is not None
    return result


async def body_of(store: Store, receipt_id: str) -> dict[str, Any]:
    got = await receipt(store, OPERATOR, ReceiptRequest(receipt_id=receipt_id))
    return got.body


def granted(result: ClaimResult) -> ClaimResult:
    assert result.granted, result.reasons
    return result


# --- open_loop -------------------------------------------------------------------------------


async def test_open_loop_seals_loop_opened_with_todos_open(store):
    result = await open_loop(
        store,
        OPERATOR,
        OpenLoopRequest(
            objective="ship it",
            policy=BASIC_POLICY,
            todos=[TodoInput(title="first"), TodoInput(title="second", depends_on=("t1",))],
        ),
    )
    assert result.status == "active" and result.todos == 2
    body = await body_of(store, result.receipt_id)
    assert (body["kind"], body["seq"], body["policy_digest"]) == (
        "loop.opened",
        1,
        result.policy_digest,
    )
    state = await view(store, result.loop_id)
    assert {t.todo_id: (t.status, t.depends_on) for t in state.todos.values()} == {
        "t1": ("open", ()),
        "t2": ("open", ("t1",)),
    }


async def test_open_loop_is_operator_only(store):
    with pytest.raises(Forbidden):
        await open_loop(
            store,
            BUILDER,
            OpenLoopRequest(objective="x", policy=BASIC_POLICY, todos=[TodoInput(title="a")]),
        )
    assert await journal_count(store) == 0


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param(make_policy(budgets={"max_turns": 0}), id="max_turns_zero"),
        pytest.param({**BASIC_POLICY, "surprise": True}, id="unknown_key"),
        pytest.param({"agents": ["builder"], "tools": {"allow": ["fs.read"]}}, id="no_budget"),
        pytest.param(make_policy(tools={"allow": ["git.push"]}), id="allow_and_deny_same"),
    ],
)
async def test_open_loop_rejects_invalid_policy_and_writes_nothing(store, policy):
    with pytest.raises(PolicyError):
        await open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(objective="x", policy=policy, todos=[TodoInput(title="a")]),
        )
    assert await journal_count(store) == 0


@pytest.mark.parametrize(
    "todos",
    [
        pytest.param(
            [TodoInput(id="a", title="a"), TodoInput(id="a", title="again")], id="duplicate_ids"
        ),
        pytest.param([TodoInput(id="a", title="a", depends_on=("zz",))], id="unknown_dependency"),
        pytest.param([TodoInput(id="a", title="a", depends_on=("a",))], id="self_dependency"),
        pytest.param(
            [
                TodoInput(id="a", title="a", depends_on=("c",)),
                TodoInput(id="b", title="b", depends_on=("a",)),
                TodoInput(id="c", title="c", depends_on=("b",)),
            ],
            id="cycle",
        ),
    ],
)
async def test_open_loop_rejects_bad_todo_graph_and_writes_nothing(store, todos):
    with pytest.raises(InvalidInput):
        await open_loop(
            store, OPERATOR, OpenLoopRequest(objective="x", policy=BASIC_POLICY, todos=todos)
        )
    assert await journal_count(store) == 0


async def test_open_loop_rejects_more_todos_than_policy_allows(store):
    policy = make_policy(todos={"max_todos": 2})
    with pytest.raises(PolicyError):
        await open_test_loop(store, policy, ["a", "b", "c"])
    assert await journal_count(store) == 0


async def test_open_loop_with_existing_id_is_conflict(store):
    await open_test_loop(store)
    with pytest.raises(Conflict):
        await open_test_loop(store)
    assert await journal_count(store) == 1


# --- claim -----------------------------------------------------------------------------------


async def test_claim_picks_todos_in_order_respecting_dependencies(store):
    await open_test_loop(
        store,
        todos=[
            TodoInput(id="a", title="a", order=5),
            TodoInput(id="b", title="b", order=1, depends_on=("a",)),
            TodoInput(id="c", title="c", order=3),
        ],
    )
    # b comes first by order but waits for a; c is next by order.
    first = granted(await claim_as(store, BUILDER))
    second = granted(await claim_as(store, REVIEWER))
    assert (first.todo_id, second.todo_id) == ("c", "a")
    await report(store, BUILDER, first)
    assert (await claim_as(store, BUILDER)).reasons[0].code == "no_eligible_todo"
    await report(store, REVIEWER, second)
    third = granted(await claim_as(store, BUILDER))
    assert third.todo_id == "b"


async def test_claim_grants_lease_fence_and_effective_tools(store, clock):
    await open_test_loop(store)
    result = granted(await claim_as(store, BUILDER))
    assert result.fence == 1
    assert result.lease_expires_at == parse_time("2026-01-01T00:15:00.000000Z")
    assert result.allowed_tools == sorted(BASIC_POLICY["tools"]["allow"])
    assert result.approval_tools == ["deploy.*"]
    assert result.budgets["turns"].used == 1 and result.budgets["turns"].remaining == 19
    body = await body_of(store, result.receipt_id)  # type: ignore[arg-type]
    assert body["kind"] == "turn.claimed" and body["data"]["fence"] == 1


async def test_claim_specific_todo_not_eligible_is_plain_result_without_receipt(store):
    await open_test_loop(
        store,
        todos=[TodoInput(id="a", title="a"), TodoInput(id="b", title="b", depends_on=("a",))],
    )
    before = await journal_count(store)
    result = await claim_as(store, BUILDER, todo_id="b")
    assert not result.granted and codes(result) == {"todo_not_eligible"}
    assert result.receipt_id is None
    assert await journal_count(store) == before
    with pytest.raises(NotFound):
        await claim_as(store, BUILDER, todo_id="nope")


async def _refused_claim(store, who, code, loop_id="L1"):
    before = Counter(await loop_kinds(store, loop_id))
    result = await claim_as(store, who, loop_id)
    assert not result.granted
    assert code in codes(result), result.reasons
    after = Counter(await loop_kinds(store, loop_id))
    assert after["claim.refused"] == before["claim.refused"] + 1
    body = await body_of(store, result.receipt_id)  # type: ignore[arg-type]
    assert body["kind"] == "claim.refused"
    assert body["decision"]["effect"] == "deny"
    assert code in {r["code"] for r in body["decision"]["reasons"]}
    return result


async def test_claim_on_paused_loop_is_refused_and_sealed(store):
    await open_test_loop(store)
    await control_loop(store, OPERATOR, "pause", LoopControlRequest(loop_id="L1"))
    result = await _refused_claim(store, BUILDER, "loop_not_active")
    assert result.status == "paused"


async def _outsider_claim(store, who, loop_id="L1"):
    """An outsider's claim: answered exactly like a claim on a loop that does not exist, and
    sealed as a refusal that operators see."""
    before = Counter(await loop_kinds(store, loop_id))
    with pytest.raises(NotFound) as missing:
        await claim_as(store, who, "no-such-loop")
    with pytest.raises(NotFound) as hidden:
        await claim_as(store, who, loop_id)
    assert hidden.value.message == missing.value.message.replace("no-such-loop", loop_id)
    after = Counter(await loop_kinds(store, loop_id))
    assert after["claim.refused"] == before["claim.refused"] + 1
    rows = await store.read(lambda r: r.loop_journal(loop_id, kind="claim.refused"))
    body = open_envelope(rows[-1].envelope, None).body
    assert body["principal"]["id"] == who.id
    assert {r["code"] for r in body["decision"]["reasons"]} == {"agent_not_allowed"}


async def test_claim_by_agent_not_in_policy_is_sealed_and_answered_as_not_found(store):
    await open_test_loop(store)
    await _outsider_claim(store, STRANGER)
    granted(await claim_as(store, BUILDER))


async def test_claim_max_turns_counts_open_turns(store):
    policy = make_policy(
        budgets={"max_turns": 2}, claims={"max_active_per_agent": 2, "max_active": 4}
    )
    await open_test_loop(store, policy)
    granted(await claim_as(store, BUILDER))
    granted(await claim_as(store, BUILDER))
    # Nothing has been reported yet: only the two open turns use the budget.
    result = await _refused_claim(store, REVIEWER, "budget_exhausted:turns")
    assert result.status == "active"


@pytest.mark.parametrize(
    ("dimension", "limit", "used"),
    [
        ("model_calls", 10, 10),
        ("input_tokens", 1000, 1200),
        ("output_tokens", 500, 500),
        ("tool_calls", 7, 7),
        ("cost_usd", 1.5, 1.5),
        ("wall_seconds", 60.0, 61.0),
    ],
)
async def test_claim_refused_when_a_budget_dimension_is_used_up(store, dimension, limit, used):
    policy = make_policy(budgets={"max_turns": 20, f"max_{dimension}": limit})
    await open_test_loop(store, policy)
    first = granted(await claim_as(store, BUILDER))
    result = await report(store, BUILDER, first, "progress", usage=Usage(**{dimension: used}))
    assert result.accepted
    assert result.budgets[dimension].used == used and result.budgets[dimension].remaining == 0
    await _refused_claim(store, REVIEWER, f"budget_exhausted:{dimension}")


async def test_claim_below_every_budget_limit_is_granted(store):
    policy = make_policy(budgets={"max_turns": 20, "max_cost_usd": 1.5})
    await open_test_loop(store, policy)
    first = granted(await claim_as(store, BUILDER))
    await report(store, BUILDER, first, "progress", usage=Usage(cost_usd=1.49))
    granted(await claim_as(store, REVIEWER))


async def test_claim_rate_limited_until_the_window_passes(store, clock):
    await open_test_loop(store, make_policy(rate={"turns_per_window": 2, "window_seconds": 60}))
    for _ in range(2):
        await report(store, BUILDER, granted(await claim_as(store, BUILDER)), "progress")
    await _refused_claim(store, BUILDER, "rate_limited")
    clock.advance(30)
    await _refused_claim(store, BUILDER, "rate_limited")
    clock.advance(31)
    granted(await claim_as(store, BUILDER))


async def test_claim_refused_at_max_active(store):
    policy = make_policy(agents=["builder", "reviewer", "carol"], claims={"max_active": 2})
    await open_test_loop(store, policy)
    granted(await claim_as(store, BUILDER))
    granted(await claim_as(store, REVIEWER))
    await _refused_claim(store, CAROL, "lease_limit")


async def test_claim_refused_at_max_active_per_agent(store):
    await open_test_loop(store)
    granted(await claim_as(store, BUILDER))
    result = await _refused_claim(store, BUILDER, "agent_lease_limit")
    assert "lease_limit" not in codes(result)
    granted(await claim_as(store, REVIEWER))


async def test_nothing_to_claim_is_plain_result_without_receipt(store):
    await open_test_loop(store, todos=["a"])
    granted(await claim_as(store, BUILDER))
    before = await journal_count(store)
    result = await claim_as(store, REVIEWER)
    assert not result.granted and codes(result) == {"no_eligible_todo"}
    assert result.receipt_id is None
    assert await journal_count(store) == before


async def test_claim_idempotency_key_replays_grant_without_new_receipt(store):
    await open_test_loop(store)
    first = await claim(store, BUILDER, ClaimRequest(loop_id="L1", idempotency_key="c-1"))
    before = await journal_count(store)
    again = await claim(store, BUILDER, ClaimRequest(loop_id="L1", idempotency_key="c-1"))
    assert again == first
    assert await journal_count(store) == before
    other = await claim(
        store, BUILDER, ClaimRequest(loop_id="L1", todo_id="b", idempotency_key="c-1")
    )
    assert not other.granted and codes(other) == {"idempotency_conflict"}


# --- leases ----------------------------------------------------------------------------------


async def test_expired_lease_is_sealed_reclaimed_with_next_fence_and_late_update_is_stale(
    store, clock
):
    await open_test_loop(store, todos=["a"])
    first = granted(await claim_as(store, BUILDER))
    clock.advance(BASIC_POLICY["claims"]["lease_seconds"] + 1)

    second = granted(await claim_as(store, REVIEWER))
    kinds = await loop_kinds(store)
    assert kinds[-2:] == ["lease.expired", "turn.claimed"]
    assert second.todo_id == "a" and second.fence == first.fence + 1  # type: ignore[operator]
    state = await view(store)
    assert state.turns[first.turn_id].status == "expired"  # type: ignore[index]
    assert state.todos["a"].attempts == 1

    late = await report(store, BUILDER, first, "completed", usage=Usage(cost_usd=0.5))
    assert not late.accepted and "stale_fence" in codes(late)
    assert late.budgets["cost_usd"].used == 0.5  # the work happened: charged
    body = await body_of(store, late.receipt_id)
    assert body["kind"] == "turn.refused" and body["data"]["charged"] is True
    assert (await view(store)).todos["a"].status == "claimed"  # the successor still holds it

    fresh = await report(store, REVIEWER, second, "completed", usage=Usage(cost_usd=0.25))
    assert fresh.accepted and fresh.todo_status == "done"
    assert fresh.budgets["cost_usd"].used == 0.75


async def test_heartbeat_extends_the_lease(store, clock):
    await open_test_loop(store, todos=["a"])
    first = granted(await claim_as(store, BUILDER))
    clock.advance(800)
    beat = await heartbeat(store, BUILDER, HeartbeatRequest(turn_id=first.turn_id, fence=1))
    assert beat.renewed and beat.lease_expires_at == parse_time("2026-01-01T00:28:20.000000Z")
    assert (await body_of(store, beat.receipt_id))["kind"] == "lease.renewed"
    clock.advance(200)  # past the original lease, inside the renewed one
    assert codes(await claim_as(store, REVIEWER)) == {"no_eligible_todo"}
    assert "lease.expired" not in await loop_kinds(store)
    assert (await report(store, BUILDER, first)).accepted


async def test_heartbeat_on_another_agents_turn_is_refused_and_sealed(store):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    beat = await heartbeat(store, REVIEWER, HeartbeatRequest(turn_id=first.turn_id, fence=1))
    assert not beat.renewed and codes(beat) == {"not_turn_owner"}
    assert (await body_of(store, beat.receipt_id))["kind"] == "request.refused"
    state = await view(store)
    assert state.turns[first.turn_id].lease_expires_at == first.lease_expires_at  # type: ignore[index]


async def test_heartbeat_with_stale_fence_is_refused(store):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    beat = await heartbeat(store, BUILDER, HeartbeatRequest(turn_id=first.turn_id, fence=7))
    assert not beat.renewed and "stale_fence" in codes(beat)


# --- update: idempotency, ownership ----------------------------------------------------------


async def test_update_replay_with_same_key_returns_identical_result_and_no_receipt(store):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    original = await report(store, BUILDER, first, usage=Usage(cost_usd=0.1), key="u-1")
    before = await journal_count(store)
    again = await report(store, BUILDER, first, usage=Usage(cost_usd=0.1), key="u-1")
    assert again == original
    assert await journal_count(store) == before
    assert (await view(store)).loop.totals.units("cost_usd") == 100_000


async def test_update_same_key_different_arguments_is_idempotency_conflict(store):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    await report(store, BUILDER, first, "progress", usage=Usage(cost_usd=0.1), key="u-1")
    conflict = await report(
        store, BUILDER, first, "completed", usage=Usage(cost_usd=0.1), key="u-1"
    )
    assert not conflict.accepted and codes(conflict) == {"idempotency_conflict"}
    body = await body_of(store, conflict.receipt_id)
    # The accepted report settled the turn: its usage is charged once, so a refusal of another
    # report on it is not charged again, and the answer says the turn is over.
    assert body["kind"] == "turn.refused" and body["data"]["charged"] is False
    assert conflict.turn_status == "reported"
    assert (await view(store)).loop.totals.units("cost_usd") == 100_000


async def test_a_refusal_on_an_open_turn_is_charged_and_says_the_turn_is_open(store):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    await report(store, BUILDER, first, "progress", usage=Usage(cost_usd=0.1), key="u-1")
    second = granted(await claim_as(store, BUILDER))
    refused = await report(
        store, BUILDER, second, "completed", usage=Usage(cost_usd=0.2), evidence=[], key="u-2"
    )  # completing needs evidence
    assert not refused.accepted and refused.turn_status == "open"
    body = await body_of(store, refused.receipt_id)
    assert body["data"]["charged"] is True
    assert (await view(store)).loop.totals.units("cost_usd") == 300_000


async def test_update_by_non_owner_is_refused_and_not_charged(store):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    result = await report(store, REVIEWER, first, usage=Usage(cost_usd=2.0))
    assert not result.accepted and codes(result) == {"not_turn_owner"}
    body = await body_of(store, result.receipt_id)
    assert body["kind"] == "turn.refused" and body["data"]["charged"] is False
    state = await view(store)
    assert state.loop.totals.units("cost_usd") == 0
    assert state.turns[first.turn_id].status == "open"  # type: ignore[index]
    assert (await report(store, BUILDER, first)).accepted


# --- update: tools ---------------------------------------------------------------------------


async def test_update_with_denied_tool_is_refused_charged_and_stops_the_loop(store):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    other = granted(await claim_as(store, REVIEWER))
    result = await report(store, BUILDER, first, tools={"git.push": 1}, usage=Usage(cost_usd=0.3))
    assert not result.accepted and "tool_denied" in codes(result)
    assert result.status == "stopped" and result.stop_reason == "policy_violation"
    assert result.route == "stop"
    assert result.budgets["cost_usd"].used == 0.3
    assert (await loop_kinds(store))[-2:] == ["turn.refused", "loop.stopped"]
    state = await view(store)
    assert state.turns[first.turn_id].status == "refused"  # type: ignore[index]
    assert state.turns[other.turn_id].status == "closed"  # type: ignore[index]
    await _refused_claim(store, REVIEWER, "loop_not_active")


async def test_violation_with_refuse_turn_keeps_loop_active_and_releases_todo(store):
    await open_test_loop(store, make_policy(stop={"on_violation": "refuse_turn"}))
    first = granted(await claim_as(store, BUILDER))
    result = await report(store, BUILDER, first, tools={"git.push": 1}, usage=Usage(cost_usd=0.2))
    assert not result.accepted and "tool_denied" in codes(result)
    assert result.status == "active" and result.todo_status == "open"
    assert result.budgets["cost_usd"].used == 0.2
    state = await view(store)
    assert state.todos[first.todo_id].attempts == 1  # type: ignore[index]
    assert state.turns[first.turn_id].status == "refused"  # type: ignore[index]
    assert "loop.stopped" not in await loop_kinds(store)
    again = granted(await claim_as(store, BUILDER))
    assert again.todo_id == first.todo_id and again.fence == 2


async def test_update_with_unlisted_tool_is_tool_not_allowed(store):
    await open_test_loop(store, make_policy(stop={"on_violation": "refuse_turn"}))
    first = granted(await claim_as(store, BUILDER))
    result = await report(store, BUILDER, first, tools={"fs.read": 3, "shell.exec": 1})
    assert not result.accepted and codes(result) == {"tool_not_allowed"}


async def test_update_with_allowed_tools_is_accepted(store):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    result = await report(store, BUILDER, first, tools={"fs.read": 3, "tests.run": 1})
    assert result.accepted and result.todo_status == "done"


# --- update: approvals -----------------------------------------------------------------------

GATED = make_policy(stop={"on_violation": "refuse_turn"})


async def _approve(
    store, turn: ClaimResult, *, approve=True, expires=3600, artifact=None, tool="deploy.prod"
) -> str:
    asked = await request_approval(
        store,
        BUILDER,
        ApprovalRequest(
            turn_id=turn.turn_id,  # type: ignore[arg-type]
            fence=turn.fence,  # type: ignore[arg-type]
            tool=tool,
            summary="deploy the build",
            artifact_digest=artifact,
        ),
    )
    assert asked.requested and asked.status == "pending", asked.reasons
    decided = await decide_approval(
        store,
        OPERATOR,
        DecideApprovalRequest(
            approval_id=asked.approval_id,  # type: ignore[arg-type]
            approve=approve,
            expires_in_seconds=expires,
        ),
    )
    assert decided.status == ("approved" if approve else "rejected")
    return asked.approval_id  # type: ignore[return-value]


async def test_approval_gated_tool_without_approval_is_approval_required(store):
    await open_test_loop(store, GATED)
    first = granted(await claim_as(store, BUILDER))
    result = await report(store, BUILDER, first, tools={"deploy.prod": 1})
    assert not result.accepted and codes(result) == {"approval_required"}


async def test_approved_approval_admits_the_tool_once_and_is_consumed(store):
    await open_test_loop(store, GATED)
    first = granted(await claim_as(store, BUILDER))
    approval = await _approve(store, first)
    result = await report(store, BUILDER, first, tools={"deploy.prod": 1}, approvals=[approval])
    assert result.accepted, result.reasons
    row = (await view(store)).approvals[approval]
    assert (row.status, row.consumed_by) == ("consumed", first.turn_id)

    # A consumed approval cannot cover the tool again, in another turn.
    second = granted(await claim_as(store, BUILDER))
    reused = await report(store, BUILDER, second, tools={"deploy.prod": 1}, approvals=[approval])
    assert not reused.accepted and "approval_invalid" in codes(reused)


async def test_an_approval_of_this_turn_counts_without_being_cited(store):
    """The operator approved deploy.prod for this very turn; the report forgets to cite it: it
    is found, consumed and recorded as found (the loop does not stop), and the audit agrees."""
    await open_test_loop(store, make_policy())  # on_violation = stop_loop, the default
    first = granted(await claim_as(store, BUILDER))
    approval = await _approve(store, first)
    result = await report(store, BUILDER, first, tools={"deploy.prod": 1})
    assert result.accepted and result.status == "active", result.reasons
    assert (await view(store)).approvals[approval].status == "consumed"
    sealed = await store.read(lambda r: r.receipt_by_id(result.receipt_id))
    assert store.body_of(sealed).data.approvals_found == (approval,)
    report_ = await store.read(lambda r: audit(r, store.keyring, workers=0))
    assert report_.findings == [], [f.as_dict() for f in report_.findings]


async def test_an_uncited_approval_is_used_only_for_the_tool_it_approves(store):
    await open_test_loop(store, GATED)
    first = granted(await claim_as(store, BUILDER))
    approval = await _approve(store, first, tool="deploy.staging")
    result = await report(store, BUILDER, first, tools={"deploy.prod": 1})
    assert not result.accepted and codes(result) == {"approval_required"}
    assert (await view(store)).approvals[approval].status == "approved"  # not consumed
    unrelated = await report(store, BUILDER, granted(await claim_as(store, BUILDER)), "progress")
    sealed = await store.read(lambda r: r.receipt_by_id(unrelated.receipt_id))
    assert store.body_of(sealed).data.approvals_found is None


async def test_approval_is_bound_to_the_turn_that_requested_it(store):
    await open_test_loop(store, GATED, ["a"])
    first = granted(await claim_as(store, BUILDER))
    approval = await _approve(store, first)
    assert (await report(store, BUILDER, first, "progress")).accepted  # approval left unused
    assert (await view(store)).approvals[approval].status == "approved"
    second = granted(await claim_as(store, BUILDER))
    result = await report(store, BUILDER, second, tools={"deploy.prod": 1}, approvals=[approval])
    assert not result.accepted and "approval_invalid" in codes(result)


async def test_rejected_approval_does_not_admit_the_tool(store):
    await open_test_loop(store, GATED)
    first = granted(await claim_as(store, BUILDER))
    approval = await _approve(store, first, approve=False)
    result = await report(store, BUILDER, first, tools={"deploy.prod": 1}, approvals=[approval])
    assert not result.accepted and "approval_invalid" in codes(result)


async def test_expired_approval_does_not_admit_the_tool(store, clock):
    await open_test_loop(store, GATED)
    first = granted(await claim_as(store, BUILDER))
    approval = await _approve(store, first, expires=60)
    clock.advance(61)
    result = await report(store, BUILDER, first, tools={"deploy.prod": 1}, approvals=[approval])
    assert not result.accepted and "approval_invalid" in codes(result)


async def test_approval_not_yet_expired_admits_the_tool(store, clock):
    await open_test_loop(store, GATED)
    first = granted(await claim_as(store, BUILDER))
    approval = await _approve(store, first, expires=60)
    clock.advance(59)
    assert (
        await report(store, BUILDER, first, tools={"deploy.prod": 1}, approvals=[approval])
    ).accepted


@pytest.mark.parametrize(
    ("evidence_digest", "accepted"),
    [(ARTIFACT, True), (OTHER_ARTIFACT, False), (None, False)],
    ids=["matching_digest", "other_digest", "no_digest"],
)
async def test_approval_bound_to_artifact_needs_evidence_with_that_digest(
    store, evidence_digest, accepted
):
    await open_test_loop(store, GATED)
    first = granted(await claim_as(store, BUILDER))
    approval = await _approve(store, first, artifact=ARTIFACT)
    evidence = [Evidence(kind="build", summary="artifact", digest=evidence_digest)]
    result = await report(
        store, BUILDER, first, tools={"deploy.prod": 1}, approvals=[approval], evidence=evidence
    )
    assert result.accepted is accepted
    if not accepted:
        assert "approval_invalid" in codes(result)


@pytest.mark.parametrize(
    ("tool", "code"),
    [
        ("fs.read", "approval_not_needed"),
        ("git.push", "tool_denied"),
        ("shell.exec", "tool_not_allowed"),
    ],
)
async def test_request_approval_for_non_gated_tool_is_refused_and_sealed(store, tool, code):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    asked = await request_approval(
        store,
        BUILDER,
        ApprovalRequest(turn_id=first.turn_id, fence=1, tool=tool, summary="please"),  # type: ignore[arg-type]
    )
    assert not asked.requested and codes(asked) == {code} and asked.approval_id is None
    assert (await body_of(store, asked.receipt_id))["kind"] == "request.refused"


async def test_decide_approval_is_operator_only_and_decides_once(store):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    asked = await request_approval(
        store,
        BUILDER,
        ApprovalRequest(turn_id=first.turn_id, fence=1, tool="deploy.prod", summary="go"),  # type: ignore[arg-type]
    )
    req = DecideApprovalRequest(approval_id=asked.approval_id, approve=True)  # type: ignore[arg-type]
    with pytest.raises(Forbidden):
        await decide_approval(store, BUILDER, req)
    await decide_approval(store, OPERATOR, req)
    with pytest.raises(Conflict):
        await decide_approval(store, OPERATOR, req)


# --- update: evidence ------------------------------------------------------------------------


async def test_completion_without_evidence_is_refused_charged_and_correctable(store):
    """The refused report's usage is charged (the work happened; budgets must hold even if the
    agent never reports again); the turn stays open and the correction carries only new usage."""
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    refused = await report(store, BUILDER, first, usage=Usage(cost_usd=0.4), evidence=[], key="e-1")
    assert not refused.accepted and codes(refused) == {"evidence_required"}
    assert refused.budgets["cost_usd"].used == 0.4
    body = await body_of(store, refused.receipt_id)
    assert body["data"]["charged"] is True and body["data"]["closes_turn"] is False
    state = await view(store)
    assert state.turns[first.turn_id].status == "open"  # type: ignore[index]
    assert state.todos[first.todo_id].status == "claimed"  # type: ignore[index]

    fixed = await report(store, BUILDER, first, usage=Usage(cost_usd=0.1), key="e-2")
    assert fixed.accepted and fixed.todo_status == "done"
    assert fixed.budgets["cost_usd"].used == 0.5


async def test_a_stale_fence_does_not_hide_a_violation_on_a_live_turn(store):
    """Reporting a denied tool with a wrong fence on one's own live turn must still stop the
    loop under on_violation = stop_loop (a wrong fence used to route it to the 'late' path)."""
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    sneaky = await report(store, BUILDER, first, fence=0, tools={"git.push": 1}, key="s-1")
    assert not sneaky.accepted and {"stale_fence", "tool_denied"} <= codes(sneaky)
    assert sneaky.status == "stopped" and sneaky.stop_reason == "policy_violation"
    state = await view(store)
    assert state.turns[first.turn_id].status == "refused"  # type: ignore[index]


async def test_an_outsider_reusing_its_own_claim_key_on_another_loop_learns_nothing(store):
    """Regression (release 0.1.0 checked the key before admission): mallory, admitted to M,
    reused a key from M on L's claim and was answered with L's status and every budget."""
    await open_test_loop(store)
    await open_test_loop(store, make_policy(agents=["mallory"]), loop_id="M")
    mine = await claim(store, STRANGER, ClaimRequest(loop_id="M", idempotency_key="k-1"))
    assert mine.granted
    with pytest.raises(NotFound) as hidden:
        await claim(store, STRANGER, ClaimRequest(loop_id="L1", idempotency_key="k-1"))
    assert hidden.value.message == "no loop with id 'L1'"


async def test_an_outsider_reusing_its_own_update_key_on_another_loops_turn_changes_nothing(
    store, clock
):
    """Regression (release 0.1.0): the conflict path ran before admission, answered with L's
    status and budgets, and swept L's stale leases and applied its stop rules in the
    outsider's name."""
    await open_test_loop(store)
    await open_test_loop(store, make_policy(agents=["mallory"]), loop_id="M")
    theirs = granted(await claim_as(store, BUILDER))
    mine = granted(await claim_as(store, STRANGER, "M"))
    await report(store, STRANGER, mine, "progress", key="u-1")
    clock.advance(BASIC_POLICY["claims"]["lease_seconds"] + 1)  # the builder's lease is stale
    kinds_before = await loop_kinds(store)
    with pytest.raises(NotFound) as hidden:
        await report(store, STRANGER, theirs, "completed", key="u-1")
    assert hidden.value.message == f"no turn with id {theirs.turn_id!r}"
    added = (await loop_kinds(store))[len(kinds_before) :]
    assert added == ["turn.refused"]  # its refusal, sealed; no lease.expired in its name
    state = await view(store)
    assert state.turns[theirs.turn_id].status == "open" and state.loop.totals.units("cost_usd") == 0  # type: ignore[index]


async def test_an_outsider_claim_is_sealed_but_reveals_nothing_and_sweeps_nothing(store, clock):
    await open_test_loop(store)
    granted(await claim_as(store, BUILDER))
    clock.advance(BASIC_POLICY["claims"]["lease_seconds"] + 1)  # the builder's lease is stale
    before = await journal_count(store)
    with pytest.raises(NotFound):
        await claim_as(store, STRANGER)
    kinds = await store.read(lambda r: [row.kind for row in r.loop_journal("L1")])
    assert kinds[before:] == ["claim.refused"]  # no lease.expired sealed in the outsider's name


async def test_completion_without_evidence_accepted_when_policy_does_not_require_it(store):
    await open_test_loop(store, make_policy(stop={"require_evidence_for_completion": False}))
    first = granted(await claim_as(store, BUILDER))
    assert (await report(store, BUILDER, first, evidence=[])).accepted


# --- update: outcomes ------------------------------------------------------------------------


async def test_progress_reopens_the_todo_without_counting_an_attempt(store):
    await open_test_loop(store, todos=["a"])
    first = granted(await claim_as(store, BUILDER))
    result = await report(store, BUILDER, first, "progress")
    assert result.accepted and result.todo_status == "open"
    todo = (await view(store)).todos["a"]
    assert (todo.status, todo.attempts, todo.fence) == ("open", 0, 1)
    assert granted(await claim_as(store, BUILDER)).fence == 2


async def test_failed_reopens_with_attempt_and_blocks_after_max_attempts(store):
    policy = make_policy(claims={"max_attempts": 2}, stop={"repeated_failure_limit": 10})
    await open_test_loop(store, policy, ["a", "b"])
    first = granted(await claim_as(store, BUILDER))
    result = await report(store, BUILDER, first, "failed")
    assert result.todo_status == "open"
    assert (await view(store)).todos["a"].attempts == 1
    second = granted(await claim_as(store, BUILDER))
    assert second.todo_id == "a"
    result = await report(store, BUILDER, second, "failed")
    assert result.todo_status == "blocked"
    todo = (await view(store)).todos["a"]
    assert (todo.status, todo.attempts) == ("blocked", 2)
    assert granted(await claim_as(store, BUILDER)).todo_id == "b"


async def test_blocked_outcome_blocks_the_todo(store):
    await open_test_loop(store, todos=["a", "b"])
    first = granted(await claim_as(store, BUILDER))
    result = await report(store, BUILDER, first, "blocked")
    assert result.accepted and result.todo_status == "blocked"
    assert (await view(store)).todos["a"].attempts == 0


# --- stop rules ------------------------------------------------------------------------------


async def test_all_todos_done_completes_the_loop_with_route_stop(store):
    await open_test_loop(store, todos=["a", "b"])
    first = granted(await claim_as(store, BUILDER))
    mid = await report(store, BUILDER, first)
    assert mid.status == "active" and mid.route == "continue"
    second = granted(await claim_as(store, BUILDER))
    done = await report(store, BUILDER, second)
    assert done.status == "completed" and done.route == "stop"
    assert done.stop_reason == "all_todos_done"
    assert (await loop_kinds(store))[-1] == "loop.completed"


async def test_budget_reached_stops_loop_and_closes_other_open_turns(store):
    await open_test_loop(store, make_policy(budgets={"max_cost_usd": 1.0}))
    first = granted(await claim_as(store, BUILDER))
    other = granted(await claim_as(store, REVIEWER))
    result = await report(store, BUILDER, first, "progress", usage=Usage(cost_usd=1.0))
    assert result.accepted
    assert result.status == "stopped" and result.stop_reason == "budget_exhausted:cost_usd"
    assert result.route == "stop"
    rows = await store.read(lambda r: r.loop_journal("L1", kind="loop.stopped"))
    assert len(rows) == 1
    stopped = await body_of(store, rows[0].receipt_id)
    assert stopped["data"]["closed_turns"] == [
        {"turn_id": other.turn_id, "todo_id": other.todo_id, "tool_calls_charged": 0}
    ]
    state = await view(store)
    assert state.turns[other.turn_id].status == "closed"  # type: ignore[index]
    assert state.todos[other.todo_id].status == "open"  # type: ignore[index]
    late = await report(store, REVIEWER, other, "progress")
    assert not late.accepted and "turn_closed" in codes(late)


async def test_max_turns_stops_the_loop_once_no_turn_is_open(store):
    await open_test_loop(store, make_policy(budgets={"max_turns": 1}))
    first = granted(await claim_as(store, BUILDER))
    result = await report(store, BUILDER, first, "progress")
    assert result.status == "stopped" and result.stop_reason == "max_turns"


async def test_deadline_in_the_past_stops_the_loop_on_claim(store):
    await open_test_loop(store, make_policy(stop={"deadline": "2025-12-31T00:00:00Z"}))
    result = await _refused_claim(store, BUILDER, "deadline_passed")
    assert result.status == "stopped"
    state = await view(store)
    assert state.loop.stop_reason == "deadline"


async def test_deadline_passing_during_a_turn_stops_the_loop_on_update(store, clock):
    await open_test_loop(store, make_policy(stop={"deadline": "2026-01-01T00:10:00Z"}))
    first = granted(await claim_as(store, BUILDER))
    clock.advance(601)
    result = await report(store, BUILDER, first, "progress")
    assert result.accepted and result.status == "stopped" and result.stop_reason == "deadline"
    assert result.route == "stop"


async def test_same_failure_signature_n_times_in_a_row_stops_the_loop(store):
    policy = make_policy(claims={"max_attempts": 10}, stop={"repeated_failure_limit": 3})
    await open_test_loop(store, policy, ["a", "b"])
    for n in range(3):
        turn = granted(await claim_as(store, BUILDER))
        result = await report(store, BUILDER, turn, "failed", failure_signature="E-flaky")
        assert result.accepted
        expected = "stopped" if n == 2 else "active"
        assert result.status == expected
    assert result.stop_reason == "repeated_failure"


async def test_different_failure_signatures_do_not_stop_the_loop(store):
    policy = make_policy(claims={"max_attempts": 10}, stop={"repeated_failure_limit": 3})
    await open_test_loop(store, policy, ["a", "b"])
    for sig in ("E1", "E1", "E2", "E1"):
        turn = granted(await claim_as(store, BUILDER))
        result = await report(store, BUILDER, turn, "failed", failure_signature=sig)
    assert result.status == "active"
    assert (await view(store)).loop.failure_streak == 1


# --- routes ----------------------------------------------------------------------------------


async def test_route_continue_when_a_claim_would_be_granted(store):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    assert (await report(store, BUILDER, first)).route == "continue"


async def test_route_wait_when_remaining_work_is_held_by_others(store):
    await open_test_loop(store, todos=["a", "b"])
    first = granted(await claim_as(store, BUILDER))
    granted(await claim_as(store, REVIEWER))
    assert (await report(store, BUILDER, first)).route == "wait"


async def test_route_user_action_required_when_only_blocked_work_remains(store):
    await open_test_loop(store, todos=["a"])
    first = granted(await claim_as(store, BUILDER))
    result = await report(store, BUILDER, first, "blocked")
    assert result.route == "user_action_required"


async def test_route_user_action_required_when_loop_is_paused(store):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    await control_loop(store, OPERATOR, "pause", LoopControlRequest(loop_id="L1"))
    result = await report(store, BUILDER, first, "progress")
    assert result.accepted and result.route == "user_action_required"


async def test_route_stop_when_loop_is_closed(store):
    await open_test_loop(store, todos=["a"])
    first = granted(await claim_as(store, BUILDER))
    assert (await report(store, BUILDER, first)).route == "stop"


# --- todo_add --------------------------------------------------------------------------------


async def test_agent_may_add_todo_when_policy_allows(store):
    await open_test_loop(store, todos=["a"])
    added = await todo_add(
        store, BUILDER, TodoAddRequest(loop_id="L1", title="more", depends_on=["a"])
    )
    assert added.added and added.todo_id == "t2"
    assert (await body_of(store, added.receipt_id))["kind"] == "todo.added"
    todo = (await view(store)).todos["t2"]
    assert (todo.status, todo.depends_on, todo.added_by) == ("open", ("a",), "builder")


async def test_agent_may_not_add_todo_when_policy_forbids_but_operator_may(store):
    await open_test_loop(store, make_policy(todos={"agents_may_add": False}), ["a"])
    refused = await todo_add(store, BUILDER, TodoAddRequest(loop_id="L1", title="more"))
    assert not refused.added and codes(refused) == {"todos_not_addable"}
    assert (await body_of(store, refused.receipt_id))["kind"] == "request.refused"
    assert (await todo_add(store, OPERATOR, TodoAddRequest(loop_id="L1", title="more"))).added


async def test_todo_add_refused_at_max_todos(store):
    await open_test_loop(store, make_policy(todos={"max_todos": 2}), ["a"])
    assert (await todo_add(store, BUILDER, TodoAddRequest(loop_id="L1", title="two"))).added
    for who in (BUILDER, OPERATOR):
        refused = await todo_add(store, who, TodoAddRequest(loop_id="L1", title="three"))
        assert not refused.added and codes(refused) == {"todo_limit"}


async def test_todo_add_by_stranger_is_agent_not_allowed(store):
    await open_test_loop(store, todos=["a"])
    with pytest.raises(NotFound):
        await todo_add(store, STRANGER, TodoAddRequest(loop_id="L1", title="x"))
    refused = await store.read(lambda r: r.loop_journal("L1", kind="request.refused"))
    assert len(refused) == 1  # sealed for operators, though the outsider learns nothing


async def test_todo_add_with_unknown_dependency_is_rejected_and_writes_nothing(store):
    await open_test_loop(store, todos=["a"])
    before = await journal_count(store)
    with pytest.raises(InvalidInput):
        await todo_add(
            store, BUILDER, TodoAddRequest(loop_id="L1", title="x", depends_on=["ghost"])
        )
    assert await journal_count(store) == before


# --- pause / resume / cancel -----------------------------------------------------------------


@pytest.mark.parametrize("action", ["pause", "resume", "cancel"])
async def test_loop_control_is_operator_only(store, action):
    await open_test_loop(store)
    before = await journal_count(store)
    with pytest.raises(Forbidden):
        await control_loop(store, BUILDER, action, LoopControlRequest(loop_id="L1"))
    assert await journal_count(store) == before


async def test_pause_resume_cancel_are_status_checked(store):
    await open_test_loop(store)
    req = LoopControlRequest(loop_id="L1")
    with pytest.raises(Conflict):
        await control_loop(store, OPERATOR, "resume", req)
    assert (await control_loop(store, OPERATOR, "pause", req)).status == "paused"
    with pytest.raises(Conflict):
        await control_loop(store, OPERATOR, "pause", req)
    assert (await control_loop(store, OPERATOR, "resume", req)).status == "active"
    assert (await control_loop(store, OPERATOR, "cancel", req)).status == "cancelled"
    for action in ("pause", "resume", "cancel"):
        with pytest.raises(Conflict):
            await control_loop(store, OPERATOR, action, req)
    assert await loop_kinds(store) == [
        "loop.opened",
        "loop.paused",
        "loop.resumed",
        "loop.cancelled",
    ]


async def test_cancel_closes_open_turns(store):
    await open_test_loop(store)
    first = granted(await claim_as(store, BUILDER))
    await control_loop(store, OPERATOR, "cancel", LoopControlRequest(loop_id="L1"))
    state = await view(store)
    assert state.loop.status == "cancelled"
    assert state.turns[first.turn_id].status == "closed"  # type: ignore[index]


# --- quota -----------------------------------------------------------------------------------


async def _quota_matches_claim(store, who, loop_id="L1"):
    before = await journal_count(store)
    predicted = await quota(store, who, QuotaRequest(loop_id=loop_id))
    assert await journal_count(store) == before  # read-only
    actual = await claim_as(store, who, loop_id)
    assert predicted.allowed == actual.granted
    assert codes(predicted) == codes(actual)
    return predicted


async def test_quota_predicts_a_grant(store):
    await open_test_loop(store)
    predicted = await _quota_matches_claim(store, BUILDER)
    assert predicted.allowed and predicted.status == "active"
    assert predicted.budgets["turns"].model_dump() == {"limit": 20, "used": 0, "remaining": 20}
    assert predicted.budgets["cost_usd"].model_dump() == {
        "limit": 5.0,
        "used": 0.0,
        "remaining": 5.0,
    }
    assert predicted.budgets["model_calls"].limit is None


async def test_quota_predicts_refusals(store, clock):
    await open_test_loop(store, make_policy(rate={"turns_per_window": 2, "window_seconds": 60}))
    with pytest.raises(NotFound):  # an outsider learns nothing, not even that the loop exists
        await quota(store, STRANGER, QuotaRequest(loop_id="L1"))
    await _outsider_claim(store, STRANGER)  # but its claim is refused and sealed
    turn = granted(await claim_as(store, BUILDER))
    await _quota_matches_claim(store, BUILDER)  # agent_lease_limit
    await report(store, BUILDER, turn, "progress")
    await claim_as(store, REVIEWER)
    predicted = await _quota_matches_claim(store, BUILDER)  # rate_limited
    assert "rate_limited" in codes(predicted) and predicted.rate.remaining == 0


async def test_quota_predicts_nothing_to_claim(store):
    await open_test_loop(store, todos=["a"])
    granted(await claim_as(store, BUILDER))
    predicted = await _quota_matches_claim(store, REVIEWER)
    assert codes(predicted) == {"no_eligible_todo"}


async def test_quota_predicts_paused_loop(store):
    await open_test_loop(store)
    await control_loop(store, OPERATOR, "pause", LoopControlRequest(loop_id="L1"))
    assert codes(await _quota_matches_claim(store, BUILDER)) == {"loop_not_active"}


async def test_quota_predicts_claim_of_a_todo_whose_lease_expired(store, clock):
    await open_test_loop(store, todos=["a"])
    granted(await claim_as(store, BUILDER))
    clock.advance(BASIC_POLICY["claims"]["lease_seconds"] + 1)
    predicted = await _quota_matches_claim(store, REVIEWER)
    assert predicted.allowed


async def test_quota_predicts_claim_after_the_deadline_passed(store, clock):
    await open_test_loop(store, make_policy(stop={"deadline": "2026-01-01T00:10:00Z"}))
    clock.advance(601)
    predicted = await quota(store, BUILDER, QuotaRequest(loop_id="L1"))
    actual = await claim_as(store, BUILDER)
    assert (predicted.allowed, predicted.status) == (actual.granted, actual.status)
    assert codes(predicted) == codes(actual)


# --- receipt ---------------------------------------------------------------------------------


async def test_receipt_by_id_and_by_seq_verifies_with_inclusion_proof(store):
    await open_test_loop(store)
    turn = granted(await claim_as(store, BUILDER))
    await store.integrate()  # PostgreSQL: given its leaf by the integrator, a moment later
    by_id = await receipt(store, BUILDER, ReceiptRequest(receipt_id=turn.receipt_id))
    by_seq = await receipt(store, BUILDER, ReceiptRequest(loop_id="L1", seq=2))
    assert by_id == by_seq
    assert by_id.verified and not by_id.problems
    assert by_id.body["kind"] == "turn.claimed" and by_id.body["turn_id"] == turn.turn_id
    assert by_id.inclusion_proof.verified and by_id.checkpoint.verified
    assert by_id.checkpoint.size >= by_id.inclusion_proof.leaf_index + 1

    # Check it independently: signed checkpoint, then the audit path up to its root.
    signed = open_checkpoint(by_id.checkpoint.note, store.keyring)
    assert signed.verified and signed.size == by_id.checkpoint.size
    leaf = merkle.leaf_hash(canonical_bytes(by_id.envelope))
    path = [base64.b64decode(h) for h in by_id.inclusion_proof.hashes]
    proof = by_id.inclusion_proof
    assert merkle.verify_inclusion(leaf, proof.leaf_index, proof.tree_size, path, signed.root)
    assert not merkle.verify_inclusion(
        merkle.leaf_hash(b"forged"), proof.leaf_index, proof.tree_size, path, signed.root
    )


async def test_receipt_of_unknown_id_is_not_found(store):
    await open_test_loop(store)
    with pytest.raises(NotFound):
        await receipt(store, BUILDER, ReceiptRequest(receipt_id="rcpt-" + "0" * 24))
    with pytest.raises(NotFound):
        await receipt(store, BUILDER, ReceiptRequest(loop_id="L1", seq=99))


# --- todo_cancel -----------------------------------------------------------------------------


async def test_an_operator_cancels_an_open_todo_which_is_never_claimed_and_no_longer_owed(store):
    from loopwarden.todos.todo_ops import todo_cancel

    await open_test_loop(store)
    done = await todo_cancel(store, OPERATOR, {"loop_id": "L1", "todo_id": "a", "reason": "dup"})
    assert done.todo_status == "cancelled" and done.status == "active"
    state = await view(store)
    assert state.todos["a"].status == "cancelled" and state.loop.count("cancelled") == 1
    granted = await claim_as(store, BUILDER)
    assert granted.granted and granted.todo_id != "a"
    for todo in ("b", "c"):
        if todo != granted.todo_id:
            await todo_cancel(store, OPERATOR, {"loop_id": "L1", "todo_id": todo})
    result = await report(store, BUILDER, granted, "completed")
    assert result.status == "completed", "every todo is done or cancelled"
    body = await body_of(store, done.receipt_id)
    assert body["kind"] == "todo.cancelled" and body["data"] == {"todo_id": "a", "reason": "dup"}
    report_ = await store.read(lambda r: audit(r, store.keyring, workers=0))
    assert report_.findings == []


async def test_todo_cancel_refuses_what_it_cannot_cancel_and_changes_nothing(store):
    from loopwarden.todos.todo_ops import todo_cancel

    await open_test_loop(
        store,
        todos=[TodoInput(id="a", title="a"), TodoInput(id="b", title="b", depends_on=["a"])],
    )
    before = await journal_count(store)
    with pytest.raises(Forbidden):
        await todo_cancel(store, BUILDER, {"loop_id": "L1", "todo_id": "b"})
    with pytest.raises(NotFound):
        await todo_cancel(store, OPERATOR, {"loop_id": "L1", "todo_id": "zz"})
    with pytest.raises(Conflict, match="dependency of b"):
        await todo_cancel(store, OPERATOR, {"loop_id": "L1", "todo_id": "a"})
    granted = await claim_as(store, BUILDER)
    with pytest.raises(Conflict, match="is claimed"):
        await todo_cancel(store, OPERATOR, {"loop_id": "L1", "todo_id": granted.todo_id})
    assert await journal_count(store) == before + 1  # the claim only


# --- projection ------------------------------------------------------------------------------


async def test_projection_attention_agent_when_work_is_ready(store):
    await open_test_loop(store)
    result = await projection(store, BUILDER, ProjectionRequest(loop_id="L1"))
    assert result.attention.who == "agent" and "a" in result.attention.why
    assert result.todo_counts == {"open": 3, "claimed": 0, "done": 0, "blocked": 0, "cancelled": 0}


async def test_projection_attention_human_when_approval_pending(store):
    await open_test_loop(store)
    turn = granted(await claim_as(store, BUILDER))
    asked = await request_approval(
        store,
        BUILDER,
        ApprovalRequest(turn_id=turn.turn_id, fence=1, tool="deploy.prod", summary="go"),  # type: ignore[arg-type]
    )
    result = await projection(store, BUILDER, ProjectionRequest(loop_id="L1"))
    assert result.attention.who == "human"
    assert asked.approval_id in result.next_action
    assert [a.approval_id for a in result.approvals] == [asked.approval_id]
    assert [t.turn_id for t in result.active_leases] == [turn.turn_id]


async def test_projection_attention_none_when_completed(store):
    await open_test_loop(store, todos=["a"])
    await report(store, BUILDER, granted(await claim_as(store, BUILDER)))
    result = await projection(store, BUILDER, ProjectionRequest(loop_id="L1"))
    assert result.status == "completed" and result.attention.who == "none"


async def test_projection_warns_near_budget_limits(store):
    await open_test_loop(store, make_policy(budgets={"max_cost_usd": 1.0}))
    turn = granted(await claim_as(store, BUILDER))
    await report(store, BUILDER, turn, "progress", usage=Usage(cost_usd=0.5))
    calm = await projection(store, BUILDER, ProjectionRequest(loop_id="L1"))
    assert not any(w.startswith("cost_usd") for w in calm.warnings)
    turn = granted(await claim_as(store, BUILDER))
    await report(store, BUILDER, turn, "progress", usage=Usage(cost_usd=0.35))
    warned = await projection(store, BUILDER, ProjectionRequest(loop_id="L1"))
    assert any(w.startswith("cost_usd") for w in warned.warnings)


async def test_projection_head_matches_the_loop_journal(store):
    await open_test_loop(store)
    await open_test_loop(store, loop_id="L2")
    turn = granted(await claim_as(store, BUILDER))
    await report(store, BUILDER, turn, "progress")
    await _outsider_claim(store, STRANGER)
    result = await projection(store, BUILDER, ProjectionRequest(loop_id="L1"))
    rows = await store.read(lambda r: r.loop_journal("L1"))
    assert result.head.seq == len(rows) == rows[-1].seq
    assert result.head.digest == rows[-1].digest
    # The outsider's refusal (the last receipt) is in the journal but not in the loop's own
    # recent view: no one outside the loop can push its activity out of view.
    assert rows[-1].kind == "claim.refused"
    assert [r.seq for r in result.recent_receipts] == [r.seq for r in reversed(rows)][1:11]


# --- every refusal is sealed -----------------------------------------------------------------


async def test_every_refusal_is_sealed(store, clock):
    await open_test_loop(store, make_policy(stop={"on_violation": "refuse_turn"}))
    refusals: Counter[str] = Counter()

    with pytest.raises(NotFound):  # an outsider is told nothing, but its refusal is sealed
        await claim_as(store, STRANGER)
    refusals["claim.refused"] += 1
    turn = granted(await claim_as(store, BUILDER))
    c = await claim_as(store, BUILDER)
    refusals["claim.refused"] += not c.granted
    h = await heartbeat(store, REVIEWER, HeartbeatRequest(turn_id=turn.turn_id, fence=1))  # type: ignore[arg-type]
    refusals["request.refused"] += not h.renewed
    a = await request_approval(
        store,
        BUILDER,
        ApprovalRequest(turn_id=turn.turn_id, fence=1, tool="fs.read", summary="x"),  # type: ignore[arg-type]
    )
    refusals["request.refused"] += not a.requested
    clock.advance(OUTSIDER_WINDOW.total_seconds())  # an outsider's next refusal is sealed again
    with pytest.raises(NotFound):
        await todo_add(store, STRANGER, TodoAddRequest(loop_id="L1", title="x"))
    refusals["request.refused"] += 1
    for kwargs in (
        {"evidence": []},
        {"tools": {"shell.exec": 1}},
    ):
        u = await report(store, BUILDER, turn, **kwargs)  # type: ignore[arg-type]
        refusals["turn.refused"] += not u.accepted
    u = await report(store, REVIEWER, turn)
    refusals["turn.refused"] += not u.accepted

    assert refusals == {"claim.refused": 2, "request.refused": 3, "turn.refused": 3}
    kinds = Counter(await loop_kinds(store))
    for kind, n in refusals.items():
        assert kinds[kind] == n, kind


async def test_todo_add_and_request_approval_are_idempotent_per_key(store):
    await open_test_loop(store)
    add = TodoAddRequest(loop_id="L1", title="found work", idempotency_key="add-1")
    first = await todo_add(store, BUILDER, add)
    again = await todo_add(store, BUILDER, add)
    assert first.added and again == first  # one todo, one receipt
    todos = await store.read(lambda r: [t.todo_id for t in r.all_todos("L1")])
    assert todos.count(first.todo_id) == 1
    other = await todo_add(
        store, BUILDER, TodoAddRequest(loop_id="L1", title="else", idempotency_key="add-1")
    )
    assert not other.added and codes(other) == {"idempotency_conflict"} and other.receipt_id

    turn = granted(await claim_as(store, BUILDER))
    ask = ApprovalRequest(
        turn_id=turn.turn_id, fence=turn.fence, tool="deploy.prod", summary="ship",
        idempotency_key="ask-1",
    )  # fmt: skip
    asked = await request_approval(store, BUILDER, ask)
    assert asked.requested and await request_approval(store, BUILDER, ask) == asked
    pending = await store.read(lambda r: r.loop_approvals("L1", "pending"))
    assert [a.approval_id for a in pending] == [asked.approval_id]


async def test_projection_does_not_send_agents_to_work_a_loop_that_is_due_to_stop(store, clock):
    await open_test_loop(store, make_policy(stop={"deadline": "2026-01-01T00:10:00Z"}))
    clock.advance(601)  # the deadline passed; nothing has sealed the stop yet
    state = await projection(store, BUILDER, ProjectionRequest(loop_id="L1"))
    assert state.attention.who == "none" and "due to stop" in state.attention.why
    assert "deadline" in state.next_action
    claimed = await claim_as(store, BUILDER)  # and the next call seals it, as it says
    assert not claimed.granted and claimed.status == "stopped"
