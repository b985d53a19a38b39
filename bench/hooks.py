"""Family 9 — host hooks: what a hook adds to every tool call the model makes.

The command hook end to end (the host starts `loopwarden hook claude-code`, writes the event to
its stdin and reads the answer: process start, store, decision, sealed receipt, exit), the same
through the standard-library forwarder to a running server (`--server`), and the HTTP hook's
round trip (`POST /hooks/claude-code` with an observer token). Each is a Claude Code PreToolUse
for `Bash` that the policy admits (the common case: a receipt sealed per call), on a loop with
an open turn, `[observe] mode = "enforce"`, SQLite synchronous=full.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2

from bench import harness as h
from bench.dashboard import mint
from bench.report import Section, Table, Target
from bench.transport import http_server
from loopwarden.operations.claim import ClaimRequest, claim
from loopwarden.operations.hooks import HookEvent, hook
from loopwarden.operations.loops import OpenLoopRequest, TodoInput, open_loop
from loopwarden.principals import Principal

NAME = "hooks"
LOOP = "hooked"
POLICY = {
    "agents": [h.AGENT.id],
    "tools": {"allow": ["fs.*", "shell.run"], "commands": {"deny": ["git push*"]}},
    "budgets": {"max_turns": 1_000},
    "claims": {"lease_seconds": 7 * 86400},
    "observe": {"mode": "enforce"},
}


@dataclass(frozen=True)
class Config:
    processes: int
    requests: int


QUICK = Config(processes=10, requests=100)
FULL = Config(processes=40, requests=400)


def event(n: int) -> bytes:
    return json.dumps(
        {
            "session_id": "bench-session",
            "transcript_path": "",
            "cwd": ".",
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_input": {"command": f"pytest -q tests/test_{n}.py"},
            "tool_use_id": f"toolu_{n:08d}",
        }
    ).encode()


async def prepare(home: Path) -> None:
    """A loop observed in enforce mode, the agent's host attached, a turn open."""
    async with h.open_store(home) as store:
        await open_loop(
            store,
            h.OPERATOR,
            OpenLoopRequest(
                objective="bench hooks",
                policy=POLICY,
                loop_id=LOOP,
                todos=[TodoInput(id="t", title="work")],
            ),
        )
        observer = Principal(id=h.AGENT.id, role="observer")
        await hook(
            store,
            observer,
            HookEvent(
                loop_id=LOOP, host="claude-code", phase="session", session_id="bench-session"
            ),
        )
        granted = await claim(store, h.AGENT, ClaimRequest(loop_id=LOOP))
        if not granted.granted:
            raise RuntimeError(f"the bench turn was refused: {granted.reasons}")


def timed_process(args: list[str], raw: bytes, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(args, input=raw, capture_output=True, env=env, timeout=60)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0 or done.stdout.strip():
        raise RuntimeError(f"the hook did not admit the call: {done.returncode} {done.stderr!r}")
    return elapsed


def command_hook(
    home: Path, cfg: Config, deadline: h.Deadline, server: str | None, token: str
) -> list[float]:
    program = h.python(
        "-m", "loopwarden", "hook", "claude-code", "--loop", LOOP, "--agent", h.AGENT.id
    )
    extra = ["--server", server] if server else ["--home", str(home)]
    env = h.child_env(LOOPWARDEN_OBSERVER_TOKEN=token) if server else h.child_env()
    samples = []
    for n in range(cfg.processes):
        if deadline.expired:
            break
        samples.append(timed_process([*program, *extra], event(n), env))
    return samples


LINE_1KB = (
    (
        "cd /repo && git status --short && python -m pytest tests/test_policy.py -x -q 2>&1 | "
        "tail -30; grep -rn 'def evaluate' loopwarden | head -20 && find . -name '*.py' -not "
        "-path './.venv/*' | xargs wc -l | sort -n | tail -5; "
    )
    * 8
)[:1024]
"""A 1 KB line of the ordinary kind: lists, pipes, redirections, quoting, a launcher."""


def decide_line(cfg: Config, deadline: h.Deadline) -> list[float]:
    """`[tools.commands]` deciding LINE_1KB in process (the grammar already imported)."""
    from loopwarden.policy.evaluate import command_reasons
    from loopwarden.policy.model import CommandRules

    rules = CommandRules(deny=("git push", "rm -r -f"))
    if command_reasons(rules, LINE_1KB):
        raise RuntimeError("the 1 KB line was refused")
    samples: list[float] = []
    stop = time.perf_counter() + min(2.0, deadline.left / 4)
    while len(samples) < cfg.requests * 3 and (not samples or time.perf_counter() < stop):
        t0 = time.perf_counter()
        command_reasons(rules, LINE_1KB)
        samples.append(time.perf_counter() - t0)
    return samples


def http_hook(base: str, token: str, cfg: Config, deadline: h.Deadline) -> list[float]:
    samples = []
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx2.Client(timeout=30) as http:
        for n in range(cfg.requests):
            if deadline.expired:
                break
            t0 = time.perf_counter()
            response = http.post(
                f"{base}/hooks/claude-code?loop={LOOP}", content=event(n), headers=headers
            )
            samples.append(time.perf_counter() - t0)
            if response.status_code != 200 or response.content:
                raise RuntimeError(f"the HTTP hook did not admit the call: {response.text[:200]}")
    return samples


def _row(label: str, samples: list[float]) -> list[str]:
    latency = h.Latency.of(samples)
    return [label, str(latency.count), h.ms(latency.p50), h.ms(latency.p99), h.rate(latency.rate)]


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    deadline = h.Deadline(budget)
    section = Section(
        family=NAME,
        number=9,
        title="Host hooks",
        how=(
            "a Claude Code PreToolUse event for Bash that the policy admits (`tool.admitted` "
            'sealed per call) on a loop with an open turn, `[observe] mode = "enforce"`, '
            "synchronous=full. Command hook: `python -m loopwarden hook claude-code …` started "
            f"per event (stdin in, answer out), {cfg.processes} runs; the forwarder: the same "
            "command with `--server` posting to a running `serve --http`; HTTP hook: sequential "
            f"`POST /hooks/claude-code` with an observer token, {cfg.requests} requests. The "
            "interpreter alone (`python -c pass`) is timed in the same run."
        ),
    )
    results: dict[str, list[float]] = {}
    h.progress(NAME, "deciding a 1 KB line")
    results["decide"] = decide_line(cfg, deadline)
    with h.temp_home(NAME) as home:
        await prepare(home)
        token = mint(home, h.AGENT.id, "observer")
        h.progress(NAME, "interpreter start")
        bare = [timed_process(h.python("-c", "pass"), b"", h.child_env()) for _ in range(10)]
        h.progress(NAME, "command hook")
        results["command"] = command_hook(home, cfg, deadline, None, token)
        async with http_server(home, home.parent / "serve.log", "loopwarden", "serve") as base:
            h.progress(NAME, "forwarder")
            results["forward"] = command_hook(home, cfg, deadline, base, token)
            h.progress(NAME, "HTTP hook")
            results["http"] = http_hook(base, token, cfg, deadline)
    section.tables.append(
        Table(
            ["hook", "n", "p50 ms", "p99 ms", "per second"],
            [
                _row("bare interpreter (`python -c pass`), for scale", bare),
                _row(
                    "command hook, in process (`loopwarden hook claude-code`)", results["command"]
                ),
                _row("command hook, forwarded (`--server`)", results["forward"]),
                _row("HTTP hook (`POST /hooks/claude-code`)", results["http"]),
                _row("deciding a 1 KB shell line in process (command rules)", results["decide"]),
            ],
        )
    )
    section.targets += _targets(results, bare)
    section.notes.append(
        f"load average at the start of the family: {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    return section


def _targets(results: dict[str, list[float]], bare: list[float]) -> list[Target]:
    command, http = h.Latency.of(results["command"]), h.Latency.of(results["http"])
    forward = h.Latency.of(results["forward"])
    decide = h.Latency.of(results["decide"])
    return [
        Target(
            "command hook ≤ 150 ms p50 (process start → answer)",
            f"{h.ms(command.p50)} ms in process; {h.ms(forward.p50)} ms forwarded to a server",
            command.p50 <= 0.150,
            f"the interpreter alone takes {h.ms(h.median(bare))} ms here; the rest in process is "
            "importing the decision's modules (pydantic models, the store) and one fsync'd commit"
            if command.p50 > 0.150
            else "",
        ),
        Target(
            "deciding a 1 KB shell line ≤ 1 ms p50 (in process)",
            f"{h.ms(decide.p50)} ms (p99 {h.ms(decide.p99)})",
            decide.p50 <= 0.001,
        ),
        Target(
            "HTTP hook ≤ 10 ms p50",
            f"{h.ms(http.p50)} ms (p99 {h.ms(http.p99)})",
            http.p50 <= 0.010,
        ),
    ]
