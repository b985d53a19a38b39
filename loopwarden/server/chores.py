"""The chores a server repeats in the background (the session sweep, the change feed's poll):
one loop that runs a step every so often and outlives the step's failures."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

log = logging.getLogger("loopwarden.server")


async def every(seconds: float, step: Callable[[], Awaitable[object]], what: str) -> None:
    """Run `step` every `seconds` until cancelled, the first time after a wait; a step that
    raises is logged (`<what> failed; retrying`, with its traceback) and run again on time."""
    while True:
        await anyio.sleep(seconds)
        try:
            await step()
        except Exception:
            log.exception("%s failed; retrying", what)
