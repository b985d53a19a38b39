"""Outsiders, callers a loop's policy does not admit: they learn nothing and flood nothing.

- The journal flood: an outsider used to append a sealed refusal per call (~200 a second, about
  3 MB per 10 s) and push the loop's own activity out of its projection's recent view. Now at
  most one refusal per outsider per loop per window is sealed, the next one carries the count
  of those answered since (a refusal is never silent), and outsiders' receipts stay out of the
  recent view.
- The oracles: "not yours" and "does not exist" get one answer on every path, tools and
  resources, receipts by id and by position (already true before this work: the
  operations-core change made it so; checked here over a real `serve --http`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import BUILDER, OPERATOR, STRANGER
from mcp import MCPError
from support import (
    EVIDENCE,
    Served,
    Token,
    bounded,
    cli,
    connect_http,
    make_policy,
    mint_tokens,
    open_db,
    run_cli_app,
    start_server,
    stop_server,
)

from loopwarden.audit.database import audit
from loopwarden.clients.agent import AgentClient, ToolCallError
from loopwarden.errors import NotFound
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.kernel.log.seals import open_envelope
from loopwarden.kernel.runner.outsiders import WINDOW
from loopwarden.kernel.store.reader import JournalRow
from loopwarden.kernel.store.store import Store
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.principals import Principal
from loopwarden.projection.projection import ProjectionRequest, projection
from loopwarden.todos.todo_ops import TodoAddRequest, todo_add
from loopwarden.tool_errors import error_of
from loopwarden.turns.claim import ClaimRequest, claim
from loopwarden.turns.quota import QuotaRequest, quota
from loopwarden.turns.update import UpdateRequest, update

pytestmark = pytest.mark.anyio

FLOOD = 200  # outsider calls per flood (bounded)
POLICY = make_policy(agents=["builder"])


# --- in process, on a manual clock -----------------------------------------------------------


async def _open(store: Store, loop_id: str = "L1") -> None:
    todos = [TodoInput(id=t, title=f"todo {t}") for t in ("a", "b")]
    request = OpenLoopRequest(objective="own work", policy=POLICY, todos=todos, loop_id=loop_id)
    await open_loop(store, OPERATOR, request)


async def _outsider_calls(store: Store, who: Principal, count: int, loop_id: str = "L1") -> None:
    """`count` refused writes by `who`, alternating claim and todo_add: each answered as if
    the loop did not exist."""
    for n in range(count):
        with pytest.raises(NotFound, match=f"no loop with id '{loop_id}'"):
            if n % 2:
                await todo_add(store, who, TodoAddRequest(loop_id=loop_id, title=f"spam {n}"))
            else:
                await claim(store, who, ClaimRequest(loop_id=loop_id))


async def _journal(store: Store, loop_id: str = "L1") -> list[JournalRow]:
    return await store.read(lambda r: r.loop_journal(loop_id))


def _reasons(store: Store, row: JournalRow) -> dict[str, str]:
    body = open_envelope(row.envelope, store.keyring).body
    return {r["code"]: r["message"] for r in body["decision"]["reasons"]}


async def test_an_outsider_adds_one_receipt_per_loop_per_window_and_the_next_carries_the_count(
    store, clock
):
    await _open(store)
    await _open(store, "L2")
    before = len(await _journal(store))
    await _outsider_calls(store, STRANGER, FLOOD)
    assert len(await _journal(store)) == before + 1  # one sealed refusal for the whole window
    await _outsider_calls(store, STRANGER, 3, "L2")  # another loop keeps its own window
    assert len(await _journal(store, "L2")) == 1 + 1
    await _outsider_calls(store, Principal(id="eve", role="agent"), 5)  # so does another outsider
    assert len(await _journal(store)) == before + 2
    assert await store.read(lambda r: r.outsider_refusals("L1")) == (2, FLOOD - 1 + 5 - 1)

    clock.advance(WINDOW.total_seconds() - 1)
    await _outsider_calls(store, STRANGER, 1)  # still within the window: counted, not sealed
    assert len(await _journal(store)) == before + 2
    clock.advance(1)
    await _outsider_calls(store, STRANGER, 1)  # the next window: sealed, carrying the count
    last = (await _journal(store))[-1]
    assert last.kind == "claim.refused" and len(await _journal(store)) == before + 3
    reasons = _reasons(store, last)
    assert set(reasons) == {"agent_not_allowed", "refusals_suppressed"}
    assert reasons["refusals_suppressed"].startswith(f"{FLOOD} more refusal(s) of 'mallory'")
    first = (await _journal(store))[before]
    assert set(_reasons(store, first)) == {"agent_not_allowed"}  # nothing suppressed before it
    report = await store.read(lambda r: audit(r, KeyStore(store.file.parent).keyring(), workers=0))
    assert report.clean, report.findings


async def test_a_mistyped_loop_id_suggests_only_loops_the_caller_may_see(store):
    """`no loop with id 'relase'; did you mean 'release'?` for whoever may see 'release'; an
    outsider gets the same answer for 'release' (hidden) as for 'relase' (missing), and never
    a hidden id, read or write."""
    await _open(store, "release")
    hidden = make_policy(agents=["someone-else"])
    request = OpenLoopRequest(objective="theirs", policy=hidden, loop_id="released", todos=[])
    await open_loop(store, OPERATOR, request)
    for op, req in (
        (quota, QuotaRequest(loop_id="relase")),
        (claim, ClaimRequest(loop_id="relase")),
    ):
        with pytest.raises(NotFound) as seen:
            await op(store, BUILDER, req)
        assert str(seen.value) == "no loop with id 'relase'; did you mean 'release'?"
        with pytest.raises(NotFound) as operator:
            await op(store, OPERATOR, req)
        assert str(operator.value) == (
            "no loop with id 'relase'; did you mean 'release' or 'released'?"
        )
        for loop_id in ("released", "releasd"):  # hidden, and missing: alike, naming none
            with pytest.raises(NotFound) as outside:
                await op(store, BUILDER, type(req)(loop_id=loop_id))
            assert str(outside.value) == (f"no loop with id {loop_id!r}; did you mean 'release'?")
        with pytest.raises(NotFound) as stranger:
            await op(store, STRANGER, req)
        assert str(stranger.value) == "no loop with id 'relase'"


async def test_outsiders_cannot_push_the_loops_own_activity_out_of_its_recent_view(store):
    await _open(store)
    grant = await claim(store, BUILDER, ClaimRequest(loop_id="L1"))
    assert grant.granted and grant.turn_id and grant.fence
    await update(
        store,
        BUILDER,
        UpdateRequest(
            turn_id=grant.turn_id,
            fence=grant.fence,
            outcome="completed",
            summary="done",
            evidence=EVIDENCE,  # type: ignore[arg-type]
            idempotency_key="r-1",
        ),
    )
    for n in range(30):  # thirty outsiders, one sealed refusal each
        await _outsider_calls(store, Principal(id=f"outsider-{n}", role="agent"), 1)
    view = await projection(store, OPERATOR, ProjectionRequest(loop_id="L1"))
    own = [r for r in await _journal(store) if not r.kind.endswith(".refused")]
    assert [r.seq for r in view.recent_receipts] == [r.seq for r in reversed(own)][:10]
    assert {r.principal for r in view.recent_receipts} <= {"alice", "builder"}
    assert any("30 refusal(s) of agents outside the policy" in w for w in view.warnings)
    assert view.head.seq == (await _journal(store))[-1].seq  # the head still counts them


# --- over a real serve --http ----------------------------------------------------------------


@dataclass
class HttpWorld:
    served: Served
    tokens: dict[str, Token]


@pytest.fixture
def http_world(tmp_path: Path) -> Iterator[HttpWorld]:
    home = tmp_path / "home"
    tokens = mint_tokens(home, [("builder", "agent"), ("mallory", "agent"), ("alice", "operator")])
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(POLICY))
    opened = run_cli_app(
        "loop", "open", "--policy", str(policy), "--objective", "own work",
        "--todo", "a", "--todo", "b", "--id", "L1", "--home", str(home), "--json",
    )  # fmt: skip
    assert opened.exit_code == 0, opened.output
    served = start_server(home, tmp_path / "logs")
    try:
        yield HttpWorld(served, tokens)
    finally:
        stop_server(served)


def _journal_on_disk(home: Path) -> list[JournalRow]:
    with open_db(home) as reader:
        return reader.loop_journal("L1")


async def _flood(mallory: AgentClient, turn_id: str, fence: int) -> None:
    """FLOOD refused writes, spread over every write an outsider can aim at a loop."""
    for n in range(FLOOD):
        with pytest.raises(ToolCallError, match=r"^not_found: "):
            match n % 4:
                case 0:
                    await mallory.claim("L1")
                case 1:
                    await mallory.todo_add("L1", f"spam {n}")
                case 2:
                    await mallory.heartbeat(turn_id, fence)
                case _:
                    await mallory.request_approval(turn_id, fence, "deploy.prod", "let me in")


@bounded(180)
async def test_an_outsider_flooding_a_loop_over_http_adds_one_receipt_per_window(http_world):
    url, home = http_world.served.url, http_world.served.home
    async with connect_http(url, http_world.tokens["builder"].token) as builder:
        grant = await builder.claim("L1")  # the loop's own activity
    assert grant.granted and grant.turn_id and grant.fence
    before = _journal_on_disk(home)
    started = time.monotonic()
    async with connect_http(url, http_world.tokens["mallory"].token) as mallory:
        await _flood(mallory, grant.turn_id, grant.fence)
    elapsed = time.monotonic() - started
    added = _journal_on_disk(home)[len(before) :]
    grown = sum(len(r.envelope) for r in added)
    print(
        f"\n{FLOOD} outsider writes in {elapsed:.1f}s added {len(added)} receipt(s), "
        f"{grown} bytes of envelopes, to the loop's journal"
    )
    assert 1 <= len(added) <= 1 + int(elapsed // WINDOW.total_seconds())
    async with connect_http(url, http_world.tokens["builder"].token) as builder:
        view = await builder.projection("L1")
    assert {r.principal for r in view.recent_receipts} == {"operator", "builder"}
    assert [r.kind for r in view.recent_receipts][:1] == ["turn.claimed"]
    assert any(f"{FLOOD} refusal(s) of agents outside" in w for w in view.warnings), view.warnings
    verified = await anyio.to_thread.run_sync(lambda: cli("verify", "--home", str(home)))
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _as_hidden(text: str, missing: dict[str, Any], hidden: dict[str, Any]) -> str:
    """`text` (the answer for `missing`) with every argument that differs put back as in
    `hidden`: what the answer for `hidden` must be, if hidden and missing look alike."""
    for key, value in missing.items():
        if hidden[key] != value:
            text = text.replace(str(value), str(hidden[key]))
    return text


async def _tool_error(client: AgentClient, tool: str, arguments: dict[str, Any]) -> str:
    result = await client.client.call_tool(tool, arguments)
    assert result.is_error, f"{tool}({arguments}) answered {result.structured_content}"
    error = error_of(result)
    assert error is not None, result
    return f"{error[0]}: {error[1]}"


async def _resource_error(client: AgentClient, uri: str) -> str:
    with pytest.raises(MCPError) as refused:
        await client.client.read_resource(uri)
    return str(refused.value)


def _unknown(real: str) -> str:
    """An id of the same kind and shape that names nothing."""
    return real[:-6] + ("000000" if not real.endswith("000000") else "111111")


async def _builder_objects(url: str, token: str) -> dict[str, Any]:
    """A turn, an approval and receipts in L1, made by the admitted agent."""
    async with connect_http(url, token) as builder:
        grant = await builder.claim("L1")
        assert grant.granted and grant.turn_id and grant.fence and grant.receipt_id
        asked = await builder.request_approval(grant.turn_id, grant.fence, "deploy.prod", "ship")
        assert asked.approval_id
    return {
        "turn": grant.turn_id,
        "fence": grant.fence,
        "receipt": grant.receipt_id,
        "approval": asked.approval_id,
    }


def _tool_cases(o: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(tool, arguments naming something hidden, the same naming nothing) for every path."""
    report = {"fence": o["fence"], "outcome": "progress", "summary": "x", "idempotency_key": "k1"}
    asks = {"fence": o["fence"], "tool": "deploy.prod", "summary": "please"}
    return [
        ("quota", {"loop_id": "L1"}, {"loop_id": "L9"}),
        ("claim", {"loop_id": "L1"}, {"loop_id": "L9"}),
        ("projection", {"loop_id": "L1"}, {"loop_id": "L9"}),
        ("todo_add", {"loop_id": "L1", "title": "t"}, {"loop_id": "L9", "title": "t"}),
        ("receipt", {"receipt_id": o["receipt"]}, {"receipt_id": _unknown(o["receipt"])}),
        ("receipt", {"loop_id": "L1", "seq": 1}, {"loop_id": "L9", "seq": 1}),
        ("receipt", {"loop_id": "L1", "seq": 2}, {"loop_id": "L1", "seq": 999_999}),  # position
        (
            "heartbeat",
            {"turn_id": o["turn"], "fence": 1},
            {"turn_id": _unknown(o["turn"]), "fence": 1},
        ),
        ("update", {"turn_id": o["turn"], **report}, {"turn_id": _unknown(o["turn"]), **report}),
        (
            "request_approval",
            {"turn_id": o["turn"], **asks},
            {"turn_id": _unknown(o["turn"]), **asks},
        ),
        (
            "decide_approval",
            {"approval_id": o["approval"], "approve": True},
            {"approval_id": _unknown(o["approval"]), "approve": True},
        ),
    ]


@bounded(180)
async def test_an_outsider_gets_one_answer_for_hidden_and_missing_on_every_path(http_world):
    url = http_world.served.url
    objects = await _builder_objects(url, http_world.tokens["builder"].token)
    async with connect_http(url, http_world.tokens["mallory"].token) as mallory:
        for tool, hidden, missing in _tool_cases(objects):
            shown = await _tool_error(mallory, tool, hidden)
            expected = _as_hidden(await _tool_error(mallory, tool, missing), missing, hidden)
            assert shown == expected, (tool, hidden)
            assert shown.startswith(("not_found: ", "forbidden: ")), shown
        for template, real, fake in (
            ("loopwarden://loops/{}/projection", "L1", "L9"),
            ("loopwarden://loops/{}/policy", "L1", "L9"),
            ("loopwarden://receipts/{}", objects["receipt"], _unknown(objects["receipt"])),
        ):
            shown = await _resource_error(mallory, template.format(real))
            assert shown == (await _resource_error(mallory, template.format(fake))).replace(
                fake, real
            )
        listed = await mallory.client.read_resource("loopwarden://loops")
        assert "L1" not in json.loads(listed.contents[0].text)["loops"].__repr__()  # type: ignore[union-attr]
