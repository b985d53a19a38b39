"""A command line judged against `[tools.commands]`: one `Verdict` per command it runs, and the
reasons a shell call is refused, worded for the model and free of the line's words.

Order per command: a deny rule that matches denies; a deny rule that might match (a word it
depends on is computed) denies on doubt; so does anything about the command that could not be
read; an opaque carrier (inline interpreter code, a shell reading input) is refused unless a
`tools.commands.opaque` rule names it; then, with allow rules, the command must match one
(launchers and calls of functions defined in the line are covered by what they run).
"""

from __future__ import annotations

import shlex
from typing import Literal, NamedTuple

from loopwarden.policy.commands import unknown
from loopwarden.policy.commands.lines import read_line
from loopwarden.policy.commands.programs import Command, read
from loopwarden.policy.commands.reading import Reading, name_of, shown
from loopwarden.policy.commands.rules import Match, Rule, glob_matches, match, rules_of
from loopwarden.policy.commands.runs import Dialect, Run
from loopwarden.policy.commands.words import PART, Word
from loopwarden.policy.decision import Reason, ReasonCode

Outcome = Literal["allowed", "denied", "doubt", "opaque", "not_allowed", "covered"]


class Verdict(NamedTuple):
    """How one run of a line fares: `rule` is the rule that decided (if one did), `why` what
    could not be read (for a doubt or an opaque carrier)."""

    run: Run
    outcome: Outcome
    rule: str | None = None
    why: str = ""
    label: str = ""  # the program (and subcommand) a deny rule matched

    @property
    def refused(self) -> bool:
        return self.outcome in ("denied", "doubt", "opaque", "not_allowed")


class Judged(NamedTuple):
    """A whole line: every run's verdict, and doubts about the line as a whole."""

    verdicts: tuple[Verdict, ...]
    line_doubts: tuple[str, ...]

    @property
    def refused(self) -> bool:
        return bool(self.line_doubts) or any(v.refused for v in self.verdicts)


class RuleSet(NamedTuple):
    deny: tuple[Rule, ...]
    allow: tuple[Rule, ...]
    opaque: tuple[Rule, ...]
    allow_texts: tuple[str, ...]
    programs: tuple[str, ...] = ()  # the programs rules are about (for unknown programs)

    @staticmethod
    def of(deny: tuple[str, ...], allow: tuple[str, ...], opaque: tuple[str, ...]) -> RuleSet:
        denied, allowed = rules_of(deny), rules_of(allow)
        restricted = [r for r in allowed if r.subcommand or r.options or r.operands]
        programs = tuple(dict.fromkeys(r.program for r in (*denied, *restricted)))
        return RuleSet(denied, allowed, rules_of(opaque), allow, programs)

    def names(self, program: str) -> bool:
        """Whether a deny rule names `program` (or may: a rule's program is a glob)."""
        return any(glob_matches(rule.program, program) for rule in self.deny)


def judge(rules: RuleSet, line: str, dialect: Dialect = "bash") -> Judged:
    """Read `line` and judge every command it runs."""
    reading = read_line(line, dialect)
    return judge_reading(rules, reading)


def judge_reading(rules: RuleSet, reading: Reading) -> Judged:
    verdicts = tuple(_judge(rules, run, reading) for run in reading.runs)
    return Judged(verdicts, tuple(d.what for d in reading.doubts))


def _judge(rules: RuleSet, run: Run, reading: Reading) -> Verdict:
    program = run.program
    if program is None or program.text is None:
        kind = program.kind if program is not None else "missing"
        return Verdict(run, "doubt", why=f"cannot tell which program it runs: its name is {kind}")
    name = name_of(run) or ""
    if name.startswith("git-"):
        name = "git"  # `git-push`, run by its path, is git's push
    named = None if run.known else unknown.names(rules.programs, run, reading)
    if not run.doubts and not rules.allow and not rules.names(name) and named is None:
        return Verdict(run, "allowed")  # no rule names its program: nothing to read
    command = read(_resolved(run.argv, reading))
    maybe: tuple[Rule, str] | None = None
    for rule in rules.deny:
        found, why = match(rule, command, run.tail, deny=True)
        if found == Match.YES:
            return Verdict(run, "denied", rule.text, label=_label(command, rule))
        if found == Match.MAYBE and maybe is None:
            maybe = (rule, why)
    unread = [d for d in run.doubts if not d.opaque]
    if unread:
        return Verdict(run, "doubt", why=unread[0].what)
    if named is not None:
        return Verdict(run, "doubt", why=unknown.why(run, named), label="unknown")
    if maybe is not None:
        return Verdict(run, "doubt", maybe[0].text, why=maybe[1])
    opaque = [d for d in run.doubts if d.opaque]
    if opaque and not _accepted(rules.opaque, command, run):
        return Verdict(run, "opaque", why=opaque[0].what)
    if not rules.allow:
        return Verdict(run, "allowed")
    if run.launcher or run.function:
        return Verdict(run, "covered")
    doubt: tuple[Rule, str] | None = None
    for rule in rules.allow:
        found, why = match(rule, command, run.tail, deny=False)
        if found == Match.YES:
            return Verdict(run, "allowed", rule.text)
        if found == Match.MAYBE and doubt is None:
            doubt = (rule, why)
    if doubt is not None:
        return Verdict(run, "doubt", doubt[0].text, why=doubt[1])
    return Verdict(run, "not_allowed")


def _resolved(argv: tuple[Word, ...], reading: Reading) -> tuple[Word, ...]:
    """`argv` with each quoted word that is one variable the line sets replaced by what the
    line tells of it: its one literal value, or the literal start every value has (a value
    set before the line, or in a scope the line does not show, is the state the docs leave
    out)."""
    if all(w.text is not None or w.params is None for w in argv):
        return argv
    out = []
    for word in argv:
        if word.text is None and word.params and word.template == PART and not word.splits:
            name = word.params[0]
            if "\0" not in name and reading.assigned(name):
                values = reading.literal_values(name)
                if values is not None and len(values) == 1:
                    out.append(Word(next(iter(values))))
                    continue
                lead = reading.starts(name)
                if lead is not None:
                    out.append(Word(None, word.kind, lead))
                    continue
        out.append(word)
    return tuple(out)


def _accepted(rules: tuple[Rule, ...], command: Command, run: Run) -> bool:
    return any(match(rule, command, run.tail, deny=False)[0] == Match.YES for rule in rules)


def _label(command: Command, rule: Rule) -> str:
    if rule.subcommand is not None and command.subcommand is not None:
        return f"{command.program} {command.subcommand}"
    return command.program


def _where(run: Run) -> str:
    if not run.via or run.via == "$(…)":
        return ""
    return f", in {run.via}" if run.via.startswith("a ") else f", run by `{run.via}`"


def message(verdict: Verdict, rules: RuleSet) -> str:
    """What the model is told about one refused run: why, and what to do instead."""
    run = verdict.run
    if verdict.outcome == "denied":
        return (
            f"command {run.index + 1} runs `{verdict.label}`{_where(run)}, which "
            f"tools.commands.deny rule {verdict.rule!r} denies: do not run it, in any spelling"
        )
    who = f"command {run.index + 1} ({shown(run)}{_where(run)})"
    if verdict.outcome == "doubt" and verdict.rule is not None:
        kind = "deny" if any(r.text == verdict.rule for r in rules.deny) else "allow"
        return (
            f"cannot tell whether {who} is what tools.commands.{kind} rule {verdict.rule!r} "
            f"names: {verdict.why}; write the command out literally"
        )
    if verdict.outcome == "doubt" and verdict.label == "unknown":
        return f"{who}: {verdict.why}"
    if verdict.outcome == "doubt":
        return f"{who}: {verdict.why}; command rules apply here, so write it out literally"
    if verdict.outcome == "opaque":
        return (
            f"{who}: {verdict.why}, which loopwarden cannot read; command rules apply here, so "
            "it is refused unless the policy accepts it (tools.commands.opaque): use commands "
            "loopwarden can read"
        )
    allowed = ", ".join(repr(t) for t in rules.allow_texts[:8])
    more = ", …" if len(rules.allow_texts) > 8 else ""
    return f"{who} matches no tools.commands.allow rule (allowed: {allowed}{more})"


_CODES = {
    "denied": ReasonCode.COMMAND_DENIED,
    "doubt": ReasonCode.COMMAND_UNREADABLE,
    "opaque": ReasonCode.COMMAND_OPAQUE,
    "not_allowed": ReasonCode.COMMAND_NOT_ALLOWED,
}


def reasons(judged: Judged, rules: RuleSet) -> list[Reason]:
    """The reasons a line is refused (none if it may run), one per distinct message."""
    out: dict[str, Reason] = {}
    for what in judged.line_doubts:
        text = f"the line cannot be checked: {what}; command rules apply here, so it is refused"
        out.setdefault(text, Reason(ReasonCode.COMMAND_UNREADABLE, text))
    for verdict in judged.verdicts:
        if verdict.refused:
            text = message(verdict, rules)
            out.setdefault(text, Reason(_CODES[verdict.outcome], text))
    return list(out.values())


def argv_text(run: Run) -> str:
    """A run's words as a shell would write them, a computed word as `<its kind>` (for the
    operator's own `policy explain`, never for a reason)."""
    words = []
    for word in run.argv:
        if word.text is None:
            words.append(f"<{word.kind}>")
        else:
            words.append(shlex.quote(word.text) if word.text else "''")
    return " ".join(words)


def explanation(verdict: Verdict, rules: RuleSet) -> str:
    """One run's verdict for `policy explain`: the reason the model is told for a refusal,
    else why it may run."""
    if verdict.refused:
        return message(verdict, rules)
    if verdict.outcome == "covered":
        kind = "a function defined in the line" if verdict.run.function else "a launcher"
        return f"allowed: {kind}, covered by what it runs"
    if verdict.rule is not None:
        return f"allowed by tools.commands.allow rule {verdict.rule!r}"
    return "allowed: no deny rule names it" if not rules.allow else "allowed"
