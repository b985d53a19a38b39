"""Security: input limits with clear errors, authorization between agents, secrets at rest and
in logs, key file permissions, binds and DNS-rebinding protection, hostile bytes on the wire, and
policy files that are wrong in every way one error at a time.

Complements test_mcp_inmemory.py (malformed arguments, operator tools refused to agents),
test_http.py (tokens: missing, wrong, revoked; 421/403 for a foreign Host/Origin; refused
non-loopback binds) and test_cli.py (policy check basics) without repeating them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import select
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import BASIC_POLICY, BUILDER, OPERATOR, REVIEWER
from support import (
    EVIDENCE,
    Served,
    Token,
    cli,
    cli_env,
    cli_open_loop,
    connect_http,
    db_bytes,
    initialize_request,
    loopwarden,
    mint_tokens,
    one_line,
    open_db,
    raw_initialize,
    run_cli_app,
    serving,
    start_server,
    stop_server,
    text_of,
)

from loopwarden.clients.agent import AgentClient, ToolCallError
from loopwarden.clock import ManualClock
from loopwarden.errors import InvalidInput
from loopwarden.kernel.log.keys import KeyStore
from loopwarden.server.settings import Settings
from loopwarden.server.transports import transport_security

pytestmark = pytest.mark.anyio

CLIENT = "security-test"  # clientInfo name of the bare initialize requests
LIMIT_POLICY = {
    **copy.deepcopy(BASIC_POLICY),
    "tools": {"allow": ["fs.*", "tests.run"], "deny": ["git.push"], "approval": ["deploy.*"]},
    "budgets": {"max_turns": 100_000},  # no usage budget: limit tests may charge the maximum
    "todos": {"agents_may_add": True, "max_todos": 50},
}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


# --- input limits ----------------------------------------------------------------------------


@dataclass
class Limits:
    operator: AgentClient
    builder: AgentClient
    home: Path
    turn: Any = None  # the builder's open turn, if any
    opened: int = 0

    async def open_turn(self) -> Any:
        if self.turn is None:
            self.turn = await self.builder.claim("LIM")
            assert self.turn.granted, self.turn.reasons
        return self.turn

    async def journal(self) -> int:
        with open_db(self.home) as reader:
            return reader.sealed_count()


@pytest.fixture(scope="module")
async def limits(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Limits]:
    home = tmp_path_factory.mktemp("limits") / "home"
    clock = ManualClock()
    async with serving(home, clock, OPERATOR) as operator, serving(home, clock, BUILDER) as builder:
        todos = [{"id": f"t{n}", "title": f"todo {n}"} for n in range(1, 21)]
        await operator.open_loop("limits", LIMIT_POLICY, todos, loop_id="LIM")
        yield Limits(operator, builder, home)


def update_args(turn: Any, key: str, **fields: Any) -> dict[str, Any]:
    arguments = {
        "turn_id": turn.turn_id,
        "fence": turn.fence,
        "outcome": "progress",  # the todo goes back: the next case gets a fresh turn
        "summary": "within limits",
        "idempotency_key": key,
    }
    return arguments | fields


def evidence(n: int, summary: str = "ok", **extra: Any) -> list[dict[str, Any]]:
    return [{"kind": "test", "summary": summary, **extra} for _ in range(n)]


_keys = iter(range(1_000_000))


def key() -> str:
    return f"limit-{next(_keys)}"


# (case id, field path the error must name, arguments at the limit, arguments over it)
UPDATE_LIMITS: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("summary", "summary", {"summary": "s" * 4000}, {"summary": "s" * 4001}),
    ("evidence-items", "evidence", {"evidence": evidence(32)}, {"evidence": evidence(33)}),
    (
        "evidence-summary",
        "evidence.0.summary",
        {"evidence": evidence(1, "e" * 2000)},
        {"evidence": evidence(1, "e" * 2001)},
    ),
    (
        "evidence-uri",
        "evidence.0.uri",
        {"evidence": evidence(1, uri="u" * 2048)},
        {"evidence": evidence(1, uri="u" * 2049)},
    ),
    (
        "evidence-total-bytes",
        "evidence",
        {"evidence": evidence(16, "e" * 2000, uri="u" * 2048)},  # 16 x 4052 = 64,832 bytes
        {"evidence": evidence(17, "e" * 2000, uri="u" * 2048)},  # 68,884 > 65,536
    ),
    (
        "evidence-total-utf8-bytes",
        "evidence",
        {"evidence": evidence(10, "€" * 2000)},  # 10 x 6,004 bytes, 20,000 characters
        {"evidence": evidence(11, "€" * 2000)},  # 66,044 bytes: counted in bytes, not characters
    ),
    (
        "tools-used-length",
        "tools_used",
        {"tools_used": [{"name": f"fs.t{n}", "count": 1} for n in range(64)]},
        {"tools_used": [{"name": f"fs.t{n}", "count": 1} for n in range(65)]},
    ),
    (
        "tool-count-max",
        "tools_used.0.count",
        {"tools_used": [{"name": "fs.read", "count": 1_000_000}]},
        {"tools_used": [{"name": "fs.read", "count": 1_000_001}]},
    ),
    (
        "tool-count-zero",
        "tools_used.0.count",
        {"tools_used": [{"name": "fs.read", "count": 1}]},
        {"tools_used": [{"name": "fs.read", "count": 0}]},
    ),
    (
        "tool-name-length",
        "tools_used.0.name",
        {"tools_used": [{"name": "fs." + "n" * 125, "count": 1}]},
        {"tools_used": [{"name": "fs." + "n" * 126, "count": 1}]},
    ),
    (
        "counter-max",
        "usage.input_tokens",
        {"usage": {"input_tokens": 10**12}},
        {"usage": {"input_tokens": 10**12 + 1}},
    ),
    (
        "counter-negative",
        "usage.model_calls",
        {"usage": {"model_calls": 0}},
        {"usage": {"model_calls": -1}},
    ),
    (
        "counter-float",
        "usage.tool_calls",
        {"usage": {"tool_calls": 3}},
        {"usage": {"tool_calls": 2.5}},
    ),
    (
        "cost-max",
        "usage.cost_usd",
        {"usage": {"cost_usd": 1e9}},
        {"usage": {"cost_usd": 1e9 + 1}},
    ),
    (
        "cost-negative",
        "usage.cost_usd",
        {"usage": {"cost_usd": 0.0}},
        {"usage": {"cost_usd": -0.01}},
    ),
    (
        "cost-infinite",
        "usage.cost_usd",
        {"usage": {"cost_usd": 0.5}},
        {"usage": {"cost_usd": float("inf")}},
    ),
    (
        "wall-nan",
        "usage.wall_seconds",
        {"usage": {"wall_seconds": 1.5}},
        {"usage": {"wall_seconds": float("nan")}},
    ),
    (
        "failure-signature",
        "failure_signature",
        {"failure_signature": "f" * 200},
        {"failure_signature": "f" * 201},
    ),
    (
        "approval-ids-length",
        "approval_ids",
        {},
        {"approval_ids": [f"appr-{n:020x}" for n in range(65)]},
    ),
    ("fence-negative", "fence", {}, {"fence": -1}),
    ("fence-beyond-2^53", "fence", {}, {"fence": 2**53 + 1}),
]


@pytest.mark.parametrize(
    ("field", "at_limit", "over_limit"),
    [case[1:] for case in UPDATE_LIMITS],
    ids=[case[0] for case in UPDATE_LIMITS],
)
async def test_update_limits_accept_the_limit_and_refuse_one_past_it_naming_the_field(
    limits, field, at_limit, over_limit
):
    turn = await limits.open_turn()
    before = await limits.journal()
    result = await limits.builder.client.call_tool("update", update_args(turn, key(), **over_limit))
    assert result.is_error
    text = text_of(result)
    assert text.startswith("invalid_input: "), text[:300]
    assert re.search(rf"(^|[:;] ){re.escape(field)}: ", text.split("invalid_input: ", 1)[1]), text
    assert "errors.pydantic.dev" not in text and "input_value" not in text
    assert await limits.journal() == before, "a call over a limit is rejected whole"

    accepted = await limits.builder.update(
        **update_args(turn, key(), **at_limit)  # type: ignore[arg-type]
    )
    assert accepted.accepted, accepted.reasons
    limits.turn = None


ID_FORMATS: list[tuple[str, str, Callable[[Any], dict[str, Any]]]] = [
    ("claim", "loop_id", lambda t: {"loop_id": "LIM/../x"}),
    ("claim", "loop_id", lambda t: {"loop_id": "L" * 65}),
    ("claim", "todo_id", lambda t: {"loop_id": "LIM", "todo_id": "t 1"}),
    ("claim", "idempotency_key", lambda t: {"loop_id": "LIM", "idempotency_key": "k" * 129}),
    ("claim", "idempotency_key", lambda t: {"loop_id": "LIM", "idempotency_key": "-leading"}),
    ("update", "turn_id", lambda t: update_args(t, key(), turn_id="turn-XYZ")),
    ("update", "turn_id", lambda t: update_args(t, key(), turn_id=t.turn_id.upper())),
    ("update", "approval_ids.0", lambda t: update_args(t, key(), approval_ids=["appr-1"])),
    ("update", "idempotency_key", lambda t: update_args(t, "k" * 129)),
    ("heartbeat", "turn_id", lambda t: {"turn_id": "t1", "fence": 1}),
    ("receipt", "receipt_id", lambda t: {"receipt_id": "rcpt-" + "0" * 23}),
    ("receipt", "receipt_id", lambda t: {"receipt_id": t.receipt_id.replace("rcpt-", "turn-")}),
    ("request_approval", "tool", lambda t: {**update_args(t, "x"), "tool": "rm -rf /"}),
    ("todo_add", "todo_id", lambda t: {"loop_id": "LIM", "title": "x", "todo_id": "a/b"}),
    ("todo_add", "depends_on.0", lambda t: {"loop_id": "LIM", "title": "x", "depends_on": [""]}),
    ("projection", "loop_id", lambda t: {"loop_id": ""}),
]


@pytest.mark.parametrize(
    ("tool", "field", "make"),
    ID_FORMATS,
    ids=[f"{tool}-{field}-{n}" for n, (tool, field, _) in enumerate(ID_FORMATS)],
)
async def test_ids_are_validated_by_format_before_any_lookup(limits, tool, field, make):
    turn = await limits.open_turn()
    arguments = make(turn)
    if tool == "request_approval":
        arguments = {k: arguments[k] for k in ("turn_id", "fence", "tool")} | {"summary": "s"}
    before = await limits.journal()
    text = text_of(result := await limits.builder.client.call_tool(tool, arguments))
    assert result.is_error
    assert text.startswith("invalid_input: "), text[:300]
    assert f"{field}: " in text and "not_found" not in text, text
    assert await limits.journal() == before


TEXT_LIMITS: list[tuple[str, str, str, Callable[[int], dict[str, Any]], int]] = [
    # (tool, caller, field, arguments for a length, the limit)
    ("todo_add", "builder", "title", lambda n: {"loop_id": "LIM", "title": "x" * n}, 500),
    (
        "request_approval",
        "builder",
        "summary",
        lambda n: {"tool": "deploy.prod", "summary": "s" * n},
        4000,
    ),
    (
        "open_loop",
        "operator",
        "objective",
        lambda n: {"objective": "o" * n, "policy": LIMIT_POLICY},
        4000,
    ),
    (
        "open_loop",
        "operator",
        "todos.0.title",
        lambda n: {"objective": "o", "policy": LIMIT_POLICY, "todos": [{"title": "t" * n}]},
        500,
    ),
    (
        "decide_approval",
        "operator",
        "reason",
        lambda n: {"approval_id": "appr-" + "0" * 20, "approve": False, "reason": "r" * n},
        4000,
    ),
]


@pytest.mark.parametrize(
    ("tool", "caller", "field", "make", "limit"),
    TEXT_LIMITS,
    ids=[f"{c[0]}-{c[2]}" for c in TEXT_LIMITS],
)
async def test_text_limits_of_the_other_tools_name_the_field(
    limits, tool, caller, field, make, limit
):
    who = getattr(limits, caller)
    turn = await limits.open_turn()
    turn_args = {"turn_id": turn.turn_id, "fence": turn.fence}
    arguments = (turn_args if tool == "request_approval" else {}) | make(limit + 1)
    before = await limits.journal()
    result = await who.client.call_tool(tool, arguments)
    text = text_of(result)
    assert result.is_error and f"invalid_input: {field}: " in text, text[:300]
    assert await limits.journal() == before
    at_limit = (turn_args if tool == "request_approval" else {}) | make(limit)
    if tool == "open_loop":
        limits.opened += 1
        at_limit["loop_id"] = f"LIM-{limits.opened}"
    result = await who.client.call_tool(tool, at_limit)
    if tool == "decide_approval":  # valid, so it gets as far as the lookup
        assert result.is_error and "not_found" in text_of(result)
    else:
        assert not result.is_error, text_of(result)[:300]


async def test_todo_counts_are_bounded_per_loop_and_per_call(limits):
    # open_loop: more todos than the policy's todos.max_todos
    too_many = [{"title": f"t{n}"} for n in range(51)]
    text = text_of(
        await limits.operator.client.call_tool(
            "open_loop", {"objective": "o", "policy": LIMIT_POLICY, "todos": too_many}
        )
    )
    assert "policy_invalid" in text and "todos.max_todos" in text, text
    # open_loop: more than the 100,000 any loop may hold, whatever the policy says
    ceiling = [{"title": "t"} for _ in range(100_001)]
    text = text_of(
        await limits.operator.client.call_tool(
            "open_loop", {"objective": "o", "policy": LIMIT_POLICY, "todos": ceiling}
        )
    )
    assert text.startswith("invalid_input: todos: "), text[:200]
    # todo_add: 32 dependencies are fine, 33 are not
    ok = await limits.builder.todo_add(
        "LIM", "many deps", depends_on=[f"t{n}" for n in range(1, 21)]
    )
    assert ok.added
    text = text_of(
        await limits.builder.client.call_tool(
            "todo_add", {"loop_id": "LIM", "title": "x", "depends_on": [f"t{n}" for n in range(33)]}
        )
    )
    assert "invalid_input: depends_on: " in text, text
    # todo_add beyond todos.max_todos: a sealed policy refusal, not an error
    state = await limits.operator.projection("LIM")
    for n in range(50 - sum(state.todo_counts.values())):
        assert (await limits.builder.todo_add("LIM", f"filler {n}")).added
    full = await limits.builder.todo_add("LIM", "one too many")
    assert not full.added and {r.code for r in full.reasons} == {"todo_limit"}
    assert full.receipt_id


async def test_error_messages_stay_short_whatever_the_input_size(limits):
    huge = "x" * (1 << 20)
    calls = [
        (limits.builder, "quota", {"loop_id": "LIM", huge: 1}),
        (
            limits.operator,
            "open_loop",
            {"objective": "o", "policy": {**LIMIT_POLICY, "tools": {"allow": [huge]}}},
        ),
        (limits.operator, "open_loop", {"objective": "o", "policy": {**LIMIT_POLICY, huge: 1}}),
        (
            limits.operator,
            "open_loop",
            {"objective": "o", "policy": {**LIMIT_POLICY, "agents": [huge]}},
        ),
    ]
    for who, tool, arguments in calls:
        result = await who.client.call_tool(tool, arguments)
        assert result.is_error
        assert len(text_of(result)) < 4096, f"{tool}: {len(text_of(result))} characters"


async def test_a_policy_with_100000_agents_or_patterns_is_refused(limits):
    for policy in (
        {**LIMIT_POLICY, "agents": [f"agent-{n}" for n in range(100_000)]},
        {**LIMIT_POLICY, "tools": {"allow": [f"fs.t{n}" for n in range(100_000)]}},
    ):
        result = await limits.operator.client.call_tool(
            "open_loop", {"objective": "o", "policy": policy}
        )
        assert result.is_error, "a policy this size must be refused, not sealed"


# --- authorization between agents ------------------------------------------------------------


@pytest.fixture
async def pair(home: Path) -> AsyncIterator[tuple[AgentClient, AgentClient, AgentClient]]:
    clock = ManualClock()
    async with (
        serving(home, clock, OPERATOR) as operator,
        serving(home, clock, BUILDER) as builder,
        serving(home, clock, REVIEWER) as reviewer,
    ):
        policy = {**LIMIT_POLICY, "budgets": {"max_turns": 10, "max_cost_usd": 5.0}}
        await operator.open_loop("two agents", policy, [{"title": "a"}, {"title": "b"}], "AUTH")
        yield operator, builder, reviewer


async def test_an_agent_cannot_report_heartbeat_or_ask_approval_on_another_agents_turn(home, pair):
    operator, builder, reviewer = pair
    mine = await builder.claim("AUTH")
    assert mine.granted and mine.turn_id and mine.fence

    stolen = await reviewer.update(
        mine.turn_id, mine.fence, "completed", "I did it", "steal-1",
        usage={"model_calls": 9, "cost_usd": 4.0}, evidence=EVIDENCE,
    )  # fmt: skip
    assert not stolen.accepted and {r.code for r in stolen.reasons} == {"not_turn_owner"}
    beat = await reviewer.heartbeat(mine.turn_id, mine.fence)
    assert not beat.renewed and {r.code for r in beat.reasons} == {"not_turn_owner"}
    asked = await reviewer.request_approval(mine.turn_id, mine.fence, "deploy.prod", "mine now")
    assert not asked.requested and asked.approval_id is None
    assert {r.code for r in asked.reasons} == {"not_turn_owner"}

    # Each refusal is sealed under the reviewer's name, and charges nothing.
    for receipt_id, kind in (
        (stolen.receipt_id, "turn.refused"),
        (beat.receipt_id, "request.refused"),
        (asked.receipt_id, "request.refused"),
    ):
        sealed = await operator.receipt(receipt_id)
        assert sealed.kind == kind and sealed.verified
        assert sealed.body["principal"] == {"id": "reviewer", "role": "agent"}
        assert sealed.body["decision"]["effect"] == "deny"
    refused = (await operator.receipt(stolen.receipt_id)).body["data"]
    assert (refused["charged"], refused["closes_turn"]) == (False, False)
    state = await operator.projection("AUTH")
    assert state.budgets["cost_usd"].used == 0 and state.budgets["model_calls"].used == 0
    assert state.approvals == []
    turn = next(t for t in state.turns if t.turn_id == mine.turn_id)
    assert (turn.agent, turn.status, turn.lease_expires_at) == (
        "builder",
        "open",
        mine.lease_expires_at,
    )

    # The owner's turn is untouched: its own report is accepted.
    done = await builder.update(
        mine.turn_id, mine.fence, "completed", "done", "mine-1", evidence=EVIDENCE
    )
    assert done.accepted, done.reasons


async def test_an_approval_granted_for_one_agents_turn_covers_nothing_for_another(home, pair):
    operator, builder, reviewer = pair
    mine = await builder.claim("AUTH")
    theirs = await reviewer.claim("AUTH")
    asked = await builder.request_approval(mine.turn_id, mine.fence, "deploy.prod", "ship")
    await operator.decide_approval(asked.approval_id, approve=True, expires_in_seconds=600)
    borrowed = await reviewer.update(
        theirs.turn_id, theirs.fence, "completed", "deployed with someone else's approval",
        "borrow-1", evidence=EVIDENCE, tools_used=[{"name": "deploy.prod", "count": 1}],
        approval_ids=[asked.approval_id],
    )  # fmt: skip
    assert not borrowed.accepted and "approval_invalid" in {r.code for r in borrowed.reasons}
    state = await operator.projection("AUTH")
    assert [(a.approval_id, a.status) for a in state.approvals] == [(asked.approval_id, "approved")]


async def test_an_agent_cannot_decide_an_approval_or_open_a_loop_and_nothing_is_sealed(home, pair):
    operator, builder, _ = pair
    mine = await builder.claim("AUTH")
    asked = await builder.request_approval(mine.turn_id, mine.fence, "deploy.prod", "ship")
    head = (await operator.projection("AUTH")).head.seq
    with pytest.raises(ToolCallError, match=r"^forbidden: "):
        await builder.decide_approval(asked.approval_id, approve=True)
    with pytest.raises(ToolCallError, match=r"^forbidden: "):
        await builder.open_loop("mine", LIMIT_POLICY, loop_id="AUTH-2")
    assert (await operator.projection("AUTH")).head.seq == head


# --- secrets: tokens and keys ----------------------------------------------------------------

DEBUG_SERVE = """\
import logging, sys
import loopwarden.server.transports as transports

def everything(level=logging.DEBUG):  # every logger, the SDK's and uvicorn's included
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")

transports.configure_logging = everything
from loopwarden.cli.root import main
main()
"""


@pytest.fixture(scope="module")
def debug_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, dict]]:
    """`loopwarden serve --http` with every logger at DEBUG, and tokens minted by the CLI."""
    root = tmp_path_factory.mktemp("secrets")
    home = root / "home"
    tokens = mint_tokens(home, [("builder", "agent"), ("doomed", "agent"), ("alice", "operator")])
    served = start_server(home, root / "logs", command=[sys.executable, "-c", DEBUG_SERVE, "serve"])
    try:
        yield served, tokens
    finally:
        stop_server(served)


async def test_tokens_are_never_logged_or_stored_in_clear_even_at_debug(debug_server):
    served, tokens = debug_server
    alice, builder, doomed = tokens["alice"], tokens["builder"], tokens["doomed"]
    async with connect_http(served.url, alice.token) as operator:
        await operator.open_loop(
            "secrets", LIMIT_POLICY | {"agents": ["builder"]}, [{"title": "a"}], loop_id="S"
        )
    async with connect_http(served.url, builder.token) as agent:
        grant = await agent.claim("S")
        assert grant.granted
        with pytest.raises(ToolCallError):
            await agent.quota("no-such-loop")
    near_miss = builder.token[:-1] + ("A" if builder.token[-1] != "A" else "B")
    for wrong in (near_miss, "lw_" + "z" * 43):
        assert (
            await raw_initialize(served.url, CLIENT, Authorization=f"Bearer {wrong}")
        ).status_code == 401
    revoked = run_revoke(served.home, doomed)
    assert (
        await raw_initialize(served.url, CLIENT, Authorization=f"Bearer {doomed.token}")
    ).status_code == 401
    assert revoked

    log = served.stderr()  # logging flushes every record; the WAL file is read too
    assert "DEBUG" in log, "the server was meant to log at DEBUG"
    stored = db_bytes(served.home)
    for token in (alice, builder, doomed):
        assert token.token not in log, f"{token.agent}'s token was logged"
        assert token.token.encode() not in stored, f"{token.agent}'s token is stored in clear"
        assert hashlib.sha256(token.token.encode()).hexdigest().encode() in stored  # what is kept
    for wrong in (near_miss, "lw_" + "z" * 43):
        assert wrong not in log


def run_revoke(home: Path, token: Token) -> bool:
    done = cli("token", "revoke", token.token_id, "--json", "--home", str(home))
    return done.returncode == 0 and token.token not in done.stdout + done.stderr


def test_a_fresh_home_is_private_even_under_a_permissive_umask(tmp_path):
    home = tmp_path / "home"
    command = loopwarden("token", "create", "--agent", "builder", "--json", "--home", str(home))
    done = subprocess.run(
        ["sh", "-c", 'umask 000 && exec "$@"', "sh", *command],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=cli_env(),
    )
    assert done.returncode == 0, done.stderr

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(home) == 0o700, oct(mode(home))
    assert mode(home / "keys") == 0o700, oct(mode(home / "keys"))
    private = sorted((home / "keys").glob("*.key"))  # the signing key and the integrity secret
    assert [p.name == "integrity.key" for p in private].count(True) == 1 and len(private) == 2
    assert {mode(p) for p in private} == {0o600}, [oct(mode(p)) for p in private]
    assert json.loads(done.stdout)["token"].encode() not in db_bytes(home)


@pytest.mark.parametrize("loose", [0o644, 0o640, 0o604], ids=["0644", "0640", "0604"])
def test_a_private_key_readable_by_others_is_refused_at_startup(tmp_path, loose):
    home = tmp_path / "home"
    assert run_cli_app("token", "create", "--agent", "x", "--home", str(home)).exit_code == 0
    key_file = next((home / "keys").glob("*.key"))
    key_file.chmod(loose)
    for args in (["serve", "--agent", "builder"], ["serve", "--http", "127.0.0.1:1"]):
        done = cli(*args, "--home", str(home))
        assert done.returncode == 1, (args, done.returncode, done.stderr)
        message = one_line(done.stderr)
        assert "readable by others" in message and "chmod 600" in message, message
        assert "Traceback" not in done.stderr and done.stdout == ""
    assert stat.S_IMODE(key_file.stat().st_mode) == loose, "refused, not silently changed"


def test_a_loosened_key_directory_is_made_private_again(tmp_path):
    home = tmp_path / "home"
    assert run_cli_app("token", "create", "--agent", "x", "--home", str(home)).exit_code == 0
    (home / "keys").chmod(0o755)
    home.chmod(0o755)
    assert run_cli_app("keys", "show", "--home", str(home)).exit_code == 0
    assert stat.S_IMODE((home / "keys").stat().st_mode) == 0o700
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert KeyStore(home).load_signer()  # and the key still loads


# --- binds and DNS rebinding -----------------------------------------------------------------


@pytest.mark.parametrize(
    "bind",
    [
        *("[::]:8765", "0:8765", "0.0.0.0:8765", "192.168.1.10:8765", "[::ffff:127.0.0.1]:8765"),
        *("localhost.evil.example:8765", "127.0.0.1.nip.io:8765", "LOCALHOST.:8765"),
    ],
)
def test_non_loopback_or_ambiguous_binds_need_allow_remote_and_keep_auth_and_rebinding_checks(
    tmp_path, bind
):
    with pytest.raises(InvalidInput, match="--allow-remote"):
        Settings.create(home=tmp_path, http=bind)
    told = Settings.create(home=tmp_path, http=bind, allow_remote=True)  # unless told
    assert told.auth and told.allow_remote
    assert transport_security(told.http[0]).enable_dns_rebinding_protection  # type: ignore[index]
    with pytest.raises(InvalidInput, match="loopback"):
        Settings.create(home=tmp_path, http=bind, no_auth=True, agent="a", allow_remote=True)


@pytest.mark.parametrize(
    "bind", ["127.0.0.1:8765", "127.8.9.10:8765", "localhost:8765", "[::1]:8765"]
)
def test_loopback_binds_are_accepted_with_auth_on(tmp_path, bind):
    settings = Settings.create(home=tmp_path, http=bind)
    assert settings.auth and settings.principal is None


@pytest.mark.parametrize(
    "host",
    [
        *("evil.example", "evil.example:{port}", "127.0.0.2:{port}", "[::2]:{port}"),
        *("127.0.0.1.evil.example:{port}", "localhost.evil.example:{port}"),
    ],
)
async def test_rebinding_style_host_headers_get_421(debug_server, host):
    served, tokens = debug_server
    port = served.url.split(":")[2].split("/")[0]
    response = await raw_initialize(
        served.url,
        CLIENT,
        Host=host.format(port=port),
        Authorization=f"Bearer {tokens['builder'].token}",
    )
    assert response.status_code == 421, (host, response.status_code)


@pytest.mark.parametrize(
    "origin",
    ["http://127.0.0.1.evil.example", "http://localhost.evil.example:1", "null", "file://"],
)
async def test_foreign_origins_get_403(debug_server, origin):
    served, tokens = debug_server
    response = await raw_initialize(
        served.url, CLIENT, Origin=origin, Authorization=f"Bearer {tokens['builder'].token}"
    )
    assert response.status_code == 403, (origin, response.status_code)


# --- hostile bytes on the wire ---------------------------------------------------------------


def raw_stdio_session(home: Path, lines: list[bytes], expect: set[int]) -> dict[int, Any]:
    """Send raw lines to `loopwarden serve` over stdio (after a proper handshake) and collect the
    answers until every id in `expect` is answered (bounded). Every byte on stdout must be
    JSON-RPC. The home gets a store (with another loop): an agent's server answers only
    `store_missing` in a home without one."""
    cli_open_loop(home, "other-loop", BASIC_POLICY)
    handshake = [
        json.dumps(initialize_request("raw", request_id=0)).encode(),
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
    ]
    process = subprocess.Popen(
        loopwarden("serve", "--agent", "builder", "--home", str(home)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=cli_env(),
    )
    assert process.stdin and process.stdout
    answers: dict[int, Any] = {}
    try:
        process.stdin.write(b"".join(line + b"\n" for line in handshake + lines))
        process.stdin.flush()
        deadline = time.monotonic() + 30
        while not expect <= set(answers):
            ready, _, _ = select.select(
                [process.stdout], [], [], max(deadline - time.monotonic(), 0)
            )
            assert ready, f"no answer for ids {sorted(expect - set(answers))}"
            message = json.loads(process.stdout.readline())  # stray text fails here
            assert message["jsonrpc"] == "2.0"
            answers[message.get("id")] = message
        process.stdin.close()
        assert process.wait(timeout=20) == 0
        return answers
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def tool_call(n: int, name: str, arguments: bytes) -> bytes:
    return (
        b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"%s","arguments":%s}}'
        % (
            n,
            name.encode(),
            arguments,
        )
    )


REPORT = b'"turn_id":"turn-00000000000000000000","fence":1,"outcome":"progress","idempotency_key":"k","summary":"s"'


def test_raw_json_nan_infinity_and_bad_utf8_are_refused_cleanly_over_stdio(home):
    """JSON has no NaN or Infinity, but Python's parsers accept the literals: they must be
    refused as non-finite, not charged. Invalid UTF-8 must not crash the server."""
    answers = raw_stdio_session(
        home,
        [
            tool_call(1, "update", b"{" + REPORT + b',"usage":{"cost_usd":NaN}}'),
            tool_call(2, "update", b"{" + REPORT + b',"usage":{"wall_seconds":-Infinity}}'),
            tool_call(3, "update", b"{" + REPORT + b',"usage":{"cost_usd":1e999}}'),
            tool_call(4, "update", b"{" + REPORT + b',"usage":{"model_calls":1e400}}'),
            tool_call(5, "update", b"{" + REPORT.replace(b'"s"', b'"\xff\xfe\xc0"') + b"}"),
            tool_call(6, "quota", b'{"loop_id":"x","loop_id":"y"}'),
            tool_call(7, "quota", b'{"loop_id":"' + b"x" * 3_000_000 + b'"}'),
        ],
        expect=set(range(8)),
    )
    results = [answers[n] for n in range(1, 8)]
    for n, name in ((0, "usage.cost_usd"), (1, "usage.wall_seconds"), (2, "usage.cost_usd")):
        text = results[n]["result"]["content"][0]["text"]
        assert results[n]["result"]["isError"] and f"{name}: " in text and "finite" in text, text
    assert "usage.model_calls" in results[3]["result"]["content"][0]["text"]
    for r in results[4:]:
        text = r["result"]["content"][0]["text"]
        assert r["result"]["isError"] and "Traceback" not in text, text[:300]


def test_unparsable_and_absurdly_nested_lines_leave_the_stdio_server_answering(home):
    """Lines the JSON-RPC layer cannot parse (the SDK drops them without an answer) must not
    take the server down: the next well-formed call is answered."""
    answers = raw_stdio_session(
        home,
        [
            b"not json at all",
            b"[" * 100_000 + b"]" * 100_000,
            tool_call(2, "quota", b'{"loop_id":' + b"[" * 300 + b"1" + b"]" * 300 + b"}"),
            tool_call(3, "update", b"{" + REPORT.replace(b'"s"', b'"\\ud800"') + b"}"),
            tool_call(9, "quota", b'{"loop_id":"nope"}'),
        ],
        expect={0, 9},
    )
    assert "not_found" in answers[9]["result"]["content"][0]["text"]
    for n in (2, 3):  # dropped by the SDK's JSON-RPC layer, or answered cleanly
        if n in answers:
            assert "Traceback" not in json.dumps(answers[n])


# --- policy files ----------------------------------------------------------------------------

VALID_TOML = """\
agents = ["builder"]
[tools]
allow = ["fs.*"]
deny = ["git.push"]
[budgets]
max_turns = 5
"""

BAD_POLICIES = [
    # (case, file name, text, what the single error must mention)
    ("toml-syntax", "p.toml", 'agents = ["builder"\n[budgets]\nmax_turns = 5\n', "malformed TOML"),
    ("toml-duplicate-key", "p.toml", VALID_TOML + "max_turns = 6\n", "malformed TOML"),
    ("yaml-syntax", "p.yaml", "agents: [builder\nbudgets: {max_turns: 5}\n", "malformed YAML"),
    ("yaml-tabs", "p.yaml", "agents:\n\t- builder\n", "malformed YAML"),
    ("yaml-not-a-mapping", "p.yaml", "- builder\n- reviewer\n", "mapping"),
    (
        "json-syntax",
        "p.json",
        '{"agents": ["builder"], "budgets": {"max_turns": 5},}',
        "malformed JSON",
    ),
    ("json-not-an-object", "p.json", "[1, 2, 3]", "mapping"),
    ("unknown-top-key", "p.toml", VALID_TOML + "surprise = 1\n", "surprise: unknown key"),
    (
        "unknown-nested-key",
        "p.yaml",
        "agents: [builder]\ntools: {alow: [fs.read]}\nbudgets: {max_turns: 5}\n",
        "tools.alow: unknown key",
    ),
    (
        "unknown-section-key",
        "p.json",
        '{"agents": ["b"], "budgets": {"max_turns": 5, "max_dollars": 3}}',
        "budgets.max_dollars: unknown key",
    ),
    ("glob-brackets", "p.toml", VALID_TOML.replace('"fs.*"', '"fs.[ab]"'), "tools.allow"),
    ("glob-space", "p.toml", VALID_TOML.replace('"fs.*"', '"fs read"'), "tools.allow"),
    ("glob-empty-segment", "p.toml", VALID_TOML.replace('"fs.*"', '"fs..read"'), "tools.allow"),
    ("glob-empty", "p.toml", VALID_TOML.replace('"git.push"', '""'), "tools.deny"),
    ("glob-too-long", "p.toml", VALID_TOML.replace('"fs.*"', '"' + "a" * 129 + '"'), "tools.allow"),
    (
        "allow-and-deny",
        "p.toml",
        VALID_TOML.replace('"git.push"', '"fs.*"'),
        "tools.allow and tools.deny",
    ),
    (
        "per-agent-above-total",
        "p.toml",
        VALID_TOML + "[claims]\nmax_active = 2\nmax_active_per_agent = 3\n",
        "claims.max_active_per_agent",
    ),
    (
        "rate-half-set",
        "p.toml",
        VALID_TOML + "[rate]\nturns_per_window = 10\n",
        "window_seconds",
    ),
    ("no-budget", "p.json", '{"agents": ["b"], "budgets": {}}', "budgets"),
    ("null-budget", "p.yaml", "agents: [b]\nbudgets: {max_turns: 5, max_cost_usd: null}\n", "null"),
    (
        "negative-budget",
        "p.toml",
        VALID_TOML.replace("max_turns = 5", "max_turns = -5"),
        "max_turns",
    ),
    (
        "string-budget",
        "p.json",
        '{"agents": ["b"], "budgets": {"max_turns": "ten"}}',
        "budgets.max_turns",
    ),
    ("agents-not-a-list", "p.json", '{"agents": "builder", "budgets": {"max_turns": 5}}', "agents"),
    ("bad-agent-id", "p.yaml", "agents: ['bob smith']\nbudgets: {max_turns: 5}\n", "agents"),
    (
        "deadline-without-zone",
        "p.toml",
        VALID_TOML + '[stop]\ndeadline = "2026-12-31T00:00:00"\n',
        "stop.deadline",
    ),
    (
        "unknown-enum",
        "p.toml",
        VALID_TOML + '[stop]\non_violation = "shrug"\n',
        "stop.on_violation",
    ),
]


@pytest.mark.parametrize(
    ("name", "text", "needle"), [c[1:] for c in BAD_POLICIES], ids=[c[0] for c in BAD_POLICIES]
)
def test_a_bad_policy_file_gets_one_clear_error_naming_the_field(tmp_path, name, text, needle):
    path = tmp_path / name
    path.write_text(text)
    result = run_cli_app("policy", "check", str(path))
    assert result.exit_code == 2, result.output
    message = one_line(result.stderr)
    assert message.count("error:") == 1, message
    assert message.startswith(f"error: {name}: "), message
    assert needle in message, message
    assert result.stdout == "" and "Traceback" not in result.output
    as_json = run_cli_app("policy", "check", str(path), "--json")
    assert as_json.exit_code == 2
    document = json.loads(as_json.stdout)
    assert document["error"] == "policy_invalid" and needle in document["message"]
    assert "\n" not in document["message"].strip() or name.endswith(".yaml")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("p.toml", VALID_TOML.replace('"fs.*"', '"fs read"')),
        ("p.yaml", "agents: [builder\nbudgets: {max_turns: 5}\n"),
    ],
    ids=["long-message", "yaml-problem-mark"],
)
def test_a_policy_error_is_one_physical_line_on_piped_stderr(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    done = cli("policy", "check", str(path))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize(
    ("name", "text", "verbatim"),
    [
        ("p.toml", VALID_TOML.replace('"fs.*"', '"[/x]"'), "[/x]"),
        ("p.toml", VALID_TOML.replace('"fs.*"', '"[bold]fs.read"'), "[bold]fs.read"),
        ("p.yaml", "agents: [builder\nbudgets: {max_turns: 5}\n", "expected ',' or ']'"),
    ],
    ids=["closing-tag", "style-tag", "yaml-bracket"],
)
def test_a_policy_error_quoting_brackets_is_printed_verbatim(tmp_path, name, text, verbatim):
    path = tmp_path / name
    path.write_text(text)
    result = run_cli_app("policy", "check", str(path))
    assert result.exit_code == 2, result.output
    assert verbatim in result.stderr, result.stderr
    assert "Traceback" not in result.output
