"""Text bash evaluates as arithmetic, and whether evaluating it may run a command.

bash evaluates arithmetic in `$(( ))`, `$[ ]`, `(( ))`, `for (( ))`, `let`, the subscripts of
indexed arrays (`a[i]`, `${a[i]}`, `unset 'a[i]'`, `test -v 'a[i]'`, `declare 'a[i]=v'`,
`printf -v 'a[i]'`, `read 'a[i]'`), the operands of `[[ … -eq … ]]`, `${x:offset:length}` and
every assignment to a variable declared `-i`. A name in that text is read as a variable whose
*value* is evaluated as arithmetic in turn, and an array subscript met there is expanded first:
a variable holding `a[$(git push)]` runs `git push` when it is read. So arithmetic is safe only
over numbers, operators and variables this line sets to numbers (or to text that is itself safe
arithmetic), and bash's own numeric variables. `doubt` says why not, for text where every
computed part the grammar found is already replaced by a placeholder (`mark`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from loopwarden.policy.commands.regexes import lazy

BASH_NUMBERS = frozenset(
    ["RANDOM", "SRANDOM", "SECONDS", "EPOCHSECONDS", "LINENO", "BASHPID", "PPID", "UID",
     "EUID", "BASH_SUBSHELL", "OPTIND", "HISTCMD", "#", "?", "$", "!"]
)  # fmt: skip
"""Variables bash itself keeps numeric (a value from the environment does not replace them)."""

MARK = "\x01"
"""Opens and closes a placeholder: MARK + its number + MARK."""

_TOKEN = lazy(
    r"\s+|\"|0[xX][0-9a-fA-F]+|[0-9]+#[0-9A-Za-z@_]+|[0-9]+|[A-Za-z_][A-Za-z0-9_]*"
    r"|\x01[0-9]+\x01|\*\*=?|<<=?|>>=?|[-+*/%&|^]=|[!=<>]=|&&|\|\||\+\+|--|[-+*/%<>=!&|^~?:,()]"
)
_ASSIGN = lazy(r"\s*(=(?!=)|[-+*/%&|^]=|<<=|>>=)")
_INCREMENT = lazy(r"\s*(\+\+|--)")

Numeric = Callable[[str], bool]
"""Whether a variable (or a placeholder, by its token) holds a number when the line runs."""


def doubt(text: str, numeric: Numeric, depth: int = 0) -> str | None:
    """Why evaluating `text` as arithmetic may run a command, or None if it cannot."""
    if depth > 4:
        return "arithmetic nests variables too deeply to follow"
    i, n = 0, len(text)
    while i < n:
        match = _TOKEN.match(text, i)
        if match is None:
            char = text[i]
            if char == "`" or text.startswith("$(", i):
                return (
                    "arithmetic holds a command substitution, which bash runs as it evaluates "
                    "the text: compute the value into a variable first"
                )
            if char == "$":
                return "arithmetic holds an expansion loopwarden does not read"
            if char == "[":
                return "arithmetic holds a subscript loopwarden does not read"
            return "arithmetic holds text that is not a number, an operator or a variable"
        token = match.group()
        i = match.end()
        if token[0] == MARK:
            if not numeric(token):
                return "arithmetic evaluates text computed when the line runs"
            continue
        if not (token[0].isalpha() or token[0] == "_"):
            continue
        if i < n and text[i] == "[":
            end = _closing(text, i)
            if end < 0:
                return "arithmetic holds a subscript loopwarden does not read"
            inner = doubt(text[i + 1 : end], numeric, depth + 1)
            if inner is not None:
                return inner
            i = end + 1
        assigned = _ASSIGN.match(text, i)
        if assigned is not None and assigned.group(1) == "=":
            continue  # a plain assignment: the variable is written, not read
        if not numeric(token):
            return (
                "arithmetic reads a variable this line does not set to a number (bash would "
                "evaluate its text, and a subscript there runs a command)"
            )
    return None


def targets(text: str) -> list[str]:
    """Variables the arithmetic `text` assigns (`x = …`, `x += …`, `x++`, `--x`): each holds a
    number afterwards."""
    out = []
    for match in re.finditer(r"(\+\+|--)?\s*([A-Za-z_][A-Za-z0-9_]*)", text):
        name, end = match.group(2), match.end()
        if match.group(1) or _ASSIGN.match(text, end) or _INCREMENT.match(text, end):
            out.append(name)
    return out


def _closing(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "[":
            depth += 1
        elif text[i] == "]":
            depth -= 1
            if depth == 0:
                return i
    return -1


_NUMBER = lazy(r"^\s*[-+]?\s*(0[xX][0-9a-fA-F]+|[0-9]+#[0-9A-Za-z@_]+|[0-9]+)\s*$")


def is_number(text: str) -> bool:
    """Whether `text` is one integer literal as arithmetic reads it (`42`, `-1`, `0x1f`)."""
    return _NUMBER.match(text) is not None
