"""Regular expressions compiled on first use: the readers' and tables' patterns (git's setting
keys, node's safe options, awk's tokens, …) cost nothing at import, so that a hook process
deciding a short line compiles only the ones that line needs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, AnyStr, Generic


class Lazy(Generic[AnyStr]):
    """A pattern compiled the first time it is used (the methods of `re.Pattern` it offers)."""

    __slots__ = ("_compiled", "flags", "pattern")

    def __init__(self, pattern: AnyStr, flags: int = 0) -> None:
        self.pattern: AnyStr = pattern
        self.flags = flags
        self._compiled: re.Pattern[AnyStr] | None = None

    @property
    def compiled(self) -> re.Pattern[AnyStr]:
        if self._compiled is None:
            self._compiled = re.compile(self.pattern, self.flags)
        return self._compiled

    def match(self, text: AnyStr, pos: int = 0) -> re.Match[AnyStr] | None:
        return self.compiled.match(text, pos)

    def fullmatch(self, text: AnyStr) -> re.Match[AnyStr] | None:
        return self.compiled.fullmatch(text)

    def search(self, text: AnyStr) -> re.Match[AnyStr] | None:
        return self.compiled.search(text)

    def split(self, text: AnyStr) -> list[Any]:
        return self.compiled.split(text)

    def finditer(self, text: AnyStr) -> Iterator[re.Match[AnyStr]]:
        return self.compiled.finditer(text)


def lazy(pattern: AnyStr, flags: int = 0) -> Lazy[AnyStr]:
    return Lazy(pattern, flags)
