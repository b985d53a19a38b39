"""Watching loopwarden from outside: OpenTelemetry spans and Prometheus metrics of decisions.

The lowest layer beside `clock`: it imports nothing else of loopwarden's, and nothing of
OpenTelemetry's or Prometheus's until a server turns it on (`watching`), so a host hook's
process start pays nothing for it.
"""

from loopwarden.observe.observer import NOBODY, Observer, Watch, metrics_pushed, tracing_wanted

__all__ = ["NOBODY", "Observer", "Watch", "metrics_pushed", "tracing_wanted", "watching"]


def watching(*, tracing: bool, metrics: bool, version: str, pushed: bool = False) -> Observer:
    """The observer for a server: `NOBODY` when all are off, else telemetry (loaded now):
    spans (`tracing`), the Prometheus registry `/metrics` serves (`metrics`), metrics pushed
    over OTLP (`pushed`)."""
    if not tracing and not metrics and not pushed:
        return NOBODY
    from loopwarden.observe.telemetry import Telemetry

    return Telemetry(tracing=tracing, metrics=metrics, version=version, pushed=pushed)
