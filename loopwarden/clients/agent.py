"""A typed agent client: loopwarden's tools over any MCP transport, with typed results.

    async with AgentClient.stdio("builder", home=...) as agent:
        grant = await agent.claim("loop-1")

Each method builds the operation's own request model (so a bad argument fails here, with the
same limits the server enforces), calls the MCP tool and parses its structured output into the
operation's result model. A tool error raises `ToolCallError` with the server's `code` and
message. Policy refusals are results, not errors.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from mcp import Client, StdioServerParameters
from pydantic import BaseModel

from loopwarden.ledger.events import Evidence, ToolUse, Usage
from loopwarden.operations import approvals as approvals_ops
from loopwarden.operations import claim as claim_ops
from loopwarden.operations import leases as lease_ops
from loopwarden.operations import loops as loop_ops
from loopwarden.operations import projection as projection_ops
from loopwarden.operations import quota as quota_ops
from loopwarden.operations import receipt as receipt_ops
from loopwarden.operations import todos as todo_ops
from loopwarden.operations import update as update_ops
from loopwarden.operations.operation import Operation, Req, Res
from loopwarden.principals import Role

M = TypeVar("M", bound=BaseModel)


class ToolCallError(Exception):
    """The server answered a tool call with an error (the message is safe to show)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def serve_command(agent: str, home: str | Path, role: Role = "agent") -> StdioServerParameters:
    """How to launch `loopwarden serve` for one agent over stdio."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "loopwarden", "serve", "--agent", agent, "--role", role, "--home", str(home)],
    )


def _error(result: Any, name: str) -> ToolCallError:
    error = (result.structured_content or {}).get("error")
    if isinstance(error, dict) and "code" in error:
        return ToolCallError(str(error["code"]), str(error.get("message", "")))
    text = " ".join(getattr(c, "text", "") for c in result.content)
    code, _, message = text.removeprefix(f"Error executing tool {name}: ").partition(": ")
    return ToolCallError(code if message else "error", message or code)


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
    def stdio(cls, agent: str, home: str | Path, role: Role = "agent") -> Any:
        return cls.connect(serve_command(agent, home, role))

    async def call(self, op: Operation[Req, Res], request: Req) -> Res:
        """Call the operation's tool with a request built from its own model."""
        return await self.raw(
            op.name, op.result, **request.model_dump(mode="json", exclude_none=True)
        )

    async def raw(self, name: str, result_type: type[M], /, **arguments: Any) -> M:
        """Call tool `name` with arguments as given (None-valued ones omitted): no client-side
        checks, for probing the server with anything."""
        args = {k: v for k, v in arguments.items() if v is not None}
        result = await self.client.call_tool(name, args)
        if result.is_error:
            raise _error(result, name)
        return result_type.model_validate(result.structured_content)

    async def quota(self, loop_id: str) -> quota_ops.QuotaResult:
        return await self.call(quota_ops.quota, quota_ops.QuotaRequest(loop_id=loop_id))

    async def claim(
        self, loop_id: str, todo_id: str | None = None, idempotency_key: str | None = None
    ) -> claim_ops.ClaimResult:
        request = claim_ops.ClaimRequest(
            loop_id=loop_id, todo_id=todo_id, idempotency_key=idempotency_key
        )
        return await self.call(claim_ops.claim, request)

    async def update(
        self,
        turn_id: str,
        fence: int,
        outcome: str,
        summary: str,
        idempotency_key: str,
        *,
        tools_used: Sequence[ToolUse | dict[str, Any]] = (),
        usage: Usage | dict[str, Any] | None = None,
        evidence: Sequence[Evidence | dict[str, Any]] = (),
        failure_signature: str | None = None,
        approval_ids: Sequence[str] = (),
    ) -> update_ops.UpdateResult:
        request = update_ops.UpdateRequest.model_validate(
            {
                "turn_id": turn_id,
                "fence": fence,
                "outcome": outcome,
                "summary": summary,
                "idempotency_key": idempotency_key,
                "tools_used": list(tools_used),
                "usage": usage or Usage(),
                "evidence": list(evidence),
                "failure_signature": failure_signature,
                "approval_ids": list(approval_ids),
            }
        )
        return await self.call(update_ops.update, request)

    async def heartbeat(self, turn_id: str, fence: int) -> lease_ops.HeartbeatResult:
        return await self.call(
            lease_ops.heartbeat, lease_ops.HeartbeatRequest(turn_id=turn_id, fence=fence)
        )

    async def projection(self, loop_id: str) -> projection_ops.ProjectionResult:
        return await self.call(
            projection_ops.projection, projection_ops.ProjectionRequest(loop_id=loop_id)
        )

    async def receipt(
        self, receipt_id: str | None = None, loop_id: str | None = None, seq: int | None = None
    ) -> receipt_ops.ReceiptResult:
        request = receipt_ops.ReceiptRequest(receipt_id=receipt_id, loop_id=loop_id, seq=seq)
        return await self.call(receipt_ops.receipt, request)

    async def todo_add(
        self,
        loop_id: str,
        title: str,
        *,
        todo_id: str | None = None,
        depends_on: Sequence[str] = (),
        order: int | None = None,
        idempotency_key: str | None = None,
    ) -> todo_ops.TodoAddResult:
        request = todo_ops.TodoAddRequest(
            loop_id=loop_id,
            title=title,
            todo_id=todo_id,
            depends_on=list(depends_on),
            order=order,
            idempotency_key=idempotency_key,
        )
        return await self.call(todo_ops.todo_add, request)

    async def request_approval(
        self,
        turn_id: str,
        fence: int,
        tool: str,
        summary: str,
        artifact_digest: str | None = None,
        idempotency_key: str | None = None,
    ) -> approvals_ops.ApprovalRequestResult:
        request = approvals_ops.ApprovalRequest(
            turn_id=turn_id,
            fence=fence,
            tool=tool,
            summary=summary,
            artifact_digest=artifact_digest,
            idempotency_key=idempotency_key,
        )
        return await self.call(approvals_ops.request_approval, request)

    async def open_loop(
        self,
        objective: str,
        policy: dict[str, Any],
        todos: Sequence[loop_ops.TodoInput | dict[str, Any]] = (),
        loop_id: str | None = None,
    ) -> loop_ops.OpenLoopResult:
        request = loop_ops.OpenLoopRequest.model_validate(
            {"objective": objective, "policy": policy, "todos": list(todos), "loop_id": loop_id}
        )
        return await self.call(loop_ops.open_loop, request)

    async def decide_approval(
        self, approval_id: str, approve: bool, expires_in_seconds: int = 3600, reason: str = ""
    ) -> approvals_ops.DecideApprovalResult:
        request = approvals_ops.DecideApprovalRequest(
            approval_id=approval_id,
            approve=approve,
            expires_in_seconds=expires_in_seconds,
            reason=reason,
        )
        return await self.call(approvals_ops.decide_approval, request)
