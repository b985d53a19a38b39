"""Glob patterns over dotted tool names (`fs.read`, `deploy.*`).

Grammar, deliberately small so a pattern means the same thing to every reader:
- a tool name is dot-separated segments of `[A-Za-z0-9_-]`, at most 128 characters;
- a pattern may also use `*` (any run of characters, dots included) and `?` (one character);
- anything else (brackets, spaces, empty segments) is a policy error, never a silent non-match.
Matching is case-sensitive.
"""

from __future__ import annotations

import re
from functools import lru_cache

from loopwarden.errors import clip

TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
_PATTERN_RE = re.compile(r"^[A-Za-z0-9_*?-]+(\.[A-Za-z0-9_*?-]+)*$")
MAX_NAME_LENGTH = 128
SHELL = "shell.run"
"""The policy name of every host's shell tools: the one tool command rules (`[tools.commands]`)
are about."""


def is_tool_name(name: str) -> bool:
    return len(name) <= MAX_NAME_LENGTH and TOOL_NAME_RE.fullmatch(name) is not None


def check_pattern(pattern: str) -> str:
    """Return `pattern` if it is a valid tool glob, else raise `ValueError` saying why."""
    if not pattern:
        raise ValueError("empty tool pattern")
    if len(pattern) > MAX_NAME_LENGTH:
        raise ValueError(
            f"tool pattern {clip(repr(pattern))} is longer than {MAX_NAME_LENGTH} characters"
        )
    if _PATTERN_RE.fullmatch(pattern) is None:
        raise ValueError(
            f"invalid tool pattern {clip(repr(pattern))}: use dot-separated segments of letters, digits, "
            "'_' or '-', with '*' (any characters) and '?' (one character) as wildcards"
        )
    return pattern


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    body = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    return re.compile(body, re.DOTALL)


def matches(pattern: str, name: str) -> bool:
    """True if the tool `name` matches the glob `pattern` (the whole name, case-sensitive)."""
    return _compiled(pattern).fullmatch(name) is not None


def first_match(patterns: tuple[str, ...], name: str) -> str | None:
    """The first pattern (in the policy's normalized order) matching `name`, or None."""
    for pattern in patterns:
        if matches(pattern, name):
            return pattern
    return None
