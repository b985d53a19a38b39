"""What a command line runs: one `Run` per command that runs or may run, nested runs pointing
at the run they run inside, and the `Doubt`s of what could not be read.

The records of this package are named tuples and slotted classes, not dataclasses: the package
is imported inside a hook process when it must decide a line, where a dataclass's generated
code (about half a millisecond each to build) is a cost every tool call pays."""

from __future__ import annotations

from typing import Literal, NamedTuple

from loopwarden.policy.commands.words import Word

Dialect = Literal["bash", "powershell"]
Tail = Literal["", "operands", "words"]


class Doubt(NamedTuple):
    """Something a decision would depend on that is not known before the line runs.

    `opaque` doubts are carriers of code loopwarden does not read (inline interpreter code, a
    shell reading its commands from input): the policy may accept them by name
    (`tools.commands.opaque`). Every other doubt is a deny whenever command rules apply.
    `what` is worded for the model and never quotes the line."""

    what: str
    opaque: bool = False


class Run:
    """One command that runs (or may run: a function body, a trap, a `find -exec`).

    `argv[0]` is the program. `via` says how it comes to run ("" for a command of the line
    itself, "$(…)", "xargs", "bash -c", …) and `parent` is the index of the run it runs in.
    `tail` says more words are added when it runs: "operands" (paths, never options, as from
    `find -exec … {} +`) or "words" (anything, as from `xargs`). A `launcher` only changes how
    its nested command runs (`timeout`, `env`, `bash -c`): allow rules need not name it. A run
    that is not `known` runs a program none of the tables names: whether it runs its arguments
    is not known (`verdicts.py` then doubts it if they name a program a rule is about)."""

    __slots__ = (
        "argv",
        "depth",
        "dialect",
        "doubts",
        "env",
        "function",
        "index",
        "input",
        "known",
        "launcher",
        "parent",
        "tail",
        "via",
    )  # fmt: skip

    def __init__(
        self,
        index: int,
        argv: tuple[Word, ...],
        via: str = "",
        parent: int | None = None,
        depth: int = 0,
        dialect: Dialect = "bash",
        tail: Tail = "",
    ) -> None:
        self.index, self.argv, self.via, self.parent = index, argv, via, parent
        self.depth, self.dialect, self.tail = depth, dialect, tail
        self.launcher = False
        self.function = False  # a call of a function defined in the line (its body is read)
        self.known = False  # its program is one the tables know to run, or not run, commands
        self.input: Word | None = None  # a here-document or here-string it reads
        self.env: tuple[Word, ...] = ()  # the values of `NAME=VALUE` words given it
        self.doubts: list[Doubt] = []

    @property
    def program(self) -> Word | None:
        return self.argv[0] if self.argv else None


class Stdin(NamedTuple):
    """Where a command's standard input comes from: "terminal" (nothing said), "pipe",
    "heredoc" or "herestring" (with its text, if literal), "file" or "process"."""

    kind: str = "terminal"
    text: Word | None = None


TERMINAL = Stdin()
