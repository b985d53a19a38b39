"""Family 5 — memory: the peak resident set (VmHWM) of a server process after many governed
turns, with the resident set sampled on the way so that growth per turn shows.

The turns run in a child process (`python -m bench.memory --worker …`) that builds the real
MCP server and drives the first turns through it in-memory, then runs the rest through the
governance operations directly on the same database (the MCP layer costs time, not memory that
grows with turns, and 10⁵ turns through it would not fit the suite's time budget).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp import Client

from bench import harness as h
from bench.report import Section, Table
from loopwarden.server.app import build_server
from loopwarden.server.settings import Settings

NAME = "memory"
SPAWN_SECONDS = 2.0  # the child's interpreter start and imports, before its own deadline


@dataclass(frozen=True)
class Config:
    turns: int
    mcp_turns: int


QUICK = Config(turns=1_000, mcp_turns=200)
FULL = Config(turns=100_000, mcp_turns=1_000)


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


async def _mcp_turns(client: Client, n: int) -> None:
    for _ in range(n):
        grant = await client.call_tool("claim", {"loop_id": h.LOOP_ID})
        g = grant.structured_content or {}
        if grant.is_error or not g.get("granted"):
            raise RuntimeError(f"claim over MCP failed: {grant.content}")
        args = {
            "turn_id": g["turn_id"],
            "fence": g["fence"],
            "idempotency_key": h.idempotency_key(),
        }
        done = await client.call_tool("update", {**args, **h.REPORT})
        if done.is_error or not (done.structured_content or {}).get("accepted"):
            raise RuntimeError(f"update over MCP failed: {done.content}")


async def worker(home: Path, cfg: Config, seconds: float) -> dict[str, Any]:
    samples: list[tuple[str, int, int]] = [("after imports", 0, status_kib("VmRSS"))]
    async with h.open_store(home, synchronous="normal") as store:
        await h.open_bench_loop(store, todos=10)
    settings = Settings(home=home, principal=h.AGENT, auth=False, synchronous="normal")
    server = build_server(settings)
    deadline = h.Deadline(seconds)
    async with Client(server) as client:
        await _mcp_turns(client, cfg.mcp_turns)
    done = cfg.mcp_turns
    samples.append((f"after {done:,} turns over in-memory MCP", done, status_kib("VmRSS")))
    marks = {10**k for k in range(3, 8)} | {cfg.turns}
    t0 = time.perf_counter()
    async with h.open_store(home, synchronous="normal") as store:
        while done < cfg.turns and not deadline.expired:
            await h.governed_turn(store, h.AGENT, h.LOOP_ID)
            done += 1
            if done in marks:
                samples.append((f"after {h.power(done)} turns", done, status_kib("VmRSS")))
    if samples[-1][1] != done:
        samples.append((f"after {done:,} turns (time budget)", done, status_kib("VmRSS")))
    return {
        "turns": done,
        "planned": cfg.turns,
        "kernel_rate": (done - cfg.mcp_turns) / (time.perf_counter() - t0),
        "samples": samples,
        "hwm_kib": status_kib("VmHWM"),
    }


async def run(quick: bool, budget: float) -> Section:
    cfg = QUICK if quick else FULL
    seconds = max(budget - SPAWN_SECONDS, 1.0)
    with h.temp_home(NAME) as home:
        h.progress(NAME, f"{cfg.turns:,} turns in a child process (budget {seconds:.0f} s)")
        done = await asyncio.to_thread(
            h.run_child,
            h.python(
                *("-m", "bench.memory", "--worker", "--home", str(home)),
                *("--turns", str(cfg.turns), "--mcp-turns", str(cfg.mcp_turns)),
                *("--seconds", f"{seconds:.1f}"),
            ),
            timeout=seconds + 120,
        )
    result = json.loads(done.stdout)
    section = Section(
        family=NAME,
        number=5,
        title="Memory",
        how=(
            "a child process imports loopwarden, builds the MCP server (`build_server`) and "
            f"runs the first {cfg.mcp_turns:,} governed turns through it with "
            "`mcp.Client(server)`, then the rest through the governance operations on the same "
            "database (synchronous=normal), one agent, outcome progress. VmRSS is read from "
            "/proc/self/status along the way; the peak is VmHWM at the end."
        ),
    )
    rows = [[stage, f"{turns:,}", h.mib(kib * 1024)] for stage, turns, kib in result["samples"]]
    # VmHWM is updated lazily by the kernel; a sampled VmRSS can be a hair above it
    peak = max([result["hwm_kib"]] + [kib for _, _, kib in result["samples"]])
    rows.append(["peak (VmHWM) at the end", f"{result['turns']:,}", h.mib(peak * 1024)])
    section.tables.append(Table(["stage", "turns", "resident set"], rows))
    per_turn = _growth(result["samples"])
    if per_turn is not None:
        section.notes.append(
            f"resident-set growth from 10³ turns to the end: {per_turn * 1000 / 2**10:,.1f} KiB "
            "per 10³ turns."
        )
    if result["turns"] < result["planned"]:
        section.notes.append(
            f"the time budget ended the run at {result['turns']:,} of {result['planned']:,} "
            f"turns ({h.rate(result['kernel_rate'])} turns/s through the store)."
        )
    return section


def _growth(samples: list[list[Any]]) -> float | None:
    marked = [s for s in samples if s[1] >= 1000]
    if len(marked) < 2 or marked[-1][1] == marked[0][1]:
        return None
    (_, t0, k0), (_, t1, k1) = marked[0], marked[-1]
    return (k1 - k0) * 1024 / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.memory")
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("--home", required=True)
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--mcp-turns", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    cfg = Config(turns=args.turns, mcp_turns=min(args.mcp_turns, args.turns))
    print(json.dumps(asyncio.run(worker(Path(args.home), cfg, args.seconds))))


if __name__ == "__main__":
    main()
