"""Warnings about a valid policy that may not mean what its author meant, or cannot work.

`policy_notes` gathers them all (what `loopwarden policy check` prints): a policy nobody may
act under; command rules for a shell tool the policy does not allow (every command refused
before a rule is read); hooks enforced while the tools every host uses are denied by default
(the agent's first file read is blocked, and its honest report stops the loop); and the
case-sensitivity near misses below.

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
from loopwarden.policy.patterns import SHELL, is_tool_name, matches

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


HOST_EVERYDAY = ("fs.read", "fs.write", SHELL)
"""What every host's everyday tools are called in a policy (Read; Write and Edit; the shell:
`docs/hooks.md` has each host's table)."""


def _admits(policy: LoopPolicy, tool: str) -> bool:
    return explain(policy, tool).rule in ("allow", "approval")


def unworkable(policy: LoopPolicy) -> list[str]:
    """Settings that cannot work together as written."""
    notes = []
    if policy.tools.commands is not None and not _admits(policy, SHELL):
        notes.append(
            f"tools.commands decides {SHELL} calls by the commands they run, but [tools] does "
            f"not allow {SHELL}: every shell command is refused before a command rule is read. "
            f'Add "{SHELL}" to [tools] allow'
        )
    if policy.observe_mode == "enforce":
        denied = [tool for tool in HOST_EVERYDAY if not _admits(policy, tool)]
        if denied:
            notes.append(
                f'observe.mode = "enforce" blocks every host tool the policy does not allow, and '
                f"{', '.join(denied)} (what the hosts call reading, writing files and the shell) "
                "are not allowed: the agent's first such call is blocked and a report naming it "
                f'is refused. Add them to [tools] allow, or use mode = "record" while tuning'
            )
    return notes


def policy_notes(policy: LoopPolicy) -> list[str]:
    """Everything `policy check` warns about a valid policy, in one list."""
    notes = []
    if not policy.agents:
        notes.append("no agents are allowed: nobody can claim a turn")
    if not policy.tools.allow and not policy.tools.approval:
        notes.append("no tool is allowed: every reported tool use will be refused")
    return notes + unworkable(policy) + case_near_misses(policy) + command_rule_notes(policy)
