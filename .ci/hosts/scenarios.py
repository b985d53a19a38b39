"""The real-host scenarios: what the scripted model does, and what must then be true.

Each runs on a fresh world (`world.py`): the loop's policy enforces host evidence, allows
`shell.run` and denies `git push*` (the MCP gateway's scenario has a policy of its own, over
the downstream's tools). The checks read the journal (`loopwarden export`), the
remote, `loopwarden verify` and what the model was shown; each says in one line what held, or
raises `Failed` saying what did not.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .host import Options
from .mcp_gateway import redescribe
from .script import (
    Memory,
    Step,
    approve_then,
    claim,
    downstream,
    note_turn,
    own_tool,
    result_json,
    shell,
    subagent,
    tool_search,
    update,
    wait_subagent,
)
from .world import AGENT, LOOP, Failed, World, policy_text

PUSH = "git push origin main"
EVASION = "git -C . push origin main"  # from the command-rules issue: a flag before the subcommand


@dataclass(frozen=True)
class Outcome:
    """What a scenario left behind, for its checks."""

    world: World
    memory: Memory
    remote_before: str
    receipts: list[dict[str, Any]]
    reported: tuple[int, ...] = ()  # the output tokens each of the fake's answers reported


Check = Callable[[Outcome], str]


@dataclass(frozen=True)
class Scenario:
    """One scenario (what each proves: docs/hooks.md, "Checked inside the real hosts")."""

    name: str
    sessions: tuple[str, ...]  # the script each session follows, in order
    steps: Callable[[frozenset[str]], Mapping[str, tuple[Step, ...]]]  # by the host's features
    checks: tuple[Check, ...]
    options: Options = field(default_factory=Options)
    needs: str | None = None  # a host feature ("tool_search", "subagent") it cannot run without
    allow: tuple[str, ...] = ("shell.run",)
    cost: float | None = None  # a max_cost_usd, with model calls allowed through the gateway
    stops: bool = False  # the host is stopped mid-run (its session may exit non-zero)
    between: Callable[[World], None] | None = None  # run before every session but the first
    policy_override: str | None = None  # a policy of its own, instead of `policy_text`'s

    def policy(self) -> str:
        if self.policy_override is not None:
            return self.policy_override
        return policy_text(allow=self.allow, cost=self.cost)


def _reasons(body: dict[str, Any]) -> list[str]:
    decision = body.get("decision") or {}
    return [str(r.get("code")) for r in decision.get("reasons", []) if isinstance(r, dict)]


def decisions(receipts: list[dict[str, Any]], tool: str) -> list[dict[str, Any]]:
    """The pre-tool decisions (admitted or refused) on the policy tool `tool`, in order."""
    kinds = ("tool.admitted", "tool.refused")
    return [r for r in receipts if r["kind"] in kinds and r["data"].get("tool") == tool]


def observed(receipts: list[dict[str, Any]], tool: str) -> list[dict[str, Any]]:
    return [r for r in receipts if r["kind"] == "tool.observed" and r["data"].get("tool") == tool]


def script_ran(out: Outcome) -> str:
    if out.memory.errors:
        raise Failed(out.memory.errors[0])
    return "the script ran to its end"


def verified(out: Outcome) -> str:
    code, text = out.world.verify()
    if code != 0:
        raise Failed(f"loopwarden verify exited {code}: {text}")
    return "verify clean"


def pushes_blocked(out: Outcome) -> str:
    """Both pushes were refused before they ran (command rules), and nothing moved the remote."""
    shells = decisions(out.receipts, "shell.run")
    if len(shells) < 2:
        raise Failed(f"the hook decided {len(shells)} shell call(s), not the 2 pushes")
    for line, body in zip((PUSH, EVASION), shells[:2], strict=True):
        if body["kind"] != "tool.refused":
            raise Failed(f"`{line}` was admitted by the hook ({body['kind']})")
        if "command_denied" not in _reasons(body) or body["data"].get("enforced") is not True:
            raise Failed(f"`{line}` was refused for {_reasons(body)}, not by the command rule")
    if observed(out.receipts, "shell.run"):
        raise Failed("the host reported a push as run (tool.observed) after it was refused")
    shown = [
        e.result
        for e in out.memory.exchanges("main")
        if e.arguments and "push" in json.dumps(e.arguments)
    ]
    if len(shown) < 2 or not all("loopwarden" in text for text in shown):
        raise Failed(f"the model was not shown loopwarden's refusal: {[t[:120] for t in shown]}")
    head = out.world.remote_head()
    if head != out.remote_before:
        raise Failed(f"the remote's main moved from {out.remote_before[:8]} to {head[:8]}")
    return f"`{PUSH}` and `{EVASION}` refused (command_denied), the remote unchanged"


def reported(accepted: bool, reason: str | None = None) -> Check:
    """The model's update was answered `accepted` (with `reason` among the reasons), and the
    journal holds the matching turn receipt."""

    def check(out: Outcome) -> str:
        exchanges = out.memory.exchanges("main") or out.memory.exchanges("second")
        updates = [e for e in exchanges if own_tool(e.tool, "update")]
        if not updates:
            raise Failed("the model's update never reached loopwarden")
        answer = result_json(updates[-1].result)
        if answer is None:
            raise Failed(f"update answered no JSON: {updates[-1].result[:160]!r}")
        codes = [r.get("code") for r in answer.get("reasons", []) if isinstance(r, dict)]
        if answer.get("accepted") is not accepted or (reason and reason not in codes):
            raise Failed(f"update answered accepted={answer.get('accepted')} {codes}")
        kind = "turn.reported" if accepted else "turn.refused"
        if not any(r["kind"] == kind for r in out.receipts):
            raise Failed(f"no {kind} receipt in the journal")
        return f"update {'accepted' if accepted else 'refused (' + str(reason) + ')'}"

    return check


def observed_calls(count: int) -> Check:
    def check(out: Outcome) -> str:
        seen = observed(out.receipts, "shell.run")
        if len(seen) != count:
            raise Failed(f"the host's hooks observed {len(seen)} shell call(s), not {count}")
        return f"{count} shell call(s) admitted and observed"

    return check


def attached_twice(out: Outcome) -> str:
    sessions = {r["data"]["session_id"] for r in out.receipts if r["kind"] == "host.attached"}
    if len(sessions) < 2:
        raise Failed(f"{len(sessions)} host session(s) attached, not 2")
    return "2 host sessions attached to one open turn"


def tool_search_admitted(out: Outcome) -> str:
    searched = [e for e in out.memory.exchanges("main") if e.tool == "ToolSearch"]
    if not searched:
        raise Failed("the model's ToolSearch never ran")
    refused = [
        r
        for r in out.receipts
        if r["kind"] == "tool.refused" and r["data"].get("host_tool") == "ToolSearch"
    ]
    if refused or "loopwarden:" in searched[0].result:
        why = _reasons(refused[0]) if refused else searched[0].result[:160]
        raise Failed(f"ToolSearch was refused: {why}")
    return "ToolSearch ran without a turn, not refused"


def subagent_recorded(out: Outcome) -> str:
    """The subagent's shell call is in the journal with the subagent's id; the main thread's
    calls (the spawn, a wait) carry none."""
    tool_kinds = ("tool.admitted", "tool.refused", "tool.observed")
    calls = [r for r in out.receipts if r["kind"] in tool_kinds]
    shells = [r for r in calls if r["data"].get("tool") == "shell.run"]
    if not shells:
        raise Failed("the subagent's shell call never reached the hook")
    missing = [r["seq"] for r in shells if not r["data"].get("agent_id")]
    if missing:
        raise Failed(f"the subagent's shell call is recorded without agent_id (receipts {missing})")
    main_thread = [r["seq"] for r in calls if r not in shells and r["data"].get("agent_id")]
    if main_thread:
        raise Failed(f"main-thread calls are recorded with an agent_id (receipts {main_thread})")
    kinds = sorted({str(r["data"].get("agent_type")) for r in shells})
    return f"the subagent's shell call recorded with its agent_id (agent_type {', '.join(kinds)})"


SUB_PROMPT = "Follow script:sub. Run one command and report back."
WAIT = "host.multi_agent_v1wait_agent"  # Codex's wait_agent, as its hooks name it


def subagent_steps(features: frozenset[str]) -> Mapping[str, tuple[Step, ...]]:
    """Spawn a subagent that runs one shell call; where the spawn returns at once (Codex), wait
    for it before reporting (Codex 0.171.0's hooks name that tool `multi_agent_v1wait_agent`,
    its namespace glued on, so the policy allows it under that name)."""
    waits = "subagent_wait" in features
    used = {"agent.spawn": 1, "shell.run": 1, **({WAIT: 1} if waits else {})}
    main = (claim(LOOP), subagent(SUB_PROMPT), *((wait_subagent,) if waits else ()), update(used))
    return {"main": main, "sub": (shell("git status --short"),)}


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "push-blocked",
        ("main",),
        lambda features: {"main": (claim(LOOP), shell(PUSH), shell(EVASION))},
        (script_ran, pushes_blocked, verified),
    ),
    Scenario(
        "honest-turn",
        ("main",),
        lambda features: {
            "main": (claim(LOOP), shell("git status --short"), update({"shell.run": 1}))
        },
        (script_ran, observed_calls(1), reported(True), verified),
    ),
    Scenario(
        "under-report",
        ("main",),
        lambda features: {
            "main": (
                claim(LOOP),
                shell("git log --oneline -1"),
                shell("git status --short"),
                update({"shell.run": 1}),
            )
        },
        (script_ran, observed_calls(2), reported(False, "unreported_tool_use"), verified),
    ),
    Scenario(
        "second-session",
        ("first", "second"),
        lambda features: {
            "first": (claim(LOOP), shell("git status --short"), note_turn),
            "second": (shell("git log --oneline -1"), update({"shell.run": 2})),
        },
        (script_ran, attached_twice, observed_calls(2), reported(True), verified),
    ),
    Scenario(
        "tool-search",
        ("main",),
        lambda features: {
            "main": (
                tool_search("mcp__loopwarden__claim", "mcp__loopwarden__update"),
                claim(LOOP),
                shell("git status --short"),
                update({"shell.run": 1}),
            )
        },
        (tool_search_admitted, script_ran, reported(True), verified),
        options=Options(tool_search=True),
        needs="tool_search",
    ),
    Scenario(
        "subagent",
        ("main",),
        subagent_steps,
        (script_ran, subagent_recorded, reported(True), verified),
        options=Options(subagents=True),
        needs="subagent",
        allow=("shell.run", "agent.spawn", WAIT),
    ),
)


# --- the model gateway (docs/model-gateway.md) ----------------------------------------------------


def _model_calls(out: Outcome) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The calls sealed as made, and those the fake upstream answered."""
    from .gateway import model_requests

    called = [r for r in out.receipts if r["kind"] == "model.called"]
    return called, model_requests(out.world.logs / "requests.jsonl")


def charged_as_upstream(out: Outcome) -> str:
    """Every call that reached the upstream is sealed, charged the usage the upstream answered:
    its 10 input tokens, the output tokens it reported, their cost at the table's price."""
    called, answered = _model_calls(out)
    if not called:
        raise Failed("no model call was sealed: the host did not go through the gateway")
    if len(called) != len(answered):
        raise Failed(f"the upstream answered {len(answered)} calls, {len(called)} were sealed")
    outputs = sorted(int(r["data"]["usage"].get("output_tokens", 0)) for r in called)
    if outputs != sorted(out.reported[: len(called)]) and outputs != sorted(out.reported):
        raise Failed(
            f"sealed output tokens {outputs}, the upstream reported {sorted(out.reported)}"
        )
    for r in called:
        usage = r["data"]["usage"]
        if usage.get("input_tokens") != 10 or r["data"].get("source") != "provider":
            raise Failed(f"call #{r['seq']} was charged {usage} ({r['data'].get('source')})")
        if abs(float(usage.get("cost_usd", 0)) - usage["output_tokens"] / 1e6) > 1e-9:
            raise Failed(f"call #{r['seq']} cost {usage.get('cost_usd')}, not its tokens' price")
    return f"{len(called)} model calls sealed, each charged the upstream's usage and its price"


def stopped_by_budget(out: Outcome) -> str:
    """The budget stopped the host mid-run: calls went up, then one was refused for the cost
    budget, the host showed loopwarden's message, and the upstream saw nothing after it."""
    called, answered = _model_calls(out)
    refused = [r for r in out.receipts if r["kind"] == "model.refused"]
    if not called:
        raise Failed("no call went upstream before the refusal: not stopped mid-run")
    if not refused or "budget_exhausted:cost_usd" not in _reasons(refused[0]):
        raise Failed(f"no call was refused for the cost budget ({[_reasons(r) for r in refused]})")
    if len(answered) != len(called):
        raise Failed(f"the upstream answered {len(answered)} calls, {len(called)} were admitted")
    shown = "\n".join(p.read_text() for p in sorted(out.world.logs.glob("session-*.log")))
    if "loopwarden" not in shown or "cost_usd" not in shown:
        raise Failed("the host did not show loopwarden's refusal")
    spent = sum(float(r["data"]["usage"]["cost_usd"]) for r in called)
    return (
        f"{len(called)} calls charged ${spent:.4f}, then refused (budget_exhausted:cost_usd), "
        "the host stopped with loopwarden's message, the upstream saw no call after"
    )


GATEWAY_SCENARIOS = (
    Scenario(
        "gateway-charged",
        ("main",),
        lambda features: {
            "main": (
                claim(LOOP),
                shell("git status --short"),
                update({"shell.run": 1}, model_calls=None),
            )
        },
        (script_ran, charged_as_upstream, reported(True), verified),
        options=Options(gateway=True),
        cost=1.0,
    ),
    Scenario(
        "gateway-capped",
        ("main",),
        lambda features: {
            "main": (
                claim(LOOP),
                shell("git status --short"),
                shell("git log --oneline -1"),
                shell("git status --short"),
                update({"shell.run": 3}, model_calls=None),
            )
        },
        (stopped_by_budget, verified),
        options=Options(gateway=True),
        cost=0.0025,
        stops=True,
    ),
)
SCENARIOS = SCENARIOS + GATEWAY_SCENARIOS


# --- the MCP gateway, no hooks (docs/mcp-gateway.md) ----------------------------------------------

GATEWAY_POLICY = f"""agents = ["{AGENT}"]

[tools]
allow = ["mcp.own.echo", "mcp.own.push"]
deny = ["mcp.own.crash"]
approval = ["mcp.own.query"]

[[tools.arguments]]
name = "no-push-to-main"
tool = "mcp.own.push"
argument = "branch"
not_matches = ["main"]

[budgets]
max_turns = 10

[observe]
mode = "enforce"

[stop]
on_violation = "refuse_turn"
"""
ECHOED = "hello through the gateway"
SQL = "select 1"


def _host_tool(tool: str) -> str:
    return f"mcp__loopwarden__own__{tool}"


def _shown(out: Outcome, session: str, tool: str) -> list[Any]:
    return [e for e in out.memory.exchanges(session) if e.tool == _host_tool(tool)]


def gateway_only(out: Outcome) -> str:
    """No hooks: every tool decision was the gateway's, and the host offered the model the
    pinned tools the policy allows or gates, not the denied one nor the unlisted ones."""
    settings = out.world.project / ".claude"
    hooked = [p.name for p in settings.glob("*.json") if "hook" in p.read_text()]
    if hooked:
        raise Failed(f"hooks are configured in the project: {hooked}")
    kinds = ("tool.admitted", "tool.refused", "tool.observed")
    hosts = {str(r["data"].get("host")) for r in out.receipts if r["kind"] in kinds}
    if hosts != {"mcp-gateway"}:
        raise Failed(f"tool decisions came from {sorted(hosts)}, not the gateway alone")
    main = out.memory.latest.get("main")
    offered = {t for t in (main.tools if main else ()) if t.startswith(_host_tool(""))}
    expected = {_host_tool(t) for t in ("echo", "push", "query")}
    if offered != expected:
        raise Failed(f"the host offered {sorted(offered)}, not {sorted(expected)}")
    return "no hooks; every decision the gateway's; only the allowed and gated tools offered"


def allowed_ran(out: Outcome) -> str:
    made = decisions(out.receipts, "mcp.own.echo")
    if [r["kind"] for r in made] != ["tool.admitted"]:
        raise Failed(f"the allowed echo was decided {[r['kind'] for r in made]}")
    seen = observed(out.receipts, "mcp.own.echo")
    if len(seen) != 1 or seen[0]["data"].get("host_tool") != "mcp__own__echo":
        raise Failed(f"the allowed echo was observed {len(seen)} time(s)")
    shown = _shown(out, "main", "echo")
    if not shown or shown[0].error or ECHOED not in shown[0].result:
        raise Failed(f"the model did not get the echo back: {[e.result[:120] for e in shown]}")
    return "the allowed call admitted, run (the model got its result) and observed"


def denied_refused(out: Outcome) -> str:
    made = decisions(out.receipts, "mcp.own.push")
    if len(made) != 1 or made[0]["kind"] != "tool.refused":
        raise Failed(f"the push to main was decided {[r['kind'] for r in made]}")
    if (
        "argument_not_allowed" not in _reasons(made[0])
        or made[0]["data"].get("enforced") is not True
    ):
        raise Failed(f"the push to main was refused for {_reasons(made[0])}, not its argument rule")
    if observed(out.receipts, "mcp.own.push"):
        raise Failed("the refused push was observed as run")
    shown = _shown(out, "main", "push")
    if not shown or "argument_not_allowed" not in shown[0].result:
        raise Failed(f"the model was not shown the refusal: {[e.result[:120] for e in shown]}")
    return "the denied call (argument rule) refused before it ran, sealed, the model shown why"


def approval_round_trip(out: Outcome) -> str:
    made = decisions(out.receipts, "mcp.own.query")
    kinds = [r["kind"] for r in made]
    if kinds != ["tool.refused", "tool.admitted"] or "approval_required" not in _reasons(made[0]):
        raise Failed(f"the gated query was decided {kinds} ({[_reasons(r) for r in made]})")
    asked = [r for r in out.receipts if r["kind"] == "approval.requested"]
    decided = [r for r in out.receipts if r["kind"] == "approval.decided"]
    if len(asked) != 1 or len(decided) != 1:
        raise Failed(f"{len(asked)} approval(s) requested, {len(decided)} decided, not 1 and 1")
    if not asked[0]["seq"] < decided[0]["seq"] < made[1]["seq"]:
        raise Failed("the gated call was admitted before the operator's approval")
    if len(observed(out.receipts, "mcp.own.query")) != 1:
        raise Failed("the approved query was not observed once")
    shown = _shown(out, "main", "query")
    if len(shown) != 2 or not shown[0].error or shown[1].error:
        raise Failed(f"the model saw {[(e.error, e.result[:80]) for e in shown]}")
    return "the gated call refused (approval_required), approved by `loopwarden approve`, then run"


def redescribed_refused(out: Outcome) -> str:
    """The next session's downstream re-described `echo`: the gateway hid it, sealed the change
    once, and the model's call of it ran nowhere."""
    after = out.memory.latest.get("after")
    if after is None:
        raise Failed("the second session never asked the model")
    if _host_tool("echo") in after.tools or _host_tool("query") not in after.tools:
        offered = sorted(t for t in after.tools if t.startswith(_host_tool("")))
        raise Failed(f"after the re-description the host offered {offered}")
    changed = [r for r in out.receipts if r["kind"] == "mcp.tool_changed"]
    if len(changed) != 1 or changed[0]["data"].get("host_tool") != "mcp__own__echo":
        raise Failed(f"{len(changed)} mcp.tool_changed receipt(s) for the re-described echo")
    if len(decisions(out.receipts, "mcp.own.echo")) != 1:
        raise Failed("the re-described echo reached the policy: it was served")
    tried = _shown(out, "after", "echo")
    if not tried or not tried[0].error:
        raise Failed(f"the re-described echo answered: {[e.result[:120] for e in tried]}")
    return "the re-described tool hidden and refused, its change sealed (mcp.tool_changed)"


MCP_GATEWAY_SCENARIOS = (
    Scenario(
        "mcp-gateway-nohooks",
        ("main", "after"),
        lambda features: {
            "main": (
                claim(LOOP),
                downstream("own__echo", {"text": ECHOED}),
                downstream("own__push", {"branch": "main"}),
                downstream("own__query", {"sql": SQL}),
                approve_then("own__query", {"sql": SQL}),
                update({"mcp.own.echo": 1, "mcp.own.query": 1}),
            ),
            "after": (downstream("own__echo", {"text": ECHOED}),),
        },
        (
            script_ran,
            gateway_only,
            allowed_ran,
            denied_refused,
            approval_round_trip,
            reported(True),
            redescribed_refused,
            verified,
        ),
        options=Options(mcp_gateway=True),
        needs="mcp_gateway",
        between=redescribe,
        policy_override=GATEWAY_POLICY,
    ),
)
SCENARIOS = SCENARIOS + MCP_GATEWAY_SCENARIOS
