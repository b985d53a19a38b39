"""A typed agent client: loopwarden's tools over any MCP transport, with typed results.

    async with AgentClient.stdio("builder", home=...) as agent:
        grant = await agent.claim("loop-1")

Each method calls the MCP tool and parses its structured output into the same result model the
kernel returns; a tool error (malformed input, unknown id, forbidden) raises `ToolCallError`
with the server's message. Policy refusals are results, not errors.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from mcp import Client, StdioServerParameters
from pydantic import BaseModel

from loopwarden.tools.approvals import ApprovalRequestResult, DecideApprovalResult
from loopwarden.tools.claim import ClaimResult
from loopwarden.tools.loops import OpenLoopResult
from loopwarden.tools.projection import ProjectionResult
from loopwarden.tools.quota import QuotaResult
from loopwarden.tools.receipt import ReceiptResult
from loopwarden.tools.turns import HeartbeatResult, TodoAddResult
from loopwarden.tools.update import UpdateResult

M = TypeVar("M", bound=BaseModel)


class ToolCallError(Exception):
    """The server answered a tool call with an error (the message is safe to show)."""


def serve_command(agent: str, home: str | Path, role: str = "agent") -> StdioServerParameters:
    """How to launch `loopwarden serve` for one agent over stdio."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "loopwarden", "serve", "--agent", agent, "--role", role, "--home", str(home)],
    )


class AgentClient:
    def __init__(self, client: Client) -> None:
        self.client = client

    @classmethod
    @asynccontextmanager
    async def connect(cls, target: Any) -> AsyncIterator[AgentClient]:
        """`target`: an MCPServer (in-process), StdioServerParameters, a URL or a transport."""
        async with Client(target) as client:
            yield cls(client)

    @classmethod
    def stdio(cls, agent: str, home: str | Path, role: str = "agent"):
        return cls.connect(serve_command(agent, home, role))

    async def call(self, name: str, result_type: type[M], /, **arguments: Any) -> M:
        """Call tool `name` (None-valued arguments are omitted) and parse its structured result."""
        args = {k: v for k, v in arguments.items() if v is not None}
        result = await self.client.call_tool(name, args)
        if result.is_error:
            text = " ".join(getattr(c, "text", "") for c in result.content)
            raise ToolCallError(text.removeprefix(f"Error executing tool {name}: "))
        return result_type.model_validate(result.structured_content)

    async def quota(self, loop_id: str) -> QuotaResult:
        return await self.call("quota", QuotaResult, loop_id=loop_id)

    async def claim(
        self, loop_id: str, todo_id: str | None = None, idempotency_key: str | None = None
    ) -> ClaimResult:
        return await self.call(
            "claim", ClaimResult, loop_id=loop_id, todo_id=todo_id, idempotency_key=idempotency_key
        )

    async def update(
        self,
        turn_id: str,
        fence: int,
        outcome: str,
        summary: str,
        idempotency_key: str,
        **report: Any,
    ) -> UpdateResult:
        return await self.call(
            "update",
            UpdateResult,
            turn_id=turn_id,
            fence=fence,
            outcome=outcome,
            summary=summary,
            idempotency_key=idempotency_key,
            **report,
        )

    async def heartbeat(self, turn_id: str, fence: int) -> HeartbeatResult:
        return await self.call("heartbeat", HeartbeatResult, turn_id=turn_id, fence=fence)

    async def projection(self, loop_id: str) -> ProjectionResult:
        return await self.call("projection", ProjectionResult, loop_id=loop_id)

    async def receipt(
        self, receipt_id: str | None = None, loop_id: str | None = None, seq: int | None = None
    ) -> ReceiptResult:
        return await self.call(
            "receipt", ReceiptResult, receipt_id=receipt_id, loop_id=loop_id, seq=seq
        )

    async def todo_add(self, loop_id: str, title: str, **options: Any) -> TodoAddResult:
        return await self.call("todo_add", TodoAddResult, loop_id=loop_id, title=title, **options)

    async def request_approval(
        self,
        turn_id: str,
        fence: int,
        tool: str,
        summary: str,
        artifact_digest: str | None = None,
        idempotency_key: str | None = None,
    ) -> ApprovalRequestResult:
        return await self.call(
            "request_approval",
            ApprovalRequestResult,
            turn_id=turn_id,
            fence=fence,
            tool=tool,
            summary=summary,
            artifact_digest=artifact_digest,
            idempotency_key=idempotency_key,
        )

    async def open_loop(
        self,
        objective: str,
        policy: dict[str, Any],
        todos: list[dict[str, Any]] | None = None,
        loop_id: str | None = None,
    ) -> OpenLoopResult:
        return await self.call(
            "open_loop",
            OpenLoopResult,
            objective=objective,
            policy=policy,
            todos=todos or [],
            loop_id=loop_id,
        )

    async def decide_approval(
        self,
        approval_id: str,
        approve: bool,
        expires_in_seconds: int | None = None,
        reason: str = "",
    ) -> DecideApprovalResult:
        return await self.call(
            "decide_approval",
            DecideApprovalResult,
            approval_id=approval_id,
            approve=approve,
            expires_in_seconds=expires_in_seconds,
            reason=reason,
        )
