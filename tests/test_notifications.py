"""Change notifications (issue 25): a subscribed client hears that a loop's projection changed,
made by another process, within a second; an outsider cannot subscribe; one poll per server.

A real `serve --http` and real SDK clients: MCP 2026-07-28's `subscriptions/listen` and
2025-11-25's `resources/subscribe`, the change made by a separate `loopwarden loop pause`
process writing the same store. The feed's cost is counted on the feed itself: a hundred
listeners, one store read per poll.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import OPERATOR
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.server.subscriptions import ResourceUpdated, ServerEvent
from support import (
    Served,
    Token,
    bounded,
    cli,
    cli_open_loop,
    make_policy,
    mint_tokens,
    start_server,
    stop_server,
)

from loopwarden.loops.lifecycle import OpenLoopRequest, open_loop
from loopwarden.server.notifications import (
    LOOPS_URI,
    REFUSED,
    ChangeFeed,
    CountingBus,
    projection_uri,
)
from loopwarden.server.runtime import Runtime
from loopwarden.server.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

DEADLINE = 1.0  # seconds from a change to its notification (the bound)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, dict[str, Token]]]:
    root = tmp_path_factory.mktemp("notify")
    server = start_server(root / "home", root / "logs")
    try:
        yield server, mint_tokens(server.home, [("builder", "agent"), ("mallory", "agent")])
    finally:
        stop_server(server)


def open_loops(home: Path, *loop_ids: str) -> None:
    for loop_id in loop_ids:
        cli_open_loop(home, loop_id, make_policy(agents=["builder"]))


def pause(home: Path, loop_id: str) -> float:
    """Pause the loop from another process; the time it returned."""
    done = cli("loop", "pause", loop_id, "--home", str(home))
    assert done.returncode == 0, done.stderr
    return time.monotonic()


def client(url: str, token: str, **options: Any) -> Client:
    import httpx2

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    return Client(streamable_http_client(url, http_client=http), **options)


@bounded(60)
async def test_a_listening_client_hears_a_change_made_by_another_process_within_a_second(served):
    server, tokens = served
    open_loops(server.home, "watched", "other")
    async with client(server.url, tokens["builder"].token) as builder:
        assert builder.protocol_version == "2026-07-28"
        uri = projection_uri("watched")
        async with builder.listen(resource_subscriptions=[uri]) as sub:
            assert sub.honored.resource_subscriptions == [uri]
            await anyio.to_thread.run_sync(pause, server.home, "other")  # not subscribed: silent
            changed = await anyio.to_thread.run_sync(pause, server.home, "watched")
            with anyio.fail_after(DEADLINE + 5):
                event = await sub.__anext__()
            heard = time.monotonic()
        assert event == ResourceUpdated(uri=uri)
        assert heard - changed < DEADLINE, f"heard {heard - changed:.2f} s after the change"
        text = (await builder.read_resource(uri)).contents[0].text
        assert json.loads(text)["status"] == "paused"


@bounded(60)
async def test_a_2025_client_subscribed_with_resources_subscribe_hears_the_change(served):
    server, tokens = served
    open_loops(server.home, "legacy")
    heard: list[tuple[str, float]] = []
    arrived = anyio.Event()

    async def on_message(message: Any) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/resources/updated":
            heard.append((root.params.uri, time.monotonic()))
            arrived.set()

    async with client(
        server.url, tokens["builder"].token, mode="legacy", message_handler=on_message
    ) as builder:
        assert builder.protocol_version == "2025-11-25"
        assert builder.server_capabilities.resources.subscribe is True
        await builder.subscribe_resource(projection_uri("legacy"))
        changed = await anyio.to_thread.run_sync(pause, server.home, "legacy")
        with anyio.fail_after(DEADLINE + 5):
            await arrived.wait()
    assert heard[0][0] == projection_uri("legacy")
    assert heard[0][1] - changed < DEADLINE


@bounded(60)
async def test_an_outsider_cannot_subscribe_to_a_loop_it_cannot_see_nor_tell_it_exists(served):
    server, tokens = served
    open_loops(server.home, "private")
    refusals = []
    async with client(server.url, tokens["mallory"].token) as mallory:
        for uri in (
            projection_uri("private"),
            projection_uri("no-such-loop"),
            "file:///etc/passwd",
        ):
            with pytest.raises(MCPError) as refused:
                async with mallory.listen(resource_subscriptions=[uri]):
                    pass
            refusals.append(str(refused.value))
        async with mallory.listen(resource_subscriptions=[LOOPS_URI]) as sub:  # its own list: fine
            assert sub.honored.resource_subscriptions == [LOOPS_URI]
    async with client(server.url, tokens["mallory"].token, mode="legacy") as legacy:
        with pytest.raises(MCPError) as refused:
            await legacy.subscribe_resource(projection_uri("private"))
        refusals.append(str(refused.value))
    assert refusals == [REFUSED] * 4  # hidden, missing and foreign alike


# --- the feed's cost -------------------------------------------------------------------------


@bounded(60)
async def test_a_hundred_listeners_cost_one_store_read_per_poll(tmp_path):
    settings = Settings(home=tmp_path, principal=OPERATOR, auth=False, synchronous="normal")
    runtime = Runtime(settings=settings)
    async with runtime.open():
        bus = CountingBus()
        feed = ChangeFeed(runtime, bus)
        assert await feed.tick() == [] and feed.polls == 0  # nobody listens: nothing is read
        heard: list[list[ServerEvent]] = [[] for _ in range(100)]
        leave = [bus.subscribe(events.append, OPERATOR) for events in heard]
        await feed.baseline()
        for n in range(3):
            await open_loop(
                runtime.require_store(),
                OPERATOR,
                OpenLoopRequest(objective="o", policy=make_policy(), loop_id=f"l{n}"),
            )
            await feed.tick()
        assert feed.polls == 1 + 3  # the baseline, then one read per poll
        expected = [
            ResourceUpdated(uri=u) for n in range(3) for u in (LOOPS_URI, projection_uri(f"l{n}"))
        ]
        assert all(events == expected for events in heard)
        for unsubscribe in leave:
            unsubscribe()
        assert bus.listeners == 0
