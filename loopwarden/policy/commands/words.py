"""A word of a command as the shell will pass it: its text after quote removal, or why that
text is not known before the command runs.

A shell word is literal only when no expansion can change it: quotes removed, backslash
escapes and ANSI-C quotes (`$'\\x67it'`) decoded. Parameter expansion, command substitution,
arithmetic, brace expansion and unquoted glob characters make it *computed*: `text` is None and
`kind` says which construct (never the word itself, which may hold a secret). `lead` is the
literal text it starts with (so `-$x` is known to be a flag and `./$x` known not to be), and
`splits` says an unquoted expansion may turn it into several words or none. A word computed
only from variables (`"$x"`, `s/a/${B}/`) also keeps their names (`params`) and its literal
text with each of them marked (`template`), so that a reader can tell what it may become.
"""

from __future__ import annotations

import re
from typing import NamedTuple

GLOB = "a glob pattern"
BRACES = "brace expansion"
PARAMETER = "a parameter expansion"
SUBSTITUTION = "a command substitution"
PROCESS = "a process substitution"
ARITHMETIC = "an arithmetic expansion"
FROM_INPUT = "filled in from input when it runs"
UNREADABLE = "a construct loopwarden does not read"


PART = "\0"
"""Where a variable's value stands in a computed word's `template`."""


class Word(NamedTuple):
    """One argv word. `text` is the exact value the program receives, or None if computed."""

    text: str | None
    kind: str = ""  # why it is computed (one of the constants above)
    lead: str = ""  # the literal text a computed word starts with
    splits: bool = False  # an unquoted expansion: may become several words, or none
    params: tuple[str, ...] | None = None  # the variables it is made of, if nothing else
    template: str = ""  # its text with each of `params` as PART

    @staticmethod
    def of(text: str) -> Word:
        return Word(text)

    @property
    def literal(self) -> bool:
        return self.text is not None

    @property
    def may_be_flag(self) -> bool:
        """Whether the program may read it as an option (it starts, or may start, with `-`).
        A glob with a literal start names files that start with it (`build/*.o`), so it is
        never an option however many words it becomes."""
        if self.text is not None:
            return self.text.startswith("-") and self.text != "-"
        if self.kind == GLOB and self.lead and not self.lead.startswith("-"):
            return False
        return self.splits or not self.lead or self.lead.startswith("-")


def computed(kind: str, lead: str = "", splits: bool = False) -> Word:
    return Word(None, kind, lead, splits)


class Pieces:
    """Builds one word from its parts: literal characters (each marked quoted or not, so that
    glob and brace characters count only unquoted) and computed parts."""

    def __init__(self) -> None:
        self.chars: list[tuple[str, bool]] = []
        self.kind = ""
        self.lead: str | None = None  # the literal text before the first computed part
        self.splits = False
        self.params: list[str] | None = []

    def text(self, text: str, quoted: bool) -> None:
        self.chars.extend((ch, quoted) for ch in text)

    def computed(self, kind: str, splits: bool, param: str | None = None) -> None:
        """A computed part: `param` names the variable it is (`$x`, `${x}`), if it is one."""
        if not self.kind:
            self.kind = kind
            self.lead = "".join(ch for ch, _ in self.chars)
        self.splits = self.splits or splits
        if param is None or self.params is None:
            self.params = None
        else:
            self.params.append(param)
            self.chars.append((PART, True))

    def word(self) -> Word:
        if self.kind:
            if self.params is None:
                return Word(None, self.kind, self.lead or "", self.splits)
            template = "".join(ch for ch, _ in self.chars)
            params = tuple(self.params)
            return Word(None, self.kind, self.lead or "", self.splits, params, template)
        text = "".join(ch for ch, _ in self.chars)
        unquoted = "".join(ch if not quoted else "\0" for ch, quoted in self.chars)
        if has_braces(unquoted):
            return Word(None, BRACES, _lead(self.chars, "{"), True)
        if has_glob(unquoted):
            return Word(None, GLOB, _lead(self.chars, "*?["), True, None, text)
        return Word(text)


def _lead(chars: list[tuple[str, bool]], specials: str) -> str:
    out = []
    for ch, quoted in chars:
        if not quoted and ch in specials:
            break
        out.append(ch)
    return "".join(out)


_GLOB = re.compile(r"[*?]|\[[^\]]*\]")


def has_glob(unquoted: str) -> bool:
    """Unquoted `*`, `?` or a bracket expression (quoted characters are NUL in `unquoted`)."""
    return _GLOB.search(unquoted) is not None


def has_braces(unquoted: str) -> bool:
    """An unquoted `{…,…}` or `{a..b}`: bash expands it into several words."""
    depth, starts = 0, []
    for i, ch in enumerate(unquoted):
        if ch == "{":
            starts.append(i)
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            inner = unquoted[starts.pop() + 1 : i]
            if "," in inner or re.fullmatch(r"[^.]+\.\.[^.]+(\.\.[^.]+)?", inner):
                return True
    return False


_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}
_NUMERIC = r"[0-7]{1,3}|x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|c."


def ansi_c(body: str) -> str:
    """The value of `$'body'` as bash decodes it (a NUL ends the string, as in bash)."""
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\" or i + 1 == len(body):
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
            continue
        match = re.compile(_NUMERIC).match(body, i + 1)
        if match is None:
            out.append("\\" + nxt)
            i += 2
            continue
        code = match.group()
        if code[0] == "c":
            out.append(chr(ord(code[1]) & 0x1F))
        elif code[0] in "xuU":
            out.append(chr(min(int(code[1:], 16), 0x10FFFF)))
        else:
            out.append(chr(int(code, 8) & 0xFF))
        i = match.end()
    text = "".join(out)
    return text.split("\0", 1)[0]


def unescape_unquoted(raw: str, pieces: Pieces) -> None:
    """An unquoted word's text into `pieces`: `\\x` is a quoted `x`, `\\<newline>` nothing."""
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\\" and i + 1 < len(raw):
            if raw[i + 1] != "\n":
                pieces.text(raw[i + 1], quoted=True)
            i += 2
            continue
        pieces.text(ch, quoted=False)
        i += 1


def unescape_double(raw: str) -> str:
    """The text of a double-quoted part: a backslash escapes only `$`, backquote, `"`, `\\`
    and a newline."""
    out, i = [], 0
    while i < len(raw):
        ch = raw[i]
        if ch == "\\" and i + 1 < len(raw) and raw[i + 1] in '$`"\\\n':
            if raw[i + 1] != "\n":
                out.append(raw[i + 1])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def filled(word: Word, mark: str, path: bool = False) -> Word:
    """A word with `mark` in it, as `xargs -I` or `find -exec` fill it in from input (a
    `path` from find starts with its starting point, never with `-`)."""
    if word.text is None or mark not in word.text:
        return word
    lead = word.text.split(mark, 1)[0]
    return computed(FROM_INPUT, lead=lead or ("./" if path else ""))


def joined(words: tuple[Word, ...]) -> Word:
    """Words a launcher joins with spaces and hands to a shell; computed if any is."""
    for word in words:
        if word.text is None:
            return word
    return Word(" ".join(w.text or "" for w in words))
