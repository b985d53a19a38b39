"""Reading a program's options the way its own parser does: one `Grammar` per program (which
options take a value, which spellings mean the same option, whether short options cluster) and
one scanner over argv words for all of them.

Every spelling of an option comes out under one canonical name: `-fr`, `-r -f`, `-Rf` and
`--recursive --force` are the same two options of `rm`; `-XPOST`, `-X POST` and
`--request=POST` the same option and value of `curl`. A computed word where an option could be
is reported (`maybe_option`), never guessed.
"""

from __future__ import annotations

import re
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
    `-` is an option (`-0`, `-10` too), `--` ends them.

    `flags` lists the options that take no value and `closed` says the lists are the program's
    whole grammar: an option outside them is reported (`Scan.unknown`), since the program may
    read the next word as its value. A long option is also read by any unambiguous prefix of
    the long options the grammar names (`--sig` is `--signal`), as getopt_long reads it."""

    values: frozenset[str] = frozenset()
    optional: frozenset[str] = frozenset()
    aliases: Mapping[str, str] = _EMPTY
    clusters: bool = True
    permute: bool = True
    plus: bool = False
    flags: frozenset[str] = frozenset()
    closed: bool = False
    longs: tuple[str, ...] = ()  # every long option named above, for prefixes (derived)
    numbers: bool = False  # `-5` is an option with a number (`nice -5`), read as `-N`
    ends: frozenset[str] = frozenset()  # options after which no option is read (python -m)
    octal: frozenset[str] = frozenset()  # optional values of octal digits only (perl -l, -0)

    def canonical(self, name: str) -> str:
        return self.aliases.get(name, name)

    def takes_value(self, name: str) -> bool:
        return name in self.values or self.canonical(name) in self.values

    def knows(self, name: str) -> bool:
        return (
            name in self.values
            or name in self.optional
            or name in self.flags
            or name in self.aliases
            or self.canonical(name) in self.flags
        )

    def long_name(self, given: str) -> str:
        """The long option `given` names: itself if the grammar knows it, else the one long
        option it is a prefix of (getopt_long), else itself."""
        if not self.longs or self.knows(given):
            return given
        found = [name for name in self.longs if name.startswith(given)]
        if len(found) > 1:  # `--fo` for --force and --format: a prefix of one canonical name?
            found = list(dict.fromkeys(self.canonical(name) for name in found))
        return found[0] if len(found) == 1 else given


def grammar(
    values: str = "",
    optional: str = "",
    aliases: Mapping[str, str] | None = None,
    flags: str | None = None,
    *,
    clusters: bool = True,
    permute: bool = True,
    plus: bool = False,
    numbers: bool = False,
) -> Grammar:
    """A `Grammar` from space-separated option lists (how the tables are written). Giving
    `flags` (even empty) closes the grammar: it is then the program's whole option list."""
    value_set, optional_set = frozenset(values.split()), frozenset(optional.split())
    flag_set = frozenset((flags or "").split())
    mapping = dict(aliases or {})
    longs = sorted(
        {n for n in (*value_set, *optional_set, *flag_set, *mapping) if n.startswith("--")}
    )
    return Grammar(
        value_set,
        optional_set,
        MappingProxyType(mapping),
        clusters=clusters,
        permute=permute,
        plus=plus,
        flags=flag_set,
        closed=flags is not None,
        longs=tuple(longs),
        numbers=numbers,
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

    __slots__ = ("ended", "maybe_option", "operands", "options", "rest", "shifted", "unknown")

    def __init__(self, rest: int = 0) -> None:
        self.options: list[Option] = []
        self.operands: list[tuple[int, Word]] = []
        self.rest = rest
        self.maybe_option = False
        self.shifted = False
        self.ended = False
        self.unknown = False  # an option a closed grammar does not list

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
            out.maybe_option = out.maybe_option or (
                not out.ended and word.may_be_flag and not _never_option(g, word)
            )
        elif not out.ended and text == "--":
            out.ended = True
            i += 1
            continue
        elif not out.ended and _is_option(g, text):
            i = _option(g, words, i, out)
            if g.ends and out.options and out.options[-1].name in g.ends:
                out.rest = i
                if not stop:
                    out.operands.extend((n, words[n]) for n in range(i, len(words)))
                return out
            continue
        if stop:  # an operand (or a computed word) ends the options here
            out.rest = i
            return out
        out.operands.append((i, word))
        i += 1
    return out


def _never_option(g: Grammar, word: Word) -> bool:
    """A glob whose every match holds a character no option of a closed grammar can hold
    (`*.pyc` for rm: `-r.pyc` is an invalid option, which rm refuses before doing anything)."""
    if not g.closed or word.template == "" or word.params is not None or "=" in word.template:
        return False
    if any(len(name) == 2 and name[0] == "-" for name in (*g.values, *g.optional)):
        return False  # `-o.pyc` would be -o with a value
    letters = {name[1] for name in (*g.flags, *g.aliases) if len(name) == 2 and name[0] == "-"}
    letters.update(ch for name in g.longs for ch in name)  # a prefix of one is that option too
    literal = re.sub(r"\[[^\]]*\]|[*?]", "", word.template)
    return any(not (ch in letters or ch == "-") for ch in literal)


def _is_option(g: Grammar, text: str) -> bool:
    # `-0` and `-10` are options too (xargs -0, nice -10): read as operands, they would move
    # where a launcher's command starts.
    if text.startswith("-") and text != "-":
        return True
    return g.plus and text.startswith("+") and len(text) > 1


def _option(g: Grammar, words: tuple[Word, ...], i: int, out: Scan) -> int:
    """Read the option word at `i` (and its value); the index after it."""
    text = words[i].text or ""
    if g.numbers and text[1:].isdigit():
        out.options.append(Option("-N", Word(text[1:]), i))
        return i + 1
    if text.startswith("--") or not g.clusters:
        name, eq, glued = text.partition("=")
        if name.startswith("--"):
            name = g.long_name(name)
        if g.closed and not g.knows(name):
            out.unknown = True
        if eq:
            out.options.append(Option(g.canonical(name), Word(glued), i))
            return i + 1
        if g.takes_value(name) and name not in g.optional:
            return _valued(g, name, words, i, out)
        out.options.append(Option(g.canonical(name), None, i))
        return i + 1
    sign = text[0]
    letters = text[1:]
    skip = 0
    for n, letter in enumerate(letters):
        if skip:
            skip -= 1
            continue
        name = sign + letter
        rest = letters[n + 1 :]
        if g.closed and not g.knows(name):
            out.unknown = True
        if name in g.octal:  # `-lane` is -l -a -n -e; `-0777`, `-0x1F` take their digits
            digits = re.match(r"x[0-9A-Fa-f]*|[0-7]*", rest).group()  # type: ignore[union-attr]
            out.options.append(Option(g.canonical(name), Word(digits) if digits else None, i))
            skip = len(digits)
            continue
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
