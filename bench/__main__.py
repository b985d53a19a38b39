"""`python -m bench [--quick] [--only NAME[,NAME]] [--out PATH]`: run the benchmark suite,
print a summary and write the figures to `docs/benchmarks.md`.

The whole suite fits a time budget (under 10 minutes; `--quick` under one): every family gets a
share of what is left when it starts, and every loop in it stops at its count or at its share,
whichever comes first. A family that fails is reported as failed; the others still run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from bench import (
    audit,
    backends,
    dashboard,
    fleet,
    generator,
    hooks,
    kernel,
    mcp_gateway,
    memory,
    model_gateway,
    peer,
    pools,
    scale,
    startup,
    telemetry,
    transport,
)
from bench import harness as h
from bench.report import Section, console_summary, read_previous, render

# name: (module, share of the quick budget, share of the full budget), in report order.
FAMILIES = {
    "transport": (transport, 18, 55),
    "kernel": (kernel, 6, 25),
    "audit": (audit, 5, 35),
    "scale": (scale, 8, 160),
    "memory": (memory, 8, 290),
    "startup": (startup, 8, 20),
    "dashboard": (dashboard, 10, 60),
    "backends": (backends, 10, 60),
    "hooks": (hooks, 6, 30),
    "telemetry": (telemetry, 5, 20),
    "pools": (pools, 5, 25),
    "fleet": (fleet, 6, 40),
    "generator": (generator, 5, 60),
    "mcp_gateway": (mcp_gateway, 30, 60),
    "model_gateway": (model_gateway, 6, 40),
    "peer": (peer, 10, 40),
}
BUDGET = {True: 50.0, False: 550.0}  # seconds: quick, full
MAX_STRETCH = 1.5  # a family never gets more than this times its nominal share


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    parser.add_argument(
        "--only", metavar="NAME[,NAME]", help=f"run only these families: {', '.join(FAMILIES)}"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=h.REPO / "docs" / "benchmarks.md",
        help="where to write the results (default: docs/benchmarks.md)",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",")] if args.only else list(FAMILIES)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown or not names:
        parser.error(f"unknown family {', '.join(unknown)}; choose from {', '.join(FAMILIES)}")
    args.names = [n for n in FAMILIES if n in names]
    return args


async def run_all(names: list[str], quick: bool, run: dict[str, str]) -> list[Section]:
    total = BUDGET[quick]
    column = 1 if quick else 2
    started = time.monotonic()
    sections = []
    for i, name in enumerate(names):
        module = FAMILIES[name][0]
        nominal = FAMILIES[name][column]
        left = total - (time.monotonic() - started)
        pending = sum(FAMILIES[n][column] for n in names[i:])
        budget = max(min(left * nominal / pending, nominal * MAX_STRETCH), nominal / 4)
        h.progress(name, f"start (budget {budget:.0f} s)")
        t0 = time.monotonic()
        try:
            section = await module.run(quick, budget)
        except Exception as exc:  # a failed family is reported; the others still run
            traceback.print_exc()
            section = Section(
                family=name,
                number=list(FAMILIES).index(name) + 1,
                title=name,
                how="(the family failed before it produced figures)",
                error=f"{type(exc).__name__}: {exc}"[:500],
            )
        section.seconds = time.monotonic() - t0
        section.run = dict(run)
        sections.append(section)
        h.progress(name, f"done in {section.seconds:.1f} s")
    return sections


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for key in [k for k in os.environ if k.startswith("LOOPWARDEN_")]:
        del os.environ[key]  # the suite measures the defaults, whatever the shell has set
    machine = h.machine()
    load = os.getloadavg()
    run = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": " ".join(["python -m bench", *(sys.argv[1:] if argv is None else argv)]),
        "mode": "quick" if args.quick else "full",
        "commit": machine["commit"],
        "load": ", ".join(f"{x:.2f}" for x in load),
    }
    t0 = time.monotonic()
    sections = asyncio.run(run_all(args.names, args.quick, run))
    wall = time.monotonic() - t0
    run["wall"] = f"{wall:.1f} s"
    for section in sections:
        section.run["wall"] = run["wall"]

    previous, tail = read_previous(args.out)
    fresh = {s.family: s for s in sections}
    merged = [fresh.get(n) or previous[n] for n in FAMILIES if n in fresh or n in previous]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(merged, machine, run, tail))
    print(console_summary(sections, wall))
    print(f"wrote {args.out}")
    return 1 if any(s.error for s in sections) else 0


if __name__ == "__main__":
    sys.exit(main())
