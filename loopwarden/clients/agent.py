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

from loopwarden.approvals import approval_ops as approvals_ops
from loopwarden.journal import receipt as receipt_ops
from loopwarden.kernel.runner.operation import Operation, Req, Res
from loopwarden.kernel.state.events import Evidence, ToolUse, Usage
from loopwarden.loops import lifecycle as loop_ops
from loopwarden.principals import Role
from loopwarden.projection import projection as projection_ops
from loopwarden.todos import todo_ops
from loopwarden.tool_errors import error_of
from loopwarden.turns import claim as claim_ops
from loopwarden.turns import leases as lease_ops
from loopwarden.turns import quota as quota_ops
from loopwarden.turns import update as update_ops

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
    error = error_of(result)
    if error is not None:
        return ToolCallError(*error)
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

    async def _run(self, op: Operation[Req, Res], arguments: dict[str, Any]) -> Res:
        """Call `op` with a method's own arguments (`locals()`), parsed by the op's request
        model: a method's signature is the only place it restates the request."""
        request = op.request.model_validate({k: v for k, v in arguments.items() if k != "self"})
        return await self.call(op, request)

    async def quota(self, loop_id: str) -> quota_ops.QuotaResult:
        return await self._run(quota_ops.quota, locals())

    async def claim(
        self, loop_id: str, todo_id: str | None = None, idempotency_key: str | None = None
    ) -> claim_ops.ClaimResult:
        return await self._run(claim_ops.claim, locals())

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
        usage = usage or Usage()
        return await self._run(update_ops.update, locals())

    async def heartbeat(self, turn_id: str, fence: int) -> lease_ops.HeartbeatResult:
        return await self._run(lease_ops.heartbeat, locals())

    async def projection(self, loop_id: str) -> projection_ops.ProjectionResult:
        return await self._run(projection_ops.projection, locals())

    async def receipt(
        self,
        receipt_id: str | None = None,
        loop_id: str | None = None,
        seq: int | None = None,
        *,
        wait: bool = False,
    ) -> receipt_ops.ReceiptResult:
        return await self._run(receipt_ops.receipt, locals())

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
        return await self._run(todo_ops.todo_add, locals())

    async def request_approval(
        self,
        turn_id: str,
        fence: int,
        tool: str,
        summary: str,
        artifact_digest: str | None = None,
        idempotency_key: str | None = None,
    ) -> approvals_ops.ApprovalRequestResult:
        return await self._run(approvals_ops.request_approval, locals())

    async def open_loop(
        self,
        objective: str,
        policy: dict[str, Any],
        todos: Sequence[loop_ops.TodoInput | dict[str, Any]] = (),
        loop_id: str | None = None,
    ) -> loop_ops.OpenLoopResult:
        return await self._run(loop_ops.open_loop, locals())

    async def decide_approval(
        self, approval_id: str, approve: bool, expires_in_seconds: int = 3600, reason: str = ""
    ) -> approvals_ops.DecideApprovalResult:
        return await self._run(approvals_ops.decide_approval, locals())
