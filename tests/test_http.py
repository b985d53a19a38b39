"""A real `loopwarden serve --http` on a free loopback port, driven by the MCP SDK over HTTP.

Principals come from bearer tokens minted with `loopwarden token create`; the server checks
every request against the store, so a revoked token fails at once. Every wait is bounded:
servers must accept connections within `STARTUP_TIMEOUT`, every async test runs under
`anyio.fail_after(TEST_TIMEOUT)` (the `bounded` decorator), every subprocess has a timeout, and
every server is terminated by its fixture's finalizer.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import MCPError
from support import (
    CLI_TIMEOUT,
    EVIDENCE,
    MCP_HEADERS,
    Served,
    Token,
    bounded,
    cli,
    cli_env,
    cli_json,
    connect_http,
    free_port,
    initialize_request,
    loopwarden,
    make_policy,
    raw_initialize,
    start_server,
    stop_server,
)

from loopwarden.clients.agent import ToolCallError
from loopwarden.turns.claim import ClaimResult

pytestmark = pytest.mark.anyio

TEST_TIMEOUT = 60.0  # seconds for any one async test
CLIENT = "raw-http-test"  # clientInfo name of the bare initialize requests


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One authenticated server for the module (each test uses its own loop ids)."""
    root = tmp_path_factory.mktemp("http")
    served = start_server(root / "home", root / "logs")
    try:
        yield served
    finally:
        stop_server(served)


@pytest.fixture(scope="module")
def tokens(server: Served) -> dict[str, Token]:
    """Tokens minted with the CLI while the server runs (it reads them from the store)."""
    specs = [("builder", "agent"), ("reviewer", "agent"), ("alice", "operator")]
    running = [
        subprocess.Popen(
            loopwarden(
                "token",
                "create",
                "--agent",
                agent,
                "--role",
                role,
                "--json",
                "--home",
                str(server.home),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=cli_env(),
        )
        for agent, role in specs
    ]
    minted = {}
    for (agent, role), process in zip(specs, running, strict=True):
        out, err = process.communicate(timeout=CLI_TIMEOUT)
        assert process.returncode == 0, err
        issued = json.loads(out)
        assert (issued["agent"], issued["role"]) == (agent, role)
        assert issued["token"] and issued["token_id"].startswith("tok-")
        minted[agent] = Token(issued["token"], issued["token_id"], agent, role)
    return minted


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def loop_policy(agents: list[str], **claims: int) -> dict[str, Any]:
    return make_policy(agents=agents, claims=claims)


async def open_loop(
    server: Served, operator: Token, loop_id: str, todos: list[str], agents: list[str]
) -> None:
    async with connect_http(server.url, operator.token) as alice:
        opened = await alice.open_loop(
            "governed over http",
            loop_policy(agents, max_active_per_agent=1),
            [{"id": t, "title": f"todo {t}"} for t in todos],
            loop_id=loop_id,
        )
    assert (opened.loop_id, opened.status, opened.todos) == (loop_id, "active", len(todos))


# --- two agents, one loop --------------------------------------------------------------------


@bounded(TEST_TIMEOUT)
async def test_two_agents_with_their_own_tokens_finish_one_loop_without_doing_a_todo_twice(
    server, tokens
):
    todos = [f"t{n}" for n in range(1, 7)]
    await open_loop(server, tokens["alice"], "duo", todos, ["builder", "reviewer"])
    done: list[tuple[str, str, str, str]] = []  # (agent, todo, claim receipt, report receipt)
    first_claims = {"builder": anyio.Event(), "reviewer": anyio.Event()}

    async def work(agent: str) -> None:
        async with connect_http(server.url, tokens[agent].token) as me:
            other = "reviewer" if agent == "builder" else "builder"
            while True:
                turn = await me.claim("duo")
                if not turn.granted:
                    if turn.status != "active":
                        return
                    await anyio.sleep(0.02)  # nothing claimable right now: the other holds it
                    continue
                if not first_claims[agent].is_set():
                    first_claims[agent].set()
                    await first_claims[other].wait()  # both hold a lease at the same time
                assert turn.turn_id and turn.fence is not None
                result = await me.update(
                    turn.turn_id,
                    turn.fence,
                    "completed",
                    f"{agent} did {turn.todo_id}",
                    f"{agent}-{turn.todo_id}-{turn.fence}",
                    evidence=EVIDENCE,
                    tools_used=[{"name": "fs.write", "count": 1}],
                )
                assert result.accepted, result.reasons
                done.append((agent, turn.todo_id, turn.receipt_id, result.receipt_id))  # type: ignore[arg-type]
                if result.route == "stop":
                    return

    async with anyio.create_task_group() as group:
        group.start_soon(work, "builder")
        group.start_soon(work, "reviewer")

    per_todo = Counter(todo for _, todo, _, _ in done)
    assert sorted(per_todo) == todos and set(per_todo.values()) == {1}, per_todo
    assert {agent for agent, *_ in done} == {"builder", "reviewer"}
    async with connect_http(server.url, tokens["alice"].token) as alice:
        state = await alice.projection("duo")
        assert state.status == "completed" and state.todo_counts["done"] == len(todos)
        for agent, todo, claim_id, report_id in done:
            for receipt_id in (claim_id, report_id):
                sealed = await alice.receipt(receipt_id)
                assert sealed.verified and sealed.body["todo_id"] == todo
                assert sealed.body["principal"] == {"id": agent, "role": "agent"}

    # The operator's view of the same journal: every turn under its own token's principal.
    journal = cli_json("receipts", "duo", "--home", str(server.home))["receipts"]
    assert journal[0]["kind"] == "loop.opened" and journal[0]["principal"] == "alice"
    owners: dict[str, str] = {}
    for item in journal:
        assert item["verified"], item
        if item["kind"] == "turn.claimed":
            owners[item["turn_id"]] = item["principal"]
        elif item["kind"] == "turn.reported":
            assert item["principal"] == owners[item["turn_id"]]
    assert sorted(owners.values()) == sorted(agent for agent, *_ in done)


# --- authentication --------------------------------------------------------------------------


@bounded(TEST_TIMEOUT)
async def test_a_request_without_a_token_is_401(server):
    response = await raw_initialize(server.url, CLIENT)
    assert response.status_code == 401
    assert response.json()["error"] == "invalid_token"
    assert response.headers["www-authenticate"].startswith("Bearer")


@bounded(TEST_TIMEOUT)
@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer lw_not-a-real-token",
        "Bearer " + "lw_" + "x" * 300,
        "Bearer",
        "Basic YWxpY2U6cGFzc3dvcmQ=",
        "lw_no-scheme",
    ],
    ids=["unknown-token", "overlong-token", "empty-token", "basic-auth", "no-scheme"],
)
async def test_a_request_with_a_wrong_token_is_401(server, authorization):
    response = await raw_initialize(server.url, CLIENT, Authorization=authorization)
    assert response.status_code == 401


@bounded(TEST_TIMEOUT)
async def test_a_valid_token_is_accepted_and_a_revoked_one_is_refused_at_once(server, tokens):
    temp = cli_json("token", "create", "--agent", "temp-agent", "--home", str(server.home))
    ok = await raw_initialize(server.url, CLIENT, **bearer(temp["token"]))
    assert ok.status_code == 200, ok.text
    async with connect_http(server.url, temp["token"]) as agent:
        with pytest.raises(ToolCallError, match="not_found"):
            await agent.quota("no-such-loop")  # authenticated: the call reaches the tool
        revoked = cli_json("token", "revoke", temp["token_id"], "--home", str(server.home))
        assert revoked == {"token_id": temp["token_id"], "revoked": True}
        with pytest.raises(MCPError):  # the live session is cut off on its next request
            await agent.quota("no-such-loop")
    after = await raw_initialize(server.url, CLIENT, **bearer(temp["token"]))
    assert after.status_code == 401
    still = await raw_initialize(server.url, CLIENT, **bearer(tokens["builder"].token))
    assert still.status_code == 200, "revoking one token must not affect the others"


@bounded(TEST_TIMEOUT)
async def test_an_agent_token_calling_open_loop_is_forbidden(server, tokens):
    async with connect_http(server.url, tokens["builder"].token) as builder:
        with pytest.raises(ToolCallError, match="forbidden") as refused:
            await builder.open_loop("mine now", loop_policy(["builder"]), loop_id="grab")
        assert "operator" in str(refused.value)
        with pytest.raises(ToolCallError, match="not_found"):
            await builder.projection("grab")  # and nothing was opened
        with pytest.raises(ToolCallError, match="forbidden"):
            await builder.decide_approval("appr-" + "0" * 20, approve=True)


@bounded(TEST_TIMEOUT)
async def test_an_operator_token_can_open_a_loop_recorded_under_the_operator(server, tokens):
    async with connect_http(server.url, tokens["alice"].token) as alice:
        opened = await alice.open_loop(
            "opened over http", loop_policy(["builder"]), [{"title": "one"}], loop_id="op-1"
        )
        sealed = await alice.receipt(opened.receipt_id)
    assert sealed.kind == "loop.opened"
    assert sealed.body["principal"] == {"id": "alice", "role": "operator"}


@bounded(TEST_TIMEOUT)
async def test_a_tool_argument_cannot_change_the_tokens_principal(server, tokens):
    async with connect_http(server.url, tokens["alice"].token) as alice:
        await alice.open_loop(
            "who am i", loop_policy(["builder"]), [{"title": "x"}], loop_id="id-1"
        )
    async with connect_http(server.url, tokens["reviewer"].token) as reviewer:
        with pytest.raises(ToolCallError, match="agent"):
            await reviewer.raw("claim", ClaimResult, loop_id="id-1", agent="builder")
        with pytest.raises(ToolCallError, match="not_found") as hidden:
            await reviewer.claim("id-1")  # not its loop: answered as if it did not exist
        assert hidden.value.code == "not_found"
    journal = cli_json("receipts", "id-1", "--home", str(server.home))["receipts"]
    assert journal[-1]["kind"] == "claim.refused" and journal[-1]["principal"] == "reviewer"


@bounded(TEST_TIMEOUT)
async def test_resources_answer_for_the_tokens_principal(server, tokens):
    async with connect_http(server.url, tokens["alice"].token) as alice:
        await alice.open_loop("for reviewers", loop_policy(["reviewer"]), loop_id="res-r")
        await alice.open_loop("for builders", loop_policy(["builder"]), loop_id="res-b")
    async with connect_http(server.url, tokens["reviewer"].token) as reviewer:
        listed = json.loads(
            (await reviewer.client.read_resource("loopwarden://loops")).contents[0].text  # type: ignore[union-attr]
        )
        visible = {item["loop_id"] for item in listed["loops"]}
        assert "res-r" in visible and "res-b" not in visible
        with pytest.raises(MCPError, match="no loop with id 'res-b'"):
            await reviewer.client.read_resource("loopwarden://loops/res-b/projection")
        read = await reviewer.client.read_resource("loopwarden://loops/res-r/policy")
        assert json.loads(read.contents[0].text)["agents"] == ["reviewer"]  # type: ignore[union-attr]


# --- DNS-rebinding protection ----------------------------------------------------------------


@bounded(TEST_TIMEOUT)
async def test_a_foreign_host_header_gets_421_and_a_foreign_origin_403(server, tokens):
    auth = bearer(tokens["builder"].token)
    rebound = await raw_initialize(server.url, CLIENT, Host="evil.example", **auth)
    assert rebound.status_code == 421
    foreign = await raw_initialize(server.url, CLIENT, Origin="http://evil.example", **auth)
    assert foreign.status_code == 403
    local = await raw_initialize(server.url, CLIENT, Origin="http://localhost:1234", **auth)
    assert local.status_code == 200


# --- --no-auth -------------------------------------------------------------------------------


@pytest.fixture
def solo_server(tmp_path: Path) -> Iterator[Served]:
    home = tmp_path / "solo-home"
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(loop_policy(["solo"])))
    opened = cli_json(
        "loop", "open", "--policy", str(policy), "--objective", "solo work",
        "--todo", "a", "--todo", "b", "--id", "solo-1", "--home", str(home),
    )  # fmt: skip
    assert opened["loop_id"] == "solo-1"
    served = start_server(home, tmp_path / "logs", "--no-auth", "--agent", "solo")
    try:
        yield served
    finally:
        stop_server(served)


@bounded(TEST_TIMEOUT)
async def test_no_auth_serves_every_request_as_the_launch_agent(solo_server):
    async with connect_http(solo_server.url) as solo:  # no Authorization header at all
        turn = await solo.claim("solo-1")
        assert turn.granted, turn.reasons
        sealed = await solo.receipt(turn.receipt_id)
        assert sealed.body["principal"] == {"id": "solo", "role": "agent"}
        with pytest.raises(ToolCallError, match="forbidden"):
            await solo.open_loop("nope", loop_policy(["solo"]))
    async with connect_http(solo_server.url, "lw_someone-elses-token") as other:
        refused = await other.claim("solo-1")  # a header changes nothing: still solo
        assert not refused.granted and refused.reasons[0].code == "agent_lease_limit"
        sealed = await other.receipt(refused.receipt_id)
        assert sealed.body["principal"]["id"] == "solo"
    rebound = await raw_initialize(solo_server.url, CLIENT, Host="evil.example")
    assert rebound.status_code == 421, "DNS-rebinding protection stays on without auth"


# --- refused binds ---------------------------------------------------------------------------


def test_serve_on_a_non_loopback_address_without_allow_remote_exits_2(tmp_path):
    done = cli("serve", "--http", f"0.0.0.0:{free_port()}", "--home", str(tmp_path / "h"))
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert "non-loopback" in message and "--allow-remote" in message
    assert done.stdout == "" and "Traceback" not in done.stderr


def test_no_auth_on_a_non_loopback_address_is_refused_even_with_allow_remote(tmp_path):
    done = cli(
        "serve", "--http", f"0.0.0.0:{free_port()}", "--no-auth", "--agent", "solo",
        "--allow-remote", "--home", str(tmp_path / "h"),
    )  # fmt: skip
    assert done.returncode == 2
    assert "--no-auth" in " ".join(done.stderr.split()) and "loopback" in done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr


def test_serve_on_the_ipv6_loopback_requires_a_token(tmp_path):
    served = start_server(tmp_path / "home", tmp_path / "logs", host="::1")
    try:
        with httpx2.Client(timeout=10) as http:
            response = http.post(served.url, json=initialize_request(CLIENT), headers=MCP_HEADERS)
        assert response.status_code == 401
    finally:
        stop_server(served)
