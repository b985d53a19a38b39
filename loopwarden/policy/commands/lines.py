"""A command line read whole: `read_line` gives a `Reading` its two steps — the readers of
each dialect (`bash.py`, `powershell.py`, their grammars imported on first use) for nested
command text, and `carriers.unwrap` for what each command runs in turn — reads the line, then
decides the doubts that depend on all of it (`Reading.finish`).
The modules it ties together import only `reading.py` below them, never each other's reader.
"""

from __future__ import annotations

from loopwarden.policy.commands import carriers, literals
from loopwarden.policy.commands.reading import MAX_RUNS, Reading, ReadText, TooManyRuns
from loopwarden.policy.commands.runs import Dialect, Doubt, Run


def read_text(
    reading: Reading, text: str, dialect: Dialect, via: str, parent: Run | None, depth: int
) -> None:
    """Read `text` with the dialect's reader: a plainly literal bash line (`literals.py`) as
    its words, the rest with the grammar (imported on first use)."""
    if dialect == "bash":
        argv = literals.argv(text)
        if argv is not None:
            reading.add(argv, via=via, parent=parent, dialect="bash", depth=depth)
            return
    read_grammar(reading, text, dialect, via, parent, depth)


def read_grammar(
    reading: Reading, text: str, dialect: Dialect, via: str, parent: Run | None, depth: int
) -> None:
    """Read `text` with the dialect's grammar, always (the fast path's reference)."""
    if dialect == "powershell":
        from loopwarden.policy.commands import powershell

        powershell.read(reading, text, via, parent, depth)
    else:
        from loopwarden.policy.commands import bash

        bash.read(reading, text, via, parent, depth)


def read_line(text: str, dialect: Dialect = "bash", reader: ReadText = read_text) -> Reading:
    """Every command `text` runs. Never raises on content: what cannot be read is a doubt.
    `reader` reads it and the command text nested in it (`read_grammar`: never the fast
    path, for the tests that hold the two equal)."""
    reading = Reading(carriers.unwrap, reader)
    try:
        reader(reading, text, dialect, "", None, 0)
        reading.finish()
    except TooManyRuns:
        reading.doubts.append(Doubt(f"the line runs more than {MAX_RUNS} commands"))
    except RecursionError:
        reading.doubts.append(Doubt("the line is nested too deeply to read"))
    return reading
