"""The real-host check: every scenario (`scenarios.py`) in every host that can run it, each on a
fresh world, the host driven by a scripted fake of its model API on loopback (`fake.py`).

`make check-clients` calls `check()` once the pinned clients are installed; it prints one `ok`
or `FAIL` line per host and scenario and, if any failed, raises the caller's failure with one
line naming them. What each host sent (a redacted request log), each session's output and the
journal's receipts (kinds, tools, reasons) are written under `test-artifacts/real-hosts/`.
Every session is bounded and killed with everything it started; nothing listens beyond
127.0.0.1.

Standalone (clients already installed by `make check-clients`), from the repository's root:
    PYTHONPATH=.ci .venv/bin/python -m hosts [--clients-dir DIR] [--only HOST[/SCENARIO]]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .claude_code import ClaudeCode
from .codex_cli import CodexCli
from .fake import FAKE_KEY, FakeApi
from .gateway import OUTPUT_CAP, gateway
from .gemini_cli import GeminiCli
from .host import Host, Options
from .scenarios import SCENARIOS, Outcome, Scenario
from .script import Script
from .world import Failed, World, bounded, last_line

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "real-hosts"
SESSION_SECONDS = 120  # one host session (a normal one takes 5 to 20 s)
TOTAL_SECONDS = 1200  # all of it: past this, the scenarios left are failed unrun
HOSTS: tuple[Host, ...] = (ClaudeCode(), GeminiCli(), CodexCli())


@dataclass(frozen=True)
class Result:
    host: Host
    scenario: Scenario
    failure: str | None
    held: tuple[str, ...]
    seconds: float

    def line(self) -> str:
        where = f"{self.host.label} · {self.scenario.name}"
        if self.failure is None:
            return f"ok    {where}: {'; '.join(self.held)} ({self.seconds:.0f} s)"
        return f"FAIL  {where}: {self.failure} ({self.seconds:.0f} s)"


def _summary(body: dict[str, Any]) -> dict[str, Any]:
    """A receipt as the artifact keeps it: what it is, never an input or a digest."""
    data = body.get("data") or {}
    keep = ("host", "session_id", "host_tool", "tool", "enforced", "agent_id", "agent_type")
    decision = body.get("decision") or {}
    return {
        "seq": body.get("seq"),
        "kind": body.get("kind"),
        **{k: data[k] for k in keep if k in data},
        "reasons": [r.get("code") for r in decision.get("reasons", []) if isinstance(r, dict)],
    }


def run_sessions(
    host: Host, scenario: Scenario, world: World, api_url: str, options: Options
) -> None:
    for number, name in enumerate(scenario.sessions, 1):
        if number > 1 and scenario.between is not None:
            scenario.between(world)  # what changes between sessions (a re-described tool)
        prompt = f"Follow script:{name}."
        argv, extra = host.session(world, api_url, prompt, options)
        done = bounded(argv, world.project, world.env(extra), SESSION_SECONDS)
        log = f"$ {' '.join(argv[:2])} …\nexit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        (world.logs / f"session-{number}.log").write_text(log)
        if done.returncode != 0 and not scenario.stops:
            raise Failed(
                f"session {number} exited {done.returncode}: {last_line(done.stderr or done.stdout)}"
            )


def run_one(host: Host, scenario: Scenario, clients: Path, scratch: Path) -> Result:
    """One scenario in one host, on a fresh world; what held, or the first thing that did not."""
    started = time.monotonic()
    logs = ARTIFACTS / host.name / scenario.name
    shutil.rmtree(logs, ignore_errors=True)
    world = World(scratch / host.name / scenario.name, clients, logs)
    options = scenario.options
    script = Script(
        scenario.steps(host.features), output_cap=OUTPUT_CAP if options.gateway else None
    )
    script.memory.operator = world.run  # the operator's side: `loopwarden approve`, say
    held: list[str] = []
    try:
        world.build(scenario.policy())
        with (
            FakeApi(host.dialect(script), logs / "requests.jsonl") as api,
            contextlib.ExitStack() as stack,
        ):
            api_url = api.url
            if options.gateway:  # the host calls loopwarden's gateway, which calls the fake
                api_url, token = stack.enter_context(gateway(world, api.url, host.name))
                options = dataclasses.replace(options, key=token)
            host.configure(world, api_url, options)
            remote_before = world.remote_head()
            run_sessions(host, scenario, world, api_url, options)
        receipts = world.receipts()
        (logs / "receipts.json").write_text(json.dumps([_summary(r) for r in receipts], indent=1))
        leaked = [p.name for p in logs.iterdir() if FAKE_KEY in p.read_text(errors="replace")]
        if leaked:
            raise Failed(f"the artifacts hold the API key: {leaked}")
        outcome = Outcome(world, script.memory, remote_before, receipts, tuple(script.reported))
        for check in scenario.checks:
            held.append(check(outcome))
    except Failed as exc:
        return Result(host, scenario, str(exc), tuple(held), time.monotonic() - started)
    except Exception as exc:  # a harness fault fails the scenario, in one line, never the run
        failure = f"the check itself failed: {type(exc).__name__}: {exc}"
        return Result(host, scenario, failure, tuple(held), time.monotonic() - started)
    return Result(host, scenario, None, tuple(held), time.monotonic() - started)


def selected(only: str | None) -> list[tuple[Host, Scenario]]:
    pairs = [(h, s) for h in HOSTS for s in SCENARIOS if s.needs is None or s.needs in h.features]
    if only:
        pairs = [(h, s) for h, s in pairs if f"{h.name}/{s.name}".startswith(only)]
    return pairs


def check(
    clients: Path,
    scratch: Path,
    failure: Callable[[str], Exception],
    only: str | None = None,
    emit: Callable[[str], None] = lambda line: print(line, flush=True),
) -> None:
    """Run the scenarios (`only`: a `HOST[/SCENARIO]` prefix), emitting one line each; raise
    `failure(line)` naming every scenario that failed."""
    started = time.monotonic()
    results = []
    for host, scenario in selected(only):
        if time.monotonic() - started > TOTAL_SECONDS:
            spent = f"not run: the real-host check's {TOTAL_SECONDS} s were spent"
            result = Result(host, scenario, spent, (), 0.0)
        else:
            result = run_one(host, scenario, clients, scratch / "real-hosts")
        emit(result.line())
        results.append(result)
    failed = [r for r in results if r.failure is not None]
    took = time.monotonic() - started
    emit(
        f"real hosts: {len(results) - len(failed)} of {len(results)} scenarios held ({took:.0f} s)"
    )
    if failed:
        named = "; ".join(f"{r.host.name}/{r.scenario.name}: {r.failure}" for r in failed)
        raise failure(f"real hosts: {len(failed)} scenario(s) failed: {named}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--clients-dir", type=Path, default=Path(tempfile.gettempdir()) / "loopwarden-clients"
    )
    parser.add_argument("--only", default=None, help="HOST[/SCENARIO] prefix, e.g. codex/honest")
    args = parser.parse_args()
    if not (args.clients_dir / "node_modules" / ".bin" / "claude").exists():
        print(f"no clients in {args.clients_dir}: run `make check-clients` once", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="loopwarden-real-hosts-") as scratch:
        try:
            check(args.clients_dir, Path(scratch), Failed, only=args.only)
        except Failed as exc:
            print(f"client check FAILED: {exc}", file=sys.stderr)
            return 1
    return 0
