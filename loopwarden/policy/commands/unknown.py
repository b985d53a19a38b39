"""Class (c) of the three classes of programs (docs/hooks.md, "Command rules"): a program no
table knows. Whether it runs its arguments is not known (`chrt`, a project's `./run.sh`, a
launcher written last week), so when its words — or a here-document it reads — name a program
a rule is about, the line is a doubt: "cannot tell whether `chrt` runs `git`".

A literal word names a program when one of its shell words does (quotes and backslashes
removed: the program may hand it to a shell), by basename (`/usr/bin/git`, `git-push`); a word
holding `$( … )`, backquotes or escapes such a shell would decode may name anything. A computed
word may name it when its literal start could begin that name (`gi$x`, `$(…)`, `./*`), or when a
variable the line sets holds it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from loopwarden.policy.commands.programs import program_name
from loopwarden.policy.commands.reading import shown
from loopwarden.policy.commands.regexes import lazy
from loopwarden.policy.commands.rules import glob_matches
from loopwarden.policy.commands.words import PART, Word

if TYPE_CHECKING:
    from loopwarden.policy.commands.reading import Reading
    from loopwarden.policy.commands.runs import Run

_SEPARATORS = lazy(r"[^A-Za-z0-9._+/\\-]+")  # a program name is made of these
_SHELL_CODE = lazy(r"\$\(|`|\$'|\$\{|\\[xu0-7]")


def names(programs: tuple[str, ...], run: Run, reading: Reading) -> str | None:
    """The first of `programs` the words of the unknown program `run` may name, or None."""
    if not programs:
        return None
    if run.tail:
        return programs[0]  # words added from input (`xargs`, `find -exec … +`) may name it
    words = [*run.argv[1:], *run.env]
    if run.input is not None:
        words.append(run.input)
    for word in words:
        for program in programs:
            if _names(word, program, reading):
                return program
    return None


def why(run: Run, program: str) -> str:
    who = shown(run)
    return (
        f"cannot tell whether {who} runs `{program}`: loopwarden does not know {who}, and what "
        f"it is given may name `{program}`; run `{program}` directly, or leave it out of the "
        f"words given to {who}"
    )


def _names(word: Word, program: str, reading: Reading) -> bool:
    if word.text is not None:
        return _text_names(word.text, program)
    if word.params is not None:
        from loopwarden.policy.commands.shells import templates

        texts = templates(reading, word)
        if texts is not None:
            return any(_text_names(t.replace(PART, ""), program) for t in texts)
    return _lead_names(word.lead, program)


def _text_names(text: str, program: str) -> bool:
    if _SHELL_CODE.search(text):
        return True
    plain = text.replace("\\", "").replace("'", "").replace('"', "")
    for token in _SEPARATORS.split(plain):
        if token and _program_is(program_name(token), program):
            return True
    return False


def _program_is(name: str, program: str) -> bool:
    return glob_matches(program, name) or (program == "git" and name.startswith("git-"))


def _lead_names(lead: str, program: str) -> bool:
    """Whether a computed word starting with `lead` may be a word naming `program`."""
    if any(ch in program for ch in "*?"):
        return True
    plain = lead.replace("\\", "").replace("'", "").replace('"', "")
    token = _SEPARATORS.split(plain)[-1] if plain else ""
    base = re.split(r"[/\\]", token)[-1].lower()
    return program.startswith(base)
