"""The readers of class (b) programs (`bystanders.py`): the options an entry names run a
command (read as a command line), a program (a run of its own), or code loopwarden cannot read
(opaque); a program with a language or an option grammar of its own has a reader here (tar's
old-style letters, ssh's `-o`, sqlite3's dot commands, psql's meta-commands, ed's and vim's
commands, zip's `-TT`, make's `SHELL=`, `cmake -E env`, `gh alias set`, apt's `-o`, less's `+`
commands), most of them on `scripts.py`'s small-language readers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from loopwarden.policy.commands import bystanders, scripts, shells
from loopwarden.policy.commands.options import Scan, scan
from loopwarden.policy.commands.regexes import lazy
from loopwarden.policy.commands.runs import Run, Stdin
from loopwarden.policy.commands.words import Word

if TYPE_CHECKING:
    from loopwarden.policy.commands.reading import Reading

_ASSIGNMENT = lazy(r"^[A-Za-z_][A-Za-z0-9_]*=")


def program(reading: Reading, run: Run, name: str, option: str, value: Word | None) -> None:
    """An option naming a program it runs with words of its own (`fakeroot --faked P`,
    `gcc -wrapper P,ARGS`, `go test -exec P`): a run whose further words are not known."""
    if value is None:
        return
    words: tuple[Word, ...] = (value,)
    if option == "-wrapper" and value.text is not None:
        words = tuple(Word(part) for part in value.text.split(","))
    reading.add(words, via=f"{name} {option}", parent=run, dialect=run.dialect, tail="words")


def read(reading: Reading, run: Run, name: str, spec: bystanders.Bystander, stdin: Stdin) -> None:
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
            program(reading, run, name, option.name, option.value)
        elif option.name in spec.opaque:
            reading.doubt(run, f"`{name} {option.name}` runs code or a program", True)
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
                reading.doubt(run, f"`{name} -F` runs a script", True)
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
        reading.doubt(run, f"`{name} {texts[0]}` runs a program of its own", True)
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
        reading.doubt(run, f"`{name} {words[0] or '…'}` runs code it is given", True)


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
