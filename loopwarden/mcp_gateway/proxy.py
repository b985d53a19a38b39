"""The gateway as MCP middleware: loopwarden's own tools, and each downstream server's under
`<server>__<name>`, on one MCP server (stdio or streamable HTTP, both protocol versions).

Per request, the loop served is the `Loopwarden-Loop` HTTP header, else the servers file's
`gateway.loop` (or `serve --loop`); the caller is the server's principal (the bearer token's
agent over HTTP), acting through its observer. Without a loop, or for a loop whose policy does
not observe tool calls, no downstream tool is listed and a call is a clear error.

- `tools/list`: loopwarden's tools, then each downstream tool the loop's policy allows or gates
  behind an approval (a denied one is not listed) whose description is pinned (an unpinned one
  is hidden until an operator pins it, or pinned now under `[gateway] pin = "first_sight"`; a
  changed one is hidden and the change sealed once per process);
- `tools/call` of a downstream tool: pin checked, decided and sealed (`gateway_ops.gateway_call`),
  forwarded if admitted (or refused in `record` mode), its outcome sealed; an approval-gated
  tool without an approval gets one requested for the turn and the person sent to its page
  (2026-07-28 with URL elicitation: `input_required`; otherwise a tool error naming it);
- `prompts/*` and `resources/*`: passed through under the policy names
  `mcp.<server>.prompts.<name>` and `mcp.<server>.resources.read` (allowed by the tool rules
  and argument rules — `uri`, a prompt's arguments — while the loop is active; not sealed);
  downstream resource URIs are served as `mcp-gateway://<server>/<uri>`;
- `tools/call` of loopwarden's `claim`: the gateway's session is announced first, so a loop
  that enforces host evidence admits the claim of an agent that only the gateway observes.

Every failure is an MCP error or a tool error saying what failed; no request hangs past its
time-out and no downstream failure stops the gateway.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    ElicitRequest,
    ElicitRequestURLParams,
    InputRequiredResult,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from loopwarden.approvals.approval_ops import ApprovalRequest, request_approval
from loopwarden.canonical import canonical_bytes, sha256_digest
from loopwarden.clock import Clock, system_clock
from loopwarden.errors import IntegrityError, LoopwardenError, SealError, StoreError
from loopwarden.kernel.state.events import new_id
from loopwarden.kernel.store.reader import Reader
from loopwarden.mcp_gateway.downstream import Downstream, DownstreamError
from loopwarden.mcp_gateway.gateway_ops import (
    GatewayCall,
    GatewayChange,
    GatewayOutcome,
    GatewaySession,
    GatewayVerdict,
    gateway_attach,
    gateway_call,
    gateway_outcome,
    gateway_policy_name,
    gateway_tool_changed,
)
from loopwarden.mcp_gateway.pins import Pins, PinsError, tool_digest
from loopwarden.mcp_gateway.servers_file import ServersFile
from loopwarden.policy.arguments import argument_reasons
from loopwarden.policy.decision import ReasonCode
from loopwarden.policy.evaluate import explain
from loopwarden.policy.model import LoopPolicy
from loopwarden.principals import Principal
from loopwarden.statuses import ApprovalStatus, LoopStatus
from loopwarden.tool_errors import error_result

log = logging.getLogger("loopwarden.gateway")
LOOP_HEADER = "loopwarden-loop"
SEPARATOR = "__"
RESOURCE_SCHEME = "mcp-gateway://"
MAX_NAME = 128
_SEGMENT = re.compile(r"[^A-Za-z0-9_-]")


def _dump(result: HandlerResult) -> dict[str, Any]:
    if isinstance(result, BaseModel):
        dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        return dumped
    return dict(result or {})


@dataclass
class Listed:
    """A downstream tool as served: its name to the client, its server and own name, its digest."""

    server: str
    name: str
    tool: dict[str, Any]
    digest: str


@dataclass
class Gateway:
    """The gateway of one server process (module docstring)."""

    servers: ServersFile
    runtime: Any  # server/runtime.Runtime (an edge's type: passed in, never imported)
    loop: str | None = None  # `serve --loop`, over the servers file's `gateway.loop`
    dashboard_url: str | None = None
    clock: Clock = system_clock
    session_id: str = field(default_factory=lambda: new_id("gw"))
    downstreams: dict[str, Downstream] = field(init=False)
    pins: Pins = field(init=False)
    _changes_sealed: set[tuple[str, str, str, str]] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        ttl = self.servers.settings.list_ttl_seconds
        self.downstreams = {
            name: Downstream(server, list_ttl=ttl) for name, server in self.servers.servers.items()
        }
        self.pins = Pins(self.servers.pins_path)
        self.loop = self.loop or self.servers.settings.loop

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Gateway]:
        """Hold the downstream sessions while the server runs; stop them all after."""
        async with anyio.create_task_group() as group:
            for downstream in self.downstreams.values():
                downstream.attach(group.start_soon)
            try:
                yield self
            finally:
                for downstream in self.downstreams.values():
                    await downstream.stop()
                group.cancel_scope.cancel()

    # --- the middleware ------------------------------------------------------------------------

    async def __call__(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        method, params = ctx.method, dict(ctx.params or {})
        if method == "tools/list":
            return await self._list_tools(ctx, call_next)
        if method == "tools/call":
            name = params.get("name")
            if isinstance(name, str) and self._split(name) is not None:
                return await self._call_tool(ctx, name, params)
            if name == "claim":
                await self._attach_for_claim(ctx, params)
        if method == "prompts/list":
            return await self._list_prompts(ctx, call_next)
        if method == "prompts/get":
            name = params.get("name")
            if isinstance(name, str) and self._split(name) is not None:
                return await self._get_prompt(ctx, name, params)
        if method in ("resources/list", "resources/templates/list"):
            return await self._list_resources(ctx, call_next, method)
        if method == "resources/read":
            uri = params.get("uri")
            if isinstance(uri, str) and uri.startswith(RESOURCE_SCHEME):
                return await self._read_resource(ctx, uri)
        return await call_next(ctx)

    def _split(self, name: str) -> tuple[Downstream, str] | None:
        server, sep, rest = name.partition(SEPARATOR)
        downstream = self.downstreams.get(server)
        return (downstream, rest) if sep and rest and downstream is not None else None

    # --- who and which loop --------------------------------------------------------------------

    def loop_of(self, ctx: ServerRequestContext[Any, Any]) -> str | None:
        request = ctx.request
        headers = getattr(request, "headers", None)
        if headers is not None:
            chosen = headers.get(LOOP_HEADER)
            if chosen:
                return str(chosen)
        return self.loop

    def observer(self) -> Principal:
        agent = self.runtime.principal()
        return Principal(id=agent.id, role="observer")

    async def _policy(self, loop_id: str) -> tuple[LoopPolicy, LoopStatus] | None:
        """The loop's policy and status as they stand now (an operator may replace the policy,
        `loop set-policy`), if the caller may see the loop."""
        store = self.runtime.require_store()
        agent = self.runtime.principal()

        def read(reader: Reader) -> tuple[LoopPolicy, LoopStatus] | None:
            row = reader.loop_row(loop_id)
            if row is None:
                return None
            policy = reader.policy(row.policy_digest)
            if not (agent.is_operator or policy.admits_agent(agent.id)):
                return None
            return policy, row.status

        found: tuple[LoopPolicy, LoopStatus] | None = await store.read(read)
        return found

    # --- tools ---------------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        own = _dump(await call_next(ctx))
        loop_id = self.loop_of(ctx)
        found = await self._policy(loop_id) if loop_id else None
        if found is None or found[0].observe_mode == "off":
            return own
        policy = found[0]
        tools = list(own.get("tools", []))
        for listed in await self._served(loop_id or "", policy):
            verdict = explain(policy, gateway_policy_name(listed.server, listed.tool["name"]))
            if verdict.rule in ("allow", "approval"):
                tools.append({**listed.tool, "name": listed.name})
        own["tools"] = tools
        return own

    async def _served(self, loop_id: str, policy: LoopPolicy) -> list[Listed]:
        """Every pinned (or now first-sight pinned) tool of every reachable downstream; a
        server that cannot be reached lists nothing (its status says why)."""
        out: list[Listed] = []
        first_sight = policy.gateway is not None and policy.gateway.pin == "first_sight"

        async def one(downstream: Downstream) -> None:
            try:
                tools = await downstream.tools()
            except DownstreamError as exc:
                log.warning("%s", exc.message)
                return
            for tool in tools:
                name = f"{downstream.name}{SEPARATOR}{tool.get('name')}"
                listed = await self._pinned(loop_id, downstream.name, tool, first_sight)
                if listed is not None and len(name) <= MAX_NAME:
                    out.append(Listed(downstream.name, name, tool, listed))

        async with anyio.create_task_group() as group:
            for downstream in self.downstreams.values():
                group.start_soon(one, downstream)
        return sorted(out, key=lambda listed: listed.name)

    async def _pinned(
        self, loop_id: str, server: str, tool: dict[str, Any], first_sight: bool
    ) -> str | None:
        """The tool's digest if it may be served (pinned, or pinned now on first sight); None
        if it is hidden (unpinned, changed: the change sealed once)."""
        name = str(tool.get("name", ""))
        try:
            digest = tool_digest(tool)
            status, pinned = self.pins.status(server, name, digest)
        except (PinsError, SealError) as exc:
            log.error("tool %s of %s hidden: %s", name, server, exc)
            return None
        if status == "pinned":
            return digest
        if status == "unpinned":
            if not first_sight:
                return None
            try:
                self.pins.pin({(server, name): digest}, "first_sight", self.clock())
            except PinsError as exc:
                log.error("tool %s of %s not pinned on first sight: %s", name, server, exc)
                return None
            return digest if self.pins.status(server, name, digest)[0] == "pinned" else None
        assert pinned is not None
        key = (loop_id, server, name, digest)
        if key not in self._changes_sealed:
            self._changes_sealed.add(key)
            change = GatewayChange(
                loop_id=loop_id, session_id=self.session_id, server=server, tool=name,
                pinned_digest=pinned, seen_digest=digest,
            )  # fmt: skip
            try:
                await gateway_tool_changed(self.runtime.require_store(), self.observer(), change)
            except LoopwardenError as exc:
                log.error("the change of %s of %s was not sealed: %s", name, server, exc.message)
            log.warning(
                "tool %s of %s changed since it was pinned: hidden and refused", name, server
            )
        return None

    async def _attach_for_claim(
        self, ctx: ServerRequestContext[Any, Any], params: dict[str, Any]
    ) -> None:
        arguments = params.get("arguments") or {}
        loop_id = arguments.get("loop_id") if isinstance(arguments, dict) else None
        if not isinstance(loop_id, str):
            return
        try:
            session = GatewaySession(loop_id=loop_id, session_id=self.session_id)
            await gateway_attach(self.runtime.require_store(), self.observer(), session)
        except LoopwardenError:
            pass  # the claim itself says what is wrong

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], name: str, params: dict[str, Any]
    ) -> HandlerResult:
        split = self._split(name)
        assert split is not None
        downstream, tool_name = split
        loop_id = self.loop_of(ctx)
        if not loop_id:
            return error_result(
                "no_loop",
                "the gateway serves downstream tools for one loop: name it in the servers file "
                "(gateway.loop), with `serve --loop`, or in the Loopwarden-Loop header",
            )
        arguments = params.get("arguments") or {}
        if not isinstance(arguments, dict):
            raise MCPError(code=INVALID_PARAMS, message="tools/call arguments must be an object")
        try:
            return await self._decided_call(ctx, loop_id, downstream, tool_name, arguments, params)
        except IntegrityError as exc:
            log.error("integrity check failed in a gateway call, refused: %s", exc)
            return error_result(
                exc.code, "the store failed an integrity check; the call was refused"
            )
        except StoreError as exc:
            log.error("store failure in a gateway call: %s", exc)
            return error_result(exc.code, "the store could not decide the call; it was refused")
        except LoopwardenError as exc:
            return error_result(exc.code, exc.message)
        except Exception:  # never a traceback to the client: the log has it
            log.exception("unexpected failure in a gateway call of %s", name)
            return error_result(
                "internal_error", "the gateway failed unexpectedly; the call was refused"
            )

    async def _decided_call(
        self,
        ctx: ServerRequestContext[Any, Any],
        loop_id: str,
        downstream: Downstream,
        tool_name: str,
        arguments: dict[str, Any],
        params: dict[str, Any],
    ) -> HandlerResult:
        found = await self._policy(loop_id)
        if found is None:
            return error_result("not_found", f"no loop {loop_id!r} the caller may see")
        policy = found[0]
        listed = {str(t.get("name")): t for t in await downstream.tools()}
        tool = listed.get(tool_name)
        if tool is None:
            return error_result(
                "not_found", f"downstream server {downstream.name!r} has no tool {tool_name!r}"
            )
        first_sight = policy.gateway is not None and policy.gateway.pin == "first_sight"
        digest = await self._pinned(loop_id, downstream.name, tool, first_sight)
        if digest is None:
            status, _ = self.pins.status(downstream.name, tool_name, tool_digest(tool))
            if status == "changed":
                return error_result(
                    ReasonCode.TOOL_CHANGED,
                    f"{downstream.name}{SEPARATOR}{tool_name}: its description or input schema "
                    "changed since an operator pinned it; it is refused until an operator pins "
                    "it again (loopwarden gateway pin)",
                )
            return error_result(
                ReasonCode.TOOL_UNPINNED,
                f"{downstream.name}{SEPARATOR}{tool_name} is not pinned: an operator admits its "
                "description first (loopwarden gateway pin)",
            )
        try:
            input_digest = sha256_digest(canonical_bytes(arguments))
        except SealError:
            raise MCPError(
                code=INVALID_PARAMS, message="the arguments are not plain JSON"
            ) from None
        call_id = new_id("call")
        request = GatewayCall(
            loop_id=loop_id, session_id=self.session_id, call_id=call_id, server=downstream.name,
            tool=tool_name, input_digest=input_digest, tool_digest=digest, arguments=arguments,
        )  # fmt: skip
        store = self.runtime.require_store()
        verdict = await gateway_call(store, self.observer(), request)
        if not verdict.forward:
            return await self._refused(ctx, loop_id, verdict, params)
        started = time.monotonic()
        try:
            result = await downstream.call_tool(tool_name, arguments)
        except DownstreamError as exc:
            await self._seal_outcome(request, started, {"error": exc.code}, errored=True)
            return error_result(exc.code, exc.message)
        dumped = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        await self._seal_outcome(request, started, dumped, errored=bool(result.is_error))
        return result

    async def _seal_outcome(
        self, request: GatewayCall, started: float, result: Any, *, errored: bool
    ) -> None:
        """Seal what the forwarded call came to: its digest and size, never the result. A
        failure to seal is logged: the call has run, withholding its result undoes nothing."""
        try:
            raw = canonical_bytes(result)
        except SealError:
            raw = canonical_bytes({"unreadable": True})
        outcome = GatewayOutcome(
            loop_id=request.loop_id, session_id=request.session_id, call_id=request.call_id,
            server=request.server, tool=request.tool, response_digest=sha256_digest(raw),
            response_bytes=len(raw), errored=errored,
            duration_ms=round((time.monotonic() - started) * 1000, 3),
        )  # fmt: skip
        try:
            await gateway_outcome(self.runtime.require_store(), self.observer(), outcome)
        except Exception:
            log.exception("the outcome of gateway call %s was not sealed", request.call_id)

    # --- approvals -----------------------------------------------------------------------------

    async def _refused(
        self,
        ctx: ServerRequestContext[Any, Any],
        loop_id: str,
        verdict: GatewayVerdict,
        params: dict[str, Any],
    ) -> HandlerResult:
        codes = {r.code for r in verdict.reasons}
        receipt = f" (receipt {verdict.receipt_id})" if verdict.receipt_id else ""
        if codes != {ReasonCode.APPROVAL_REQUIRED} or verdict.turn_id is None:
            code = verdict.reasons[0].code if verdict.reasons else "refused"
            return error_result(
                str(code), f"loopwarden refused {verdict.tool}: {verdict.message}{receipt}"
            )
        approval_id, status = await self._approval(verdict)
        page = f"{self.dashboard_url}/approvals/{approval_id}" if self.dashboard_url else None
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        caps = ctx.session.client_capabilities
        url_mode = (
            caps is not None and caps.elicitation is not None and caps.elicitation.url is not None
        )
        retry = params.get("requestState") is not None
        if page and modern and url_mode and not retry and status == ApprovalStatus.PENDING:
            message = (
                f"{self.runtime.principal().id} asks to use {verdict.tool} in loop {loop_id}. An "
                "operator approves or rejects it on this page (sign in as an operator); the call "
                "then goes on."
            )
            ask = ElicitRequestURLParams(mode="url", message=message, url=page)
            state = {"approval_id": approval_id, "loop_id": loop_id}
            return InputRequiredResult(
                input_requests={"approval": ElicitRequest(params=ask)},
                request_state=json.dumps(state),
            )
        where = f"at {page}" if page else f"with `loopwarden approve {approval_id}`"
        said = "is still pending" if status == ApprovalStatus.PENDING else f"is {status}"
        return error_result(
            ReasonCode.APPROVAL_REQUIRED,
            f"{verdict.tool} needs an operator's approval for this turn: approval {approval_id} "
            f"{said}; an operator decides it {where}. Call the tool again once it is approved "
            f"(one approval covers one call) and cite approval_id {approval_id} in your update"
            f"{receipt}",
        )

    async def _approval(self, verdict: GatewayVerdict) -> tuple[str, ApprovalStatus]:
        """The turn's pending approval of the tool, or a new one requested for the agent."""
        store = self.runtime.require_store()
        assert verdict.turn_id is not None and verdict.fence is not None
        turn_id, tool = verdict.turn_id, verdict.tool

        def pending(reader: Any) -> Any:
            row = reader.turn(turn_id)
            if row is None:
                return None
            for approval in reader.loop_approvals(row.loop_id, ApprovalStatus.PENDING):
                if approval.turn_id == turn_id and approval.tool == tool:
                    return approval
            return None

        existing = await store.read(pending)
        if existing is not None:
            return existing.approval_id, existing.status
        agent = self.runtime.principal()
        asked = await request_approval(
            store,
            Principal(id=agent.id, role="agent"),
            ApprovalRequest(
                turn_id=turn_id,
                fence=verdict.fence,
                tool=tool,
                summary=f"{agent.id} calls {tool} through the MCP gateway (one call)",
            ),
        )
        if not asked.requested or asked.approval_id is None:
            why = "; ".join(r.message for r in asked.reasons)
            raise LoopwardenError(f"the approval could not be requested: {why}")
        return asked.approval_id, asked.status or ApprovalStatus.PENDING

    # --- prompts and resources -----------------------------------------------------------------

    async def _allowed(
        self, ctx: ServerRequestContext[Any, Any], policy_name: str, arguments: dict[str, Any]
    ) -> str | None:
        """Why a prompt or resource read may not pass (None if it may): the loop served is
        active and observes, the tool rules allow the name, its argument rules hold."""
        loop_id = self.loop_of(ctx)
        found = await self._policy(loop_id) if loop_id else None
        if found is None:
            return "no loop the caller may see is served (gateway.loop, --loop, or the Loopwarden-Loop header)"
        policy, status = found
        if policy.observe_mode == "off":
            return "the loop's policy does not observe tool calls ([observe] mode is off)"
        if status != LoopStatus.ACTIVE:
            return f"the loop is {status}"
        verdict = explain(policy, policy_name)
        if verdict.rule != "allow":
            return verdict.explain()
        reasons = argument_reasons(policy.tools.arguments, policy_name, arguments)
        return "; ".join(r.message for r in reasons) if reasons else None

    async def _listable(self, ctx: ServerRequestContext[Any, Any]) -> LoopPolicy | None:
        loop_id = self.loop_of(ctx)
        found = await self._policy(loop_id) if loop_id else None
        if found is None or found[0].observe_mode == "off":
            return None
        return found[0]

    async def _gather(self, fetch: Any) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []

        async def one(downstream: Downstream) -> None:
            try:
                out.extend((downstream.name, item) for item in await fetch(downstream))
            except DownstreamError as exc:
                log.warning("%s", exc.message)

        async with anyio.create_task_group() as group:
            for downstream in self.downstreams.values():
                group.start_soon(one, downstream)
        return out

    async def _list_prompts(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
    ) -> HandlerResult:
        own = _dump(await call_next(ctx))
        policy = await self._listable(ctx)
        if policy is None:
            return own
        prompts = list(own.get("prompts", []))
        for server, prompt in await self._gather(lambda d: d.list_prompts()):
            name = str(prompt.get("name", ""))
            if explain(policy, prompt_policy_name(server, name)).rule == "allow":
                prompts.append({**prompt, "name": f"{server}{SEPARATOR}{name}"})
        own["prompts"] = prompts
        return own

    async def _get_prompt(
        self, ctx: ServerRequestContext[Any, Any], name: str, params: dict[str, Any]
    ) -> HandlerResult:
        split = self._split(name)
        assert split is not None
        downstream, prompt = split
        arguments = params.get("arguments") or {}
        why = await self._allowed(ctx, prompt_policy_name(downstream.name, prompt), arguments)
        if why is not None:
            raise MCPError(code=INVALID_PARAMS, message=f"loopwarden refused prompt {name}: {why}")
        try:
            return await downstream.get_prompt(prompt, arguments or None)
        except DownstreamError as exc:
            raise MCPError(code=-32603, message=exc.message) from None

    async def _list_resources(
        self, ctx: ServerRequestContext[Any, Any], call_next: CallNext, method: str
    ) -> HandlerResult:
        own = _dump(await call_next(ctx))
        policy = await self._listable(ctx)
        if policy is None:
            return own
        templates = method == "resources/templates/list"
        key, field_name = (
            ("resourceTemplates", "uriTemplate") if templates else ("resources", "uri")
        )
        items = list(own.get(key, []))
        fetch = (
            (lambda d: d.list_resource_templates()) if templates else (lambda d: d.list_resources())
        )
        for server, item in await self._gather(fetch):
            if explain(policy, resource_policy_name(server)).rule == "allow":
                items.append(
                    {**item, field_name: f"{RESOURCE_SCHEME}{server}/{item.get(field_name, '')}"}
                )
        own[key] = items
        return own

    async def _read_resource(self, ctx: ServerRequestContext[Any, Any], uri: str) -> HandlerResult:
        server, _, inner = uri[len(RESOURCE_SCHEME) :].partition("/")
        downstream = self.downstreams.get(server)
        if downstream is None or not inner:
            raise MCPError(code=INVALID_PARAMS, message=f"no downstream server serves {uri[:200]}")
        why = await self._allowed(ctx, resource_policy_name(server), {"uri": inner})
        if why is not None:
            raise MCPError(code=INVALID_PARAMS, message=f"loopwarden refused the read: {why}")
        try:
            result = await downstream.read_resource(inner)
        except DownstreamError as exc:
            raise MCPError(code=-32603, message=exc.message) from None
        dumped = _dump(result)
        for content in dumped.get("contents", []):
            content["uri"] = f"{RESOURCE_SCHEME}{server}/{content.get('uri', inner)}"
        return dumped

    # --- status --------------------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """Each server's health, as `gateway status` and the logs show it (no secret)."""
        return [
            {
                "server": d.name,
                "where": d.server.where,
                "health": d.health,
                "error": d.error,
                "restarts": d.restarts,
                "calls": d.calls,
                "protocol": d.protocol,
            }
            for d in self.downstreams.values()
        ]


def _segment(text: str) -> str:
    return _SEGMENT.sub("_", text) or "_"


def prompt_policy_name(server: str, prompt: str) -> str:
    """The policy name of a downstream prompt: `mcp.<server>.prompts.<name>` (four segments,
    so never a tool's)."""
    return f"mcp.{_segment(server)}.prompts.{_segment(prompt)}"[:MAX_NAME]


def resource_policy_name(server: str) -> str:
    """The policy name of reading a downstream server's resources: `mcp.<server>.resources.read`."""
    return f"mcp.{_segment(server)}.resources.read"
