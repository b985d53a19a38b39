"""Command rules (`[tools.commands]`), read once per policy and matched against argv.

A rule is words separated by whitespace, read like a command (docs/hooks.md, "Command rules"):
its first word names a program (by basename, without case; `*` and `?` are wildcards), the rest
are read with that program's grammar (`programs.py`) into its subcommand, options and operands.
A command matches a rule when

- it runs that program;
- for a program with subcommands (git, npm, docker, …), its subcommand is the rule's, after
  the program's global options and aliases (`git -C d -c k=v push` is `git push`);
- every option the rule names is present, in any spelling the program accepts (`rm -r -f`
  matches `-fr`, `-Rf`, `--recursive --force`; a deny rule also matches an abbreviated long
  option, as getopt accepts), with the rule's value if it gives one (`curl -X POST`);
- the rule's other words are among its operands: in order for a deny rule, right after the
  subcommand for an allow rule. A command may always have more words than the rule.

A trailing ` *` (today's `"rm -rf *"`) adds nothing and is ignored; `*` or `?` inside a word
matches within that one word (`"git push*"` is `git` with a subcommand starting `push`).
Matching is three-valued: `YES`, `NO`, or `MAYBE` when a word the rule depends on is computed
(the caller denies on `MAYBE`: deny on doubt).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final, Literal, NamedTuple

from loopwarden.policy.commands.options import Grammar, scan
from loopwarden.policy.commands.programs import Command, program_name, spec_of
from loopwarden.policy.commands.runs import Tail
from loopwarden.policy.commands.words import Word
from loopwarden.policy.patterns import matches

Found = Literal["yes", "no", "maybe"]


class Match:
    """The three answers of `match` (plain constants: see `runs.py` on records)."""

    YES: Final = "yes"
    NO: Final = "no"
    MAYBE: Final = "maybe"


class Rule(NamedTuple):
    """One rule as the policy wrote it and as it is read."""

    text: str
    program: str
    subcommand: str | None
    options: tuple[tuple[str, str | None], ...]
    operands: tuple[str, ...]

    @property
    def label(self) -> str:
        """The program and subcommand it names (what a reason may say a command runs)."""
        return f"{self.program} {self.subcommand}" if self.subcommand else self.program


def _globby(text: str) -> bool:
    return "*" in text or "?" in text


@lru_cache(maxsize=4096)
def parse_rule(text: str) -> Rule:
    """The rule `text` means (see the module docstring). Never raises on a checked rule."""
    words = text.split()
    while len(words) > 1 and words[-1] == "*":
        words.pop()
    program = words[0] if _globby(words[0]) else program_name(words[0])
    spec = spec_of(program)
    argv = tuple(Word(w) for w in words)
    if spec.subcommands is None:
        found = scan(spec.main, argv, 1)
        options = tuple((o.name, o.value.text if o.value else None) for o in found.options)
        return Rule(
            text, program.lower(), None, options, tuple(w.text or "" for _, w in found.operands)
        )
    head = scan(spec.main, argv, 1, stop=True)
    sub = words[head.rest] if head.rest < len(words) else None
    if sub is not None and not _globby(sub):
        sub = spec.aliases.get(sub, sub)
    rest = scan(spec.sub or spec.main, argv, head.rest + 1)
    operands = [w.text or "" for _, w in rest.operands]
    if sub is not None and operands and (sub, operands[0]) in spec.pairs:
        sub, operands = spec.pairs[(sub, operands[0])], operands[1:]
    options = tuple(
        (o.name, o.value.text if o.value else None) for o in (*head.options, *rest.options)
    )
    for (base, flag), other in spec.by_flag.items():
        if sub == base and any(name == flag for name, _ in options):
            sub = other
    return Rule(text, program.lower(), sub, options, tuple(operands))


def glob_matches(pattern: str, text: str) -> bool:
    """`*` any run of characters, `?` one, the rest literal: the tool patterns' globs (a
    pattern without either is compared as text, the glob's own answer)."""
    if "*" in pattern or "?" in pattern:
        return matches(pattern, text)
    return pattern == text


def match(rule: Rule, command: Command, tail: Tail, deny: bool) -> tuple[Found, str]:
    """Whether `command` (with `tail` words added when it runs) is what `rule` names, and,
    for `MAYBE`, what could not be read."""
    if not glob_matches(rule.program, command.program):
        return Match.NO, ""
    # each part in order: any NO is the answer, else the first MAYBE (the parts are pure, so
    # stopping at a NO gives what judging them all would)
    doubt = None
    found, why = _subcommand(rule, command, tail)
    if found == Match.NO:
        return Match.NO, ""
    if found == Match.MAYBE:
        doubt = why
    for name, value in rule.options:
        found, why = _option(rule, command, tail, name, value, deny)
        if found == Match.NO:
            return Match.NO, ""
        if found == Match.MAYBE and doubt is None:
            doubt = why
    found, why = _operands(rule, command, tail, deny)
    if found == Match.NO:
        return Match.NO, ""
    if found == Match.MAYBE and doubt is None:
        doubt = why
    return (Match.MAYBE, doubt) if doubt is not None else (Match.YES, "")


def _subcommand(rule: Rule, command: Command, tail: Tail) -> tuple[Found, str]:
    if rule.subcommand is None:
        return Match.YES, ""
    if command.subcommand_doubt:
        return Match.MAYBE, command.subcommand_doubt
    if command.subcommand is None:
        if tail == "words":
            return Match.MAYBE, "its subcommand is filled in from input"
        return Match.NO, ""
    return (Match.YES, "") if glob_matches(rule.subcommand, command.subcommand) else (Match.NO, "")


def _option(
    rule: Rule, command: Command, tail: Tail, name: str, value: str | None, deny: bool
) -> tuple[Found, str]:
    spec = spec_of(command.program)
    grammar = spec.sub or spec.main
    present = [o for o in command.options if _same_option(grammar, name, o.name, deny)]
    for option in present:
        if value is None:
            return Match.YES, ""
        given = option.value.text if option.value is not None else None
        if given is not None and glob_matches(value, given):
            return Match.YES, ""
    if value is not None and any(o.value is not None and o.value.text is None for o in present):
        return Match.MAYBE, f"the value of its {name} option is computed"
    if not command.ended and (command.maybe_option or (tail == "words")):
        why = "filled in from input" if tail == "words" else "computed"
        return Match.MAYBE, f"a word that may be its {name} option is {why}"
    return Match.NO, ""


def _same_option(grammar: Grammar, wanted: str, given: str, deny: bool) -> bool:
    if given == wanted:
        return True
    if not deny or not given.startswith("--") or len(given) < 3:
        return False
    spellings = [wanted, *(k for k, v in grammar.aliases.items() if v == wanted)]
    return any(s.startswith(given) for s in spellings if s.startswith("--"))


def _operands(rule: Rule, command: Command, tail: Tail, deny: bool) -> tuple[Found, str]:
    wanted = rule.operands
    if not wanted:
        return Match.YES, ""
    given = command.operands
    unsure = command.shifted or bool(tail) or any(w.text is None for w in given)
    why = "an operand it depends on is computed or filled in from input"
    if deny:
        n = 0
        for word in given:
            if n < len(wanted) and word.text is not None and glob_matches(wanted[n], word.text):
                n += 1
        if n == len(wanted):
            return Match.YES, ""
        return (Match.MAYBE, why) if unsure else (Match.NO, "")
    for n, pattern in enumerate(wanted):
        if command.shifted:
            return Match.MAYBE, why
        if n >= len(given):
            return (Match.MAYBE, why) if tail else (Match.NO, "")
        if given[n].text is None:
            return Match.MAYBE, why
        if not glob_matches(pattern, given[n].text or ""):
            return Match.NO, ""
    return Match.YES, ""


def rules_of(texts: tuple[str, ...]) -> tuple[Rule, ...]:
    return tuple(parse_rule(t) for t in texts)


def legacy_note(text: str) -> str | None:
    """How today's glob pattern `text` now reads, when it differs from its text (`policy check`
    says so), else None."""
    rule = parse_rule(text)
    words = text.split()
    if words[-1] == "*" and len(words) > 1:
        return f"{text!r} reads as {' '.join(words[:-1])!r}: a rule matches a command with any further arguments"
    if any(_globby(w) for w in words[1:]) and rule.subcommand != words[-1]:
        return f"{text!r}: `*` and `?` match within one word of a command, not across words"
    return None
