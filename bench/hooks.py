"""Family 9 — host hooks: what a hook adds to every tool call the model makes.

The command hook end to end (the host starts `loopwarden hook claude-code`, writes the event to
its stdin and reads the answer), three ways: the default hook `hook install` writes, which
forwards to the home's local hook server on a Unix socket (started by the first call, which is
timed apart); the in-process hook (`--in-process`: process start, store, decision, sealed
receipt, exit); and the standard-library forwarder to a running server (`--server`). Then the
HTTP hook's round trip (`POST /hooks/claude-code` with an observer token). Each is a Claude Code PreToolUse
for `Bash` that the policy admits (the common case: a receipt sealed per call), on a loop with
an open turn, `[observe] mode = "enforce"`, SQLite synchronous=full.

Where the in-process hook's time goes is measured twice over: its phases timed inside the
process (interpreter start, imports, the decision) and its imports by module and by package
from `python -X importtime` (the flag's own bookkeeping inflates those figures; their shares
are what they show).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import httpx2

from bench import harness as h
from bench.dashboard import mint
from bench.report import Section, Table, Target
from bench.transport import http_server
from loopwarden.hosts.hook import HookEvent, hook
from loopwarden.loops.lifecycle import OpenLoopRequest, TodoInput, open_loop
from loopwarden.principals import Principal
from loopwarden.turns.claim import ClaimRequest, claim

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


MIN_SAMPLES = 5  # a loop past its share still takes these, so that every row has a figure
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


@dataclass(frozen=True)
class Install:
    """The loopwarden a hook process runs. A host runs an installed one: a wheel of this tree,
    built and installed here into a scratch venv whose dependencies are the bench's own (a
    `.pth` line names the bench venv's site-packages, so no import finder of this checkout's
    editable install is loaded), compiled as pip compiles it. If the wheel cannot be built
    here (no package index for its build backend), this checkout's editable install instead,
    said so in the report. Every process starts in `cwd`, outside the checkout, so that
    `python -m`/`-c` do not import the source tree from the working directory."""

    executable: str
    pythonpath: str | None  # the checkout on the path (the editable fallback), else nothing
    cwd: Path
    label: str

    def python(self, *args: str) -> list[str]:
        return [self.executable, *args]

    def run(self, args: list[str], raw: bytes, **extra: str) -> subprocess.CompletedProcess[bytes]:
        # bytecode caching on: pip compiles an installed package once; with
        # PYTHONDONTWRITEBYTECODE set every hook process would compile every module it imports
        env = h.child_env(**extra)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.pop("PYTHONPATH", None)
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        return subprocess.run(
            args, input=raw, capture_output=True, env=env, cwd=self.cwd, timeout=60
        )  # fmt: skip


def installed(scratch: Path) -> Install:
    """A wheel of this tree installed in a venv under `scratch` (or the editable fallback)."""
    scratch.mkdir(parents=True, exist_ok=True)
    source, wheels, venv = scratch / "source", scratch / "wheels", scratch / "venv"
    skip = shutil.ignore_patterns("__pycache__")  # a copy: no stale build/ gets into the wheel
    shutil.copytree(h.REPO / "loopwarden", source / "loopwarden", ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(h.REPO / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    try:
        for step in (
            [*pip, "wheel", "--no-deps", "-w", str(wheels), str(source)],
            [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        ):
            subprocess.run(step, check=True, capture_output=True, timeout=180)
        (site,) = venv.glob("lib/python3*/site-packages")
        deps = next(Path(p) for p in sys.path if p.endswith("site-packages"))
        (site / "_bench_dependencies.pth").write_text(f"{deps}\n")
        (wheel,) = wheels.glob("loopwarden-*.whl")
        python = str(venv / "bin" / "python")
        install = [*pip, "--python", python, "install", "--no-deps", str(wheel)]
        subprocess.run(install, check=True, capture_output=True, timeout=180)
    except (subprocess.SubprocessError, OSError, ValueError, StopIteration) as exc:
        why = f"the wheel could not be built and installed here ({type(exc).__name__})"
        return Install(
            sys.executable, str(h.REPO), scratch, f"this checkout's editable install: {why}"
        )
    return Install(python, None, scratch, "a wheel of this tree installed in a scratch venv")


def timed_process(inst: Install, args: list[str], raw: bytes, **extra: str) -> float:
    t0 = time.perf_counter()
    done = inst.run(args, raw, **extra)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0 or done.stdout.strip():
        raise RuntimeError(f"the hook did not admit the call: {done.returncode} {done.stderr!r}")
    return elapsed


HOOK = ["hook", "claude-code", "--loop", LOOP, "--agent", h.AGENT.id]
IN_PROCESS = "--in-process"
LOCAL = "local"  # the default hook: the home's local hook server
PEER_MS = 458.0  # issue 43: the Agent Governance Toolkit's Claude Code hook process, same run


def command_hook(
    inst: Install, home: Path, cfg: Config, deadline: h.Deadline, server: str, token: str
) -> list[float]:
    """`server`: a URL (the forwarder), `IN_PROCESS`, or `LOCAL` (the default hook, its server
    already started)."""
    program = [*inst.python("-m", "loopwarden", *HOOK)]
    if server == IN_PROCESS:
        program += ["--home", str(home), IN_PROCESS]
    elif server == LOCAL:
        program += ["--home", str(home)]
    else:
        program += ["--server", server]
    env = {"LOOPWARDEN_OBSERVER_TOKEN": token} if server.startswith("http") else {}
    timed_process(inst, program, event(-1), **env)  # the bytecode, if missing
    samples: list[float] = []
    for n in range(cfg.processes):
        if deadline.expired and len(samples) >= MIN_SAMPLES:
            break
        samples.append(timed_process(inst, program, event(n), **env))
    return samples


def first_calls(inst: Install, home: Path, runs: int) -> list[float]:
    """The default hook's first call, `runs` times: no server runs, the call starts it (its
    imports, the store's opening), waits for it and is answered; the server is stopped after."""
    program = [*inst.python("-m", "loopwarden", *HOOK, "--home", str(home))]
    stop = inst.python("-m", "loopwarden", "hook", "stop", "--home", str(home))
    samples = []
    for n in range(runs):
        inst.run(stop, b"")
        samples.append(timed_process(inst, program, event(200_000 + n)))
    return samples


# The in-process hook with its imports done first and timed, then the same main and the same
# exit (no interpreter teardown) as the entry point's: what is left after the imports is the
# decision (store, evaluation, receipt, the fsync'd commit, and the command-line parser's own
# imports on a shell call).
PHASES = """
import sys, time
t0 = time.perf_counter()
from loopwarden.cli.entry import lean, leave
lean()
from loopwarden.clients import admin, hook_command
from loopwarden.hosts import handle
from loopwarden.kernel.store import homes
from loopwarden.kernel.log import keys
from loopwarden.kernel.store import store
t1 = time.perf_counter()
code = hook_command.main(sys.argv[2:])  # argv: -c hook HOST …
t2 = time.perf_counter()
sys.stderr.write(f"\\nphases {t1 - t0} {t2 - t1}\\n")
leave(code)
"""


def phases(inst: Install, home: Path, runs: int) -> dict[str, list[float]]:
    """`runs` in-process hooks, each timed from outside (`whole`) and inside (`imports`,
    `decision`); `outside` is the rest: the interpreter's start and exit, the pipes."""
    found: dict[str, list[float]] = defaultdict(list)
    for n in range(runs):
        t0 = time.perf_counter()
        done = inst.run(inst.python("-c", PHASES, *HOOK, "--home", str(home)), event(20_000 + n))
        whole = time.perf_counter() - t0
        line = done.stderr.decode().rsplit("phases ", 1)[-1].split()
        if done.returncode != 0 or done.stdout.strip() or len(line) != 2:
            raise RuntimeError(f"the timed hook failed: {done.returncode} {done.stderr[-300:]!r}")
        imports, decision = float(line[0]), float(line[1])
        for key, value in (("whole", whole), ("imports", imports), ("decision", decision)):
            found[key].append(value)
        found["outside"].append(whole - imports - decision)
    return found


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
    samples: list[float] = []
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    with httpx2.Client(timeout=30) as http:
        for n in range(cfg.requests):
            if deadline.expired and len(samples) >= MIN_SAMPLES:
                break
            t0 = time.perf_counter()
            response = http.post(
                f"{base}/hooks/claude-code?loop={LOOP}", content=event(n), headers=headers
            )
            samples.append(time.perf_counter() - t0)
            if response.status_code != 200 or response.content:
                raise RuntimeError(f"the HTTP hook did not admit the call: {response.text[:200]}")
    return samples


# --- where the in-process hook's imports go (`-X importtime`) --------------------------------

PYDANTIC = (
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_inspection",
    "typing_extensions",
)


@dataclass(frozen=True)
class Imported:
    """One module's line of `-X importtime`: its own time and with what it imported (µs)."""

    name: str
    own: int
    total: int


def importtime(inst: Install, args: list[str], raw: bytes, **env: str) -> list[Imported]:
    """The modules `python -X importtime ARGS` imports, in its order; the process must answer
    (exit 0, nothing on stdout: an admitted call)."""
    done = inst.run(inst.python("-X", "importtime", *args), raw, **env)
    if done.returncode != 0 or done.stdout.strip():
        raise RuntimeError(f"the traced hook failed: {done.returncode} {done.stderr[-300:]!r}")
    found = []
    for line in done.stderr.decode().splitlines():
        own, _, rest = line.removeprefix("import time:").partition("|")
        total, _, name = rest.partition("|")
        if line.startswith("import time:") and own.strip().isdigit():
            found.append(Imported(name.strip(), int(own), int(total)))
    return found


def group_of(name: str, startup: set[str]) -> str:
    top = name.split(".")[0]
    if name in startup:
        return "interpreter start-up (imported by `python -c pass` too)"
    if top in PYDANTIC:
        return "pydantic (with pydantic_core, annotated_types, typing_*)"
    if name.startswith(("loopwarden.kernel", "loopwarden.policy", "loopwarden.kernel.runner")):
        return ".".join(name.split(".")[:2])
    if top == "loopwarden":
        return "loopwarden, the rest (clients, hooks, hosts, …)"
    if top in sys.stdlib_module_names:
        return "the standard library"
    return "other packages (PyNaCl, tree-sitter, rfc8785, anyio, …)"


def import_breakdown(inst: Install, home: Path, runs: int) -> tuple[Table, Table, dict[str, float]]:
    """The in-process hook's imports, median of `runs` traced runs: the top modules by
    cumulative time, and the time by package (with the figures the targets' notes use)."""
    startup = {m.name for m in importtime(inst, ["-c", "pass"], b"")}
    traced = [
        importtime(inst, ["-m", "loopwarden", *HOOK, "--home", str(home)], event(10_000 + n))
        for n in range(runs)
    ]
    own: dict[str, list[int]] = defaultdict(list)
    total: dict[str, list[int]] = defaultdict(list)
    for trace in traced:
        for m in trace:
            own[m.name].append(m.own)
            total[m.name].append(m.total)
    mid = {name: h.median([float(x) for x in values]) / 1e6 for name, values in own.items()}
    cumulative = {name: h.median([float(x) for x in v]) / 1e6 for name, v in total.items()}
    top = sorted(cumulative, key=lambda name: -cumulative[name])[:12]
    by_module = Table(
        ["module (top 12 by cumulative import time)", "own ms", "cumulative ms"],
        [[f"`{name}`", h.ms(mid[name]), h.ms(cumulative[name])] for name in top],
        title="The in-process hook's imports, by module (`-X importtime`)",
    )
    groups: dict[str, list[str]] = defaultdict(list)
    for name in mid:
        groups[group_of(name, startup)].append(name)
    whole = sum(mid.values())
    shares = {g: sum(mid[n] for n in names) for g, names in groups.items()}
    by_package = Table(
        ["imported", "modules", "own ms", "share"],
        [[g, str(len(groups[g])), h.ms(shares[g]), f"{shares[g] / whole:.0%}"]
         for g in sorted(shares, key=lambda g: -shares[g])]
        + [["all", str(len(mid)), h.ms(whole), "100%"]],
        title="The same imports by package (own times summed)",
    )  # fmt: skip
    figures = {"whole": whole, "modules": float(len(mid))}
    figures["pydantic"] = next((v for g, v in shares.items() if g.startswith("pydantic")), 0.0)
    figures["loopwarden"] = sum(v for g, v in shares.items() if g.startswith("loopwarden"))
    return by_module, by_package, figures


def forwarder_imports(inst: Install, base: str, token: str) -> list[Imported]:
    """What the forwarder imports beyond the bare interpreter's own start-up."""
    startup = {m.name for m in importtime(inst, ["-c", "pass"], b"")}
    args = ["-m", "loopwarden", *HOOK, "--server", base]
    traced = importtime(inst, args, event(-3), LOOPWARDEN_OBSERVER_TOKEN=token)
    return [m for m in traced if m.name not in startup]


def _row(label: str, samples: list[float]) -> list[str]:
    latency = h.Latency.of(samples)
    p95 = h.percentile(samples, 95)
    return [label, str(latency.count), h.ms(latency.p50), h.ms(p95), h.ms(latency.p99),
            h.rate(latency.rate)]  # fmt: skip


HOW = (
    "a Claude Code PreToolUse event for Bash that the policy admits (`tool.admitted` sealed per "
    'call) on a loop with an open turn, `[observe] mode = "enforce"`, synchronous=full. Command '
    "hook: `python -m loopwarden hook claude-code …` started per event (stdin in, answer out; "
    "a wheel of this tree installed in a scratch venv, compiled as pip compiles it, started "
    "outside the checkout; one untimed run first), {processes} runs; "
    "the forwarder: the same command with `--server` posting to a running `serve --http`; HTTP "
    "hook: sequential `POST /hooks/claude-code` with an observer token, {requests} requests. "
    "The default hook: the same command without `--server` or `--in-process`, forwarding to the "
    "home's local hook server over its Unix socket, {processes} runs once the server runs; its "
    "first call (no server: it starts one and waits for it) timed apart, the server stopped "
    "before each. The "
    "interpreter alone (`python -c pass`, and without the `site` module: `python -S -c pass`) is "
    "timed in the same run. Phases: {runs} in-process hooks that time their own imports, then "
    "decide. Imports: {traces} runs under `python -X importtime`, median per module; a module's "
    "own time excludes what it imports, its cumulative time includes it."
)


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    deadline = h.Deadline(budget)
    runs, traces = (3, 1) if quick else (7, 3)
    how = HOW.format(processes=cfg.processes, requests=cfg.requests, runs=runs, traces=traces)
    section = Section(family=NAME, number=9, title="Host hooks", how=how)
    results: dict[str, list[float]] = {}
    h.progress(NAME, "deciding a 1 KB line")
    results["decide"] = decide_line(cfg, deadline)
    with h.temp_home(NAME) as home:
        await prepare(home)
        token = mint(home, h.AGENT.id, "observer")
        h.progress(NAME, "installing a wheel of this tree")
        inst = installed(home.parent / "installed")
        section.notes.append(f"the hook processes run {inst.label}")
        h.progress(NAME, "interpreter start")
        for args, key in ((["-c", "pass"], "bare"), (["-S", "-c", "pass"], "bare -S")):
            results[key] = [timed_process(inst, inst.python(*args), b"") for _ in range(10)]
        h.progress(NAME, "the default hook's first call (it starts the local server)")
        results["first"] = first_calls(inst, home, 3 if quick else 5)
        h.progress(NAME, "the default hook (local server)")
        results["local"] = command_hook(inst, home, cfg, deadline, LOCAL, token)
        inst.run(inst.python("-m", "loopwarden", "hook", "stop", "--home", str(home)), b"")
        h.progress(NAME, "command hook in process")
        results["command"] = command_hook(inst, home, cfg, deadline, IN_PROCESS, token)
        h.progress(NAME, "phases and imports of the command hook")
        results.update(phases(inst, home, runs))
        by_module, by_package, figures = import_breakdown(inst, home, traces)
        async with http_server(home, home.parent / "serve.log", "loopwarden", "serve") as base:
            h.progress(NAME, "forwarder")
            results["forward"] = command_hook(inst, home, cfg, deadline, base, token)
            forwarded = forwarder_imports(inst, base, token)
            h.progress(NAME, "HTTP hook")
            results["http"] = http_hook(base, token, cfg, deadline)
    section.tables += [_latencies(results), _phases(results), by_module, by_package]
    section.targets += _targets(results, figures, forwarded)
    section.notes.append(_forwarded_note(forwarded))
    section.notes.append(
        f"load average at the start of the family: {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    return section


def _latencies(results: dict[str, list[float]]) -> Table:
    return Table(
        ["hook", "n", "p50 ms", "p95 ms", "p99 ms", "per second"],
        [
            _row("bare interpreter (`python -c pass`), for scale", results["bare"]),
            _row("bare interpreter without `site` (`python -S -c pass`)", results["bare -S"]),
            _row(
                "the default hook (`loopwarden hook claude-code`, local server)", results["local"]
            ),
            _row("the default hook's first call (starts the local server)", results["first"]),
            _row("command hook, in process (`--in-process`)", results["command"]),
            _row("command hook, forwarded (`--server`)", results["forward"]),
            _row("HTTP hook (`POST /hooks/claude-code`)", results["http"]),
            _row("deciding a 1 KB shell line in process (command rules)", results["decide"]),
        ],
    )


def _phases(results: dict[str, list[float]]) -> Table:
    whole = h.median(results["whole"])
    rows = [
        ("the interpreter's start and exit, the pipes (outside loopwarden's code)", "outside"),
        ("imports: entry point, hook command, store, keys, decision modules", "imports"),
        ("the decision: open the store, decide, seal, fsync'd commit, answer", "decision"),
        ("the whole hook, timed from outside", "whole"),
    ]
    return Table(
        ["phase of the in-process hook", "ms (median)", "share"],
        [[label, h.ms(h.median(results[key])), f"{h.median(results[key]) / whole:.0%}"]
         for label, key in rows],
        title=f"Where the in-process hook's time goes ({len(results['whole'])} runs)",
    )  # fmt: skip


def _forwarded_note(forwarded: list[Imported]) -> str:
    names = ", ".join(f"`{m.name}`" for m in forwarded)
    own = sum(m.own for m in forwarded) / 1e6
    return (
        f"the forwarder imports {len(forwarded)} modules beyond the bare interpreter's "
        f"({h.ms(own)} ms under `-X importtime`): {names}"
    )


def _targets(
    results: dict[str, list[float]], figures: dict[str, float], forwarded: list[Imported]
) -> list[Target]:
    command, http = h.Latency.of(results["command"]), h.Latency.of(results["http"])
    forward, decide = h.Latency.of(results["forward"]), h.Latency.of(results["decide"])
    bare, bare_s = h.median(results["bare"]), h.median(results["bare -S"])
    imports, decision = h.median(results["imports"]), h.median(results["decision"])
    in_process = (
        f"{h.ms(command.p50 - 0.100)} ms over ({command.p50 / 0.100 - 1:.0%}): the interpreter "
        f"takes {h.ms(bare)} ms, the imports {h.ms(imports)} ms ({figures['modules']:.0f} "
        f"modules; under `-X importtime` pydantic is {figures['pydantic'] / figures['whole']:.0%} "
        f"of them and loopwarden's own modules {figures['loopwarden'] / figures['whole']:.0%}, "
        "whose pydantic models and dataclasses are built as they are imported), the decision "
        f"{h.ms(decision)} ms"
    )
    own = sum(m.own for m in forwarded) / 1e6
    forwarded_note = (
        f"{h.ms(forward.p50 - 0.030)} ms over: the interpreter alone takes {h.ms(bare)} ms here "
        f"({h.ms(bare - bare_s)} ms of it is `site`), "
        f"the forwarder's own imports {h.ms(own)} ms under `-X importtime`, the server's answer "
        f"~{h.ms(http.p50)} ms (the HTTP hook's p50)"
    )
    local = h.Latency.of(results["local"])
    peer = f"{local.p50 * 1000 / PEER_MS:.2f}× the peer's {PEER_MS:.0f} ms (quoted in issue 43)"
    return [
        Target(
            "the default hook (local server) ≤ 30 ms p50 (process start → answer)",
            f"{h.ms(local.p50)} ms (p95 {h.ms(h.percentile(results['local'], 95))}); "
            f"{command.p50 / local.p50:.1f}× faster than in process",
            local.p50 <= 0.030,
        ),
        Target(
            "the default hook ≤ 0.25× the peer's hook process (p50)",
            peer,
            local.p50 * 1000 <= 0.25 * PEER_MS,
            "the peer (Microsoft's Agent Governance Toolkit's Claude Code hook, Node) is not "
            "installed here: the ratio is against the figure issue 43 measured in its run",
        ),
        Target(
            "command hook in process ≤ 100 ms p50 (process start → answer)",
            f"{h.ms(command.p50)} ms (p99 {h.ms(command.p99)})",
            command.p50 <= 0.100,
            in_process if command.p50 > 0.100 else "",
        ),
        Target(
            "command hook forwarded to a server ≤ 30 ms p50 (process start → answer)",
            f"{h.ms(forward.p50)} ms (p99 {h.ms(forward.p99)})",
            forward.p50 <= 0.030,
            forwarded_note if forward.p50 > 0.030 else "",
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
