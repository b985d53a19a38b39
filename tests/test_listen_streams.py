"""Listen streams that end, and tell nothing of hidden loops (issue 44, findings 3 and 4).

A `subscriptions/listen` stream (MCP 2026-07-28) belongs to the token that opened it: revoking
the token ends the stream on every server sharing the store, and so does the token's expiry
(a static token's, a JWT's `exp`). A subscriber of the loop list hears only of loops it can
see: a loop hidden from it appears and pauses in silence, as one that does not exist would.

Real `serve --http` processes (two sharing one store, as replicas do), real tokens, the SDK's
real client; revocation and changes by the CLI, outside the servers' processes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from conftest import BUILDER, OPERATOR
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.subscriptions import ResourceUpdated
from support import (
    Served,
    bounded,
    cli_open_loop,
    make_policy,
    mint_tokens,
    run_cli_app,
    start_oauth_server,
    start_server,
    stop_server,
)

from loopwarden.clock import ManualClock
from loopwarden.server.notifications import (
    LOOPS_URI,
    CountingBus,
    Holder,
    ListenStreams,
    projection_uri,
)
from loopwarden.server.runtime import Runtime
from loopwarden.server.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ENDS_WITHIN = 10.0  # seconds: the sweep runs every second; generous for a loaded machine


@bounded(60)
async def test_the_sweep_ends_exactly_the_streams_of_revoked_or_expired_tokens(tmp_path):
    """The sweep's decision, on the server's own clock: one sweep (a server makes one every
    second) after each step, and expiry reached by moving the clock, not by waiting."""
    home = tmp_path / "home"
    await anyio.to_thread.run_sync(
        lambda: cli_open_loop(home, "shared", make_policy(agents=["builder"]))
    )
    forever = await anyio.to_thread.run_sync(
        lambda: mint_tokens(home, [("builder", "agent"), ("revoked", "agent")])
    )
    hourly = await anyio.to_thread.run_sync(
        lambda: mint_tokens(home, [("hourly", "agent")], expires="1h")
    )
    clock = ManualClock(datetime.now().astimezone())
    runtime = Runtime(Settings(home=home, principal=OPERATOR, auth=False), clock=clock)
    streams = ListenStreams(CountingBus(), runtime, clock=clock)
    jwt_exp = clock().timestamp() + 600
    holders = {
        "static": Holder(BUILDER, forever["builder"].token_id, None),
        "revoked": Holder(BUILDER, forever["revoked"].token_id, None),
        "hourly": Holder(BUILDER, hourly["hourly"].token_id, None),
        "jwt": Holder(BUILDER, None, jwt_exp),
        "launch": Holder(OPERATOR, None, None),  # stdio: the launch principal's, for ever
    }
    ended: list[str] = []

    async def hold(name: str, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        with streams.holding(holders[name]):
            task_status.started()
            await anyio.sleep_forever()
        ended.append(name)

    async with runtime.open(), anyio.create_task_group() as group:
        for name in holders:
            await group.start(hold, name)
        assert (await streams.sweep(), streams.open) == (0, 5)

        done = await anyio.to_thread.run_sync(
            run_cli_app, "token", "revoke", forever["revoked"].token_id, "--home", str(home)
        )
        assert done.exit_code == 0, done.output
        assert await streams.sweep() == 1
        await anyio.wait_all_tasks_blocked()
        assert ended == ["revoked"]

        clock.set(datetime.fromtimestamp(jwt_exp).astimezone() - timedelta(seconds=1))
        assert await streams.sweep() == 0
        clock.advance(1)  # the JWT's exp
        assert await streams.sweep() == 1
        clock.advance(3600)  # past the static token's expiry
        assert await streams.sweep() == 1
        await anyio.wait_all_tasks_blocked()
        assert ended == ["revoked", "jwt", "hourly"]
        assert streams.open == 2  # the live static token's and the launch principal's
        group.cancel_scope.cancel()


def client(url: str, token: str) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    return Client(streamable_http_client(url, http_client=http))


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[Served]]:
    """Two servers on one store (the home's file), as two replicas share one database."""
    home = tmp_path / "home"
    cli_open_loop(home, "shared", make_policy(agents=["builder"]))
    served = [start_server(home, tmp_path / "logs") for _ in range(2)]
    try:
        yield served
    finally:
        for one in served:
            stop_server(one)


async def _ends(sub: Any) -> list[Any]:
    """The events a stream delivers until it ends (bounded by ENDS_WITHIN)."""
    events = []
    with anyio.fail_after(ENDS_WITHIN):
        async for event in sub:
            events.append(event)
    return events


def pause(home: Path, loop_id: str) -> None:
    """`loopwarden loop pause`, in this process (not the servers'): the CLI app, no new
    interpreter."""
    done = run_cli_app("loop", "pause", loop_id, "--home", str(home))
    assert done.exit_code == 0, done.output


def open_elsewhere(home: Path, loop_id: str, agents: list[str]) -> None:
    """`loopwarden loop open`, as `pause` runs it."""
    path = home.parent / f"policy-{loop_id}.json"
    path.write_text(json.dumps(make_policy(agents=agents)))
    done = run_cli_app(
        *("loop", "open", "--policy", str(path), "--objective", "o", "--id", loop_id),
        *("--home", str(home)),
    )
    assert done.exit_code == 0, done.output


@bounded(90)
async def test_revoking_a_token_ends_its_listen_streams_on_every_replica(replicas):
    home = replicas[0].home
    minted = await anyio.to_thread.run_sync(lambda: mint_tokens(home, [("builder", "agent")]))
    token = minted["builder"]
    async with (
        client(replicas[0].url, token.token) as one,
        client(replicas[1].url, token.token) as two,
    ):
        uri = projection_uri("shared")
        async with (
            one.listen(resource_subscriptions=[uri]) as first,
            two.listen(resource_subscriptions=[uri]) as second,
        ):
            done = await anyio.to_thread.run_sync(
                run_cli_app, "token", "revoke", token.token_id, "--home", str(home)
            )
            assert done.exit_code == 0, done.output
            revoked = time.monotonic()
            heard = await _ends(first) + await _ends(second)
            ended = time.monotonic() - revoked
            # Nothing after the revocation: the loop's pause is heard by no one.
            await anyio.to_thread.run_sync(pause, home, "shared")
    assert heard == [] and ended < ENDS_WITHIN
    for served in replicas:
        assert "ended 1 listen stream(s) of revoked or expired tokens" in served.stderr()


@pytest.mark.slow  # short variant: the sweep on a clock of its own, above
@bounded(90)
async def test_an_expired_token_s_listen_stream_ends(replicas):
    home = replicas[0].home
    minted = await anyio.to_thread.run_sync(
        lambda: mint_tokens(home, [("builder", "agent")], expires="3s")
    )
    token = minted["builder"]
    async with (
        client(replicas[0].url, token.token) as builder,
        builder.listen(resource_subscriptions=[LOOPS_URI]) as sub,
    ):
        opened = time.monotonic()
        await _ends(sub)
    assert time.monotonic() - opened < 3 + ENDS_WITHIN


@pytest.mark.slow  # short variant: the sweep on a clock of its own, above
@bounded(90)
async def test_a_jwt_s_listen_stream_ends_at_its_exp(tmp_path, issuer):
    served, resource = start_oauth_server(tmp_path, issuer.url)
    try:
        jwt = issuer.mint(
            sub="builder", aud=resource, scope="loopwarden:agent", exp=int(time.time()) + 4
        )
        async with (
            client(served.url, jwt) as builder,
            builder.listen(resource_subscriptions=[LOOPS_URI]) as sub,
        ):
            await _ends(sub)
    finally:
        stop_server(served)


@bounded(90)
async def test_the_loop_list_tells_a_subscriber_nothing_of_loops_it_cannot_see(tmp_path):
    home = tmp_path / "home"
    cli_open_loop(home, "seed", make_policy(agents=["builder"]))
    cli_open_loop(home, "open-to-all", make_policy(agents=["*"]))
    served = start_server(home, tmp_path / "logs")
    tokens = await anyio.to_thread.run_sync(
        lambda: mint_tokens(home, [("builder", "agent"), ("mallory", "agent")])
    )
    visible_uri = projection_uri("open-to-all")
    try:
        async with (
            client(served.url, tokens["mallory"].token) as mallory,
            client(served.url, tokens["builder"].token) as builder,
            mallory.listen(resource_subscriptions=[LOOPS_URI, visible_uri]) as outsider,
            builder.listen(resource_subscriptions=[LOOPS_URI]) as insider,
        ):
            # Loops mallory cannot see are opened and paused; builder (who can) hears both.
            for step in (
                lambda: open_elsewhere(home, "private", ["builder"]),
                lambda: pause(home, "private"),
            ):
                await anyio.to_thread.run_sync(step)
                with anyio.fail_after(ENDS_WITHIN):
                    assert await insider.__anext__() == ResourceUpdated(uri=LOOPS_URI)
            # A loop it can see is paused: the first events mallory hears are exactly that
            # change (the list, then the loop, announced in this order in one poll). Anything
            # it had been told of the hidden loops would have come first, on the same stream.
            await anyio.to_thread.run_sync(pause, home, "open-to-all")
            with anyio.fail_after(ENDS_WITHIN):
                heard = [await outsider.__anext__(), await outsider.__anext__()]
            assert heard == [ResourceUpdated(uri=LOOPS_URI), ResourceUpdated(uri=visible_uri)]
            listed = (await mallory.read_resource(LOOPS_URI)).contents[0].text
            assert "open-to-all" in listed and "private" not in listed
    finally:
        stop_server(served)
