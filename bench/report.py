"""Benchmark results as data, and their two renderings: the console summary and
`docs/benchmarks.md`.

Each family returns a `Section`. The markdown file embeds every section's data in an HTML
comment, so a run of a subset (`--only`) rewrites the families it ran and keeps the others from
the previous file, with their own date and command. Everything from the `## Before and after`
heading to the end of the file belongs to the optimization work and is kept verbatim.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BEFORE_AFTER = "## Before and after"
BEFORE_AFTER_PLACEHOLDER = f"{BEFORE_AFTER}\n\n(filled in by the optimization work)\n"
DATA = re.compile(r"<!-- bench-data (\{.*?\}) -->", re.S)


@dataclass
class Table:
    columns: list[str]
    rows: list[list[str]]
    title: str = ""


@dataclass
class Target:
    """One of the issue's targets, judged on figures from the same run."""

    goal: str
    measured: str
    met: bool | None  # None: a figure the issue asks for without a threshold, or not judgeable
    note: str = ""

    @property
    def verdict(self) -> str:
        return {True: "met", False: "missed", None: "—"}[self.met]


@dataclass
class Section:
    family: str
    number: int
    title: str
    how: str
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    run: dict[str, str] = field(default_factory=dict)  # date, command, mode, commit

    def to_json(self) -> str:
        # "--" can only occur inside JSON strings; escaping it keeps the HTML comment intact.
        return json.dumps(asdict(self), ensure_ascii=False).replace("--", "-\\u002d")

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Section:
        data = dict(data)
        data["tables"] = [Table(**t) for t in data.get("tables", [])]
        data["targets"] = [Target(**t) for t in data.get("targets", [])]
        return Section(**data)


# --- console ---------------------------------------------------------------------------------


def text_table(table: Table) -> str:
    rows = [table.columns, *table.rows]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(table.columns))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    head = [table.title] if table.title else []
    return "\n".join(head + ["  " + line for line in lines])


def console_summary(sections: list[Section], wall: float) -> str:
    out = []
    for s in sections:
        out.append(f"\n== {s.number}. {s.title} ({s.seconds:.1f} s)")
        if s.error:
            out.append(f"  FAILED: {s.error}")
        out.extend(text_table(t) for t in s.tables)
        out.extend(f"  note: {n}" for n in s.notes)
    targets = [t for s in sections for t in s.targets]
    if targets:
        out.append("\n== targets")
        out.append(
            text_table(
                Table(
                    ["target", "measured", "verdict"],
                    [[t.goal, t.measured, t.verdict] for t in targets],
                )
            )
        )
    out.append(f"\nwall time {wall:.1f} s")
    return "\n".join(out)


# --- markdown --------------------------------------------------------------------------------


def _cell(value: str) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(table: Table) -> str:
    lines = []
    if table.title:
        lines += [f"**{table.title}**", ""]
    lines.append("| " + " | ".join(_cell(c) for c in table.columns) + " |")
    lines.append("| " + " | ".join("---" for _ in table.columns) + " |")
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def _stamp(run: dict[str, str]) -> str:
    return f"{run.get('date', '?')}, `{run.get('command', '?')}`, commit {run.get('commit', '?')}"


def md_section(section: Section, current: dict[str, str]) -> str:
    out = [f"## {section.number}. {section.title}", ""]
    if section.run and section.run.get("date") != current.get("date"):
        out += [f"*Kept from an earlier run: {_stamp(section.run)}.*", ""]
    out += [f"*How measured:* {section.how}", ""]
    if section.error:
        out += [f"**This family failed in its run:** `{section.error}`", ""]
    for table in section.tables:
        out += [md_table(table), ""]
    if section.targets:
        rows = [[t.goal, t.measured, t.verdict, t.note] for t in section.targets]
        out += [md_table(Table(["target", "measured", "verdict", "why"], rows)), ""]
    out += [f"- {note}" for note in section.notes]
    if section.notes:
        out.append("")
    out += [f"<!-- bench-data {section.to_json()} -->", ""]
    return "\n".join(out)


def read_previous(path: Path) -> tuple[dict[str, Section], str]:
    """Sections and the before/after text of an existing results file (empty if none)."""
    try:
        text = path.read_text()
    except OSError:
        return {}, BEFORE_AFTER_PLACEHOLDER
    sections = {}
    for match in DATA.finditer(text):
        try:
            section = Section.from_dict(json.loads(match.group(1)))
        except (ValueError, TypeError):
            continue
        sections[section.family] = section
    at = text.find(BEFORE_AFTER)
    tail = text[at:].rstrip() + "\n" if at >= 0 else BEFORE_AFTER_PLACEHOLDER
    return sections, tail


def render(sections: list[Section], machine: dict[str, str], run: dict[str, str], tail: str) -> str:
    targets = [(s, t) for s in sections for t in s.targets]
    out = [
        "# loopwarden benchmarks",
        "",
        "Figures from the benchmark suite in `bench/` (issue 6), written by the suite itself. "
        "`make bench` runs the whole suite (under 10 minutes), `make bench-quick` a smaller "
        "version (under a minute; `python -m bench --only NAME[,NAME]` runs some families). "
        "Every ratio compares figures measured in the same run on the same machine; targets are "
        "judged from those ratios, never from absolute thresholds in tests.",
        "",
        "## The run",
        "",
        md_table(
            Table(
                ["", ""],
                [
                    ["date", run["date"]],
                    ["command", f"`{run['command']}`"],
                    ["mode", run["mode"]],
                    ["wall time", run["wall"]],
                    ["load average at the start (1, 5, 15 min)", run.get("load", "?")],
                    ["CPU", f"{machine['cpu']}, {machine['cores']} cores"],
                    ["RAM", machine["ram"]],
                    ["OS", machine["os"]],
                    ["Python", machine["python"]],
                    ["SQLite", machine["sqlite"]],
                    ["loopwarden commit", machine["commit"]],
                ],
            )
        ),
        "",
        "## Targets",
        "",
        md_table(
            Table(
                ["target", "measured", "verdict", "family"],
                [[t.goal, t.measured, t.verdict, f"{s.number}. {s.family}"] for s, t in targets],
            )
        ),
        "",
    ]
    out += [md_section(s, run) for s in sections]
    out.append(tail)
    return "\n".join(out)
