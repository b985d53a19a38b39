"""Variables that carry code, and the bash builtins that take variable names or evaluate text.

Assigning some variables makes a program run text: a pager, an editor or `ssh` (`PAGER`,
`GIT_SSH_COMMAND`, …: their value is read as a command line), a shell its startup file
(`BASH_ENV`), bash its table of program names (`BASH_CMDS`, `BASH_ALIASES`), an interpreter its
options (`NODE_OPTIONS`, `PERL5OPT`), a dynamic loader a library (`LD_PRELOAD`): these are read or
doubted where the line sets them (`assigned`).

Builtins that take a variable *name* evaluate a subscript in it as arithmetic, so
`test -v 'a[$(git push)]'`, `declare 'a[$(…)]=1'`, `printf -v 'a[…]'`, `read 'a[…]'`,
`unset 'a[…]'` and a nameref (`declare -n r='a[…]'`) run a command: `name_doubt` checks a name,
`declare` a declaration's words, `let` its expressions (`arithmetic.py`).
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

from loopwarden.policy.commands import arithmetic
from loopwarden.policy.commands.reading import NUMBER
from loopwarden.policy.commands.regexes import lazy
from loopwarden.policy.commands.runs import Run
from loopwarden.policy.commands.words import Word

if TYPE_CHECKING:
    from loopwarden.policy.commands.reading import Reading

CODE_VARIABLES = frozenset(
    [
        "PAGER",
        "GIT_PAGER",
        "MANPAGER",
        "SYSTEMD_PAGER",
        "SYSTEMD_EDITOR",
        "EDITOR",
        "VISUAL",
        "SUDO_EDITOR",
        "FCEDIT",
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
        "RSYNC_RSH",
        "RSYNC_CONNECT_PROG",
        "CVS_RSH",
        "SVN_SSH",
        "RUSTC_WRAPPER",
        "CARGO_BUILD_RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CC",
        "CXX",
        "CPP",
        "LD",
        "AR",
        "AS",
        "NM",
        "RANLIB",
        "STRIP",
        "OBJCOPY",
        "FC",
        "F77",
        "HOSTCC",
        "PKG_CONFIG",
        "YACC",
        "LEX",
        "MAKE",
    ]
)
"""Variables whose value a program runs as a command (a pager, an editor, `ssh`, a compiler
`make` calls): their value is read as a command line."""

CONFIG_VARIABLES = lazy(r"^GIT_CONFIG_(PARAMETERS|COUNT|KEY_\d+|VALUE_\d+)$")
"""Variables that set git configuration (aliases, pagers) where loopwarden cannot read it."""

_DOUBTED = {
    "BASH_ENV": "`BASH_ENV` makes a shell run the file it names before its commands",
    "ENV": "`ENV` makes an interactive or POSIX shell run the file it names first",
    "BASH_CMDS": "`BASH_CMDS` binds a program name to another program (as `hash -p` does)",
    "BASH_ALIASES": "`BASH_ALIASES` defines aliases loopwarden cannot follow",
    "BASH_LOADABLES_PATH": "`BASH_LOADABLES_PATH` lets `enable -f` load code into bash",
    "LD_PRELOAD": "`LD_PRELOAD` loads a library into every program the line runs",
    "LD_AUDIT": "`LD_AUDIT` loads a library into every program the line runs",
    "PERL5DB": "`PERL5DB` is code perl runs under `-d`",
    "PYTHONSTARTUP": "`PYTHONSTARTUP` is a file of code python runs when interactive",
    "PYTHONINSPECT": "`PYTHONINSPECT` makes python read more code from input",
    "GIT_EXEC_PATH": "`GIT_EXEC_PATH` makes git run its commands from a place the line names",
    "GIT_CONFIG_GLOBAL": "`GIT_CONFIG_GLOBAL` makes git read settings (which may run commands) "
    "from a file",
    "GIT_CONFIG_SYSTEM": "`GIT_CONFIG_SYSTEM` makes git read settings (which may run commands) "
    "from a file",
    "GIT_CONFIG": "`GIT_CONFIG` makes git read settings (which may run commands) from a file",
    "GIT_TEMPLATE_DIR": "`GIT_TEMPLATE_DIR` gives new repositories hooks from a place the line "
    "names",
    "JAVA_TOOL_OPTIONS": "`JAVA_TOOL_OPTIONS` may load an agent into every JVM",
    "_JAVA_OPTIONS": "`_JAVA_OPTIONS` may load an agent into every JVM",
    "JDK_JAVA_OPTIONS": "`JDK_JAVA_OPTIONS` may load an agent into every JVM",
}
"""Variables whose value makes a program run code loopwarden cannot read from the line."""

_OPTION_VARIABLES = {
    "TAR_OPTIONS": lazy(
        r"--(to-c|checkpoint-a|use-c|rsh|rmt|info|new-v|transform)|(^|\s)-[A-Za-z]*[IF]"
    ),
    "ZIPOPT": lazy(r"-TT|--unzip|--tt"),
    "MAKEFLAGS": lazy(r"--eval|(^|\s)-[A-Za-z]*[Ef]|SHELL|\.SHELLFLAGS"),
    "MFLAGS": lazy(r"--eval|(^|\s)-[A-Za-z]*[Ef]|SHELL"),
    "GNUMAKEFLAGS": lazy(r"--eval|(^|\s)-[A-Za-z]*[Ef]|SHELL"),
    "GOFLAGS": lazy(r"-toolexec|-exec|-overlay"),
    "RUBYOPT": lazy(r"-[A-Za-z]*[reI]|--"),
    "PERL5OPT": lazy(r"-[A-Za-z]*[MmdIe]"),
}
"""Variables holding options for a program, doubted when they hold one that runs code."""

_NODE_SAFE = lazy(
    r"^(--max-old-space-size=\d+|--max-semi-space-size=\d+|--stack-size=\d+|--enable-source-maps"
    r"|--no-warnings|--trace-warnings|--trace-deprecation|--no-deprecation|--throw-deprecation"
    r"|--experimental-vm-modules|--experimental-specifier-resolution=\w+|--openssl-legacy-provider"
    r"|--use-openssl-ca|--unhandled-rejections=\w+|--dns-result-order=[\w-]+|--inspect(-brk)?"
    r"(=[\w.:]+)?|--trace-uncaught|--no-experimental-fetch|--experimental-fetch|--tls-min-v1\.\d"
    r"|--preserve-symlinks|--heapsnapshot-signal=\w+|--report-on-signal|--abort-on-uncaught-"
    r"exception|--expose-gc|--disable-warning=[\w-]+|--experimental-strip-types|--conditions=\S+"
    r"|-C\s*\S+)$"
)
_CARGO_RUNNER = lazy(r"^CARGO_TARGET_[A-Z0-9_]+_(RUNNER|LINKER)$")


def assigned(reading: Reading, run: Run | None, variable: str, value: Word) -> None:
    """A variable set in the line (a shell assignment, or `env NAME=VALUE`; the caller records
    its value): its value read if a program runs it, a doubt if it makes a program run what the
    line cannot show."""
    base = variable.split("[", 1)[0]
    if base in CODE_VARIABLES or _CARGO_RUNNER.match(base):
        reading.line(value, run.dialect if run else "bash", f"${base}", run)
    elif base in _DOUBTED:
        reading.doubt(run, _DOUBTED[base] + ": loopwarden cannot read what it runs")
    elif CONFIG_VARIABLES.match(base):
        reading.doubt(run, f"${base} sets git configuration loopwarden cannot read")
    elif base in _OPTION_VARIABLES:
        if value.text is None or _OPTION_VARIABLES[base].search(value.text):
            reading.doubt(run, f"`{base}` gives a program an option that runs code")
    elif base == "NODE_OPTIONS" and (
        value.text is None or not all(_NODE_SAFE.match(o) for o in _options(value.text))
    ):
        reading.doubt(run, "`NODE_OPTIONS` gives node an option loopwarden does not know")


def _options(text: str) -> list[str]:
    try:
        parts = shlex.split(text)
    except ValueError:
        return [text]
    out: list[str] = []
    for part in parts:
        if out and out[-1] == "-C":
            out[-1] += " " + part
        else:
            out.append(part)
    return out


# --- names and subscripts ----------------------------------------------------------------

SUBSCRIPT_CODE = (
    "a subscript holds a command substitution, which bash runs as it evaluates the subscript "
    "as arithmetic: use a plain name or number"
)
SUBSCRIPT_EXPANSION = "a subscript holds an expansion loopwarden does not read"

_DECLARED = lazy(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[(.*)\])?(?:(\+?=)(.*))?$", re.DOTALL)


def name_doubt(reading: Reading, run: Run | None, word: Word, array: str = "") -> None:
    """`word` is a variable name a builtin reads or writes (`test -v`, `printf -v`, `read`,
    `unset`, a nameref): a subscript in it is evaluated as arithmetic."""
    if word.text is None:
        if word.params is not None and word.lead == "" and word.template == "\0":
            name = word.params[0]
            reading.later(run, lambda r: _names_of(r, name))
            return
        reading.doubt(run, "a builtin is given a variable name that is computed: bash may "
                      "evaluate a subscript in it, which runs a command")  # fmt: skip
        return
    match = _DECLARED.match(word.text)
    if match is None or match.group(3):
        return  # not a name: bash refuses it
    _subscript(reading, run, match.group(1), match.group(2))


def _names_of(reading: Reading, variable: str) -> str | None:
    values = reading.literal_values(variable)
    if values is not None and all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v) for v in values):
        return None
    return (
        "a builtin reads a variable named by another variable's value: bash may evaluate a "
        "subscript in it, which runs a command"
    )


def _subscript(reading: Reading, run: Run | None, name: str, index: str | None) -> None:
    if index is None or index in ("@", "*"):
        return
    text = _plain(index)
    if text is None:
        reading.doubt(run, SUBSCRIPT_CODE if "$(" in index or "`" in index else SUBSCRIPT_EXPANSION)
        return
    reading.later(run, lambda r: None if name in r.assoc else arithmetic.doubt(text, r.numeric))


def _plain(text: str) -> str | None:
    """Arithmetic text with `$x` and `${x}` read as the variable itself (what arithmetic does
    with them), or None if it holds any other expansion."""
    text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", text)
    return None if "$" in text or "`" in text else text


def declare(reading: Reading, run: Run | None, words: list[Word], assign: bool = True) -> str:
    """`declare`, `typeset`, `local`, `export`, `readonly` and their words (options,
    `name`, `name=value`, `name[i]=value`); the option letters it was given. Without `assign`
    the caller records the values it assigns (the bash reader, from the grammar's nodes)."""
    flags = ""
    for word in words:
        if word.text is None:
            if word.lead[:1] in ("-", "+") or word.may_be_flag:
                reading.doubt(run, "a declaration is given a computed word that may be its option")
            elif not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\+?=", word.lead):
                reading.doubt(
                    run, "a declaration is given a computed word: bash may read it as an "
                    "array element whose subscript runs a command"
                )  # fmt: skip
            continue
        if word.text[:1] in ("-", "+") and len(word.text) > 1:
            flags += word.text[1:] if word.text[0] == "-" else ""
            continue
        match = _DECLARED.match(word.text)
        if match is None:
            continue
        name, index, operator, value = match.groups()
        _subscript(reading, run, name, index)
        if operator and value.startswith("(") and re.search(r"[$`]", value):
            reading.doubt(
                run, "a declaration's quoted `(…)` value is read again as an array, and what "
                "it holds is expanded: assign the array without quotes around it"
            )  # fmt: skip
        if "A" in flags:
            reading.assoc.add(name)
        if "i" in flags:
            reading.integers.add(name)
        if operator and assign:
            reading.assign(name, value)
        if operator and "n" in flags:
            name_doubt(reading, run, Word(value))
    return flags


def let(reading: Reading, run: Run | None, words: list[Word]) -> None:
    """`let EXPR…`: each word is arithmetic; the variables it assigns hold numbers."""
    for word in words:
        if word.text is None:
            reading.doubt(
                run, "`let` evaluates computed text as arithmetic, which may run a command"
            )
            continue
        for target in arithmetic.targets(word.text):
            reading.assign(target, NUMBER)
        text = word.text
        reading.later(run, lambda r, t=text: arithmetic.doubt(t, r.numeric))  # type: ignore[misc]
