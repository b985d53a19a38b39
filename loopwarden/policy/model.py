"""`LoopPolicy`: the declarative rules of one loop, parsed once and normalized.

Normalization makes equal policies equal: pattern and agent lists are sorted and de-duplicated
(their order never changes a decision), every default is written out. The digest of the
normalized form versions the policy (see `digest.py`).

Safe defaults: an empty `tools.allow` allows nothing; `agents` defaults to nobody; a policy that
sets no budget at all is refused, so "unlimited" is never an accident (a single missing key still
means no limit on that one dimension, as the policy contract says).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from loopwarden import hostnames as hosts
from loopwarden.errors import clip
from loopwarden.policy.arguments import MAX_RULES, ArgumentRule, normalized
from loopwarden.policy.budgets import Budgets
from loopwarden.policy.commands import check_command_pattern
from loopwarden.policy.patterns import check_pattern, is_tool_name

AGENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}$")

MAX_TODOS_CEILING = 100_000
MAX_HOST_TOOL = 200


def _name_set(check: Callable[[str], object]) -> AfterValidator:
    """A set of names as a sorted tuple without repeats (their order never changes a decision),
    each one `check`ed (it raises ValueError on a bad one)."""

    def validate(values: tuple[str, ...]) -> tuple[str, ...]:
        names = tuple(sorted(set(values)))
        for name in names:
            check(name)
        return names

    return AfterValidator(validate)


def _check_agent(agent: str) -> None:
    if agent != "*" and not AGENT_ID_RE.fullmatch(agent):
        raise ValueError(
            f"invalid agent id {clip(repr(agent))}: use 1-64 characters of letters, digits and "
            "'_.@:-', starting with a letter or digit, or '*' for any authenticated agent"
        )


POOL_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,47}$")


def check_pool_name(name: str) -> str:
    if not POOL_NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid pool name {name[:60]!r}: use 1-48 lowercase letters, digits and '_.-', "
            "starting with a letter or digit"
        )
    return name


PoolNames = Annotated[tuple[str, ...], Field(max_length=32), _name_set(check_pool_name)]


MAX_PATTERNS = 1_000
MAX_AGENTS = 1_000

AgentIds = Annotated[tuple[str, ...], Field(max_length=MAX_AGENTS), _name_set(_check_agent)]
"""Agent ids (or `*`, any authenticated agent), sorted and de-duplicated."""

Patterns = Annotated[tuple[str, ...], Field(max_length=MAX_PATTERNS), _name_set(check_pattern)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


CommandPatterns = Annotated[
    tuple[str, ...], Field(max_length=MAX_PATTERNS), _name_set(check_command_pattern)
]


class CommandRules(_Section):
    """Which shell commands a `shell.run` call may run, by rules over every command its line
    runs (`commands/rules.py`, docs/hooks.md "Command rules"). A command matching `deny`
    denies the call, and so does a doubt; with a non-empty `allow`, so does any command matching
    none of it. `opaque` names the carriers of unread code (inline interpreter code, a shell
    reading input) the policy accepts; unset, every one is refused."""

    allow: CommandPatterns = Field(default=(), description="Commands allowed (empty: any).")
    deny: CommandPatterns = Field(default=(), description="Commands never run.")
    opaque: CommandPatterns | None = Field(
        default=None,
        description="Carriers of code loopwarden does not read that may run (e.g. 'python3 -c').",
    )

    @field_validator("opaque")
    @classmethod
    def _unset_when_empty(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return value or None  # an empty list means no list: the same policy, the same digest


class ToolRules(_Section):
    """Which tools an agent may use. Precedence: deny > approval > allow > default deny."""

    allow: Patterns = Field(default=(), description="Tools usable without approval.")
    deny: Patterns = Field(default=(), description="Tools never usable; deny always wins.")
    approval: Patterns = Field(
        default=(), description="Tools usable only with an approved, unconsumed approval."
    )
    commands: CommandRules | None = Field(
        default=None, description="Rules over the command lines of shell.run calls."
    )
    arguments: tuple[ArgumentRule, ...] | None = Field(
        default=None,
        max_length=MAX_RULES,
        description="Rules over named arguments of tool calls (policy/arguments.py).",
    )  # None (the default) keeps older digests

    @field_validator("arguments")
    @classmethod
    def _one_order(cls, value: tuple[ArgumentRule, ...] | None) -> tuple[ArgumentRule, ...] | None:
        return normalized(value)

    @model_validator(mode="after")
    def _no_contradictions(self) -> ToolRules:
        lists = {"allow": self.allow, "deny": self.deny, "approval": self.approval}
        names = list(lists)
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                both = sorted(set(lists[first]) & set(lists[second]))
                if both:
                    raise ValueError(
                        f"pattern {both[0]!r} is listed in both tools.{first} and "
                        f"tools.{second}; keep it in one list"
                    )
        return self


class Rate(_Section):
    """At most `turns_per_window` claims in any sliding `window_seconds`."""

    turns_per_window: int | None = Field(default=None, ge=1, le=10**9)
    window_seconds: int | None = Field(default=None, ge=1, le=366 * 86400)

    @model_validator(mode="after")
    def _both_or_neither(self) -> Rate:
        if (self.turns_per_window is None) != (self.window_seconds is None):
            raise ValueError("rate needs both turns_per_window and window_seconds, or neither")
        return self

    @property
    def limited(self) -> bool:
        return self.turns_per_window is not None


class Claims(_Section):
    """Leases and concurrency."""

    lease_seconds: int = Field(default=900, ge=1, le=7 * 86400)
    max_active: int = Field(default=4, ge=1, le=10_000)
    max_active_per_agent: int = Field(default=1, ge=1, le=10_000)
    max_attempts: int = Field(default=3, ge=1, le=1_000)

    @model_validator(mode="after")
    def _per_agent_within_total(self) -> Claims:
        if self.max_active_per_agent > self.max_active:
            raise ValueError(
                f"claims.max_active_per_agent ({self.max_active_per_agent}) is larger than "
                f"claims.max_active ({self.max_active})"
            )
        return self


class StopRules(_Section):
    """When the loop stops by itself."""

    on_violation: Literal["stop_loop", "refuse_turn"] = "stop_loop"
    repeated_failure_limit: int = Field(default=3, ge=1, le=1_000)
    require_evidence_for_completion: bool = True
    deadline: datetime | None = None

    @model_validator(mode="after")
    def _aware_deadline(self) -> StopRules:
        if self.deadline is not None and self.deadline.tzinfo is None:
            raise ValueError("stop.deadline needs a time zone, e.g. 2026-12-31T00:00:00Z")
        return self


def _check_names(value: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    for host, names in value.items():
        if host not in hosts.NAMES:
            known = ", ".join(hosts.NAMES)
            raise ValueError(f"observe.names: unknown host {host!r} (known: {known})")
        for host_tool, tool in names.items():
            if not host_tool or len(host_tool) > MAX_HOST_TOOL:
                raise ValueError(
                    f"observe.names.{host}: a host tool name of 1-{MAX_HOST_TOOL} characters"
                )
            if not is_tool_name(tool):
                raise ValueError(
                    f"observe.names.{host}.{host_tool}: {tool!r} is not a dotted tool name"
                )
    return {host: dict(sorted(names.items())) for host, names in sorted(value.items())}


class ObserveRules(_Section):
    """How host hook evidence is used (docs/hooks.md): `off` (hooks are not consulted),
    `record` (decisions and observations are sealed and compared with reports, mismatches are
    warnings), `enforce` (decisions bind, an unreported observed tool is a violation, a claim
    needs the agent's host attached)."""

    mode: Literal["off", "record", "enforce"] = "off"
    names: Annotated[dict[str, dict[str, str]], AfterValidator(_check_names)] = Field(
        default_factory=dict,
        description="Per host, host tool name → policy tool name (over the default table).",
    )


MODEL_PATTERN_RE = re.compile(r"^[A-Za-z0-9*?][A-Za-z0-9._:@/*?-]{0,127}$")


def check_model_pattern(pattern: str) -> str:
    """`pattern` if it is a model-name glob (`*` any run, `?` one character), else `ValueError`."""
    if not MODEL_PATTERN_RE.fullmatch(pattern):
        raise ValueError(
            f"invalid model pattern {clip(repr(pattern))}: use 1-128 letters, digits and "
            "'._:@/-', with '*' and '?' as wildcards (e.g. 'claude-*')"
        )
    return pattern


ModelPatterns = Annotated[
    tuple[str, ...], Field(max_length=MAX_PATTERNS), _name_set(check_model_pattern)
]


class ModelRules(_Section):
    """Which models the model gateway (docs/model-gateway.md) lets the loop's agents call, by
    glob over the model name the request names. Deny wins; a model no `allow` pattern names is
    refused (an empty `allow` admits none: a loop without `[model]` has no model calls through
    the gateway)."""

    allow: ModelPatterns = Field(default=(), description="Models the gateway forwards calls to.")
    deny: ModelPatterns = Field(default=(), description="Models never called; deny always wins.")


class GatewayRules(_Section):
    """How the MCP gateway treats this loop's downstream tools (docs/mcp-gateway.md): `pin` says
    who admits a tool description the gateway has not seen before, an operator (`loopwarden
    gateway pin`; until then the tool is hidden) or the gateway on first sight. A pinned
    description that changes is refused either way until an operator pins it again."""

    pin: Literal["operator", "first_sight"] = "operator"


class TodoRules(_Section):
    agents_may_add: bool = False
    max_todos: int = Field(default=1_000, ge=1, le=MAX_TODOS_CEILING)


class LoopPolicy(_Section):
    """The rules of one loop. Parse with `parse_policy`; version with `policy_digest`."""

    agents: AgentIds = Field(
        default=(), description="Agent ids allowed to work the loop, or ['*']."
    )
    tools: ToolRules = ToolRules()
    budgets: Budgets = Budgets()
    rate: Rate = Rate()
    claims: Claims = Claims()
    stop: StopRules = StopRules()
    todos: TodoRules = TodoRules()
    observe: ObserveRules | None = None  # None (the default) is `off`, and keeps older digests
    pools: PoolNames | None = Field(
        default=None, description="The budget pools the loop draws from (policy/pool_policy.py)."
    )  # None (the default) draws from none, and keeps older digests
    model: ModelRules | None = None  # the model gateway's rules; None (the default) admits no
    # model call through the gateway, and keeps older digests
    gateway: GatewayRules | None = None  # None (the default): operators pin; keeps older digests

    @model_validator(mode="after")
    def _some_budget(self) -> LoopPolicy:
        if self.budgets.is_empty():
            raise ValueError(
                "budgets: set at least one limit (max_turns is the usual one); a policy with no "
                "budget at all is refused so that 'unlimited' is never an accident"
            )
        return self

    def admits_agent(self, agent_id: str) -> bool:
        return "*" in self.agents or agent_id in self.agents

    @property
    def observe_mode(self) -> Literal["off", "record", "enforce"]:
        return self.observe.mode if self.observe is not None else "off"
