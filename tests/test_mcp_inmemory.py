"""The MCP surface in-process: every tool, resource and the prompt through `mcp.Client(server)`.

Each principal gets its own `build_server` instance on one shared data home (like separate
server processes on one database), all driven by one manual clock. The tests check what an MCP
client sees: structured results that parse into the result models, refusals as normal results
with a sealed receipt, and malformed input / unknown ids / forbidden calls as clean tool errors
(no traceback, no file path) or, for resources, JSON-RPC errors.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from conftest import BASIC_POLICY, BUILDER, OPERATOR, REVIEWER, STRANGER
from mcp import Client, MCPError
from mcp.types import INVALID_PARAMS
from pydantic import BaseModel
from support import TOOL_NAMES, codes, make_policy, text_of

from loopwarden.approvals.approval_ops import ApprovalRequestResult, DecideApprovalResult
from loopwarden.clock import ManualClock
from loopwarden.journal.receipt import ReceiptResult
from loopwarden.loops.lifecycle import OpenLoopResult
from loopwarden.principals import Principal
from loopwarden.projection.projection import ProjectionResult
from loopwarden.server.app import build_server
from loopwarden.server.settings import Settings
from loopwarden.todos.todo_ops import TodoAddResult
from loopwarden.tool_errors import error_of
from loopwarden.turns.claim import ClaimResult
from loopwarden.turns.leases import HeartbeatResult
from loopwarden.turns.quota import QuotaResult
from loopwarden.turns.update import UpdateResult

pytestmark = pytest.mark.anyio

M = TypeVar("M", bound=BaseModel)

READ_ONLY_TOOLS = {"quota", "receipt", "projection"}
EVIDENCE = [{"kind": "test", "summary": "12 passed"}]
UNKNOWN_TURN = "turn-" + "0" * 20
UNKNOWN_APPROVAL = "appr-" + "0" * 20
UNKNOWN_RECEIPT = "rcpt-" + "0" * 24
# What must never reach a client: tracebacks and server-side file paths.
LEAKS = re.compile(r"Traceback|File \"|site-packages|\.py\b|/work/|/tmp/|/home/")


# --- harness ---------------------------------------------------------------------------------


def assert_no_leak(text: str, home: Path | None = None) -> None:
    assert not LEAKS.search(text), f"internals leaked to the client: {text!r}"
    if home is not None:
        assert str(home) not in text


@dataclass
class Caller:
    """One principal's MCP connection to its own server instance."""

    client: Client
    principal: Principal
    home: Path

    async def ok(self, tool: str, model: type[M], /, **arguments: Any) -> M:
        result = await self.client.call_tool(tool, arguments)
        assert not result.is_error, text_of(result)
        assert result.structured_content is not None
        return model.model_validate(result.structured_content)

    async def error(self, tool: str, /, **arguments: Any) -> str:
        """Call a tool that must fail; return its (checked-clean) error text."""
        result = await self.client.call_tool(tool, arguments)
        assert result.is_error, f"{tool} should have failed: {result.structured_content}"
        text = text_of(result)
        if tool in TOOL_NAMES:  # our errors carry their code for machines too
            assert result.structured_content is None, "an error has no structured content"
            code, message = error_of(result) or ("", "")
            assert text == f"{code}: {message}", (text, code, message)
        assert text.strip(), "an error needs a message"
        assert_no_leak(text, self.home)
        return text

    async def resource(self, uri: str) -> str:
        read = await self.client.read_resource(uri)
        assert len(read.contents) == 1
        content = read.contents[0]
        assert content.mime_type == "application/json"
        return content.text  # type: ignore[union-attr]

    async def resource_error(self, uri: str) -> MCPError:
        with pytest.raises(MCPError) as caught:
            await self.client.read_resource(uri)
        assert_no_leak(caught.value.error.message, self.home)
        return caught.value


@dataclass
class World:
    operator: Caller
    builder: Caller
    clock: ManualClock


@asynccontextmanager
async def serving(home: Path, clock: ManualClock, principal: Principal) -> AsyncIterator[Caller]:
    """A fresh server instance for `principal` on `home`, and a client connected to it."""
    server = build_server(
        Settings(home=home, principal=principal, auth=False, synchronous="normal"), clock=clock
    )
    async with Client(server) as client:
        yield Caller(client, principal, home)


@pytest.fixture
async def world(home: Path, clock: ManualClock) -> AsyncIterator[World]:
    """An operator's server and an admitted agent's server on one data home."""
    async with serving(home, clock, OPERATOR) as operator, serving(home, clock, BUILDER) as builder:
        yield World(operator, builder, clock)


@pytest.fixture
async def reviewer(home: Path, clock: ManualClock) -> AsyncIterator[Caller]:
    """A second admitted agent, on its own server instance."""
    async with serving(home, clock, REVIEWER) as caller:
        yield caller


@pytest.fixture
async def stranger(home: Path, clock: ManualClock) -> AsyncIterator[Caller]:
    """An authenticated agent that BASIC_POLICY does not admit."""
    async with serving(home, clock, STRANGER) as caller:
        yield caller


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    # Module scope, so that the read-only `shared` world below can live for the whole module.
    return "asyncio"


@pytest.fixture(scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    """One world with loop L1 for the many tests that must not change anything (malformed
    input, unknown ids, bad resource URIs): they assert that the journal did not move."""
    home = tmp_path_factory.mktemp("shared") / "home"
    clock = ManualClock()
    async with serving(home, clock, OPERATOR) as operator, serving(home, clock, BUILDER) as builder:
        world = World(operator, builder, clock)
        await open_loop(world)
        yield world


async def open_loop(
    world: World, loop_id: str = "L1", todo_ids: tuple[str, ...] = ("a", "b", "c"), **sections: Any
) -> OpenLoopResult:
    return await world.operator.ok(
        "open_loop",
        OpenLoopResult,
        objective="ship it",
        policy=make_policy(**sections),
        todos=[{"id": t, "title": f"todo {t}"} for t in todo_ids],
        loop_id=loop_id,
    )


@pytest.fixture
async def loop(world: World) -> OpenLoopResult:
    return await open_loop(world)


async def claim(caller: Caller, loop_id: str = "L1", **arguments: Any) -> ClaimResult:
    granted = await caller.ok("claim", ClaimResult, loop_id=loop_id, **arguments)
    assert granted.granted, granted.reasons
    return granted


_keys = iter(range(1, 10_000))


async def report(
    caller: Caller, turn: ClaimResult, outcome: str = "completed", **fields: Any
) -> UpdateResult:
    arguments = {
        "turn_id": turn.turn_id,
        "fence": turn.fence,
        "outcome": outcome,
        "summary": f"{outcome} {turn.todo_id}",
        "idempotency_key": f"key-{next(_keys)}",
        "tools_used": [{"name": "tests.run", "count": 2}],
        "usage": {"model_calls": 3, "input_tokens": 1200, "output_tokens": 300, "cost_usd": 0.25},
        "evidence": EVIDENCE if outcome == "completed" else [],
    }
    arguments.update(fields)
    return await caller.ok("update", UpdateResult, **arguments)


async def head_seq(world: World, loop_id: str = "L1") -> int:
    state = await world.operator.ok("projection", ProjectionResult, loop_id=loop_id)
    return state.head.seq


# --- discovery: tools, resources, prompt, instructions ---------------------------------------


async def test_list_tools_shows_exactly_the_ten_governance_tools_with_descriptions(world):
    tools = (await world.builder.client.list_tools()).tools
    assert {t.name for t in tools} == set(TOOL_NAMES)
    assert len(tools) == len(TOOL_NAMES)
    for tool in tools:
        assert tool.description and len(tool.description) > 30, tool.name
        assert tool.output_schema is not None, f"{tool.name} has no structured output"


async def test_read_only_hint_marks_exactly_quota_receipt_and_projection(world):
    tools = (await world.builder.client.list_tools()).tools
    read_only = {t.name for t in tools if t.annotations and t.annotations.read_only_hint}
    assert read_only == READ_ONLY_TOOLS


async def test_every_input_schema_forbids_additional_properties_and_describes_arguments(world):
    for tool in (await world.builder.client.list_tools()).tools:
        schema = tool.input_schema
        assert schema.get("additionalProperties") is False, tool.name
        for name, prop in schema.get("properties", {}).items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"


async def test_server_instructions_describe_the_turn_protocol(world):
    instructions = world.builder.client.instructions
    assert instructions and instructions.strip()
    for step in ("quota", "claim", "update", "projection"):
        assert step in instructions


async def test_resources_and_templates_are_listed(world):
    resources = (await world.builder.client.list_resources()).resources
    assert [str(r.uri) for r in resources] == ["loopwarden://loops"]
    templates = (await world.builder.client.list_resource_templates()).resource_templates
    assert {t.uri_template for t in templates} == {
        "loopwarden://loops/{loop_id}/projection",
        "loopwarden://loops/{loop_id}/policy",
        "loopwarden://receipts/{receipt_id}",
    }


async def test_loop_operator_prompt_explains_the_protocol_for_a_given_loop(world):
    prompts = (await world.builder.client.list_prompts()).prompts
    assert [p.name for p in prompts] == ["loop-operator"]
    assert prompts[0].description
    got = await world.builder.client.get_prompt("loop-operator", {"loop_id": "L7"})
    assert len(got.messages) == 1 and got.messages[0].role == "user"
    text = got.messages[0].content.text  # type: ignore[union-attr]
    assert "loop L7" in text
    order = [text.index(step) for step in ("quota(", "claim(", "update(", "route")]
    assert order == sorted(order), "the prompt must teach quota → claim → update → route"
    bare = await world.builder.client.get_prompt("loop-operator", {})
    assert "(loop " not in bare.messages[0].content.text  # type: ignore[union-attr]


# --- every tool, the happy path --------------------------------------------------------------


async def test_open_loop_by_operator_seals_loop_opened(world):
    opened = await open_loop(world)
    assert (opened.loop_id, opened.status, opened.todos) == ("L1", "active", 3)
    first = await world.operator.ok("receipt", ReceiptResult, receipt_id=opened.receipt_id)
    assert (first.kind, first.seq, first.verified) == ("loop.opened", 1, True)
    assert first.body["principal"] == {"id": "alice", "role": "operator"}


async def test_quota_predicts_a_grant_and_changes_nothing(world, loop):
    before = await head_seq(world)
    quota = await world.builder.ok("quota", QuotaResult, loop_id="L1")
    assert quota.allowed and quota.reasons == [] and quota.status == "active"
    assert quota.budgets["turns"].limit == 20 and quota.budgets["turns"].remaining == 20
    assert quota.policy_digest == loop.policy_digest
    assert await head_seq(world) == before


async def test_claim_grants_a_lease_fence_and_the_turns_tools(world, loop):
    granted = await claim(world.builder)
    assert granted.todo_id == "a" and granted.fence == 1
    assert granted.turn_id and granted.turn_id.startswith("turn-")
    assert granted.lease_expires_at is not None and granted.lease_expires_at > world.clock()
    assert "fs.write" in granted.allowed_tools and granted.approval_tools == ["deploy.*"]
    assert granted.denied_tools == ["git.push"]
    sealed = await world.operator.ok("receipt", ReceiptResult, receipt_id=granted.receipt_id)
    assert sealed.kind == "turn.claimed"
    assert sealed.body["principal"] == {"id": "builder", "role": "agent"}


async def test_update_completed_with_evidence_is_accepted_charged_and_routes_continue(world, loop):
    turn = await claim(world.builder)
    result = await report(world.builder, turn)
    assert result.accepted and result.reasons == []
    assert (result.route, result.status, result.todo_status) == ("continue", "active", "done")
    assert result.budgets["cost_usd"].used == pytest.approx(0.25)
    assert result.budgets["model_calls"].used == 3
    sealed = await world.operator.ok("receipt", ReceiptResult, receipt_id=result.receipt_id)
    assert (sealed.kind, sealed.seq) == ("turn.reported", result.seq)
    assert sealed.body["data"]["usage"]["input_tokens"] == 1200


async def test_update_resent_with_the_same_key_returns_the_original_result(world, loop):
    turn = await claim(world.builder)
    first = await report(world.builder, turn, idempotency_key="same-key")
    again = await report(world.builder, turn, idempotency_key="same-key")
    assert again == first
    changed = await report(world.builder, turn, idempotency_key="same-key", summary="other")
    assert not changed.accepted and codes(changed) == {"idempotency_conflict"}


async def test_receipt_by_id_and_by_loop_and_seq_verify_with_an_inclusion_proof(world, loop):
    turn = await claim(world.builder)
    by_id = await world.builder.ok("receipt", ReceiptResult, receipt_id=turn.receipt_id)
    by_seq = await world.builder.ok("receipt", ReceiptResult, loop_id="L1", seq=by_id.seq)
    assert by_seq.receipt_id == by_id.receipt_id == turn.receipt_id
    assert by_id.verified and by_id.problems == []
    assert by_id.inclusion_proof.verified and by_id.checkpoint.verified
    assert by_id.inclusion_proof.tree_size > by_id.inclusion_proof.leaf_index
    assert by_id.envelope["payloadType"].startswith("application/vnd.loopwarden.receipt+json")


async def test_projection_shows_todos_leases_attention_and_head(world, loop):
    turn = await claim(world.builder)
    state = await world.builder.ok("projection", ProjectionResult, loop_id="L1")
    assert state.status == "active" and state.objective == "ship it"
    assert {t.todo_id: t.status for t in state.todos} == {"a": "claimed", "b": "open", "c": "open"}
    assert [lease.turn_id for lease in state.active_leases] == [turn.turn_id]
    assert state.attention.who == "agent"
    assert state.head.seq == 2 and state.head.digest.startswith("sha256:")
    assert [r.kind for r in state.recent_receipts][:2] in (
        ["turn.claimed", "loop.opened"],
        ["loop.opened", "turn.claimed"],
    )


async def test_heartbeat_extends_the_lease_from_now(world, loop):
    turn = await claim(world.builder)
    world.clock.advance(600)
    renewed = await world.builder.ok(
        "heartbeat", HeartbeatResult, turn_id=turn.turn_id, fence=turn.fence
    )
    assert renewed.renewed and renewed.reasons == []
    assert renewed.lease_expires_at > turn.lease_expires_at
    world.clock.advance(600)  # past the original lease, within the renewed one
    assert (await report(world.builder, turn)).accepted


async def test_todo_add_by_an_admitted_agent_adds_a_claimable_todo(world, loop):
    added = await world.builder.ok(
        "todo_add", TodoAddResult, loop_id="L1", title="found more", todo_id="d", order=0
    )
    assert added.added and added.todo_id == "d" and added.receipt_id
    assert (await claim(world.builder)).todo_id == "d"


async def test_approval_requested_by_agent_decided_by_operator_covers_the_tool(world, loop):
    turn = await claim(world.builder)
    asked = await world.builder.ok(
        "request_approval",
        ApprovalRequestResult,
        turn_id=turn.turn_id,
        fence=turn.fence,
        tool="deploy.prod",
        summary="ship to prod",
    )
    assert asked.requested and asked.status == "pending" and asked.approval_id
    pending = await world.operator.ok("projection", ProjectionResult, loop_id="L1")
    assert pending.attention.who == "human"
    decided = await world.operator.ok(
        "decide_approval",
        DecideApprovalResult,
        approval_id=asked.approval_id,
        approve=True,
        expires_in_seconds=600,
        reason="looks fine",
    )
    assert decided.status == "approved" and decided.expires_at
    result = await report(
        world.builder,
        turn,
        tools_used=[{"name": "deploy.prod", "count": 1}],
        approval_ids=[asked.approval_id],
    )
    assert result.accepted, result.reasons


async def test_a_rejected_approval_covers_nothing_and_cannot_be_decided_twice(world, loop):
    turn = await claim(world.builder)
    asked = await world.builder.ok(
        "request_approval",
        ApprovalRequestResult,
        turn_id=turn.turn_id,
        fence=turn.fence,
        tool="deploy.prod",
        summary="ship to prod",
    )
    rejected = await world.operator.ok(
        "decide_approval",
        DecideApprovalResult,
        approval_id=asked.approval_id,
        approve=False,
        reason="not today",
    )
    assert (rejected.status, rejected.expires_at) == ("rejected", None)
    text = await world.operator.error(
        "decide_approval", approval_id=asked.approval_id, approve=True
    )
    assert "conflict" in text
    used_anyway = await report(
        world.builder,
        turn,
        "progress",
        tools_used=[{"name": "deploy.prod", "count": 1}],
        approval_ids=[asked.approval_id],
    )
    assert not used_anyway.accepted and "approval_invalid" in codes(used_anyway)
    assert used_anyway.status == "stopped"


# --- refusals are results with a receipt, not errors -----------------------------------------


async def test_claim_by_an_agent_outside_the_policy_is_answered_not_found_and_sealed(
    world, loop, stranger
):
    hidden = await stranger.error("claim", loop_id="L1")
    missing = await stranger.error("claim", loop_id="L9")
    assert hidden == missing.replace("L9", "L1") == "not_found: no loop with id 'L1'"
    state = await world.operator.ok("projection", ProjectionResult, loop_id="L1")
    assert all(r.principal != "mallory" for r in state.recent_receipts)  # the loop's own view
    seq = state.head.seq
    sealed = await world.operator.ok("receipt", ReceiptResult, loop_id="L1", seq=seq)
    assert sealed.kind == "claim.refused" and sealed.body["principal"]["id"] == "mallory"
    assert sealed.body["decision"]["effect"] == "deny"


async def test_a_second_claim_over_the_per_agent_limit_is_refused_and_quota_says_so(
    world, loop, reviewer
):
    await claim(world.builder)
    quota = await world.builder.ok("quota", QuotaResult, loop_id="L1")
    assert not quota.allowed and "agent_lease_limit" in codes(quota)
    refused = await world.builder.ok("claim", ClaimResult, loop_id="L1")
    assert not refused.granted and codes(refused) == {"agent_lease_limit"}
    assert refused.receipt_id
    assert (await claim(reviewer)).todo_id == "b"


async def test_update_with_a_denied_tool_is_refused_and_stops_the_loop(world, loop, reviewer):
    turn = await claim(world.builder)
    refused = await report(
        world.builder, turn, "progress", tools_used=[{"name": "git.push", "count": 1}]
    )
    assert not refused.accepted and "tool_denied" in codes(refused)
    assert (refused.route, refused.status, refused.stop_reason) == (
        "stop",
        "stopped",
        "policy_violation",
    )
    sealed = await world.operator.ok("receipt", ReceiptResult, receipt_id=refused.receipt_id)
    assert sealed.kind == "turn.refused" and sealed.verified
    again = await reviewer.ok("claim", ClaimResult, loop_id="L1")
    assert not again.granted and "loop_not_active" in codes(again)


async def test_completing_without_evidence_is_refused_and_the_turn_stays_open(world, loop):
    turn = await claim(world.builder)
    refused = await report(world.builder, turn, "completed", evidence=[])
    assert not refused.accepted and codes(refused) == {"evidence_required"}
    assert refused.status == "active" and refused.receipt_id
    assert (await report(world.builder, turn, "completed")).accepted


async def test_heartbeat_on_another_agents_turn_is_refused_as_not_turn_owner(world, loop, reviewer):
    turn = await claim(world.builder)
    refused = await reviewer.ok(
        "heartbeat", HeartbeatResult, turn_id=turn.turn_id, fence=turn.fence
    )
    assert not refused.renewed and codes(refused) == {"not_turn_owner"} and refused.receipt_id


async def test_request_approval_for_an_allowed_tool_is_refused_as_not_needed(world, loop):
    turn = await claim(world.builder)
    refused = await world.builder.ok(
        "request_approval",
        ApprovalRequestResult,
        turn_id=turn.turn_id,
        fence=turn.fence,
        tool="fs.write",
        summary="write a file",
    )
    assert not refused.requested and codes(refused) == {"approval_not_needed"}
    assert refused.approval_id is None and refused.receipt_id


async def test_todo_add_is_refused_when_the_policy_keeps_agents_from_adding(world):
    await open_loop(world, todos={"agents_may_add": False})
    refused = await world.builder.ok("todo_add", TodoAddResult, loop_id="L1", title="more")
    assert not refused.added and codes(refused) == {"todos_not_addable"} and refused.receipt_id


async def test_quota_for_an_outsider_is_not_found_and_reveals_no_budgets(world, loop, stranger):
    text = await stranger.error("quota", loop_id="L1")
    assert text == "not_found: no loop with id 'L1'"


# --- malformed input: clean tool errors, nothing sealed --------------------------------------


GOOD_TURN = {"turn_id": UNKNOWN_TURN, "fence": 1}
GOOD_UPDATE = {
    **GOOD_TURN,
    "outcome": "progress",
    "summary": "did things",
    "idempotency_key": "k-1",
}

MALFORMED = [
    pytest.param("quota", {"loop_id": "L1", "bogus": 1}, "bogus", id="quota-extra-argument"),
    pytest.param("claim", {"loop_id": "L1", "agent": "alice"}, "agent", id="claim-identity-arg"),
    pytest.param("quota", {}, "loop_id", id="quota-missing-loop-id"),
    pytest.param("quota", {"loop_id": 42}, "loop_id", id="quota-loop-id-not-a-string"),
    pytest.param("projection", {"loop_id": "../etc/passwd"}, "loop_id", id="loop-id-path"),
    pytest.param("projection", {"loop_id": "x" * 65}, "loop_id", id="loop-id-too-long"),
    pytest.param("claim", {"loop_id": "L1", "todo_id": "a b"}, "todo_id", id="claim-bad-todo-id"),
    pytest.param("update", {**GOOD_UPDATE, "fence": "abc"}, "fence", id="update-fence-not-int"),
    pytest.param("update", {**GOOD_UPDATE, "fence": -1}, "fence", id="update-negative-fence"),
    pytest.param("update", {**GOOD_UPDATE, "fence": 2**60}, "fence", id="update-fence-beyond-2^53"),
    pytest.param("update", {**GOOD_UPDATE, "turn_id": "turn-zz"}, "turn_id", id="bad-turn-id"),
    pytest.param("update", {**GOOD_UPDATE, "outcome": "done"}, "outcome", id="unknown-outcome"),
    pytest.param(
        "update", {**GOOD_UPDATE, "summary": "x" * 4001}, "summary", id="overlong-summary"
    ),
    pytest.param(
        "update",
        {**GOOD_UPDATE, "usage": {"model_calls": -1}},
        "model_calls",
        id="negative-model-calls",
    ),
    pytest.param(
        "update", {**GOOD_UPDATE, "usage": {"cost_usd": -0.5}}, "cost_usd", id="negative-cost"
    ),
    pytest.param(
        "update",
        {**GOOD_UPDATE, "usage": {"cost_usd": float("nan")}},
        "cost_usd",
        id="nan-cost",
    ),
    pytest.param(
        "update",
        {**GOOD_UPDATE, "usage": {"wall_seconds": float("inf")}},
        "wall_seconds",
        id="infinite-wall-seconds",
    ),
    pytest.param("update", {**GOOD_UPDATE, "fence": float("nan")}, "fence", id="nan-fence"),
    pytest.param(
        "update",
        {**GOOD_UPDATE, "usage": {"tokens": 5}},
        "tokens",
        id="unknown-usage-field",
    ),
    pytest.param(
        "update",
        {**GOOD_UPDATE, "tools_used": [{"name": "fs.read"}, {"name": "fs.read"}]},
        "tools_used",
        id="tool-listed-twice",
    ),
    pytest.param(
        "update",
        {**GOOD_UPDATE, "tools_used": [{"name": "fs.read", "count": 0}]},
        "count",
        id="zero-tool-count",
    ),
    pytest.param(
        "update",
        {**GOOD_UPDATE, "evidence": [{"kind": "Bad Kind", "summary": "x"}]},
        "kind",
        id="bad-evidence-kind",
    ),
    pytest.param(
        "update",
        {**GOOD_UPDATE, "approval_ids": ["appr-nope"]},
        "approval_ids",
        id="bad-approval-id",
    ),
    pytest.param(
        "update",
        {**GOOD_UPDATE, "idempotency_key": "bad key!"},
        "idempotency_key",
        id="bad-idempotency-key",
    ),
    pytest.param(
        "update",
        {k: v for k, v in GOOD_UPDATE.items() if k != "summary"},
        "summary",
        id="update-missing-summary",
    ),
    pytest.param("receipt", {"receipt_id": "rcpt-xyz"}, "receipt_id", id="bad-receipt-id"),
    pytest.param("receipt", {}, "receipt_id", id="receipt-without-address"),
    pytest.param(
        "receipt",
        {"receipt_id": UNKNOWN_RECEIPT, "loop_id": "L1", "seq": 1},
        "receipt_id",
        id="receipt-two-addresses",
    ),
    pytest.param("receipt", {"loop_id": "L1", "seq": 0}, "seq", id="receipt-seq-zero"),
    pytest.param("heartbeat", {**GOOD_TURN, "fence": -3}, "fence", id="heartbeat-negative-fence"),
    pytest.param("todo_add", {"loop_id": "L1", "title": ""}, "title", id="todo-empty-title"),
    pytest.param(
        "todo_add", {"loop_id": "L1", "title": "t", "order": -1}, "order", id="todo-negative-order"
    ),
    pytest.param(
        "request_approval",
        {**GOOD_TURN, "tool": "deploy.prod", "summary": "s", "artifact_digest": "md5:abc"},
        "artifact_digest",
        id="bad-artifact-digest",
    ),
    pytest.param(
        "request_approval",
        {**GOOD_TURN, "tool": "rm -rf /", "summary": "s"},
        "tool",
        id="bad-tool-name",
    ),
]


@pytest.mark.parametrize(("tool", "arguments", "field"), MALFORMED)
async def test_malformed_arguments_are_clean_tool_errors_naming_the_field(
    shared, tool, arguments, field
):
    before = await head_seq(shared)
    text = await shared.builder.error(tool, **arguments)
    assert field in text, f"the message should name {field!r}: {text!r}"
    assert "not_found" not in text, "arguments must be validated before any lookup"
    assert await head_seq(shared) == before, "a malformed call must not seal anything"


@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    [
        pytest.param("claim", {"loop_id": "L1", "todo_id": "a b"}, "todo_id", id="todo-id"),
        pytest.param("receipt", {"loop_id": "bad id", "seq": 1}, "loop_id", id="receipt-loop-id"),
        pytest.param("update", {**GOOD_UPDATE, "fence": 2**60}, "fence", id="fence-beyond-2^53"),
    ],
)
async def test_request_validation_errors_carry_the_invalid_input_code_and_one_line_per_field(
    shared, tool, arguments, field
):
    text = await shared.builder.error(tool, **arguments)
    assert text.startswith(f"invalid_input: {field}: "), text
    assert "\n" not in text and "errors.pydantic.dev" not in text and "input_value" not in text


@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    [
        pytest.param("quota", {"loop_id": "L1", "bogus": 1}, "bogus", id="extra-argument"),
        pytest.param("update", {**GOOD_UPDATE, "summary": "x" * 4001}, "summary", id="summary"),
        pytest.param("projection", {"loop_id": "../x"}, "loop_id", id="loop-id-pattern"),
    ],
)
async def test_argument_validation_errors_carry_the_invalid_input_code_like_request_errors(
    shared, tool, arguments, field
):
    text = await shared.builder.error(tool, **arguments)
    assert text.startswith(f"invalid_input: {field}: "), text
    assert "errors.pydantic.dev" not in text and "input_value" not in text


async def test_nan_usage_is_refused_rather_than_charged(world, loop):
    """JSON has no NaN: the client sends it as null, which a float budget field refuses."""
    turn = await claim(world.builder)
    text = await world.builder.error(
        "update",
        turn_id=turn.turn_id,
        fence=turn.fence,
        outcome="progress",
        summary="s",
        idempotency_key="nan-1",
        usage={"cost_usd": float("nan")},
    )
    assert "usage.cost_usd" in text
    state = await world.operator.ok("projection", ProjectionResult, loop_id="L1")
    cost = state.budgets["cost_usd"].used
    assert cost == 0 and not math.isnan(cost)
    assert [t.status for t in state.turns] == ["open"]


@pytest.mark.parametrize(
    ("tool", "arguments", "field"),
    [
        pytest.param(
            "open_loop",
            {"objective": "", "policy": BASIC_POLICY},
            "objective",
            id="empty-objective",
        ),
        pytest.param(
            "open_loop",
            {"objective": "x", "policy": {**BASIC_POLICY, "surprise": 1}},
            "surprise",
            id="unknown-policy-key",
        ),
        pytest.param(
            "open_loop",
            {"objective": "x", "policy": make_policy(budgets={"max_turns": 0})},
            "max_turns",
            id="policy-max-turns-zero",
        ),
        pytest.param(
            "open_loop",
            {
                "objective": "x",
                "policy": BASIC_POLICY,
                "todos": [{"title": "a", "depends_on": ["zz"]}],
            },
            "zz",
            id="unknown-dependency",
        ),
        pytest.param(
            "open_loop",
            {"objective": "x", "policy": BASIC_POLICY, "loop_id": "no/slash"},
            "loop_id",
            id="bad-loop-id",
        ),
        pytest.param(
            "decide_approval",
            {"approval_id": "appr-1", "approve": True},
            "approval_id",
            id="bad-approval-id",
        ),
        pytest.param(
            "decide_approval",
            {"approval_id": UNKNOWN_APPROVAL, "approve": True, "expires_in_seconds": 0},
            "expires_in_seconds",
            id="zero-expiry",
        ),
        pytest.param(
            "decide_approval",
            {"approval_id": UNKNOWN_APPROVAL, "approve": "maybe"},
            "approve",
            id="approve-not-bool",
        ),
    ],
)
async def test_malformed_operator_arguments_are_clean_tool_errors(shared, tool, arguments, field):
    before = await shared.operator.resource("loopwarden://loops")
    text = await shared.operator.error(tool, **arguments)
    assert field in text, text
    after = await shared.operator.resource("loopwarden://loops")
    assert after == before, "a malformed open_loop must not open anything"


async def test_calling_an_unknown_tool_is_an_error_result(shared):
    text = await shared.builder.error("delete_everything", loop_id="L1")
    assert "delete_everything" in text


# --- unknown ids: not_found ------------------------------------------------------------------


NOT_FOUND = [
    pytest.param("quota", {"loop_id": "nope"}, id="quota"),
    pytest.param("claim", {"loop_id": "nope"}, id="claim"),
    pytest.param("claim", {"loop_id": "L1", "todo_id": "zz"}, id="claim-unknown-todo"),
    pytest.param("projection", {"loop_id": "nope"}, id="projection"),
    pytest.param("todo_add", {"loop_id": "nope", "title": "t"}, id="todo_add"),
    pytest.param("update", GOOD_UPDATE, id="update"),
    pytest.param("heartbeat", GOOD_TURN, id="heartbeat"),
    pytest.param(
        "request_approval",
        {**GOOD_TURN, "tool": "deploy.prod", "summary": "s"},
        id="request_approval",
    ),
    pytest.param("receipt", {"receipt_id": UNKNOWN_RECEIPT}, id="receipt-by-id"),
    pytest.param("receipt", {"loop_id": "L1", "seq": 999}, id="receipt-by-seq"),
    pytest.param("receipt", {"loop_id": "nope", "seq": 1}, id="receipt-unknown-loop"),
]


@pytest.mark.parametrize(("tool", "arguments"), NOT_FOUND)
async def test_unknown_ids_are_clear_not_found_errors(shared, tool, arguments):
    before = await head_seq(shared)
    text = await shared.builder.error(tool, **arguments)
    assert "not_found" in text, text
    assert await head_seq(shared) == before, "a failed lookup must not seal anything"


async def test_deciding_an_unknown_approval_is_not_found(shared):
    text = await shared.operator.error(
        "decide_approval", approval_id=UNKNOWN_APPROVAL, approve=True
    )
    assert "not_found" in text and UNKNOWN_APPROVAL in text


# --- forbidden: operator tools, other loops --------------------------------------------------


async def test_an_agent_calling_open_loop_is_forbidden_and_nothing_opens(world):
    text = await world.builder.error(
        "open_loop", objective="mine now", policy=BASIC_POLICY, loop_id="L9"
    )
    assert "forbidden" in text
    loops = json.loads(await world.operator.resource("loopwarden://loops"))
    assert loops == {"loops": []}


async def test_an_agent_deciding_its_own_approval_is_forbidden_and_it_stays_pending(world, loop):
    turn = await claim(world.builder)
    asked = await world.builder.ok(
        "request_approval",
        ApprovalRequestResult,
        turn_id=turn.turn_id,
        fence=turn.fence,
        tool="deploy.prod",
        summary="self-serve",
    )
    text = await world.builder.error("decide_approval", approval_id=asked.approval_id, approve=True)
    assert "forbidden" in text
    state = await world.operator.ok("projection", ProjectionResult, loop_id="L1")
    assert [(a.approval_id, a.status) for a in state.approvals] == [(asked.approval_id, "pending")]


async def test_an_outsider_cannot_read_the_loops_projection_or_receipts_but_an_operator_can(
    world, loop, stranger
):
    # The same answer as for things that do not exist: nothing to tell them apart by.
    assert await stranger.error("projection", loop_id="L1") == "not_found: no loop with id 'L1'"
    hidden = await stranger.error("receipt", receipt_id=loop.receipt_id)
    assert hidden == f"not_found: no receipt {loop.receipt_id}"
    assert await stranger.error("receipt", loop_id="L1", seq=1) == "not_found: no receipt L1 #1"
    assert await stranger.error("receipt", loop_id="L9", seq=1) == "not_found: no receipt L9 #1"
    state = await world.operator.ok("projection", ProjectionResult, loop_id="L1")
    assert state.loop_id == "L1"
    sealed = await world.operator.ok("receipt", ReceiptResult, receipt_id=loop.receipt_id)
    assert sealed.verified


async def test_an_outsider_cannot_read_the_loop_through_resources_either(world, loop, stranger):
    for uri in (
        "loopwarden://loops/L1/projection",
        "loopwarden://loops/L1/policy",
        f"loopwarden://receipts/{loop.receipt_id}",
    ):
        error = await stranger.resource_error(uri)
        assert error.error.message.startswith("no "), uri
    listed = json.loads(await stranger.resource("loopwarden://loops"))
    assert listed == {"loops": []}


# --- resources -------------------------------------------------------------------------------


async def test_loops_resource_lists_the_loops_an_agent_may_see(world, loop):
    await open_loop(world, "L2")
    listed = json.loads(await world.builder.resource("loopwarden://loops"))
    assert [item["loop_id"] for item in listed["loops"]] == ["L1", "L2"]
    assert listed["loops"][0]["status"] == "active" and listed["loops"][0]["head_seq"] == 1


async def test_loops_resource_hides_loops_whose_policy_does_not_admit_the_agent(world):
    await world.operator.ok(
        "open_loop",
        OpenLoopResult,
        objective="reviewers only",
        policy={**copy.deepcopy(BASIC_POLICY), "agents": ["reviewer"]},
        loop_id="R1",
    )
    await open_loop(world)
    mine = json.loads(await world.builder.resource("loopwarden://loops"))
    assert [item["loop_id"] for item in mine["loops"]] == ["L1"]
    everything = json.loads(await world.operator.resource("loopwarden://loops"))
    assert sorted(item["loop_id"] for item in everything["loops"]) == ["L1", "R1"]


async def test_projection_resource_equals_the_projection_tool(world, loop):
    await claim(world.builder)
    from_resource = ProjectionResult.model_validate_json(
        await world.builder.resource("loopwarden://loops/L1/projection")
    )
    from_tool = await world.builder.ok("projection", ProjectionResult, loop_id="L1")
    assert from_resource == from_tool


async def test_policy_resource_is_the_normalized_policy_document(world, loop):
    document = json.loads(await world.builder.resource("loopwarden://loops/L1/policy"))
    assert document["agents"] == ["builder", "reviewer"]
    assert document["tools"]["deny"] == ["git.push"]
    assert document["budgets"]["max_turns"] == 20


async def test_receipt_resource_is_the_verified_receipt(world, loop):
    got = ReceiptResult.model_validate_json(
        await world.builder.resource(f"loopwarden://receipts/{loop.receipt_id}")
    )
    assert got.receipt_id == loop.receipt_id and got.kind == "loop.opened"
    assert got.verified and got.inclusion_proof.verified


@pytest.mark.parametrize(
    "uri",
    [
        "loopwarden://loops/nope/projection",
        "loopwarden://loops//projection",
        "loopwarden://loops/nope/policy",
        "loopwarden://loops/a%20b/policy",
        f"loopwarden://receipts/{UNKNOWN_RECEIPT}",
        "loopwarden://receipts/rcpt-xyz",
        "loopwarden://receipts/",
        "loopwarden://loops/../../etc/passwd/projection",
        "loopwarden://nothing/here",
    ],
)
async def test_reading_unknown_or_malformed_resource_ids_is_invalid_params(shared, uri):
    error = await shared.builder.resource_error(uri)
    assert error.error.code == INVALID_PARAMS, error.error
    assert error.error.message


# --- several servers, one database -----------------------------------------------------------


async def test_two_servers_on_one_home_see_each_others_writes_and_never_double_claim(
    world, loop, reviewer
):
    a = await claim(world.builder)
    b = await claim(reviewer)
    assert a.todo_id != b.todo_id
    for caller, turn in ((world.builder, a), (reviewer, b)):
        assert (await report(caller, turn)).accepted
    c = await claim(reviewer)
    assert c.todo_id == "c"
    done = await report(reviewer, c)
    assert (done.status, done.route) == ("completed", "stop")
    state = await world.operator.ok("projection", ProjectionResult, loop_id="L1")
    assert state.status == "completed" and state.todo_counts["done"] == 3
    assert {r.principal for r in state.recent_receipts} >= {"alice", "builder", "reviewer"}
