"""`loopwarden demo`: the product in one run, over real MCP stdio connections.

Each agent talks to its own `loopwarden serve` subprocess (as every stdio MCP client does);
all of them share one fresh SQLite store. The operator acts through the admin API. Four
scenarios — success, refusal, approval, and a host whose hooks decide every tool call (a
`git push` blocked before it runs, an under-reported turn refused) — then a full audit and an
offline bundle check.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rich.markup import escape

from loopwarden.approvals.approval_ops import DecideApprovalRequest, decide_approval
from loopwarden.audit.bundles import export_bundle, verify_bundle
from loopwarden.audit.database import audit
from loopwarden.clients import admin, render
from loopwarden.clients.agent import AgentClient
from loopwarden.clock import format_optional
from loopwarden.errors import Conflict
from loopwarden.kernel.log.keys import Keyring
from loopwarden.kernel.store.homes import DB_NAME
from loopwarden.loops.lifecycle import OpenLoopRequest, open_loop
from loopwarden.policy.digest import policy_document
from loopwarden.policy.loader import parse_policy
from loopwarden.turns.update import UpdateResult

OPERATOR = admin.operator("operator")


@dataclass
class Step:
    scenario: str
    actor: str
    action: str
    outcome: str
    decision: str = ""
    route: str = ""
    turn_id: str = ""
    receipt_id: str = ""
    reasons: list[str] = field(default_factory=list)


class Narrator:
    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.steps: list[Step] = []
        self.scenario = ""

    def section(self, key: str, title: str) -> None:
        self.scenario = key
        if not self.as_json:
            render.console.print(f"\n[bold cyan]━━ {title} ━━[/bold cyan]")

    def say(self, text: str) -> None:
        if not self.as_json:
            render.console.print(f"[dim]{text}[/dim]")

    def step(self, actor: str, action: str, outcome: str, **extra: Any) -> Step:
        step = Step(self.scenario, actor, action, outcome, **extra)
        self.steps.append(step)
        if not self.as_json:
            color = {"deny": "red", "wait": "yellow"}.get(step.decision, "green")
            line = f"  [bold]{actor:9}[/bold] {action:32} → [{color}]{outcome}[/{color}]"
            details = []
            if step.route:
                details.append(f"route [bold]{step.route}[/bold]")
            if step.turn_id:
                details.append(f"turn {step.turn_id}")
            if step.receipt_id:
                details.append(f"receipt {step.receipt_id}")
            render.console.print(line)
            if details:
                render.console.print("  " + " " * 10 + "[dim]" + "  ".join(details) + "[/dim]")
        return step


def _policy(name: str) -> dict[str, Any]:
    """A demo policy shipped with the package (`loopwarden/clients/demo_policies/`)."""
    text = resources.files("loopwarden.clients.demo_policies").joinpath(name).read_text()
    return policy_document(parse_policy(text, "toml", source=name))


def _reasons(reasons: Iterable[Any]) -> list[str]:
    return [r.code for r in reasons]


async def _open(
    home: Path, n: Narrator, loop_id: str, objective: str, todos: list[dict[str, Any]]
) -> None:
    """The operator opens `loop_id` under its demo policy (`demo_policies/<loop_id>.toml`)."""
    async with admin.open_store(home) as store:
        result = await open_loop(
            store,
            OPERATOR,
            OpenLoopRequest(
                objective=objective, policy=_policy(f"{loop_id}.toml"), todos=todos, loop_id=loop_id
            ),
        )
    n.step(
        "operator",
        f"open loop {loop_id}",
        f"{render.counted(result.todos, 'todo')}, policy {result.policy_digest[:15]}…",
        decision="allow",
        receipt_id=result.receipt_id,
    )


@dataclass
class Actor:
    """An agent as the demo narrates it: its name and its own MCP connection (`_agents`)."""

    name: str
    client: AgentClient
    n: Narrator

    async def claim(self, loop_id: str, todo_id: str | None = None) -> Any:
        """The `ClaimResult`, narrated: granted, not yet (nothing to claim), or refused."""
        grant = await self.client.claim(loop_id, todo_id)
        action = f"claim {todo_id}" if todo_id else "claim"
        if grant.granted:
            self.n.step(
                self.name,
                action,
                f"granted {grant.todo_id} “{grant.todo_title}” (fence {grant.fence})",
                decision="allow",
                turn_id=grant.turn_id or "",
                receipt_id=grant.receipt_id or "",
            )
        elif grant.receipt_id is None:  # nothing to claim yet: a plain answer, not a refusal
            self.n.step(
                self.name,
                action,
                "not yet: " + "; ".join(r.message for r in grant.reasons),
                decision="wait",
                reasons=_reasons(grant.reasons),
            )
        else:
            self.n.step(
                self.name,
                action,
                "refused: " + ", ".join(_reasons(grant.reasons)),
                decision="deny",
                receipt_id=grant.receipt_id,
                reasons=_reasons(grant.reasons),
            )
        return grant

    async def update(
        self, grant: Any, key: str, summary: str, tools: dict[str, int], **report: Any
    ) -> UpdateResult:
        """Report the turn `grant` opened as completed, having used `tools` (name → calls)."""
        used = [{"name": name, "count": count} for name, count in tools.items()]
        result = await self.client.update(
            grant.turn_id, grant.fence, "completed", summary, key, tools_used=used, **report
        )
        listed = ", ".join(f"{name}×{count}" for name, count in tools.items())
        if result.accepted:
            outcome_text = "accepted"
        else:
            outcome_text = "refused: " + ", ".join(_reasons(result.reasons))
        if result.status != "active":
            outcome_text += f"; loop {result.status} ({result.stop_reason})"
        self.n.step(
            self.name,
            f"update completed ({listed})",
            outcome_text,
            decision="allow" if result.accepted else "deny",
            route=result.route,
            turn_id=result.turn_id,
            receipt_id=result.receipt_id,
            reasons=_reasons(result.reasons),
        )
        return result


@asynccontextmanager
async def _agents(home: Path, n: Narrator, *names: str) -> AsyncIterator[list[Actor]]:
    """One `Actor` per name, each with its own `loopwarden serve` subprocess over stdio."""
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(AgentClient.stdio(name, home)) for name in names]
        yield [Actor(name, client, n) for name, client in zip(names, clients, strict=True)]


def _usage(calls: int, cost: float, seconds: float) -> dict[str, Any]:
    return {
        "model_calls": calls,
        "input_tokens": 1800 * calls,
        "output_tokens": 420 * calls,
        "tool_calls": calls + 1,
        "cost_usd": cost,
        "wall_seconds": seconds,
    }


async def scenario_success(home: Path, n: Narrator, work: Path) -> bool:
    n.section("success", "1. success — two agents build and review a change")
    build = {"id": "build", "title": "implement CSV export and its test"}
    review = {"id": "review", "title": "review the change", "depends_on": ["build"]}
    await _open(home, n, "build-review", "Add CSV export with a reviewed test", [build, review])
    async with _agents(home, n, "builder", "reviewer") as (builder, reviewer):
        q = await builder.client.quota("build-review")
        turns = q.budgets["turns"]
        n.step(
            "builder",
            "quota",
            f"allowed={q.allowed} (turns {turns.used}/{turns.limit})",
            decision="allow" if q.allowed else "deny",
        )
        early = await reviewer.claim("build-review", "review")  # waits for the build
        grant = await builder.claim("build-review")
        await builder.update(
            grant,
            "build-1",
            "Wrote export_csv() and test_export_csv; tests pass.",
            {"fs.read": 3, "fs.write": 2, "tests.run": 1},
            usage=_usage(4, 0.21, 95.0),
            evidence=[{"kind": "test", "summary": "tests/test_export.py: 6 passed"}],
        )
        grant = await reviewer.claim("build-review", "review")
        final = await reviewer.update(
            grant,
            "review-1",
            "Reviewed the diff; approved.",
            {"git.diff": 1, "fs.read": 2},
            usage=_usage(2, 0.08, 40.0),
            evidence=[{"kind": "review", "summary": "diff reviewed: no issues"}],
        )
    return not early.granted and final.status == "completed"


async def scenario_refusal(home: Path, n: Narrator, work: Path) -> bool:
    n.section("refusal", "2. refusal — a turn reports a tool outside the policy")
    todos = [
        {"id": "fix", "title": "fix the flaky test"},
        {"id": "docs", "title": "update the changelog"},
    ]
    await _open(home, n, "guarded", "Fix the flaky test without touching the remote", todos)
    async with _agents(home, n, "builder") as (builder,):
        grant = await builder.claim("guarded")
        result = await builder.update(
            grant,
            "fix-1",
            "Fixed the test and pushed the branch.",
            {"fs.write": 1, "git.push": 1},
            usage=_usage(3, 0.12, 60.0),
            evidence=[{"kind": "test", "summary": "test passes 50/50 runs"}],
        )
        again = await builder.claim("guarded")
    return (
        not result.accepted
        and result.stop_reason == "policy_violation"
        and not again.granted
        and "loop_not_active" in _reasons(again.reasons)
    )


async def _approve(home: Path, n: Narrator, approval_id: str) -> None:
    """The operator approves, through the admin API (the same operation `loopwarden approve` runs)."""
    async with admin.open_store(home) as store:
        decided = await decide_approval(
            store,
            OPERATOR,
            DecideApprovalRequest(
                approval_id=approval_id,
                approve=True,
                expires_in_seconds=1800,
                reason="staging deploy of 1.4 is fine",
            ),
        )
    n.step(
        "operator",
        f"approve {decided.approval_id}",
        f"{decided.status} until {format_optional(decided.expires_at)}",
        decision="allow",
        receipt_id=decided.receipt_id,
    )


async def scenario_approval(home: Path, n: Narrator, work: Path) -> bool:
    n.section("approval", "3. approval — a deploy needs a human, once")
    todos = [
        {"id": "deploy", "title": "deploy build 1.4 to staging"},
        {"id": "smoke", "title": "smoke-test staging"},
    ]
    await _open(home, n, "release", "Ship release 1.4 to staging", todos)
    artifact = "sha256:" + hashlib.sha256(b"release-1.4.tar.gz").hexdigest()
    async with _agents(home, n, "builder") as (builder,):
        grant = await builder.claim("release")
        asked = await builder.client.request_approval(
            grant.turn_id,
            grant.fence,
            "deploy.staging",
            "Deploy build 1.4 to staging",
            artifact_digest=artifact,
        )
        n.step(
            "builder",
            "request_approval deploy.staging",
            f"{asked.status} ({asked.approval_id})",
            decision="allow",
            turn_id=grant.turn_id,
            receipt_id=asked.receipt_id,
        )
        if asked.approval_id is None:  # refused: the step above says why
            return False
        await _approve(home, n, asked.approval_id)
        await builder.update(
            grant,
            "deploy-1",
            "Deployed 1.4 to staging.",
            {"deploy.staging": 1},
            usage=_usage(2, 0.05, 120.0),
            evidence=[{"kind": "deploy", "summary": "staging runs 1.4", "digest": artifact}],
            approval_ids=[asked.approval_id],
        )
        again = await builder.claim("release")
        reuse = await builder.update(
            again,
            "smoke-1",
            "Smoke test passed; redeployed a hotfix with the same approval.",
            {"deploy.staging": 1, "tests.run": 1},
            usage=_usage(1, 0.02, 30.0),
            evidence=[{"kind": "test", "summary": "smoke suite green", "digest": artifact}],
            approval_ids=[asked.approval_id],
        )
    return not reuse.accepted and "approval_invalid" in _reasons(reuse.reasons)


async def scenario_audit(home: Path, n: Narrator, work: Path) -> bool:
    n.section("audit", "5. audit — every receipt checked offline")
    async with admin.open_store(home) as store:
        size = await store.checkpoint()
    n.step("operator", "sign a checkpoint", f"tree size {size}", decision="allow")
    keyring = admin.keyring_of(home)
    with admin.open_reader(home) as reader:
        report = audit(reader, keyring)
    n.step(
        "auditor",
        "loopwarden verify",
        f"{'clean' if report.clean else 'TAMPERED'}: {render.counted(report.receipts, 'receipt')}, "
        f"{render.counted(report.loops, 'loop')}, tree size {report.tree_size}, "
        f"{render.counted(report.checkpoints, 'checkpoint')}, projections rebuilt",
        decision="allow" if report.clean else "deny",
    )
    n.say(f"            Merkle root {report.root}")
    return report.clean


async def scenario_bundle(home: Path, n: Narrator, work: Path) -> bool:
    async with admin.open_store(home) as store:
        await store.checkpoint()
        now = store.clock()
        signer = store.signer
        bundle = await store.read(lambda r: export_bundle(r, "guarded", store.keyring, now, signer))
        key = store.signer.public_key
    path = work / "guarded-bundle.json"
    path.write_text(json.dumps(bundle, indent=2))
    n.step(
        "operator",
        "loopwarden export guarded",
        f"{render.counted(len(bundle['receipts']), 'receipt')} → {path.name}",
        decision="allow",
    )
    report = verify_bundle(json.loads(path.read_text()), Keyring({"pinned": key}))
    n.step(
        "auditor",
        "loopwarden verify-bundle --key …",
        f"{'clean' if report.clean else 'TAMPERED'}: replayed status {report.status} ({report.stop_reason})",
        decision="allow" if report.clean else "deny",
    )
    return report.clean


def _host_event(name: str, tool: str | None = None, **fields: Any) -> dict[str, Any]:
    """A Claude Code hook event, as its hooks send them (docs/hooks.md)."""
    event = {
        "session_id": "demo-session",
        "transcript_path": "",
        "cwd": ".",
        "hook_event_name": name,
        **(
            {
                "tool_name": tool,
                "tool_use_id": f"toolu_{hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:12]}",
            }
            if tool
            else {}
        ),
        **fields,
    }
    return event


async def _hook(home: Path, n: Narrator, event: dict[str, Any], action: str) -> str | None:
    """Run the real command hook (`loopwarden hook claude-code`) on one event; the deny
    reason, or None if the call may run."""
    import sys

    import anyio

    command = [sys.executable, "-m", "loopwarden", "hook", "claude-code"]
    args = ["--loop", "hooked", "--agent", "builder", "--home", str(home)]
    done = await anyio.run_process([*command, *args], input=json.dumps(event).encode(), check=False)
    out = json.loads(done.stdout) if done.stdout.strip() else {}
    spec = out.get("hookSpecificOutput", {})
    reason = (
        spec.get("permissionDecisionReason") if spec.get("permissionDecision") == "deny" else None
    )
    if done.returncode not in (0,):
        reason = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
    n.step(
        "host",
        action,
        "blocked: " + reason.removeprefix("loopwarden: ") if reason else "let through",
        decision="deny" if reason else "allow",
    )
    return reason


async def scenario_hooks(home: Path, n: Narrator, work: Path) -> bool:
    n.section("hooks", "4. hooks — the agent's host asks before every tool call")
    todos = [
        {"id": "fix", "title": "fix the failing test"},
        {"id": "notes", "title": "write notes"},
    ]
    await _open(home, n, "hooked", "Fix the failing test; never push", todos)

    def bash(command: str, phase: str = "PreToolUse", **more: Any) -> dict[str, Any]:
        return _host_event(phase, "Bash", tool_input={"command": command}, **more)

    tested = [{"kind": "test", "summary": "3 passed"}]
    await _hook(home, n, _host_event("SessionStart", source="startup"), "SessionStart")
    async with _agents(home, n, "builder") as (builder,):
        grant = await builder.claim("hooked")
        ran = await _hook(home, n, bash("pytest -q"), "Bash: pytest -q")
        await _hook(
            home,
            n,
            bash("pytest -q", "PostToolUse", tool_response={"stdout": "3 passed"}),
            "Bash ran",
        )
        pushed = await _hook(home, n, bash("git push origin main"), "Bash: git push origin main")
        under = await builder.update(
            grant, "hooked-1", "Fixed the test.", {"fs.write": 1}, evidence=tested
        )
        again = await builder.claim("hooked")
        await _hook(home, n, bash("pytest -q"), "Bash: pytest -q")
        honest = await builder.update(
            again,
            "hooked-2",
            "Fixed the test; reported what the host saw.",
            {"shell.run": 1},
            evidence=tested,
        )
    return (
        ran is None
        and pushed is not None
        and not under.accepted
        and "unreported_tool_use" in _reasons(under.reasons)
        and honest.accepted
    )


Scenario = Callable[[Path, Narrator, Path], Awaitable[bool]]
SCENARIOS: dict[str, Scenario] = {
    "success": scenario_success,
    "refusal": scenario_refusal,
    "approval": scenario_approval,
    "hooks": scenario_hooks,
    "audit": scenario_audit,
    "bundle": scenario_bundle,
}


def _leaf(exc: BaseException) -> str:
    """The innermost message of an exception (task groups wrap transport errors)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def fresh_home(home: Path) -> None:
    """Refuse, before anything runs, a home that already holds a database: the demo opens its
    loops under fixed ids (`build-review`, ...), so on an earlier demo's store every scenario
    would fail, and on anyone else's it would mix its loops into theirs. `Conflict`."""
    if (home / DB_NAME).is_file():
        raise Conflict(
            f"{home} already holds a loopwarden database (an earlier demo's?); the demo needs a "
            "home of its own: give --home a new directory, or leave --home out to use a "
            "temporary one"
        )


async def run_demo(home: str | Path | None = None, as_json: bool = False) -> bool:
    """Run every scenario; True if each showed what it should and the audit is clean.

    With `home`, the demo's store and bundle stay there (a home that already holds a database
    is refused first: `fresh_home`); without, it works in a fresh temporary directory and
    removes it at the end."""
    if home:
        fresh_home(Path(home))
    work = Path(home) if home else Path(tempfile.mkdtemp(prefix="loopwarden-demo-"))
    work.mkdir(parents=True, exist_ok=True, mode=0o700)
    home_path = work if home else work / "home"
    try:
        return await _run_scenarios(home_path, work, as_json, kept=home is not None)
    finally:
        if home is None:
            shutil.rmtree(work, ignore_errors=True)


async def _run_scenarios(home: Path, work: Path, as_json: bool, *, kept: bool) -> bool:
    n = Narrator(as_json)
    if not as_json:
        render.console.print(
            "[bold]loopwarden demo[/bold] — governed agent loops over MCP (stdio), "
            "every step a signed, Merkle-logged receipt"
        )
        render.console.print(f"[dim]data home {home}{'' if kept else ' (temporary)'}[/dim]")
    results: dict[str, bool] = {}
    for name, scenario in SCENARIOS.items():
        try:
            results[name] = await scenario(home, n, work)
        except Exception as exc:  # the demo reports a broken step instead of a traceback
            results[name] = False
            n.step("demo", name, f"FAILED: {_leaf(exc)}", decision="deny")
    ok = all(results.values())
    if as_json:
        steps = [s.__dict__ for s in n.steps]
        render.emit_json(
            {"ok": ok, "home": str(home), "kept": kept, "results": results, "steps": steps}
        )
        return ok
    verdict = (
        "[green]all scenarios behaved as governed[/green]"
        if ok
        else "[red]a scenario misbehaved[/red]"
    )
    outcomes = ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in results.items())
    render.console.print(f"\n{verdict}: {outcomes}")
    cmd = render.program()
    hint = (
        f"inspect it: {cmd} loop show build-review --home {home}"
        if kept
        else f"the temporary data home is removed; to keep one and inspect it: {cmd} demo --home DIR"
    )
    render.console.print(f"[dim]{escape(hint)}[/dim]", soft_wrap=True)
    return ok
