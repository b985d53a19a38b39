"""Streamable-HTTP sessions against a hostile token holder, on a real `serve --http`.

One token used to be able to open sessions until the SDK's global cap (10,000) answered 503 to
everyone for 30 minutes, and revoking the token freed none of them. Now each principal has its
own limit (`--max-sessions`), idle sessions close after `--session-idle-timeout`, and a revoked
or expired token's sessions are closed by the server. Every wait is bounded; every server is
stopped by its finalizer.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
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
LIFETIMES = (3, 6, 12, 24)  # seconds: a set-up slower than one (a loaded machine) takes the next


class ExpiredInSetUp(Exception):
    """The token expired before its session and stream were open: nothing was tested yet."""


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
async def event_stream(
    url: str, token: str, session: str, *, expired_ok: bool = False
) -> AsyncIterator[httpx2.Response]:
    """The session's standalone SSE stream (GET), held open until the server ends it. With
    `expired_ok`, a token refused on the way raises `ExpiredInSetUp` instead of failing."""
    headers = {**bearer(token), "mcp-session-id": session, "mcp-protocol-version": PROTOCOL}
    read = CLOSE_WITHIN + LIFETIMES[-1]
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10, read=read)) as http:
        ready = await http.post(
            url,
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers={**MCP_HEADERS, **headers},
        )
        if expired_ok and ready.status_code in (401, 404):  # refused, or its session closed
            raise ExpiredInSetUp
        assert ready.status_code == 202, ready.text
        async with http.stream(
            "GET", url, headers={"Accept": "text/event-stream", **headers}
        ) as stream:
            if expired_ok and stream.status_code in (401, 404):
                raise ExpiredInSetUp
            assert stream.status_code == 200
            yield stream


async def drained(stream: httpx2.Response, within: float = CLOSE_WITHIN) -> bool:
    """True once the server has ended the stream (within `within` s), False if it had not."""
    with anyio.move_on_after(within):
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


async def open_stream_in_time(url: str, token: str) -> AbstractAsyncContextManager[httpx2.Response]:
    """`event_stream` of a new session, or `ExpiredInSetUp` if the token was refused on the way."""
    response = await raw_initialize(url, "brief", **bearer(token))
    if response.status_code == 401:
        raise ExpiredInSetUp
    assert response.status_code == 200, response.text
    return event_stream(url, token, response.headers["mcp-session-id"], expired_ok=True)


@bounded(150)
async def test_an_expired_token_is_refused_and_its_open_stream_closed(tmp_path):
    """The token's lifetime starts once the server is ready (it used to start before the server
    did, and a slow start outlived it), and a set-up that outlives it anyway is retried with a
    token twice as long: the server's closing is tested on a stream that was open in time."""
    home = tmp_path / "home"
    mint = functools.partial(anyio.to_thread.run_sync, mint_tokens, home)  # the CLI runs a loop
    await mint([("setup", "agent")])  # the home and its store, before the server
    served = start_server(home, tmp_path / "logs")
    try:
        for lifetime in LIFETIMES:
            brief = (await mint([("brief", "agent")], None, f"{lifetime}s"))["brief"]
            try:
                async with await open_stream_in_time(served.url, brief.token) as stream:
                    closed = await drained(stream, within=lifetime + CLOSE_WITHIN)
            except ExpiredInSetUp:
                continue
            assert closed, "the expired token's open stream was not closed"
            after = await raw_initialize(served.url, "late", **bearer(brief.token))
            assert after.status_code == 401, "an expired token is refused like a revoked one"
            return
        pytest.fail(f"no token lived through the set-up, even for {LIFETIMES[-1]} s")
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
