"""Shells and interpreters as carriers of code: `sh -c TEXT` (any option cluster with `c`) and a
shell reading a here-document are read as command text; PowerShell's `-Command` as PowerShell;
a shell language without a real grammar here (zsh, fish, ksh, …), inline interpreter code,
a program read from a pipe or input, a module that runs code (`python -m timeit`, `perl -M…`,
`node --import data:…`), awk that can run commands and sed's `e` are opaque; a script file is
a program of its own, whose arguments `verdicts.py` checks as an unknown program's.

Standard input has many names (`/dev/stdin`, `/dev//stdin`, `/dev/fd/0`, `/proc/self/fd/0`,
`/proc/thread-self/fd/0`, `/proc/<pid>/fd/N`): `reads_input` knows them all, normalised.
"""

from __future__ import annotations

import posixpath
import re
from typing import TYPE_CHECKING

from loopwarden.policy.commands import interpreters
from loopwarden.policy.commands import launchers as table
from loopwarden.policy.commands.options import grammar, scan
from loopwarden.policy.commands.regexes import lazy
from loopwarden.policy.commands.runs import Run, Stdin
from loopwarden.policy.commands.words import PART, PROCESS, Word, joined

if TYPE_CHECKING:
    from loopwarden.policy.commands.reading import Reading

_INPUT_PATH = lazy(
    r"^(/dev/(stdin|fd(/\d+)?|tty)|/proc/(self|thread-self|\d+)(/task/\d+)?/fd(/\d+)?)$"
)


def input_path(text: str) -> bool:
    """Whether `text` names standard input or another open descriptor, in any spelling
    (`-`, `/dev//stdin`, `/dev/./fd/0`, `//proc/thread-self/fd/0`)."""
    if text == "-":
        return True
    if not text.startswith("/"):
        return False
    return bool(_INPUT_PATH.match(posixpath.normpath("/" + text.lstrip("/"))))


def reads_input(word: Word) -> bool:
    """Whether a script or program file word is input: a process substitution, a descriptor
    path, or a computed word that may spell one (`/proc/$$/fd/0`)."""
    if word.kind == PROCESS:
        return True
    if word.text is not None:
        return input_path(word.text)
    if not word.lead:
        return True
    lead = posixpath.normpath("/" + word.lead.lstrip("/"))
    return (
        lead.startswith(("/dev", "/proc"))
        or "/dev/".startswith(lead)
        or ("/proc/".startswith(lead))
    )


def shell(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """`sh`/`bash`/… : `-c TEXT` (any option cluster with `c`), a script, or input."""
    found = scan(table.SHELL_GRAMMAR, run.argv, 1, stop=True)
    if found.maybe_option or found.shifted:
        reading.doubt(run, f"cannot tell what `{name}` runs: a computed word is among its options")
        return
    run.launcher = run.known = True
    for option in found.options:
        value = option.value
        if option.name in table.SHELL_FILES and value is not None and reads_input(value):
            reading.doubt(run, f"`{name} {option.name}` runs commands from input", True)
    if found.has("-c"):
        script = run.argv[found.rest] if found.rest < len(run.argv) else None
        reading.line(script, "bash", f"{name} -c", run)
        return
    script = run.argv[found.rest] if found.rest < len(run.argv) else None
    if script is None or found.has("-s") or reads_input(script):
        from_input(reading, run, name, stdin, "bash", script)
        return
    run.launcher = run.known = False  # a script file: a program of its own, as rules see it


def foreign(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """zsh, fish, ksh, …: their text is not bash (zsh's `=git`, `noglob`, `repeat`), and no
    grammar for it is loaded: inline text and input are opaque; a script file is a program."""
    found = scan(table.SHELL_GRAMMAR, run.argv, 1, stop=True)
    run.launcher = run.known = True
    script = run.argv[found.rest] if found.rest < len(run.argv) else None
    if found.has("-c", "--command") or script is None or reads_input(script) or found.has("-s"):
        if found.has("--version", "-v", "--help", "-h") and script is None:
            return
        reading.doubt(run, f"`{name}` runs text in a shell language no grammar here reads", True)
        return
    if found.maybe_option or found.shifted:
        reading.doubt(run, f"cannot tell what `{name}` runs: a computed word is among its options")
        return
    run.launcher = run.known = False


def from_input(
    reading: Reading, run: Run, name: str, stdin: Stdin, dialect: str, path: Word | None = None
) -> None:
    """A shell reading its commands from standard input (or a descriptor): a here-document or
    here-string on input is read as command text; a pipe, another descriptor or a terminal
    is opaque."""
    other_fd = (
        path is not None
        and path.text is not None
        and path.text not in ("-",)
        and not re.search(r"(stdin|/0)$", posixpath.normpath("/" + path.text.lstrip("/")))
    )
    if (
        stdin.kind in ("heredoc", "herestring")
        and not other_fd
        and (path is None or path.text is not None)
    ):
        reading.line(stdin.text, "powershell" if dialect == "powershell" else "bash", name, run)
        return
    if path is not None and path.kind == PROCESS:
        source = "a process substitution"
    elif other_fd or (path is not None and path.text is None):
        source = "a file descriptor"
    else:
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
    run.launcher = run.known = True
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
            run.launcher = run.known = False
            return
        n += 2 if any(v.startswith(flag) for v in _PWSH_VALUES if len(flag) > 1) else 1
    from_input(reading, run, name, stdin, "powershell")


def interpreter(
    reading: Reading, run: Run, name: str, spec: interpreters.Interpreter, stdin: Stdin
) -> None:
    """Inline code is opaque; so is a program read from input, a module that may run the
    line's code, and an option the interpreter's grammar does not list; a script file is a
    program of its own."""
    run.known = True
    found = scan(spec.grammar, run.argv, 1, stop=True)
    inline = next((o.name for o in found.options if o.name in spec.inline), None)
    if inline is None and found.rest < len(run.argv) and run.argv[found.rest].text in spec.inline:
        inline = run.argv[found.rest].text  # `deno eval CODE`
    if inline is not None:
        reading.doubt(run, f"`{name} {inline}` runs inline code", True)
        return
    if found.has(*spec.no_input):
        return
    if found.unknown:
        reading.doubt(run, f"`{name}` is given an option outside its grammar here", True)
        return
    base = interpreters.interpreter_base(name)
    for option in found.options:
        if option.name not in spec.modules:
            continue
        if _module_runs_code(base, option.name, option.value):
            reading.doubt(
                run,
                f"`{name} {option.name}` loads code by name (a module that runs its arguments, code in the name itself, or input)",
                True,
            )
            return
        if base == "python" and option.name == "-m":
            module = option.value.text if option.value is not None else ""
            run.known = (
                module in interpreters.INERT_MODULES["python"]
                or (module or "").split(".")[0] in interpreters.INERT_MODULES["python"]
            )
            return  # python -m MODULE: the rest are the module's arguments
    if name == "gdb" or base == "gdb":
        args = next((o.at for o in found.options if o.name == "--args"), None)
        if args is not None:
            reading.add(run.argv[args + 1 :], via="gdb --args", parent=run, dialect=run.dialect)
        return
    if found.maybe_option or found.shifted:
        reading.doubt(run, f"cannot tell what `{name}` runs: a computed word is among its options")
        return
    script = run.argv[found.rest] if found.rest < len(run.argv) else None
    interactive = found.has(*spec.interactive)
    if script is None or reads_input(script) or interactive:
        source = {"pipe": "a pipe", "heredoc": "a here-document", "herestring": "a here-string"}
        where = (
            "a process substitution"
            if script is not None and script.kind == PROCESS
            else (source.get(stdin.kind, "input"))
        )
        if script is not None and not reads_input(script) and interactive:
            where = "input, after its script (-i)"
        reading.doubt(run, f"`{name}` reads the program it runs from {where}", True)
        return
    run.known = False  # a script file: a program of its own, as rules see it


def _module_runs_code(base: str, option: str, value: Word | None) -> bool:
    """Whether a module an interpreter is told to load may run code of the line's (a module
    that runs its arguments, code in a `data:` URL or in `perl -M'…;…'`, a debugger reading
    its commands from input, a module from input), rather than a named module's own files."""
    if value is None or value.text is None:
        return True
    text = value.text
    if reads_input(value):
        return True
    if base == "python":
        return (
            text in interpreters.CODE_MODULES["python"]
            or text.split(".")[0] in (interpreters.CODE_MODULES["python"])
        )
    if base == "perl":
        if option == "-d":
            return not re.fullmatch(r":[\w:]+(=[\w,:.\-/]*)?", text)
        return not re.fullmatch(r"-?[\w:]+(=[\w,:.\-/]*)?", text)
    if base == "node":
        return text.startswith("data:") or bool(re.search(r"[\s;()`$]", text))
    if base == "ruby":
        return not re.fullmatch(r"[\w/.\-]+", text)
    return False


_AWK = grammar(
    values="-F --field-separator -v --assign -f --file -e --source -i --include -l --load "
    "-E --exec -W",
    optional="-d --dump-variables -D --debug -o --pretty-print -p --profile -L --lint",
)


def awk(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """awk's program (`-e`, `--source`, or its first operand) judged on awk's own syntax; a
    program file from input, an extension or an include are opaque."""
    from loopwarden.policy.commands.scripts import awk_runs_code

    run.known = True
    found = scan(_AWK, run.argv, 1, stop=True)
    if found.has("-l", "--load", "-i", "--include"):
        reading.doubt(run, f"`{name}` loads an extension or another program", True)
    for option in found.options:
        value = option.value
        if option.name in ("-f", "--file", "-E", "--exec") and value and reads_input(value):
            reading.doubt(run, f"`{name}` reads its program from input", True)
    programs = [o.value for o in found.options if o.name in ("-e", "--source")]
    if not programs and not found.has("-f", "--file", "-E", "--exec"):
        programs = [run.argv[found.rest] if found.rest < len(run.argv) else None]
    for program in programs:
        if program is None or program.text is None:
            if program is not None:
                reading.doubt(run, f"cannot read the `{name}` program: it is {program.kind}")
        elif awk_runs_code(program.text):
            reading.doubt(run, f"the `{name}` program can run commands (system, a pipe)", True)


_SED = grammar(
    values="-e --expression -f --file -l --line-length",
    optional="-i --in-place",
    flags="-n --quiet --silent -E -r --regexp-extended -s --separate -z --null-data -u "
    "--unbuffered --posix --sandbox --debug --follow-symlinks -b --binary --help --version",
)._replace(closed=False)


def sed(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """sed's scripts (`-e`, or its first operand) read for the `e` command and flag; a variable
    in a replacement is read as text standing there; a script file from input is opaque."""
    from loopwarden.policy.commands.scripts import sed_runs_code

    run.known = True
    found = scan(_SED, run.argv, 1)
    if found.has("--sandbox"):
        return
    for option in found.options:
        value = option.value
        if option.name in ("-f", "--file") and value is not None and reads_input(value):
            reading.doubt(run, f"`{name}` reads its script from input", True)
    scripts = [o.value for o in found.options if o.name in ("-e", "--expression")]
    if not scripts and not found.has("-f", "--file") and found.operands:
        scripts = [found.operands[0][1]]
    for script in scripts:
        if script is None:
            continue
        texts = [script.text] if script.text is not None else templates(reading, script)
        if texts is None:
            reading.doubt(run, f"cannot read the `{name}` script: it is {script.kind}")
        elif any(sed_runs_code(text.replace(PART, "x")) for text in texts):
            reading.doubt(run, f"the `{name}` script runs commands (the e command or flag)", True)
        elif any(sed_runs_code(text) for text in texts):
            reading.doubt(
                run,
                f"a variable stands where `{name}` reads an address, a command or a flag (its "
                "value could be an `e` command): write that part out, or compute the script "
                "before",
            )


def templates(reading: Reading, word: Word, limit: int = 16) -> list[str] | None:
    """What a word computed only from variables may be: each variable the line sets replaced
    by each literal value it is given, one set before the line (or a default) left as PART.
    None if a value is not known, or there are too many."""
    if word.params is None:
        return None
    texts = [""]
    pieces = word.template.split(PART)
    for n, param in enumerate(word.params):
        name, _, default = param.partition("\0")
        if reading.assigned(name):
            values = reading.literal_values(name)
            if values is None:
                return None
            options = sorted(values) + ([default] if default else [])
        else:
            options = [PART] + ([default] if default else [])
        texts = [t + pieces[n] + v for t in texts for v in options]
        if len(texts) > limit:
            return None
    return [t + pieces[-1] for t in texts]
