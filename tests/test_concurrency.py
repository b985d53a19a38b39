"""Concurrency: many agents on one loop, over real transports, and what the receipts prove.

- 16 agents, each with its own bearer token and MCP session, against ONE `loopwarden serve
  --http`; and 8 `loopwarden serve` stdio processes (one per agent, as desktop clients launch
  them) sharing one SQLite file. Both drain a loop of ~200 todos with a realistic mix of turns:
  completions, progress (the todo goes back), failures, a denied tool (refused and charged),
  completions without evidence (refused, not charged, then corrected) and heartbeats.
  Afterwards the signed journal alone must show: no todo ever held by two live leases, fences
  strictly rising, no todo completed twice, `seq` contiguous with an unbroken `prev` chain, one
  consistent Merkle tree (`loopwarden verify` exit 0), and every budget counter equal to the
  sum of the usage in the receipts (turns = grants).
- Lease expiry under contention, on a manual clock: late workers get `stale_fence`, their
  successors' work stands.
- Idempotent retries: one update sent 5 times at once seals one `turn.reported` and returns 5
  identical answers.
- Replicas on PostgreSQL: 4 `loopwarden serve --http` processes on one database, 16 agents
  spread over them, the same drain and the same proofs; and replicas SIGKILLed again and again
  while agents write through them (retrying with their idempotency keys): no acknowledged
  receipt lost, no half receipt (`verify` rebuilds every projection and finds it whole).

LOOPWARDEN_TEST_SCALE scales the todo count (e.g. 0.25 for a quick run, 2 for a longer one).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import BASIC_POLICY, OPERATOR, postgres_server
from mcp import Client
from support import (
    Served,
    assert_totals_match,
    bounded,
    cli,
    cli_env,
    codes,
    connect_http,
    kill_server,
    loop_entries,
    merkle_problems,
    mint_tokens,
    open_db,
    replay_grants,
    run_cli_app,
    scale,
    serving,
    spawn_server,
    start_server,
    stdio_params,
    stop_server,
    text_of,
    wait_listening,
)

from loopwarden.clients.agent import AgentClient, ToolCallError
from loopwarden.clock import ManualClock
from loopwarden.kernel.store.store import snapshot
from loopwarden.policy.budgets import Totals
from loopwarden.principals import Principal
from loopwarden.turns.claim import ClaimResult
from loopwarden.turns.update import UpdateResult

pytestmark = pytest.mark.anyio

TODOS = scale(200)
HTTP_AGENTS = [f"http-{n:02d}" for n in range(16)]
STDIO_AGENTS = [f"proc-{n}" for n in range(8)]
ALLOWED = ["fs.read", "fs.write", "tests.run", "git.diff"]
RUN_TIMEOUT = 60 + TODOS * 0.5  # seconds for one whole drain (bounded, scales with the load)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def crowd_policy(agents: list[str]) -> dict[str, Any]:
    """Room for everyone at once (max_active = agents), one lease each, budgets that never bind,
    and violations that refuse the turn without stopping the loop."""
    policy = copy.deepcopy(BASIC_POLICY)
    policy.update(
        agents=agents,
        budgets={
            "max_turns": 100_000,
            "max_model_calls": 10**9,
            "max_input_tokens": 10**12,
            "max_cost_usd": 1_000_000.0,
            "max_wall_seconds": 10**8,
        },
        claims={
            "lease_seconds": 900,
            "max_active": len(agents),
            "max_active_per_agent": 1,
            "max_attempts": 1000,
        },
        stop={"on_violation": "refuse_turn", "repeated_failure_limit": 1000},
        todos={"agents_may_add": False, "max_todos": 10_000},
    )
    return policy


@dataclass
class Tally:
    """What the agents saw, to compare with what the journal says."""

    turns: Counter[str] = field(default_factory=Counter)
    completed: list[str] = field(default_factory=list)
    refusals: Counter[str] = field(default_factory=Counter)
    waits: int = 0


async def work(agent: AgentClient, name: str, loop_id: str, tally: Tally, seed: int) -> None:
    """Claim and report until the loop is over. Every outcome is checked as it comes back."""
    rng = random.Random(seed)
    n = 0
    while True:
        grant = await agent.claim(loop_id)
        if not grant.granted:
            if grant.status != "active":
                return
            codes = {r.code for r in grant.reasons}
            assert codes == {"no_eligible_todo"}, (name, grant.reasons)
            tally.waits += 1
            await anyio.sleep(0.02)  # every open todo is held by someone right now
            continue
        assert grant.turn_id and grant.fence and grant.todo_id
        n += 1
        tally.turns[name] += 1
        if rng.random() < 0.1:
            beat = await agent.heartbeat(grant.turn_id, grant.fence)
            assert beat.renewed, beat.reasons
        usage = {
            "model_calls": rng.randint(1, 5),
            "input_tokens": rng.randint(0, 5000),
            "output_tokens": rng.randint(0, 800),
            "tool_calls": rng.randint(0, 9),
            "cost_usd": round(rng.uniform(0, 0.05), 6),
            "wall_seconds": round(rng.uniform(0, 30), 3),
        }
        tools = [{"name": rng.choice(ALLOWED), "count": rng.randint(1, 3)}]
        roll = rng.random()
        if roll < 0.05:  # completing without evidence: refused, nothing charged, turn stays open
            refused = await agent.update(
                grant.turn_id, grant.fence, "completed", "no proof", f"{name}-{n}-bare",
                usage=usage, tools_used=tools,
            )  # fmt: skip
            assert not refused.accepted
            assert {r.code for r in refused.reasons} == {"evidence_required"}
            tally.refusals["evidence_required"] += 1
            roll = 0.5  # then report properly
        if roll < 0.1:  # a denied tool: refused, charged, the turn closes, the loop goes on
            refused = await agent.update(
                grant.turn_id, grant.fence, "progress", "pushed", f"{name}-{n}",
                usage=usage, tools_used=[*tools, {"name": "git.push", "count": 1}],
            )  # fmt: skip
            assert not refused.accepted and refused.status == "active"
            assert {r.code for r in refused.reasons} == {"tool_denied"}
            tally.refusals["tool_denied"] += 1
            continue
        outcome = "completed" if roll < 0.8 else "progress" if roll < 0.95 else "failed"
        result = await agent.update(
            grant.turn_id,
            grant.fence,
            outcome,
            f"{outcome} {grant.todo_id} by {name}",
            f"{name}-{n}",
            usage=usage,
            tools_used=tools,
            evidence=[{"kind": "test", "summary": f"{name} #{n}"}],
            failure_signature=f"sig-{name}-{n}" if outcome == "failed" else None,
        )
        assert result.accepted, (name, result.reasons)
        expected = {"completed": "done", "progress": "open", "failed": "open"}[outcome]
        assert result.todo_status == expected, (name, outcome, result.todo_status)
        if outcome == "completed":
            tally.completed.append(grant.todo_id)
        if result.route == "stop":
            assert result.status == "completed", result.stop_reason
            return


def check_journal(
    home: Path, loop_id: str, todos: int, agents: list[str], tally: Tally, store: str | None = None
) -> str:
    """Everything the issue requires, proven from the signed receipts (in the home's file, or
    the store `store` names). Returns a summary."""
    with open_db(home) if store is None else snapshot(store) as reader:
        entries = loop_entries(reader, home, loop_id)  # seq 1..n, each signature verified
        replayed = replay_grants(entries)  # one live lease per todo, rising fences, chain
        loop = reader.loop_row(loop_id)
        assert merkle_problems(reader) == []
        assert_totals_match(loop.totals, replayed)
    assert loop.status == "completed", loop.stop_reason
    everything = {f"t{n}" for n in range(1, todos + 1)}
    assert set(replayed.completed) == everything
    assert set(replayed.completed.values()) == {1}, "a todo was completed twice"
    assert sorted(tally.completed) == sorted(everything), "agents saw a todo completed twice"
    assert set(replayed.reports.values()) == {1}, "a turn was reported twice"
    assert replayed.kinds["turn.claimed"] == sum(tally.turns.values())
    assert replayed.kinds["turn.refused"] == sum(tally.refusals.values())
    busy = [a for a in agents if tally.turns[a]]
    assert len(busy) >= len(agents) * 3 // 4, f"too little concurrency: {tally.turns}"
    assert replayed.max_open >= min(len(agents), 4), f"at most {replayed.max_open} leases at once"

    audit = cli("verify", "--json", "--home", str(home), *(("--store", store) if store else ()))
    assert audit.returncode == 0, audit.stdout + audit.stderr
    report = json.loads(audit.stdout)
    assert report["verdict"] == "clean" and report["tree_size"] >= len(entries)
    return (
        f"{todos} todos, {len(busy)}/{len(agents)} agents busy, "
        f"{replayed.kinds['turn.claimed']} grants, {len(entries)} receipts, "
        f"{replayed.max_open} leases open at once at most, "
        f"{sum(tally.refusals.values())} refusals, {tally.waits} waits, verify clean"
    )


# --- 16 agents, one HTTP server --------------------------------------------------------------


@pytest.fixture(scope="module")
def http_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, dict]]:
    """One `loopwarden serve --http` (default durability) with a token per agent and operator."""
    root = tmp_path_factory.mktemp("http-crowd")
    home = root / "home"
    tokens = mint_tokens(
        home, [(a, "agent") for a in HTTP_AGENTS] + [("alice", "operator"), ("solo", "agent")]
    )
    served = start_server(home, root / "logs", env=cli_env(synchronous=None))  # default: FULL
    try:
        yield served, tokens
    finally:
        stop_server(served)


async def drain(
    urls: list[str], tokens: dict[str, Any], loop_id: str, seeds: int
) -> tuple[Tally, float]:
    """Open `loop_id` (TODOS todos) as alice, then let the 16 HTTP agents drain it, agent n on
    `urls[n % len(urls)]`; returns what they saw and the seconds the drain took."""
    async with connect_http(urls[0], tokens["alice"].token) as alice:
        opened = await alice.open_loop(
            f"drain {loop_id}",
            crowd_policy(HTTP_AGENTS),
            [{"title": f"item {n}"} for n in range(1, TODOS + 1)],
            loop_id=loop_id,
        )
    assert opened.todos == TODOS
    tally = Tally()
    began = time.monotonic()

    async def agent(name: str, n: int) -> None:
        async with connect_http(urls[n % len(urls)], tokens[name].token) as me:
            await work(me, name, loop_id, tally, seeds + n)

    async with anyio.create_task_group() as group:
        for n, name in enumerate(HTTP_AGENTS):
            group.start_soon(agent, name, n)
    return tally, time.monotonic() - began


@bounded(RUN_TIMEOUT)
async def test_16_http_agents_drain_200_todos_without_a_double_grant_or_double_completion(
    http_world,
):
    served, tokens = http_world
    tally, elapsed = await drain([served.url], tokens, "crowd-http", seeds=0)
    summary = check_journal(served.home, "crowd-http", TODOS, HTTP_AGENTS, tally)
    print(f"\n[concurrency/http] 16 sessions, one server: {summary}; drained in {elapsed:.1f}s")


# --- 8 stdio server processes, one SQLite file -----------------------------------------------


@pytest.fixture(scope="module")
def stdio_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stdio-crowd")
    home = root / "home"
    policy = root / "policy.json"
    policy.write_text(json.dumps(crowd_policy(STDIO_AGENTS)))
    items = root / "todos.json"
    items.write_text(json.dumps([{"title": f"item {n}"} for n in range(1, TODOS + 1)]))
    opened = run_cli_app(
        "loop", "open", "--policy", str(policy), "--objective", "drain across processes",
        "--todos", str(items), "--id", "crowd-stdio", "--home", str(home), "--json",
    )  # fmt: skip
    assert opened.exit_code == 0, opened.output
    return home


@bounded(RUN_TIMEOUT)
@pytest.mark.slow  # a long fleet variant (make test-all); test_replicas holds it in make test
async def test_8_stdio_server_processes_on_one_sqlite_file_drain_200_todos_consistently(
    stdio_home,
):
    tally = Tally()
    ready = 0
    all_ready = anyio.Event()
    began = time.monotonic()

    async def agent(name: str, seed: int) -> None:
        nonlocal ready
        # Each agent spawns its own `loopwarden serve` (the SDK's stdio client) on the shared home;
        # the SDK terminates the process when the client closes, even on failure.
        async with Client(stdio_params(name, stdio_home, synchronous="full")) as client:
            ready += 1
            if ready == len(STDIO_AGENTS):
                all_ready.set()
            await all_ready.wait()  # start together, so the processes really contend
            await work(AgentClient(client), name, "crowd-stdio", tally, 100 + seed)

    async with anyio.create_task_group() as group:
        for seed, name in enumerate(STDIO_AGENTS):
            group.start_soon(agent, name, seed)
    elapsed = time.monotonic() - began
    summary = check_journal(stdio_home, "crowd-stdio", TODOS, STDIO_AGENTS, tally)
    print(f"\n[concurrency/stdio] 8 processes, one file: {summary}; drained in {elapsed:.1f}s")


# --- lease expiry under contention -----------------------------------------------------------


@bounded(60)
async def test_late_workers_get_stale_fence_and_their_successors_work_stands(home):
    """Six workers claim six todos; their leases run out; six others re-claim them; then all
    twelve report at once. The late six are refused `stale_fence` (charged, nothing else), the
    six successors are accepted, and the projection shows only the successors' work."""
    clock = ManualClock()
    late = [Principal(id=f"late-{n}", role="agent") for n in range(6)]
    fresh = [Principal(id=f"fresh-{n}", role="agent") for n in range(6)]
    policy = crowd_policy([p.id for p in late + fresh])
    policy["claims"]["lease_seconds"] = 60
    todos = [{"id": f"x{n}", "title": "x"} for n in range(6)]
    async with contextlib.AsyncExitStack() as stack:
        alice = await stack.enter_async_context(serving(home, clock, OPERATOR))
        await alice.open_loop("contended leases", policy, todos, loop_id="L")
        clients = {
            p.id: await stack.enter_async_context(serving(home, clock, p)) for p in late + fresh
        }

        async def claim_all(workers: list[Principal]) -> dict[str, ClaimResult]:
            grants: dict[str, ClaimResult] = {}

            async def grab(p: Principal) -> None:
                grants[p.id] = await clients[p.id].claim("L")

            async with anyio.create_task_group() as group:
                for p in workers:
                    group.start_soon(grab, p)
            assert all(g.granted for g in grants.values()), [g.reasons for g in grants.values()]
            assert sorted(g.todo_id for g in grants.values()) == [t["id"] for t in todos]
            return grants

        old = await claim_all(late)
        clock.advance(61)  # every lease is now past its expiry
        new = await claim_all(fresh)  # the first claim sweeps the expired leases
        by_todo = {g.todo_id: g for g in new.values()}
        for g in old.values():
            assert by_todo[g.todo_id].fence == g.fence + 1  # type: ignore[operator]

        results: dict[str, UpdateResult] = {}

        async def report(p: Principal, grant: ClaimResult) -> None:
            results[p.id] = await clients[p.id].update(
                grant.turn_id, grant.fence, "completed", f"done by {p.id}", f"k-{p.id}",
                evidence=[{"kind": "test", "summary": p.id}],
                usage={"model_calls": 1, "cost_usd": 0.5},
            )  # fmt: skip

        async with anyio.create_task_group() as group:  # late and fresh reports interleave
            for p in late + fresh:
                group.start_soon(report, p, (old | new)[p.id])
        state = await alice.projection("L")

    for p in late:
        refused = results[p.id]
        assert not refused.accepted and "stale_fence" in codes(refused), refused.reasons
        assert refused.todo_status in ("claimed", "done")  # whatever the successor made of it
    for p in fresh:
        assert results[p.id].accepted, results[p.id].reasons
    assert state.status == "completed"
    with open_db(home) as reader:  # every turn (the projection lists only the recent ones)
        turns = {t.turn_id: t for t in reader.loop_turns("L")}
    for p in fresh:
        turn = turns[new[p.id].turn_id]  # type: ignore[index]
        assert (turn.agent, turn.status, turn.outcome) == (p.id, "reported", "completed")
    for p in late:
        assert turns[old[p.id].turn_id].status == "expired"  # type: ignore[index]
    assert {t.todo_id: (t.status, t.fence) for t in state.todos} == {
        g.todo_id: ("done", g.fence) for g in new.values()
    }
    # The late reports were charged (the work happened) but changed nothing else.
    assert state.budgets["cost_usd"].used == pytest.approx(0.5 * 12)
    assert state.budgets["turns"].used == 12


# --- idempotent retries ----------------------------------------------------------------------


async def five_at_once(clients: list[Client], arguments: dict[str, Any]) -> list[dict[str, Any]]:
    answers: list[dict[str, Any]] = []

    async def send(client: Client) -> None:
        result = await client.call_tool("update", arguments)
        assert not result.is_error, text_of(result)
        answers.append(result.structured_content)

    async with anyio.create_task_group() as group:
        for client in clients:
            group.start_soon(send, client)
    return answers


def reports_of(home: Path, loop_id: str, turn_id: str) -> Counter[str]:
    with open_db(home) as reader:
        return Counter(
            e.body.kind for e in loop_entries(reader, home, loop_id) if e.body.turn_id == turn_id
        )


def retry_arguments(grant: ClaimResult, key: str) -> dict[str, Any]:
    return {
        "turn_id": grant.turn_id,
        "fence": grant.fence,
        "outcome": "completed",
        "summary": "once, however often it is sent",
        "idempotency_key": key,
        "usage": {"model_calls": 2, "cost_usd": 0.125},
        "tools_used": [{"name": "fs.write", "count": 1}],
        "evidence": [{"kind": "test", "summary": "ok"}],
    }


@bounded(60)
@pytest.mark.parametrize("sessions", [1, 5], ids=["one-session", "five-sessions"])
async def test_the_same_update_sent_5_times_at_once_over_http_seals_one_report(
    http_world, sessions
):
    served, tokens = http_world
    loop_id = f"retry-http-{sessions}"
    async with connect_http(served.url, tokens["alice"].token) as alice:
        await alice.open_loop("retries", crowd_policy(["solo"]), [{"title": "x"}], loop_id=loop_id)
    async with contextlib.AsyncExitStack() as stack:
        solo = [
            await stack.enter_async_context(connect_http(served.url, tokens["solo"].token))
            for _ in range(sessions)
        ]
        grant = await solo[0].claim(loop_id)
        assert grant.granted
        clients = [solo[n % sessions].client for n in range(5)]
        answers = await five_at_once(clients, retry_arguments(grant, f"retry-{sessions}"))
    assert len(answers) == 5 and all(a == answers[0] for a in answers), answers
    assert answers[0]["accepted"] is True
    kinds = reports_of(served.home, loop_id, grant.turn_id)
    assert kinds == {"turn.claimed": 1, "turn.reported": 1}, kinds
    with open_db(served.home) as reader:
        assert reader.loop_row(loop_id).totals.units("model_calls") == 2, "charged once"


@bounded(60)
async def test_the_same_update_sent_5_times_at_once_in_process_seals_one_report(home):
    clock = ManualClock()
    solo = Principal(id="solo", role="agent")
    async with serving(home, clock, OPERATOR) as alice, serving(home, clock, solo) as me:
        await alice.open_loop("retries", crowd_policy(["solo"]), [{"title": "x"}], loop_id="R")
        grant = await me.claim("R")
        answers = await five_at_once([me.client] * 5, retry_arguments(grant, "retry-mem"))
        assert all(a == answers[0] for a in answers) and answers[0]["accepted"]
        state = await alice.projection("R")
        assert state.budgets["model_calls"].used == 2
    assert reports_of(home, "R", grant.turn_id) == {"turn.claimed": 1, "turn.reported": 1}


# --- the checks themselves can fail ----------------------------------------------------------


@bounded(60)
async def test_the_journal_checks_catch_a_double_grant_a_gap_a_double_report_and_a_miscount(
    home,
):
    """Mutate a real journal one defect at a time: each check above must notice."""
    clock = ManualClock()
    solo = Principal(id="solo", role="agent")
    async with serving(home, clock, OPERATOR) as alice, serving(home, clock, solo) as me:
        await alice.open_loop("oracle", crowd_policy(["solo"]), [{"title": "x"}], loop_id="O")
        for n, outcome in enumerate(("progress", "completed")):  # the same todo, granted twice
            grant = await me.claim("O")
            result = await me.update(
                grant.turn_id, grant.fence, outcome, "s", f"o-{n}", evidence=[{"kind": "t", "summary": "s"}],
                usage={"model_calls": 1, "cost_usd": 0.25},
            )  # fmt: skip
            assert result.accepted
    with open_db(home) as reader:
        entries = loop_entries(reader, home, "O")
        totals = reader.loop_row("O").totals
    kinds = [e.body.kind for e in entries]
    assert kinds[:5] == [
        "loop.opened",
        "turn.claimed",
        "turn.reported",
        "turn.claimed",
        "turn.reported",
    ]
    clean = replay_grants(entries)
    assert_totals_match(totals, clean)
    assert clean.claims == {"t1": 2} and clean.completed == {"t1": 1}

    def with_data(entry, **changes):
        body = entry.body.model_copy(update={"data": entry.body.data.model_copy(update=changes)})
        return dataclasses.replace(entry, body=body)

    mutations = {
        "lease held twice": ([entries[0], entries[1], entries[3], entries[4]], "live lease"),
        "fence not rising": (
            [
                *entries[:3],
                with_data(entries[3], fence=entries[1].body.data.fence),
                *entries[4:],
            ],
            "fence",
        ),
        "reported twice": ([*entries[:3], entries[2], *entries[3:]], "closed twice"),
    }
    for name, (mutated, says) in mutations.items():
        with pytest.raises(AssertionError, match=says):
            replay_grants(mutated, chain=False)
        assert name
    # A todo completed twice replays, but is counted: check_journal requires exactly one.
    again = with_data(entries[3], fence=9, turn_id="turn-" + "9" * 20)
    twice = [*entries, again, with_data(entries[4], turn_id="turn-" + "9" * 20)]
    assert replay_grants(twice, chain=False).completed == {"t1": 2}
    # A todo completed twice replays, but is counted: check_journal requires exactly one.
    again = with_data(entries[3], fence=9, turn_id="turn-" + "9" * 20)
    twice = [*entries, again, with_data(entries[4], turn_id="turn-" + "9" * 20)]
    assert replay_grants(twice, chain=False).completed == {"t1": 2}
    with pytest.raises(AssertionError, match="seq gap"):
        replay_grants([entries[0], *entries[2:]])
    with pytest.raises(AssertionError, match="prev chain"):
        replay_grants(
            [
                *entries[:2],
                dataclasses.replace(
                    entries[2], body=entries[2].body.model_copy(update={"prev": None})
                ),
            ]
        )
    with pytest.raises(AssertionError):
        assert_totals_match(totals.plus(Totals(cost_micros=1)), clean)
    with pytest.raises(AssertionError):
        assert_totals_match(totals.minus(Totals(turns=1)), clean)


# --- replicas on one PostgreSQL database ---------------------------------------------------------

REPLICAS = 4


def pg_store() -> str:
    server = postgres_server()
    if server is None:
        pytest.skip("no PostgreSQL server (see the line at the start of the run)")
    return server.fresh_url("replicas")


def start_replicas(home: Path, logs: Path, store: str, count: int) -> list[Served]:
    """`count` `serve --http` processes on one store, started together, each listening."""
    spawned = [spawn_server(home, logs, "--store", store) for _ in range(count)]
    return [wait_listening(served, port) for served, port in spawned]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Served], dict, str]]:
    """4 replicas on one fresh PostgreSQL schema, a token per agent and the operator."""
    store = pg_store()
    root = tmp_path_factory.mktemp("replicas")
    home = root / "home"
    tokens = mint_tokens(home, [(a, "agent") for a in HTTP_AGENTS] + [("alice", "operator")], store)
    served = start_replicas(home, root / "logs", store, REPLICAS)
    try:
        yield served, tokens, store
    finally:
        for replica in served:
            stop_server(replica)


@bounded(RUN_TIMEOUT)
@pytest.mark.slow  # a long fleet variant (make test-all); test_replicas holds it in make test
async def test_4_replicas_on_one_postgresql_database_drain_200_todos_with_16_agents(replicas):
    served, tokens, store = replicas
    tally, elapsed = await drain([r.url for r in served], tokens, "crowd-pg", seeds=200)
    home = served[0].home
    summary = check_journal(home, "crowd-pg", TODOS, HTTP_AGENTS, tally, store)
    print(f"\n[concurrency/replicas] 16 agents, {REPLICAS} replicas: {summary}; {elapsed:.1f}s")


RETRIED = {"store_error", "store_unavailable", "store_busy", "commit_unknown", "internal_error"}


@dataclass
class Acknowledged:
    """Every receipt a replica answered with, and how often a call had to be retried."""

    receipts: set[str] = field(default_factory=set)
    completed: Counter[str] = field(default_factory=Counter)
    retries: int = 0


async def _kill_loop(
    home: Path, logs: Path, store: str, live: list[Served], kills: int, stop: anyio.Event
) -> None:
    """SIGKILL a random replica every so often (agents are mid-call), start a new one."""
    rng = random.Random(7)
    try:
        for _ in range(kills):
            await anyio.sleep(rng.uniform(0.3, 0.9))
            victim = live.pop(rng.randrange(len(live)))
            kill_server(victim)
            fresh = await anyio.to_thread.run_sync(start_replicas, home, logs, store, 1)
            live.append(fresh[0])
    finally:
        stop.set()


async def _killed_agent(
    name: str, token: str, live: list[Served], stop: anyio.Event, seen: Acknowledged
) -> None:
    """Claim and complete until `stop`, every call retried (same idempotency key) on any live
    replica until one answers: a lost connection never makes the agent act twice."""
    rng = random.Random(name)

    async def call(make: Any) -> Any:
        for _ in range(60):
            try:
                with anyio.fail_after(20):
                    async with connect_http(rng.choice(live).url, token) as me:
                        return await make(me)
            except ToolCallError as exc:
                if exc.code not in RETRIED:
                    raise
            except Exception:  # the replica died under the call: try another
                pass
            seen.retries += 1
            await anyio.sleep(0.05)
        raise AssertionError(f"{name}: no replica answered 60 times in a row")

    n = 0
    while not stop.is_set():
        n += 1
        key = f"{name}-{n}"
        grant = await call(lambda me, key=key: me.claim("killed", idempotency_key=f"{key}-claim"))
        seen.receipts.add(grant.receipt_id)
        assert grant.granted, grant.reasons
        result = await call(
            lambda me, grant=grant, key=key: me.update(
                grant.turn_id,
                grant.fence,
                "completed",
                "done",
                f"{key}-report",
                usage={"model_calls": 1, "cost_usd": 0.01},
                evidence=[{"kind": "test", "summary": "green"}],
            )
        )
        assert result.accepted, result.reasons
        seen.receipts.add(result.receipt_id)
        seen.completed[grant.todo_id] += 1


@pytest.mark.parametrize("kills", [3, pytest.param(15, marks=pytest.mark.slow)])
async def test_sigkilled_replicas_lose_no_acknowledged_receipt_and_leave_no_half_receipt(
    tmp_path, kills
):
    store = pg_store()
    home, logs = tmp_path / "home", tmp_path / "logs"
    agents = [f"k-{n}" for n in range(8)]
    specs = [(a, "agent") for a in agents] + [("alice", "operator")]
    tokens = await anyio.to_thread.run_sync(mint_tokens, home, specs, store)  # runs its own loop
    live = await anyio.to_thread.run_sync(start_replicas, home, logs, store, 3)
    seen, stop = Acknowledged(), anyio.Event()
    try:
        with anyio.fail_after(60 + kills * 20):
            async with connect_http(live[0].url, tokens["alice"].token) as alice:
                await alice.open_loop(
                    "work through crashes",
                    crowd_policy(agents),
                    [{"title": f"item {n}"} for n in range(1, 2001)],
                    loop_id="killed",
                )
            async with anyio.create_task_group() as group:
                group.start_soon(_kill_loop, home, logs, store, live, kills, stop)
                for name in agents:
                    group.start_soon(_killed_agent, name, tokens[name].token, live, stop, seen)
    finally:
        for replica in live:
            stop_server(replica)
    assert seen.retries > 0, "no call was cut by a kill: the test proved nothing"
    with snapshot(store) as reader:
        stored = {row.receipt_id for row in reader.loop_journal("killed")}
        lost = seen.receipts - stored
        assert not lost, f"{len(lost)} acknowledged receipts are not in the journal"
        entries = loop_entries(reader, home, "killed")  # every one whole and verified
        replayed = replay_grants(entries)  # seq 1..n, prev chain, one lease per todo
        assert merkle_problems(reader) == []
        loop = reader.loop_row("killed")
        assert_totals_match(loop.totals, replayed)
    assert set(replayed.completed.values()) <= {1}, "a todo was completed twice"
    assert dict(replayed.completed) == dict(seen.completed)
    audit = cli("verify", "--json", "--home", str(home), "--store", store)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    print(
        f"\n[concurrency/sigkill] {kills} replicas killed mid-write: {len(seen.receipts)} "
        f"acknowledged receipts all kept, {seen.retries} calls retried, verify clean"
    )
