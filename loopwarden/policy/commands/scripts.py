"""The two inline languages agents use most, read just far enough to tell whether a program
can run a command: awk (`system()`, pipes to and from commands, gawk's indirect calls and
`@load`) and sed (GNU sed's `e` command and `s///e` flag). Anything these readers cannot follow
counts as running code: they fail closed."""

from __future__ import annotations

import re


def awk_runs_code(program: str) -> bool:
    """Whether an awk program may run a command: `system`, any `|` other than `||` (print to or
    getline from a command), or `@` (gawk's indirect function calls, `@load`, `@include`)."""
    text = program.replace("||", "")
    return "system" in text or "|" in text or "@" in text


_NUMBER = re.compile(r"\d+")


def sed_runs_code(script: str) -> bool:
    """Whether a sed script may run a command (the `e` command, or the `e` flag of `s`)."""
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
                self.i += 1
            return False
        if cmd in "aicrRwW":
            self._to_eol(continued=cmd in "aic")
            return False
        if cmd == "s":
            delimiter = s[self.i]
            self.i += 1
            self._part(delimiter)
            self._part(delimiter)
            return self._flags()
        if cmd == "y":
            delimiter = s[self.i]
            self.i += 1
            self._part(delimiter)
            self._part(delimiter)
            return False
        return True  # `e`, or a command sed does not have

    def _flags(self) -> bool:
        s = self.s
        while self.i < len(s) and s[self.i] not in ";\n}":
            if s[self.i] == "e":
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
