"""The parameter expansions loopwarden reads (`${…}`), modelled from their text the way bash
reads them, and those it does not: a form outside this model is a doubt.

Read: `${name}`, `${name[i]}`, `${#name}`, `${#name[@]}`, `${name[@]}`, `${!name[@]}` (keys),
`${!prefix*}` / `${!prefix@}` (names), the default and test forms (`:-`, `-`, `:=`, `=`, `:+`,
`+`, `:?`, `?`), pattern removal and replacement (`#`, `##`, `%`, `%%`, `/`, `//`, `/#`, `/%`),
case changes (`^`, `^^`, `,`, `,,`), substrings (`:offset:length`, arithmetic) and the
transformations `@Q @E @A @a @K @k @L @U @u`. Doubts: `${name@P}` (prompt expansion runs the
value's `$( … )`), an indirect `${!name}` (the value names a variable, and a subscript there is
evaluated), and anything else this model does not name. Subscripts of indexed arrays and
substring bounds are arithmetic (`arithmetic.py`).
"""

from __future__ import annotations

from typing import NamedTuple

from loopwarden.policy.commands.regexes import lazy

_NAME = lazy(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!0-]")
_OPERATORS = (
    ":-", ":=", ":+", ":?", "-", "=", "+", "?", "##", "#", "%%", "%", "//", "/#", "/%", "/",
    "^^", "^", ",,", ",", "@", ":",
)  # fmt: skip
_TRANSFORMS = frozenset("QEAaKkLUu")
DEFAULTS = frozenset({":-", "-", ":=", "=", ":+", "+", ":?", "?"})


class Expansion(NamedTuple):
    """One `${…}` as bash reads it: `prefix` "", "#" (length) or "!" (indirection, keys or
    names), the variable `name`, its subscript text (None: none), the operator and the text
    after it."""

    prefix: str
    name: str
    subscript: str | None
    operator: str
    rest: str

    @property
    def length(self) -> bool:
        """`${#x}`, `${#a[@]}`: a number."""
        return self.prefix == "#"

    @property
    def all_elements(self) -> bool:
        """`${a[@]}`, `${a[*]}`, `$@`: every element (several words when quoted with @)."""
        return self.subscript in ("@", "*") or self.name in ("@", "*")

    @property
    def plain(self) -> bool:
        """The value of one variable, nothing else: `${x}`, `${a[@]}`."""
        return not self.prefix and not self.operator


def parse(raw: str) -> Expansion | None:
    """`raw` (`${…}`, braces included) as bash reads it, or None if it is not a form above."""
    if not raw.startswith("${") or not raw.endswith("}"):
        return None
    inner = raw[2:-1]
    prefix = ""
    if inner[:1] in ("#", "!") and len(inner) > 1 and inner[1] not in "}:-=+?%/":
        prefix, inner = inner[0], inner[1:]
    match = _NAME.match(inner)
    if match is None:
        return None
    name, rest = match.group(), inner[match.end() :]
    index = None
    if rest.startswith("["):
        end = _closing(rest)
        if end < 0:
            return None
        index, rest = rest[1:end], rest[end + 1 :]
    if prefix == "!" and rest in ("*", "@") and index is None:
        return Expansion("!", name, None, rest, "")  # ${!prefix*}: names
    if not rest:
        return Expansion(prefix, name, index, "", "")
    if prefix:
        return None  # ${#x:-y} and the like are not bash
    operator = next((op for op in _OPERATORS if rest.startswith(op)), None)
    if operator is None:
        return None
    value = rest[len(operator) :]
    if operator == "@" and (len(value) != 1 or value not in _TRANSFORMS):
        return None if value != "P" else Expansion("", name, index, "@", "P")
    return Expansion("", name, index, operator, value)


def doubt(expansion: Expansion) -> str | None:
    """What in the form itself may run a command (the reader checks its parts as well)."""
    if expansion.operator == "@" and expansion.rest == "P":
        return (
            "`${…@P}` expands a variable's value as a prompt, which runs the `$( … )` in it: "
            "use the value without @P"
        )
    return None


def substring(rest: str) -> tuple[str, str]:
    """The offset and length texts of `${x:offset:length}` (both arithmetic)."""
    depth = 0
    for i, char in enumerate(rest):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char == ":" and depth == 0 and not rest[:i].rstrip().endswith("?"):
            return rest[:i], rest[i + 1 :]
    return rest, ""


def _closing(text: str) -> int:
    depth = 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                return i
    return -1
