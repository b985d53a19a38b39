"""The MCP tools: flat, described arguments → the kernel operation → a structured result.

Handlers only adapt. The docstrings are what an agent reads to decide when to call a tool.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import Field, ValidationError

from loopwarden.ledger.events import (
    APPROVAL_ID_PATTERN,
    DIGEST_PATTERN,
    ID_PATTERN,
    MAX_OBJECTIVE,
    MAX_SUMMARY,
    MAX_TITLE,
    RECEIPT_ID_PATTERN,
    TURN_ID_PATTERN,
    Evidence,
    Outcome,
    ToolUse,
    Usage,
)
from loopwarden.policy.patterns import TOOL_NAME_RE
from loopwarden.server.runtime import Runtime, describe_validation, invoke
from loopwarden.tools import approvals as approvals_op
from loopwarden.tools import claim as claim_op
from loopwarden.tools import loops as loops_op
from loopwarden.tools import projection as projection_op
from loopwarden.tools import quota as quota_op
from loopwarden.tools import receipt as receipt_op
from loopwarden.tools import turns as turns_op
from loopwarden.tools import update as update_op
from loopwarden.tools.common import IDEMPOTENCY_KEY_PATTERN

LoopIdArg = Annotated[str, Field(description="The loop's id.", pattern=ID_PATTERN)]
TurnIdArg = Annotated[
    str, Field(description="The turn id returned by claim.", pattern=TURN_ID_PATTERN)
]
FenceArg = Annotated[int, Field(description="The fence returned by claim.", ge=0, le=2**53)]
TodoIdArg = Annotated[str | None, Field(description="A todo id.", pattern=ID_PATTERN)]
OptionalKeyArg = Annotated[
    str | None,
    Field(
        description="Optional key: resending the same call with the same key returns the "
        "original result instead of acting twice.",
        pattern=IDEMPOTENCY_KEY_PATTERN,
    ),
]
KeyArg = Annotated[
    str,
    Field(
        description="A key unique to this report; resending the same call with the same key is safe.",
        pattern=IDEMPOTENCY_KEY_PATTERN,
    ),
]


def _runtime(ctx: Context) -> Runtime:
    return ctx.request_context.lifespan_context


async def quota(loop_id: LoopIdArg, ctx: Context) -> quota_op.QuotaResult:
    """Check whether you may run a turn in this loop now, before claiming.

    Returns `allowed`, every reason a claim would be refused, the loop status, each budget's
    limit / used / remaining and the rate window. Changes nothing.
    """
    return await invoke(_runtime(ctx), quota_op.quota, quota_op.QuotaRequest, loop_id=loop_id)


async def claim(
    loop_id: LoopIdArg,
    ctx: Context,
    todo_id: Annotated[
        str | None,
        Field(
            description="A specific todo to claim; omit for the next eligible one.",
            pattern=ID_PATTERN,
        ),
    ] = None,
    idempotency_key: OptionalKeyArg = None,
) -> claim_op.ClaimResult:
    """Start a turn: claim the next eligible todo under a lease before doing any work.

    If `granted`, work only on `todo_id`, use only `allowed_tools` (and `approval_tools` with an
    approved approval), finish before `lease_expires_at` (or call heartbeat), then report with
    update using `turn_id` and `fence`. If not granted, `reasons` say why; do not retry in a
    tight loop.
    """
    return await invoke(
        _runtime(ctx),
        claim_op.claim,
        claim_op.ClaimRequest,
        loop_id=loop_id,
        todo_id=todo_id,
        idempotency_key=idempotency_key,
    )


async def update(
    turn_id: TurnIdArg,
    fence: FenceArg,
    outcome: Annotated[
        Outcome,
        Field(
            description="progress (more to do), completed (todo done), failed, or blocked (needs a human)."
        ),
    ],
    summary: Annotated[str, Field(description="What you did this turn.", max_length=MAX_SUMMARY)],
    idempotency_key: KeyArg,
    ctx: Context,
    tools_used: Annotated[
        list[ToolUse], Field(description="Every tool you called this turn, with its call count.")
    ] = [],  # noqa: B006 - the SDK copies defaults per call
    usage: Annotated[Usage, Field(description="What the turn consumed.")] = Usage(),
    evidence: Annotated[
        list[Evidence], Field(description="Evidence of the work: test results, diffs, logs, URLs.")
    ] = [],  # noqa: B006
    failure_signature: Annotated[
        str | None, Field(description="For failed turns: a stable short signature of the failure.")
    ] = None,
    approval_ids: Annotated[
        list[str], Field(description="Approved approvals covering approval-gated tools you used.")
    ] = [],  # noqa: B006
) -> update_op.UpdateResult:
    """Close your turn with an honest report: outcome, tools used, usage, evidence, summary.

    Every turn you claim must end with exactly one accepted update. Budgets are charged from
    `usage`; tools are checked against the loop's policy (a forbidden tool is refused and may
    stop the loop). Completing a todo may require evidence. Then follow `route`: continue
    (claim again), wait, user_action_required (stop and tell the user), or stop.
    """
    return await invoke(
        _runtime(ctx),
        update_op.update,
        update_op.UpdateRequest,
        turn_id=turn_id,
        fence=fence,
        outcome=outcome,
        tools_used=tools_used,
        usage=usage,
        evidence=evidence,
        summary=summary,
        failure_signature=failure_signature,
        approval_ids=approval_ids,
        idempotency_key=idempotency_key,
    )


async def receipt(
    ctx: Context,
    receipt_id: Annotated[
        str | None, Field(description="The receipt id (rcpt-…).", pattern=RECEIPT_ID_PATTERN)
    ] = None,
    loop_id: Annotated[
        str | None, Field(description="With seq: the loop of the receipt.", pattern=ID_PATTERN)
    ] = None,
    seq: Annotated[
        int | None, Field(description="With loop_id: the receipt's sequence number.", ge=1)
    ] = None,
) -> receipt_op.ReceiptResult:
    """Fetch a signed receipt with its verification status and Merkle inclusion proof.

    Address it by `receipt_id`, or by `loop_id` and `seq`. Use it to prove what happened.
    """
    return await invoke(
        _runtime(ctx),
        receipt_op.receipt,
        receipt_op.ReceiptRequest,
        receipt_id=receipt_id,
        loop_id=loop_id,
        seq=seq,
    )


async def projection(loop_id: LoopIdArg, ctx: Context) -> projection_op.ProjectionResult:
    """Read the loop's current state: status, budgets, todos, leases, approvals, recent
    receipts, who must act next (attention) and the next action. Call it to orient yourself."""
    return await invoke(
        _runtime(ctx), projection_op.projection, projection_op.ProjectionRequest, loop_id=loop_id
    )


async def heartbeat(turn_id: TurnIdArg, fence: FenceArg, ctx: Context) -> turns_op.HeartbeatResult:
    """Extend your lease on an open turn when the work takes longer than the lease."""
    return await invoke(
        _runtime(ctx), turns_op.heartbeat, turns_op.HeartbeatRequest, turn_id=turn_id, fence=fence
    )


async def todo_add(
    loop_id: LoopIdArg,
    title: Annotated[
        str, Field(description="What the new todo is.", min_length=1, max_length=MAX_TITLE)
    ],
    ctx: Context,
    todo_id: TodoIdArg = None,
    depends_on: Annotated[
        list[str], Field(description="Ids of todos that must be done first.")
    ] = [],  # noqa: B006
    order: Annotated[
        int | None, Field(description="Claim order; default: last.", ge=0, le=10**9)
    ] = None,
    idempotency_key: OptionalKeyArg = None,
) -> turns_op.TodoAddResult:
    """Add a todo you discovered, if the loop's policy lets agents add work."""
    return await invoke(
        _runtime(ctx),
        turns_op.todo_add,
        turns_op.TodoAddRequest,
        loop_id=loop_id,
        title=title,
        todo_id=todo_id,
        depends_on=depends_on,
        order=order,
        idempotency_key=idempotency_key,
    )


async def request_approval(
    turn_id: TurnIdArg,
    fence: FenceArg,
    tool: Annotated[
        str,
        Field(
            description="The approval-gated tool, e.g. deploy.prod.", pattern=TOOL_NAME_RE.pattern
        ),
    ],
    summary: Annotated[
        str,
        Field(description="What the tool will do and why.", min_length=1, max_length=MAX_SUMMARY),
    ],
    ctx: Context,
    artifact_digest: Annotated[
        str | None,
        Field(
            description="Optional sha256:… of the artifact the approval is for.",
            pattern=DIGEST_PATTERN,
        ),
    ] = None,
    idempotency_key: OptionalKeyArg = None,
) -> approvals_op.ApprovalRequestResult:
    """Ask a human operator to approve one approval-gated tool for your open turn.

    Do not use the tool until projection or the operator shows the approval as approved; then
    cite its `approval_id` in your update.
    """
    return await invoke(
        _runtime(ctx),
        approvals_op.request_approval,
        approvals_op.ApprovalRequest,
        turn_id=turn_id,
        fence=fence,
        tool=tool,
        summary=summary,
        artifact_digest=artifact_digest,
        idempotency_key=idempotency_key,
    )


async def open_loop(
    objective: Annotated[
        str, Field(description="What the loop is for.", min_length=1, max_length=MAX_OBJECTIVE)
    ],
    policy: Annotated[
        dict[str, Any], Field(description="The policy document (same keys as a policy file).")
    ],
    ctx: Context,
    todos: Annotated[
        list[loops_op.TodoInput], Field(description="Initial todos, in claim order.")
    ] = [],  # noqa: B006
    loop_id: Annotated[
        str | None, Field(description="Optional id for the loop.", pattern=ID_PATTERN)
    ] = None,
) -> loops_op.OpenLoopResult:
    """Operator only: open a governed loop with an objective, a policy and initial todos."""
    return await invoke(
        _runtime(ctx),
        loops_op.open_loop,
        loops_op.OpenLoopRequest,
        objective=objective,
        policy=policy,
        todos=todos,
        loop_id=loop_id,
    )


async def decide_approval(
    approval_id: Annotated[
        str, Field(description="The approval id (appr-…).", pattern=APPROVAL_ID_PATTERN)
    ],
    approve: Annotated[bool, Field(description="true to approve, false to reject.")],
    ctx: Context,
    expires_in_seconds: Annotated[
        int, Field(description="How long an approval stays usable, in seconds.", ge=1)
    ] = 3600,
    reason: Annotated[str, Field(description="Why.", max_length=MAX_SUMMARY)] = "",
) -> approvals_op.DecideApprovalResult:
    """Operator only: approve or reject a pending approval request."""
    return await invoke(
        _runtime(ctx),
        approvals_op.decide_approval,
        approvals_op.DecideApprovalRequest,
        approval_id=approval_id,
        approve=approve,
        expires_in_seconds=expires_in_seconds,
        reason=reason,
    )


READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
MUTATING = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
IDEMPOTENT = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)

# name → (handler, annotations)
TOOLS = {
    "quota": (quota, READ_ONLY),
    "claim": (claim, MUTATING),
    "update": (update, IDEMPOTENT),
    "receipt": (receipt, READ_ONLY),
    "projection": (projection, READ_ONLY),
    "heartbeat": (heartbeat, MUTATING),
    "todo_add": (todo_add, MUTATING),
    "request_approval": (request_approval, MUTATING),
    "open_loop": (open_loop, MUTATING),
    "decide_approval": (decide_approval, MUTATING),
}


class GovernedTool(Tool):
    """A tool whose argument errors read like every other loopwarden error.

    The SDK validates the flat arguments before the handler runs and reports pydantic's raw
    dump (URLs, echoed input). Those become `invalid_input: field: reason` lines here; any other
    failure is passed through untouched.
    """

    async def run(
        self, arguments: dict[str, Any], context: Any, convert_result: bool = False
    ) -> Any:
        try:
            return await super().run(arguments, context, convert_result)
        except ToolError as exc:
            cause = exc.__cause__
            if type(exc) is ToolError and isinstance(cause, ValidationError):
                raise ToolError(
                    f"Error executing tool {self.name}: {describe_validation(cause)}"
                ) from None
            raise


def strict(tool: Tool) -> Tool:
    """Reject unknown arguments (the SDK ignores them by default) and advertise it in the schema."""
    model = tool.fn_metadata.arg_model
    model.model_config["extra"] = "forbid"
    model.model_rebuild(force=True)
    tool.parameters = model.model_json_schema(by_alias=True)
    return tool


def build_tools() -> list[Tool]:
    return [
        strict(
            GovernedTool.from_function(
                fn,
                name=name,
                description=inspect.cleandoc(fn.__doc__ or ""),
                annotations=annotations,
                structured_output=True,
            )
        )
        for name, (fn, annotations) in TOOLS.items()
    ]
