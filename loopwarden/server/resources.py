"""MCP resources (the same read models as the tools, through the same operations) and the
`loop-operator` prompt."""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError

from loopwarden.errors import LoopwardenError, NotFound
from loopwarden.journal.receipt import receipt
from loopwarden.kernel.runner.operation import Operation
from loopwarden.kernel.state.events import ID_PATTERN, RECEIPT_ID_PATTERN
from loopwarden.projection.loop_list import list_loops
from loopwarden.projection.projection import loop_policy, policy_json, projection
from loopwarden.server.runtime import Runtime

LOOP_OPERATOR_PROMPT = """\
You are working inside a loop governed by loopwarden{where}. The loop has an objective, a
policy (who may act, which tools are allowed, denied or need approval, budgets, leases) and
todos. Every call you make is checked against the policy and sealed as a signed receipt.

Run each turn like this:
1. quota(loop_id): may you run a turn now? If not, read `reasons` and stop or wait.
2. claim(loop_id): take the next eligible todo. Note turn_id, fence, lease_expires_at,
   allowed_tools, approval_tools, denied_tools.
3. Work on that todo only, using only allowed tools. If you need an approval-gated tool, call
   request_approval first and wait until an operator approves it; never use denied tools.
   If the work outlasts the lease, call heartbeat(turn_id, fence).
4. update(turn_id, fence, outcome, tools_used, usage, evidence, summary, idempotency_key):
   report honestly - every tool you used with its count, the model calls, tokens, cost and wall
   time you consumed, and evidence (test output, diffs, digests). Completing a todo needs
   evidence. Cite approval_ids for approval-gated tools. If a call fails in transit, resend it
   with the same idempotency_key. A refused report is still charged (the work happened): if
   the turn stays open, fix the report, use a new key, and report only the usage since.
5. Respect the route: continue → claim again; wait → pause and check projection later;
   user_action_required → stop and tell the user what is needed; stop → the loop is over.

Use projection(loop_id) to see the whole state and who must act next, and receipt(...) to
prove what happened. A refusal is not an error to route around: it is the policy working.
"""


def _check(value: str, pattern: str, what: str) -> None:
    # Templates match empty and odd segments too; an invalid id can name nothing.
    if not re.fullmatch(pattern, value):
        raise ResourceNotFoundError(f"no {what} {value!r}")


async def _read(runtime: Runtime, op: Operation[Any, Any], request: dict[str, Any]) -> Any:
    try:
        return await op(runtime.require_store(), runtime.principal(), request)
    except NotFound as exc:
        raise ResourceNotFoundError(exc.message) from None
    except LoopwardenError as exc:
        raise ResourceError(f"{exc.code}: {exc.message}") from None


def _as_json(result: Any) -> str:
    return str(result.model_dump_json(indent=2))


@dataclass(frozen=True)
class ReadModel:
    """One resource: the operation it reads through, the id its URI carries, and how the
    result becomes the resource's text."""

    uri: str
    name: str
    description: str
    op: Operation[Any, Any]
    param: tuple[str, str, str] | None = None  # (URI parameter, id pattern, what it names)
    render: Callable[[Any], str] = _as_json


READ_MODELS = (
    ReadModel(
        "loopwarden://loops",
        "loops",
        "The loops the caller may see: id, objective, status, journal head.",
        list_loops,
    ),
    ReadModel(
        "loopwarden://loops/{loop_id}/projection",
        "loop-projection",
        "A loop's projection (the same as the projection tool).",
        projection,
        ("loop_id", ID_PATTERN, "loop"),
    ),
    ReadModel(
        "loopwarden://loops/{loop_id}/policy",
        "loop-policy",
        "A loop's normalized policy document.",
        loop_policy,
        ("loop_id", ID_PATTERN, "loop"),
        policy_json,
    ),
    ReadModel(
        "loopwarden://receipts/{receipt_id}",
        "receipt",
        "A signed receipt with its verification status and inclusion proof.",
        receipt,
        ("receipt_id", RECEIPT_ID_PATTERN, "receipt"),
    ),
)


def _reader(runtime: Runtime, model: ReadModel) -> Callable[..., Awaitable[str]]:
    """The resource function the SDK calls: its parameter is named as in the URI template."""
    if model.param is None:

        async def read_all() -> str:
            return model.render(await _read(runtime, model.op, {}))

        return read_all
    name, pattern, what = model.param

    async def read_one(**uri: str) -> str:
        _check(uri[name], pattern, what)
        return model.render(await _read(runtime, model.op, {name: uri[name]}))

    # The SDK matches URI parameters to the function's by name, from its signature and hints.
    read_one.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str)]
    )
    read_one.__annotations__ = {name: str, "return": str}
    return read_one


def register_resources(server: MCPServer, runtime: Runtime) -> None:
    """The read models as resources, and the `loop-operator` prompt."""
    for model in READ_MODELS:
        register = server.resource(
            model.uri, name=model.name, description=model.description, mime_type="application/json"
        )
        register(_reader(runtime, model))

    @server.prompt(
        name="loop-operator",
        description="How to run a governed loop with loopwarden's tools.",
    )
    def loop_operator(loop_id: str = "") -> str:
        where = f" (loop {loop_id})" if loop_id else ""
        return LOOP_OPERATOR_PROMPT.format(where=where)
