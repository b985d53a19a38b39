"""Receipt facts: the vocabulary the journal records, one typed `data` model per kind.

These models are the receipt schema an audit checks (`extra="forbid"` everywhere). Each kind's
data model is named by its spec in the kind registry (`registry.py`), which also generates the
body class of each kind (its `kind` literal and its `data` model) and the discriminated union
that parses a body: consumers get typed facts, never a dict to index. The small value types
(usage, tool use, evidence, todo specs) double as the operations' input types, so one set of
limits guards both.
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    WithJsonSchema,
    create_model,
    model_validator,
)

from loopwarden.clock import format_time, parse_time
from loopwarden.policy.budgets import DIMENSIONS, Totals, charged
from loopwarden.policy.patterns import TOOL_NAME_RE

RECEIPT_SCHEMA: Final = "loopwarden.receipt/v1"

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
TIME_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$"
TURN_ID_PATTERN = r"^turn-[0-9a-f]{20}$"
APPROVAL_ID_PATTERN = r"^appr-[0-9a-f]{20}$"
RECEIPT_ID_PATTERN = r"^rcpt-[0-9a-f]{24}$"
IDEMPOTENCY_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
MAX_FENCE = 2**53

# Input limits (documented in docs/tools.md): bounded so one call can never bloat the journal.
MAX_SUMMARY = 4_000
MAX_OBJECTIVE = 4_000
MAX_TITLE = 500
MAX_EVIDENCE_ITEMS = 32
MAX_EVIDENCE_BYTES = 64 * 1024
MAX_TOOLS_USED = 64
MAX_DEPENDENCIES = 32
MAX_TOOL_COUNT = 1_000_000
MAX_COUNTER = 10**12
MAX_FLOAT = 1e9

LoopId = Annotated[str, Field(pattern=ID_PATTERN, description="Loop id.")]
POOL_CHAIN_PATTERN = r"^pool:[a-z0-9][a-z0-9_.-]{0,47}$"
ChainId = Annotated[str, Field(pattern=rf"{ID_PATTERN}|{POOL_CHAIN_PATTERN}")]
"""The chain a receipt belongs to: a loop's id, or `pool:<name>` for a budget pool's."""
TodoId = Annotated[str, Field(pattern=ID_PATTERN, description="Todo id.")]
TurnId = Annotated[str, Field(pattern=TURN_ID_PATTERN, description="Turn id from claim.")]
ApprovalId = Annotated[str, Field(pattern=APPROVAL_ID_PATTERN, description="Approval id.")]
Digest = Annotated[str, Field(pattern=DIGEST_PATTERN, description="sha256:<64 hex>.")]
_TIME = re.compile(TIME_PATTERN)


def _instant(value: object) -> datetime:
    """A receipt's time: the fixed-width UTC text of `clock.format_time` in JSON (no other
    spelling: the signed bytes are that text), an aware datetime in memory."""
    if isinstance(value, str):
        if _TIME.match(value) is None:
            raise ValueError(f"a time is written YYYY-MM-DDTHH:MM:SS.ffffffZ, not {value[:40]!r}")
        return parse_time(value)
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value
    raise ValueError("a time is an aware datetime or its UTC text")


Timestamp = Annotated[
    datetime,
    PlainValidator(_instant),
    PlainSerializer(format_time, return_type=str),
    WithJsonSchema({"type": "string", "pattern": TIME_PATTERN}),
]
"""An instant: an aware `datetime` in memory, `format_time`'s text in a receipt's JSON."""
ToolName = Annotated[str, Field(pattern=TOOL_NAME_RE.pattern, max_length=128)]
Outcome = Literal["progress", "completed", "failed", "blocked"]
Count = Annotated[int, Field(ge=0, le=MAX_COUNTER)]
Amount = Annotated[float, Field(ge=0, le=MAX_FLOAT, allow_inf_nan=False)]
Fence = Annotated[int, Field(ge=0, le=MAX_FENCE, description="The fence returned by claim.")]
_KEY_HELP = (
    "Resending the same call with the same key returns the original result instead of acting twice."
)
IdempotencyKey = Annotated[str, Field(pattern=IDEMPOTENCY_KEY_PATTERN, description=_KEY_HELP)]
OptionalKey = Annotated[
    str | None, Field(pattern=IDEMPOTENCY_KEY_PATTERN, description="Optional. " + _KEY_HELP)
]


def new_id(prefix: str) -> str:
    """A fresh random id as issued for turns and approvals: `<prefix>-` + 20 hex digits."""
    return f"{prefix}-{secrets.token_hex(10)}"


class Fact(BaseModel):
    # Built on first use, not at import: a process that seals one receipt (a host hook) pays
    # only for the kinds it touches.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class Reported(Fact):
    """What a turn consumed, as reported: one field per budget dimension an agent reports
    (`policy/budgets.DIMENSIONS`, `reported`), each non-negative and finite."""

    def amount(self, dimension: str) -> int | float:
        """The reported amount of `dimension`, in the policy's unit."""
        value: int | float = getattr(self, dimension)
        return value

    def charge(self) -> Totals:
        """What this usage charges, in exact units (`Totals`)."""
        return charged({d.name: self.amount(d.name) for d in DIMENSIONS if d.reported})


if TYPE_CHECKING:
    Usage = Reported
else:
    Usage = create_model(
        "Usage",
        __base__=Reported,
        __module__=__name__,
        __doc__=Reported.__doc__,
        **{d.name: (Amount, 0.0) if d.micro else (Count, 0) for d in DIMENSIONS if d.reported},
    )


class ToolUse(Fact):
    name: ToolName = Field(description="Dotted tool name, e.g. fs.write.")
    count: int = Field(default=1, ge=1, le=MAX_TOOL_COUNT, description="How many calls.")


class Evidence(Fact):
    kind: str = Field(pattern=r"^[a-z][a-z0-9_.-]{0,31}$", description="e.g. test, diff, log, url.")
    summary: str = Field(min_length=1, max_length=2_000)
    uri: str | None = Field(default=None, max_length=2_048)
    digest: Digest | None = None


def check_evidence_size(items: list[Evidence] | tuple[Evidence, ...]) -> None:
    """Raise `ValueError` if the evidence's total text exceeds `MAX_EVIDENCE_BYTES` (UTF-8)."""
    total = sum(len(e.summary.encode()) + len((e.uri or "").encode()) + len(e.kind) for e in items)
    if total > MAX_EVIDENCE_BYTES:
        raise ValueError(f"evidence totals {total} bytes; the limit is {MAX_EVIDENCE_BYTES}")


class TodoSpec(Fact):
    id: TodoId
    title: str = Field(min_length=1, max_length=MAX_TITLE)
    order: int = Field(ge=0, le=10**9)
    depends_on: tuple[TodoId, ...] = Field(default=(), max_length=MAX_DEPENDENCIES)


MODEL_DIMENSIONS: tuple[str, ...] = (
    "model_calls", "input_tokens", "output_tokens", "cost_usd", "cache_write_tokens",
    "cache_read_tokens",
)  # fmt: skip
"""The budget dimensions a call to a model spends: what the model gateway observes and
charges (`model_gateway/`), and what a report no longer charges once the gateway saw the turn."""


class ModelSpend(Fact):
    """What calls to a model spent, as the model gateway read it from the provider's answers:
    calls, tokens (uncached input, output, written to and read from the prompt cache) and their
    cost in US dollars at the price the gateway charged."""

    model_calls: Count = 0
    input_tokens: Count = 0
    output_tokens: Count = 0
    cache_write_tokens: Count = 0
    cache_read_tokens: Count = 0
    cost_usd: Amount = 0.0

    def charge(self) -> Totals:
        """What this spend charges, in exact units."""
        return charged({name: getattr(self, name) for name in MODEL_DIMENSIONS})

    @classmethod
    def of(cls, totals: Totals) -> ModelSpend:
        """The model dimensions of `totals` (the rest left out)."""
        return cls(**{name: totals.used(name) for name in MODEL_DIMENSIONS})


def model_part(totals: Totals) -> Totals:
    """The model dimensions of `totals` alone (the rest zero)."""
    return ModelSpend.of(totals).charge()


class ClosedTurn(Fact):
    turn_id: TurnId
    todo_id: TodoId
    # The calls the host observed in the turn beyond what it was charged (absent before 0.2.0).
    tool_calls_charged: Count | None = None


# --- data per kind ---------------------------------------------------------------------------


class ReceiptKind(StrEnum):
    LOOP_OPENED = "loop.opened"
    TURN_CLAIMED = "turn.claimed"
    CLAIM_REFUSED = "claim.refused"
    REQUEST_REFUSED = "request.refused"
    LEASE_RENEWED = "lease.renewed"
    LEASE_EXPIRED = "lease.expired"
    TURN_REPORTED = "turn.reported"
    TURN_REFUSED = "turn.refused"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_DECIDED = "approval.decided"
    TODO_ADDED = "todo.added"
    TODO_CANCELLED = "todo.cancelled"
    LOOP_PAUSED = "loop.paused"
    LOOP_RESUMED = "loop.resumed"
    LOOP_CANCELLED = "loop.cancelled"
    LOOP_STOPPED = "loop.stopped"
    LOOP_COMPLETED = "loop.completed"
    LOOP_POLICY_CHANGED = "loop.policy_changed"
    HOST_ATTACHED = "host.attached"
    TOOL_ADMITTED = "tool.admitted"
    TOOL_REFUSED = "tool.refused"
    TOOL_OBSERVED = "tool.observed"
    POOL_DEFINED = "pool.defined"
    POOL_PAUSED = "pool.paused"
    POOL_RESUMED = "pool.resumed"
    MODEL_CALLED = "model.called"
    MODEL_REFUSED = "model.refused"
    MCP_TOOL_CHANGED = "mcp.tool_changed"


POOL_KINDS = frozenset(
    {ReceiptKind.POOL_DEFINED, ReceiptKind.POOL_PAUSED, ReceiptKind.POOL_RESUMED}
)
"""The kinds of a budget pool's chain (`pool:<name>`); every other kind is a loop's."""


class CarriesPolicy(Fact):
    """A fact that carries a loop's policy document whole (`loop.opened`, and an operator's
    `loop.policy_changed`): the body's `policy_digest` is that document's, the store keeps the
    document by it, and the loop is judged by it from that receipt on."""

    policy: dict[str, Any]


class LoopOpened(CarriesPolicy):
    objective: str = Field(min_length=1, max_length=MAX_OBJECTIVE)
    todos: tuple[TodoSpec, ...]


class PoolRef(Fact):
    """A budget pool a claim was checked against, and the policy it had then."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,47}$")
    policy_digest: Digest


class TurnReport(Fact):
    """The agent's self-report, as received (shared by accepted and refused reports)."""

    turn_id: TurnId
    todo_id: TodoId
    fence: int = Field(ge=0)
    outcome: Outcome
    tools_used: tuple[ToolUse, ...] = Field(default=(), max_length=MAX_TOOLS_USED)
    usage: Usage = Usage()
    evidence: tuple[Evidence, ...] = Field(default=(), max_length=MAX_EVIDENCE_ITEMS)
    summary: str = Field(max_length=MAX_SUMMARY)
    failure_signature: str | None = Field(default=None, max_length=200)
    approval_ids: tuple[ApprovalId, ...] = Field(default=(), max_length=MAX_TOOLS_USED)
    # The approvals the report did not cite that count for it: for each approval-gated tool it
    # names that no cited approval covers, the turn's earliest usable approval for that tool
    # (`facts.approvals_found`). Absent when there are none (and before this field).
    approvals_found: tuple[ApprovalId, ...] | None = Field(default=None, max_length=MAX_TOOLS_USED)
    # What the server charged against max_tool_calls (`rules.tool_calls_due`). Absent in
    # receipts of release 0.1.0, which charged usage.tool_calls alone (the fold does the same).
    tool_calls_charged: Count | None = None
    # What the turn had been charged before this report (its earlier reports, its lease's
    # expiry, its loop's close). Absent before 0.2.0, whose reports charged the largest of
    # usage.tool_calls, the tools_used sum and the observed calls, whatever came before.
    tool_calls_before: Count | None = None
    # What the model gateway observed in the turn when it was reported (absent when it
    # observed nothing): then the report's model usage is kept beside it and not charged,
    # because each observed call was charged as it ended (`model.called`).
    model_observed: ModelSpend | None = None

    @property
    def tool_calls(self) -> int:
        """The tool calls this report charges."""
        if self.tool_calls_charged is not None:
            return self.tool_calls_charged
        return int(self.usage.amount("tool_calls"))


class TurnRefused(TurnReport):
    """A refused report. `charged`: the usage counts against budgets (the work happened).
    `closes_turn`: the turn ends and its todo is released (else it stays open for a retry)."""

    charged: bool
    closes_turn: bool


class LoopStopped(Fact):
    """The loop closed (stopped, completed or cancelled): a reason code, and the turns it closed."""

    reason: str = Field(min_length=1, max_length=200)
    detail: str = Field(default="", max_length=MAX_SUMMARY)
    closed_turns: tuple[ClosedTurn, ...] = ()


# --- bodies ----------------------------------------------------------------------------------


class PrincipalRef(Fact):
    id: str
    role: Literal["agent", "operator", "observer"]


class ReasonRef(Fact):
    code: str
    message: str


class DecisionRef(Fact):
    effect: Literal["allow", "deny"]
    reasons: tuple[ReasonRef, ...] = ()


class ReceiptBody(Fact):
    """The signed payload every receipt shares. The registry makes one subclass per kind, whose
    `kind` is that kind's literal and whose `data` is its fact model; parse a body with
    `registry.parse_body`, build one with `registry.make_body`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, defer_build=True)

    schema_: Literal["loopwarden.receipt/v1"] = Field(default=RECEIPT_SCHEMA, alias="schema")
    kind: ReceiptKind
    loop_id: ChainId  # a loop's id, or `pool:<name>` for a pool's receipts
    seq: int = Field(ge=1)
    at: Timestamp
    principal: PrincipalRef
    turn_id: TurnId | None = None
    todo_id: TodoId | None = None
    approval_id: ApprovalId | None = None
    decision: DecisionRef
    policy_digest: Digest
    data: Fact
    prev: Digest | None = None
    idempotency_key: str | None = None

    @model_validator(mode="after")
    def _chain_starts_once(self) -> ReceiptBody:
        if (self.seq == 1) != (self.prev is None):
            raise ValueError("prev is null exactly for seq 1")
        if (self.kind in POOL_KINDS) != self.loop_id.startswith("pool:"):
            raise ValueError("a pool's receipts, and only they, chain under pool:<name>")
        if self.kind in POOL_KINDS:
            if self.seq == 1 and self.kind != ReceiptKind.POOL_DEFINED:
                raise ValueError("pool.defined is the first receipt of a pool")
        elif (self.kind == ReceiptKind.LOOP_OPENED) != (self.seq == 1):
            raise ValueError("loop.opened is exactly the first receipt of a loop")
        return self

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
