"""The bash builtins with a reader of their own: those that run text (`eval`, `source`, `trap`,
`alias`, `hash -p`, `mapfile -C`, `compgen`/`complete`, `fc`, `enable -f`) and those that take
variable names or arithmetic (`test -v`, `printf -v`, `read`, `let`, `declare` and the other
declarations, `unset`: `variables.py`), as runs (`builtin declare …`, `command eval …`; the bash
reader reads the declarations it parses itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from loopwarden.policy.commands import shells, variables
from loopwarden.policy.commands.options import grammar, scan
from loopwarden.policy.commands.runs import Run, Stdin
from loopwarden.policy.commands.words import Word, joined

if TYPE_CHECKING:
    from loopwarden.policy.commands.reading import Reading


def _eval(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    run.launcher = True
    words = run.argv[1:]
    if words and words[0].text == "--":
        words = words[1:]
    if words:
        reading.line(joined(words), "bash", "eval", run)


def _source(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    words = run.argv[1:]
    if words and words[0].text == "--":
        words = words[1:]
    script = words[0] if words else None
    if script is not None and shells.reads_input(script):
        shells.from_input(reading, run, name, stdin, "bash", script)


def _trap(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    found = scan(grammar(), run.argv, 1)
    operands = [w for _, w in found.operands]
    if len(operands) >= 2 and operands[0].text not in ("-", ""):
        reading.line(operands[0], "bash", "trap", run)
    elif len(operands) == 1 and operands[0].text is None:
        reading.doubt(run, "cannot tell what `trap` sets: its words are computed")


def _alias(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    for word in run.argv[1:]:
        if word.text is None:
            reading.doubt(run, "cannot read an alias this line defines: it is computed")
            continue
        alias, eq, value = word.text.partition("=")
        if eq:
            reading.aliases.add(alias)
            reading.line(Word(value), "bash", "alias", run)


def _hash(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`hash -p PATH NAME` makes NAME run PATH: like an alias, a later NAME is a doubt."""
    found = scan(grammar(values="-p", optional=""), run.argv, 1)
    if found.has("-p"):
        for _, word in found.operands:
            if word.text is not None:
                reading.aliases.add(word.text)
            else:
                reading.doubt(run, "cannot read the name `hash -p` binds: it is computed")


def _test(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`test -v NAME` / `[ -v NAME ]`: a subscript in NAME is arithmetic."""
    words = run.argv[1:]
    for n, word in enumerate(words[:-1]):
        if word.text == "-v":
            variables.name_doubt(reading, run, words[n + 1])


def _printf(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    found = scan(grammar(values="-v"), run.argv, 1, stop=True)
    for option in found.options:
        if option.name == "-v" and option.value is not None:
            variables.name_doubt(reading, run, option.value)
            reading.assign(option.value.text or "", None)


def _read(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`read NAME…`: names (a subscript in one is arithmetic), each set to input."""
    found = scan(grammar(values="-a -d -i -n -N -p -t -u"), run.argv, 1)
    names = [w for _, w in found.operands] + [o.value for o in found.options if o.name == "-a"
                                              and o.value is not None]  # fmt: skip
    for word in names:
        variables.name_doubt(reading, run, word)
        if word.text is not None:
            reading.assign(word.text.split("[", 1)[0], None)
    if not names:
        reading.assign("REPLY", None)


def _mapfile(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`mapfile -C CALLBACK`: bash runs CALLBACK (with words added) as it reads."""
    found = scan(grammar(values="-d -n -O -s -u -C -c"), run.argv, 1)
    for option in found.options:
        if option.name == "-C":
            reading.line(option.value, "bash", f"{name} -C", run)
    for _, word in found.operands:
        if word.text is not None:
            reading.assign(word.text, None)
    if not found.operands:
        reading.assign("MAPFILE", None)


def _compgen(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`compgen -W WORDS` expands WORDS as the shell would (its `$( … )` runs); `-C CMD` runs
    CMD; `-F FUNC` calls a function (one the line defines is read)."""
    found = scan(grammar(values="-A -G -W -C -F -P -S -X -o"), run.argv, 1)
    for option in found.options:
        if option.name == "-W" and option.value is not None:
            text = option.value.text
            reading.line(Word(": " + text) if text is not None else option.value, "bash",
                         f"{name} -W", run)  # fmt: skip
        elif option.name == "-C":
            reading.line(option.value, "bash", f"{name} -C", run)
        elif (
            option.name == "-F"
            and option.value is not None
            and option.value.text not in reading.functions
        ):
            reading.doubt(run, f"`{name} -F` calls a function this line does not define")


def _fc(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`fc` runs commands from history (or an editor): only `fc -l` lists."""
    found = scan(grammar(values="-e"), run.argv, 1)
    if found.has("-l") and not found.has("-e", "-s"):
        return
    editor = found.value("-e")
    if editor is not None:
        reading.line(editor, "bash", "fc -e", run)
    reading.doubt(run, "`fc` runs commands from the shell's history, which loopwarden cannot read")


def _enable(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    if scan(grammar(values="-f"), run.argv, 1).has("-f"):
        reading.doubt(run, "`enable -f` loads a builtin from a library", True)


def _let(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    variables.let(reading, run, list(run.argv[1:]))


def _declare(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    variables.declare(reading, run, list(run.argv[1:]))


def _unset(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    functions = False
    for word in run.argv[1:]:
        if word.text is not None and word.text.startswith("-"):
            functions = functions or "f" in word.text
        elif not functions:
            variables.name_doubt(reading, run, word)


HANDLERS: dict[str, Callable[[Reading, Run, str, Stdin], None]] = {
    "eval": _eval,
    "source": _source,
    ".": _source,
    "trap": _trap,
    "alias": _alias,
    "hash": _hash,
    "test": _test,
    "[": _test,
    "printf": _printf,
    "read": _read,
    "mapfile": _mapfile,
    "readarray": _mapfile,
    "compgen": _compgen,
    "complete": _compgen,
    "fc": _fc,
    "enable": _enable,
    "let": _let,
    "declare": _declare,
    "typeset": _declare,
    "local": _declare,
    "export": _declare,
    "readonly": _declare,
    "unset": _unset,
}
"""The builtins read here, by name."""
