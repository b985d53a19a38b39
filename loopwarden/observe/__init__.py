"""Watching loopwarden from outside: OpenTelemetry spans and Prometheus metrics of decisions.

The lowest layer beside `clock`: it imports nothing else of loopwarden's, and nothing of
OpenTelemetry's or Prometheus's until a server turns it on (`watching`), so a host hook's
process start pays nothing for it.
"""

from loopwarden.observe.observer import NOBODY, Observer, Watch, tracing_wanted

__all__ = ["NOBODY", "Observer", "Watch", "tracing_wanted", "watching"]


def watching(*, tracing: bool, metrics: bool, version: str) -> Observer:
    """The observer for a server: `NOBODY` when both are off, else telemetry (loaded now)."""
    if not tracing and not metrics:
        return NOBODY
    from loopwarden.observe.telemetry import Telemetry

    return Telemetry(tracing=tracing, metrics=metrics, version=version)
