"""Warnings about a valid policy that may not mean what its author meant.

Tool names are matched case-sensitively, so `deny = ["fs.secret"]` does not stop `fs.Secret`,
and an `allow = ["fs.*"]` admits it. `case_near_misses` finds such names: for each deny pattern
it tries the spellings that differ from it only in case (each of its segments, wildcards filled
in, as written, capitalized, upper or lower case), and every allow and approval pattern's own
spelling, and reports one the policy admits. It searches likely spellings; it does not prove
that no other exists. The evaluator itself never folds case.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from loopwarden.policy.evaluate import explain
from loopwarden.policy.model import LoopPolicy
from loopwarden.policy.patterns import is_tool_name, matches

MAX_SEGMENTS = 4


def _fillings(pattern: str) -> Iterator[str]:
    """Concrete names a pattern matches: its wildcards filled with nothing, or with `x`."""
    yield pattern.replace("*", "").replace("?", "x")
    yield pattern.replace("*", "x").replace("?", "x")


def _spellings(name: str) -> Iterator[str]:
    """`name` with each of its first `MAX_SEGMENTS` segments as written, capitalized, upper or
    lower case, in every combination (at most 4**MAX_SEGMENTS spellings)."""
    segments = name.split(".")
    head, tail = segments[:MAX_SEGMENTS], segments[MAX_SEGMENTS:]
    forms = [dict.fromkeys((s, s.capitalize(), s.upper(), s.lower())) for s in head]
    for combination in itertools.product(*forms):
        yield ".".join([*combination, *tail])


def _candidates(policy: LoopPolicy, deny: str) -> Iterator[str]:
    for filled in _fillings(deny):
        yield from _spellings(filled)
    for pattern in policy.tools.allow + policy.tools.approval:
        yield from _fillings(pattern)  # e.g. allow "fs.Secret" itself, against deny "fs.secret"


def case_near_misses(policy: LoopPolicy) -> list[str]:
    """One note per deny pattern that a differently-cased name slips past while an allow or
    approval pattern admits that name."""
    notes = []
    for deny in policy.tools.deny:
        for name in _candidates(policy, deny):
            if not is_tool_name(name) or matches(deny, name):
                continue
            if not matches(deny.lower(), name.lower()):
                continue
            verdict = explain(policy, name)
            if verdict.rule in ("allow", "approval"):
                notes.append(
                    f"deny pattern {deny!r} does not stop {name!r}, which tools.{verdict.rule} "
                    f"pattern {verdict.pattern!r} admits: tool names are matched case-sensitively"
                )
                break
    return notes


def command_rule_notes(policy: LoopPolicy) -> list[str]:
    """How today's glob command patterns now read, where that differs from their text."""
    rules = policy.tools.commands
    if rules is None:
        return []
    from loopwarden.policy.commands.rules import legacy_note

    texts = (*rules.deny, *rules.allow, *(rules.opaque or ()))
    return [f"tools.commands: {note}" for text in texts if (note := legacy_note(text))]
