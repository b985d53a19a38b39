"""What one command line runs, as it is read: the readers (bash, PowerShell) report each
command they find to a `Reading`, which records it and hands it to its `unwrap` step (what it
runs in turn: launchers, shells, interpreters, `eval`, …) and hands nested command text to its
`read` step, to a bounded depth. Both steps are given to it by `lines.read_line`, which wires
the readers and the carriers together; this module imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable

from loopwarden.policy.commands.programs import program_name
from loopwarden.policy.commands.runs import TERMINAL, Dialect, Doubt, Run, Stdin, Tail
from loopwarden.policy.commands.words import Word

MAX_DEPTH = 8  # nested command text (`bash -c "eval '…'"`) read this deep, then a doubt
MAX_RUNS = 1_000  # runs of one line, then a doubt (bounds the work for any line)


class TooManyRuns(Exception):
    """The line runs more commands than `MAX_RUNS`: the reading stops (a doubt)."""


Unwrap = Callable[["Reading", Run, Stdin], None]
"""What a recorded run runs in turn, read into the reading (`carriers.unwrap`)."""
ReadText = Callable[["Reading", str, Dialect, str, "Run | None", int], None]
"""Nested command text read with its dialect's reader (`lines.read_text`)."""


class Reading:
    """The runs of one line, in the order the line names them, and what could not be read."""

    __slots__ = ("aliases", "assigned", "doubts", "functions", "read", "runs", "unwrap")

    def __init__(self, unwrap: Unwrap, read: ReadText) -> None:
        self.unwrap, self.read = unwrap, read
        self.runs: list[Run] = []
        self.doubts: list[Doubt] = []  # of the line as a whole
        self.functions: set[str] = set()  # defined in the line
        self.aliases: set[str] = set()  # defined in the line
        self.assigned: dict[str, str | None] = {}  # variables set in the line

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
    ) -> Run | None:
        """Record the command `argv` and what it runs in turn; None for an empty argv."""
        if not argv:
            return None
        if len(self.runs) >= MAX_RUNS:
            raise TooManyRuns
        level = depth if depth is not None else (parent.depth if parent else 0)
        run = Run(len(self.runs), argv, via, parent.index if parent else None, level, dialect, tail)
        self.runs.append(run)
        program = argv[0].text
        if program is not None:
            if dialect == "bash" and program in self.aliases:
                self.doubt(run, "its program is a name this line binds (alias, hash -p)")
            if program in self.functions:
                run.function = True
        self.unwrap(self, run, stdin)
        return run

    def doubt(self, run: Run | None, what: str, opaque: bool = False) -> None:
        """A doubt about `run` (or the line as a whole, without one)."""
        found = Doubt(what, opaque)
        if run is None:
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


def name_of(run: Run) -> str | None:
    """The program a run names, as rules name programs; None if computed."""
    program = run.program
    return program_name(program.text) if program is not None and program.text else None
