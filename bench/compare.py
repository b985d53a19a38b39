"""`python -m bench.compare --against DIR [--only NAME[,NAME]] [--rounds N] [--quick]`: the same
benchmark families, this checkout against another one (e.g. a `git worktree` of a release),
interleaved in one session so host noise hits both alike.

Each round runs `python -m bench --only …` once in each checkout (the order alternates between
rounds), each with its own bench code on its own package, and writes its results to a temporary
file; the headline figures of every round are read back from the bench-data the suite embeds,
and printed as medians over the rounds with the before/after change. Nothing is written to
`docs/benchmarks.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench import harness as h
from bench.report import DATA, Section, Table, text_table


@dataclass(frozen=True)
class Figure:
    """One cell of a family's tables: table title, the row's first cell, the column."""

    family: str
    table: str
    row: str
    column: str
    label: str
    higher_is_better: bool


def _figures() -> list[Figure]:
    out = []
    for row in (
        "1 writer, synchronous=full (the default)",
        "1 writer, synchronous=normal",
        "8 writers, one process, one store, synchronous=full",
    ):
        out.append(Figure("kernel", "", row, "turns/s", f"kernel: {row}, turns/s", True))
    for row in ("raw PyNaCl verify, one process", "audit()"):
        out.append(Figure("audit", "", row, "receipts/s", f"audit: {row}, receipts/s", True))
    out.append(
        Figure("audit", "", "audit()", "of raw verify rate", "audit: of the raw rate (%)", True)
    )
    for row in ("allowed", "denied (git push)", "denied (rm -rf)"):
        label = f"peer: the decision, {row}, loopwarden µs"
        out.append(Figure("peer", "The decision, in process", row, "loopwarden µs", label, False))
    for sync in ("normal", "full"):
        row = f"loopwarden hook event, sealed, synchronous={sync}"
        label = f"peer: decide and seal, synchronous={sync}, p50 ms"
        out.append(
            Figure(
                "peer", "Decide and record the evidence, in process", row, "p50 ms", label, False
            )
        )
    for row in ("SQLite, one server", "PostgreSQL, 1 replica", "PostgreSQL, 2 replicas"):
        out.append(Figure("fleet", "", row, "events/s", f"fleet: {row}, hook events/s", True))
        label = f"fleet: {row}, server CPU ms per event"
        out.append(Figure("fleet", "", row, "server CPU ms per event", label, False))
    for row in (
        "command hook, in process (`loopwarden hook claude-code`)",
        "command hook, forwarded (`--server`)",
        "HTTP hook (`POST /hooks/claude-code`)",
    ):
        out.append(Figure("hooks", "", row, "p50 ms", f"hooks: {row}, p50 ms", False))
    for transport in ("stdio", "HTTP"):
        for op in ("noop", "claim", "update", "turn (claim + update)"):
            label = f"{transport}: {op}, p50 ms"
            out.append(Figure("transport", transport, op, "p50 ms", label, False))
        for op in ("claim", "update"):
            label = f"{transport}: {op} × no-op (p50)"
            out.append(Figure("transport", transport, op, "× no-op (p50)", label, False))
    return out


FIGURES = _figures()


def number(cell: str) -> float | None:
    text = cell.replace(",", "").replace("×", "").replace("%", "").strip()
    try:
        return float(text)
    except ValueError:
        return None


def read_figures(path: Path) -> dict[str, float]:
    """The `FIGURES` found in one results file (a family that failed or lacks a row is absent)."""
    sections = {}
    for match in DATA.finditer(path.read_text()):
        section = Section.from_dict(json.loads(match.group(1)))
        sections[section.family] = section
    out: dict[str, float] = {}
    for fig in FIGURES:
        section = sections.get(fig.family)
        if section is None or section.error:
            continue
        for table in section.tables:
            if table.title != fig.table or fig.column not in table.columns:
                continue
            col = table.columns.index(fig.column)
            for row in table.rows:
                value = number(row[col]) if row[0] == fig.row else None
                if value is not None:
                    out[fig.label] = value
    return out


def run_once(checkout: Path, families: str, quick: bool, out: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
    env["PYTHONPATH"] = str(checkout)  # its own package first, whatever is installed
    args = [sys.executable, "-m", "bench", "--only", families, "--out", str(out)]
    if quick:
        args.append("--quick")
    done = subprocess.run(args, cwd=checkout, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        print(done.stderr[-3000:], file=sys.stderr)
    return read_figures(out) if out.exists() else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    parser.add_argument("--against", type=Path, required=True, help="the other checkout")
    parser.add_argument("--label", default="before", help="what to call the other checkout")
    parser.add_argument("--only", default="kernel,audit,transport")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args = parser.parse_args(argv)
    here, there = h.REPO, args.against.resolve()
    samples: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    loads = []
    with tempfile.TemporaryDirectory(prefix="loopwarden-compare-") as tmp:
        for n in range(args.rounds):
            order = [("before", there), ("after", here)]
            for side, checkout in order if n % 2 == 0 else order[::-1]:
                loads.append(os.getloadavg()[0])
                h.progress("compare", f"round {n + 1}/{args.rounds}: {side} ({checkout.name})")
                figures = run_once(checkout, args.only, args.quick, Path(tmp) / f"{side}{n}.md")
                for label, value in figures.items():
                    samples[side].setdefault(label, []).append(value)
    rows = []
    for fig in FIGURES:
        before, after = samples["before"].get(fig.label), samples["after"].get(fig.label)
        if not before or not after:
            continue
        b, a = h.median(before), h.median(after)
        change = (a - b) / b if b else 0.0
        better = change > 0 if fig.higher_is_better else change < 0
        rows.append(
            [
                fig.label,
                f"{b:,.4g}",
                f"{a:,.4g}",
                f"{change:+.1%}" + ("" if abs(change) < 0.005 else " ✓" if better else " ✗"),
                " ".join(f"{x:,.4g}" for x in before),
                " ".join(f"{x:,.4g}" for x in after),
            ]
        )
    columns = ["figure (median of rounds)", args.label, "this checkout", "change"]
    print(text_table(Table([*columns, f"{args.label} rounds", "this rounds"], rows)))
    print(f"1-min load average at each run's start: {', '.join(f'{x:.2f}' for x in loads)}")
    if args.json:
        args.json.write_text(json.dumps({"samples": samples, "loads": loads}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
