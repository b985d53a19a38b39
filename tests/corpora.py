"""The command corpora of tests/fixtures/commands (the format is in its README.md)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "commands"


@dataclass(frozen=True)
class Entry:
    line: str
    group: str  # the `from:` or `class:` of its group
    tasks: tuple[str, ...] = ()
    denies: str = ""
    bash: bool = True  # a real bash can run it here (ground truth)
    number: int = 0  # its line in the file
    opaque: tuple[str, ...] = ()  # carriers of unread code the policy accepts for it


@dataclass
class _State:
    group: str = ""
    tasks: tuple[str, ...] = ()
    denies: str = ""
    bash: bool = True
    opaque: tuple[str, ...] = ()
    entries: list[Entry] = field(default_factory=list)

    def add(self, line: str, number: int) -> None:
        self.entries.append(
            Entry(line, self.group, self.tasks, self.denies, self.bash, number, self.opaque)
        )


def load(name: str) -> list[Entry]:
    """Every entry of `tests/fixtures/commands/<name>`."""
    state = _State()
    block: list[str] | None = None
    start = 0
    for number, raw in enumerate((FIXTURES / name).read_text().split("\n"), 1):
        if block is not None:
            if raw == "-->8--":
                state.add("\n".join(block), start)
                block = None
            else:
                block.append(raw)
            continue
        if raw == "--8<--":
            block, start = [], number
        elif raw.startswith("# "):
            _directive(state, raw[2:])
        elif raw.strip():
            state.add(raw, number)
    assert block is None, f"{name}: an unclosed --8<-- block"
    return state.entries


def _directive(state: _State, text: str) -> None:
    key, _, value = text.partition(": ")
    if key in ("from", "class"):
        state.group, state.tasks, state.denies, state.bash = value, (), "", True
        state.opaque = ()
    elif key == "opaque":
        state.opaque = tuple(v.strip() for v in value.split(","))
    elif key == "tasks":
        state.tasks = tuple(value.split())
    elif key == "denies":
        state.denies = value
    elif key == "bash":
        state.bash = not value.startswith("no")


def tasks() -> dict[str, dict[str, list[str]]]:
    return tomllib.loads((FIXTURES / "tasks.toml").read_text())
