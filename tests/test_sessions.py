"""Streamable-HTTP sessions against a hostile token holder, on a real `serve --http`.

One token used to be able to open sessions until the SDK's global cap (10,000) answered 503 to
everyone for 30 minutes, and revoking the token freed none of them. Now each principal has its
own limit (`--max-sessions`), idle sessions close after `--session-idle-timeout`, and a revoked
or expired token's sessions are closed by the server. Every wait is bounded; every server is
stopped by its finalizer.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import pytest
from support import (
    MCP_HEADERS,
    Served,
    Token,
    bounded,
    cli_json,
    connect_http,
    make_policy,
    mint_tokens,
    raw_initialize,
    run_cli_app,
    start_server,
    stop_server,
)

pytestmark = pytest.mark.anyio

LIMIT = 4  # --max-sessions for these servers
PROTOCOL = "2025-11-25"
CLOSE_WITHIN = 15.0  # seconds a revoked token's open stream may take to be closed


@dataclass
class World:
    served: Served
    tokens: dict[str, Token]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _open_loop(home: Path, tmp: Path, agents: list[str]) -> None:
    policy = tmp / "policy.json"
    policy.write_text(json.dumps(make_policy(agents=agents)))
    done = run_cli_app(
        "loop", "open", "--policy", str(policy), "--objective", "sessions",
        "--todo", "a", "--id", "S1", "--home", str(home), "--json",
    )  # fmt: skip
    assert done.exit_code == 0, done.output


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    home = tmp_path / "home"
    tokens = mint_tokens(home, [("flooder", "agent"), ("builder", "agent")])
    _open_loop(home, tmp_path, ["flooder", "builder"])
    served = start_server(home, tmp_path / "logs", "--max-sessions-per-principal", str(LIMIT))
    try:
        yield World(served, tokens)
    finally:
        stop_server(served)


async def open_session(url: str, token: str, name: str = "flood") -> str:
    """A bare `initialize` that opens a session (and never closes it): its id."""
    response = await raw_initialize(url, name, **bearer(token))
    assert response.status_code == 200, response.text
    return response.headers["mcp-session-id"]


@asynccontextmanager
async def event_stream(url: str, token: str, session: str) -> AsyncIterator[httpx2.Response]:
    """The session's standalone SSE stream (GET), held open until the server ends it."""
    headers = {**bearer(token), "mcp-session-id": session, "mcp-protocol-version": PROTOCOL}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10, read=CLOSE_WITHIN * 2)) as http:
        ready = await http.post(
            url,
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers={**MCP_HEADERS, **headers},
        )
        assert ready.status_code == 202, ready.text
        async with http.stream(
            "GET", url, headers={"Accept": "text/event-stream", **headers}
        ) as stream:
            assert stream.status_code == 200
            yield stream


async def drained(stream: httpx2.Response) -> bool:
    """True once the server has ended the stream (within CLOSE_WITHIN s), False if it had not."""
    with anyio.move_on_after(CLOSE_WITHIN):
        try:
            async for _ in stream.aiter_bytes():
                pass
        except httpx2.HTTPError:
            pass  # cut off mid-stream: ended all the same
        return True
    return False


@bounded(120)
async def test_a_token_at_its_session_limit_is_refused_clearly_and_nobody_else_is_affected(world):
    url, flooder = world.served.url, world.tokens["flooder"].token
    for n in range(LIMIT):
        await open_session(url, flooder, f"flood-{n}")
    over = await raw_initialize(url, "flood-over", **bearer(flooder))
    assert over.status_code == 429, over.text
    message = over.json()["error"]["message"]
    assert "too many open sessions" in message and "'flooder'" in message, message
    assert f"limit {LIMIT}" in message and "idle" in message, message
    # Another principal still initializes and calls a tool while the flooder sits at its limit.
    async with connect_http(url, world.tokens["builder"].token) as builder:
        assert (await builder.quota("S1")).allowed
    for n in range(LIMIT):  # and keeps doing so, however often the flooder retries
        again = await raw_initialize(url, f"flood-again-{n}", **bearer(flooder))
        assert again.status_code == 429
        await open_session(url, world.tokens["builder"].token, f"builder-{n}")


@bounded(120)
async def test_revoking_a_token_closes_its_sessions_and_frees_its_slots(world):
    url, flooder = world.served.url, world.tokens["flooder"]
    sessions = [await open_session(url, flooder.token, f"flood-{n}") for n in range(LIMIT)]
    async with event_stream(url, flooder.token, sessions[0]) as stream:
        home = str(world.served.home)
        revoked = await anyio.to_thread.run_sync(
            cli_json, "token", "revoke", flooder.token_id, "--home", home
        )
        assert revoked["revoked"]
        assert await drained(stream), "the revoked token's open stream was not closed"
    # The same agent with a new token gets all its slots back: nothing was left holding them.
    fresh = await anyio.to_thread.run_sync(
        cli_json, "token", "create", "--agent", "flooder", "--home", str(world.served.home)
    )
    for n in range(LIMIT):
        await open_session(url, fresh["token"], f"fresh-{n}")
    assert (await raw_initialize(url, "fresh-over", **bearer(fresh["token"]))).status_code == 429


@bounded(120)
async def test_an_expired_token_is_refused_and_its_open_stream_closed(tmp_path):
    home = tmp_path / "home"
    brief = await anyio.to_thread.run_sync(
        cli_json, "token", "create", "--agent", "brief", "--expires", "3s", "--home", str(home)
    )
    assert brief["expires_at"]
    served = start_server(home, tmp_path / "logs")
    try:
        session = await open_session(served.url, brief["token"])
        async with event_stream(served.url, brief["token"], session) as stream:
            assert await drained(stream), "the expired token's open stream was not closed"
        after = await raw_initialize(served.url, "late", **bearer(brief["token"]))
        assert after.status_code == 401, "an expired token is refused like a revoked one"
    finally:
        stop_server(served)


@bounded(120)
async def test_an_idle_session_is_closed_after_the_idle_timeout_and_frees_its_slot(tmp_path):
    home = tmp_path / "home"
    idler = await anyio.to_thread.run_sync(
        cli_json, "token", "create", "--agent", "idler", "--home", str(home)
    )
    served = start_server(
        home, tmp_path / "logs", "--max-sessions-per-principal", "1", "--session-idle-timeout", "1"
    )
    try:
        token = idler["token"]
        session = await open_session(served.url, token)
        headers = {**MCP_HEADERS, **bearer(token), "mcp-session-id": session}
        ping = {"jsonrpc": "2.0", "id": 7, "method": "ping"}
        statuses = []
        async with httpx2.AsyncClient(timeout=10) as http:
            for _ in range(6):  # each probe is a request, so wait past the timeout before each
                await anyio.sleep(2)
                statuses.append(
                    (await http.post(served.url, json=ping, headers=headers)).status_code
                )
                if statuses[-1] == 404:
                    break
        assert statuses[-1] == 404, f"the idle session was never closed: {statuses}"
        await open_session(served.url, token, "after-idle")  # its slot is free again
    finally:
        stop_server(served)


def test_the_default_idle_timeout_is_well_below_30_minutes_and_the_limit_is_finite():
    from loopwarden.server.settings import HttpLimits

    limits = HttpLimits()
    assert 0 < limits.session_idle_seconds <= 600
    assert 1 <= limits.sessions_per_principal <= 64


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-sessions-per-principal", "0"),
        ("--session-idle-timeout", "0"),
        ("--session-idle-timeout", "nan"),
    ],
)
def test_a_bad_session_setting_is_a_clear_usage_error(tmp_path, flag, value):
    done = run_cli_app("serve", "--http", "127.0.0.1:1", flag, value, "--home", str(tmp_path))
    assert done.exit_code == 2, done.output
    message = " ".join(done.output.split())
    assert flag in message and "must be a positive" in message, message
