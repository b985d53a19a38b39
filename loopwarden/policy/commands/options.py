"""Reading a program's options the way its own parser does: one `Grammar` per program (which
options take a value, which spellings mean the same option, whether short options cluster) and
one scanner over argv words for all of them.

Every spelling of an option comes out under one canonical name: `-fr`, `-r -f`, `-Rf` and
`--recursive --force` are the same two options of `rm`; `-XPOST`, `-X POST` and
`--request=POST` the same option and value of `curl`. A computed word where an option could be
is reported (`maybe_option`), never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from loopwarden.policy.commands.words import Word

_EMPTY: Mapping[str, str] = MappingProxyType({})


class Grammar(NamedTuple):
    """How one program reads its options.

    `values` take an argument (glued `-n5`, `--lines=5`, or the next word); `optional` take one
    only when glued (`-i.bak`, `--color=auto`); `aliases` map a spelling to the canonical name;
    `clusters`: `-abc` is `-a -b -c` (GNU and POSIX programs), else it is one option (`find
    -name`, `terraform -chdir=d`); `permute`: options may follow operands (GNU), else the first
    operand ends them (launchers, POSIX); `plus`: `+o` options (shells). Any word starting with
    `-` is an option (`-0`, `-10` too), `--` ends them."""

    values: frozenset[str] = frozenset()
    optional: frozenset[str] = frozenset()
    aliases: Mapping[str, str] = _EMPTY
    clusters: bool = True
    permute: bool = True
    plus: bool = False

    def canonical(self, name: str) -> str:
        return self.aliases.get(name, name)

    def takes_value(self, name: str) -> bool:
        return name in self.values or self.canonical(name) in self.values


def grammar(
    values: str = "",
    optional: str = "",
    aliases: Mapping[str, str] | None = None,
    **flags: bool,
) -> Grammar:
    """A `Grammar` from space-separated option lists (how the tables are written)."""
    return Grammar(
        frozenset(values.split()),
        frozenset(optional.split()),
        MappingProxyType(dict(aliases or {})),
        **flags,
    )


class Option(NamedTuple):
    name: str  # canonical
    value: Word | None
    at: int  # index of the word it was read from


class Scan:
    """Options and operands of an argv tail. `rest` is where scanning stopped (the first
    operand, without `permute`); `maybe_option` says a computed word may be an option;
    `shifted` that an unquoted expansion may add or remove words (positions after it are not
    known); `ended` that `--` ended the options."""

    __slots__ = ("ended", "maybe_option", "operands", "options", "rest", "shifted")

    def __init__(self, rest: int = 0) -> None:
        self.options: list[Option] = []
        self.operands: list[tuple[int, Word]] = []
        self.rest = rest
        self.maybe_option = False
        self.shifted = False
        self.ended = False

    def has(self, *names: str) -> bool:
        return any(option.name in names for option in self.options)

    def value(self, *names: str) -> Word | None:
        for option in self.options:
            if option.name in names:
                return option.value
        return None


def scan(g: Grammar, words: tuple[Word, ...], start: int = 0, stop: bool = False) -> Scan:
    """Read `words[start:]` with `g`. With `stop` (or a grammar that does not permute), the
    first operand ends the scan (`rest` is its index)."""
    out = Scan(rest=len(words))
    i = start
    stop = stop or not g.permute
    while i < len(words):
        word = words[i]
        text = word.text
        if text is None:
            out.shifted = out.shifted or word.splits
            out.maybe_option = out.maybe_option or (not out.ended and word.may_be_flag)
        elif not out.ended and text == "--":
            out.ended = True
            i += 1
            continue
        elif not out.ended and _is_option(g, text):
            i = _option(g, words, i, out)
            continue
        if stop:  # an operand (or a computed word) ends the options here
            out.rest = i
            return out
        out.operands.append((i, word))
        i += 1
    return out


def _is_option(g: Grammar, text: str) -> bool:
    # `-0` and `-10` are options too (xargs -0, nice -10): read as operands, they would move
    # where a launcher's command starts.
    if text.startswith("-") and text != "-":
        return True
    return g.plus and text.startswith("+") and len(text) > 1


def _option(g: Grammar, words: tuple[Word, ...], i: int, out: Scan) -> int:
    """Read the option word at `i` (and its value); the index after it."""
    text = words[i].text or ""
    if text.startswith("--") or not g.clusters:
        name, eq, glued = text.partition("=")
        if eq:
            out.options.append(Option(g.canonical(name), Word(glued), i))
            return i + 1
        if g.takes_value(name) and name not in g.optional:
            return _valued(g, name, words, i, out)
        out.options.append(Option(g.canonical(name), None, i))
        return i + 1
    sign = text[0]
    letters = text[1:]
    for n, letter in enumerate(letters):
        name = sign + letter
        rest = letters[n + 1 :]
        if name in g.optional:
            out.options.append(Option(g.canonical(name), Word(rest) if rest else None, i))
            return i + 1
        if g.takes_value(name):
            if rest:
                out.options.append(Option(g.canonical(name), Word(rest), i))
                return i + 1
            return _valued(g, name, words, i, out)
        out.options.append(Option(g.canonical(name), None, i))
    return i + 1


def _valued(g: Grammar, name: str, words: tuple[Word, ...], i: int, out: Scan) -> int:
    """An option whose value is the next word (an unquoted expansion there shifts the rest)."""
    value = words[i + 1] if i + 1 < len(words) else None
    out.shifted = out.shifted or (value is not None and value.splits)
    out.options.append(Option(g.canonical(name), value, i))
    return i + 2
