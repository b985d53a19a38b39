"""What a provider's answer says a call used, read as it streams by.

A `UsageReader` is fed the response's bytes chunk by chunk as they go to the client (it never
holds the stream back) and keeps the latest usage figures it has seen: a stream cut at any point
is charged what had been observed by then. Each provider's reader knows where its API puts usage
(`anthropic_api.py`, `openai_api.py`, `gemini_api.py`); this module has what they share: the
counts, a bounded server-sent-events splitter, and a bounded JSON body.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MAX_EVENT = 4 * 1024 * 1024
"""The longest server-sent event a reader parses (a longer one is skipped, not buffered)."""
MAX_BODY = 8 * 1024 * 1024
"""The largest non-streamed answer a reader parses for its usage."""


@dataclass
class Counts:
    """Tokens of one call: uncached input, output (reasoning included), written to and read
    from the prompt cache. `seen`: some usage figure was read from the answer."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    seen: bool = False
    complete: bool = False  # the answer's final figures were read (not cut before them)

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_write_tokens + self.cache_read_tokens


def count(value: Any) -> int:
    """A usage figure as a non-negative int (anything else counts 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    return max(int(value), 0)


class UsageReader:
    """Reads usage out of an answer as it passes. `feed` each chunk; `counts` at any time."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.counts = Counts()
        self._pending = bytearray()
        self._skipping = False
        self._body = bytearray()
        self._too_big = False

    def feed(self, chunk: bytes) -> None:
        if not self.stream:
            if not self._too_big:
                self._body += chunk
                if len(self._body) > MAX_BODY:
                    self._too_big, self._body = True, bytearray()
            return
        for data in self._events(chunk):
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if isinstance(event, dict):
                self.on_event(event)

    def finish(self) -> Counts:
        """The counts, once the answer has ended (or been cut): a whole JSON body is read now."""
        if not self.stream and self._body and not self._too_big:
            try:
                answer = json.loads(bytes(self._body))
            except ValueError:
                answer = None
            if isinstance(answer, dict):
                self.on_answer(answer)
                self.counts.complete = self.counts.seen
            self._body = bytearray()
        return self.counts

    def _events(self, chunk: bytes) -> Iterator[bytes]:
        """The `data:` payloads of the whole events in `chunk` and what came before it."""
        self._pending += chunk
        while True:
            cut = _boundary(self._pending)
            if cut is None:
                if len(self._pending) > MAX_EVENT:  # skip an event too long to parse
                    self._pending.clear()
                    self._skipping = True
                return
            start, end = cut
            event = bytes(self._pending[:start])
            del self._pending[:end]
            if self._skipping:
                self._skipping = False
                continue
            lines = [
                line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:")
            ]
            if lines:
                yield b"\n".join(lines)

    # --- what a provider's reader defines --------------------------------------------------

    def on_event(self, event: dict[str, Any]) -> None:
        """One streamed event's JSON."""

    def on_answer(self, answer: dict[str, Any]) -> None:
        """A whole non-streamed answer's JSON."""


def _boundary(buffer: bytearray) -> tuple[int, int] | None:
    """Where the first event of `buffer` ends: (its end, the next event's start), or None."""
    best: tuple[int, int] | None = None
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        at = buffer.find(sep)
        if at != -1 and (best is None or at < best[0]):
            best = (at, at + len(sep))
    return best
