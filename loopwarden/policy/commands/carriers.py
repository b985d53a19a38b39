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

from loopwarden.policy.commands import launchers as table
from loopwarden.policy.commands.launchers import Launcher
from loopwarden.policy.commands.options import Scan, scan
from loopwarden.policy.commands.programs import GIT, program_name, spec_of
from loopwarden.policy.commands.programs import read as read_argv
from loopwarden.policy.commands.runs import TERMINAL, Run, Stdin, Tail
from loopwarden.policy.commands.words import FROM_INPUT, PROCESS, Word, computed

if TYPE_CHECKING:
    from loopwarden.policy.commands.reading import Reading

CODE_VARIABLES = frozenset(
    [
        "PAGER",
        "GIT_PAGER",
        "MANPAGER",
        "SYSTEMD_PAGER",
        "EDITOR",
        "VISUAL",
        "GIT_EDITOR",
        "GIT_SEQUENCE_EDITOR",
        "GIT_SSH_COMMAND",
        "GIT_SSH",
        "GIT_EXTERNAL_DIFF",
        "GIT_ASKPASS",
        "SSH_ASKPASS",
        "SUDO_ASKPASS",
        "GIT_PROXY_COMMAND",
        "LESSOPEN",
        "LESSCLOSE",
        "PROMPT_COMMAND",
        "BROWSER",
        "PS0",
        "PS1",
        "PS2",
        "PS4",
    ]
)
"""Variables whose value a program runs as a command (a pager, an editor, `ssh`): their value
is read as a command line."""

CONFIG_VARIABLES = r"^GIT_CONFIG_(PARAMETERS|COUNT|KEY_\d+|VALUE_\d+)$"
"""Variables that set git configuration (aliases, pagers) where loopwarden cannot read it."""

_GIT_CODE_KEYS = (
    r"^(alias\..+|core\.(pager|editor|sshcommand|askpass|fsmonitor|gitproxy)|sequence\.editor"
    r"|diff\.external|gpg(\..+)?\.program|credential(\..+)?\.helper|pager\..+"
    r"|diff\..+\.(textconv|command)|filter\..+\.(clean|smudge|process)|merge\..+\.driver"
    r"|uploadpack\.packobjectshook|remote\..+\.(uploadpack|receivepack)"
    r"|sendemail\..*(cccmd|tocmd|sendmailcmd))$"
)
"""git settings whose value is a command git runs (through a shell)."""

_GIT_CODE_OPTIONS: dict[str, frozenset[str]] = {
    "rebase": frozenset({"-x", "--exec"}),
    "difftool": frozenset({"-x", "--extcmd"}),
    "mergetool": frozenset({"-x", "--extcmd"}),
    "clone": frozenset({"-u", "--upload-pack"}),
    "fetch": frozenset({"--upload-pack"}),
    "pull": frozenset({"--upload-pack"}),
    "ls-remote": frozenset({"--upload-pack"}),
    "archive": frozenset({"--exec"}),
    "push": frozenset({"--receive-pack", "--exec"}),
    "send-pack": frozenset({"--receive-pack", "--exec"}),
    "filter-branch": frozenset(
        [
            "--env-filter",
            "--tree-filter",
            "--index-filter",
            "--parent-filter",
            "--msg-filter",
            "--commit-filter",
            "--tag-name-filter",
        ]
    ),
}
"""git subcommand options whose value is a shell command."""

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_STDIN_PATHS = r"^(-|/dev/stdin|/dev/fd/\d+|/proc/(self|\d+)/fd/\d+)$"


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
        _shell(reading, run, name, stdin)
    elif name in table.POWERSHELLS:
        _powershell(reading, run, name, stdin)
    elif name in table.FOREIGN_SHELLS:
        reading.doubt(run, f"`{name}` runs a shell language", True)
    elif (found := table.interpreter(name)) is not None:
        _interpreter(reading, run, name, found, stdin)
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
        reading.line(_joined(inner), run.dialect, name, run)
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
        inner = tuple(_filled(word, mark) for word in inner)
        tail = ""
    reading.add(inner, via=name, parent=run, dialect=run.dialect, stdin=stdin, tail=tail)


def _filled(word: Word, mark: str, path: bool = False) -> Word:
    """A word with `mark` in it, as `xargs -I` or `find -exec` fill it in from input (a
    `path` from find starts with its starting point, never with `-`)."""
    if word.text is None or mark not in word.text:
        return word
    lead = word.text.split(mark, 1)[0]
    return computed(FROM_INPUT, lead=lead or ("./" if path else ""))


def _joined(words: tuple[Word, ...]) -> Word:
    """Words a launcher joins with spaces and hands to a shell; computed if any is."""
    for word in words:
        if word.text is None:
            return word
    return Word(" ".join(w.text or "" for w in words))


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
        assigned(reading, run, variable, Word(value))
        i += 1
    return i


def assigned(reading: Reading, run: Run | None, variable: str, value: Word) -> None:
    """A variable set in the line: remembered, and its value read if a program runs it."""
    reading.assigned[variable] = value.text
    if variable in CODE_VARIABLES:
        reading.line(value, run.dialect if run else "bash", f"${variable}", run)
    elif re.match(CONFIG_VARIABLES, variable):
        reading.doubt(run, f"${variable} sets git configuration loopwarden cannot read")


def _shell(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
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
    if script is None or found.has("-s") or _reads_input(script):
        _from_input(reading, run, name, stdin, "bash")
        return
    run.launcher = False  # a script file: a program of its own, as allow rules see it


def _reads_input(word: Word) -> bool:
    return word.kind == PROCESS or (
        word.text is not None and bool(re.match(_STDIN_PATHS, word.text))
    )


def _from_input(reading: Reading, run: Run, name: str, stdin: Stdin, dialect: str) -> None:
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


def _powershell(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
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
            reading.line(_joined(words[n:]), "powershell", f"{name} -Command", run)
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
                reading.line(_joined(rest), "powershell", f"{name} -Command", run)
            return
        if "file".startswith(flag):
            run.launcher = False
            return
        n += 2 if any(v.startswith(flag) for v in _PWSH_VALUES if len(flag) > 1) else 1
    _from_input(reading, run, name, stdin, "powershell")


def _interpreter(
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
    if script is None or _reads_input(script):
        source = {"pipe": "a pipe", "heredoc": "a here-document", "herestring": "a here-string"}
        where = "a process substitution" if script is not None else source.get(stdin.kind, "input")
        reading.doubt(run, f"`{name}` reads the program it runs from {where}", True)


def _awk(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    from loopwarden.policy.commands.scripts import awk_runs_code

    g = table.grammar(values="-F -v -f --file -e --source -i --include -l --load -E --exec -W")
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


def _sed(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    from loopwarden.policy.commands.scripts import sed_runs_code

    g = table.grammar(values="-e --expression -f --file -l --line-length", optional="-i --in-place")
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


def _eval(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    run.launcher = True
    if len(run.argv) > 1:
        reading.line(_joined(run.argv[1:]), "bash", "eval", run)


def _source(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    script = run.argv[1] if len(run.argv) > 1 else None
    if script is not None and _reads_input(script):
        _from_input(reading, run, name, stdin if script.text else Stdin("process"), "bash")


def _trap(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    found = scan(table.grammar(), run.argv, 1)
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
    found = scan(table.grammar(values="-p", optional=""), run.argv, 1)
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
        inner = tuple(_filled(word, "{}", path=True) for word in argv[i + 1 : end])
        tail: Tail = "operands" if end < len(argv) and argv[end].text == "+" else ""
        reading.add(inner, via=f"find {argv[i].text}", parent=run, dialect=run.dialect, tail=tail)
        i = end + 1


def _git(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """git's command-carrying settings (`-c core.pager=…`, shell aliases `-c alias.x=!…`)
    and options (`rebase --exec`, `--upload-pack`, …), and `ext::` remotes."""
    head = scan(GIT.main, run.argv, 1, stop=True)
    for option in head.options:
        if option.name == "--config-env" and option.value is not None:
            key = (option.value.text or "").partition("=")[0].lower()
            if option.value.text is None or re.match(_GIT_CODE_KEYS, key):
                reading.doubt(run, "a git setting takes a command from the environment")
        if option.name != "-c" or option.value is None:
            continue
        if option.value.text is None:
            reading.doubt(run, f"cannot read a `git -c` setting: it is {option.value.kind}")
            continue
        key, _, value = option.value.text.partition("=")
        key = key.lower()
        if re.match(_GIT_CODE_KEYS, key) and (
            not key.startswith("alias.") or value.startswith("!")
        ):
            reading.line(Word(value.removeprefix("!")), "bash", "git -c", run)
    command = read_argv(run.argv)
    carriers = _GIT_CODE_OPTIONS.get(command.subcommand or "", frozenset())
    for option in command.options:
        if option.name in carriers:
            reading.line(option.value, "bash", f"git {command.subcommand} {option.name}", run)
    if any(w.text is not None and w.text.startswith("ext::") for w in command.operands):
        reading.doubt(run, "a git `ext::` remote runs a command", True)
    _git_argv_carriers(reading, run, command.subcommand, command.operands)


def _git_argv_carriers(reading: Reading, run: Run, sub: str | None, operands: list[Word]) -> None:
    """`git bisect run CMD …` (an argv) and `git submodule foreach CMD` (a shell line)."""
    words = [w.text for w in operands]
    if sub == "bisect" and words[:1] == ["run"]:
        reading.add(tuple(operands[1:]), via="git bisect run", parent=run, dialect=run.dialect)
    if sub == "submodule" and "foreach" in words:
        rest = [w for w in operands[words.index("foreach") + 1 :] if w.text != "--recursive"]
        if rest:
            reading.line(_joined(tuple(rest)), "bash", "git submodule foreach", run)


def _parallel(reading: Reading, run: Run, name: str, stdin: Stdin) -> None:
    """GNU parallel: the command (joined, run by a shell) with arguments after `:::`, or
    from input; without a command, each argument is a command line."""
    g = table.grammar(
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
    line = _joined(command)
    if cut is None or texts[cut] != ":::" or len(sources) == 0:
        if line.text is not None:
            line = Word(line.text + " {}")
        reading.line(_filled(line, "{}") if line.text else line, "bash", "parallel", run)
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
    "git": _git,
    "parallel": _parallel,
    "awk": _awk,
    "gawk": _awk,
    "mawk": _awk,
    "nawk": _awk,
    "busybox": lambda reading, run, name, stdin: _launch(
        reading, run, name, table.LAUNCHERS["busybox"], 1, stdin
    ),
    "sed": _sed,
    "gsed": _sed,
}
"""Programs with a reader of their own (the rest: shells, interpreters, `LAUNCHERS`)."""

__all__ = ["CODE_VARIABLES", "TERMINAL", "assigned", "unwrap"]
