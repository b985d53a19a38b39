"""Shell command lines, split into the simple commands they run, and matched against the
policy's command globs (`[tools.commands]`).

Best effort by design: a shell is a programming language, and this reads it the way a careful
reviewer would, not the way bash does. It splits on `;`, `&&`, `||`, `|`, `&` and newlines,
descends into subshells `( … )`, `$( … )`, backquotes and `sh -c '…'` / `bash -c "…"` /
`eval`, drops leading `NAME=value` assignments and wrappers (`sudo`, `env`, `command`, `exec`,
`nohup`, `time`, `nice`), and names a program by its basename (`/usr/bin/git` → `git`). A line
it cannot read (an unclosed quote, nesting deeper than `MAX_DEPTH`) is an error, which the
evaluator turns into a deny. The hard boundary is a sandbox, not this parser; docs/hooks.md
says so.

A pattern is a glob over one simple command's words joined by single spaces: `*` is any run of
characters, `?` one character, everything else literal (no brackets). Matching is
case-sensitive. An allow pattern must match a whole simple command; a deny pattern matches if
it matches the command or any word-aligned tail of it (`tails`), so wrappers this parser does
not know still meet it — at the price of denying `echo git push` under `git push*`.
"""

from __future__ import annotations

import re
from functools import lru_cache

MAX_DEPTH = 8
MAX_COMMAND = 100_000  # characters of one command line
MAX_PATTERN = 256
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh"})
WRAPPERS = frozenset({"sudo", "env", "command", "exec", "nohup", "time", "nice", "builtin"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SEPARATORS = frozenset(";&|\n")


class CommandParseError(ValueError):
    """The command line cannot be read reliably (so no rule can be trusted to have seen it)."""


def check_command_pattern(pattern: str) -> str:
    if not pattern.strip():
        raise ValueError("empty command pattern")
    if len(pattern) > MAX_PATTERN:
        raise ValueError(f"command pattern longer than {MAX_PATTERN} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in pattern):
        raise ValueError(f"command pattern {pattern[:40]!r} holds a control character")
    return pattern


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    words = " ".join(pattern.split())
    body = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in words)
    return re.compile(body, re.DOTALL)


def command_matches(pattern: str, command: str) -> bool:
    """`pattern` matches the whole of `command`."""
    return _compiled(pattern).fullmatch(command) is not None


def tails(command: str) -> list[str]:
    """`command` and every word-aligned tail of it, each starting with a program basename:
    what a deny pattern is checked against, so that `sudo -u x git push`, `timeout 5 git push`
    or `xargs git push` still meet `git push*` (an allow pattern must match the whole)."""
    words = command.split(" ")
    return [
        " ".join([words[i].rsplit("/", 1)[-1] or words[i], *words[i + 1 :]])
        for i in range(len(words))
    ]


def simple_commands(line: str) -> list[str]:
    """The simple commands `line` runs, each as its words joined by single spaces (program by
    basename, assignments and wrappers dropped). `CommandParseError` if it cannot be read."""
    if len(line) > MAX_COMMAND:
        raise CommandParseError(f"the command line is longer than {MAX_COMMAND} characters")
    out: list[str] = []
    for words in _Splitter(line, 0).commands():
        out.extend(_normalized(words, 0))
    return [command for command in out if command]


def _normalized(words: list[str], depth: int) -> list[str]:
    while words and (_ASSIGNMENT.match(words[0]) or words[0] in WRAPPERS):
        words = words[1:]
        while words and words[0].startswith("-") and len(words) > 1:  # `env -i`, `nice -n 5`
            words = words[1:]
    if not words:
        return []
    program = words[0].rsplit("/", 1)[-1] or words[0]
    words = [program, *words[1:]]
    if program in SHELLS and "-c" in words[1:]:
        index = words.index("-c")
        if index + 1 < len(words):
            return [*_inner(words[index + 1], depth), " ".join(words[: index + 1])]
    if program == "eval" and len(words) > 1:
        return _inner(" ".join(words[1:]), depth)
    return [" ".join(words)]


def _inner(text: str, depth: int) -> list[str]:
    if depth + 1 > MAX_DEPTH:
        raise CommandParseError(f"commands nested deeper than {MAX_DEPTH} levels")
    out: list[str] = []
    for words in _Splitter(text, depth + 1).commands():
        out.extend(_normalized(words, depth + 1))
    return out


class _Splitter:
    """One pass over a command line: words of simple commands, with nested command text
    (subshells, substitutions) split recursively into commands of their own."""

    def __init__(self, text: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise CommandParseError(f"commands nested deeper than {MAX_DEPTH} levels")
        self.text, self.depth, self.i = text, depth, 0
        self.nested: list[list[str]] = []

    def commands(self) -> list[list[str]]:
        commands: list[list[str]] = []
        words: list[str] = []
        word: list[str] | None = None
        text = self.text
        while self.i < len(text):
            ch = text[self.i]
            if ch in " \t\r":
                if word is not None:
                    words.append("".join(word))
                    word = None
                self.i += 1
            elif ch in _SEPARATORS or (ch in "()" and word is None):
                if word is not None:
                    words.append("".join(word))
                    word = None
                if words:
                    commands.append(words)
                    words = []
                if ch == "(":
                    self.nested.extend(self._sub(self._balanced(self.i + 1, "(", ")")))
                else:
                    self.i += 1
            elif ch == "#" and word is None:
                while self.i < len(text) and text[self.i] != "\n":
                    self.i += 1
            else:
                word = word if word is not None else []
                word.append(self._word_part())
        if word is not None:
            words.append("".join(word))
        if words:
            commands.append(words)
        return commands + self.nested

    def _word_part(self) -> str:
        """One piece of a word: a quoted string, an escape, a substitution, or one character."""
        text, i = self.text, self.i
        ch = text[i]
        if ch == "\\":
            self.i = i + 2
            return text[i + 1 : i + 2]
        if ch == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise CommandParseError("an unclosed single quote")
            self.i = end + 1
            return text[i + 1 : end]
        if ch == '"':
            return self._double_quoted()
        if text.startswith("$(", i):
            inner = self._balanced(i + 2, "(", ")")
            self.nested.extend(self._sub(inner))
            return "$(…)"
        if ch == "`":
            end = text.find("`", i + 1)
            if end < 0:
                raise CommandParseError("an unclosed backquote")
            self.nested.extend(self._sub(text[i + 1 : end]))
            self.i = end + 1
            return "`…`"
        self.i = i + 1
        return ch

    def _double_quoted(self) -> str:
        text = self.text
        self.i += 1
        out: list[str] = []
        while self.i < len(text):
            ch = text[self.i]
            if ch == '"':
                self.i += 1
                return "".join(out)
            if ch == "\\" and self.i + 1 < len(text):
                out.append(text[self.i + 1])
                self.i += 2
            elif text.startswith("$(", self.i):
                self.nested.extend(self._sub(self._balanced(self.i + 2, "(", ")")))
                out.append("$(…)")
            elif ch == "`":
                end = text.find("`", self.i + 1)
                if end < 0:
                    raise CommandParseError("an unclosed backquote")
                self.nested.extend(self._sub(text[self.i + 1 : end]))
                out.append("`…`")
                self.i = end + 1
            else:
                out.append(ch)
                self.i += 1
        raise CommandParseError("an unclosed double quote")

    def _balanced(self, start: int, opening: str, closing: str) -> str:
        """The text from `start` to the matching `closing` (quotes respected); moves past it."""
        text, level, i = self.text, 1, start
        while i < len(text):
            ch = text[i]
            if ch == "\\":
                i += 2
                continue
            if ch in "'\"":
                end = text.find(ch, i + 1)
                if end < 0:
                    raise CommandParseError("an unclosed quote")
                i = end + 1
                continue
            if ch == opening:
                level += 1
            elif ch == closing:
                level -= 1
                if level == 0:
                    self.i = i + 1
                    return text[start:i]
            i += 1
        raise CommandParseError(f"an unclosed {opening!r}")

    def _sub(self, inner: str) -> list[list[str]]:
        commands: list[list[str]] = []
        for words in _Splitter(inner, self.depth + 1).commands():
            commands.append(words)
        return commands
