"""The small languages of programs that can run commands, read just far enough to tell whether a
script may run one — judged on each language's own syntax, never on substrings:

- awk: `system(…)`, `print | "cmd"`, `"cmd" | getline`, gawk's `|&` coprocesses and `@`
  (indirect calls, `@load`, `@include`); strings, regular expressions and comments are skipped,
  so `/ERROR|WARN/`, `"a|b"` and the word `systemd` are data;
- sed (GNU): the `e` command and the `e` flag of `s`;
- ed: `!cmd`, and `r`, `w`, `e`, `E` reading from or writing to `!cmd`, inside `g`/`v` too;
- vim's ex commands (`-c`, `+`, `--cmd`, input in ex mode): only a small closed set is read
  (`s` without `\\=`, `w`, `q`, `x`, `d`, `set`, …); any other command is code;
- sqlite3's dot commands: `.shell`, `.system`, a pipe in `.once`/`.output`/`.import`/`.read`,
  `.load`; and SQL's `edit()`;
- psql's meta-commands: `\\!`, a pipe in `\\o`/`\\g`/`\\w`/`\\copy`, `\\i`.

Anything a reader cannot follow counts as running code: they fail closed.
"""

from __future__ import annotations

import re

from loopwarden.policy.commands.regexes import lazy
from loopwarden.policy.commands.words import PART

# --- awk -------------------------------------------------------------------------------------

_AWK_NAME = lazy(r"[A-Za-z_][A-Za-z0-9_]*")
_AWK_NUMBER = lazy(r"[0-9.]+([eE][-+]?[0-9]+)?")
_AWK_KEYWORDS_BEFORE_REGEX = frozenset(
    {"print", "printf", "return", "in", "case", "if", "while", "for", "do", "else", "getline"}
)


def awk_runs_code(program: str) -> bool:
    """Whether an awk program may run a command (see the module docstring)."""
    i, n = 0, len(program)
    previous = ""  # the last significant token, to tell a regex from a division
    while i < n:
        char = program[i]
        if char in " \t\r":
            i += 1
            continue
        if char == "\\" and program[i + 1 : i + 2] == "\n":
            i += 2
            continue
        if char == "\n":
            previous = ";"
            i += 1
            continue
        if char == "#":
            while i < n and program[i] != "\n":
                i += 1
            continue
        if char == '"':
            end = _string_end(program, i)
            if end < 0:
                return True
            i, previous = end, '"'
            continue
        if char == "/" and _regex_expected(previous):
            end = _regex_end(program, i)
            if end < 0:
                return True
            i, previous = end, '"'
            continue
        if char == "@":
            return True
        if char == "|":
            if program[i + 1 : i + 2] == "|":
                i, previous = i + 2, "||"
                continue
            return True  # a pipe to or from a command, or gawk's |& coprocess
        if char.isalpha() or char == "_":
            match = lazy(r"[A-Za-z_][A-Za-z0-9_]*").match(program, i)
            assert match is not None
            word = match.group()
            if word == "system":
                return True
            i, previous = match.end(), (word if word in _AWK_KEYWORDS_BEFORE_REGEX else "x")
            continue
        if char.isdigit() or char == ".":
            match = lazy(r"[0-9.]+([eE][-+]?[0-9]+)?").match(program, i)
            i, previous = (match.end() if match else i + 1), "x"
            continue
        previous = ")" if char in ")]" else "$" if char == "$" else "op"
        i += 1
    return False


def _regex_expected(previous: str) -> bool:
    if previous in ("", ";", "op", "||", "&&") or previous in _AWK_KEYWORDS_BEFORE_REGEX:
        return True
    return previous not in ("x", '"', ")", "$")


def _string_end(text: str, start: int) -> int:
    i = start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i + 1
        if text[i] == "\n":
            return -1
        i += 1
    return -1


def _regex_end(text: str, start: int) -> int:
    i, bracket = start + 1, False
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if bracket:
            if char == "]":
                bracket = False
        elif char == "[":
            bracket = True
            if text[i + 1 : i + 2] == "]":
                i += 1
        elif char == "/":
            return i + 1
        elif char == "\n":
            return -1
        i += 1
    return -1


# --- sed -------------------------------------------------------------------------------------

_NUMBER = lazy(r"\d+")


def sed_runs_code(script: str) -> bool:
    """Whether a sed script may run a command (the `e` command, or the `e` flag of `s`). A
    variable's value in the script (PART) may stand inside a regex, a replacement or text, never
    where a command or a flag is read."""
    try:
        return _Sed(script).runs_code()
    except (IndexError, ValueError):
        return True


class _Sed:
    def __init__(self, script: str) -> None:
        self.s, self.i = script, 0

    def runs_code(self) -> bool:
        s = self.s
        while self.i < len(s):
            ch = s[self.i]
            if ch in " \t\n;}":
                self.i += 1
                continue
            if ch == "#":
                self._to_eol()
                continue
            self._address()
            self._spaces()
            if self.i < len(s) and s[self.i] == "!":
                self.i += 1
                self._spaces()
            if self.i >= len(s):
                return False
            if self._command(s[self.i]):
                return True
        return False

    def _command(self, cmd: str) -> bool:
        """Read one command at `self.i`; True if it runs code (or is not one sed has)."""
        s = self.s
        self.i += 1
        if cmd == "{":
            return False
        if cmd in "=dDgGhHlLnNpPqQxzF":
            self._spaces()
            match = _NUMBER.match(s, self.i)
            self.i = match.end() if match else self.i
            return False
        if cmd in ":btTv":
            while self.i < len(s) and s[self.i] not in ";\n":
                if s[self.i] == PART:
                    return True
                self.i += 1
            return False
        if cmd in "aicrRwW":
            self._to_eol(continued=cmd in "aic")
            return False
        if cmd == "s":
            delimiter = s[self.i]
            if delimiter in (PART, "\n", "\\"):
                return True
            self.i += 1
            self._part(delimiter)
            self._part(delimiter)
            return self._flags()
        if cmd == "y":
            delimiter = s[self.i]
            if delimiter in (PART, "\n", "\\"):
                return True
            self.i += 1
            self._part(delimiter)
            self._part(delimiter)
            return False
        return True  # `e`, a value where a command is read, or a command sed does not have

    def _flags(self) -> bool:
        s = self.s
        while self.i < len(s) and s[self.i] not in ";\n}":
            if s[self.i] in ("e", PART):
                return True
            if s[self.i] == "w":
                self._to_eol()
                return False
            self.i += 1
        return False

    def _address(self) -> None:
        self._one_address()
        self._spaces()
        if self.i < len(self.s) and self.s[self.i] == ",":
            self.i += 1
            self._spaces()
            if self.i < len(self.s) and self.s[self.i] in "+~":
                self.i += 1
            self._one_address()

    def _one_address(self) -> None:
        s = self.s
        if self.i >= len(s):
            return
        ch = s[self.i]
        if ch.isdigit():
            self.i = _NUMBER.match(s, self.i).end()  # type: ignore[union-attr]
            if self.i < len(s) and s[self.i] == "~":
                self.i += 1
                match = _NUMBER.match(s, self.i)
                self.i = match.end() if match else self.i
        elif ch == "$":
            self.i += 1
        elif ch in "/\\":
            delimiter = "/"
            if ch == "\\":
                delimiter = s[self.i + 1]
                self.i += 1
            self.i += 1
            self._part(delimiter)
            while self.i < len(s) and s[self.i] in "IM":
                self.i += 1

    def _part(self, delimiter: str) -> None:
        """Move past one delimited part (`\\` escapes the next character)."""
        s = self.s
        while True:
            ch = s[self.i]  # IndexError at the end: an unterminated part fails closed
            if ch == "\\":
                self.i += 2
                continue
            self.i += 1
            if ch == delimiter:
                return

    def _spaces(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def _to_eol(self, continued: bool = False) -> None:
        s = self.s
        while self.i < len(s) and s[self.i] != "\n":
            if continued and s[self.i] == "\\":
                self.i += 1
            self.i += 1


# --- ed, and vim's ex commands ----------------------------------------------------------------

_ED_ADDRESS = lazy(r"^\s*(([0-9.$,;+\-]|'[a-z]|/(\\.|[^/])*/?|\?(\\.|[^?])*\??)\s*)*")


def ed_runs_code(script: str) -> bool:
    """Whether an ed script runs a command: `!cmd`, or `r`/`w`/`W`/`e`/`E` with `!cmd`, also
    as the command list of `g`, `G`, `v`, `V`."""
    return any(_ed_command_runs(line) for line in script.split("\n"))


def _ed_command_runs(line: str, depth: int = 0) -> bool:
    if depth > 3:
        return True
    rest = line[_ED_ADDRESS.match(line).end() :]  # type: ignore[union-attr]
    if not rest:
        return False
    command = rest[0]
    if command == "!":
        return True
    if command in "rwWeEf" and rest[1:].lstrip().startswith("!"):
        return True
    if command in "gGvV" and len(rest) > 1:
        delimiter = rest[1]
        end = rest.find(delimiter, 2)
        while end > 0 and rest[end - 1] == "\\":
            end = rest.find(delimiter, end + 1)
        return end < 0 or _ed_command_runs(rest[end + 1 :], depth + 1)
    return False


_EX_READ = frozenset(
    [
        "s",
        "substitute",
        "w",
        "write",
        "wq",
        "x",
        "xit",
        "exit",
        "q",
        "quit",
        "qa",
        "qall",
        "quitall",
        "wqa",
        "wqall",
        "xa",
        "xall",
        "d",
        "delete",
        "set",
        "se",
        "noh",
        "nohlsearch",
        "retab",
        "sort",
        "sor",
        "j",
        "join",
        "m",
        "move",
        "t",
        "co",
        "copy",
        "le",
        "left",
        "ri",
        "right",
        "ce",
        "center",
        "u",
        "undo",
        "red",
        "redo",
        "update",
        "up",
        "y",
        "yank",
        "g",
        "global",
        "v",
        "vglobal",
        "norm-no",
    ]
)
_EX_RANGE = lazy(r"^[\s:]*([%.$,;0-9+\-]|'[<>a-z]|/(\\.|[^/])*/|\?(\\.|[^?])*\?)*\s*")


def ex_runs_code(commands: str) -> bool:
    """Whether vim's ex commands may run code: any command outside a small closed set, `!`,
    `\\=` in a replacement, a backquote in a file name, `w !cmd` / `r !cmd`."""
    if "`" in commands or "\\=" in commands or "system(" in commands:
        return True
    for piece in _ex_split(commands):
        rest = piece[_EX_RANGE.match(piece).end() :]  # type: ignore[union-attr]
        if not rest:
            continue
        if rest[0] in "!&~<>=@*":
            return True
        name = re.match(r"[A-Za-z]*", rest).group()  # type: ignore[union-attr]
        if name not in _EX_READ:
            return True
        argument = rest[len(name) :]
        if argument.startswith("!") and name in ("w", "write", "wq", "x", "xit", "q", "quit",
                                                 "qa", "qall", "quitall", "wqa", "wqall"):  # fmt: skip
            argument = argument[1:]  # `w!`, `q!`: force, not a shell
        if argument.lstrip().startswith("!"):
            return True
        if name in ("g", "global", "v", "vglobal"):
            body = argument.lstrip("!")
            if not body:
                continue
            delimiter = body[0]
            end = body.find(delimiter, 1)
            if end < 0 or ex_runs_code(body[end + 1 :] or "p"):
                return True
        if name in ("set", "se") and re.search(r"\b(shell|sh|shellcmdflag|makeprg|grepprg|"
                                                r"keywordprg|formatprg|equalprg|diffexpr|"
                                                r"patchexpr|packpath|runtimepath|rtp)\b",
                                                argument):  # fmt: skip
            return True
    return False


def _ex_split(commands: str) -> list[str]:
    out, current, i = [], [], 0
    while i < len(commands):
        char = commands[i]
        if char == "\\" and i + 1 < len(commands):
            current.append(commands[i : i + 2])
            i += 2
            continue
        if char in "|\n":
            out.append("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    out.append("".join(current))
    return out


# --- sqlite3 and psql -------------------------------------------------------------------------

_SQLITE_RUNS = lazy(
    r"^\s*\.(sh|she|shel|shell|sy|sys|syst|syste|system|load|lo|loa|excel|www)\b"
    r"|^\s*\.(once|output|out|outp|outpu|import|read|log|o)\s+['\"]?\s*\|",
    re.MULTILINE,
)


def sqlite_runs_code(text: str) -> bool:
    """Whether sqlite3 input runs a command (a dot command of the module docstring, `edit()`)."""
    return bool(_SQLITE_RUNS.search(text)) or bool(re.search(r"\bedit\s*\(", text, re.I))


_PSQL_RUNS = lazy(r"\\!|\\[ogw]\s*\||\\(copy|i|ir|include|include_relative)\b|\bprogram\b",
                        re.I)  # fmt: skip


def psql_runs_code(text: str) -> bool:
    """Whether psql input runs a command on this machine (see the module docstring)."""
    return bool(_PSQL_RUNS.search(text))
