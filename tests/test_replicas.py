"""Both protocol versions over streamable HTTP (issue 25): stateless replicas under 2026-07-28.

Two real `serve --http` replicas that share nothing but the store and the configured keys (on
SQLite one home; on PostgreSQL two homes, the second holding only a copy of the first's key
directory). With MCP 2026-07-28 every request stands alone: an agent claims on one replica and
reports on the other, no response carries a session, and a multi-round-trip request started on
one replica (an approval link: `input_required` with sealed `requestState`) is finished on the
other. With 2025-11-25 (today's Claude Code) nothing changes: one session, on one replica.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from conftest import postgres_server
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, ElicitResult, InputRequiredResult
from support import (
    EVIDENCE,
    Served,
    Token,
    bounded,
    cli_open_loop,
    make_policy,
    mint_tokens,
    start_server,
    stop_server,
)

from loopwarden.clients.agent import AgentClient

pytestmark = pytest.mark.anyio

POLICY = make_policy(
    agents=["builder"],
    tools={"allow": ["fs.*"], "approval": ["deploy.*"]},
    claims={"max_active_per_agent": 3},
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[list[Served], Token]]:
    root = tmp_path_factory.mktemp(f"replicas-{request.param}")
    home_a = root / "a"
    store: list[str] = []
    if request.param == "postgresql":
        server = postgres_server()
        if server is None:
            pytest.skip("no PostgreSQL server (see the line at the start of the run)")
        store = ["--store", server.fresh_url("stateless")]
    token = mint_tokens(home_a, [("builder", "agent")], store[1] if store else None)["builder"]
    home_b = home_a
    if store:  # the second replica has the keys and nothing else
        home_b = root / "b"
        home_b.mkdir()
        shutil.copytree(home_a / "keys", home_b / "keys")
    cli_open_loop(home_a, "shared", POLICY, ("one", "two", "three"), *store)
    served = [start_server(home, root / "logs", *store) for home in (home_a, home_b)]
    try:
        yield served, token
    finally:
        for replica in served:
            stop_server(replica)


class Recorded:
    """An SDK client over streamable HTTP that keeps every response's headers."""

    def __init__(self, url: str, token: str, **options: Any) -> None:
        self.headers: list[httpx2.Headers] = []

        async def keep(response: httpx2.Response) -> None:
            self.headers.append(response.headers)

        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            event_hooks={"response": [keep]},
        )
        self.client = Client(streamable_http_client(url, http_client=http), **options)

    @property
    def sessions(self) -> set[str]:
        return {h["mcp-session-id"] for h in self.headers if "mcp-session-id" in h}


@bounded(90)
async def test_a_2026_agent_claims_on_one_replica_and_reports_on_the_other(pair):
    (a, b), token = pair
    on_a, on_b = (
        Recorded(a.url, token.token, mode="2026-07-28"),
        Recorded(b.url, token.token, mode="2026-07-28"),
    )
    async with on_a.client as raw_a, on_b.client as raw_b:
        turn = await AgentClient(raw_a).claim("shared")
        assert turn.granted
        report = await AgentClient(raw_b).update(
            turn.turn_id, turn.fence, "completed", "done", "k-replica", evidence=EVIDENCE
        )
        assert report.accepted, report.reasons
    assert on_a.headers and on_b.headers
    assert on_a.sessions == on_b.sessions == set()  # no session anywhere: any replica answers


async def accept(context: Any, params: Any) -> ElicitResult:
    return ElicitResult(action="accept")


@bounded(90)
async def test_a_multi_round_trip_request_started_on_one_replica_finishes_on_the_other(pair):
    (a, b), token = pair
    declares_url_mode = {"elicitation_callback": accept}  # the loop is driven by hand below
    async with Recorded(a.url, token.token, mode="2026-07-28", **declares_url_mode).client as raw_a:
        turn = await AgentClient(raw_a).claim("shared")
        assert turn.granted
        args = {
            "turn_id": turn.turn_id,
            "fence": turn.fence,
            "tool": "deploy.prod",
            "summary": "ship",
        }
        first = await raw_a.session.call_tool("request_approval", args, allow_input_required=True)
    assert isinstance(first, InputRequiredResult)
    (ask,) = first.input_requests.values()
    assert ask.params.mode == "url" and "/approvals/appr-" in ask.params.url
    assert first.request_state and "appr-" not in first.request_state  # sealed, not readable
    async with Recorded(b.url, token.token, mode="2026-07-28").client as raw_b:
        done = await raw_b.session.call_tool(
            "request_approval", args,
            input_responses={key: ElicitResult(action="accept") for key in first.input_requests},
            request_state=first.request_state, allow_input_required=True,
        )  # fmt: skip
        assert isinstance(done, CallToolResult) and not done.is_error, done
        assert done.structured_content["status"] == "pending"
        assert ask.params.url.endswith(done.structured_content["approval_id"])
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await raw_b.session.call_tool(
                "request_approval", {**args, "summary": "another"},  # state bound to its request
                request_state=first.request_state, allow_input_required=True,
            )  # fmt: skip


@bounded(90)
async def test_a_2025_client_keeps_its_session_on_one_replica(pair):
    (a, _), token = pair
    legacy = Recorded(a.url, token.token, mode="legacy")
    async with legacy.client as raw:
        assert raw.protocol_version == "2025-11-25"
        agent = AgentClient(raw)
        turn = await agent.claim("shared")
        assert turn.granted, turn.reasons
        report = await agent.update(turn.turn_id, turn.fence, "progress", "half", "k-legacy")
        assert report.accepted, report.reasons
    assert len(legacy.sessions) == 1
