"""Approvals through the client: `request_approval` can put the dashboard's page for the new
approval in front of the human in the agent's client (MCP URL-mode elicitation).

The approval is requested and sealed as before; then, if the server knows the dashboard's
address and the client declared URL-mode elicitation, the agent's client is asked to show
`…/approvals/{id}`:

- MCP 2026-07-28: the call answers `input_required` with one URL-mode `elicitation/create` and a
  `requestState` (sealed by the SDK, `request_state.py`) naming the approval; the client's retry
  reads the approval's current status through `projection` and answers the ordinary result;
- MCP 2025-11-25: the server sends the `elicitation/create` request during the call.

Either way the answer is today's result (`status` `pending` until an operator decides), and a
client without URL mode gets exactly today's answer. The page is the dashboard's, behind its
operator sign-in: the decision is sealed by the operator who makes it there, never by the agent,
whose token cannot sign in (the link carries no credential). Optionally each new approval is
also posted to a webhook (a chat channel) with the page's link: in the background, bounded,
with the ids, tool and agent only (never the summary, never a token).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
from mcp.server.mcpserver.tools import Tool
from mcp_types import (
    CallToolResult,
    ElicitRequest,
    ElicitRequestURLParams,
    InputRequiredResult,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from loopwarden.approvals.approval_ops import ApprovalRequestResult
from loopwarden.errors import LoopwardenError
from loopwarden.projection.projection import projection
from loopwarden.server.runtime import Runtime
from loopwarden.server.tools import (
    GovernedTool,
    make_tool,
    success_result,
    tool_annotations,
)
from loopwarden.tool_errors import error_result

log = logging.getLogger("loopwarden.server")

WEBHOOK_SECONDS = 5.0
MAX_PENDING_POSTS = 100
INPUT_KEY = "approval"


def wants_url(context: Any) -> bool:
    """True if the calling client declared URL-mode elicitation."""
    caps = context.client_capabilities
    elicitation = None if caps is None else caps.elicitation
    return elicitation is not None and elicitation.url is not None


@dataclass
class ApprovalLinks:
    """Where approval pages are (`base_url`, None: nowhere known) and who else to tell."""

    runtime: Runtime
    base_url: str | None
    webhook: str | None = None
    _send: Any = field(default=None, repr=False)
    posted: int = 0  # webhook posts delivered (2xx)

    def page(self, approval_id: str) -> str:
        assert self.base_url is not None
        return f"{self.base_url}/approvals/{approval_id}"

    async def offer(
        self, context: Any, result: CallToolResult
    ) -> CallToolResult | InputRequiredResult:
        """`result`, or for a new approval and a client that can open URLs, the request to
        open the approval's page (module docstring)."""
        content = result.structured_content
        if result.is_error or not isinstance(content, dict) or not content.get("requested"):
            return result
        approval_id = str(content["approval_id"])
        store = self.runtime.require_store()
        approval = await store.read(lambda reader: reader.approval(approval_id))
        if approval is None or self.base_url is None:
            return result
        self.announce(approval_id, approval.loop_id, approval.tool, approval.requested_by)
        if not wants_url(context):
            return result
        message = (
            f"{approval.requested_by} asks to use {approval.tool} in loop {approval.loop_id}. "
            "An operator approves or rejects it on this page (sign in as an operator)."
        )
        if context.protocol_version in MODERN_PROTOCOL_VERSIONS:
            state = {"approval_id": approval_id, "loop_id": approval.loop_id}
            state["receipt_id"] = str(content["receipt_id"])
            ask = ElicitRequestURLParams(mode="url", message=message, url=self.page(approval_id))
            return InputRequiredResult(
                input_requests={INPUT_KEY: ElicitRequest(params=ask)},
                request_state=json.dumps(state),
            )
        try:
            await context.elicit_url(message, self.page(approval_id), approval_id)
        except Exception as exc:  # the client could not show it: today's answer stands
            log.info("approval link for %s not shown: %s", approval_id, type(exc).__name__)
        return result

    async def resume(self, context: Any, state: str) -> CallToolResult:
        """The retry after the link was shown: the approval's current status, read through
        `projection` as the caller (the SDK verified that this state is the caller's)."""
        try:
            data = json.loads(state)
            store = self.runtime.require_store()
            view = await projection(store, self.runtime.principal(), {"loop_id": data["loop_id"]})
        except LoopwardenError as exc:
            return error_result(exc.code, exc.message)
        except (ValueError, KeyError, TypeError):
            return error_result("invalid_input", "this retry's request state is not an approval's")
        found = [a for a in view.approvals if a.approval_id == data["approval_id"]]
        if not found:
            return error_result("not_found", f"no approval with id {data['approval_id']!r}")
        return success_result(
            ApprovalRequestResult(
                requested=True,
                reasons=[],
                approval_id=found[0].approval_id,
                status=found[0].status,
                receipt_id=data["receipt_id"],
            )
        )

    # --- the webhook ---------------------------------------------------------------------------

    def announce(self, approval_id: str, loop_id: str, tool: str, agent: str) -> None:
        """Queue the webhook post for a new approval (dropped, with a warning, when the queue
        is full or the webhook is not running)."""
        if self.webhook is None or self._send is None:
            return
        url = self.page(approval_id)
        post = {
            "text": f"loopwarden: {agent} asks to use {tool} in loop {loop_id}. Decide: {url}",
            "approval_id": approval_id,
            "loop_id": loop_id,
            "tool": tool,
            "agent": agent,
            "url": url,
        }
        try:
            self._send.send_nowait(post)
        except anyio.WouldBlock:
            log.warning("approval webhook queue full; %s not posted", approval_id)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[ApprovalLinks]:
        """Post queued approvals to the webhook while the server runs (a no-op without one)."""
        if self.webhook is None:
            yield self
            return
        send, receive = anyio.create_memory_object_stream[dict[str, str]](MAX_PENDING_POSTS)
        self._send = send
        async with anyio.create_task_group() as group:
            group.start_soon(self._deliver, receive)
            try:
                yield self
            finally:
                self._send = None
                group.cancel_scope.cancel()

    async def _deliver(self, posts: Any) -> None:
        assert self.webhook is not None
        async with httpx2.AsyncClient(timeout=WEBHOOK_SECONDS, follow_redirects=False) as http:
            async for post in posts:
                try:
                    response = await http.post(self.webhook, json=post)
                    if response.is_success:
                        self.posted += 1
                    else:
                        log.warning("approval webhook answered HTTP %d", response.status_code)
                except httpx2.HTTPError as exc:
                    log.warning("approval webhook failed: %s", type(exc).__name__)


class ApprovalTool(GovernedTool):
    """`request_approval`, offering the approval's page to a client that can open it."""

    links: Any = None  # the ApprovalLinks

    async def run(  # type: ignore[override]  # the SDK's Tool.run may answer input_required
        self, arguments: dict[str, Any], context: Any, convert_result: bool = False
    ) -> CallToolResult | InputRequiredResult:
        links: ApprovalLinks = self.links
        if context.request_state is not None:
            return await links.resume(context, context.request_state)
        return await links.offer(context, await super().run(arguments, context, convert_result))


def with_approval_links(tools: list[Tool], links: ApprovalLinks) -> list[Tool]:
    """`tools` with `request_approval` replaced by an `ApprovalTool` using `links`."""
    out: list[Tool] = []
    for tool in tools:
        if isinstance(tool, GovernedTool) and tool.name == "request_approval":
            op = tool.operation
            replaced = make_tool(
                ApprovalTool,
                op.name,
                op.description,
                op.request,
                op.result,
                tool_annotations(op),
                op,
            )
            assert isinstance(replaced, ApprovalTool)
            replaced.links = links
            tool = replaced
        out.append(tool)
    return out
