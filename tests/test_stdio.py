"""A real `loopwarden serve` over stdio, driven by the MCP SDK's stdio client.

The operator opens a loop with the CLI; the agent's server is a separate process on the same
data home, exactly as a desktop MCP client would launch it. Every subprocess is bounded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.text import TextReceiveStream
from conftest import BASIC_POLICY
from support import cli, cli_env, initialize_request, loopwarden

from loopwarden.clients.agent import AgentClient, ToolCallError
from loopwarden.tool_errors import error_of
from loopwarden.turns.claim import ClaimResult
from loopwarden.turns.update import UpdateResult

pytestmark = pytest.mark.anyio

SESSION_TIMEOUT = 90  # seconds, for a whole stdio session
EVIDENCE = [{"kind": "test", "summary": "all green"}]
LEAKS = re.compile(r"Traceback|File \"|site-packages|\.py\b")


def write_policy(tmp_path: Path, **overrides: Any) -> Path:
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({**BASIC_POLICY, "agents": ["builder"], **overrides}))
    return path


def open_loop_with_cli(home: Path, policy: Path, loop_id: str, todos: list[str]) -> str:
    args = ["loop", "open", "--policy", str(policy), "--objective", "ship the feature"]
    for title in todos:
        args += ["--todo", title]
    done = cli(*args, "--id", loop_id, "--home", str(home), "--json")
    assert done.returncode == 0, done.stderr
    opened = json.loads(done.stdout)
    assert opened["loop_id"] == loop_id and opened["todos"] == len(todos)
    return opened["loop_id"]


async def report(agent: AgentClient, turn: ClaimResult, outcome: str, key: str, **fields: Any):
    assert turn.turn_id and turn.fence is not None
    return await agent.update(
        turn.turn_id,
        turn.fence,
        outcome,
        f"{outcome} on {turn.todo_id}",
        key,
        **{
            "tools_used": [{"name": "fs.write", "count": 2}, {"name": "tests.run", "count": 1}],
            "usage": {"model_calls": 2, "input_tokens": 900, "output_tokens": 150, "cost_usd": 0.1},
            "evidence": EVIDENCE,
            **fields,
        },
    )


async def test_a_full_governed_loop_over_stdio_ends_in_a_sealed_policy_stop(home, tmp_path):
    loop_id = open_loop_with_cli(home, write_policy(tmp_path), "web-1", ["a", "b", "c", "d"])

    with anyio.fail_after(SESSION_TIMEOUT):
        async with AgentClient.stdio("builder", home) as agent:
            assert agent.client.instructions and "claim" in agent.client.instructions
            quota = await agent.quota(loop_id)
            assert quota.allowed and quota.status == "active"

            accepted = []
            for n in range(3):  # update ×3, each accepted and routed on
                turn = await agent.claim(loop_id)
                assert turn.granted, turn.reasons
                outcome = "progress" if n == 0 else "completed"
                result = await report(agent, turn, outcome, f"ok-{n}")
                assert result.accepted and result.reasons == [], result.reasons
                assert result.route == "continue" and result.status == "active"
                accepted.append(result)
            assert accepted[-1].budgets["model_calls"].used == 6

            turn = await agent.claim(loop_id)
            assert turn.granted and "git.push" in turn.denied_tools
            refused = await report(
                agent, turn, "progress", "push-1", tools_used=[{"name": "git.push", "count": 1}]
            )
            assert not refused.accepted
            assert {r.code for r in refused.reasons} == {"tool_denied"}
            assert (refused.route, refused.status, refused.stop_reason) == (
                "stop",
                "stopped",
                "policy_violation",
            )

            state = await agent.projection(loop_id)
            assert state.status == "stopped" and state.stop_reason == "policy_violation"
            assert state.attention.who == "human" and state.active_leases == []
            kinds = [r.kind for r in state.recent_receipts]
            assert "turn.refused" in kinds and "loop.stopped" in kinds

            sealed = await agent.receipt(refused.receipt_id)
            assert sealed.kind == "turn.refused" and sealed.verified and sealed.problems == []
            assert sealed.body["principal"] == {"id": "builder", "role": "agent"}
            assert sealed.body["decision"]["effect"] == "deny"
            proof = sealed.inclusion_proof
            assert proof.verified and proof.tree_size == sealed.checkpoint.size
            assert sealed.checkpoint.verified

            again = await agent.claim(loop_id)
            assert not again.granted and "loop_not_active" in {r.code for r in again.reasons}

    audit = cli("verify", "--home", str(home), "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr


async def test_stdio_errors_are_clean_and_identity_comes_from_the_launch_config(home, tmp_path):
    loop_id = open_loop_with_cli(home, write_policy(tmp_path), "web-2", ["a"])
    with anyio.fail_after(SESSION_TIMEOUT):
        async with AgentClient.stdio("builder", home) as agent:
            with pytest.raises(ToolCallError, match="forbidden"):
                await agent.open_loop("take over", BASIC_POLICY)
            with pytest.raises(ToolCallError, match="not_found"):
                await agent.quota("no-such-loop")
            with pytest.raises(ToolCallError, match="agent"):
                await agent.raw("claim", ClaimResult, loop_id=loop_id, agent="alice")
            turn = await agent.claim(loop_id)
            assert turn.granted
            # JSON has no NaN; whatever the client sends for it must be refused, not charged.
            with pytest.raises(ToolCallError, match="cost_usd") as nan:
                await agent.raw(
                    "update",
                    UpdateResult,
                    turn_id=turn.turn_id,
                    fence=turn.fence,
                    outcome="progress",
                    summary="nan",
                    idempotency_key="nan-1",
                    usage={"cost_usd": float("nan")},
                )
            assert not LEAKS.search(str(nan.value)), str(nan.value)
            state = await agent.projection(loop_id)
            assert state.budgets["cost_usd"].used == 0
            claimed = await agent.receipt(turn.receipt_id)
            assert claimed.body["principal"] == {"id": "builder", "role": "agent"}


async def test_a_tool_error_is_readable_by_a_client_that_validates_every_result(home, tmp_path):
    """MCP: structured content MUST conform to the tool's output schema, and strict clients
    check it on error results too, so an error carries its code in the text and `_meta` only."""
    open_loop_with_cli(home, write_policy(tmp_path), "web-3", ["a"])
    with anyio.fail_after(SESSION_TIMEOUT):
        async with AgentClient.stdio("builder", home) as agent:
            calls = {
                "quota": ({"loop_id": "nope"}, "not_found: no loop with id 'nope'"),
                "open_loop": ({"objective": "x", "policy": BASIC_POLICY}, "forbidden: "),
            }
            for tool, (arguments, expected) in calls.items():
                result = await agent.client.call_tool(tool, arguments)
                assert result.is_error and result.structured_content is None, result
                text = " ".join(getattr(c, "text", "") for c in result.content)
                assert text.startswith(expected), text
                assert error_of(result) == tuple(text.split(": ", 1)), result.meta


async def test_serve_writes_only_json_rpc_to_stdout(home):
    """Raw stdio: every byte the server writes to stdout, until it exits, is protocol."""
    requests = [
        initialize_request("raw-test"),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "quota", "arguments": {"loop_id": "nope"}},
        },
    ]
    command = loopwarden("serve", "--agent", "builder")
    output = ""
    with anyio.fail_after(SESSION_TIMEOUT):
        async with await anyio.open_process(
            [*command, "--home", str(home)], env=cli_env()
        ) as process:
            assert process.stdin and process.stdout
            await process.stdin.send("".join(json.dumps(m) + "\n" for m in requests).encode())
            async for chunk in TextReceiveStream(process.stdout):
                output += chunk
                if '"id":3' in output.replace(" ", "") and output.endswith("\n"):
                    break
            await process.stdin.aclose()  # EOF: the server shuts down
            async for chunk in TextReceiveStream(process.stdout):
                output += chunk  # anything flushed at exit must be protocol too
            assert await process.wait() == 0
    messages = [json.loads(line) for line in output.splitlines()]  # fails on any stray text
    assert all(m.get("jsonrpc") == "2.0" for m in messages)
    by_id = {m["id"]: m for m in messages if "id" in m}
    assert by_id[1]["result"]["serverInfo"]["name"] == "loopwarden"
    assert len(by_id[2]["result"]["tools"]) == 10
    assert by_id[3]["result"]["isError"] is True
    assert "store_missing" in by_id[3]["result"]["content"][0]["text"]  # no store in that home


def test_serve_without_an_agent_exits_2_with_a_message_on_stderr_only(home):
    done = cli("serve", "--home", str(home))
    assert done.returncode == 2
    assert done.stdout == "", "stdout is the protocol channel: nothing else may go there"
    message = " ".join(done.stderr.split())
    assert "--agent" in message and "LOOPWARDEN_AGENT" in message
    assert "Traceback" not in done.stderr


async def test_serve_on_a_home_without_a_store_makes_none_and_says_so_to_the_agent(tmp_path):
    """A mistyped home: no empty store is made (nor keys), and every call names the problem
    instead of answering each loop `not_found`."""
    from loopwarden.clients.agent import AgentClient, ToolCallError

    home = tmp_path / "mistyped"
    async with AgentClient.stdio("builder", home) as agent:
        with pytest.raises(ToolCallError) as refused:
            await agent.quota("L1")
    assert refused.value.code == "store_missing"
    assert "there is no loopwarden store" in refused.value.message
    assert "loopwarden loop open --home" in refused.value.message
    assert not (home / "loopwarden.db").exists() and not (home / "keys").exists()
