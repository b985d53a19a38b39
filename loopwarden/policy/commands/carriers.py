"""What a command runs in turn: launchers (`launchers.py`), shells and their `-c` text,
interpreters given inline code, `eval`, `source`, `trap`, `alias`, `find -exec`, git's
command-carrying settings and options, and environment variables whose value is a command.

`unwrap` is called for every run a reader records. Nested command text is read again
(`Reading.line`); a nested argv becomes a run of its own; what cannot be followed is a doubt on
the run that carries it. Doubt messages name programs and constructs, never the line's words.
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

from loopwarden.policy.commands import configs, shells
from loopwarden.policy.commands import launchers as table
from loopwarden.policy.commands.launchers import Launcher
from loopwarden.policy.commands.options import Scan, grammar, scan
from loopwarden.policy.commands.programs import program_name, spec_of
from loopwarden.policy.commands.runs import TERMINAL, Run, Stdin, Tail
from loopwarden.policy.commands.words import Word, filled, joined

if TYPE_CHECKING:
    from loopwarden.policy.commands.reading import Reading

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def unwrap(reading: Reading, run: Run, stdin: Stdin) -> None:
    """Record what `run` runs in turn (see the module docstring)."""
    name = _name(run)
    if name is None:
        return
    if run.dialect == "powershell":
        from loopwarden.policy.commands.powershell import unwrap as powershell_unwrap

        if powershell_unwrap(reading, run, name, stdin):
            return
    handler = _HANDLERS.get(name)
    if handler is not None:
        handler(reading, run, name, stdin)
        return
    if name in table.SHELLS:
        shells.shell(reading, run, name, stdin)
    elif name in table.POWERSHELLS:
        shells.powershell(reading, run, name, stdin)
    elif name in table.FOREIGN_SHELLS:
        reading.doubt(run, f"`{name}` runs a shell language", True)
    elif (found := table.interpreter(name)) is not None:
        shells.interpreter(reading, run, name, found, stdin)
    elif name in table.LAUNCHERS:
        _launch(reading, run, name, table.LAUNCHERS[name], 1, stdin)
    else:
        _subcommand_launcher(reading, run, name, stdin)


def _name(run: Run) -> str | None:
    program = run.program
    return program_name(program.text) if program is not None and program.text else None


_SUBCOMMAND_LAUNCHERS = frozenset(name.split()[0] for name in table.LAUNCHERS if " " in name)


def _subcommand_launcher(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`uv run CMD`, `npm exec CMD`, …: a program whose subcommand launches a command."""
    if name not in _SUBCOMMAND_LAUNCHERS:
        return
    head = scan(spec_of(name).main, run.argv, 1, stop=True)
    if head.rest >= len(run.argv):
        return
    word = run.argv[head.rest].text
    launcher = table.LAUNCHERS.get(f"{name} {word}") if word else None
    if launcher is not None:
        _launch(reading, run, f"{name} {word}", launcher, head.rest + 1, stdin)


def _launch(
    reading: Reading, run: Run, name: str, spec: Launcher, start: int, stdin: Stdin
) -> None:
    """A launcher: its options, `before` operands, then the command it runs."""
    argv = run.argv
    found = scan(spec.grammar, argv, start, stop=not spec.grammar.permute)
    run.launcher = spec.transparent
    if found.has(*spec.no_run):
        return
    if found.maybe_option or found.shifted:
        reading.doubt(run, f"cannot tell which command `{name}` runs: a computed word comes first")
        return
    for option in found.options:
        if option.name in spec.shell:
            reading.line(option.value, run.dialect, f"{name} {option.name}", run)
            return
        if option.name in spec.split:
            split = _split_string(reading, run, name, option.value, argv, found.rest)
            if split is None:
                return
            argv = split
            found = scan(spec.grammar, argv, found.rest, stop=not spec.grammar.permute)
    i = found.rest + spec.before
    if spec.before and i > len(argv):
        return
    if spec.before and any(w.splits for w in argv[found.rest : i]):
        reading.doubt(run, f"cannot tell which command `{name}` runs: a computed word comes first")
        return
    if i < len(argv) and argv[i].text in ("-c", "--command") and spec.shell:
        reading.line(argv[i + 1] if i + 1 < len(argv) else None, run.dialect, f"{name} -c", run)
        return
    i = _assignments(reading, run, argv, i) if spec.assignments else i
    if spec.after_dashdash:
        i = next((n + 1 for n in range(i, len(argv)) if argv[n].text == "--"), i)
    inner = argv[i:]
    if not inner:
        if spec.bare == "shell" or found.has(*spec.shell_flags):
            reading.doubt(run, f"`{name}` runs a shell that reads its commands from input", True)
        return
    if (spec.joined and not found.has(*spec.exec_options)) or found.has(*spec.join_options):
        reading.line(joined(inner), run.dialect, name, run)
        return
    _inner(reading, run, name, spec, found, inner, stdin)


def _inner(
    reading: Reading,
    run: Run,
    name: str,
    spec: Launcher,
    found: Scan,
    inner: tuple[Word, ...],
    stdin: Stdin,
) -> None:
    """The launched argv as a run of its own (xargs' placeholder and input words applied)."""
    tail = spec.tail
    placeholder = next((o for o in found.options if o.name in spec.replace), None)
    if placeholder is not None:
        mark = placeholder.value.text if placeholder.value is not None else "{}"
        mark = mark or "{}"
        inner = tuple(filled(word, mark) for word in inner)
        tail = ""
    reading.add(inner, via=name, parent=run, dialect=run.dialect, stdin=stdin, tail=tail)


def _split_string(
    reading: Reading, run: Run, name: str, value: Word | None, argv: tuple[Word, ...], at: int
) -> tuple[Word, ...] | None:
    """`env -S STRING`: STRING split into arguments, in place of the option."""
    if value is None or value.text is None or "$" in value.text or "\\" in value.text:
        reading.doubt(run, f"cannot read the string `{name} -S` splits")
        return None
    try:
        parts = shlex.split(value.text)
    except ValueError:
        reading.doubt(run, f"cannot read the string `{name} -S` splits")
        return None
    return (*argv[:at], *[Word(p) for p in parts], *argv[at:])


def _assignments(reading: Reading, run: Run, argv: tuple[Word, ...], i: int) -> int:
    """Skip `NAME=VALUE` words (env), reading command-carrying values; the index after."""
    while i < len(argv):
        text = argv[i].text
        if text == "-":
            i += 1
            continue
        if argv[i].text is None:
            if argv[i].lead and _ASSIGNMENT.match(argv[i].lead):
                i += 1
                continue
            break
        if not _ASSIGNMENT.match(text or ""):
            break
        variable, _, value = (text or "").partition("=")
        configs.assigned(reading, run, variable, Word(value))
        i += 1
    return i


def _eval(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    run.launcher = True
    if len(run.argv) > 1:
        reading.line(joined(run.argv[1:]), "bash", "eval", run)


def _source(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    script = run.argv[1] if len(run.argv) > 1 else None
    if script is not None and shells.reads_input(script):
        shells.from_input(reading, run, name, stdin if script.text else Stdin("process"), "bash")


def _trap(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    found = scan(grammar(), run.argv, 1)
    operands = [w for _, w in found.operands]
    if len(operands) >= 2 and operands[0].text not in ("-", ""):
        reading.line(operands[0], "bash", "trap", run)


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


def _find(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`find … -exec CMD … ;` / `+`, `-execdir`, `-ok`, `-okdir`: each a run of its own."""
    found = scan(spec_of("find").main, run.argv, 1)
    if found.shifted:
        reading.doubt(run, "cannot tell whether `find` runs a command: a computed word")
    argv, i = run.argv, 1
    while i < len(argv):
        if argv[i].text not in ("-exec", "-execdir", "-ok", "-okdir"):
            i += 1
            continue
        end = next((n for n in range(i + 1, len(argv)) if argv[n].text in (";", "+")), len(argv))
        inner = tuple(filled(word, "{}", path=True) for word in argv[i + 1 : end])
        tail: Tail = "operands" if end < len(argv) and argv[end].text == "+" else ""
        reading.add(inner, via=f"find {argv[i].text}", parent=run, dialect=run.dialect, tail=tail)
        i = end + 1


def _parallel(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """GNU parallel: the command (joined, run by a shell) with arguments after `:::`, or
    from input; without a command, each argument is a command line."""
    g = grammar(
        values="-j --jobs -S --sshlogin -a --arg-file -d --delimiter -E -I -N -n --max-args "
        "--timeout --delay --joblog --results --tmpdir -C --colsep --env --sshloginfile",
        permute=False,
    )
    found = scan(g, run.argv, 1, stop=True)
    run.launcher = True
    if found.maybe_option or found.shifted:
        reading.doubt(run, "cannot tell which command `parallel` runs: a computed word comes first")
        return
    words = run.argv[found.rest :]
    texts = [w.text for w in words]
    cut = next((n for n, t in enumerate(texts) if t in (":::", "::::", ":::+", "::::+")), None)
    command, sources = (words, ()) if cut is None else (words[:cut], words[cut + 1 :])
    if not command:
        if cut is None or texts[cut] != ":::":
            reading.doubt(run, "`parallel` runs command lines it reads from input", True)
        for source in sources:
            if source.text not in (":::", "::::", ":::+", "::::+"):
                reading.line(source, "bash", "parallel", run)
        return
    line = joined(command)
    if cut is None or texts[cut] != ":::" or len(sources) == 0:
        if line.text is not None:
            line = Word(line.text + " {}")
        reading.line(filled(line, "{}") if line.text else line, "bash", "parallel", run)
        return
    for source in sources:
        if source.text in (":::", "::::", ":::+", "::::+"):
            break
        value = source.text if source.text is not None else None
        if line.text is None or value is None:
            reading.line(line if line.text is None else source, "bash", "parallel", run)
            continue
        text = line.text.replace("{}", value) if "{}" in line.text else f"{line.text} {value}"
        reading.line(Word(text), "bash", "parallel", run)


def _runuser(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`runuser -u USER [--] CMD …` runs an argv; without `-u` it is `su`."""
    su_style = not scan(table.LAUNCHERS["su"].grammar, run.argv, 1).has("-u", "--user")
    spec = table.LAUNCHERS["su" if su_style else "runuser"]
    _launch(reading, run, name, spec, 1, stdin)


_HANDLERS = {
    "runuser": _runuser,
    "eval": _eval,
    "source": _source,
    ".": _source,
    "trap": _trap,
    "alias": _alias,
    "hash": _hash,
    "find": _find,
    "git": configs.git,
    "parallel": _parallel,
    "awk": shells.awk,
    "gawk": shells.awk,
    "mawk": shells.awk,
    "nawk": shells.awk,
    "busybox": lambda reading, run, name, stdin: _launch(
        reading, run, name, table.LAUNCHERS["busybox"], 1, stdin
    ),
    "sed": shells.sed,
    "gsed": shells.sed,
}
"""Programs with a reader of their own (the rest: shells, interpreters, `LAUNCHERS`)."""

__all__ = ["TERMINAL", "unwrap"]
