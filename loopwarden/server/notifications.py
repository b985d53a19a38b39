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
exist. A change is announced only to subscribers who may see the loop that changed: the loop
list (`loopwarden://loops`) moves for a caller only when a loop it can see appears or changes
status, so a hidden loop answers exactly like one that does not exist (`Audience`).

A listen stream belongs to the token it was opened with (`ListenStreams`): every
`SWEEP_SECONDS` each server ends the streams of tokens revoked or expired since (the store is
shared, so every replica ends its own), and of JWTs past their `exp`. The stream ends as the
spec's graceful close does: its final `SubscriptionsListenResult`. Latency is a poll interval
plus a read; replicas need nothing but the shared store.
"""

from __future__ import annotations

import contextvars
import logging
import re
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    ListenHandler,
    ResourceUpdated,
    ServerEvent,
)
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    EmptyResult,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
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

SWEEP_SECONDS = 1.0  # how often the streams of revoked or expired tokens are looked for

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


@dataclass(frozen=True)
class Change:
    """What moved between two readings of the heads: the loops whose head moved, and those
    that appeared or changed status (which is what the loop list shows)."""

    moved: tuple[str, ...]
    listed: tuple[str, ...]


def changes(before: Heads, after: Heads) -> Change:
    moved = tuple(loop_id for loop_id, head in after.items() if before.get(loop_id) != head)
    listed = tuple(
        loop_id
        for loop_id, (_, status) in after.items()
        if loop_id not in before or before[loop_id][1] != status
    )
    return Change(moved, listed)


def changed_uris(before: Heads, after: Heads) -> list[str]:
    """The URIs to announce between two readings of the heads (to someone who sees it all)."""
    change = changes(before, after)
    return ([LOOPS_URI] if change.listed else []) + [projection_uri(i) for i in change.moved]


Audience = dict[Principal, set[str]]
"""Of the principals listening, the URIs each may hear of (see `audience`)."""


def audience(reader: Reader, change: Change, listeners: Iterable[Principal]) -> Audience:
    """For each listening principal, the changed URIs it may see: a loop's projection if it
    can see the loop, the loop list if it can see a loop that appeared or changed status. A
    loop hidden from it (or gone) is, for it, a change that did not happen."""
    rows = {loop_id: reader.loop_row(loop_id) for loop_id in {*change.moved, *change.listed}}
    heard: Audience = {}
    for who in set(listeners):
        seen = {i for i, row in rows.items() if row is not None and visible(reader, who, row)}
        uris = {projection_uri(i) for i in change.moved if i in seen}
        if seen.intersection(change.listed):
            uris.add(LOOPS_URI)
        heard[who] = uris
    return heard


_LISTENER: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "loopwarden_listener", default=None
)
"""The principal of the listen stream being opened (`ListenStreams`), read by the bus."""


class CountingBus:
    """The server's subscription bus (the SDK's `SubscriptionBus`): in-process fan-out that
    knows the principal each listener serves, and counts its listeners (the feed polls only
    while any). `publish` reaches every listener; `publish_to` only those whose principal may
    hear of the event's URI (a listener with no known principal hears nothing of it)."""

    def __init__(self) -> None:
        self._listeners: dict[object, tuple[Callable[[ServerEvent], None], Principal | None]] = {}

    @property
    def listeners(self) -> int:
        return len(self._listeners)

    def principals(self) -> set[Principal]:
        return {who for _, who in self._listeners.values() if who is not None}

    def subscribe(
        self, listener: Callable[[ServerEvent], None], who: Principal | None = None
    ) -> Callable[[], None]:
        """Register `listener` for `who` (default: the principal of the listen stream being
        opened); returns its idempotent unsubscribe."""
        token = object()
        self._listeners[token] = (listener, who or _LISTENER.get())

        def leave() -> None:
            self._listeners.pop(token, None)

        return leave

    async def publish(self, event: ServerEvent) -> None:
        await self._deliver(event, lambda who: True)

    async def publish_to(self, uri: str, heard: Audience) -> None:
        event = ResourceUpdated(uri=uri)
        await self._deliver(event, lambda who: who is not None and uri in heard.get(who, ()))

    async def _deliver(
        self, event: ServerEvent, admits: Callable[[Principal | None], bool]
    ) -> None:
        for listener, who in list(self._listeners.values()):
            if not admits(who):
                continue
            try:
                listener(event)
            except Exception:  # one bad listener must not starve the others
                log.exception("subscription listener raised; continuing")
        await anyio.lowlevel.checkpoint()


@dataclass(frozen=True)
class Holder:
    """Who holds a listen stream: the principal, the static token's id (None for a JWT or the
    launch principal) and when the token expires (Unix seconds; None: never)."""

    who: Principal
    token_id: str | None
    expires_at: float | None


class ListenStreams(ListenHandler):
    """The SDK's `subscriptions/listen` handler, knowing who holds each stream: the bus learns
    the stream's principal (so events reach only what it may see), and `sweep` ends the
    streams of tokens revoked or expired since they were opened (on every replica: each
    sweeps its own streams against the shared store)."""

    def __init__(self, bus: CountingBus, runtime: Runtime, *, clock: Clock = system_clock) -> None:
        super().__init__(bus)
        self._runtime = runtime
        self._clock = clock
        self._held: dict[anyio.CancelScope, Holder] = {}

    @property
    def open(self) -> int:
        return len(self._held)

    def _holder(self) -> Holder:
        who = self._runtime.principal()
        access = get_access_token()
        if access is None:  # stdio, or HTTP without auth: the launch principal's, for ever
            return Holder(who, None, None)
        token_id = access.token if access.token.startswith("tok-") else None
        expires = None if access.expires_at is None else float(access.expires_at)
        return Holder(who, token_id, expires)

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        try:
            holder = self._holder()
        except LoopwardenError:
            raise MCPError(INVALID_PARAMS, REFUSED) from None
        with self.holding(holder):
            mark = _LISTENER.set(holder.who)
            try:
                return await super().__call__(ctx, params)
            finally:
                _LISTENER.reset(mark)
        # Ended by the sweep: close the stream as the spec's graceful close does.
        return SubscriptionsListenResult(_meta={SUBSCRIPTION_ID_META_KEY: ctx.request_id})

    @contextmanager
    def holding(self, holder: Holder) -> Iterator[anyio.CancelScope]:
        """A stream held by `holder` for the block's length: `sweep` cancels the scope (the
        block ends quietly) once the holder's token is revoked or expired."""
        with anyio.CancelScope() as scope:
            self._held[scope] = holder
            try:
                yield scope
            finally:
                self._held.pop(scope, None)

    async def sweep(self) -> int:
        """End the streams whose token is revoked or expired (a JWT's `exp` passed, a static
        token's row revoked or expired in the store); returns how many were ended."""
        now = self._clock()
        ending = [
            scope
            for scope, holder in self._held.items()
            if holder.expires_at is not None and holder.expires_at <= now.timestamp()
        ]
        ids = {h.token_id for h in self._held.values() if h.token_id is not None}
        store = self._runtime.store
        if ids and store is not None:
            live = await store.read(
                lambda r: {t.token_id for t in r.tokens() if t.token_id in ids and t.live_at(now)}
            )
            ending += [
                scope
                for scope, holder in self._held.items()
                if holder.token_id is not None and holder.token_id not in live
            ]
        for scope in set(ending):
            self._held.pop(scope, None)
            scope.cancel()
        if ending:
            log.warning("ended %d listen stream(s) of revoked or expired tokens", len(set(ending)))
        return len(set(ending))


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
        self._legacy_who: weakref.WeakKeyDictionary[Connection, Principal] = (
            weakref.WeakKeyDictionary()
        )
        self.streams = ListenStreams(bus, runtime, clock=clock)
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
        listeners = self.bus.principals() | set(self._legacy_who.values())

        def read(reader: Reader) -> tuple[Heads, Change | None, Audience]:
            heads = read_heads(reader)
            if self._heads is None:
                return heads, None, {}
            change = changes(self._heads, heads)
            return heads, change, audience(reader, change, listeners)

        heads, change, heard = await store.read(read)  # one read, whoever listens
        self.polls += 1
        self._heads = heads
        if change is None:
            return []
        uris = ([LOOPS_URI] if change.listed else []) + [projection_uri(i) for i in change.moved]
        for uri in uris:
            await self.bus.publish_to(uri, heard)
            await self._notify_sessions(uri, heard)
        return uris

    async def _notify_sessions(self, uri: str, heard: Audience) -> None:
        for connection, uris in list(self._legacy.items()):
            who = self._legacy_who.get(connection)
            if uri in uris and who is not None and uri in heard.get(who, ()):
                # on the connection's standalone stream; never raises
                await connection.notify("notifications/resources/updated", {"uri": uri})

    async def run(self) -> None:
        """Poll every `POLL_SECONDS` until cancelled; a failed poll is logged and retried."""
        await every(POLL_SECONDS, self.tick, "change feed poll")

    @asynccontextmanager
    async def running(self) -> AsyncIterator[ChangeFeed]:
        async with anyio.create_task_group() as group:
            group.start_soon(self.run)
            group.start_soon(every, SWEEP_SECONDS, self.streams.sweep, "listen stream sweep")
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
        connection = _connection(ctx)
        self._legacy.setdefault(connection, set()).add(params.uri)
        self._legacy_who[connection] = self.runtime.principal()
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
    (which also makes the handshake advertise `resources.subscribe`), and 2026-07-28's
    `subscriptions/listen` through `feed.streams` in place of the SDK's own handler."""
    # MCPServer has no public seam for these two methods; its low-level server does (this and
    # `_connection` are the couplings to SDK internals, pinned by tests/test_notifications.py).
    lowlevel = server._lowlevel_server
    lowlevel.add_request_handler("resources/subscribe", SubscribeRequestParams, feed.subscribe)
    lowlevel.add_request_handler(
        "resources/unsubscribe", UnsubscribeRequestParams, feed.unsubscribe
    )
    lowlevel.add_request_handler(
        "subscriptions/listen", SubscriptionsListenRequestParams, feed.streams
    )
