"""What a command runs in turn, by the class of its program (docs/hooks.md, "Command rules"):

- (a) launchers (`launchers.py`, applied here), shells and interpreters (`shells.py`,
  `interpreters.py`), the builtins that run text (`bashbuiltins.py`: `eval`, `source`, `trap`,
  `alias`, `mapfile -C`, `compgen -W`/`-C`, `fc`), `find -exec`, `fd -x`, `parallel`, `at`, git's
  command-carrying settings and options (`configs.py`): what they run is read, or doubted;
- (b) programs known not to run the line's commands (`bystanders.py`), with the options and
  small languages that would make them run one (`readers.py`, `scripts.py`), and the builtins
  that take variable names or arithmetic (`bashbuiltins.py`, `variables.py`);
- (c) any other program: `run.known` stays False, and `verdicts.py` doubts it when its words
  name a program a rule is about.

`unwrap` is called for every run a reader records. Nested command text is read again
(`Reading.line`); a nested argv becomes a run of its own; what cannot be followed is a doubt on
the run that carries it. Doubt messages name programs and constructs, never the line's words.
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

from loopwarden.policy.commands import (
    bashbuiltins,
    bystanders,
    configs,
    interpreters,
    readers,
    shells,
    variables,
)
from loopwarden.policy.commands import launchers as table
from loopwarden.policy.commands.launchers import Launcher
from loopwarden.policy.commands.options import Scan, grammar, scan
from loopwarden.policy.commands.programs import GIT, program_name, spec_of
from loopwarden.policy.commands.regexes import lazy
from loopwarden.policy.commands.runs import TERMINAL, Run, Stdin, Tail
from loopwarden.policy.commands.words import Word, filled, joined

if TYPE_CHECKING:
    from collections.abc import Callable

    from loopwarden.policy.commands.reading import Reading

_ASSIGNMENT = lazy(r"^[A-Za-z_][A-Za-z0-9_]*=")


def unwrap(reading: Reading, run: Run, stdin: Stdin) -> None:
    """Record what `run` runs in turn (see the module docstring)."""
    name = _name(run)
    if name is None:
        return
    if name in _PLAIN:  # most programs of a line: nothing to read in their words
        run.known = True
        return
    if run.dialect == "powershell":
        from loopwarden.policy.commands.powershell import unwrap as powershell_unwrap

        if powershell_unwrap(reading, run, name, stdin):
            run.known = True
            return
        if re.fullmatch(r"[a-z]+-[a-z]+", name):
            run.known = True  # a cmdlet (the PowerShell reader doubts the ones that run code)
            return
    if name in table.RESERVED and run.dialect == "bash":
        run.known = True
        reading.doubt(
            run,
            f"the shell keyword `{name}` stands where a command is read: bash reads this line "
            "otherwise than loopwarden can (write it without `time`, `!` or `coproc` before a "
            "compound command)",
        )
        return
    if name.startswith("git-") and name[4:] in (GIT.subcommands or ()):
        name = "git"  # `git-push` run by its path in git's exec path is `git push`
    if name in _WRITERS:
        _WRITERS[name](reading, run)
    handler = _HANDLERS.get(name)
    if handler is not None:
        run.known = True
        handler(reading, run, name, stdin)
    elif name in table.SHELLS:
        shells.shell(reading, run, name, stdin)
    elif name in table.POWERSHELLS:
        shells.powershell(reading, run, name, stdin)
    elif name in table.FOREIGN_SHELLS:
        shells.foreign(reading, run, name, stdin)
    elif (found := interpreters.interpreter(name)) is not None:
        shells.interpreter(reading, run, name, found, stdin)
    elif name in table.LAUNCHERS:
        run.known = True
        _launch(reading, run, name, table.LAUNCHERS[name], 1, stdin)
    elif name in bystanders.SUBCOMMAND_BASES and _subcommand_launcher(reading, run, name, stdin):
        run.known = True
    elif name in bystanders.BYSTANDERS:
        run.known = True
        readers.read(reading, run, name, bystanders.BYSTANDERS[name], stdin)


def _name(run: Run) -> str | None:
    program = run.program
    return program_name(program.text) if program is not None and program.text else None


def _subcommand_launcher(reading: Reading, run: Run, name: str, stdin: Stdin) -> bool:
    """`uv run CMD`, `npm exec CMD`, …: a program whose subcommand launches a command. True if
    the program was read (whatever its subcommand)."""
    head = scan(spec_of(name).main, run.argv, 1, stop=True)
    if head.rest >= len(run.argv):
        return name in bystanders.BYSTANDERS
    word = run.argv[head.rest].text
    if word is not None:
        word = spec_of(name).aliases.get(word, word)  # `npm x` is `npm exec`
    launcher = table.LAUNCHERS.get(f"{name} {word}") if word else None
    if launcher is not None:
        _launch(reading, run, f"{name} {word}", launcher, head.rest + 1, stdin)
        return True
    if word is None and any(key.startswith(name + " ") for key in table.LAUNCHERS):
        reading.doubt(run, f"cannot tell which subcommand of `{name}` runs: it is computed")
        return True
    return name in bystanders.BYSTANDERS


def _launch(
    reading: Reading, run: Run, name: str, spec: Launcher, start: int, stdin: Stdin
) -> None:
    """A launcher: its `lead` operands, its options, `before` operands, then its command."""
    argv = run.argv
    if spec.lead:
        if any(w.text is None for w in argv[start : start + spec.lead]):
            reading.doubt(
                run, f"cannot tell which command `{name}` runs: a computed word comes first"
            )
            return
        start += spec.lead
    found = scan(spec.grammar, argv, start, stop=not spec.grammar.permute)
    run.launcher = spec.transparent
    if found.has(*spec.no_run):
        return
    if found.unknown:
        reading.doubt(
            run,
            f"`{name}` is given an option loopwarden does not know: cannot tell where its "
            "command starts",
        )
        return
    if found.maybe_option or found.shifted:
        reading.doubt(run, f"cannot tell which command `{name}` runs: a computed word comes first")
        return
    options = _launcher_options(reading, run, name, spec, argv, found)
    if options is None:
        return
    argv, found = options
    if not spec.operands:
        if spec.bare == "shell" and not any(o.name in spec.shell for o in found.options):
            shells.from_input(reading, run, name, stdin, "bash")
        return
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
            shells.from_input(reading, run, name, stdin, "bash")
        return
    if (spec.joined and not found.has(*spec.exec_options)) or found.has(*spec.join_options):
        reading.line(joined(inner), run.dialect, name, run)
        return
    _inner(reading, run, name, spec, found, inner, stdin)


def _launcher_options(
    reading: Reading, run: Run, name: str, spec: Launcher, argv: tuple[Word, ...], found: Scan
) -> tuple[tuple[Word, ...], Scan] | None:
    """Read a launcher's options that carry code (a shell line, a program, a string it splits
    into words): the argv and scan its command is found in after them, or None when an option
    ran the command (or what it splits cannot be told)."""
    for option in found.options:
        if option.name in spec.shell:
            reading.line(option.value, run.dialect, f"{name} {option.name}", run)
            return None
        if option.name in spec.programs:
            readers.program(reading, run, name, option.name, option.value)
        if option.name in spec.split:
            split = _split_string(reading, run, name, option.value, argv, found.rest)
            if split is None:
                return None
            argv = split
            found = scan(spec.grammar, argv, found.rest, stop=not spec.grammar.permute)
    return argv, found


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
                variable = argv[i].lead.partition("=")[0]
                reading.assign(variable, None)
                variables.assigned(reading, run, variable, Word(None, argv[i].kind))
                i += 1
                continue
            break
        if not _ASSIGNMENT.match(text or ""):
            break
        variable, _, value = (text or "").partition("=")
        reading.assign(variable, value)
        variables.assigned(reading, run, variable, Word(value))
        i += 1
    return i


def _find(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`find … -exec CMD … ;` / `+`, `-execdir`, `-ok`, `-okdir`: each a run of its own."""
    found = scan(spec_of("find").main, run.argv, 1)
    if found.shifted:
        reading.doubt(run, "cannot tell whether `find` runs a command: a computed word")
    argv, i = run.argv, 1
    while i < len(argv):
        if argv[i].text not in ("-exec", "-execdir", "-ok", "-okdir"):
            if argv[i].text in ("-fprint", "-fprintf", "-fls", "-fprint0") and i + 1 < len(argv):
                i += 1
            i += 1
            continue
        end = next((n for n in range(i + 1, len(argv)) if argv[n].text in (";", "+")), len(argv))
        inner = tuple(filled(word, "{}", path=True) for word in argv[i + 1 : end])
        tail: Tail = "operands" if end < len(argv) and argv[end].text == "+" else ""
        via = f"find {argv[i].text}"
        reading.add(inner, via=via, parent=run, dialect=run.dialect, stdin=stdin, tail=tail)
        i = end + 1


_FD = grammar(
    values="-e --extension -t --type -d --max-depth --min-depth --exact-depth -E --exclude "
    "-S --size --changed-within --changed-before -o --owner --base-directory --path-separator "
    "-j --threads --max-results -c --color --ignore-file --search-path --format --and",
    optional="",
)


def _fd(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`fd … -x CMD …` / `-X CMD …` (`--exec`, `--exec-batch`): a run of its own, with the
    found paths added."""
    argv = run.argv
    for n, word in enumerate(argv[1:], 1):
        glued = word.text is not None and word.text.startswith(("--exec=", "--exec-batch="))
        if word.text in ("-x", "--exec", "-X", "--exec-batch") or glued:
            end = next((m for m in range(n + 1, len(argv)) if argv[m].text == ";"), len(argv))
            first = (Word(word.text.partition("=")[2]),) if glued and word.text else ()
            inner = tuple(filled(w, "{}", path=True) for w in (*first, *argv[n + 1 : end]))
            reading.add(inner, via=f"fd {word.text}", parent=run, dialect=run.dialect,
                        tail="operands")  # fmt: skip
            return
        if word.text is None and word.may_be_flag:
            reading.doubt(run, "cannot tell whether `fd` runs a command: a computed word")
            return


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


def _later(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`at`, `batch`, `crontab -`: commands read from input, run later (a here-document or
    here-string is read; a file or a pipe is opaque)."""
    words = [w.text for w in run.argv[1:]]
    if name == "crontab" and not (set(words) & {"-", None}) and words:
        return  # `crontab -l`, `crontab -e`, `crontab FILE` (a file: its lines run later)
    listing = any(w in ("-l", "-r", "-d", "-c", "-q", "-V") for w in words)
    if name in ("at", "batch") and listing and "-f" not in words:
        return
    if "-f" in words:
        at = words.index("-f")
        script = run.argv[at + 2] if at + 2 < len(run.argv) else None
        if script is None or shells.reads_input(script):
            shells.from_input(reading, run, name, stdin, "bash")
        return
    shells.from_input(reading, run, name, stdin, "bash")


def _last_operand(reading: Reading, run: Run) -> None:
    operands = [w for w in run.argv[1:] if w.text is None or not w.text.startswith("-")]
    if operands:
        configs.writes(reading, run, operands[-1])


def _every_operand(reading: Reading, run: Run) -> None:
    for word in run.argv[1:]:
        configs.writes(reading, run, word)


def _dd(reading: Reading, run: Run) -> None:
    for word in run.argv[1:]:
        if word.text is not None and word.text.startswith("of="):
            configs.writes(reading, run, Word(word.text[3:]))


_WRITERS: dict[str, Callable[[Reading, Run], None]] = {
    "tee": _every_operand,
    "cp": _last_operand,
    "mv": _last_operand,
    "ln": _last_operand,
    "install": _last_operand,
    "sed": _every_operand,
    "gsed": _every_operand,
    "dd": _dd,
}
"""Programs that write files they are given (checked for git's settings and hooks)."""

_HANDLERS: dict[str, Callable[[Reading, Run, str, Stdin], None]] = {
    **bashbuiltins.HANDLERS,
    "runuser": _runuser,
    "find": _find,
    "fd": _fd,
    "fdfind": _fd,
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
    "at": _later,
    "batch": _later,
    "crontab": _later,
}
"""Programs with a reader of their own (the rest: shells, interpreters, `LAUNCHERS`,
`bystanders.BYSTANDERS`)."""

_PLAIN = frozenset(
    name
    for name, spec in bystanders.BYSTANDERS.items()
    if spec is bystanders.PLAIN
    and name not in _HANDLERS
    and name not in _WRITERS
    and name not in table.LAUNCHERS
    and name not in table.SHELLS | table.POWERSHELLS | table.FOREIGN_SHELLS | table.RESERVED
    and name not in bystanders.SUBCOMMAND_BASES
    and interpreters.interpreter(name) is None
    and not name.startswith("git-")
)
"""Programs `unwrap` knows at once to need nothing more (the class (b) programs with no option
that runs a command, and no other reading)."""

__all__ = ["TERMINAL", "unwrap"]
