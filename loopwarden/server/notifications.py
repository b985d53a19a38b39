"""Change notifications: a subscriber hears that a loop's projection changed, whichever process
or replica wrote the store.

One `ChangeFeed` per server reads the store's loop heads (each loop's last `seq` and its status)
every `POLL_SECONDS` while anyone listens: **one read per poll, whatever the number of
subscribers** (a hundred streams cost what one costs; with none, the feed reads nothing). For
every loop whose head moved it publishes "this changed, read it again" for
`loopwarden://loops/{id}/projection` (and `loopwarden://loops` when a loop appears or changes
status), never the content:

- MCP 2026-07-28: into the server's `SubscriptionBus`; the SDK's `subscriptions/listen` handler
  delivers it to every stream that asked for that URI;
- MCP 2025-11-25: as `notifications/resources/updated` to every session that called
  `resources/subscribe` for it (`subscribe_handlers`).

A caller subscribes only to what it may read (`readable`): a `subscriptions/listen` naming any
other URI is refused before it is acknowledged (`ListenGate`), and so is such a
`resources/subscribe`, with one message whether the loop is hidden from the caller or does not
exist. Latency is a poll interval plus a read; replicas need nothing but the shared store.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated, ServerEvent
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    EmptyResult,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    UnsubscribeRequestParams,
)
from pydantic import ValidationError

from loopwarden.clock import Clock, system_clock
from loopwarden.errors import LoopwardenError
from loopwarden.kernel.runner.visibility import visible
from loopwarden.kernel.state.events import ID_PATTERN
from loopwarden.kernel.store.reader import Reader
from loopwarden.principals import Principal
from loopwarden.server.chores import every
from loopwarden.server.runtime import Runtime

log = logging.getLogger("loopwarden.server")

POLL_SECONDS = 0.25
KEEP_SECONDS = 30.0  # the feed keeps its baseline this long after the last subscriber left
MAX_URIS = 100  # resource URIs in one subscription request
LOOPS_URI = "loopwarden://loops"
LOOP_URI = re.compile(r"loopwarden://loops/(?P<loop_id>[^/]+)/(?:projection|policy)")
REFUSED = "cannot subscribe: every URI must be a loopwarden loop resource you may read"
Heads = dict[str, tuple[int, str]]


def projection_uri(loop_id: str) -> str:
    return f"{LOOPS_URI}/{loop_id}/projection"


def readable(reader: Reader, who: Principal, uris: list[str]) -> bool:
    """True if `who` may read every one of `uris`: the loop list, or a loop's projection or
    policy for a loop it can see. An unknown loop and a hidden one are alike False."""
    for uri in uris:
        if uri == LOOPS_URI:
            continue
        match = LOOP_URI.fullmatch(uri)
        if match is None or not re.fullmatch(ID_PATTERN, match["loop_id"]):
            return False
        row = reader.loop_row(match["loop_id"])
        if row is None or not visible(reader, who, row):
            return False
    return True


def read_heads(reader: Reader) -> Heads:
    return {row.loop_id: (row.head_seq, str(row.status)) for row in reader.loops()}


def changed_uris(before: Heads, after: Heads) -> list[str]:
    """The URIs to announce between two readings of the heads."""
    uris = [
        projection_uri(loop_id) for loop_id, head in after.items() if before.get(loop_id) != head
    ]
    listing = {k: v[1] for k, v in before.items()} != {k: v[1] for k, v in after.items()}
    return ([LOOPS_URI] if listing else []) + uris


class CountingBus(InMemorySubscriptionBus):
    """The SDK's in-process bus, counting its listeners (the feed polls only while any)."""

    def __init__(self) -> None:
        super().__init__()
        self.listeners = 0

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        unsubscribe = super().subscribe(listener)
        self.listeners += 1
        done = False

        def leave() -> None:
            nonlocal done
            if not done:
                done = True
                self.listeners -= 1
            unsubscribe()

        return leave


class ChangeFeed:
    """One server's poll of the store, fanned out to its subscribers (module docstring)."""

    def __init__(self, runtime: Runtime, bus: CountingBus, *, clock: Clock = system_clock) -> None:
        self.runtime = runtime
        self.bus = bus
        self._clock = clock
        self._heads: Heads | None = None
        self._wanted_at = float("-inf")
        # 2025-11-25 subscribers by connection, held weakly: a connection the SDK has dropped
        # leaves this table with it.
        self._legacy: weakref.WeakKeyDictionary[Connection, set[str]] = weakref.WeakKeyDictionary()
        self.polls = 0  # store reads made so far (the feed's whole cost)

    def _now(self) -> float:
        return self._clock().timestamp()

    @property
    def listening(self) -> bool:
        return self.bus.listeners > 0 or any(self._legacy.values())

    async def baseline(self) -> None:
        """Read the heads now unless the feed holds a reading: called before a subscription is
        acknowledged, so that no change after the acknowledgment can be missed."""
        self._wanted_at = self._now()
        store = self.runtime.store
        if self._heads is None and store is not None:
            self._heads = await store.read(read_heads)
            self.polls += 1

    async def tick(self) -> list[str]:
        """One poll: read the heads (only while anyone listens or listened lately), announce
        what moved; returns the URIs announced."""
        store = self.runtime.store
        if self.listening:
            self._wanted_at = self._now()
        elif self._now() - self._wanted_at > KEEP_SECONDS:
            self._heads = None
            return []
        if store is None:
            return []
        heads = await store.read(read_heads)
        self.polls += 1
        before, self._heads = self._heads, heads
        uris = [] if before is None else changed_uris(before, heads)
        for uri in uris:
            await self.bus.publish(ResourceUpdated(uri=uri))
            await self._notify_sessions(uri)
        return uris

    async def _notify_sessions(self, uri: str) -> None:
        for connection, uris in list(self._legacy.items()):
            if uri in uris:  # on the connection's standalone stream; never raises
                await connection.notify("notifications/resources/updated", {"uri": uri})

    async def run(self) -> None:
        """Poll every `POLL_SECONDS` until cancelled; a failed poll is logged and retried."""
        await every(POLL_SECONDS, self.tick, "change feed poll")

    @asynccontextmanager
    async def running(self) -> AsyncIterator[ChangeFeed]:
        async with anyio.create_task_group() as group:
            group.start_soon(self.run)
            try:
                yield self
            finally:
                group.cancel_scope.cancel()

    async def check(self, uris: list[str]) -> None:
        """Refuse (an `MCPError`, naming no URI) unless the caller may read every URI."""
        try:
            who = self.runtime.principal()
            store = self.runtime.require_store()
        except LoopwardenError:
            raise MCPError(INVALID_PARAMS, REFUSED) from None
        if len(uris) > MAX_URIS or not await store.read(lambda r: readable(r, who, uris)):
            raise MCPError(INVALID_PARAMS, REFUSED)
        await self.baseline()

    # --- MCP 2025-11-25: resources/subscribe ---------------------------------------------------

    async def subscribe(
        self, ctx: ServerRequestContext[Any, Any], params: SubscribeRequestParams
    ) -> EmptyResult:
        await self.check([params.uri])
        self._legacy.setdefault(_connection(ctx), set()).add(params.uri)
        return EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any, Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        self._legacy.get(_connection(ctx), set()).discard(params.uri)
        return EmptyResult()

    # --- MCP 2026-07-28: the subscriptions/listen gate ----------------------------------------

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        """Server middleware: a `subscriptions/listen` is checked before the SDK acknowledges
        it; every other message passes."""
        if ctx.method == "subscriptions/listen":
            try:
                params = SubscriptionsListenRequestParams.model_validate(ctx.params or {})
            except ValidationError:
                return await call_next(ctx)  # the SDK answers malformed params itself
            await self.check(list(params.notifications.resource_subscriptions or ()))
        return await call_next(ctx)


def _connection(ctx: ServerRequestContext[Any, Any]) -> Connection:
    # A handler's `ServerSession` lives for one request; the connection it belongs to (whose
    # standalone stream carries 2025-11-25 notifications) has no public accessor.
    connection: Connection = ctx.session._connection
    return connection


def subscribe_handlers(server: MCPServer, feed: ChangeFeed) -> None:
    """Serve MCP 2025-11-25's `resources/subscribe` and `resources/unsubscribe` through `feed`
    (which also makes the handshake advertise `resources.subscribe`)."""
    # MCPServer has no public seam for these two methods; its low-level server does (this and
    # `_connection` are the couplings to SDK internals, pinned by tests/test_notifications.py).
    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, feed.subscribe)
    lowlevel.add_request_handler(
        "resources/unsubscribe", UnsubscribeRequestParams, feed.unsubscribe
    )
