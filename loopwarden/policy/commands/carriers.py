"""What a command runs in turn, by the class of its program (docs/hooks.md, "Command rules"):

- (a) launchers (`launchers.py`), shells, interpreters, and the builtins that run text (`eval`,
  `source`, `trap`, `alias`, `mapfile -C`, `compgen -W`/`-C`, `fc`), `find -exec`, `fd -x`,
  git's command-carrying settings and options (`configs.py`): what they run is read, or doubted;
- (b) programs known not to run the line's commands (`bystanders.py`), with the options and
  small languages that would make them run one, and the builtins that take variable names or
  arithmetic (`variables.py`);
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

from loopwarden.policy.commands import bystanders, configs, scripts, shells, variables
from loopwarden.policy.commands import launchers as table
from loopwarden.policy.commands.launchers import Launcher
from loopwarden.policy.commands.options import Scan, grammar, scan
from loopwarden.policy.commands.programs import GIT, program_name, spec_of
from loopwarden.policy.commands.runs import TERMINAL, Run, Stdin, Tail
from loopwarden.policy.commands.words import Word, filled, joined

if TYPE_CHECKING:
    from collections.abc import Callable

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
    elif (found := table.interpreter(name)) is not None:
        shells.interpreter(reading, run, name, found, stdin)
    elif name in table.LAUNCHERS:
        run.known = True
        _launch(reading, run, name, table.LAUNCHERS[name], 1, stdin)
    elif name in bystanders.SUBCOMMAND_BASES and _subcommand_launcher(reading, run, name, stdin):
        run.known = True
    elif name in bystanders.BYSTANDERS:
        run.known = True
        _bystander(reading, run, name, bystanders.BYSTANDERS[name], stdin)


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
    for option in found.options:
        if option.name in spec.shell:
            reading.line(option.value, run.dialect, f"{name} {option.name}", run)
            return
        if option.name in spec.programs:
            _program(reading, run, name, option.name, option.value)
        if option.name in spec.split:
            split = _split_string(reading, run, name, option.value, argv, found.rest)
            if split is None:
                return
            argv = split
            found = scan(spec.grammar, argv, found.rest, stop=not spec.grammar.permute)
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


def _program(reading: Reading, run: Run, name: str, option: str, value: Word | None) -> None:
    """An option naming a program it runs with words of its own (`fakeroot --faked P`,
    `gcc -wrapper P,ARGS`, `go test -exec P`): a run whose further words are not known."""
    if value is None:
        return
    words: tuple[Word, ...] = (value,)
    if option == "-wrapper" and value.text is not None:
        words = tuple(Word(part) for part in value.text.split(","))
    reading.add(words, via=f"{name} {option}", parent=run, dialect=run.dialect, tail="words")


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


# --- programs known not to run commands, with the options that would ------------------------


def _bystander(
    reading: Reading, run: Run, name: str, spec: bystanders.Bystander, stdin: Stdin
) -> None:
    if spec is bystanders.PLAIN:
        return
    found = scan(spec.grammar, run.argv, 1)
    for option in found.options:
        if option.name in spec.lines:
            value = option.value
            if name == "tar" and option.name == "--checkpoint-action":
                if value is None or value.text is None or value.text.startswith("exec"):
                    command = value.text.partition("=")[2] if value and value.text else None
                    reading.line(Word(command) if command is not None else value, "bash",
                                 f"{name} {option.name}", run)  # fmt: skip
                continue
            reading.line(value, "bash", f"{name} {option.name}", run)
        elif option.name in spec.programs:
            _program(reading, run, name, option.name, option.value)
        elif option.name in spec.opaque:
            reading.doubt(run, f"`{name} {option.name}` runs code loopwarden cannot read", True)
        elif (
            option.name in spec.reads_input
            and option.value is not None
            and shells.reads_input(option.value)
        ):
            reading.doubt(run, f"`{name}` reads what it runs from input", True)
    if spec.reader:
        READERS[spec.reader](reading, run, name, found, stdin)


def _input_text(stdin: Stdin) -> str | None:
    if stdin.kind in ("heredoc", "herestring") and stdin.text is not None:
        return stdin.text.text
    return None


def _reads_stdin(reading: Reading, run: Run, name: str, stdin: Stdin, check: Callable[[str], bool],
                 what: str) -> None:  # fmt: skip
    """A program reading its commands from standard input: a here-document or here-string is
    checked with `check`; a pipe, a file or a terminal is opaque."""
    text = _input_text(stdin)
    if text is not None:
        if check(text):
            reading.doubt(run, f"`{name}` runs {what} from its input", True)
    elif stdin.kind in ("heredoc", "herestring"):
        reading.doubt(run, f"cannot read the commands `{name}` reads from input: they are computed")
    else:
        source = {"pipe": "a pipe", "file": "a file", "process": "a process substitution"}
        where = source.get(stdin.kind, "input")
        reading.doubt(run, f"`{name}` reads the commands it runs from {where}", True)


def _tar(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    """tar's old-style first word (`tar cIf PROG F`): its letters take values in order."""
    argv = run.argv
    if len(argv) < 2 or argv[1].text is None or argv[1].text.startswith("-"):
        return
    letters = argv[1].text
    if not re.fullmatch(r"[A-Za-z]+", letters):
        return
    at = 2
    for letter in letters:
        if letter in "fbCgKLNTVXH":
            at += 1
        elif letter in "IF":
            value = argv[at] if at < len(argv) else None
            if letter == "I":
                reading.line(value, "bash", f"{name} -I", run)
            else:
                reading.doubt(run, f"`{name} -F` runs a script loopwarden cannot read", True)
            at += 1


def _ssh(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    """ssh's `-o` options that run a command here (ProxyCommand, LocalCommand,
    KnownHostsCommand) are read; a config file from input and a provider library are doubts."""
    for option in found.options:
        value = option.value
        if option.name == "-F" and value is not None and shells.reads_input(value):
            reading.doubt(run, f"`{name}` reads its configuration from input", True)
        if option.name != "-o" or value is None:
            continue
        if value.text is None:
            reading.doubt(run, f"cannot read an `{name} -o` option: it is computed")
            continue
        parts = re.split(r"\s*=\s*|\s+", value.text.strip(), maxsplit=1)
        key, rest = parts[0].lower(), parts[1] if len(parts) > 1 else ""
        if key in ("proxycommand", "localcommand", "knownhostscommand"):
            if rest.lower() != "none":
                reading.line(Word(rest), "bash", f"{name} -o {parts[0]}", run)
        elif key in ("pkcs11provider", "securitykeyprovider", "match", "include"):
            reading.doubt(run, f"an `{name}` option loads code or settings loopwarden cannot read")


def _compiler(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    """A compiler driver: options read from a file (`@file`) may include `-wrapper`."""
    if any(w.text is not None and w.text.startswith("@") and len(w.text) > 1 for w in run.argv):
        reading.doubt(run, f"`{name}` reads more options from a file loopwarden cannot read")


def _sqlite3(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    if any(o.name == "-safe" for o in found.options):
        return
    texts = [o.value for o in found.options if o.name == "-cmd"]
    operands = [w for _, w in found.operands]
    texts += operands[1:]
    for option in found.options:
        if option.name == "-init" and option.value is not None and shells.reads_input(option.value):
            reading.doubt(run, f"`{name}` reads commands from input", True)
    for text in texts:
        if text is None:
            continue
        if text.text is None:
            reading.doubt(run, f"cannot read what `{name}` is given to run: it is computed")
        elif scripts.sqlite_runs_code(text.text):
            reading.doubt(run, f"`{name}` is given a dot command that runs a command", True)
    if len(operands) <= 1:
        _reads_stdin(reading, run, name, stdin, scripts.sqlite_runs_code, "dot commands")


def _psql(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    commands = [o.value for o in found.options if o.name in ("-c", "--command")]
    files = [o.value for o in found.options if o.name in ("-f", "--file")]
    for text in commands:
        if text is not None and (text.text is None or scripts.psql_runs_code(text.text)):
            reading.doubt(run, f"`{name}` is given a meta-command that runs a command", True)
    from_input = any(f is not None and shells.reads_input(f) for f in files)
    if (from_input or not (commands or files)) and stdin.kind != "terminal":
        _reads_stdin(reading, run, name, stdin, scripts.psql_runs_code, "meta-commands")


def _ed(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    _reads_stdin(reading, run, name, stdin, scripts.ed_runs_code, "commands (`!`)")


def _vim(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    """vim's ex commands from `-c`, `--cmd` and `+cmd`, and from input in ex mode; `-S`, `-s`,
    `-u` files from input."""
    commands = [o.value for o in found.options if o.name in ("-c", "--cmd")]
    commands += [w for _, w in found.operands if w.text is None or w.text.startswith("+")]
    for word in commands:
        if word is None:
            continue
        text = word.text[1:] if word.text is not None and word.text.startswith("+") else word.text
        if text is None or scripts.ex_runs_code(text):
            reading.doubt(run, f"`{name}` is given an ex command that may run code", True)
    for option in found.options:
        value = option.value
        if option.name.startswith("--remote-") or (
            option.name in ("-S", "-u", "-U") and (value is None or shells.reads_input(value))
        ):
            reading.doubt(run, f"`{name}` runs commands from input or another vim", True)
    ex_mode = name == "ex" or any(o.name in ("-e", "-E", "-es", "-Es") for o in found.options)
    texts = [w.text or "" for w in run.argv]
    scriptin = [n for n, t in enumerate(texts) if re.fullmatch(r"-[A-Za-z]*s", t)]
    if not ex_mode and scriptin:
        script = run.argv[scriptin[0] + 1] if scriptin[0] + 1 < len(run.argv) else None
        if script is None or shells.reads_input(script):
            reading.doubt(run, f"`{name} -s` types keys it reads from input", True)
    if ex_mode and stdin.kind != "terminal":
        _reads_stdin(reading, run, name, stdin, scripts.ex_runs_code, "ex commands")


def _zip(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    argv = run.argv
    for n, word in enumerate(argv[1:], 1):
        if word.text == "-TT" and n + 1 < len(argv):
            reading.line(argv[n + 1], "bash", f"{name} -TT", run)
        elif word.text is not None and word.text.startswith("-TT") and len(word.text) > 3:
            reading.line(Word(word.text[3:]), "bash", f"{name} -TT", run)


def _make(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    """make's variables given on the line that change how recipes run (`SHELL=…`)."""
    for _, word in found.operands:
        text = word.text if word.text is not None else word.lead
        if re.match(r"^\s*(SHELL|\.SHELLFLAGS|MAKESHELL)\s*[:+?]?=", text or ""):
            reading.doubt(run, f"`{name}` is given the shell its recipes run with")


def _cmake(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    """`cmake -E env|chdir|time … CMD`: a launcher; `-P SCRIPT` from input is opaque."""
    argv = run.argv
    texts = [w.text for w in argv]
    if "-E" in texts:
        at = texts.index("-E")
        tool = texts[at + 1] if at + 1 < len(texts) else None
        rest = argv[at + 2 :]
        if tool == "env":
            while rest and (rest[0].text is None or rest[0].text.startswith("-") or (
                _ASSIGNMENT.match(rest[0].text)
            )):  # fmt: skip
                if rest[0].text == "--":
                    rest = rest[1:]
                    break
                rest = rest[1:]
        elif tool == "chdir":
            rest = rest[1:]
        elif tool == "time":
            pass
        else:
            return
        if rest:
            reading.add(rest, via=f"cmake -E {tool}", parent=run, dialect=run.dialect, stdin=stdin)
        run.launcher = True


def _inputs(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    """Nothing beyond the entry's options (their input checked by `_bystander`)."""


def _gh(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    """`gh alias set NAME EXPANSION [--shell]`: a shell alias's expansion is read."""
    words = [w for _, w in found.operands]
    texts = [w.text for w in words]
    running = bystanders.RUNNING_SUBCOMMANDS.get(name, frozenset())
    if texts and texts[0] in running:
        reading.doubt(run, f"`{name} {texts[0]}` runs a program loopwarden does not read", True)
    if texts[:2] == ["alias", "set"] and len(words) >= 4:
        expansion = words[3]
        shell = any(o.name in ("-s", "--shell") for o in found.options)
        if expansion.text is None or shell or expansion.text.startswith("!"):
            text = expansion.text[1:] if expansion.text and expansion.text.startswith("!") else None
            reading.line(Word(text) if text is not None else expansion, "bash",
                         f"{name} alias", run)  # fmt: skip


def _apt(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    for option in found.options:
        if option.name in ("-o", "--option") and option.value is not None:
            text = option.value.text
            if text is None or re.search(r"(?i)invoke|script|::pre-|::post-|dpkg::", text):
                reading.doubt(run, f"an `{name} -o` setting runs a command", True)


def _less(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    for word in run.argv[1:]:
        text = word.text if word.text is not None else word.lead
        if text.startswith("+") and (word.text is None or re.search(r"[!|]", text)):
            reading.doubt(run, f"`{name}` is given a command that runs a shell", True)


def _subcommands(reading: Reading, run: Run, name: str, found: Scan, stdin: Stdin) -> None:
    words = [w.text for _, w in found.operands]
    running = bystanders.RUNNING_SUBCOMMANDS.get(name, frozenset())
    if words and (words[0] is None or words[0] in running):
        reading.doubt(run, f"`{name} {words[0] or '…'}` runs code loopwarden does not read", True)


READERS: dict[str, Callable[[Reading, Run, str, Scan, Stdin], None]] = {
    "tar": _tar,
    "ssh": _ssh,
    "compiler": _compiler,
    "sqlite3": _sqlite3,
    "psql": _psql,
    "ed": _ed,
    "vim": _vim,
    "zip": _zip,
    "make": _make,
    "cmake": _cmake,
    "inputs": _inputs,
    "gh": _gh,
    "apt": _apt,
    "less": _less,
    "subcommands": _subcommands,
}
"""The readers of programs with a small language or an option grammar of their own."""


# --- builtins and programs with a reader of their own --------------------------------------


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
    "runuser": _runuser,
    "eval": _eval,
    "source": _source,
    ".": _source,
    "trap": _trap,
    "alias": _alias,
    "hash": _hash,
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
"""Programs with a reader of their own (the rest: shells, interpreters, `LAUNCHERS`,
`bystanders.BYSTANDERS`)."""

__all__ = ["TERMINAL", "unwrap"]
