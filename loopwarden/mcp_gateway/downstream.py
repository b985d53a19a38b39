"""One connection per downstream MCP server: started lazily, restarted when it dies, bounded.

A `Downstream` owns its MCP client session in a task of its own (an anyio task group holds the
client's transport, and a task group is left by the task that entered it). The first request
starts it (`start_timeout_seconds`); a request that finds it dead (its process exited, its HTTP
endpoint gone) starts it again, at most once per `RESTART_SECONDS` (in between it fails at once,
saying when it failed and why); each call is bounded by `call_timeout_seconds`. Every failure
is a `DownstreamError` whose message names the server and what failed, never a credential: the
gateway answers it as an MCP error and carries on.

Its tool list is kept: refreshed when the server says it changed (`tools/list_changed`), when it
restarts, and when a client lists tools after `list_ttl_seconds`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal

import anyio
import httpx2
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    CallToolResult,
    GetPromptResult,
    Implementation,
    ReadResourceResult,
)

from loopwarden import __version__
from loopwarden.errors import LoopwardenError
from loopwarden.mcp_gateway.servers_file import HttpSpec, SecretUnavailable, Server, StdioSpec

log = logging.getLogger("loopwarden.gateway")
RESTART_SECONDS = 2.0
MAX_LIST = 1_000  # tools (or prompts, resources) kept of one server's list
Health = Literal["idle", "starting", "ready", "failed", "stopped"]


class DownstreamError(LoopwardenError, code="downstream_unavailable"):
    """A downstream server could not be reached, started, or did not answer in time."""


class DownstreamTimeout(DownstreamError, code="downstream_timeout"):
    """A downstream call did not finish within its time-out."""


class Downstream:
    """One downstream server (module docstring). `start()` within a running task group."""

    def __init__(
        self, server: Server, *, list_ttl: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.server = server
        self.list_ttl = list_ttl
        self._clock = clock
        self.health: Health = "idle"
        self.error: str | None = None  # why it last failed (no secret)
        self.restarts = 0
        self.calls = 0
        self._client: Client | None = None
        self._ready = anyio.Event()
        self._stop = anyio.Event()
        self._lock = anyio.Lock()
        self._failed_at = float("-inf")
        self._spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], Any] | None = None
        self._tools: list[dict[str, Any]] | None = None
        self._listed_at = float("-inf")
        self.protocol: str | None = None
        self._generation = 0

    def attach(self, spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], Any]) -> None:
        """Give it the task group's `start_soon` it starts its session with."""
        self._spawn = spawn

    @property
    def name(self) -> str:
        return self.server.name

    # --- the session ---------------------------------------------------------------------------

    async def client(self) -> Client:
        """The live session, started (or restarted) if it is not; `DownstreamError` if it cannot
        be within the start time-out."""
        if self._client is not None and self.health == "ready":
            return self._client
        async with self._lock:
            if self._client is not None and self.health == "ready":
                return self._client
            since = self._clock() - self._failed_at
            if since < RESTART_SECONDS:
                raise DownstreamError(
                    f"downstream server {self.name!r} is unavailable ({self.error}); the gateway "
                    f"starts it again in {RESTART_SECONDS - since:.1f} s"
                )
            if self._spawn is None:
                raise DownstreamError(
                    f"downstream server {self.name!r}: the gateway is not running"
                )
            if self.health in ("failed", "stopped") or self._tools is not None:
                self.restarts += 1
            self.health, self._ready, self._stop = "starting", anyio.Event(), anyio.Event()
            self._spawn(self._run)
            with anyio.move_on_after(self.server.start_timeout_seconds):
                await self._ready.wait()
            health: str = self.health  # as the session's task has set it meanwhile
            if health != "ready" or self._client is None:
                if health == "starting":
                    self._fail(f"it did not start within {self.server.start_timeout_seconds:g} s")
                    self._stop.set()
                raise DownstreamError(
                    f"downstream server {self.name!r} is unavailable: {self.error}"
                )
            return self._client

    async def _run(self) -> None:
        """The session's task: open it, mark it ready, hold it until stopped or dead."""
        self._generation += 1
        generation, stop, ready = self._generation, self._stop, self._ready
        try:
            async with self._connect() as client:
                if generation != self._generation:
                    return
                self._client = client
                self.protocol = client.protocol_version
                self.health, self.error = "ready", None
                self._tools = None
                ready.set()
                await stop.wait()
        except SecretUnavailable as exc:
            if generation == self._generation:
                self._fail(exc.message)
        except Exception as exc:  # a server that cannot start or dies: said, never raised
            if generation == self._generation:
                self._fail(_why(exc))
        finally:
            if generation == self._generation:
                self._client = None
                if self.health in ("ready", "starting"):
                    self.health = "stopped" if stop.is_set() else "failed"
                    if self.health == "failed":
                        self._failed_at = self._clock()
                        self.error = self.error or "its session ended"
            ready.set()

    def _connect(self) -> Client:
        spec = self.server.resolved()
        info = Implementation(name="loopwarden-gateway", version=__version__)
        handler = self._on_message
        if isinstance(spec, StdioSpec):
            params = StdioServerParameters(
                command=spec.command, args=list(spec.args), env=dict(spec.env) or None, cwd=spec.cwd
            )
            return Client(params, client_info=info, message_handler=handler, cache=None)
        assert isinstance(spec, HttpSpec)
        http = httpx2.AsyncClient(
            headers=dict(spec.headers), timeout=httpx2.Timeout(30.0, read=300.0)
        )
        transport = streamable_http_client(spec.url, http_client=http)
        return Client(transport, client_info=info, message_handler=handler, cache=None)

    async def _on_message(self, message: Any) -> None:
        method = getattr(getattr(message, "root", message), "method", None)
        if method == "notifications/tools/list_changed":
            self._listed_at = float("-inf")

    def _fail(self, why: str) -> None:
        self.health, self.error, self._failed_at = "failed", why, self._clock()
        log.warning("downstream server %s failed: %s", self.name, why)

    def _died(self, exc: BaseException) -> DownstreamError:
        """A request failed on the transport: the session is dead; the next request restarts."""
        self._fail(_why(exc))
        self._failed_at = float("-inf")  # a dead session restarts at once on the next request
        self._stop.set()
        return DownstreamError(f"downstream server {self.name!r} failed: {self.error}")

    async def stop(self) -> None:
        self._stop.set()

    # --- requests ------------------------------------------------------------------------------

    async def _request(self, what: str, send: Callable[[Client], Awaitable[Any]]) -> Any:
        client = await self.client()
        timeout = self.server.call_timeout_seconds
        try:
            with anyio.fail_after(timeout):
                return await send(client)
        except TimeoutError:
            raise DownstreamTimeout(
                f"downstream server {self.name!r} did not answer {what} within {timeout:g} s"
            ) from None
        except MCPError as exc:  # the server's own error answer: passed on, the session lives
            if exc.error.code == CONNECTION_CLOSED or self.health != "ready":
                raise self._died(exc) from None
            raise DownstreamError(
                f"downstream server {self.name!r} answered {what} with an error: "
                f"{_clip(exc.error.message)}"
            ) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            raise self._died(exc) from None
        except httpx2.HTTPError as exc:
            raise self._died(exc) from None

    async def tools(self, *, fresh: bool = False) -> list[dict[str, Any]]:
        """The server's tools as listed (JSON objects), from the kept list unless it is older
        than the list time-out (or `fresh`)."""
        stale = self._clock() - self._listed_at > self.list_ttl
        if self._tools is None or fresh or stale or self.health != "ready":
            listed: list[dict[str, Any]] = []

            async def send(client: Client) -> None:
                cursor = None
                for _ in range(20):
                    page = await client.list_tools(cursor=cursor)
                    listed.extend(
                        t.model_dump(mode="json", by_alias=True, exclude_none=True)
                        for t in page.tools
                    )
                    cursor = page.next_cursor
                    if not cursor or len(listed) >= MAX_LIST:
                        return

            await self._request("tools/list", send)
            self._tools, self._listed_at = listed[:MAX_LIST], self._clock()
        return list(self._tools or ())

    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> CallToolResult:
        self.calls += 1
        result: CallToolResult = await self._request(
            f"tools/call {tool}", lambda c: c.call_tool(tool, arguments)
        )
        return result

    async def list_prompts(self) -> list[dict[str, Any]]:
        if not self._capable("prompts"):
            return []
        page = await self._request("prompts/list", lambda c: c.list_prompts())
        return [p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in page.prompts][
            :MAX_LIST
        ]

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> GetPromptResult:
        result: GetPromptResult = await self._request(
            f"prompts/get {name}", lambda c: c.get_prompt(name, arguments)
        )
        return result

    async def list_resources(self) -> list[dict[str, Any]]:
        if not self._capable("resources"):
            return []
        page = await self._request("resources/list", lambda c: c.list_resources())
        return [
            r.model_dump(mode="json", by_alias=True, exclude_none=True) for r in page.resources
        ][:MAX_LIST]

    async def list_resource_templates(self) -> list[dict[str, Any]]:
        if not self._capable("resources"):
            return []
        page = await self._request(
            "resources/templates/list", lambda c: c.list_resource_templates()
        )
        return [
            t.model_dump(mode="json", by_alias=True, exclude_none=True)
            for t in page.resource_templates
        ][:MAX_LIST]

    async def read_resource(self, uri: str) -> ReadResourceResult:
        result: ReadResourceResult = await self._request(
            "resources/read", lambda c: c.read_resource(uri)
        )
        return result

    def _capable(self, what: str) -> bool:
        """Whether the live session's server declared `what` (prompts, resources)."""
        client = self._client
        if client is None:
            return True  # asked before it started: the request starts it and finds out
        return getattr(client.server_capabilities, what, None) is not None


def _clip(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "…"


def _why(exc: BaseException) -> str:
    """A failure in one line, without a credential: the exception's type, and its text only for
    failures whose text is the transport's or the OS's own."""
    if isinstance(exc, BaseExceptionGroup):
        inner = exc.exceptions[0] if exc.exceptions else exc
        return _why(inner)
    if isinstance(exc, OSError):
        return f"{type(exc).__name__}: {exc.strerror or 'cannot start'}"
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    if isinstance(exc, httpx2.HTTPError):
        return f"{type(exc).__name__} (the server cannot be reached)"
    if isinstance(exc, MCPError):
        return f"MCP error {exc.error.code}: {_clip(exc.error.message)}"
    return type(exc).__name__
