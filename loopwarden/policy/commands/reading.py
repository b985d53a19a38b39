"""What one command line runs, as it is read: the readers (bash, PowerShell) report each
command they find to a `Reading`, which records it and hands it to its `unwrap` step (what it
runs in turn: launchers, shells, interpreters, `eval`, …) and hands nested command text to its
`read` step, to a bounded depth. Both steps are given to it by `lines.read_line`, which wires
the readers and the carriers together; this module imports none of them.

A reading also keeps what the line does to variables: every value it gives each one (`values`),
which it declares integer (`-i`) or associative (`-A`). Some doubts depend on the whole line
(arithmetic over a variable set later in a loop, a value assigned in a subshell): those checks
are kept (`later`) and made once the line is read (`finish`).
"""

from __future__ import annotations

from collections.abc import Callable

from loopwarden.policy.commands import arithmetic
from loopwarden.policy.commands.programs import program_name
from loopwarden.policy.commands.regexes import lazy
from loopwarden.policy.commands.runs import TERMINAL, Dialect, Doubt, Run, Stdin, Tail
from loopwarden.policy.commands.words import Word

MAX_DEPTH = 8  # nested command text (`bash -c "eval '…'"`) read this deep, then a doubt
MAX_RUNS = 1_000  # runs of one line, then a doubt (bounds the work for any line)

NUMBER = "\x01number"
"""A value known to be a number though not which (`$(( … ))`, `${#x}`, `date +%s`)."""
PATH = "\x03/"
"""A value known to be an absolute path though not which (`$(mktemp)`, `$(pwd)`)."""
ALIAS = "\x02"
"""Marks a value that is another variable's (`y=$x`): ALIAS + its name."""
KEYS = "\x04"
"""Marks a value that is a subscript of an array (`for i in "${!a[@]}"`): KEYS + its name; a
number unless the array is associative."""


class TooManyRuns(Exception):
    """The line runs more commands than `MAX_RUNS`: the reading stops (a doubt)."""


Unwrap = Callable[["Reading", Run, Stdin], None]
"""What a recorded run runs in turn, read into the reading (`carriers.unwrap`)."""
ReadText = Callable[["Reading", str, Dialect, str, "Run | None", int], None]
"""Nested command text read with its dialect's reader (`lines.read_text`)."""
Check = Callable[["Reading"], "str | None"]
"""A doubt known only once the whole line is read: why, or None."""


class Reading:
    """The runs of one line, in the order the line names them, and what could not be read."""

    __slots__ = (
        "aliases", "assoc", "checks", "doubts", "functions", "integers", "read", "runs",
        "unwrap", "values",
    )  # fmt: skip

    def __init__(self, unwrap: Unwrap, read: ReadText) -> None:
        self.unwrap, self.read = unwrap, read
        self.runs: list[Run] = []
        self.doubts: list[Doubt] = []  # of the line as a whole
        self.functions: set[str] = set()  # defined in the line
        self.aliases: set[str] = set()  # defined in the line
        self.values: dict[str, set[str] | None] = {}  # every value the line gives a variable
        self.integers: set[str] = set()  # declared -i: every assignment is arithmetic
        self.assoc: set[str] = set()  # declared -A: subscripts are strings
        self.checks: list[tuple[Run | None, Check]] = []

    def add(
        self,
        argv: tuple[Word, ...],
        *,
        via: str,
        parent: Run | None,
        dialect: Dialect,
        stdin: Stdin = TERMINAL,
        tail: Tail = "",
        depth: int | None = None,
        doubts: tuple[str, ...] = (),
        env: tuple[Word, ...] = (),
    ) -> Run | None:
        """Record the command `argv` and what it runs in turn; None for an empty argv.
        `doubts` are the reader's about the command itself (they come first)."""
        if not argv:
            return None
        if len(self.runs) >= MAX_RUNS:
            raise TooManyRuns
        level = depth if depth is not None else (parent.depth if parent else 0)
        run = Run(len(self.runs), argv, via, parent.index if parent else None, level, dialect, tail)
        self.runs.append(run)
        for why in doubts:
            self.doubt(run, why)
        run.env = env
        if stdin.kind in ("heredoc", "herestring"):
            run.input = stdin.text
        program = argv[0].text
        if program is not None:
            if dialect == "bash" and program in self.aliases:
                self.doubt(run, "its program is a name this line binds (alias, hash -p)")
            if program in self.functions:
                run.function = run.known = True
        self.unwrap(self, run, stdin)
        return run

    def doubt(self, run: Run | None, what: str, opaque: bool = False) -> None:
        """A doubt about `run` (or the line as a whole, without one)."""
        found = Doubt(what, opaque)
        if run is None:
            if found not in self.doubts:
                self.doubts.append(found)
        elif found not in run.doubts:
            run.doubts.append(found)

    def line(self, text: Word | None, dialect: Dialect, via: str, parent: Run | None) -> None:
        """Read command text that `parent` runs (`bash -c TEXT`, `eval`, a trap, an alias)."""
        if text is None or text.text is None:
            what = f"the commands `{via}` runs are {text.kind if text else 'missing'}"
            self.doubt(parent, what)
            return
        depth = (parent.depth if parent else 0) + 1
        if depth > MAX_DEPTH:
            self.doubt(parent, f"commands are nested deeper than {MAX_DEPTH} levels")
            return
        self.read(self, text.text, dialect, via, parent, depth)

    # --- variables ---------------------------------------------------------------------

    def assign(self, name: str, value: str | None) -> None:
        """`name` is given `value` somewhere in the line (literal text, NUMBER, or None for a
        value not known before the line runs)."""
        if value is None:
            self.values[name] = None
            return
        known = self.values.setdefault(name, set())
        if known is not None and len(known) < 64:
            known.add(value)
        elif known is not None:
            self.values[name] = None

    def assigned(self, name: str) -> bool:
        return name in self.values

    def literal_values(self, name: str) -> set[str] | None:
        """Every literal value the line gives `name`; None if one is not known (or it is set
        to a number whose digits are not known)."""
        values = self.values.get(name)
        if values is None or NUMBER in values or PATH in values:
            return None
        if any(v.startswith(KEYS) for v in values):
            return None
        if any(v.startswith(ALIAS) for v in values):
            out: set[str] = set()
            for value in values:
                if value.startswith(ALIAS):
                    other = self.values.get(value[1:])
                    if (
                        value[1:] == name
                        or other is None
                        or any(o[:1] in "\x01\x02\x03\x04" for o in other)
                    ):
                        return None
                    out |= other
                else:
                    out.add(value)
            return out
        return values

    def starts(self, name: str) -> str | None:
        """Text every value the line gives `name` starts with, when none may start with `-`
        (a literal value, an absolute path); None if the line does not tell."""
        values = self.values.get(name)
        if not values:
            return None
        leads = set()
        for value in values:
            if value == PATH:
                leads.add("/")
            elif value[:1] in ("", "-", NUMBER[0], ALIAS, KEYS):
                return None
            else:
                leads.add(value)
        if len(leads) == 1:
            return next(iter(leads))
        return "/" if all(lead.startswith("/") for lead in leads) else None

    def numeric(self, name: str, depth: int = 0) -> bool:
        """Whether `name` holds a number (or text that is safe arithmetic) wherever the line
        reads it: every value the line gives it is one, or bash keeps it numeric."""
        if name in arithmetic.BASH_NUMBERS:
            return True
        values = self.values.get(name)
        if values is None:
            return False
        for value in values:
            if value == NUMBER or value == "" or arithmetic.is_number(value):
                continue
            if value.startswith(KEYS) and value[1:] not in self.assoc:
                continue
            if depth > 3 or arithmetic.doubt(value, lambda n: self.numeric(n, depth + 1)):
                return False
        return True

    def later(self, run: Run | None, check: Check) -> None:
        """A doubt to decide once the whole line is read (`finish`)."""
        self.checks.append((run, check))

    def finish(self) -> None:
        """Decide the checks kept for the end: integer variables, then `later` checks."""
        for name in self.integers:
            values = self.values.get(name, set())
            if values is None or any(
                v != NUMBER and not arithmetic.is_number(v) and arithmetic.doubt(v, self.numeric)
                for v in values
            ):
                self.doubt(
                    None,
                    "a variable declared integer (-i) is given text bash evaluates as arithmetic,"
                    " which may run a command: give it a number",
                )
        for run, check in self.checks:
            why = check(self)
            if why:
                self.doubt(run, why)
        self.checks.clear()


def name_of(run: Run) -> str | None:
    """The program a run names, as rules name programs; None if computed."""
    program = run.program
    return program_name(program.text) if program is not None and program.text else None


_SAFE_NAME = lazy(r"^[a-z0-9][a-z0-9._+-]{0,39}$")


def shown(run: Run) -> str:
    """How a reason names a run's program: its basename if it is a plain name, never more."""
    name = name_of(run)
    return f"`{name}`" if name is not None and _SAFE_NAME.match(name) else "a program"
