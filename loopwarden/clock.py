"""Time, injectable: every lease, rate window and deadline reads the clock through here.

An instant has one type in memory, an aware UTC `datetime`; it is text only where it leaves
the process: in the database (the row codecs, `kernel/sql/schema.py` TIME), in a receipt's
signed JSON (`kernel/state/events.py` Timestamp) and in results and pages. That text is one
fixed RFC 3339 form with microseconds and a `Z` (`format_time`), so stored times sort
lexicographically in SQL and a receipt's bytes never depend on how a time was made.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]
"""A zero-argument callable returning an aware UTC datetime."""


def system_clock() -> datetime:
    return datetime.now(UTC)


class ManualClock:
    """A clock tests move by hand: leases, windows and deadlines without sleeping."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> datetime:
        self._now += timedelta(seconds=seconds)
        return self._now

    def set(self, when: datetime) -> None:
        self._now = when.astimezone(UTC)


@functools.lru_cache(maxsize=4096)  # a write encodes the same rows' times several times over
def format_time(when: datetime) -> str:
    """Render an aware datetime as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (always UTC, always 27 chars).
    Memoized: equal instants are equal keys whatever their time zone, and render alike."""
    if when.tzinfo is None:
        raise ValueError("naive datetime: loopwarden only handles aware UTC times")
    if when.tzinfo is not UTC:
        when = when.astimezone(UTC)
    if when.year < 1000:  # strftime does not pad such years; isoformat (twice as fast) would
        return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return when.isoformat(timespec="microseconds")[:-6] + "Z"  # drop "+00:00"


def format_optional(when: datetime | None) -> str | None:
    """`format_time`, with None for no time (a nullable column)."""
    return None if when is None else format_time(when)


@functools.lru_cache(maxsize=1024)
def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (with `Z` or an offset) into an aware UTC datetime.

    Memoized (datetimes are immutable): a receipt's time is read several times over, by the
    write path's rules and again by the judge."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"timestamp {text!r} has no time zone")
    return value.astimezone(UTC)
