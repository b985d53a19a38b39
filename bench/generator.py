"""Family 13 — generator: the differential command-line generator of issue 42 run long. Lines
that run a denied command (`git push`, `rm -r -f`) and lines around harmless commands are
composed in the layers bash reads (tests/linegen.py), run in a real bash with stub programs in a
scratch repository with a bare remote (tests/bashtruth.py), and judged by the command rules:
an escape is a line bash really ran a denied command for (confirmed by a run of its own) that
the rules let run; a false refusal a line around a harmless command, in layers loopwarden reads,
that the rules refuse. Each found is printed in full, to go into
tests/fixtures/commands/generated.txt once fixed."""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass

from bench import harness as h
from bench.report import Section, Table, Target

NAME = "generator"


@dataclass(frozen=True)
class Config:
    batch: int


QUICK = Config(batch=40)
FULL = Config(batch=100)


async def run(quick: bool, budget: float) -> Section:
    sys.path.insert(0, str(h.REPO / "tests"))
    import linegen
    from bashtruth import Sandbox

    from loopwarden.policy.evaluate import command_reasons
    from loopwarden.policy.model import CommandRules

    cfg = QUICK if quick else FULL
    deny = CommandRules(deny=("git push", "rm -r -f"))
    seed = int(time.time())
    rng = random.Random(seed)
    deadline = h.Deadline(budget * 0.9)
    counts = {"evasion": 0, "ran": 0, "benign": 0, "read": 0}
    escapes: list[str] = []
    refused: list[str] = []
    spent = {"evasion": 0.0, "benign": 0.0}
    box = Sandbox()
    try:
        while not deadline.expired:
            for kind, cores in (("evasion", linegen.DENIED), ("benign", linegen.HARMLESS)):
                pieces = [linegen.compose(rng.choice, cores) for _ in range(cfg.batch)]
                lines = [p.text for p in pieces]
                t0 = time.perf_counter()
                ran = box.run(lines, bound=6, settle=True)
                for piece, done in zip(pieces, ran, strict=True):
                    reasons = command_reasons(deny, piece.text)
                    if kind == "evasion":
                        counts["ran"] += bool(done)
                        if done and not reasons and box.run([piece.text], bound=8)[0]:
                            escapes.append(piece.text)
                    elif piece.reading == "read":
                        counts["read"] += 1
                        if reasons:
                            refused.append(piece.text)
                spent[kind] += time.perf_counter() - t0
                counts[kind] += len(lines)
            tried = counts["evasion"] + counts["benign"]
            h.progress(NAME, f"{tried} lines, {len(escapes)} escapes, {len(refused)} refused")
    finally:
        box.close()
    total = counts["evasion"] + counts["benign"]
    seconds = spent["evasion"] + spent["benign"]
    section = Section(
        family=NAME,
        number=13,
        title="Command-line generator against real bash",
        how=(
            "lines composed from the denied commands and from harmless ones, each wrapped in up "
            "to three layers of tests/linegen.py (seeded random choices), run in batches of "
            f"{cfg.batch} by one bash driver (each line its own `bash -c` with a time bound, the "
            "repository and its remote restored after each), then judged under deny = "
            '["git push", "rm -r -f"]; lines per second count the bash run and the judging.'
        ),
    )
    section.tables.append(
        Table(
            ["lines", "n", "per second", "found"],
            [
                [
                    "around a denied command",
                    str(counts["evasion"]),
                    f"{counts['evasion'] / max(spent['evasion'], 1e-9):.0f}",
                    f"{counts['ran']} really ran it in bash; {len(escapes)} escapes",
                ],
                [
                    "around a harmless command",
                    str(counts["benign"]),
                    f"{counts['benign'] / max(spent['benign'], 1e-9):.0f}",
                    f"{counts['read']} in layers loopwarden reads; {len(refused)} refused",
                ],
                ["all", str(total), f"{total / max(seconds, 1e-9):.0f}", ""],
            ],
        )
    )
    section.targets.append(
        Target(
            "no line that really runs a denied command in bash is admitted",
            f"{len(escapes)} escapes in {counts['ran']} lines that ran one",
            not escapes,
            "",
        )
    )
    section.targets.append(
        Target(
            "every harmless line in layers loopwarden reads is admitted",
            f"{len(refused)} refused of {counts['read']}",
            not refused,
            "",
        )
    )
    section.notes.append(f"seed {seed} (random.Random; rerun the same lines with it)")
    section.notes.extend(f"escape: {line!r}" for line in escapes[:20])
    section.notes.extend(f"false refusal: {line!r}" for line in refused[:20])
    return section
