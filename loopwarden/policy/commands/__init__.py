"""Shell command lines read with a real grammar and judged against `[tools.commands]`, in a
closed world: a line is admitted only when every construct in it was understood.

`lines.py` reads a line into the commands it runs (a `Reading`, `reading.py`): the readers
`bash.py` (statements) with `evaluation.py` (words, `expansions.py`, `arithmetic.py`) and
`powershell.py` report each command; `carriers.py` reads what each one runs in turn, by the
class of its program — launchers (`launchers.py`), shells and interpreters (`shells.py`,
`interpreters.py`), builtins (`bashbuiltins.py`, `variables.py`), git (`configs.py`), programs
known not to run commands with the options that would (`bystanders.py`, `readers.py`,
`scripts.py`) — and `unknown.py` judges the rest. `rules.py` reads and matches rules over argv
with the programs of `programs.py` and the option grammars of `options.py`; `verdicts.py`
judges a line. The grammars and the tables are imported only when a line must be decided
(`judge_line`), so a hook that decides no shell line pays nothing for them.

What the reader guarantees, and what it does not (a sandbox is still the hard boundary), is
in docs/hooks.md, "Command rules".
"""

from __future__ import annotations

MAX_COMMAND = 100_000  # characters of one command line
MAX_RULE = 256


def check_command_pattern(text: str) -> str:
    """`text` if it is a valid command rule, else `ValueError` saying why (the policy model's
    check; the rule's meaning is read when a line is judged)."""
    if not text.strip():
        raise ValueError("empty command pattern")
    if len(text) > MAX_RULE:
        raise ValueError(f"command pattern longer than {MAX_RULE} characters")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise ValueError(f"command pattern {text[:40]!r} holds a control character")
    return text
