"""Family 6 — startup: from spawning `loopwarden serve` over stdio to the first tool answer,
the import cost of the pieces in separate interpreters, and `python -X importtime` of the server
import, split into loopwarden's own modules and what they pull in."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from bench import harness as h
from bench.report import Section, Table, Target

NAME = "startup"
SERVER_IMPORT = "loopwarden.server.app"
CLI_IMPORT = "loopwarden.cli"  # what `loopwarden serve` imports first
TOP = 10


@dataclass(frozen=True)
class Config:
    starts: int
    import_runs: int


QUICK = Config(starts=3, import_runs=1)
FULL = Config(starts=5, import_runs=3)


async def first_answer(home: Path, log: Path) -> float:
    """Seconds from spawning `python -m loopwarden serve` to the first `quota` result."""
    params = StdioServerParameters(
        command=h.python()[0],
        args=["-m", "loopwarden", "serve", "--agent", h.AGENT.id, "--home", str(home)],
        env=h.child_env(),
        cwd=str(h.REPO),
    )
    with log.open("a") as errlog:
        t0 = time.perf_counter()
        async with Client(stdio_client(params, errlog=errlog)) as client:
            result = await client.call_tool("quota", {"loop_id": h.LOOP_ID})
            elapsed = time.perf_counter() - t0
            if result.is_error or not (result.structured_content or {}).get("allowed"):
                raise RuntimeError(f"the first quota call failed: {result.content}")
    return elapsed


def wall_of(code: str, runs: int) -> float:
    """Median wall time of `python -c CODE` in a fresh interpreter."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        h.run_child(h.python("-c", code), timeout=60)
        times.append(time.perf_counter() - t0)
    return h.median(times)


def importtime(module: str) -> list[tuple[str, int, int]]:
    """(module, self µs, cumulative µs) from `python -X importtime -c 'import MODULE'`."""
    done = h.run_child(h.python("-X", "importtime", "-c", f"import {module}"), timeout=60)
    out = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line.removeprefix("import time:").split("|")
        out.append((name.strip(), int(own), int(cumulative)))
    return out


def ours(name: str) -> bool:
    return name == "loopwarden" or name.startswith("loopwarden.")


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    section = Section(
        family=NAME,
        number=6,
        title="Startup",
        how=(
            "stdio: the SDK's stdio client spawns `python -m loopwarden serve --agent builder` on "
            "a home holding one loop and calls `quota`; timed from the spawn to the result "
            f"(median of {cfg.starts}; includes the store check `serve` runs first and the MCP "
            f"handshake). Imports: wall time of `python -c ...` in fresh interpreters (median "
            f"of {cfg.import_runs}). Import profile: `python -X importtime -c 'import "
            f"{SERVER_IMPORT}'`, cumulative µs."
        ),
    )
    with h.temp_home(NAME) as home:
        async with h.open_store(home) as store:
            await h.open_bench_loop(store, todos=10)
        starts = []
        for n in range(cfg.starts):
            h.progress(NAME, f"stdio start {n + 1} of {cfg.starts}")
            starts.append(await first_answer(home, home.parent / "serve.log"))
    section.tables.append(
        Table(
            ["stdio: spawn to first `quota` answer", "ms"],
            [
                ["median", h.ms(h.median(starts))],
                ["fastest", h.ms(min(starts))],
                ["slowest", h.ms(max(starts))],
            ],
        )
    )
    h.progress(NAME, "import wall times")
    walls = [
        ("bare interpreter (`pass`)", "pass"),
        ("`import mcp.server.mcpserver` (the SDK)", "import mcp.server.mcpserver"),
        (f"`import {SERVER_IMPORT}`", f"import {SERVER_IMPORT}"),
        (f"`import {CLI_IMPORT}` (the `serve` entry)", f"import {CLI_IMPORT}"),
    ]
    section.tables.append(
        Table(
            ["fresh interpreter", "wall ms"],
            [[label, h.ms(wall_of(code, cfg.import_runs))] for label, code in walls],
        )
    )
    h.progress(NAME, "import profile")
    entries = importtime(SERVER_IMPORT)
    total = next((c for name, _, c in entries if name == SERVER_IMPORT), 0)
    own = sorted((e for e in entries if ours(e[0])), key=lambda e: -e[2])
    section.tables.append(
        Table(
            ["loopwarden module", "self ms", "cumulative ms", "of the server import"],
            [
                [f"`{name}`", h.ms(s / 1e6), h.ms(c / 1e6), f"{c / total:.0%}"]
                for name, s, c in own[:TOP]
            ],
            title=f"`-X importtime` of `{SERVER_IMPORT}`: loopwarden's modules, top {TOP}",
        )
    )
    others = sorted((e for e in entries if "." not in e[0] and not ours(e[0])), key=lambda e: -e[2])
    section.tables.append(
        Table(
            ["package", "cumulative ms", "of the server import"],
            [[f"`{name}`", h.ms(c / 1e6), f"{c / total:.0%}"] for name, _, c in others[:TOP]],
            title="Third-party packages it pulls in (first import of each), top 10",
        )
    )
    own_self = sum(s for _, s, _ in own)
    section.targets.append(
        Target(
            "server start to first tool answer over stdio: measure it, cut import time where "
            "it is ours",
            f"{h.ms(h.median(starts))} ms; loopwarden's own module bodies are "
            f"{h.ms(own_self / 1e6)} of the {h.ms(total / 1e6)} ms server import",
            None,
            "no numeric target in the issue",
        )
    )
    section.notes.append(
        f"the server import takes {h.ms(total / 1e6)} ms cumulative under -X importtime; "
        f"loopwarden's own module bodies account for {h.ms(own_self / 1e6)} ms of it "
        f"({own_self / total:.0%}); the rest is the packages they import."
    )
    return section
