"""Plainly literal bash lines, read without the grammar: a fast path that gives the reading
exactly what the bash reader would (one command, its words as written), for lines whose text
leaves bash nothing to interpret.

A line takes it only if it is simple words of plain characters (ASCII letters and digits and
`_ - . / : , @ + %`, and `=` after the first word) separated by single spaces, and no word is a
reserved word or a keyword the grammar reads as a statement of its own (`declare`, `unset`, …).
Anything else — quotes, `$`, backquotes, globs, braces, `~`, `#`, `!`, redirections, control
operators, a tab, a newline, a backslash, non-ASCII text, an assignment, a doubled or outer
space — is read by the grammar (`bash.py`). What the reading then does with the command (the
carriers, the tables, the rules) is the same code either way. Tests hold the two paths equal on
every corpus, on generated lines and on lines a property draws (tests/test_literal_lines.py).
"""

from __future__ import annotations

import re

from loopwarden.policy.commands.words import Word

_PLAIN = re.compile(r"[A-Za-z0-9_./:,@+%-]+(?: [A-Za-z0-9_./:,@+%=-]+)*")
"""Words of plain characters, single spaces between them, no `=` in the first."""

RESERVED = frozenset(
    {"!", "case", "coproc", "do", "done", "elif", "else", "esac", "fi", "for", "function",
     "if", "in", "select", "then", "time", "until", "while", "{", "}", "[[", "]]",
     "declare", "typeset", "export", "readonly", "local", "unset", "unsetenv"}
)  # fmt: skip
"""Bash's reserved words, and the builtins the grammar reads as statements of their own: a
line holding one, anywhere, is read by the grammar."""

_MAX = 4_096  # characters: a longer line is read by the grammar


def argv(text: str) -> tuple[Word, ...] | None:
    """The words of `text` if it is plainly literal (see the module docstring), else None."""
    if len(text) > _MAX or not _PLAIN.fullmatch(text):
        return None
    names = text.split(" ")
    if not RESERVED.isdisjoint(names):
        return None
    return tuple(map(Word, names))
