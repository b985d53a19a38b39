"""Shells and interpreters as carriers of code: `sh -c TEXT` (any option cluster with `c`) and a
shell reading a here-document are read as command text; PowerShell's `-Command` as PowerShell;
inline interpreter code, a program read from a pipe or input, awk that can run commands and
sed's `e` are opaque; a script file is a program of its own."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from loopwarden.policy.commands import launchers as table
from loopwarden.policy.commands.options import grammar, scan
from loopwarden.policy.commands.runs import Run, Stdin
from loopwarden.policy.commands.words import PROCESS, Word, joined

if TYPE_CHECKING:
    from loopwarden.policy.commands.reading import Reading

_STDIN_PATHS = r"^(-|/dev/stdin|/dev/fd/\d+|/proc/(self|\d+)/fd/\d+)$"


def shell(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`sh`/`bash`/… : `-c TEXT` (any option cluster with `c`), a script, or input."""
    found = scan(table.SHELL_GRAMMAR, run.argv, 1, stop=True)
    if found.maybe_option or found.shifted:
        reading.doubt(run, f"cannot tell what `{name}` runs: a computed word is among its options")
        return
    run.launcher = True
    if found.has("-c"):
        script = run.argv[found.rest] if found.rest < len(run.argv) else None
        reading.line(script, "bash", f"{name} -c", run)
        return
    script = run.argv[found.rest] if found.rest < len(run.argv) else None
    if script is None or found.has("-s") or reads_input(script):
        from_input(reading, run, name, stdin, "bash")
        return
    run.launcher = False  # a script file: a program of its own, as allow rules see it


def reads_input(word: Word) -> bool:
    return word.kind == PROCESS or (
        word.text is not None and bool(re.match(_STDIN_PATHS, word.text))
    )


def from_input(reading: Reading, run: Run, name: str, stdin: Stdin, dialect: str) -> None:
    """A shell reading its commands from standard input: a here-document or here-string is
    read as command text; a pipe, a file descriptor or a terminal is opaque."""
    if stdin.kind in ("heredoc", "herestring"):
        reading.line(stdin.text, "powershell" if dialect == "powershell" else "bash", name, run)
        return
    source = {"pipe": "a pipe", "process": "a process substitution"}.get(stdin.kind, "input")
    reading.doubt(run, f"`{name}` reads the commands it runs from {source}", True)


_PWSH_VALUES = (
    "executionpolicy", "windowstyle", "version", "inputformat", "outputformat",
    "workingdirectory", "configurationname", "configurationfile", "custompipename",
    "settingsfile", "psconsolefile", "ep", "wd",
)  # fmt: skip


def powershell(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`pwsh -Command TEXT` (or a first word that is no option) is PowerShell text;
    `-EncodedCommand` is a doubt; `-File` a script; nothing, or `-Command -`, reads input.
    Parameters are matched as PowerShell does: without case, by any prefix."""
    words = run.argv[1:]
    run.launcher = True
    n = 0
    while n < len(words):
        text = words[n].text
        if text is None:
            reading.doubt(
                run, f"cannot tell what `{name}` runs: a computed word is among its options"
            )
            return
        if not text.startswith(("-", "/")):
            reading.line(joined(words[n:]), "powershell", f"{name} -Command", run)
            return
        flag = text.lstrip("-/").split(":", 1)[0].lower()
        if not flag:
            break
        if "encodedcommand".startswith(flag):
            reading.doubt(run, f"`{name} -EncodedCommand` runs base64 code loopwarden cannot read")
            return
        if "command".startswith(flag):
            rest = words[n + 1 :]
            if rest and rest[0].text == "-":
                break
            if rest:
                reading.line(joined(rest), "powershell", f"{name} -Command", run)
            return
        if "file".startswith(flag):
            run.launcher = False
            return
        n += 2 if any(v.startswith(flag) for v in _PWSH_VALUES if len(flag) > 1) else 1
    from_input(reading, run, name, stdin, "powershell")


def interpreter(
    reading: Reading, run: Run, name: str, spec: table.Interpreter, stdin: Stdin
) -> None:
    """Inline code is opaque; so is a program read from input; a script file is a program."""
    found = scan(spec.grammar, run.argv, 1, stop=True)
    inline = next((o.name for o in found.options if o.name in spec.inline), None)
    if inline is None and found.rest < len(run.argv) and run.argv[found.rest].text in spec.inline:
        inline = run.argv[found.rest].text  # `deno eval CODE`
    if inline is not None:
        reading.doubt(run, f"`{name} {inline}` runs inline code", True)
        return
    if found.has(*spec.no_input):
        return
    if found.maybe_option or found.shifted:
        reading.doubt(run, f"cannot tell what `{name}` runs: a computed word is among its options")
        return
    script = run.argv[found.rest] if found.rest < len(run.argv) else None
    if script is None or reads_input(script):
        source = {"pipe": "a pipe", "heredoc": "a here-document", "herestring": "a here-string"}
        where = "a process substitution" if script is not None else source.get(stdin.kind, "input")
        reading.doubt(run, f"`{name}` reads the program it runs from {where}", True)


def awk(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    from loopwarden.policy.commands.scripts import awk_runs_code

    g = grammar(values="-F -v -f --file -e --source -i --include -l --load -E --exec -W")
    found = scan(g, run.argv, 1, stop=True)
    if found.has("-l", "--load"):
        reading.doubt(run, f"`{name} -l` loads an extension", True)
    programs = [o.value for o in found.options if o.name in ("-e", "--source")]
    if not programs and not found.has("-f", "--file", "-E", "--exec"):
        programs = [run.argv[found.rest] if found.rest < len(run.argv) else None]
    for program in programs:
        if program is None or program.text is None:
            if program is not None:
                reading.doubt(run, f"cannot read the `{name}` program: it is {program.kind}")
        elif awk_runs_code(program.text):
            reading.doubt(run, f"the `{name}` program can run commands (system, a pipe)", True)


def sed(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    from loopwarden.policy.commands.scripts import sed_runs_code

    g = grammar(values="-e --expression -f --file -l --line-length", optional="-i --in-place")
    found = scan(g, run.argv, 1)
    if found.has("--sandbox"):
        return
    scripts = [o.value for o in found.options if o.name in ("-e", "--expression")]
    if not scripts and not found.has("-f", "--file") and found.operands:
        scripts = [found.operands[0][1]]
    for script in scripts:
        if script is None:
            continue
        if script.text is None:
            reading.doubt(run, f"cannot read the `{name}` script: it is {script.kind}")
        elif sed_runs_code(script.text):
            reading.doubt(run, f"the `{name}` script runs commands (the e command or flag)", True)
