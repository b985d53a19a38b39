"""The fast path for plainly literal lines (`policy/commands/literals.py`, issue 46) is the
grammar's answer, only sooner: every line of every corpus, lines the differential generator
composes, and lines a property draws from the programs the tables know are read both ways —
the grammar always (`lines.read_grammar`), or the fast path wherever it applies, nested command
text included — and the readings, verdicts, reasons and `policy explain` answers must be equal,
under deny rules, an allow-list and opaque entries. The fast path refuses every character and
word outside its narrow grammar.
"""

from __future__ import annotations

import random
from typing import Any

import linegen
import pytest
from corpora import FIXTURES, load
from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden.policy.commands import bash, literals
from loopwarden.policy.commands.bystanders import BYSTANDERS
from loopwarden.policy.commands.interpreters import INTERPRETERS
from loopwarden.policy.commands.launchers import LAUNCHERS, SHELLS
from loopwarden.policy.commands.lines import read_grammar, read_line
from loopwarden.policy.commands.programs import PROGRAMS
from loopwarden.policy.commands.reading import Reading
from loopwarden.policy.commands.verdicts import (
    RuleSet,
    argv_text,
    explanation,
    judge_reading,
    reasons,
)

RULES = {
    "deny": RuleSet.of(("git push*", "rm -rf *"), (), ()),
    "argv-deny": RuleSet.of(("git push", "rm -r -f", "git -c *", "curl"), (), ()),
    "allow-list": RuleSet.of(
        ("git push", "rm -r -f"),
        (
            "git status",
            "git diff",
            "git log",
            "git add",
            "git commit",
            "ls",
            "cat",
            "grep",
            "pytest",
            "python3 -m pytest",
            "make test",
            "uv run *",
            "npm test",
            "cargo build",
        ),
        (),
    ),
    "opaque": RuleSet.of(("git push",), (), ("python3 -c", "bash", "node -e")),
}
CORPORA = sorted(p.name for p in FIXTURES.glob("*.txt"))
LINES = [e.line for name in CORPORA for e in load(name)]


def _reading(reading: Reading) -> Any:
    runs = [
        (r.index, r.argv, r.via, r.parent, r.depth, r.dialect, r.tail, r.launcher, r.function,
         r.known, r.input, r.env, tuple(r.doubts))
        for r in reading.runs
    ]  # fmt: skip
    return runs, tuple(reading.doubts), reading.values, reading.functions, reading.aliases


def _answers(reading: Reading) -> Any:
    out = []
    for name, rules in RULES.items():
        judged = judge_reading(rules, reading)
        verdicts = [
            (v.run.index, v.outcome, v.rule, v.why, v.label, argv_text(v.run),
             explanation(v, rules))
            for v in judged.verdicts
        ]  # fmt: skip
        told = [(r.code, r.message) for r in reasons(judged, rules)]
        out.append((name, verdicts, judged.line_doubts, told))
    return out


def _one_command_of_words(line: str) -> bool:
    """Whether the grammar reads `line` as one command of plain words, and nothing else."""
    root = bash._parser().parse(line.encode()).root_node
    if root.has_error or [c.type for c in root.children] != ["command"]:
        return False
    parts = root.children[0].children
    name = parts[0] if parts else None
    return (
        name is not None
        and name.type == "command_name"
        and [c.type for c in name.children] == ["word"]
        and all(c.type in ("word", "number") for c in parts[1:])
        and [c.text.decode() for c in parts] == line.split(" ")
    )


def same(line: str) -> None:
    """The line read and judged with the fast path and with the grammar alone agree (and a
    line the fast path takes is, to the grammar, one command of plain words)."""
    if literals.argv(line) is not None:
        assert _one_command_of_words(line), line
    fast, full = read_line(line), read_line(line, reader=read_grammar)
    assert _reading(fast) == _reading(full), line
    assert _answers(fast) == _answers(full), line


def test_every_corpus_line_reads_and_is_judged_the_same_either_way():
    plain = 0
    for line in LINES:
        same(line)
        plain += literals.argv(line) is not None
    assert len(LINES) > 1_000
    assert plain > 400, "the corpora hold many plainly literal lines: the test means something"


def test_generated_lines_read_and_are_judged_the_same_either_way():
    rng = random.Random(46)
    for cores in (linegen.DENIED, linegen.HARMLESS):
        for _ in range(300):
            same(linegen.compose(rng.choice, cores).text)
            argv = rng.choice(cores)
            same(" ".join(argv))


# bash's reserved words and the grammar's statement keywords, written out here on purpose: drawn
# so that a fast path taking one (where the grammar reads otherwise) fails this test
_KEYWORDS = frozenset(
    "! case coproc do done elif else esac fi for function if in select then time until while "  # noqa: SIM905
    "{ } [[ ]] declare typeset export readonly local unset unsetenv".split()
)
_NAMES = sorted(
    {n for n in (*PROGRAMS, *LAUNCHERS, *INTERPRETERS, *BYSTANDERS, *SHELLS) if " " not in n}
    | _KEYWORDS
)
_PLAIN_WORD = st.text("abcxyzABZ019_./:,@+%=-", min_size=1, max_size=8)
_WORD = st.one_of(
    _PLAIN_WORD,
    st.sampled_from(
        [
            "-c",
            "-r",
            "-f",
            "-rf",
            "-e",
            "--",
            "-m",
            "push",
            "origin",
            "main",
            "status",
            "run",
            "--force",
            "-C",
            "exec",
            "git",
            "rm",
            "bash",
            "sh",
            "python3",
            "env",
            "xargs",
            "-n1",
            "timeout",
            "5",
            "sudo",
            "-u",
            "x=y",
            "-i",
            "--help",
            "alias.p=push",
            "p",
            ".",
        ]
    ),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.one_of(*[st.sampled_from(_NAMES)] * 3, st.sampled_from(sorted(_KEYWORDS))),
    st.lists(st.one_of(st.sampled_from(_NAMES), _WORD, _WORD), max_size=6),
)
def test_a_plain_line_of_known_programs_reads_the_same_either_way(program, words):
    line = " ".join([program, *words])
    if literals.argv(line) is not None:
        same(line)


@pytest.mark.parametrize(
    "line",
    [
        *(f"ls a{c}b" for c in "'\"$`*?[]{}~#;&|()<>\\!\t\n^é\x00\x7f"),
        "ls ~/x",
        "ls a=~",
        "X=1 ls",
        "=x ls",
        "ls  a",
        " ls",
        "ls ",
        "",
        " ",
        *(f"{w} x" for w in sorted(_KEYWORDS)),
        *(f"ls {w}" for w in sorted(_KEYWORDS)),
        "ls " + "a" * 5_000,
    ],
)
def test_the_fast_path_refuses_what_is_outside_its_grammar(line):
    assert literals.argv(line) is None
    same(line)


def test_the_fast_path_takes_plain_lines():
    argv = literals.argv("git -C src push --force origin HEAD:main a=b 100% x,y @u +1")
    assert argv is not None and [w.text for w in argv][:3] == ["git", "-C", "src"]
