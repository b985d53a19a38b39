"""An issuer whose key set does not answer stalls no JWT request (issue 44, finding 7).

With the cache expired and the JWKS endpoint hanging, three concurrent JWT requests used to be
answered after 10, 20 and 30 s: each fetched again in turn under one lock, and a failure was not
remembered. Now one fetch serves every waiter, a failure is remembered for a short backoff, and
the last good key set answers during an outage for a bounded time (`jwks_stale_seconds`), after
which JWTs are refused (fail closed).

The issuer is real (tests/issuer.py, on loopback): it answers 503, or takes the request and
hangs. The cache runs on a manual clock in-process; a real `serve --http` is timed end to end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import anyio
import httpx2
import pytest
from issuer import Issuer
from support import (
    MCP_HEADERS,
    bounded,
    free_port,
    initialize_request,
    start_server,
    stop_server,
)

from loopwarden.auth.identity import OAuthSettings
from loopwarden.auth.oauth import FAILURE_BACKOFF_SECONDS, JwtVerifier
from loopwarden.clock import ManualClock

pytestmark = pytest.mark.anyio

AGENT = "loopwarden:agent"
RESOURCE = "http://127.0.0.1:9/mcp"


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    found = Issuer().start()
    try:
        yield found
    finally:
        if found.jwks_hang is not None:
            found.jwks_hang.set()
        found.stop()


def _verifier(issuer: Issuer, clock: ManualClock) -> JwtVerifier:
    settings = OAuthSettings(
        issuer=issuer.url, resource=RESOURCE, jwks_cache_seconds=60, jwks_stale_seconds=600
    )
    return JwtVerifier(settings, clock=clock)


async def _all(verifier: JwtVerifier, tokens: list[str]) -> list[bool]:
    answers: list[bool] = [False] * len(tokens)

    async def one(i: int) -> None:
        answers[i] = await verifier.verify_token(tokens[i]) is not None

    async with anyio.create_task_group() as group:
        for i in range(len(tokens)):
            group.start_soon(one, i)
    return answers


@bounded(60)
async def test_an_issuer_that_fails_is_asked_once_for_all_and_not_again_before_the_backoff(
    issuer,
):
    clock = ManualClock(datetime.now(UTC))
    verifier = _verifier(issuer, clock)
    lasting = int(time.time()) + 3600  # the manual clock runs ahead of the issuer's
    tokens = [issuer.mint(sub="builder", aud=RESOURCE, scope=AGENT, exp=lasting) for _ in range(3)]
    assert await _all(verifier, tokens[:1]) == [True]
    assert issuer.seen["/jwks"] == 1

    issuer.jwks_status = 503
    clock.advance(61)  # the cache is stale, and the issuer is down
    assert await _all(verifier, tokens) == [True] * 3  # the last good keys answer
    assert issuer.seen["/jwks"] == 2  # one fetch for the three
    assert await _all(verifier, tokens) == [True] * 3
    assert issuer.seen["/jwks"] == 2  # the failure is remembered: no fetch during the backoff
    clock.advance(FAILURE_BACKOFF_SECONDS)
    assert await _all(verifier, tokens) == [True] * 3
    assert issuer.seen["/jwks"] == 3  # then one more try

    clock.advance(600)  # past the cache's life plus jwks_stale_seconds: fail closed
    assert await _all(verifier, tokens) == [False] * 3
    assert issuer.seen["/jwks"] == 4

    issuer.jwks_status = 200
    clock.advance(FAILURE_BACKOFF_SECONDS)
    assert await _all(verifier, tokens) == [True] * 3  # the issuer is back: so are its keys
    assert issuer.seen["/jwks"] == 5


@bounded(60)
async def test_a_hanging_issuer_holds_no_request_and_one_fetch_serves_every_waiter(issuer):
    clock = ManualClock(datetime.now(UTC))
    verifier = _verifier(issuer, clock)
    tokens = [issuer.mint(sub="builder", aud=RESOURCE, scope=AGENT) for _ in range(3)]
    issuer.jwks_hang = threading.Event()
    # No keys yet: three requests wait for one fetch, which answers them all.
    async with anyio.create_task_group() as group:
        answers: list[bool] = []

        async def first_three() -> None:
            answers.extend(await _all(verifier, tokens))

        group.start_soon(first_three)
        with anyio.fail_after(10):
            while issuer.seen["/jwks"] == 0:
                await anyio.sleep(0.01)  # until the issuer holds the one fetch
        await anyio.wait_all_tasks_blocked()
        issuer.jwks_hang.set()
    assert answers == [True] * 3 and issuer.seen["/jwks"] == 1

    # With keys, and the refresh in the background, a hanging issuer delays nobody.
    issuer.jwks_hang = threading.Event()
    async with verifier.keys.running():
        clock.advance(61)
        with anyio.fail_after(2):  # far below the 10 s a fetch may take
            assert await _all(verifier, tokens) == [True] * 3
            assert await _all(verifier, tokens) == [True] * 3
        with anyio.fail_after(10):
            while issuer.seen["/jwks"] < 2:
                await anyio.sleep(0.01)  # until the issuer holds the background refresh
        assert await _all(verifier, tokens) == [True] * 3
        assert issuer.seen["/jwks"] == 2  # one refresh in flight, however many asked
        issuer.jwks_hang.set()


def _post(url: str, token: str) -> tuple[int, float]:
    started = time.monotonic()
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {token}"}
    answer = httpx2.post(url, json=initialize_request("jwks"), headers=headers, timeout=60)
    return answer.status_code, time.monotonic() - started


def test_three_jwt_requests_to_a_real_serve_are_answered_at_once_while_the_jwks_hangs(
    tmp_path: Path, issuer
):
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    config = tmp_path / "oauth.toml"
    config.write_text(
        f'[oauth]\nissuer = "{issuer.url}"\nresource = "{resource}"\njwks_cache_seconds = 0.05\n'
    )
    served = start_server(
        tmp_path / "home", tmp_path / "logs", "--oauth-config", str(config), port=port
    )
    try:
        token = issuer.mint(sub="builder", aud=resource, scope=AGENT)
        assert _post(served.url, token)[0] == 200
        issuer.jwks_hang = threading.Event()  # from now on the key set hangs; the cache expired
        results: list[tuple[int, float]] = []
        threads = [
            threading.Thread(target=lambda: results.append(_post(served.url, token)))
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=90)
        assert [status for status, _ in results] == [200, 200, 200]
        assert max(seconds for _, seconds in results) < 5, results  # was 10, 20 and 30 s
    finally:
        issuer.jwks_hang.set() if issuer.jwks_hang else None
        stop_server(served)
