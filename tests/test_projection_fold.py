"""The projection is a fold over the receipts: rebuilding it from the journal gives the stored one.

A scripted scenario touches every receipt kind and checks rebuilt == stored after each operation;
a hypothesis test drives random operation sequences against one loop and checks the same, plus
the chain (per-loop seq contiguous from 1, `prev` links), the counters (every loop total is the
sum of what the charged receipts say) and the lease invariant (open turns ↔ claimed todos).
"""

from __future__ import annotations

import copy
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import BASIC_POLICY, BUILDER, OPERATOR, REVIEWER, STRANGER
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import CallCharges, control_loop, make_policy, scale

from loopwarden.approvals.approval_ops import (
    ApprovalRequest,
    DecideApprovalRequest,
    decide_approval,
    request_approval,
)
from loopwarden.audit.database import audit
from loopwarden.clock import ManualClock
from loopwarden.errors import LoopwardenError, NotFound
from loopwarden.hosts.hook import HookEvent, hook
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.log.seals import open_envelope
from loopwarden.kernel.state.events import (
    Evidence,
    ModelSpend,
    ReceiptBody,
    ToolUse,
    TurnRefused,
    TurnReport,
    Usage,
)
from loopwarden.kernel.state.rows import LoopView
from loopwarden.kernel.store.store import Store, snapshot
from loopwarden.kinds import KINDS
from loopwarden.loops.lifecycle import (
    LoopControlRequest,
    OpenLoopRequest,
    SetPolicyRequest,
    TodoInput,
    open_loop,
    set_policy,
)
from loopwarden.mcp_gateway.gateway_ops import GatewayChange, gateway_tool_changed
from loopwarden.model_gateway.model_ops import model_admit, model_settle
from loopwarden.pools.pool_ops import (
    PoolControlRequest,
    PoolDefineRequest,
    pool_define,
    pool_pause,
    pool_resume,
)
from loopwarden.principals import Principal
from loopwarden.todos.todo_ops import TodoAddRequest, TodoCancelRequest, todo_add, todo_cancel
from loopwarden.turns.claim import ClaimRequest, ClaimResult, claim
from loopwarden.turns.leases import HeartbeatRequest, heartbeat
from loopwarden.turns.turn_kinds import TurnReported
from loopwarden.turns.update import UpdateRequest, UpdateResult, update

CAROL = Principal(id="carol", role="agent")
AGENTS = (BUILDER, REVIEWER, CAROL)
EVIDENCE = [Evidence(kind="test", summary="the tests pass", digest="sha256:" + "ab" * 32)]
MICRO = 1_000_000


# --- the fold check --------------------------------------------------------------------------


def _settled(loop_id: str) -> Any:
    from loopwarden.model_gateway.model_kinds import ModelPrice
    from loopwarden.model_gateway.model_ops import SettleRequest

    price = ModelPrice(
        key="claude-sonnet-4-5", input=3.0, output=15.0, cache_write=3.75, cache_read=0.3
    )
    usage = ModelSpend(model_calls=1, input_tokens=1000, output_tokens=100, cache_read_tokens=500)
    usage = usage.model_copy(update={"cost_usd": price.cost_micros(usage) / 1e6})
    return SettleRequest(
        loop_id=loop_id, provider="anthropic", api="messages", model="claude-sonnet-4-5",
        stream=True, request_digest="sha256:" + "3" * 64, status=200, outcome="ok", usage=usage,
        source="provider", price=price, duration_ms=5.0,
    )  # fmt: skip


def _admission(loop_id: str, cost: float) -> Any:
    from loopwarden.model_gateway.model_ops import AdmitRequest

    return AdmitRequest(
        loop_id=loop_id, provider="anthropic", api="messages", model="claude-sonnet-4-5",
        stream=False, request_digest="sha256:" + "4" * 64, priced=True,
        reserve=ModelSpend(model_calls=1, output_tokens=100, cost_usd=cost),
    )  # fmt: skip


async def fold_check(store: Store, loop_id: str) -> tuple[list[ReceiptBody], LoopView]:
    """Rebuild the loop from its receipts, compare with the stored projection, check the chain.

    Returns the receipt bodies and the stored view for further checks.
    """

    def read(r):
        return r.loop_journal(loop_id), r.full_view(loop_id), r.journal_count(), r.log_state()[0]

    rows, stored, count, size = await store.read(read)
    assert count == size, "journal rows and Merkle leaves disagree"
    bodies: list[ReceiptBody] = []
    prev = None
    for expected_seq, row in enumerate(rows, start=1):
        opened = open_envelope(row.envelope, store.keyring)
        assert opened.verified, opened.problems
        body = KINDS.parse_body(opened.body)
        assert (body.seq, row.seq) == (expected_seq, expected_seq), "seq is not contiguous from 1"
        assert body.prev == prev, f"receipt {body.seq} does not chain to its predecessor"
        prev = row.digest
        bodies.append(body)
    rebuilt = KINDS.rebuild([(b, row.digest) for b, row in zip(bodies, rows, strict=True)])[loop_id]
    assert stored is not None
    assert rebuilt.loop == stored.loop
    assert rebuilt.todos == stored.todos
    assert rebuilt.turns == stored.turns
    assert rebuilt.approvals == stored.approvals
    assert rebuilt.policy == stored.policy
    return bodies, stored


def assert_counters_are_sums(bodies: list[ReceiptBody], stored: LoopView) -> None:
    """turns == number of turn.claimed; every other total == the charged usage in receipts
    (tool calls: what each charged report, expiry and close records, each replayed apart from
    the server by `CallCharges`)."""
    expected = Counter()
    calls = CallCharges()
    for body in bodies:
        data = body.data.model_dump(mode="json")
        if body.kind == "turn.claimed":
            expected["turns"] += 1
        elif body.kind == "lease.expired":
            expected["tool_calls"] += calls.close(data["turn_id"], data.get("tool_calls_charged"))
        elif body.kind.startswith("tool."):
            expected["tool_calls"] += calls.hook(body.kind, body.turn_id, data)
        for closed in data.get("closed_turns", ()) if body.kind.startswith("loop.") else ():
            expected["tool_calls"] += calls.close(
                closed["turn_id"], closed.get("tool_calls_charged")
            )
        charged = isinstance(body.data, TurnReported) or (
            isinstance(body.data, TurnRefused) and body.data.charged
        )
        if body.kind == "model.called":  # what the gateway observed, charged as it ended
            spent = data["usage"]
            for name in ("model_calls", "input_tokens", "output_tokens", "cache_write_tokens",
                         "cache_read_tokens"):  # fmt: skip
                expected[name] += spent.get(name, 0)
            expected["cost_micros"] += round(spent.get("cost_usd", 0) * MICRO)
        if charged:
            assert isinstance(body.data, TurnReport)
            usage = body.data.usage
            if body.data.model_observed is None:  # else charged call by call by the gateway
                expected["model_calls"] += usage.model_calls
                expected["input_tokens"] += usage.input_tokens
                expected["output_tokens"] += usage.output_tokens
                expected["cost_micros"] += round(usage.cost_usd * MICRO)
            expected["tool_calls"] += calls.report(data)
            expected["wall_micros"] += round(usage.wall_seconds * MICRO)
    totals = stored.loop.totals.as_dict()
    assert totals == {name: expected[name] for name in totals}


def assert_open_turns_match_claimed_todos(stored: LoopView) -> None:
    """Every claimed todo has exactly one open turn, holding its current fence, and vice versa."""
    open_turns = [t for t in stored.turns.values() if t.status == "open"]
    by_todo = Counter(t.todo_id for t in open_turns)
    assert all(n == 1 for n in by_todo.values()), f"a todo has two open turns: {by_todo}"
    for todo in stored.todos.values():
        if todo.status == "claimed":
            assert by_todo[todo.todo_id] == 1, f"claimed todo {todo.todo_id} has no open turn"
            turn = stored.turns[todo.turn_id]  # type: ignore[index]
            assert turn.status == "open" and turn.fence == todo.fence
        else:
            assert by_todo[todo.todo_id] == 0, f"{todo.status} todo {todo.todo_id} has an open turn"
    counts = Counter(t.status for t in stored.todos.values())
    assert stored.loop.todo_counts == tuple(
        counts[s] for s in ("open", "claimed", "done", "blocked", "cancelled")
    )


async def full_check(store: Store, loop_id: str) -> list[ReceiptBody]:
    bodies, stored = await fold_check(store, loop_id)
    assert_counters_are_sums(bodies, stored)
    assert_open_turns_match_claimed_todos(stored)
    return bodies


# --- a scripted scenario touching every receipt kind -----------------------------------------


def _policy(**stop: Any) -> dict[str, Any]:
    return make_policy(agents=["builder", "reviewer", "carol"], stop=stop)


def _report(turn: ClaimResult, outcome: str, key: str, **kw: Any) -> UpdateRequest:
    return UpdateRequest(
        turn_id=turn.turn_id,  # type: ignore[arg-type]
        fence=kw.pop("fence", turn.fence),
        outcome=outcome,  # type: ignore[arg-type]
        summary=outcome,
        idempotency_key=key,
        evidence=kw.pop("evidence", EVIDENCE if outcome == "completed" else []),
        **kw,
    )


@pytest.mark.anyio
async def test_fold_equals_stored_after_every_operation_of_a_scenario(store, clock):
    seen: set[str] = set()

    async def step(loop_id: str, coro, *, outsider: bool = False):
        if outsider:  # answered as if the loop did not exist; the refusal is still sealed
            with pytest.raises(NotFound):
                await coro
            result = None
        else:
            result = await coro
        bodies = await full_check(store, loop_id)
        seen.update(b.kind for b in bodies)
        return result

    def req(loop_id):
        return ClaimRequest(loop_id=loop_id)

    # L1: claims, refusals, leases, approvals, todo add, pause/resume, completion.
    todos = [TodoInput(id="a", title="a"), TodoInput(id="b", title="b", depends_on=("a",))]
    await step(
        "L1",
        open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(
                objective="o", policy=_policy(on_violation="refuse_turn"), todos=todos, loop_id="L1"
            ),
        ),
    )
    await step("L1", claim(store, STRANGER, req("L1")), outsider=True)  # claim.refused
    t1 = await step("L1", claim(store, BUILDER, req("L1")))
    await step("L1", heartbeat(store, BUILDER, HeartbeatRequest(turn_id=t1.turn_id, fence=1)))
    await step("L1", heartbeat(store, REVIEWER, HeartbeatRequest(turn_id=t1.turn_id, fence=1)))
    await step(
        "L1",
        update(
            store, BUILDER, _report(t1, "progress", "s1", usage=Usage(model_calls=2, cost_usd=0.1))
        ),
    )
    t2 = await step("L1", claim(store, REVIEWER, req("L1")))
    clock.advance(901)
    t3 = await step("L1", claim(store, BUILDER, req("L1")))  # lease.expired + turn.claimed
    await step(
        "L1", update(store, REVIEWER, _report(t2, "progress", "s2", usage=Usage(tool_calls=4)))
    )  # late
    asked = await step(
        "L1",
        request_approval(
            store,
            BUILDER,
            ApprovalRequest(
                turn_id=t3.turn_id,
                fence=t3.fence,
                tool="deploy.prod",
                summary="go",
                artifact_digest=EVIDENCE[0].digest,
            ),
        ),
    )
    await step(
        "L1",
        decide_approval(
            store, OPERATOR, DecideApprovalRequest(approval_id=asked.approval_id, approve=True)
        ),
    )
    await step(
        "L1", update(store, BUILDER, _report(t3, "completed", "s3", evidence=[]))
    )  # evidence_required: stays open
    await step(
        "L1",
        update(
            store,
            BUILDER,
            _report(
                t3,
                "completed",
                "s4",
                tools_used=[ToolUse(name="deploy.prod")],
                approval_ids=[asked.approval_id],
                usage=Usage(input_tokens=100, output_tokens=50, wall_seconds=12.5),
            ),
        ),
    )
    await step(
        "L1", todo_add(store, BUILDER, TodoAddRequest(loop_id="L1", title="c", depends_on=["a"]))
    )
    await step(
        "L1", todo_add(store, STRANGER, TodoAddRequest(loop_id="L1", title="x")), outsider=True
    )  # request.refused
    await step("L1", control_loop(store, OPERATOR, "pause", LoopControlRequest(loop_id="L1")))
    await step("L1", control_loop(store, OPERATOR, "resume", LoopControlRequest(loop_id="L1")))
    t4 = await step("L1", claim(store, BUILDER, req("L1")))
    await step(
        "L1",
        update(
            store, BUILDER, _report(t4, "completed", "s5", tools_used=[ToolUse(name="shell.exec")])
        ),
    )  # violation, refuse_turn
    t5 = await step("L1", claim(store, REVIEWER, req("L1")))
    await step("L1", update(store, REVIEWER, _report(t5, "failed", "s6", failure_signature="E1")))
    for key in ("s7", "s8"):
        turn = await step("L1", claim(store, BUILDER, req("L1")))
        await step("L1", update(store, BUILDER, _report(turn, "completed", key)))
    assert (await store.read(lambda r: r.loop_row("L1"))).status == "completed"

    # L2: a policy violation stops the loop, closing another open turn.
    await step(
        "L2",
        open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(objective="o", policy=_policy(), todos=todos, loop_id="L2"),
        ),
    )
    u1 = await step("L2", claim(store, BUILDER, req("L2")))
    await step("L2", todo_add(store, OPERATOR, TodoAddRequest(loop_id="L2", title="free")))
    await step("L2", claim(store, REVIEWER, req("L2")))
    await step(
        "L2",
        update(
            store,
            BUILDER,
            _report(
                u1,
                "progress",
                "v1",
                tools_used=[ToolUse(name="git.push")],
                usage=Usage(cost_usd=0.2),
            ),
        ),
    )
    assert (await store.read(lambda r: r.loop_row("L2"))).status == "stopped"

    # L3: cancelled with an open turn and a pending approval.
    await step(
        "L3",
        open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(objective="o", policy=_policy(), todos=todos, loop_id="L3"),
        ),
    )
    w1 = await step("L3", claim(store, CAROL, req("L3")))
    await step(
        "L3",
        request_approval(
            store,
            CAROL,
            ApprovalRequest(turn_id=w1.turn_id, fence=1, tool="deploy.prod", summary="go"),
        ),
    )
    await step("L3", control_loop(store, OPERATOR, "cancel", LoopControlRequest(loop_id="L3")))

    # L4: a host's hooks (record mode): attach, admit, refuse, observe; the report cross-checked.
    watched = make_policy(
        agents=["builder"], observe={"mode": "record"}, tools={"allow": ["fs.*", "shell.run"]}
    )
    await step(
        "L4",
        open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(objective="o", policy=watched, todos=todos, loop_id="L4"),
        ),
    )
    observer = Principal(id="builder", role="observer")

    def event(phase: str, tool: str | None = None, **kw: Any) -> HookEvent:
        digests = {"input_digest": "sha256:" + "1" * 64} if tool else {}
        if phase == "post":
            digests["response_digest"] = "sha256:" + "2" * 64
        return HookEvent(
            loop_id="L4", host="claude-code", phase=phase, session_id="s", host_tool=tool,
            **digests, **kw,
        )  # fmt: skip

    await step("L4", hook(store, observer, event("session")))  # host.attached
    await step("L4", hook(store, observer, event("pre", "Read")))  # no turn: tool.refused
    v1 = await step("L4", claim(store, BUILDER, req("L4")))
    await step("L4", hook(store, observer, event("pre", "Read", tool_use_id="u1")))
    await step("L4", hook(store, observer, event("post", "Read", tool_use_id="u1")))
    await step("L4", hook(store, observer, event("post", "Bash", tool_use_id="u2")))
    reported = await step(
        "L4",
        update(store, BUILDER, _report(v1, "progress", "w1", tools_used=[ToolUse(name="fs.read")])),
    )
    assert reported.accepted and [r.code for r in reported.reasons] == ["tool_unreported"]
    # The MCP gateway, for the same loop: a downstream tool no longer its pinned description.
    changed_tool = GatewayChange(
        loop_id="L4", session_id="g", server="files", tool="read_file",
        pinned_digest="sha256:" + "3" * 64, seen_digest="sha256:" + "4" * 64,
    )  # fmt: skip
    await step("L4", gateway_tool_changed(store, observer, changed_tool))
    cancel = TodoCancelRequest(loop_id="L4", todo_id="b", reason="not needed")
    assert (await step("L4", todo_cancel(store, OPERATOR, cancel))).todo_status == "cancelled"

    # L5: a loop drawing from a budget pool, which an operator defines, pauses and resumes.
    team = PoolDefineRequest(name="team", policy={"budgets": {"max_turns": 5}})
    await pool_define(store, OPERATOR, team)
    await pool_pause(store, OPERATOR, PoolControlRequest(name="team"))
    await pool_resume(store, OPERATOR, PoolControlRequest(name="team"))
    pooled = {**_policy(), "pools": ["team"]}
    await step(
        "L5",
        open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(objective="o", policy=pooled, todos=todos, loop_id="L5"),
        ),
    )
    x1 = await step("L5", claim(store, BUILDER, req("L5")))
    await step("L5", update(store, BUILDER, _report(x1, "completed", "p1")))

    # L6: the model gateway: calls charged in and outside a turn, one refused, the report.
    modelled = make_policy(
        agents=["builder"], budgets={"max_turns": 20, "max_cost_usd": 1.0},
        model={"allow": ["claude-*"]}, observe={"mode": "record"},
    )  # fmt: skip
    await step(
        "L6",
        open_loop(
            store, OPERATOR, OpenLoopRequest(objective="o", policy=modelled, todos=todos, loop_id="L6")
        ),
    )  # fmt: skip
    gateway = Principal(id="builder", role="observer")
    await step("L6", model_settle(store, gateway, _settled("L6")))  # outside a turn
    y1 = await step("L6", claim(store, BUILDER, req("L6")))
    await step("L6", model_settle(store, gateway, _settled("L6")))  # in the turn
    refused = await step("L6", model_admit(store, gateway, _admission("L6", cost=2.0)))
    assert not refused.admitted and refused.receipt_id is not None
    await step("L6", update(store, BUILDER, _report(y1, "progress", "m1")))
    wider = {**pooled, "budgets": {**pooled["budgets"], "max_turns": 30}}
    changed = SetPolicyRequest(loop_id="L5", policy=wider, reason="more turns")
    assert (await step("L5", set_policy(store, OPERATOR, changed))).changed
    x2 = await step("L5", claim(store, BUILDER, req("L5")))
    await step("L5", update(store, BUILDER, _report(x2, "progress", "p2")))
    seen.update(
        await store.read(lambda r: [j.kind for j in r.iter_journal() if j.loop_id == "pool:team"])
    )

    assert set(seen) == set(KINDS.data_models), (
        f"kinds never exercised: {set(KINDS.data_models) - set(seen)}"
    )
    report = await store.read(lambda r: audit(r, store.keyring, workers=0))
    assert report.findings == [], "every decision of the scenario is judged legal"


@pytest.mark.anyio
async def test_fold_check_detects_a_stored_projection_that_drifted(store):
    """The check itself can fail: a projection row edited behind the fold is caught."""
    await open_loop(
        store,
        OPERATOR,
        OpenLoopRequest(
            objective="o", policy=BASIC_POLICY, todos=[TodoInput(title="a")], loop_id="L1"
        ),
    )
    await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
    await full_check(store, "L1")

    def drift(tx):
        tx.conn.execute("UPDATE todos SET attempts = attempts + 1 WHERE loop_id = 'L1'")

    await store.write(drift)
    with pytest.raises(AssertionError):
        await fold_check(store, "L1")


# --- random operation sequences (hypothesis) -------------------------------------------------

# Mostly allowed tools, so loops live long enough to reach deep states; sometimes a violation.
TOOLS = ("fs.read", "fs.write", "tests.run") * 4 + (
    "git.push",
    "deploy.prod",
    "deploy.prod",
    "shell.exec",
)
FUZZ_POLICY: dict[str, Any] = {
    "agents": ["builder", "reviewer", "carol"],
    "tools": {
        "allow": ["fs.read", "fs.write", "tests.run"],
        "deny": ["git.push"],
        "approval": ["deploy.*"],
    },
    "budgets": {"max_turns": 30, "max_cost_usd": 6.0, "max_model_calls": 40},
    "rate": {"turns_per_window": 8, "window_seconds": 600},
    "claims": {"lease_seconds": 300, "max_active": 3, "max_active_per_agent": 1, "max_attempts": 3},
    "stop": {"repeated_failure_limit": 3},
    "todos": {"agents_may_add": True, "max_todos": 8},
}


@dataclass
class World:
    """What the driver remembers to pick meaningful arguments (never used as an oracle)."""

    store: Store
    clock: ManualClock
    turns: list[tuple[Principal, ClaimResult]] = field(default_factory=list)
    approvals: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    sent: list[tuple[Principal, UpdateRequest, UpdateResult]] = field(default_factory=list)
    keys: int = 0

    def key(self) -> str:
        self.keys += 1
        return f"k{self.keys}"


def _who(data: st.DataObject, owner: Principal) -> Principal:
    """Mostly the turn's owner; sometimes another agent."""
    return data.draw(st.sampled_from([owner, owner, owner, *AGENTS]))


async def op_claim(w: World, data: st.DataObject) -> None:
    who = data.draw(st.sampled_from([*AGENTS, STRANGER]))
    result = await claim(w.store, who, ClaimRequest(loop_id="L"))
    if result.granted:
        w.turns.append((who, result))


async def op_update(w: World, data: st.DataObject) -> None:
    if w.sent and data.draw(st.integers(0, 4)) == 0:
        # Retry a previous update with its key: same arguments replay, others conflict.
        who, req, original = data.draw(st.sampled_from(w.sent))
        if data.draw(st.booleans()):
            before = await w.store.read(lambda r: r.sealed_count())
            again = await update(w.store, who, req)
            assert again == original, "an idempotent retry returned a different result"
            assert await w.store.read(lambda r: r.sealed_count()) == before
        else:
            changed = req.model_copy(update={"summary": req.summary + " (changed)"})
            result = await update(w.store, who, changed)
            assert not result.accepted and {r.code for r in result.reasons} == {
                "idempotency_conflict"
            }
        return
    if not w.turns:
        return
    owner, turn = data.draw(st.sampled_from(w.turns))
    who = _who(data, owner)
    outcome = data.draw(st.sampled_from(["progress", "completed", "failed", "blocked"]))
    tools = data.draw(st.lists(st.sampled_from(TOOLS), unique=True, max_size=2))
    usage = Usage(
        model_calls=data.draw(st.integers(0, 4)),
        input_tokens=data.draw(st.sampled_from([0, 10, 1000])),
        output_tokens=data.draw(st.sampled_from([0, 7])),
        tool_calls=data.draw(st.integers(0, 3)),
        cost_usd=data.draw(st.sampled_from([0.0, 0.1, 0.25, 1.0])),
        wall_seconds=data.draw(st.sampled_from([0.0, 1.5, 30.0])),
    )
    approvals = data.draw(st.lists(st.sampled_from(w.approvals), max_size=1)) if w.approvals else []
    req = UpdateRequest(
        turn_id=turn.turn_id,  # type: ignore[arg-type]
        fence=data.draw(st.sampled_from([turn.fence] * 4 + [turn.fence + 1])),  # type: ignore[operator]
        outcome=outcome,  # type: ignore[arg-type]
        tools_used=[ToolUse(name=t, count=data.draw(st.integers(1, 3))) for t in tools],
        usage=usage,
        evidence=EVIDENCE if data.draw(st.integers(0, 3)) else [],
        summary=f"{outcome} by {who.id}",
        failure_signature=data.draw(st.sampled_from([None, "E1", "E1", "E2"])),
        approval_ids=approvals,
        idempotency_key=w.key(),
    )
    w.sent.append((who, req, await update(w.store, who, req)))


async def op_heartbeat(w: World, data: st.DataObject) -> None:
    if not w.turns:
        return
    owner, turn = data.draw(st.sampled_from(w.turns))
    fence = data.draw(st.sampled_from([turn.fence, turn.fence, 0]))
    await heartbeat(w.store, _who(data, owner), HeartbeatRequest(turn_id=turn.turn_id, fence=fence))  # type: ignore[arg-type]


async def op_advance(w: World, data: st.DataObject) -> None:
    w.clock.advance(data.draw(st.sampled_from([1, 59, 299, 301, 700])))


async def op_todo_add(w: World, data: st.DataObject) -> None:
    who = data.draw(st.sampled_from([BUILDER, OPERATOR, STRANGER]))
    todos = await w.store.read(lambda r: [t.todo_id for t in r.all_todos("L")])
    deps = data.draw(st.lists(st.sampled_from([*todos, "ghost"]), max_size=2, unique=True))
    await todo_add(w.store, who, TodoAddRequest(loop_id="L", title="added", depends_on=deps))


async def op_request_approval(w: World, data: st.DataObject) -> None:
    if not w.turns:
        return
    owner, turn = data.draw(st.sampled_from(w.turns))
    result = await request_approval(
        w.store,
        _who(data, owner),
        ApprovalRequest(
            turn_id=turn.turn_id,  # type: ignore[arg-type]
            fence=turn.fence,  # type: ignore[arg-type]
            tool=data.draw(st.sampled_from(["deploy.prod", "deploy.prod", "fs.read"])),
            summary="please",
            artifact_digest=data.draw(st.sampled_from([None, EVIDENCE[0].digest])),
        ),
    )
    if result.requested:
        w.approvals.append(result.approval_id)  # type: ignore[arg-type]
        w.pending.append(result.approval_id)  # type: ignore[arg-type]


async def op_decide(w: World, data: st.DataObject) -> None:
    if not w.pending:
        return
    approval_id = data.draw(st.sampled_from(w.pending))
    w.pending.remove(approval_id)
    await decide_approval(
        w.store,
        OPERATOR,
        DecideApprovalRequest(
            approval_id=approval_id,  # type: ignore[arg-type]
            approve=data.draw(st.booleans()),
            expires_in_seconds=data.draw(st.sampled_from([30, 3600])),
        ),
    )


async def op_pause_resume(w: World, data: st.DataObject) -> None:
    action = data.draw(st.sampled_from(["pause", "resume"]))
    await control_loop(w.store, OPERATOR, action, LoopControlRequest(loop_id="L"))


OPERATIONS = {
    "claim": op_claim,
    "update": op_update,
    "heartbeat": op_heartbeat,
    "advance": op_advance,
    "todo_add": op_todo_add,
    "request_approval": op_request_approval,
    "decide": op_decide,
    "pause_resume": op_pause_resume,
}
WEIGHTED = ["claim"] * 3 + ["update"] * 4 + list(OPERATIONS)


async def _drive(data: st.DataObject, on_violation: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        clock = ManualClock()
        keys = KeyStore(home)
        store = await Store.open(
            home / "loopwarden.db", keys.load_signer(), clock=clock, checkpoint_every=8, kinds=KINDS
        )
        try:
            policy = copy.deepcopy(FUZZ_POLICY)
            policy["stop"]["on_violation"] = on_violation
            todos = [
                TodoInput(id="a", title="a"),
                TodoInput(id="b", title="b"),
                TodoInput(id="c", title="c", depends_on=("a",)),
            ]
            await open_loop(
                store,
                OPERATOR,
                OpenLoopRequest(objective="fuzz", policy=policy, todos=todos, loop_id="L"),
            )
            await full_check(store, "L")
            world = World(store, clock)
            for _ in range(data.draw(st.integers(1, 25), label="steps")):
                name = data.draw(st.sampled_from(WEIGHTED), label="operation")
                before = await store.read(lambda r: r.sealed_count())
                try:
                    await OPERATIONS[name](world, data)
                except NotFound:
                    # An outsider is answered as for a missing loop; its refusal alone is sealed.
                    added = await store.read(
                        lambda r, after=before: r.loop_journal("L", after_seq=after)
                    )
                    assert [row.kind for row in added] in (
                        [],
                        ["claim.refused"],
                        ["request.refused"],
                    )
                except LoopwardenError:
                    # A raised error (Conflict, InvalidInput, ...) must leave nothing behind.
                    assert await store.read(lambda r: r.sealed_count()) == before
                await full_check(store, "L")
            # The judging audit finds nothing to object to in a journal only operations wrote.
            with snapshot(home / "loopwarden.db") as reader:
                report = audit(reader, store.keyring, workers=0)
            assert report.clean, [f.as_dict() for f in report.findings]
        finally:
            await store.close()


@settings(
    max_examples=scale(30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data(), on_violation=st.sampled_from(["stop_loop", "refuse_turn"]))
def test_random_operation_sequences_keep_fold_chain_and_counters_consistent(data, on_violation):
    anyio.run(_drive, data, on_violation)
